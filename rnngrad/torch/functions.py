"""rnngrad's ops as PyTorch operators: ``torch.ops.rnngrad.*``, differentiable, on any rnngrad
backend.

Each cell has two operators, registered with ``torch.library.custom_op``:

- ``torch.ops.rnngrad.single_gate_rnn`` / ``gru`` / ``lstm``: the forward op. Returns
  ``(h, h_n, z_state)`` (LSTM: ``(h, c, h_n, c_n, z_state)``); z_state is kept only with
  ``training=True`` (an empty tensor otherwise);
- ``torch.ops.rnngrad.single_gate_rnn_backward`` / ``gru_backward`` / ``lstm_backward``: the
  gradient op, from the forward's inputs and outputs and the gradients of its outputs; returns
  one tensor per input, the gradient where ``needs`` asks for it, an empty tensor otherwise.

Both have fake (meta) implementations, so ``torch.compile`` (also ``fullgraph=True``),
``torch.export`` and meta tensors see shapes without running anything, and the forward's
autograd formula (``torch.library.register_autograd``) calls the gradient op; ``torch.func``
transforms work through it. Dynamo never looks inside: the ops are opaque to it. The
descriptor crosses as a string (:func:`descriptor_code`), the backend as its name or None.

The functions and the layers call the operators through autograd.Functions that hold the same
formula (the layers' plain eager calls of CPU tensors in float32 or float64 without a mask run
as one autograd node a layer instead: ``rnngrad.torch._eager``). A plain eager call (nothing
compiling, exporting or transforming it, no dispatch or function mode, plain tensors on the
CPU, CUDA or MPS) runs the operators' kernels directly, without the dispatcher's Python
custom-op layers, which cost more than the op itself at small sizes; every other call goes
through ``torch.ops.rnngrad.*``.

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

The functions ``single_gate_rnn``, ``gru``, ``lstm`` return a named tuple: ``state`` h
[T,N,D·H] (processing order for a unidirectional ``reverse`` op, aligned with input time when
bidirectional), for the LSTM ``cell`` c [T,N,D·H], and ``final_state`` (``final_cell``) [N,D·H]:
each direction's state after its last processing step (the initial state, or zeros, when
T = 0). The gradient of ``final_state`` enters the gradient op as ``state_gradient``, the
gradient of ``final_cell`` as the final-cell ``cell_gradient``, the gradient of ``cell`` as the
per-step one; no output's gradient is materialised as zeros unless the op needs it
(``source_gradient``).

Dtypes: float32 and float64 are computed as they are; float16 and bfloat16 are computed in
float32 (on the float32 fast paths) and returned in the input's dtype (z_state stays float32).
Under ``torch.autocast`` the float32 tensors of a call are cast to autocast's dtype first, as
autocast does for ``torch.nn``'s recurrent layers on CUDA (their op is in its lower-precision
list), on the CPU and CUDA alike; float64 calls are left alone.

In the backward, the bias and secondary bias are handed to the gradient op only when their
gradients are wanted (the op reads neither: z_state holds the pre-activations), so their
gradients are not computed otherwise. When the source needs no gradient (a model's first
layer), the gradient op runs without the input weight, which skips d_source = dA·W (a sixth of
a step's FLOPs at I = H), and the weight's gradient is dAᵀ·source by PyTorch; the other
gradients come out of the op's one pass. On the CPU, outputs share the backend's result arrays.
The gradient op is not itself differentiable: a gradient of a gradient (``create_graph=True``
then a second backward, Hessians) raises a ``RuntimeError`` that says so.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch

import rnngrad
from rnngrad.api import FORWARD_INPUTS, FORWARD_OPS, add_to_final, run_checked
from rnngrad.descriptors import DESCRIPTORS, Activation, z_width
from rnngrad.torch import _device
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["single_gate_rnn", "gru", "lstm", "SingleGateRNNFunction", "GRUFunction",
           "LSTMFunction", "RNNOutput", "LSTMOutput", "descriptor_code", "OPS"]

#: each cell's array arguments, in the order of rnngrad's forward functions
INPUTS = FORWARD_INPUTS


def _backend_op(cell: str, gradients: bool):
    def run(*, descriptor, backend, **arrays):
        return run_checked(cell, gradients, descriptor, backend, arrays)
    return run


#: each cell's forward and gradient op, called with the arrays, the descriptor and the backend
#: by name: the backend's own ForwardArrays or GradientArrays (``rnngrad.api.run_checked``)
_FORWARD = {cell: _backend_op(cell, False) for cell in FORWARD_OPS}
_GRADIENTS = {cell: _backend_op(cell, True) for cell in FORWARD_OPS}
_DESCRIPTORS = DESCRIPTORS
_GATES = {"single_gate": 1, "gru": 3, "lstm": 4}
#: inputs whose values the gradient op does not read: handed to it only for their gradients
_ONLY_FOR_GRADIENT = ("bias", "secondary_bias")
#: the namespace of the operators: torch.ops.rnngrad.<op>
NAMESPACE = "rnngrad"

DOUBLE_BACKWARD = ("rnngrad.torch: double backward is not supported: rnngrad's gradient ops are "
                   "not differentiable themselves, so a gradient of a gradient (a backward with "
                   "create_graph=True followed by another, Hessians, gradient penalties) is "
                   "refused; differentiate once, or use torch.nn's modules for higher orders")


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


# -- the descriptor as an operator argument ---------------------------------------------------

def _fields(cls) -> tuple:
    """The fields a descriptor code carries: all but the outputs the operators choose."""
    return tuple(f.name for f in dataclasses.fields(cls)
                 if f.name not in ("training", "produce_cell"))


@functools.lru_cache(maxsize=256)
def descriptor_code(descriptor) -> str:
    """``descriptor`` as the operators take it: ``"field=int,…"`` for every option (bools as
    0/1, activations as MPSGraph's integers), e.g. ``"reverse=0,bidirectional=1,activation=2"``."""
    return ",".join(f"{name}={int(getattr(descriptor, name))}"
                    for name in _fields(type(descriptor)))


@functools.lru_cache(maxsize=256)
def _decode(cell: str, code: str):
    cls = _DESCRIPTORS[cell]
    kinds = {f.name: f.type for f in dataclasses.fields(cls)}
    options = {}
    for item in code.split(",") if code else ():
        name, _, value = item.partition("=")
        if name not in kinds or name in ("training", "produce_cell"):
            raise ValueError(f"descriptor: unknown option {name!r} for {cls.__name__} in "
                             f"{code!r}; expected options {_fields(cls)}")
        is_activation = kinds[name] in (Activation, "Activation")
        options[name] = Activation(int(value)) if is_activation else bool(int(value))
    return cls(**options)


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
    a descriptor checks every field when made)."""
    extra = {"produce_cell": True} if isinstance(descriptor, rnngrad.LSTMDescriptor) else {}
    return dataclasses.replace(descriptor, training=training, **extra)


# -- the operators' real implementations -------------------------------------------------------

def _final(seq, initial, D: int, device, dtype):
    """Each direction's last state [N,D·H] of ``seq`` [T,N,D·H] (the backend's array:
    processing order unidirectional, aligned bidirectional) as a tensor of its own; the
    initial state (a tensor or None: zeros) when T = 0."""
    T, N, DH = seq.shape
    if T == 0:
        if initial is None:
            return torch.zeros((N, DH), dtype=dtype, device=device)
        return initial.detach().reshape(N, DH).to(dtype, copy=True)
    if D == 1:
        last = _device.namespace(device).array(seq[-1])  # [N,H], a copy
    else:
        H = DH // 2
        last = _device.namespace(device).concatenate([seq[-1, :, :H], seq[0, :, H:]], axis=-1)
    return _device.to_tensor(last, device, dtype)  # [N,DH]


def _forward_impl(cell: str, tensors, code: str, backend, training: bool):
    names = INPUTS[cell]
    given = dict(zip(names, tensors))
    descriptor = _decode(cell, code)
    device = _device.device_of(given)
    name = _device.backend_for(device, backend)
    dtype = given["source"].dtype
    _device.check_served(given, device)
    arrays = _device.to_arrays(given, device)
    result = _FORWARD[cell](**arrays, descriptor=_with_outputs(descriptor, training), backend=name)
    D = 2 if descriptor.bidirectional else 1
    h = _device.to_tensor(result.h, device, dtype)  # [T,N,DH]
    h_n = _final(result.h, given["init_state"], D, device, dtype)  # [N,DH]
    if training:
        z = _device.to_tensor(result.z_state, device)  # [T,N,DZH], the compute dtype
    else:
        z = torch.empty(0, dtype=_device.compute_dtype(dtype), device=device)
    if cell != "lstm":
        return h, h_n, z
    c = _device.to_tensor(result.c, device, dtype)  # [T,N,DH]
    return h, c, h_n, _final(result.c, given["init_cell"], D, device, dtype), z


def _cell_gradient(gc, gcn, D: int, T: int):
    """rnngrad's cell_gradient from the gradients of the per-step cell ``gc`` [T,N,D·H] and of
    the final cell ``gcn`` [N,D·H] (either may be None): per step, with the final cell's added
    at each direction's last processing step; or the final-cell form alone."""
    if gc is None or T == 0:
        return gcn
    if gcn is None:
        return gc
    return add_to_final(gc.clone(), gcn, D)  # [T,N,DH]


def _backward_impl(cell: str, tensors, h, c, z_state, gh, gc, ghn, gcn, code: str, backend,
                   needs, empty=True):
    """One gradient per input of ``tensors``: where not needed, an empty tensor (``empty``, as
    the operator's schema has it) or None."""
    names = INPUTS[cell]
    descriptor = _decode(cell, code)
    if z_state.dim() != 3:
        raise RuntimeError(f"z_state: the forward ran with training=False, which keeps no "
                           f"z_state; run torch.ops.{NAMESPACE}.{FORWARD_OPS[cell]} with "
                           f"training=True to differentiate it")
    saved = dict(zip(names, tensors))
    device = h.device
    dtype = h.dtype
    if gh is None:
        gh = torch.zeros_like(h)  # [T,N,DH] the op needs a source gradient
    given = {"source_gradient": gh, "state_gradient": ghn}
    for name, need in zip(names, needs):
        t = saved[name]
        if t is not None and (need or name not in _ONLY_FOR_GRADIENT):
            given[name] = t
    if cell == "gru":
        given["output_fwd"] = h
    elif cell == "lstm":
        given["cell_output_fwd"] = c
        given["cell_gradient"] = _cell_gradient(
            gc, gcn, 2 if descriptor.bidirectional else 1, h.shape[0])
    source, weight = given["source"], given.get("input_weight")
    skip_source = weight is not None and not needs[0]
    if skip_source:
        # the source needs no gradient: the op runs without the input weight, so that it
        # skips d_source = dA W; its "source gradient" is then dA, the gradient of the
        # projected input, and the weight's gradient is dAᵀ source here. The op does not
        # read the source then, only its shape (z_state holds the projection).
        del given["input_weight"]
        given["source"] = _device.placeholder(
            (source.shape[0], source.shape[1], weight.shape[0]), z_state.dtype, device)
    given["z_state"] = z_state
    arrays = _device.to_arrays(given, device)
    result = _GRADIENTS[cell](**arrays, descriptor=descriptor,
                               backend=_device.backend_for(device, backend))
    out = {}  # the gradients wanted, by argument: the backend's arrays [D,GH,H], [1,1,DGH] …
    for name, need in zip(names, needs):
        if need and saved[name] is not None:
            out[name] = getattr(result, name)
    if skip_source:
        dA = _device.to_tensor(result.source, device)  # [T,N,DGH], compute dtype
        out.pop("source", None)
        if needs[2]:
            x = source.detach().reshape(-1, weight.shape[1])
            out["input_weight"] = _device.transposed_product(
                dA.reshape(-1, weight.shape[0]), x.to(dA.dtype))
    grads = []
    for name, need in zip(names, needs):
        t = saved[name]
        g = out.get(name) if need and t is not None else None
        if g is None:
            grads.append(torch.empty(0, dtype=dtype if t is None else t.dtype, device=device)
                         if empty else None)
            continue
        if tuple(g.shape) != tuple(t.shape):
            g = g.reshape(tuple(t.shape))  # bias [1,1,DGH] → [DGH], before wrapping
        g = _device.to_tensor(g, device, t.dtype)
        if h.shape[0] == 0:  # T = 0: the op may hand back a state gradient as it was given
            g = g.clone()  # an operator's outputs alias neither its inputs nor each other
        grads.append(g)
    return tuple(grads)


# -- the fake implementations: shapes and dtypes only ------------------------------------------

def _fake_forward(cell: str, tensors, code: str, training: bool):
    given = dict(zip(INPUTS[cell], tensors))
    _device.device_of(given)
    descriptor = _decode(cell, code)
    source, R = given["source"], given["recurrent_weight"]
    D = 2 if descriptor.bidirectional else 1
    T, N, H = source.shape[0], source.shape[1], R.shape[-1]
    dtype = source.dtype
    h = source.new_empty((T, N, D * H))
    h_n = source.new_empty((N, D * H))
    compute = _device.compute_dtype(dtype)
    if training:
        z = source.new_empty((T, N, D * z_width(descriptor) * H), dtype=compute)
    else:
        z = source.new_empty((0,), dtype=compute)
    if cell != "lstm":
        return h, h_n, z
    return h, source.new_empty((T, N, D * H)), h_n, source.new_empty((N, D * H)), z


def _fake_backward(cell: str, tensors, h, needs):
    out = []
    for t, need in zip(tensors, needs):
        if t is None:
            out.append(h.new_empty((0,)))
        elif need:
            out.append(t.new_empty(t.shape))
        else:
            out.append(t.new_empty((0,)))
    return tuple(out)


# -- the operators -------------------------------------------------------------------------------

def _forward_schema(cell: str) -> str:
    names = INPUTS[cell]
    args = ", ".join(f"Tensor{'?' if i >= 2 else ''} {n}" for i, n in enumerate(names))
    outs = 5 if cell == "lstm" else 3
    returns = ", ".join(["Tensor"] * outs)
    return f"({args}, str descriptor, str? backend, bool training) -> ({returns})"


def _backward_schema(cell: str) -> str:
    names = INPUTS[cell]
    args = ", ".join(f"Tensor{'?' if i >= 2 else ''} {n}" for i, n in enumerate(names))
    states = "Tensor state, Tensor? cell" if cell == "lstm" else "Tensor state"
    grads = ("Tensor? grad_state, Tensor? grad_cell, Tensor? grad_final_state, "
             "Tensor? grad_final_cell") if cell == "lstm" else \
        "Tensor? grad_state, Tensor? grad_final_state"
    return (f"({args}, {states}, Tensor z_state, {grads}, str descriptor, str? backend, "
            f"bool[] needs) -> ({', '.join(['Tensor'] * len(names))})")


def _define(cell: str):
    """The forward and backward operators of ``cell``, with fake implementations and the
    forward's autograd formula; the autograd.Functions that call them."""
    names = INPUTS[cell]
    n = len(names)
    lstm = cell == "lstm"
    op = FORWARD_OPS[cell]

    def forward_kernel(*args):
        return _forward_impl(cell, args[:n], *args[n:])

    def forward_fake(*args):
        return _fake_forward(cell, args[:n], args[n], args[n + 2])

    if lstm:
        def backward_kernel(*args, empty=True):
            h, c, z, gh, gc, ghn, gcn, code, backend, needs = args[n:]
            return _backward_impl(cell, args[:n], h, c, z, gh, gc, ghn, gcn, code, backend, needs,
                                  empty)
    else:
        def backward_kernel(*args, empty=True):
            h, z, gh, ghn, code, backend, needs = args[n:]
            return _backward_impl(cell, args[:n], h, None, z, gh, None, ghn, None, code,
                                  backend, needs, empty)

    def backward_fake(*args):
        return _fake_backward(cell, args[:n], args[n], args[-1])

    forward_op = torch.library.custom_op(f"{NAMESPACE}::{op}", forward_kernel, mutates_args=(),
                                         schema=_forward_schema(cell))
    forward_op.register_fake(forward_fake)
    backward_op = torch.library.custom_op(f"{NAMESPACE}::{op}_backward",
                                          lambda *args: backward_kernel(*args),
                                          mutates_args=(), schema=_backward_schema(cell))
    backward_op.register_fake(backward_fake)

    def setup_context(ctx, inputs, output):
        code, backend, training = inputs[n:]
        h = output[0]
        ctx.save_for_backward(*inputs[:n], h, output[1] if lstm else None, output[-1])
        ctx.code, ctx.backend = code, backend
        ctx.set_materialize_grads(False)

    def call_backward(*args):
        if torch.compiler.is_compiling():  # traced once: nothing to differentiate further
            return backward_overload(*args)
        return gradient.apply(*args)

    def call_backward_eager(*args):
        if torch.is_grad_enabled():  # create_graph: through the Function that refuses
            return gradient.apply(*args)
        return backward_kernel(*args, empty=False)

    def backward(ctx, *grads):
        return formula(ctx, grads, call_backward)

    def eager_backward(ctx, *grads):
        return formula(ctx, grads, call_backward_eager)

    def formula(ctx, grads, call_backward):
        saved = ctx.saved_tensors
        tensors, (h, c, z) = saved[:n], saved[n:]
        needs = [bool(x) for x in ctx.needs_input_grad[:n]]
        needs[names.index("mask")] = False
        if lstm:
            gh, gc, ghn, gcn, _ = grads
            out = call_backward(*tensors, h, c, z, gh, gc, ghn, gcn, ctx.code, ctx.backend, needs)
        else:
            gh, ghn, _ = grads
            out = call_backward(*tensors, h, z, gh, ghn, ctx.code, ctx.backend, needs)
        return (*(g if need else None for g, need in zip(out, needs)), None, None, None)

    forward_op.register_autograd(backward, setup_context=setup_context)

    def refuse(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD)

    def nothing_to_save(ctx, inputs, output):
        pass

    backward_op.register_autograd(refuse, setup_context=nothing_to_save)

    def below_autograd(op):
        def call(*args):
            if torch.compiler.is_compiling():  # traced without grad mode
                return op(*args)
            with torch._C._AutoDispatchBelowAutograd():  # the formula is the Function's
                return op(*args)
        return call

    def function(name, op, setup, formula, doc):
        return type(name, (torch.autograd.Function,), {
            "forward": staticmethod(below_autograd(op)), "setup_context": staticmethod(setup),
            "backward": staticmethod(formula), "__module__": __name__, "__doc__": doc})

    # The formulas again as autograd.Functions with setup_context, which torch.func's
    # transforms require (an operator's registered formula has none); the Python surface calls
    # the operators through them.
    backward_overload = backward_op._opoverload  # what torch.compile can trace a call to
    gradient = function(f"{op}_backward_function", backward_overload, nothing_to_save, refuse,
                        f"``torch.ops.{NAMESPACE}.{op}_backward``, not differentiable.")
    forward_function = function(
        f"{op}_function", forward_op._opoverload, setup_context, backward,
        f"``torch.ops.{NAMESPACE}.{op}`` with its gradient operator in the backward.")

    def eager_forward(ctx, *args):
        out = forward_kernel(*args)
        setup_context(ctx, args, out)
        return out

    # plain eager calls: the operators' kernels, without the dispatcher's Python custom-op
    # layers (module docstring)
    eager_function = type(f"{op}_eager_function", (torch.autograd.Function,), {
        "forward": staticmethod(eager_forward), "backward": staticmethod(eager_backward),
        "__module__": __name__,
        "__doc__": f"``torch.ops.{NAMESPACE}.{op}``'s kernels, called directly in eager mode."})
    return forward_op, backward_op, forward_function, eager_function, forward_kernel


_DEFINED = {cell: _define(cell) for cell in INPUTS}
#: cell → (forward operator, backward operator), as registered
OPS = {cell: ops[:2] for cell, ops in _DEFINED.items()}
_APPLY = {cell: ops[2].apply for cell, ops in _DEFINED.items()}
_EAGER = {cell: ops[3].apply for cell, ops in _DEFINED.items()}
_KERNEL = {cell: ops[4] for cell, ops in _DEFINED.items()}
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_EAGER_DEVICES = ("cpu", "cuda", "mps")


def _plain_eager(tensors) -> bool:
    """Whether a call is plain eager PyTorch: nothing traces or transforms it (torch.compile,
    torch.export, torch.func, dispatch and function modes, tensor subclasses such as fake
    tensors) and its tensors are on a device a backend serves."""
    if torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is not None \
            or _get_current_dispatch_mode() is not None \
            or torch._C._is_torch_function_mode_enabled():
        return False
    for t in tensors:
        if t is not None and type(t) not in _PLAIN:
            return False
    return tensors[0].device.type in _EAGER_DEVICES


# -- the Python surface ----------------------------------------------------------------------

def _check_tensors(given: dict):
    for name, t in given.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
        if name != "mask":
            _device.check_dtype(name, t)


def apply(cell: str, given: dict, descriptor, backend):
    """The op of ``cell`` on ``given`` ({argument: tensor or None}, every name of
    ``INPUTS[cell]`` in that order), with its arguments checked."""
    _check_tensors(given)
    descriptor = _descriptor(cell, descriptor)
    mask = given.get("mask")
    if mask is not None and mask.dtype != given["source"].dtype:
        given["mask"] = mask.to(given["source"].dtype)  # a bool or integer mask, as 0/1
    return run(cell, given, descriptor_code(descriptor), backend)


_AUTOCAST_DEVICES = ("cpu", "cuda")


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
    if not _plain_eager(tensors):
        out = _APPLY[cell](*tensors, code, backend, training)
    elif training:
        out = _EAGER[cell](*tensors, code, backend, training)
    else:
        out = _KERNEL[cell](*tensors, code, backend, training)
    return LSTMOutput(*out[:4]) if cell == "lstm" else RNNOutput(*out[:2])


def _function(cell: str, class_name: str):
    names = INPUTS[cell]

    def apply_(descriptor, backend, *tensors):
        desc = _descriptor(cell, descriptor)
        return tuple(run(cell, dict(zip(names, tensors)), descriptor_code(desc), backend))

    doc = (f"``{class_name}.apply(descriptor, backend, {', '.join(names)})``: "
           f"``torch.ops.{NAMESPACE}.{FORWARD_OPS[cell]}`` on rnngrad's layouts (module "
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
