"""One layer of an ``rnngrad.torch`` module, all its directions: ``(output [T,N,D·H], h_n
[D,N,H], c_n [D,N,H] or None)`` from its input ``x`` [T,N,I] and initial states ``h0``, ``c0``
[D,N,H] (or None). The module's layer stack (``rnngrad.torch.layers``) calls one of three:

- :func:`one_node`: the layer as one autograd node on torch.nn's parameters as they are. Its
  forward makes the op's arguments from NumPy (or CuPy) views of the parameters
  (``rnngrad.convert.parameters``), runs the op and returns PyTorch's outputs; its backward
  runs the gradient op once (``rnngrad.torch._compute.backward``) and hands each parameter its
  part back by name. Several nodes (the bias sum, concatenations, the op's Function) cost more
  than the op at small sizes; one does not. For plain eager calls that
  ``rnngrad.torch._route.one_node`` accepts.
- :func:`general`: the op's arguments made with differentiable tensor operations and the op's
  operator (``rnngrad.torch.functions.run``): every other call (torch.compile, torch.export,
  torch.func, autocast, float16 and bfloat16, ``metal-mps``).
- :func:`packed`: a layer of a ``PackedSequence`` (each direction over the padded batch, the
  lengths applied around it).

All three compute the same op on the same arguments (SEMANTICS.md, with
``rnngrad.convert.parameters``' mapping).
"""

from __future__ import annotations

import torch

from rnngrad import states
from rnngrad.convert import parameters
from rnngrad.torch import _compute, _device, _internals, functions, ops


# -- one node a layer ---------------------------------------------------------------------------

def one_node(layer, k: int, x, h0, c0, mask):
    """Layer ``k`` of ``layer`` as one autograd node (module docstring)."""
    if x.is_cpu and layer.backend == _device.CUDA_BACKEND:  # its error, as on the general route
        _device.backend_for(x.device, layer.backend)
    params = layer.step_parameters(k)
    training = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in params)
        or h0 is not None and h0.requires_grad or c0 is not None and c0.requires_grad)
    if training:
        # no transform is live (the route's check), so only these can be a dead one's wrappers
        out = _APPLY(layer, k, _internals.unwrap(x), h0 if h0 is None else _internals.unwrap(h0),
                     c0 if c0 is None else _internals.unwrap(c0), mask, *params)
    else:
        out, _ = _forward(layer, k, x, h0, c0, mask, params, False)
    return out if len(out) == 3 else (*out, None)


def _views(layer, k: int, params, arrays) -> list:
    """Array views of layer ``k``'s parameters ``params`` (``arrays``' vocabulary), kept on the
    layer from one call to the next while each parameter keeps its memory, strides and shape
    (an optimiser's in-place update keeps them; ``p.data = …`` or ``.to()`` do not; addresses
    are unique across a process's GPUs, so is_cuda tells the CPU's from theirs)."""
    views = layer.__dict__.get("_array_views")
    if views is None:
        views = layer.__dict__["_array_views"] = {}
    out = []
    for name, p in zip(layer._step_names[k], params):
        layout = (p.data_ptr(), p.stride(), p.shape, p.is_cuda)
        entry = views.get(name)
        if entry is None or entry[0] != layout:
            entry = views[name] = (layout, arrays.view(p))
        out.append(entry[1])
    return out


def _forward(layer, k, x, h0, c0, mask, params, training):
    """The op of layer ``k`` on its tensors: ((output, h_n[, c_n]) as tensors, the op's
    arguments and results as arrays)."""
    D, arrays = layer.num_directions, _device.arrays_of(x.device)
    xp, tensor = arrays.xp, arrays.tensor
    with arrays.on(x.device):
        sides = parameters.sides(_views(layer, k, params, arrays), layer._step_kinds[k], D)
        given = parameters.op_arguments(sides, H=layer.hidden_size,
                                        secondary=layer._secondary(), xp=xp)
        given["source"] = arrays.view(x)  # [T,N,I]
        if h0 is not None:
            given["init_state"] = states.sided(arrays.view(h0), D, xp)  # [N,DH]
        if c0 is not None:
            given["init_cell"] = states.sided(arrays.view(c0), D, xp)  # [N,DH]
        if mask is not None:
            given["mask"] = arrays.view(mask)
        result, h_n, c_n = _compute.forward(layer.cell, given, layer._descriptors[training],
                                            _backend(layer, x), xp)
        out = (tensor(result.h), tensor(_stacked_array(h_n, D, xp)))  # [T,N,DH], [D,N,H]
        if layer.cell == "lstm":
            out += (tensor(_stacked_array(c_n, D, xp)),)  # [D,N,H]
    return out, (given, result)


def _stacked_array(final, D, xp):
    """[N,D·H] → [D,N,H], contiguous (as torch.nn's h_n)."""
    return final[None] if D == 1 else xp.ascontiguousarray(states.stacked(final, D, xp))


def _backend(layer, x):
    """The backend name for the layer's arrays: ``metal-cuda`` for CUDA tensors, else the
    layer's (None: rnngrad picks among the CPU backends)."""
    return _device.CUDA_BACKEND if x.is_cuda else layer.backend


class _Refused(torch.autograd.Function):
    """The gradients of a backward run with ``create_graph=True``: differentiating them
    again raises (rnngrad's gradient ops are not differentiable)."""

    @staticmethod
    def forward(ctx, anchor, *grads):
        return tuple(None if g is None else g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(ops.DOUBLE_BACKWARD)


class _OneNode(torch.autograd.Function):
    """Layer ``k`` of a module, all directions: (layer, k, x, h0, c0, mask, *parameters) →
    (output [T,N,D·H], h_n [D,N,H][, c_n [D,N,H]])."""

    @staticmethod
    def forward(ctx, layer, k, x, h0, c0, mask, *params):
        out, (given, result) = _forward(layer, k, x, h0, c0, mask, params, True)
        # the tensors whose values the gradient op reads (the biases' it does not), for
        # PyTorch's check that none changed in place before the backward
        ctx.save_for_backward(x, h0, c0, out[0] if layer.cell == "gru" else None,
                              *[params[i] for i in layer._step_reads[k]])
        ctx.layer, ctx.k, ctx.given, ctx.result = layer, k, given, result
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, gh, ghn, gcn=None):
        saved = ctx.saved_tensors
        x = saved[0]
        arrays = _device.arrays_of(x.device)
        with arrays.on(x.device):
            grads = _backward(ctx.layer, ctx.k, ctx.given, ctx.result, x,
                              ctx.needs_input_grad[2:], (gh, ghn, gcn), arrays)
        if torch.is_grad_enabled():  # create_graph: their own gradient is refused
            anchor = next((t for t in saved if t is not None and t.requires_grad), None)
            grads = _Refused.apply(torch.zeros((), requires_grad=True) if anchor is None
                                   else anchor, *grads)
        return (None, None, *grads)


_APPLY = _internals.fast_apply(_OneNode)


def _backward(layer, k, given, result, x, needs, grads, arrays):
    """The gradients of (x, h0, c0, mask, *parameters), None where not needed."""
    D, xp, view, tensor = layer.num_directions, arrays.xp, arrays.view, arrays.tensor
    gh, ghn, gcn = grads
    kinds, need_params = layer._step_kinds[k], needs[4:]
    secondary = layer._secondary()
    wanted = _wanted(layer, k, needs, secondary)
    out = _compute.backward(
        layer.cell, layer.descriptor, _backend(layer, x), given, result,
        (None if gh is None else view(gh), None if ghn is None else states.sided(view(ghn), D, xp),
         None, None if gcn is None else states.sided(view(gcn), D, xp)), wanted, arrays, source=x)
    sides = parameters.parameter_gradients(out, D=D, H=layer.hidden_size, secondary=secondary,
                                           xp=xp)
    back = [tensor(out["source"]) if "source" in out else None,  # [T,N,I]
            tensor(states.stacked(out["init_state"], D, xp)) if "init_state" in out else None,
            tensor(states.stacked(out["init_cell"], D, xp)) if "init_cell" in out else None,
            None]  # the mask
    for (d, kind), need in zip(kinds, need_params):
        g = sides[d].get(kind) if need else None
        if g is None:
            back.append(None)
        elif kind == "bias_hh" and g is sides[d].get("bias_ih"):
            back.append(arrays.copied(g))  # two parameters' gradients never share memory
        else:
            back.append(tensor(g))
    return back


def _wanted(layer, k, needs, secondary) -> frozenset:
    """The op arguments whose gradients layer ``k``'s backward needs, given which of (x, h0,
    c0, mask, *parameters) need one (``needs``), kept on the layer per ``needs``."""
    kept = layer.__dict__.setdefault("_wanted", {})
    wanted = kept.get((k, needs))
    if wanted is None:
        wanted = {argument for argument, need in zip(layer._step_arguments[k], needs[4:])
                  if need}
        wanted |= {name for name, need in zip(("source", "init_state", "init_cell"), needs)
                   if need}
        if secondary and "bias" in wanted:
            wanted.add("secondary_bias")  # bias_hh's candidate block
        wanted = kept[(k, needs)] = frozenset(wanted)
    return wanted


# -- the op's operator on differentiable arguments ----------------------------------------------

def general(layer, k: int, x, h0, c0, mask):
    """Layer ``k`` of ``layer`` through the op's operator (module docstring)."""
    D = layer.num_directions
    given = dict.fromkeys(functions.INPUTS[layer.cell])
    given.update(layer.op_parameters(k), source=x, mask=mask)
    if h0 is not None:
        given["init_state"] = states.sided(h0, D, torch)  # [N,DH]
    if c0 is not None:
        given["init_cell"] = states.sided(c0, D, torch)  # [N,DH]
    out = functions.run(layer.cell, given, layer._code, layer.backend)
    h_n = _stacked(out.final_state, D)
    c_n = _stacked(out.final_cell, D) if layer.cell == "lstm" else None
    return out.state, h_n, c_n


def _stacked(final, D):
    """[N,D·H] → [D,N,H], contiguous (as torch.nn's h_n)."""
    return states.stacked(final, D, torch).contiguous()


# -- a layer of a PackedSequence ----------------------------------------------------------------

def _time_gather(a, index):
    """``a`` [T,N,F] with row n's step t taken from step ``index[t, n]``."""
    return a.gather(0, index.unsqueeze(-1).expand(-1, -1, a.shape[-1]))


def packed(layer, k: int, x, h0, c0, lengths):
    """Layer ``k`` of ``layer`` on the padded batch ``x`` [T,N,I] of sequences of ``lengths``
    [N] (a CPU tensor): torch.nn's semantics for a ``PackedSequence`` from rnngrad's
    unidirectional op, which has no sequence lengths. Each direction runs the op once over the
    padded batch (batch rows never mix in a recurrence) and the lengths are applied around it,
    with differentiable indexing:

    - forward direction: the op runs from step 0; sequence n's final state is its state at
      step L_n − 1, gathered; its steps past L_n are zeroed in the output;
    - reverse direction: each sequence's first L_n steps are reversed in place (a per-row time
      gather; the padding stays after them), the op runs from step 0, so it starts at each
      sequence's own end; the same gather puts its outputs back in input time, the final state
      is the state at step L_n − 1, and the padding is zeroed.

    The padding holds zeros and every output computed from it is dropped, so nothing from it
    reaches a result, and its gradients are zero: nothing reaches any gradient either."""
    T, N = x.shape[0], x.shape[1]
    device, H, lstm = x.device, layer.hidden_size, layer.cell == "lstm"
    steps = torch.arange(T, device=device).unsqueeze(1)  # [T,1]
    ends = lengths.to(device).unsqueeze(0)  # [1,N]
    valid = (steps < ends).unsqueeze(-1)  # [T,N,1]
    flip = torch.where(steps < ends, ends - 1 - steps, steps)  # [T,N], an involution
    last = (lengths.to(device) - 1).view(1, N, 1).expand(1, N, H)  # [1,N,H]
    outputs, finals_h, finals_c = [], [], []
    for d in range(layer.num_directions):
        given = dict.fromkeys(functions.INPUTS[layer.cell])
        given.update(layer.op_parameters(k, d), source=x if d == 0 else _time_gather(x, flip))
        if h0 is not None:
            given["init_state"] = h0[d]
        if c0 is not None:
            given["init_cell"] = c0[d]
        out = functions.run(layer.cell, given, layer._one_direction_code, layer.backend)
        finals_h.append(out.state.gather(0, last)[0])  # [N,H]
        if lstm:
            finals_c.append(out.cell.gather(0, last)[0])
        h = out.state if d == 0 else _time_gather(out.state, flip)  # [T,N,H]
        outputs.append(h * valid)
    output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)  # [T,N,DH]
    return output, torch.stack(finals_h), torch.stack(finals_c) if lstm else None
