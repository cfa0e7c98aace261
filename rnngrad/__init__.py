"""rnngrad: forward passes and BPTT gradients of MPSGraph's recurrent ops, exactly.

    import rnngrad as rg
    h, z = rg.lstm(x, R, W, b, descriptor=rg.LSTMDescriptor(training=True, produce_cell=False))

What every backend computes is stated in ``rnngrad/backends/reference/SEMANTICS.md``;
``backend="reference"`` is the NumPy oracle that implements it literally.
"""

__version__ = "0.1.0"

from .api import (
    gru,
    gru_gradients,
    lstm,
    lstm_gradients,
    single_gate_rnn,
    single_gate_rnn_gradients,
    synchronize,
)
from .descriptors import Activation, GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor
from .registry import available_backends
from .results import ForwardResult, GradientResult

__all__ = [
    "Activation", "SingleGateRNNDescriptor", "GRUDescriptor", "LSTMDescriptor",
    "single_gate_rnn", "single_gate_rnn_gradients", "gru", "gru_gradients", "lstm",
    "lstm_gradients", "available_backends", "ForwardResult", "GradientResult", "synchronize",
]
