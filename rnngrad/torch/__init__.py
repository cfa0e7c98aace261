"""rnngrad in PyTorch training: PyTorch operators, differentiable functions and ``torch.nn``
layers.

    import rnngrad.torch as rt
    layer = rt.GRU(input_size=32, hidden_size=64, batch_first=True)   # torch.nn.GRU's conventions
    output, h_n = layer(x)                                             # rnngrad's ops inside
    output.sum().backward()                                            # rnngrad's gradient ops

- :mod:`rnngrad.torch.ops`: the operators ``torch.ops.rnngrad.single_gate_rnn``, ``gru``,
  ``lstm`` and their ``*_backward`` (``torch.library.custom_op``: schemas, fake implementations
  for torch.compile, torch.export and meta tensors, a registered autograd formula);
- :mod:`rnngrad.torch.functions`: ``single_gate_rnn``, ``gru``, ``lstm`` on tensors in
  rnngrad's layouts, differentiable (``SingleGateRNNFunction``, ``GRUFunction``,
  ``LSTMFunction``.apply too);
- :mod:`rnngrad.torch.layers`: ``RNN``, ``GRU``, ``LSTM`` with PyTorch's constructor, call
  conventions and parameters (``PackedSequence`` input too), plus MPSGraph's options;
  ``from_torch(module)`` and ``layer.to_torch()``.

float16 and bfloat16 are computed in float32 and returned in their dtype; under
``torch.autocast`` float32 calls run in autocast's dtype.

CPU tensors run on the CPU backends without copies (``backend=None`` picks the fastest here);
CUDA tensors on the ``metal-cuda`` backend where it is available, through DLPack; MPS tensors
on the ``metal-mps`` backend (rnngrad's Metal kernels through ``torch.mps.compile_shader``,
PyTorch 2.7 or later), where they are; meta tensors give shapes only; any other device is an
error that names the backends that would serve it. PyTorch is imported only when this package
is (``pip install 'rnngrad[torch]'``).

Inside: ``_device`` (device → backend, tensors ⇄ arrays), ``_compute`` (the one forward and
backward on arrays), ``_route`` (which route a call takes), ``_layer`` (one layer, by route),
``_internals`` (PyTorch's private internals, each with its public fallback).
"""

from rnngrad.torch._device import CUDA_BACKEND, MPS_BACKEND
from rnngrad.torch.functions import (
    GRUFunction,
    LSTMFunction,
    LSTMOutput,
    RNNOutput,
    SingleGateRNNFunction,
    gru,
    lstm,
    single_gate_rnn,
)
from rnngrad.torch.layers import GRU, LSTM, RNN, from_torch

__all__ = ["RNN", "GRU", "LSTM", "from_torch", "single_gate_rnn", "gru", "lstm",
           "SingleGateRNNFunction", "GRUFunction", "LSTMFunction", "RNNOutput", "LSTMOutput",
           "CUDA_BACKEND", "MPS_BACKEND"]
