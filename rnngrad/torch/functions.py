"""rnngrad's ops as PyTorch autograd functions: the forward op runs in the forward, the gradient
op in the backward, on any rnngrad backend.

Arguments and layouts are rnngrad's (SEMANTICS.md §2; time-major, MPSGraph's packed gate
layouts; see ``rnngrad.gru`` and the others):

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

Each function returns a named tuple: ``state`` h [T,N,D·H] (processing order for a
unidirectional ``reverse`` op, aligned with input time when bidirectional, as SEMANTICS.md §2.1
says), for the LSTM ``cell`` c [T,N,D·H], and ``final_state`` (``final_cell``) [N,D·H]: each
direction's state after its last processing step (the initial state, or zeros, when T = 0).
The gradient of ``final_state`` enters the gradient op as ``state_gradient``, the gradient of
``final_cell`` as the final-cell ``cell_gradient``, the gradient of ``cell`` as the per-step
one; no output's gradient is materialised as zeros unless the op needs it (``source_gradient``).

In the backward, the bias and secondary bias are handed to the gradient op only when their
gradients are wanted (the op reads neither: z_state holds the pre-activations), so their
gradients are not computed otherwise. When the source needs no gradient (a model's first
layer), the gradient op runs without the input weight, which skips d_source = dA·W (a sixth of
a step's FLOPs at I = H), and the weight's gradient is dAᵀ·source by PyTorch; the other
gradients come out of the op's one pass. Outputs share the backend's result arrays (CPU). The
gradient op is not itself differentiable: a backward with ``create_graph=True`` (a gradient
of a gradient, Hessians) raises a ``RuntimeError`` that says so.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch

import rnngrad
from rnngrad.api import FORWARD_INPUTS, FORWARD_OPS, add_to_final
from rnngrad.descriptors import DESCRIPTORS
from rnngrad.torch import _device

__all__ = ["single_gate_rnn", "gru", "lstm", "SingleGateRNNFunction", "GRUFunction",
           "LSTMFunction", "RNNOutput", "LSTMOutput"]

#: each cell's array arguments, in the order of rnngrad's forward functions
INPUTS = FORWARD_INPUTS
_FORWARD = {cell: getattr(rnngrad, op) for cell, op in FORWARD_OPS.items()}
_GRADIENTS = {cell: getattr(rnngrad, op + "_gradients") for cell, op in FORWARD_OPS.items()}
_DESCRIPTORS = DESCRIPTORS
#: inputs whose values the gradient op does not read: handed to it only for their gradients
_ONLY_FOR_GRADIENT = ("bias", "secondary_bias")
#: Function.apply's arguments before the tensors: descriptor, backend
_LEADING = 2

DOUBLE_BACKWARD = ("rnngrad.torch: double backward is not supported: rnngrad's gradient ops are "
                   "not differentiable themselves, so a backward with create_graph=True (a "
                   "gradient of a gradient, Hessians, gradient penalties) is refused; "
                   "differentiate once, or use torch.nn's modules for higher orders")


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


def _final(seq, initial, D: int, device):
    """Each direction's last state [N,D·H] of ``seq`` [T,N,D·H] (the backend's array; SEMANTICS.md
    §2.1: processing order unidirectional, aligned bidirectional) as a tensor of its own; the
    initial state (a tensor or None: zeros) when T = 0."""
    T, N, DH = seq.shape
    if T == 0:
        if initial is None:
            return torch.zeros((N, DH), dtype=_device.torch_dtype(seq.dtype), device=device)
        return initial.detach().reshape(N, DH).clone()
    if D == 1:
        last = seq[-1].copy()  # [N,H]
    else:
        H = DH // 2
        last = _device.namespace(seq, device).concatenate([seq[-1, :, :H], seq[0, :, H:]], axis=-1)
    return _device.to_tensor(last, device)  # [N,DH]


@functools.lru_cache(maxsize=None)
def _default_descriptor(cell):
    return _DESCRIPTORS[cell]()


def _descriptor(cell, descriptor):
    cls = _DESCRIPTORS[cell]
    if descriptor is None:
        return _default_descriptor(cell)
    if not isinstance(descriptor, cls):
        raise TypeError(f"descriptor: expected an rnngrad.{cls.__name__} (or None for the "
                        f"defaults), got {type(descriptor).__name__}")
    return descriptor


@functools.lru_cache(maxsize=256)
def _with_outputs(descriptor, training: bool):
    """``descriptor`` asking for z_state (``training``) and, for the LSTM, the cell (cached:
    a descriptor checks every field when made, which costs more than the lookup)."""
    extra = {"produce_cell": True} if isinstance(descriptor, rnngrad.LSTMDescriptor) else {}
    return dataclasses.replace(descriptor, training=training, **extra)


def _run_forward(cell, descriptor, backend, given: dict, training: bool):
    """(outputs as tensors, forward result of rnngrad, device): the forward op of ``given``
    ({argument: tensor or None}); with ``training``, z_state is kept."""
    device = _device.device_of(given)
    name = _device.backend_for(device, backend)
    arrays = _device.to_arrays(given, device)
    result = _FORWARD[cell](**arrays, descriptor=_with_outputs(descriptor, training), backend=name)
    D = 2 if descriptor.bidirectional else 1
    h = _device.to_tensor(result[0], device)  # [T,N,DH]
    h_n = _final(result[0], given["init_state"], D, device)  # [N,DH]
    if cell != "lstm":
        return RNNOutput(h, h_n), result, device
    c = _device.to_tensor(result[1], device)  # [T,N,DH]
    return LSTMOutput(h, c, h_n, _final(result[1], given["init_cell"], D, device)), result, device


def _first_order_only(backward):
    """Refuse a backward that builds a graph of its gradients (``create_graph=True``: a
    gradient of a gradient, Hessians): the gradient op is not differentiable itself. Refused
    at once, not later: ``once_differentiable``'s error node is not connected to the inputs, so
    ``torch.autograd.functional.hessian`` would see unused inputs and return zeros."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(DOUBLE_BACKWARD)
        return backward(ctx, *grads)
    return wrapper


def _cell_gradient(gc, gcn, D: int, T: int):
    """The op's cell_gradient (SEMANTICS.md §3.1) from the gradients of the per-step cell
    ``gc`` [T,N,D·H] and of the final cell ``gcn`` [N,D·H] (either may be None): per step, with
    the final cell's added at each direction's last processing step; or the final-cell form
    alone."""
    if gc is None or T == 0:
        return gcn
    if gcn is None:
        return gc
    return add_to_final(gc.clone(), gcn, D)  # [T,N,DH]


def _make_function(cell: str, class_name: str):
    names = INPUTS[cell]
    lstm = cell == "lstm"

    def forward(ctx, descriptor, backend, *tensors):
        outputs, result, device = _run_forward(cell, descriptor, backend,
                                               dict(zip(names, tensors)), training=True)
        ctx.set_materialize_grads(False)
        ctx.cell_descriptor, ctx.backend, ctx.device = descriptor, backend, device
        ctx.z_state = result[-1]
        # inputs and the outputs the gradient op reads, with PyTorch's check that none was
        # modified in place before the backward
        ctx.save_for_backward(*tensors, outputs[0], outputs[1] if lstm else None)
        return tuple(outputs)

    @_first_order_only
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[_LEADING:]
        desc, device = ctx.cell_descriptor, ctx.device
        h, c = saved[-2:]
        if lstm:
            gh, gc, ghn, gcn = grads
        else:
            (gh, ghn), gc, gcn = grads, None, None
        if gh is None:
            gh = torch.zeros_like(h)  # [T,N,DH] the op needs a source gradient
        given = {"source_gradient": gh, "state_gradient": ghn}
        for name, t, need in zip(names, saved, needs):
            if t is not None and (need or name not in _ONLY_FOR_GRADIENT):
                given[name] = t
        if cell == "gru":
            given["output_fwd"] = h
        elif lstm:
            given["cell_output_fwd"] = c
            given["cell_gradient"] = _cell_gradient(
                gc, gcn, 2 if desc.bidirectional else 1, h.shape[0])
        source, weight = given["source"], given.get("input_weight")
        skip_source = weight is not None and not needs[0]
        if skip_source:
            # the source needs no gradient: the op runs without the input weight, so that it
            # skips d_source = dA W; its "source gradient" is then dA, the gradient of the
            # projected input, and the weight's gradient is dAᵀ source here. The op does not
            # read the source then, only its shape (z_state holds the projection).
            del given["input_weight"]
            given["source"] = _device.placeholder(
                (source.shape[0], source.shape[1], weight.shape[0]), source.dtype, device)
        arrays = _device.to_arrays(given, device)
        out = _GRADIENTS[cell](z_state=ctx.z_state, **arrays, descriptor=desc,
                               backend=_device.backend_for(device, ctx.backend))
        out = out.as_dict()
        if skip_source:
            dA = _device.to_tensor(out.pop("source"), device)  # [T,N,DGH]
            if needs[2]:
                out["input_weight"] = _device.transposed_product(
                    dA.reshape(-1, weight.shape[0]), source.detach().reshape(-1, weight.shape[1]))
        grads_in = [None] * (_LEADING + len(names))
        for i, (name, t, need) in enumerate(zip(names, saved, needs)):
            g = out.get(name) if need else None
            if g is not None:
                if g.shape != t.shape:
                    g = g.reshape(tuple(t.shape))  # bias [1,1,DGH] → [DGH], before wrapping
                grads_in[_LEADING + i] = _device.to_tensor(g, device)
        return tuple(grads_in)

    doc = (f"rnngrad's {cell} forward op in the forward, its gradient op in the backward. "
           f"``{class_name}.apply(descriptor, backend, {', '.join(names)})`` with the "
           "layouts of rnngrad's ops (module docstring); returns (h, final h) or, for the LSTM, "
           "(h, c, final h, final c).")
    return type(class_name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward),
                 "__doc__": doc, "__module__": __name__})


SingleGateRNNFunction = _make_function("single_gate", "SingleGateRNNFunction")
GRUFunction = _make_function("gru", "GRUFunction")
LSTMFunction = _make_function("lstm", "LSTMFunction")
_FUNCTIONS = {"single_gate": SingleGateRNNFunction, "gru": GRUFunction, "lstm": LSTMFunction}


def _check_tensors(given: dict, dtype_of: str = "source"):
    for name, t in given.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
        if name != "mask":
            _device.check_dtype(name, t)


def apply(cell: str, given: dict, descriptor, backend):
    """The op of ``cell`` on ``given`` ({argument: tensor or None}, every name of
    ``INPUTS[cell]`` in that order): through the autograd function when a gradient can be asked for, else the
    forward op alone (no z_state kept)."""
    _check_tensors(given)
    descriptor = _descriptor(cell, descriptor)
    mask = given.get("mask")
    if mask is not None and mask.dtype != given["source"].dtype:
        given["mask"] = mask.to(given["source"].dtype)  # a bool or integer mask, as 0/1
    return run(cell, given, descriptor, backend)


def run(cell: str, given: dict, descriptor, backend):
    """:func:`apply` without its checks, for callers that made them (the layers)."""
    if torch.is_grad_enabled():
        for name, t in given.items():
            if t is not None and t.requires_grad and name != "mask":
                out = _FUNCTIONS[cell].apply(descriptor, backend, *given.values())
                return LSTMOutput(*out) if cell == "lstm" else RNNOutput(*out)
    return _run_forward(cell, descriptor, backend, given, training=False)[0]


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
