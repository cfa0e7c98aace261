"""rnngrad in PyTorch training: autograd functions and ``torch.nn`` layers.

    import rnngrad.torch as rt
    layer = rt.GRU(input_size=32, hidden_size=64, batch_first=True)   # torch.nn.GRU's conventions
    output, h_n = layer(x)                                             # rnngrad's ops inside
    output.sum().backward()                                            # rnngrad's gradient ops

- :mod:`rnngrad.torch.functions`: ``single_gate_rnn``, ``gru``, ``lstm`` on tensors in the
  rnngrad's layouts, differentiable (``SingleGateRNNFunction``, ``GRUFunction``,
  ``LSTMFunction``: the forward op forward, the gradient op backward);
- :mod:`rnngrad.torch.layers`: ``RNN``, ``GRU``, ``LSTM`` with PyTorch's constructor, call
  conventions and parameters, plus MPSGraph's options; ``from_torch(module)`` and
  ``layer.to_torch()``.

CPU tensors run on the CPU backends without copies (``backend=None`` picks the fastest here);
CUDA tensors on the ``metal-cuda`` backend where it is available, through DLPack; any other
device is an error that names the backends that would serve it. PyTorch is imported only when
this package is (``pip install 'rnngrad[torch]'``).
"""

from rnngrad.torch._device import CUDA_BACKEND
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
           "CUDA_BACKEND"]
