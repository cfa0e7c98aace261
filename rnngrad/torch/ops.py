"""rnngrad's ops as PyTorch operators: ``torch.ops.rnngrad.*``, differentiable, on any backend.

Each cell has two operators, registered with ``torch.library.custom_op``; the descriptor crosses
as a string (:func:`descriptor_code`), the backend as its name or None. Schemas, with the
cell's inputs ``INPUTS[cell]`` (``rnngrad.torch.functions``' table of layouts) in order:

``rnngrad::lstm(Tensor source, Tensor recurrent_weight, Tensor? input_weight, Tensor? bias,
Tensor? init_state, Tensor? init_cell, Tensor? mask, Tensor? peephole, str descriptor,
str? backend, bool training) -> (Tensor h, Tensor c, Tensor h_n, Tensor c_n, Tensor z_state)``

``rnngrad::gru(…, Tensor? secondary_bias, str descriptor, str? backend, bool training) ->
(Tensor h, Tensor h_n, Tensor z_state)``; ``rnngrad::single_gate_rnn`` likewise, without the
secondary bias.

``rnngrad::<op>_backward(<the forward's inputs>, Tensor state[, Tensor? cell], Tensor z_state,
Tensor? grad_state[, Tensor? grad_cell], Tensor? grad_final_state[, Tensor? grad_final_cell],
str descriptor, str? backend, bool[] needs) -> (one Tensor per input)``: the gradient of each
input where ``needs`` asks for it, an empty tensor otherwise.

- ``h`` and ``c`` are [T,N,D·H] (processing order unidirectional, aligned bidirectional),
  ``h_n`` and ``c_n`` [N,D·H]: each direction's state after its last processing step (the
  initial state, or zeros, when T = 0);
- ``z_state`` [T,N,D·Z·H] is kept only with ``training=True`` (an empty tensor otherwise): it
  is what the backward reads. A forward with ``training=False`` is differentiable too, as
  ``torch.nn``'s eval-mode layers are: its backward runs the forward again to make z_state;
- the descriptor code is ``"field=int,…"`` for every option but ``training`` and
  ``produce_cell`` (bools as 0/1, activations as MPSGraph's integers), e.g.
  ``"reverse=0,bidirectional=1,activation=2"``.

Both operators have fake (meta) implementations, so ``torch.compile`` (also ``fullgraph=True``),
``torch.export`` and meta tensors see shapes without running anything; the forward's autograd
formula (``torch.library.register_autograd``) calls the gradient operator, and
``torch.func``'s transforms run through the autograd.Functions of :data:`APPLY`. Under
``torch.func.vmap`` both operators and the Functions run the op once per slice of the mapped
axis (:func:`_looped`). The gradient operator is not itself differentiable: a gradient of a
gradient raises a ``RuntimeError``.

Plain eager calls (:func:`rnngrad.torch._route.plain`) run the operators' kernels through
:data:`EAGER` and :data:`KERNEL`, without the dispatcher's Python custom-op layers, which cost
more than the op itself at small sizes.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

import rnngrad
from rnngrad.api import FORWARD_INPUTS, FORWARD_OPS
from rnngrad.descriptors import DESCRIPTORS, Activation, z_width
from rnngrad.problem import ForwardArrays
from rnngrad.torch import _compute, _device, _internals

__all__ = ["OPS", "APPLY", "EAGER", "KERNEL", "descriptor_code", "decode", "NAMESPACE",
           "DOUBLE_BACKWARD"]

#: each cell's array arguments, in the order of rnngrad's forward functions
INPUTS = FORWARD_INPUTS
#: the namespace of the operators: torch.ops.rnngrad.<op>
NAMESPACE = "rnngrad"

DOUBLE_BACKWARD = ("rnngrad.torch: double backward is not supported: rnngrad's gradient ops are "
                   "not differentiable themselves, so a gradient of a gradient (a backward with "
                   "create_graph=True followed by another, Hessians, gradient penalties) is "
                   "refused; differentiate once, or use torch.nn's modules for higher orders")


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
def decode(cell: str, code: str):
    """The descriptor of ``cell`` that :func:`descriptor_code` wrote as ``code``."""
    cls = DESCRIPTORS[cell]
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


@functools.lru_cache(maxsize=256)
def with_outputs(descriptor, training: bool):
    """``descriptor`` asking for z_state (``training``) and, for the LSTM, the cell (cached:
    a descriptor checks every field when made)."""
    extra = {"produce_cell": True} if isinstance(descriptor, rnngrad.LSTMDescriptor) else {}
    return dataclasses.replace(descriptor, training=training, **extra)


# -- the operators' real implementations -------------------------------------------------------

def _forward_impl(cell: str, tensors, code: str, backend, training: bool):
    given = dict(zip(INPUTS[cell], tensors))
    descriptor = decode(cell, code)
    device = _device.device_of(given)
    name = _device.backend_for(device, backend)
    dtype = given["source"].dtype
    _device.check_served(given, device)
    arrays = _device.arrays_of(device)
    with arrays.on(device):
        result, h_n, c_n = _compute.forward(cell, _device.to_arrays(given, device),
                                            with_outputs(descriptor, training), name, arrays.xp)
    h = _device.to_tensor(result.h, device, dtype)  # [T,N,DH]
    h_n = _device.to_tensor(h_n, device, dtype)  # [N,DH]
    if training:
        z = _device.to_tensor(result.z_state, device)  # [T,N,DZH], the compute dtype
    else:
        z = torch.empty(0, dtype=_device.compute_dtype(dtype), device=device)
    if cell != "lstm":
        return h, h_n, z
    return h, _device.to_tensor(result.c, device, dtype), h_n, \
        _device.to_tensor(c_n, device, dtype), z


def _backward_impl(cell: str, tensors, h, c, z_state, gh, gc, ghn, gcn, code: str, backend,
                   needs, empty=True):
    """One gradient per input of ``tensors``: where not needed, an empty tensor (``empty``, as
    the operator's schema has it) or None."""
    names = INPUTS[cell]
    descriptor = decode(cell, code)
    saved = dict(zip(names, tensors))
    if z_state.dim() != 3:  # a forward with training=False kept none: made again, with it
        z_state = _forward_impl(cell, tensors, code, backend, True)[-1]
    device, dtype = h.device, h.dtype
    wanted = {name for name, need in zip(names, needs) if need and saved[name] is not None}
    arrays = _device.arrays_of(device)
    to_array = functools.partial(_device.to_array, device=device)
    given = _device.to_arrays({k: t for k, t in saved.items()
                               if k not in _compute.ONLY_FOR_GRADIENT or k in wanted}, device)
    result = ForwardArrays(to_array(h), to_array(c), to_array(z_state))  # the backend's arrays
    with arrays.on(device):
        out = _compute.backward(cell, descriptor, _device.backend_for(device, backend), given,
                                result, tuple(map(to_array, (gh, ghn, gc, gcn))), wanted, arrays,
                                source=saved["source"])
    grads = []
    for name in names:
        t, g = saved[name], out.get(name)
        if g is None:
            grads.append(torch.empty(0, dtype=dtype if t is None else t.dtype, device=device)
                         if empty else None)
            continue
        if tuple(g.shape) != tuple(t.shape):
            g = g.reshape(tuple(t.shape))  # bias [1,1,DGH] → [DGH], before wrapping
        grads.append(_device.to_tensor(g, device, t.dtype))
    return tuple(grads)


# -- the fake implementations: shapes and dtypes only ------------------------------------------

def _fake_forward(cell: str, tensors, code: str, training: bool):
    given = dict(zip(INPUTS[cell], tensors))
    _device.device_of(given)
    descriptor = decode(cell, code)
    source, R = given["source"], given["recurrent_weight"]
    D = 2 if descriptor.bidirectional else 1
    T, N, H = source.shape[0], source.shape[1], R.shape[-1]
    h = source.new_empty((T, N, D * H))
    h_n = source.new_empty((N, D * H))
    compute = _device.compute_dtype(source.dtype)
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


# -- torch.func.vmap ---------------------------------------------------------------------------

def _looped(call):
    """A vmap rule for ``call`` (an operator): the op on each slice of the mapped axis, the
    results stacked on a new first axis. Batching into the op's own batch axis would serve
    only calls whose weights are shared; a loop serves every argument mapped or not."""
    def rule(info, in_dims, *args):
        # an unmapped argument's dim is None (a list's: a list of them)
        outs = [call(*(a.select(d, b) if isinstance(d, int) else a for a, d in zip(args, in_dims)))
                for b in range(info.batch_size)]
        stacked = tuple(torch.stack(parts) for parts in zip(*outs))
        return stacked, (0,) * len(stacked)
    return rule


# -- the operators -------------------------------------------------------------------------------

def _forward_schema(cell: str) -> str:
    names = INPUTS[cell]
    args = ", ".join(f"Tensor{'?' if i >= 2 else ''} {n}" for i, n in enumerate(names))
    returns = "Tensor h, Tensor c, Tensor h_n, Tensor c_n, Tensor z_state" if cell == "lstm" \
        else "Tensor h, Tensor h_n, Tensor z_state"
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

    def backward_kernel(*args, empty=True):
        if lstm:
            h, c, z, gh, gc, ghn, gcn, code, backend, needs = args[n:]
        else:
            (h, z, gh, ghn, code, backend, needs), c, gc, gcn = args[n:], None, None, None
        return _backward_impl(cell, args[:n], h, c, z, gh, gc, ghn, gcn, code, backend, needs,
                              empty)

    def backward_fake(*args):
        return _fake_backward(cell, args[:n], args[n], args[-1])

    torch.library.custom_op(f"{NAMESPACE}::{op}", forward_kernel, mutates_args=(),
                            schema=_forward_schema(cell)).register_fake(forward_fake)
    torch.library.custom_op(f"{NAMESPACE}::{op}_backward", lambda *args: backward_kernel(*args),
                            mutates_args=(), schema=_backward_schema(cell)
                            ).register_fake(backward_fake)
    forward_op = getattr(torch.ops.rnngrad, op).default  # the public OpOverloads
    backward_op = getattr(torch.ops.rnngrad, f"{op}_backward").default
    torch.library.register_vmap(f"{NAMESPACE}::{op}", _looped(forward_op))
    torch.library.register_vmap(f"{NAMESPACE}::{op}_backward", _looped(backward_op))

    def setup_context(ctx, inputs, output):
        code, backend, training = inputs[n:]
        h = output[0]
        ctx.save_for_backward(*inputs[:n], h, output[1] if lstm else None, output[-1])
        ctx.code, ctx.backend = code, backend
        ctx.set_materialize_grads(False)

    def call_backward(*args):
        if torch.compiler.is_compiling():  # traced once: nothing to differentiate further
            return backward_op(*args)
        return gradient.apply(*args)

    def call_backward_eager(*args):
        if torch.is_grad_enabled():  # create_graph: through the Function that refuses
            return gradient.apply(*args)
        return backward_kernel(*args, empty=False)

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

    def backward(ctx, *grads):
        return formula(ctx, grads, call_backward)

    def eager_backward(ctx, *grads):
        return formula(ctx, grads, call_backward_eager)

    torch.library.register_autograd(f"{NAMESPACE}::{op}", backward, setup_context=setup_context)

    def refuse(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD)

    def nothing_to_save(ctx, inputs, output):
        pass

    torch.library.register_autograd(f"{NAMESPACE}::{op}_backward", refuse,
                                    setup_context=nothing_to_save)

    def below_autograd(call):
        def run(*args):
            if torch.compiler.is_compiling():  # traced without grad mode
                return call(*args)
            with _internals.below_autograd():  # the formula is the Function's
                return call(*args)
        return run

    def function(name, call, setup, formula, doc):
        return type(name, (torch.autograd.Function,), {
            "forward": staticmethod(below_autograd(call)), "setup_context": staticmethod(setup),
            "backward": staticmethod(formula), "vmap": staticmethod(_looped(call)),
            "__module__": __name__, "__doc__": doc})

    # The formulas again as autograd.Functions with setup_context, which torch.func's
    # transforms require (an operator's registered formula has none); the Python surface calls
    # the operators through them.
    gradient = function(f"{op}_backward_function", backward_op, nothing_to_save, refuse,
                        f"``torch.ops.{NAMESPACE}.{op}_backward``, not differentiable.")
    forward_function = function(
        f"{op}_function", forward_op, setup_context, backward,
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
    return (forward_op, backward_op), forward_function.apply, eager_function.apply, forward_kernel


_DEFINED = {cell: _define(cell) for cell in INPUTS}
#: cell → (forward operator, backward operator): the OpOverloads ``torch.ops.rnngrad.<op>``
OPS = {cell: defined[0] for cell, defined in _DEFINED.items()}
#: cell → the autograd.Function's apply that calls the operators (any call)
APPLY = {cell: defined[1] for cell, defined in _DEFINED.items()}
#: cell → the autograd.Function's apply that calls the kernels directly (plain eager calls)
EAGER = {cell: defined[2] for cell, defined in _DEFINED.items()}
#: cell → the forward kernel (plain eager calls that need no gradient)
KERNEL = {cell: defined[3] for cell, defined in _DEFINED.items()}
