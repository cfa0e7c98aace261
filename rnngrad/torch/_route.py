"""Which route a call takes: the one predicate of rnngrad.torch's fast routes.

A *plain eager* call (:func:`plain`: nothing compiling, exporting or transforming it, no
dispatch or function mode, plain tensors) may skip the dispatcher's Python custom-op layers:
the functions run the operators' kernels directly (``rnngrad.torch.ops.EAGER``, ``KERNEL``).
A layer's call that is plain and that :func:`one_node` accepts runs each layer as one autograd
node on the parameters as they are (``rnngrad.torch._layer``). Every other call takes the
general route, ``torch.ops.rnngrad.*`` through their autograd.Functions, which serves every
call; both routes compute the same op on the same arguments.
"""

from __future__ import annotations

import torch

import rnngrad
from rnngrad.torch import _device, _internals

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_DEVICES = ("cpu", "cuda", "mps")
#: dtypes the one-node route computes in as they are (the others are cast on the general one)
_NATIVE = (torch.float32, torch.float64)


def plain(tensors) -> bool:
    """Whether a call on ``tensors`` (None entries allowed) is plain eager PyTorch on a device a
    backend serves."""
    if _internals.transforming():  # first: Dynamo traces what follows
        return False
    first = None
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN:
            return False
        if first is None:
            first = t
    return first is not None and first.device.type in _DEVICES


def one_node(layer, x, states, mask, dtype) -> bool:
    """Whether ``layer``'s call on input ``x`` [T,N,I], initial ``states`` and ``mask``
    (tensors or None) in ``dtype`` runs each layer as one autograd node: a plain call, every
    tensor and parameter of ``dtype`` (the mask of any) on ``x``'s device, each parameter the
    layer's own (not parametrized or pruned: those take the general route); on the CPU float32
    or float64 without autocast, on CUDA float32 through ``metal-cuda``; never for tensors
    ``metal-mps`` takes."""
    if _internals.transforming():  # first: Dynamo traces what follows
        return False
    device = x.device
    kind = device.type
    if kind == "cpu":
        if dtype not in _NATIVE or torch.is_autocast_enabled("cpu"):
            return False
    elif kind != "cuda" or dtype != torch.float32 or not _cuda_ready(layer, device):
        return False
    if _device.takes_tensors(device):
        return False
    for t in (x, *states):
        if t is not None and (type(t) not in _PLAIN or t.dtype != dtype or t.device != device):
            return False
    if mask is not None and (type(mask) not in _PLAIN or mask.device != device):
        return False
    own = layer._parameters
    for names in layer._step_names:
        for name in names:
            p = own.get(name)  # None: parametrized or pruned, computed at each call
            if type(p) not in _PLAIN or p.dtype != dtype or p.device != device:
                return False
    return True


def _cuda_ready(layer, device) -> bool:
    """``metal-cuda`` chosen (or nothing) and available, no autocast."""
    return (layer.backend in (None, _device.CUDA_BACKEND)
            and not torch.is_autocast_enabled("cuda")
            and _device.CUDA_BACKEND in rnngrad.available_backends())
