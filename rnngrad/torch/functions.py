"""rnngrad's ops on tensors, differentiable: ``single_gate_rnn``, ``gru``, ``lstm`` (and
``SingleGateRNNFunction``, ``GRUFunction``, ``LSTMFunction``.apply), through the operators
``torch.ops.rnngrad.*`` (:mod:`rnngrad.torch.ops`: schemas, torch.compile, torch.export,
torch.func).

Arguments and layouts are rnngrad's (time-major, MPSGraph's packed gate layouts; see
``rnngrad.gru`` and the others):

====================  ============================================================
source                [T,N,I], or [T,N,D·G·H] without input_weight
recurrent_weight      [G·H,H], or [2,G·H,H] bidirectional
input_weight          [D·G·H,I] or None
bias                  [D·G·H] or None
init_state            [N,D·H] (or [1,N,D·H]) or None
init_cell             [N,D·H] (or [1,N,D·H]) or None   (LSTM)
mask                  broadcastable to [N,D·H], or [T,N,D·H]; never differentiated
peephole              [4H] or [2,4H], or None          (LSTM)
secondary_bias        [D·H] or None                    (GRU)
====================  ============================================================

The functions return a named tuple: ``state`` h [T,N,D·H] (processing order for a
unidirectional ``reverse`` op, aligned with input time when bidirectional), for the LSTM
``cell`` c [T,N,D·H], and ``final_state`` (``final_cell``) [N,D·H]: each direction's state
after its last processing step (the initial state, or zeros, when T = 0). The gradient of
``final_state`` enters the gradient op as ``state_gradient``, the gradient of ``final_cell`` as
the final-cell ``cell_gradient``, the gradient of ``cell`` as the per-step one; no output's
gradient is materialised as zeros unless the op needs it (``source_gradient``).

Dtypes: float32 and float64 are computed as they are; float16 and bfloat16 are computed in
float32 (on the float32 fast paths) and returned in the input's dtype (z_state stays float32).
Under ``torch.autocast`` the float32 tensors of a call are cast to autocast's dtype first, as
autocast does for ``torch.nn``'s recurrent layers on CUDA (their op is in its lower-precision
list), on the CPU and CUDA alike; float64 calls are left alone. On the CPU, outputs share the
backend's result arrays. The gradient op is not itself differentiable: a gradient of a gradient
(``create_graph=True`` then a second backward, Hessians) raises a ``RuntimeError`` that says so.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rnngrad.api import FORWARD_OPS
from rnngrad.descriptors import DESCRIPTORS
from rnngrad.torch import _device, _route, ops

__all__ = ["single_gate_rnn", "gru", "lstm", "SingleGateRNNFunction", "GRUFunction",
           "LSTMFunction", "RNNOutput", "LSTMOutput", "descriptor_code", "INPUTS"]

#: each cell's array arguments, in the order of rnngrad's forward functions
INPUTS = ops.INPUTS
descriptor_code = ops.descriptor_code
_AUTOCAST_DEVICES = ("cpu", "cuda")


class RNNOutput(NamedTuple):
    """``state`` h [T,N,D·H]; ``final_state`` [N,D·H]."""

    state: torch.Tensor
    final_state: torch.Tensor


class LSTMOutput(NamedTuple):
    """``state`` h and ``cell`` c [T,N,D·H]; ``final_state`` and ``final_cell`` [N,D·H]."""

    state: torch.Tensor
    cell: torch.Tensor
    final_state: torch.Tensor
    final_cell: torch.Tensor


def checked_descriptor(cell, value):
    """``value`` as the descriptor of ``cell`` (None: the defaults), or a TypeError."""
    cls = DESCRIPTORS[cell]
    if value is None:
        return _default(cell)
    if not isinstance(value, cls):
        raise TypeError(f"descriptor: expected an rnngrad.{cls.__name__} (or None for the "
                        f"defaults), got {type(value).__name__}")
    return value


_DEFAULTS = {}


def _default(cell):
    if cell not in _DEFAULTS:
        _DEFAULTS[cell] = DESCRIPTORS[cell]()
    return _DEFAULTS[cell]


def _check_tensors(given: dict):
    for name, t in given.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
        if name != "mask":
            _device.check_dtype(name, t)


def apply(cell: str, given: dict, value, backend):
    """The op of ``cell`` on ``given`` ({argument: tensor or None}, every name of
    ``INPUTS[cell]`` in that order) with descriptor ``value``, its arguments checked."""
    _check_tensors(given)
    desc = checked_descriptor(cell, value)
    mask = given.get("mask")
    if mask is not None and mask.dtype != given["source"].dtype:
        given["mask"] = mask.to(given["source"].dtype)  # a bool or integer mask, as 0/1
    return run(cell, given, ops.descriptor_code(desc), backend)


def _autocast(given: dict) -> dict:
    """``given`` with its float32 tensors in autocast's dtype, when autocast is on for their
    device (see the module docstring)."""
    source = given["source"]
    if source.dtype != torch.float32 and source.dtype not in _device.AUTOCAST_DTYPES:
        return given
    low = torch.get_autocast_dtype(source.device.type)
    return {k: t.to(low) if t is not None and t.dtype == torch.float32 else t
            for k, t in given.items()}


def run(cell: str, given: dict, code: str, backend):
    """:func:`apply` without its checks, for callers that made them (the layers); ``code`` is
    :func:`descriptor_code` of the descriptor."""
    kind = given["source"].device.type
    if kind in _AUTOCAST_DEVICES and torch.is_autocast_enabled(kind):
        given = _autocast(given)
    tensors = tuple(given.values())
    training = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors)
    if not _route.plain(tensors):
        # with nothing to differentiate no node is recorded, so the operator itself (Dynamo
        # would also pass the autograd.Function's forward a context it does not take)
        call = ops.APPLY[cell] if training else ops.OPS[cell][0]
        out = call(*tensors, code, backend, training)
    elif training:
        out = ops.EAGER[cell](*tensors, code, backend, training)
    else:
        out = ops.KERNEL[cell](*tensors, code, backend, training)
    return LSTMOutput(*out[:4]) if cell == "lstm" else RNNOutput(*out[:2])


def _function(cell: str, class_name: str):
    names = INPUTS[cell]

    def apply_(value, backend, *tensors):
        desc = checked_descriptor(cell, value)
        return tuple(run(cell, dict(zip(names, tensors)), ops.descriptor_code(desc), backend))

    doc = (f"``{class_name}.apply(descriptor, backend, {', '.join(names)})``: "
           f"``torch.ops.{ops.NAMESPACE}.{FORWARD_OPS[cell]}`` on rnngrad's layouts (module "
           "docstring), differentiable; returns (h, final h) or, for the LSTM, "
           "(h, c, final h, final c).")
    return type(class_name, (), {"apply": staticmethod(apply_), "__doc__": doc,
                                 "__module__": __name__})


SingleGateRNNFunction = _function("single_gate", "SingleGateRNNFunction")
GRUFunction = _function("gru", "GRUFunction")
LSTMFunction = _function("lstm", "LSTMFunction")


def single_gate_rnn(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
                    mask=None, *, descriptor=None, backend=None) -> RNNOutput:
    """``rnngrad.single_gate_rnn`` on tensors, differentiable: ``(state, final_state)``."""
    return apply("single_gate", dict(
        source=source, recurrent_weight=recurrent_weight, input_weight=input_weight, bias=bias,
        init_state=init_state, mask=mask), descriptor, backend)


def gru(source, recurrent_weight, input_weight=None, bias=None, init_state=None, mask=None,
        secondary_bias=None, *, descriptor=None, backend=None) -> RNNOutput:
    """``rnngrad.gru`` on tensors, differentiable: ``(state, final_state)``."""
    return apply("gru", dict(
        source=source, recurrent_weight=recurrent_weight, input_weight=input_weight, bias=bias,
        init_state=init_state, mask=mask, secondary_bias=secondary_bias), descriptor, backend)


def lstm(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
         init_cell=None, mask=None, peephole=None, *, descriptor=None, backend=None) -> LSTMOutput:
    """``rnngrad.lstm`` on tensors, differentiable: ``(state, cell, final_state,
    final_cell)``."""
    return apply("lstm", dict(
        source=source, recurrent_weight=recurrent_weight, input_weight=input_weight, bias=bias,
        init_state=init_state, init_cell=init_cell, mask=mask, peephole=peephole),
        descriptor, backend)
