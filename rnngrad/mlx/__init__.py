"""rnngrad in MLX training: differentiable functions (``mx.custom_function`` with a vjp) and
``mlx.nn`` layers.

    import rnngrad.mlx as rm
    layer = rm.GRU(32, 64)                       # mlx.nn.GRU's conventions
    hidden = layer(x)                            # rnngrad's ops inside, [N,L,64]
    loss, grads = nn.value_and_grad(layer, loss_fn)(x)   # rnngrad's gradient ops

- :mod:`rnngrad.mlx.functions`: ``single_gate_rnn``, ``gru``, ``lstm`` on ``mx.array``\\ s in
  rnngrad's layouts (SEMANTICS.md §2);
- :mod:`rnngrad.mlx.layers`: ``RNN``, ``GRU``, ``LSTM`` with MLX's conventions plus MPSGraph's
  options; ``from_mlx(module)``.

MLX is imported only when this package is (``pip install mlx``; on Linux ``mlx[cpu]``).
"""

from rnngrad.mlx.functions import LSTMOutput, RNNOutput, gru, lstm, single_gate_rnn
from rnngrad.mlx.layers import GRU, LSTM, RNN, from_mlx

__all__ = ["RNN", "GRU", "LSTM", "from_mlx", "single_gate_rnn", "gru", "lstm", "RNNOutput",
           "LSTMOutput"]
