"""``rnngrad.mlx.RNN``, ``GRU`` and ``LSTM``: ``mlx.nn.Module`` layers with MLX's constructor,
call conventions and parameters, computed by rnngrad's ops, plus the MPSGraph options MLX lacks.

MLX's conventions, as ``mlx.nn.RNN`` / ``GRU`` / ``LSTM``:

- ``input_size``, ``hidden_size``, ``bias`` (``RNN``: ``nonlinearity``, a callable as MLX's —
  ``mx.tanh``, ``nn.relu``, ``mx.sigmoid`` — or an activation name);
- ``layer(x, hidden=None)`` (``LSTM``: ``layer(x, hidden=None, cell=None)``): x [N,L,I] or
  [L,I]; the initial state(s) [N,H] or [H]; returns every step's hidden state [N,L,H] (``LSTM``:
  ``(hidden, cell)``, both [N,L,H]);
- parameters as MLX names and lays them out, initialised as MLX does (uniform in ±1/√H, in
  MLX's order: the same seed gives MLX's weights): ``RNN`` ``Wxh`` [H,I], ``Whh`` [H,H],
  ``bias`` [H]; ``GRU`` ``Wx`` [3H,I], ``Wh`` [3H,H], ``b`` [3H], ``bhn`` [H]; ``LSTM`` ``Wx``
  [4H,I], ``Wh`` [4H,H], ``bias`` [4H].

The op: ``input_weight`` = ``Wx`` (``Wxh``), ``recurrent_weight`` = ``Wh`` (``Whh``), ``bias``
= ``b`` / ``bias``, and the GRU's ``bhn`` (inside the reset product) is the op's
``secondary_bias``. MLX's GRU is rnngrad's with ``reset_gate_first`` (gates r, z, n),
``reset_after`` and not ``flip_z``; its LSTM the default descriptor (i, f, g, o).

MPSGraph's options (keyword-only; defaults give MLX's cells): ``backend``, ``reverse`` (outputs
in processing order, as MPSGraph), ``mask=`` at call time ([N,H] or per step [N,L,H]); ``RNN``:
``nonlinearity`` also ``"sigmoid"``, ``"hard_sigmoid"``, ``"none"``; ``GRU``:
``reset_gate_first``, ``reset_after``, ``flip_z``, the three gate activations, and
``secondary_bias`` (default: as ``reset_after`` and ``bias``: whether ``bhn`` exists);
``LSTM``: ``peephole`` (a parameter ``peephole`` [4H]), ``forget_gate_last`` (weights packed
i, z, f, o), the five activations. MLX has no bidirectional or stacked recurrent layers; neither
have these (stack them, or use ``rnngrad.mlx.functions`` with a bidirectional descriptor).
"""

from __future__ import annotations

import math
import types

import mlx.core as mx
import mlx.nn as nn

import rnngrad
from rnngrad.mlx import functions

__all__ = ["RNN", "GRU", "LSTM", "from_mlx"]

#: MLX's nonlinearity callables, by rnngrad activation name
_CALLABLES = {"tanh": (mx.tanh, nn.tanh), "relu": (nn.relu,), "sigmoid": (mx.sigmoid, nn.sigmoid)}


def _uniform(scale, shape):
    return mx.random.uniform(low=-scale, high=scale, shape=shape)


def _activation_name(value, field):
    if callable(value) and not isinstance(value, (str, int)):
        for name, fns in _CALLABLES.items():
            if any(value is f for f in fns):
                return name
        raise ValueError(f"{field}: expected mx.tanh, nn.relu, mx.sigmoid or an activation name "
                         f"{[a.name.lower() for a in rnngrad.Activation]}, got {value!r}")
    return rnngrad.Activation.coerce(value, field).name.lower()


class _Base(nn.Module):
    cell = "single_gate"
    _names = ("Wxh", "Whh", "bias")  # input weight, recurrent weight, bias

    def __init__(self, input_size, hidden_size, bias, backend, reverse, descriptor):
        super().__init__()
        for name, value, least in (("input_size", input_size, 0),
                                   ("hidden_size", hidden_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an int ≥ {least}, got {value!r}")
        if not isinstance(bias, bool):
            raise ValueError(f"bias: expected a bool, got {bias!r}")
        self.hidden_size = hidden_size
        # not a dict: mlx.nn.Module would take a dict for a part of its parameter tree
        self._settings = types.SimpleNamespace(backend=backend, descriptor=descriptor)

    @property
    def descriptor(self):
        """The op's descriptor (rnngrad's, with every option of this layer)."""
        return self._settings.descriptor

    @property
    def backend(self):
        return self._settings.backend

    def _given(self, x, states, mask):
        """(time-major source, {op argument: array}, batched)."""
        if not isinstance(x, mx.array):
            raise TypeError(f"x: expected an mx.array, got {type(x).__name__}")
        if x.ndim not in (2, 3):
            raise ValueError(f"x: expected [N,L,I] or [L,I], got shape {tuple(x.shape)}")
        W = self[self._names[0]]
        if x.shape[-1] != W.shape[1]:
            raise ValueError(f"x: expected the last dimension to be input_size={W.shape[1]}, "
                             f"got shape {tuple(x.shape)}")
        batched = x.ndim == 3
        source = x.swapaxes(0, 1) if batched else x[:, None]  # [L,N,I]
        N, H = source.shape[1], self.hidden_size
        given = dict.fromkeys(functions.INPUTS[self.cell])
        given.update(source=source, input_weight=W, recurrent_weight=self[self._names[1]])
        if self._names[2] in self:
            given["bias"] = self[self._names[2]]
        for name, s in states.items():
            if s is None:
                continue
            want = (N, H) if batched else (H,)
            if tuple(s.shape) != want:
                raise ValueError(f"{name}: expected shape {want}, got {tuple(s.shape)}")
            given["init_state" if name == "hidden" else "init_cell"] = s.reshape(N, H)
        if mask is not None:
            if not isinstance(mask, mx.array):
                raise TypeError(f"mask: expected an mx.array or None, got {type(mask).__name__}")
            if batched and mask.ndim == 3:
                mask = mask.swapaxes(0, 1)  # [N,L,H] → [L,N,H]
            elif not batched and mask.ndim == 2:
                mask = mask[:, None]  # [L,H] → [L,1,H]
            given["mask"] = mask
        return given, batched

    def _output(self, seq, batched):
        return seq.swapaxes(0, 1) if batched else seq[:, 0]

    def _extra_repr(self):
        W = self[self._names[0]]
        return (f"input_size={W.shape[1]}, hidden_size={self.hidden_size}, "
                f"bias={self._names[2] in self}, descriptor={self.descriptor}")


class RNN(_Base):
    """``mlx.nn.RNN`` computed by rnngrad's single-gate RNN (module docstring)."""

    cell = "single_gate"
    _names = ("Wxh", "Whh", "bias")

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity=None, *, backend=None,
                 reverse=False):
        name = "tanh" if nonlinearity is None else _activation_name(nonlinearity, "nonlinearity")
        super().__init__(input_size, hidden_size, bias, backend, reverse,
                         rnngrad.SingleGateRNNDescriptor(activation=name, reverse=reverse))
        scale = 1.0 / math.sqrt(hidden_size)
        self.Wxh = _uniform(scale, (hidden_size, input_size))
        self.Whh = _uniform(scale, (hidden_size, hidden_size))
        if bias:
            self.bias = _uniform(scale, (hidden_size,))

    def __call__(self, x, hidden=None, *, mask=None):
        given, batched = self._given(x, {"hidden": hidden}, mask)
        out = functions.apply(self.cell, given, self.descriptor, self.backend)
        return self._output(out.state, batched)


class GRU(_Base):
    """``mlx.nn.GRU`` computed by rnngrad's GRU (module docstring)."""

    cell = "gru"
    _names = ("Wx", "Wh", "b")

    def __init__(self, input_size, hidden_size, bias=True, *, backend=None, reverse=False,
                 reset_gate_first=True, reset_after=True, flip_z=False,
                 update_gate_activation="sigmoid", reset_gate_activation="sigmoid",
                 output_gate_activation="tanh", secondary_bias=None):
        if secondary_bias is None:
            secondary_bias = bool(reset_after) and bool(bias)
        if not isinstance(secondary_bias, bool):
            raise ValueError(f"secondary_bias: expected a bool or None, got {secondary_bias!r}")
        if secondary_bias and not reset_after:
            raise ValueError("secondary_bias: MPSGraph reads the secondary bias only with "
                             "reset_after=True; got secondary_bias=True with reset_after=False")
        desc = rnngrad.GRUDescriptor(
            reverse=reverse, reset_gate_first=reset_gate_first, reset_after=reset_after,
            flip_z=flip_z, update_gate_activation=update_gate_activation,
            reset_gate_activation=reset_gate_activation,
            output_gate_activation=output_gate_activation)
        super().__init__(input_size, hidden_size, bias, backend, reverse, desc)
        scale = 1.0 / math.sqrt(hidden_size)
        self.Wx = _uniform(scale, (3 * hidden_size, input_size))
        self.Wh = _uniform(scale, (3 * hidden_size, hidden_size))
        if bias:
            self.b = _uniform(scale, (3 * hidden_size,))
        if secondary_bias:
            self.bhn = _uniform(scale, (hidden_size,))

    def __call__(self, x, hidden=None, *, mask=None):
        given, batched = self._given(x, {"hidden": hidden}, mask)
        if "bhn" in self:
            given["secondary_bias"] = self.bhn
        out = functions.apply(self.cell, given, self.descriptor, self.backend)
        return self._output(out.state, batched)


class LSTM(_Base):
    """``mlx.nn.LSTM`` computed by rnngrad's LSTM (module docstring)."""

    cell = "lstm"
    _names = ("Wx", "Wh", "bias")

    def __init__(self, input_size, hidden_size, bias=True, *, backend=None, reverse=False,
                 peephole=False, forget_gate_last=False, input_gate_activation="sigmoid",
                 forget_gate_activation="sigmoid", cell_gate_activation="tanh",
                 output_gate_activation="sigmoid", activation="tanh"):
        if not isinstance(peephole, bool):
            raise ValueError(f"peephole: expected a bool, got {peephole!r}")
        desc = rnngrad.LSTMDescriptor(
            reverse=reverse, forget_gate_last=forget_gate_last,
            input_gate_activation=input_gate_activation,
            forget_gate_activation=forget_gate_activation,
            cell_gate_activation=cell_gate_activation,
            output_gate_activation=output_gate_activation, activation=activation)
        super().__init__(input_size, hidden_size, bias, backend, reverse, desc)
        scale = 1.0 / math.sqrt(hidden_size)
        self.Wx = _uniform(scale, (4 * hidden_size, input_size))
        self.Wh = _uniform(scale, (4 * hidden_size, hidden_size))
        if bias:
            self.bias = _uniform(scale, (4 * hidden_size,))
        if peephole:
            self.peephole = _uniform(scale, (4 * hidden_size,))

    def __call__(self, x, hidden=None, cell=None, *, mask=None):
        given, batched = self._given(x, {"hidden": hidden, "cell": cell}, mask)
        if "peephole" in self:
            given["peephole"] = self.peephole
        out = functions.apply(self.cell, given, self.descriptor, self.backend)
        return self._output(out.state, batched), self._output(out.cell, batched)


def from_mlx(module, *, backend=None):
    """The rnngrad.mlx layer that computes what ``module`` (an ``mlx.nn.RNN``, ``GRU`` or
    ``LSTM``) computes, with its parameter values."""
    if isinstance(module, nn.GRU):
        layer = GRU(module.Wx.shape[1], module.hidden_size, bias=module.b is not None,
                    backend=backend)
        names = ("Wx", "Wh", "b", "bhn")
    elif isinstance(module, nn.LSTM):
        layer = LSTM(module.Wx.shape[1], module.hidden_size, bias=module.bias is not None,
                     backend=backend)
        names = ("Wx", "Wh", "bias")
    elif isinstance(module, nn.RNN):
        layer = RNN(module.Wxh.shape[1], module.Whh.shape[0], bias=module.bias is not None,
                    nonlinearity=module.nonlinearity, backend=backend)
        names = ("Wxh", "Whh", "bias")
    else:
        raise ValueError(f"module: expected mlx.nn.RNN, GRU or LSTM, got {type(module).__name__}")
    layer.update({n: module[n] for n in names if n in module and module[n] is not None})
    return layer
