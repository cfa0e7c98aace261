"""PyTorch ``nn.RNN`` (tanh, relu), ``nn.GRU`` and ``nn.LSTM`` ⇄ rnngrad.

A single-layer PyTorch recurrent module (uni- or bidirectional, with or without biases,
time-major or ``batch_first``) is exactly one rnngrad op:

==============  ==========================================================================
nn.RNN          single_gate_rnn, ``activation`` = the module's nonlinearity (tanh or relu)
nn.GRU          gru with ``reset_gate_first=True`` (PyTorch's gate order r, z, n),
                ``reset_after=True`` (``n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))``),
                ``flip_z=False`` (``h = (1 − z) ⊙ n + z ⊙ h[t−1]``)
nn.LSTM         lstm with the default descriptor (PyTorch's gate order i, f, g, o)
==============  ==========================================================================

Parameters (per direction ``d``; suffix ``_reverse`` for d = 1):

- ``input_weight`` [D·G·H, I] = ``weight_ih_l0`` and ``weight_ih_l0_reverse`` concatenated;
- ``recurrent_weight`` [G·H, H], or [2, G·H, H] bidirectional = ``weight_hh_l0`` (stacked);
- ``bias`` [D·G·H] = ``bias_ih + bias_hh``, except GRU's candidate block, which is ``b_in``
  alone; GRU's ``b_hn`` sits inside the reset product and is ``secondary_bias`` [D·H].
- gradients back: ``bias_ih`` and ``bias_hh`` both receive the bias gradient, except GRU's
  ``b_hn``, which receives the secondary-bias gradient.

States: PyTorch's ``h_0`` / ``c_0`` / ``h_n`` / ``c_n`` are [D, N, H]; rnngrad's are
[N, D·H]. PyTorch's bidirectional output is time-aligned, as rnngrad's is, so the backward
direction's final state is ``output[0, :, H:]``. ``grad_h_n`` becomes ``state_gradient`` and
``grad_c_n`` the final-cell form of ``cell_gradient``. With ``batch_first`` the input and output
are [N, T, ·] and are transposed on the way in and out (the states stay [D, N, H], as in PyTorch).

Not supported (a ``ValueError`` says so): ``num_layers > 1``, LSTM ``proj_size > 0``,
unbatched 2-D input.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ..descriptors import Activation, GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor
from . import parameters
from ._common import call_forward, call_gradients, final_state, sided_to_stacked, stacked_to_sided, to_numpy

__all__ = ["TorchRNN", "TorchGradients", "from_module", "from_state_dict", "MODES"]

#: PyTorch's ``module.mode`` → (rnngrad cell, gates)
MODES = {"RNN_TANH": ("single_gate", 1), "RNN_RELU": ("single_gate", 1), "GRU": ("gru", 3),
         "LSTM": ("lstm", 4)}


@dataclasses.dataclass(frozen=True)
class TorchGradients:
    """PyTorch-layout gradients: ``input`` like the input ([T,N,I], or [N,T,I] batch-first);
    ``h_0`` / ``c_0`` [D,N,H] (None when no initial state was given); ``parameters`` by
    PyTorch's parameter names (``weight_ih_l0``, ``bias_hh_l0_reverse``, …)."""

    input: np.ndarray
    h_0: Optional[np.ndarray]
    c_0: Optional[np.ndarray]
    parameters: dict


@dataclasses.dataclass(frozen=True)
class TorchRNN:
    """One single-layer PyTorch recurrent module as rnngrad arguments.

    Fields are rnngrad's: ``descriptor``; ``input_weight`` [D·G·H,I]; ``recurrent_weight``
    [G·H,H] or [2,G·H,H]; ``bias`` [D·G·H] or None; ``secondary_bias`` [D·H] or None (GRU).
    ``has_bias`` says whether the module has ``bias_ih`` / ``bias_hh``; ``batch_first`` its
    input layout.
    """

    mode: str
    descriptor: object
    input_weight: np.ndarray
    recurrent_weight: np.ndarray
    bias: Optional[np.ndarray]
    secondary_bias: Optional[np.ndarray]
    has_bias: bool
    batch_first: bool = False

    # -- shapes -------------------------------------------------------------------------------
    @property
    def cell(self) -> str:
        return MODES[self.mode][0]

    @property
    def G(self) -> int:
        return MODES[self.mode][1]

    @property
    def D(self) -> int:
        return 2 if self.descriptor.bidirectional else 1

    @property
    def H(self) -> int:
        return self.recurrent_weight.shape[-1]

    def parameter_names(self) -> tuple:
        """PyTorch's parameter names, in PyTorch's order."""
        names = []
        for suffix in ("_l0", "_l0_reverse")[: self.D]:
            names += [f"weight_ih{suffix}", f"weight_hh{suffix}"]
            if self.has_bias:
                names += [f"bias_ih{suffix}", f"bias_hh{suffix}"]
        return tuple(names)

    # -- PyTorch → rnngrad --------------------------------------------------------------------
    def _time_major(self, a, name):
        a = to_numpy(a, name)
        if a is None:
            return None
        if a.ndim != 3:
            raise ValueError(f"{name}: expected a batched 3-D array "
                             f"({'[N,T,·]' if self.batch_first else '[T,N,·]'}), got shape {a.shape}")
        return np.ascontiguousarray(a.transpose(1, 0, 2)) if self.batch_first else a

    def _split_hx(self, hx):
        if self.cell == "lstm":
            if hx is None:
                return None, None
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise ValueError(f"hx: expected (h_0, c_0) for an LSTM, got {type(hx).__name__}")
            return hx
        return hx, None

    def arguments(self, input, hx=None) -> dict:
        """rnngrad's keyword arguments of the forward op for ``module(input, hx)``."""
        source = self._time_major(input, "input")
        T, N = source.shape[:2]
        h0, c0 = self._split_hx(hx)
        args = dict(source=source, recurrent_weight=self.recurrent_weight,
                    input_weight=self.input_weight)
        if self.bias is not None:
            args["bias"] = self.bias
        if h0 is not None:
            args["init_state"] = stacked_to_sided(to_numpy(h0, "h_0"), "h_0", self.D, N, self.H)
        if c0 is not None:
            args["init_cell"] = stacked_to_sided(to_numpy(c0, "c_0"), "c_0", self.D, N, self.H)
        if self.secondary_bias is not None:
            args["secondary_bias"] = self.secondary_bias
        return args

    def upstream(self, T, N, grad_output=None, grad_h_n=None, grad_c_n=None, dtype=None) -> dict:
        """rnngrad's source_gradient / state_gradient / cell_gradient for PyTorch's gradients
        of ``output``, ``h_n`` and ``c_n`` (each may be None, meaning zero)."""
        dtype = dtype or self.recurrent_weight.dtype
        D, H = self.D, self.H
        gy = self._time_major(grad_output, "grad_output")
        if gy is None:
            gy = np.zeros((T, N, D * H), dtype)
        out = {"source_gradient": gy,
               "state_gradient": stacked_to_sided(to_numpy(grad_h_n, "grad_h_n"), "grad_h_n", D, N, H)}
        if self.cell == "lstm":
            out["cell_gradient"] = stacked_to_sided(to_numpy(grad_c_n, "grad_c_n"), "grad_c_n", D, N, H)
        elif grad_c_n is not None:
            raise ValueError(f"grad_c_n: only an LSTM has c_n, got one for {self.mode}")
        return out

    # -- rnngrad → PyTorch --------------------------------------------------------------------
    def outputs(self, result):
        """PyTorch's ``(output, h_n)``, or ``(output, (h_n, c_n))`` for an LSTM, from an rnngrad
        forward result (with the cell, for an LSTM)."""
        h = result.state  # [T,N,DH]
        output = np.ascontiguousarray(h.transpose(1, 0, 2)) if self.batch_first else h
        h_n = final_state(h, self.D, self.H)
        if self.cell == "lstm":
            return output, (h_n, final_state(result.cell, self.D, self.H))
        return output, h_n

    def parameter_gradients(self, grads) -> dict:
        """PyTorch's parameter gradients, by parameter name, from an rnngrad GradientResult
        (each an array of its own)."""
        sides = parameters.parameter_gradients(
            {name: getattr(grads, name) for name in ("input_weight", "recurrent_weight", "bias",
                                                    "secondary_bias")},
            D=self.D, H=self.H, secondary=self.secondary_bias is not None)
        names = parameters.names(0, self.D, bias=self.has_bias)
        return {name: np.array(sides[d][kind])
                for name, (d, kind) in zip(names, map(parameters.direction_kinds, names))}

    def input_gradients(self, grads):
        """(grad of input, grad of h_0, grad of c_0) in PyTorch's layout (None where no initial
        state was given)."""
        dx = grads.source
        dx = np.ascontiguousarray(dx.transpose(1, 0, 2)) if self.batch_first else dx
        return (dx, sided_to_stacked(grads.init_state, self.D, self.H),
                sided_to_stacked(grads.init_cell, self.D, self.H))

    # -- whole calls --------------------------------------------------------------------------
    def forward(self, input, hx=None, *, backend=None):
        """``module(input, hx)`` computed by rnngrad: ``(output, h_n)`` or
        ``(output, (h_n, c_n))``, NumPy arrays in PyTorch's layout."""
        result = call_forward(self.cell, self.descriptor, self.arguments(input, hx), backend)
        return self.outputs(result)

    def gradients(self, input, hx=None, grad_output=None, grad_h_n=None, grad_c_n=None, *,
                  backend=None) -> TorchGradients:
        """The gradients PyTorch's autograd gives for
        ``L = Σ grad_output ⊙ output + Σ grad_h_n ⊙ h_n (+ Σ grad_c_n ⊙ c_n)``, by rnngrad."""
        args = self.arguments(input, hx)
        T, N = args["source"].shape[:2]
        up = self.upstream(T, N, grad_output, grad_h_n, grad_c_n, dtype=args["source"].dtype)
        run = call_gradients(self.cell, self.descriptor, args, backend=backend, **up)
        dx, dh0, dc0 = self.input_gradients(run.gradients)
        return TorchGradients(dx, dh0, dc0, self.parameter_gradients(run.gradients))


def _descriptor(mode, bidirectional):
    if mode == "RNN_TANH":
        return SingleGateRNNDescriptor(bidirectional=bidirectional, activation=Activation.TANH)
    if mode == "RNN_RELU":
        return SingleGateRNNDescriptor(bidirectional=bidirectional, activation=Activation.RELU)
    if mode == "GRU":
        return GRUDescriptor(bidirectional=bidirectional, reset_gate_first=True, reset_after=True,
                             flip_z=False)
    return LSTMDescriptor(bidirectional=bidirectional)


def from_state_dict(mode, state_dict, *, batch_first=False) -> TorchRNN:
    """A :class:`TorchRNN` from PyTorch parameters by name (``module.state_dict()`` or
    ``dict(module.named_parameters())``; tensors or arrays).

    ``mode``: ``"RNN_TANH"``, ``"RNN_RELU"``, ``"GRU"`` or ``"LSTM"`` (PyTorch's
    ``module.mode``; ``"RNN"`` alone is not enough, the nonlinearity matters). The hidden size,
    direction count and biases are read from the names and shapes.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {sorted(MODES)}, got {mode!r}")
    params = {k: to_numpy(v, k) for k, v in state_dict.items()}
    if "weight_ih_l0" not in params or "weight_hh_l0" not in params:
        raise ValueError(f"state_dict: expected weight_ih_l0 and weight_hh_l0, got {sorted(params)}")
    extra = sorted(k for k in params if "_l0" not in k)
    if extra or any(k.endswith(("_l1", "_l1_reverse")) for k in params):
        raise ValueError(f"state_dict: expected a single-layer module (…_l0 parameters only), "
                         f"got {sorted(params)}")
    if any(k.startswith("weight_hr") for k in params):
        raise ValueError("state_dict: LSTM projections (proj_size > 0) have no rnngrad equivalent")
    cell, G = MODES[mode]
    D = 2 if "weight_ih_l0_reverse" in params else 1
    H = params["weight_hh_l0"].shape[-1]
    has_bias = "bias_ih_l0" in params
    suffixes = ("_l0", "_l0_reverse")[:D]
    for suffix in suffixes:
        for key, shape in ((f"weight_hh{suffix}", (G * H, H)),) + (
                ((f"bias_ih{suffix}", (G * H,)), (f"bias_hh{suffix}", (G * H,))) if has_bias else ()):
            if params[key].shape != shape:
                raise ValueError(f"{key}: expected shape {shape} for {mode} with hidden size {H}, "
                                 f"got {params[key].shape}")
        if params[f"weight_ih{suffix}"].shape[0] != G * H:
            raise ValueError(f"weight_ih{suffix}: expected {G * H} rows for {mode} with hidden "
                             f"size {H}, got shape {params[f'weight_ih{suffix}'].shape}")
    # PyTorch's GRU: b_hn sits inside the reset product, the op's secondary bias
    names = parameters.names(0, D, bias=has_bias)
    args = parameters.op_arguments(
        parameters.sides([params[k] for k in names], map(parameters.direction_kinds, names), D),
        H=H, secondary=cell == "gru" and has_bias)
    return TorchRNN(mode=mode, descriptor=_descriptor(mode, D == 2),
                    input_weight=np.ascontiguousarray(args["input_weight"]),
                    recurrent_weight=np.ascontiguousarray(args["recurrent_weight"]),
                    bias=args.get("bias"), secondary_bias=args.get("secondary_bias"),
                    has_bias=has_bias, batch_first=bool(batch_first))


def from_module(module) -> TorchRNN:
    """A :class:`TorchRNN` from a ``torch.nn.RNN``, ``GRU`` or ``LSTM`` (single layer, no
    projection; dropout is irrelevant for one layer)."""
    mode = getattr(module, "mode", None)
    if mode not in MODES:
        raise ValueError(f"module: expected torch.nn.RNN, GRU or LSTM (mode in {sorted(MODES)}), "
                         f"got {type(module).__name__} with mode {mode!r}")
    if module.num_layers != 1:
        raise ValueError(f"module.num_layers: expected 1 (rnngrad ops are single-layer; convert "
                         f"each layer separately), got {module.num_layers}")
    if getattr(module, "proj_size", 0):
        raise ValueError(f"module.proj_size: expected 0 (LSTM projections have no rnngrad "
                         f"equivalent), got {module.proj_size}")
    return from_state_dict(mode, dict(module.named_parameters()), batch_first=module.batch_first)
