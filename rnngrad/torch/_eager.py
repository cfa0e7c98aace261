"""The layers' plain eager path on the CPU: one autograd node per layer of a module, on
``torch.nn``'s parameters as they are.

A layer's call made of the op's arguments (``op_parameters``: the bias sum, concatenations) and
the op's autograd.Function puts several nodes in the graph, each with its own cost in the
forward, in autograd's engine and in the gradient accumulation; at small sizes they cost more
than the op. Here each layer (all its directions) is one autograd.Function whose inputs are
the layer's input, initial states and parameters, and whose outputs are PyTorch's (output
[T,N,D·H], h_n and c_n [D,N,H]). Inside it, on NumPy views of the tensors:

- the op's arguments are made from the parameters (``input_weight`` = the directions'
  ``weight_ih`` concatenated, ``recurrent_weight`` = their ``weight_hh`` stacked, ``bias`` =
  ``bias_ih + bias_hh``, or for the GRU with a secondary bias the r and z blocks summed, the
  candidate block ``bias_ih``'s and ``bias_hh``'s candidate block the ``secondary_bias``), as
  ``rnngrad.torch.layers`` documents;
- the op runs through :func:`rnngrad.api.run_checked` (its inputs checked once per signature);
- the backward runs the gradient op once and hands each parameter its part: the bias gradient
  to ``bias_ih`` and (a copy) to ``bias_hh``, the GRU's candidate block of ``bias_hh`` from the
  secondary bias's gradient, each direction its rows of the weights' gradients. When the input
  needs no gradient (a model's first layer) the gradient op runs without the input weight and
  the weight's gradient is dAᵀ·input, as in ``rnngrad.torch.functions``.

The path serves plain eager calls (nothing compiling, exporting or transforming them, plain
tensors, no autocast) without a mask, of CPU tensors in float32 or float64 (NumPy views, the
CPU backends) and of CUDA tensors in float32 while PyTorch works on the legacy default stream
(CuPy views, ``metal-cuda``; on another stream the general path's DLPack handshake orders the
streams). Every other call takes the general path (the op's autograd.Function and
``torch.ops.rnngrad``). Both compute the same op on the same arguments; a gradient of a
gradient is refused here as there.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import rnngrad
from rnngrad.torch import _device, functions

_NATIVE = (torch.float32, torch.float64)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class _Host:
    """The CPU's arrays: NumPy views of the tensors, tensors over the results' memory."""

    xp = np

    @staticmethod
    def backend(layer):
        return layer.backend  # None: rnngrad picks among the CPU backends

    @staticmethod
    def view(t):
        return t.detach().numpy()

    tensor = staticmethod(_device.from_numpy)

    @staticmethod
    def copied(a):
        return torch.from_numpy(np.array(a))

    @staticmethod
    def on(device):
        return contextlib.nullcontext()


class _Cuda:
    """A CUDA device's arrays: CuPy views of the tensors (``metal-cuda`` takes and returns
    CuPy arrays), tensors over the results' memory through DLPack."""

    def __init__(self):
        import cupy

        self.xp = cupy

    @staticmethod
    def backend(layer):
        return _device.CUDA_BACKEND

    @staticmethod
    def view(t):
        return _device._cupy_view(t.detach())

    tensor = staticmethod(_device._from_cupy)

    @staticmethod
    def copied(a):
        return _device._from_cupy(a.copy())

    def on(self, device):
        """The block in which CuPy makes its arrays on ``device`` (the backend runs where its
        arrays are; the arrays it makes here go to the same GPU)."""
        return self.xp.cuda.Device(device.index)


_ARRAYS = {"cpu": _Host}


def _arrays(device):
    """The array vocabulary of ``device``'s tensors (:class:`_Host` or :class:`_Cuda`)."""
    kind = _ARRAYS.get(device.type)
    if kind is None:
        kind = _ARRAYS[device.type] = _Cuda()
    return kind


def _cuda_serves(layer, x) -> bool:
    """Whether CUDA input ``x`` can take this path: ``metal-cuda`` chosen (or nothing) and
    available, PyTorch on the legacy default stream, no autocast."""
    return (layer.backend in (None, _device.CUDA_BACKEND)
            and torch._C._cuda_getCurrentRawStream(x.device.index) == 0
            and not torch.is_autocast_enabled("cuda")
            and _device.CUDA_BACKEND in rnngrad.available_backends())


def serves(layer, x, h0, c0, dtype) -> bool:
    """Whether this path runs ``layer`` on input ``x`` [T,N,I] and initial states ``h0``,
    ``c0`` (tensors or None) in ``dtype``."""
    if torch.compiler.is_compiling() or torch._C._functorch.peek_interpreter_stack() is not None \
            or functions._get_current_dispatch_mode() is not None \
            or torch._C._is_torch_function_mode_enabled():  # first: Dynamo traces what follows
        return False
    device = x.device
    if device.type == "cpu":
        if dtype not in _NATIVE or torch.is_autocast_enabled("cpu") \
                or _device.takes_tensors(device):  # metal-mps's stand-in runs on CPU tensors
            return False
    elif device.type != "cuda" or dtype != torch.float32 or _device.takes_tensors(device) \
            or not _cuda_serves(layer, x):
        return False
    for t in (x, h0, c0):
        if t is not None and (type(t) not in _PLAIN or t.dtype != dtype or t.device != device):
            return False
    for p in layer._parameters.values():
        if type(p) not in _PLAIN or p.dtype != dtype or p.device != device:
            return False
    return True


def parameter_names(layer, k: int) -> list:
    """The names of layer ``k``'s parameters, each direction's weight_ih, weight_hh, [bias_ih,
    bias_hh], [peephole] in turn (PyTorch's order of registration)."""
    names = layer._layer_names[k]
    kinds = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if layer.bias else []) \
        + (["peephole"] if layer._has_peephole() else [])
    return [names[kind][d] for d in range(layer.num_directions) for kind in kinds]


def run(layer, x, h0, c0, k: int):
    """Layer ``k`` of ``layer`` on ``x`` [T,N,I]: (output [T,N,D·H], h_n [D,N,H], c_n [D,N,H]
    or None); ``h0``, ``c0``: its initial states [D,N,H] or None."""
    if x.is_cpu and layer.backend == _device.CUDA_BACKEND:  # its error, as on the general path
        _device.backend_for(x.device, layer.backend)
    table = layer._parameters
    params = [table[name] for name in layer._step_names[k]]
    training = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in params)
        or h0 is not None and h0.requires_grad or c0 is not None and c0.requires_grad)
    if training:
        # Function.apply less its Python layer, which walks every argument for functorch's dead
        # wrappers (serves() refused live transforms): the tensors that could be one are these
        out = _apply(layer, k, _unwrap(x), h0 if h0 is None else _unwrap(h0),
                     c0 if c0 is None else _unwrap(c0), *params)
    else:
        out, _ = _forward(layer, k, x, h0, c0, params, False)
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


def _sided(a, D: int):
    """[D,N,H] → [N,D·H] (PyTorch's states → rnngrad's), a view for D = 1."""
    return a[0] if D == 1 else a.transpose(1, 0, 2).reshape(a.shape[1], -1)


def _stacked(a, D: int):
    """[N,D·H] → [D,N,H] (rnngrad's states → PyTorch's), a view."""
    return a[None] if D == 1 else a.reshape(a.shape[0], D, -1).transpose(1, 0, 2)


def _op_arguments(layer, arrays: list, xp) -> dict:
    """The op's parameter arguments from the layer's parameters (array views of module
    ``xp``, the order of :func:`parameter_names`); see the module docstring."""
    H, bias, peephole = layer.hidden_size, layer.bias, layer._has_peephole()
    if layer.num_directions == 1:
        out = {"input_weight": arrays[0], "recurrent_weight": arrays[1]}  # [GH,I], [GH,H]
        if bias:
            b_ih, b_hh = arrays[2], arrays[3]
            if layer._secondary():
                out["bias"] = xp.concatenate([b_ih[:2 * H] + b_hh[:2 * H], b_ih[2 * H:]])  # [3H]
                out["secondary_bias"] = b_hh[2 * H:]  # [H]
            else:
                out["bias"] = b_ih + b_hh  # [GH]
        if peephole:
            out["peephole"] = arrays[-1]  # [4H]
        return out
    per = len(arrays) // 2
    sides = arrays[:per], arrays[per:]
    out = {"input_weight": xp.concatenate([s[0] for s in sides]),  # [2GH,I]
           "recurrent_weight": xp.stack([s[1] for s in sides])}  # [2,GH,H]
    if bias:
        if layer._secondary():
            out["bias"] = xp.concatenate([
                xp.concatenate([s[2][:2 * H] + s[3][:2 * H], s[2][2 * H:]]) for s in sides])  # [6H]
            out["secondary_bias"] = xp.concatenate([s[3][2 * H:] for s in sides])  # [2H]
        else:
            out["bias"] = xp.concatenate([s[2] + s[3] for s in sides])  # [2GH]
    if peephole:
        out["peephole"] = xp.stack([s[-1] for s in sides])  # [2,4H]
    return out


def _last(seq, initial, D: int, xp):
    """Each direction's last state [D,N,H] of ``seq`` [T,N,D·H] (processing order
    unidirectional, aligned bidirectional), an array of its own; the initial state (an array
    [N,D·H] or None: zeros) when T = 0."""
    T, N, DH = seq.shape
    if T == 0:
        last = xp.zeros((N, DH), seq.dtype) if initial is None else initial
        return _stacked(last, D).copy()
    if D == 1:
        return seq[-1:].copy()  # [1,N,H]
    H = DH // 2
    return xp.stack([seq[-1, :, :H], seq[0, :, H:]])  # [2,N,H]


def _forward(layer, k, x, h0, c0, params, training):
    """The op of layer ``k`` on its tensors: ((output, h_n[, c_n]) as tensors, the op's
    arguments and results as arrays)."""
    D, arrays = layer.num_directions, _arrays(x.device)
    xp, tensor = arrays.xp, arrays.tensor
    with arrays.on(x.device):
        given = _op_arguments(layer, _views(layer, k, params, arrays), xp)
        given["source"] = arrays.view(x)  # [T,N,I]
        if h0 is not None:
            given["init_state"] = _sided(arrays.view(h0), D)  # [N,DH]
        if c0 is not None:
            given["init_cell"] = _sided(arrays.view(c0), D)  # [N,DH]
        result = functions._FORWARD[layer.cell](**given, descriptor=layer._descriptors[training],
                                                backend=arrays.backend(layer))
        out = (tensor(result.h), tensor(_last(result.h, given.get("init_state"), D, xp)))
        if layer.cell == "lstm":  # [T,N,DH], [D,N,H]
            out += (tensor(_last(result.c, given.get("init_cell"), D, xp)),)
    return out, (given, result)


class _Refused(torch.autograd.Function):
    """The gradients of a backward run with ``create_graph=True``: differentiating them
    again raises (rnngrad's gradient ops are not differentiable)."""

    @staticmethod
    def forward(ctx, anchor, *grads):
        return tuple(None if g is None else g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(functions.DOUBLE_BACKWARD)


class _Layer(torch.autograd.Function):
    """Layer ``k`` of a module, all directions: (layer, k, x, h0, c0, *parameters) →
    (output [T,N,D·H], h_n [D,N,H][, c_n [D,N,H]])."""

    @staticmethod
    def forward(ctx, layer, k, x, h0, c0, *params):
        out, (given, result) = _forward(layer, k, x, h0, c0, params, True)
        # the tensors whose values the gradient op reads (the biases' it does not), for
        # PyTorch's check that none changed in place before the backward; the arrays, so that
        # the backward makes no views again
        ctx.save_for_backward(x, h0, c0, out[0] if layer.cell == "gru" else None,
                              *[params[i] for i in layer._step_reads[k]])
        ctx.layer, ctx.given, ctx.result = layer, given, result
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, gh, ghn, gcn=None):
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad
        x = saved[0]
        arrays = _arrays(x.device)
        with arrays.on(x.device):
            grads = _backward(ctx.layer, ctx.given, ctx.result, x, needs[2:], gh, ghn, gcn,
                              arrays)
        if torch.is_grad_enabled():  # create_graph: their own gradient is refused
            anchor = next((t for t in saved if t is not None and t.requires_grad), None)
            grads = _Refused.apply(torch.zeros((), requires_grad=True) if anchor is None
                                   else anchor, *grads)
        return (None, None, *grads)


_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _Layer)
_unwrap = torch._C._functorch.unwrap_if_dead


def _backward(layer, given, result, x, needs, gh, ghn, gcn, arrays):
    """The gradients of (x, h0, c0, *parameters), None where not needed."""
    D, H, cell = layer.num_directions, layer.hidden_size, layer.cell
    xp, view = arrays.xp, arrays.view
    h = result.h  # [T,N,DH]
    T = h.shape[0]
    need_x, need_params = needs[0], needs[3:]
    per = len(need_params) // D
    op = dict(given, z_state=result.z_state)
    op["source_gradient"] = xp.zeros(h.shape, h.dtype) if gh is None \
        else view(gh)  # [T,N,DH]: the op needs one
    if ghn is not None:
        op["state_gradient"] = _sided(view(ghn), D)  # [N,DH]
    if cell == "gru":
        op["output_fwd"] = h
    elif cell == "lstm":
        op["cell_output_fwd"] = result.c
        if gcn is not None:
            op["cell_gradient"] = _sided(view(gcn), D)  # [N,DH], the final cell's
    if layer.bias:
        # the op reads neither bias (z_state holds the pre-activations): given for its gradient
        need_ih = need_params[2] or D == 2 and need_params[per + 2]
        need_hh = need_params[3] or D == 2 and need_params[per + 3]
        if not (need_ih or need_hh):
            del op["bias"]
        if not need_hh and "secondary_bias" in op:
            del op["secondary_bias"]
    weight = given["input_weight"]  # [DGH,I]
    if not need_x:
        # as rnngrad.torch.functions: without the input weight the op skips d_source = dA W;
        # its source gradient is then dA, and the weight's gradient dAᵀ x is PyTorch's
        del op["input_weight"]
        op["source"] = xp.zeros((T, h.shape[1], weight.shape[0]), h.dtype)  # [T,N,DGH]
    out = functions._GRADIENTS[cell](**op, descriptor=layer.descriptor,
                                     backend=arrays.backend(layer))

    # T = 0: the op may hand back a state gradient as it was given
    tensor = arrays.tensor if T > 0 else arrays.copied
    grads = [tensor(out.source) if need_x else None,  # [T,N,I]
             tensor(_stacked(out.init_state, D)) if needs[1] else None,  # [D,N,H]
             tensor(_stacked(out.init_cell, D)) if needs[2] else None]
    dW = None
    if need_params[0] or D == 2 and need_params[per]:
        if need_x:
            dW = tensor(out.input_weight)  # [DGH,I]
        else:
            dA = arrays.tensor(out.source)  # [T,N,DGH]
            dW = _device.transposed_product(dA.reshape(-1, weight.shape[0]),
                                            x.detach().reshape(-1, weight.shape[1]))  # [DGH,I]
    GH = weight.shape[0] // D
    bias = out.bias.reshape(-1) if out.bias is not None else None  # [DGH]
    for d in range(D):
        need = need_params[d * per:(d + 1) * per]
        grads.append(None if not need[0] else dW if D == 1 else dW[d * GH:(d + 1) * GH])
        grads.append(tensor(out.recurrent_weight[d]) if need[1] else None)  # [GH,H]
        if layer.bias:
            db = bias[d * GH:(d + 1) * GH] if D == 2 else bias  # [GH]
            grads.append(tensor(db) if need[2] else None)
            if not need[3]:
                grads.append(None)
            elif "secondary_bias" in given:  # r, z from the bias; the candidate's own
                grads.append(arrays.tensor(xp.concatenate(
                    [db[:2 * H], out.secondary_bias[d * H:(d + 1) * H]])))
            else:
                grads.append(arrays.copied(db))
        if per % 2:  # the peephole
            grads.append(tensor(out.peephole[d]) if need[-1] else None)  # [4H]
    return grads
