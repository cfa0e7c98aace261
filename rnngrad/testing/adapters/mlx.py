"""MLX's ``mlx.nn.RNN``, ``GRU`` and ``LSTM`` as array layers for
:func:`rnngrad.testing.check_module`, on rnngrad's parameter names, gradients by ``mx.vjp``
(no PyTorch)::

    from rnngrad.testing import check_module
    from rnngrad.testing.adapters.mlx import mlx_adapter
    check_module(mlx_adapter("gru"), "gru")

MLX's layers take a batch-first input [N,T,I] (or unbatched [T,I]), an optional initial
``hidden`` [N,H] (and ``cell`` for the LSTM) and return every step's hidden state (the LSTM:
hidden and cell); they are single-layer and unidirectional, without lengths. Layouts, rnngrad's
names on the right:

==========  ================================================================================
RNN         ``Wxh`` [H,I] = input_weight; ``Whh`` [H,H] = recurrent_weight; ``bias`` [H] =
            bias; ``nonlinearity`` tanh, or ``mlx.nn.relu`` for "relu"
GRU         ``Wx`` [3H,I] = input_weight; ``Wh`` [3H,H] = recurrent_weight; gates r, z, n
            (rnngrad ``reset_gate_first=True``: r, z, o); ``b`` [3H] = bias; ``bhn`` [H] =
            secondary_bias, inside the reset product (``reset_after=True``);
            h' = (1 − z) ⊙ n + z ⊙ h
LSTM        ``Wx`` [4H,I] = input_weight; ``Wh`` [4H,H] = recurrent_weight; ``bias`` [4H] =
            bias; gates i, f, g, o (rnngrad's i, f, z, o)
==========  ================================================================================

Needs mlx (``pip install -e ".[mlx]"``; ``mlx[cpu]`` on Linux).
"""

from __future__ import annotations

import numpy as np

from ..arrays import TORCH_GRU, cell_descriptor
from ..layer_problems import Capabilities

__all__ = ["mlx_adapter", "to_framework"]

_CLASSES = {"rnn": "RNN", "gru": "GRU", "lstm": "LSTM"}
_GATES = {"gru": ("r", "z", "n"), "lstm": ("i", "f", "g", "o")}


def to_framework(cell, params):
    """MLX's parameters {name: array} from rnngrad's (the one mapping)."""
    W, R = params["input_weight_l0"], params["recurrent_weight_l0"]
    if cell == "rnn":
        own = {"Wxh": W, "Whh": R}
    else:
        own = {"Wx": W, "Wh": R}
    if "bias_l0" in params:
        own["b" if cell == "gru" else "bias"] = params["bias_l0"]
        if cell == "gru":
            own["bhn"] = params["secondary_bias_l0"]
    return own


class MLXAdapter:
    """A factory of array layers computed by ``mlx.nn``'s recurrent layer of ``cell``."""

    def __init__(self, cell):
        if cell not in _CLASSES:
            raise ValueError(f"cell: expected one of {tuple(_CLASSES)}, got {cell!r}")
        self.cell = cell
        self.framework = f"mlx.nn.{_CLASSES[cell]}"
        self.capabilities = Capabilities(num_layers=1, bidirectional=False, dropout=False,
                                         lengths=False, noncontiguous=False,
                                         layouts=("batch_first",))
        self.source = ("from rnngrad.testing.adapters.mlx import mlx_adapter", f"mlx_adapter({cell!r})")

    def __call__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=True,
                 dropout=0.0, bidirectional=False, nonlinearity="tanh"):
        if num_layers != 1 or bidirectional or not batch_first:
            raise NotImplementedError("mlx.nn's recurrent layers: one layer, one direction, batch-first")
        descriptor = cell_descriptor(self.cell, nonlinearity, **TORCH_GRU)
        return MLXLayer(self.cell, input_size, hidden_size, bias, nonlinearity, descriptor)


class MLXLayer:
    """One ``mlx.nn`` layer behind the array protocol (:mod:`rnngrad.testing.arrays`)."""

    def __init__(self, cell, I, H, bias, nonlinearity, descriptor):
        import mlx.nn as mnn

        self.cell, self.descriptor, self.gate_names = cell, descriptor, _GATES.get(cell)
        names = ["input_weight_l0", "recurrent_weight_l0"]
        names += (["bias_l0"] + (["secondary_bias_l0"] if cell == "gru" else [])) if bias else []
        self.parameter_names = tuple(names)
        if cell == "rnn":
            self.layer = mnn.RNN(I, H, bias=bias, nonlinearity=mnn.relu if nonlinearity == "relu" else None)
        else:
            self.layer = getattr(mnn, _CLASSES[cell])(I, H, bias=bias)

    def framework_parameters(self, params):
        return {k: np.asarray(v) for k, v in to_framework(self.cell, params).items()}

    def _forward(self, names, given):
        """The layer as a function of MLX arrays: (output, h_n [1,·,H], c_n or absent)."""
        import mlx.core as mx

        args = dict(zip(names, given))
        self.layer.update(to_framework(self.cell, {k: v for k, v in args.items() if k.endswith("_l0")}))
        h0, c0 = args.get("h0"), args.get("c0")
        if self.cell == "lstm":
            hs, cs = self.layer(args["x"], h0, c0)
            return [hs, mx.expand_dims(hs[..., -1, :], 0), mx.expand_dims(cs[..., -1, :], 0)]
        hs = self.layer(args["x"], h0)
        return [hs, mx.expand_dims(hs[..., -1, :], 0)]

    def run(self, params, x, *, h0=None, c0=None, lengths=None, cotangents=None):
        import mlx.core as mx

        if lengths is not None:
            raise NotImplementedError("lengths: mlx.nn's recurrent layers take padded arrays")
        kind = {np.dtype(np.float32): mx.float32, np.dtype(np.float64): mx.float64}[np.dtype(x.dtype)]
        arrays = {"x": x, "h0": None if h0 is None else h0[0], "c0": None if c0 is None else c0[0]}
        arrays.update(params)
        names = [k for k, v in arrays.items() if v is not None]
        primals = [mx.array(np.ascontiguousarray(arrays[k]), dtype=kind) for k in names]
        with mx.stream(mx.cpu):  # float64 is a CPU type in MLX
            out = self._forward(names, primals)
            result = {"output": np.array(out[0]), "h_n": np.array(out[1]),
                      "c_n": np.array(out[2]) if self.cell == "lstm" else None}
            if cotangents is None:
                return result
            keys = ("output", "h_n", "c_n")[:len(out)]
            cot = [mx.array(cotangents[k], dtype=kind) if cotangents.get(k) is not None
                   else mx.zeros(o.shape, dtype=kind) for k, o in zip(keys, out)]
            _, grads = mx.vjp(lambda *given: self._forward(names, given), primals, cot)
        grads = dict(zip(names, (np.array(g) for g in grads)))
        result["input"] = grads["x"]
        result["h_0"] = None if h0 is None else grads["h0"][None]
        result["c_0"] = None if c0 is None else grads["c0"][None]
        result["params"] = {k: grads[k] for k in params}
        return result


def mlx_adapter(cell) -> MLXAdapter:
    """The factory for ``check_module``: ``mlx.nn``'s layer of ``cell`` ("rnn", "gru", "lstm")."""
    return MLXAdapter(cell)
