"""Where a call runs: the tensors' device picks the rnngrad backend, and tensors cross into the
backend's arrays and back without copies.

- CPU tensors: the chosen CPU backend (``backend=None`` picks as everywhere in rnngrad). A
  tensor becomes a NumPy array sharing its memory (``Tensor.numpy()``); results come back as
  tensors sharing the NumPy arrays' memory (``torch.from_numpy``).
- CUDA tensors: the ``metal-cuda`` backend, where it is available. A tensor becomes a CuPy array
  through DLPack (that backend takes CuPy arrays and returns them), and results come back
  through DLPack (``torch.from_dlpack``): nothing goes through the host.
- Any other device (``mps``, ``meta``, XLA …), or CUDA without ``metal-cuda``: a
  ``RuntimeError`` naming the device and the backends that would serve it.
"""

from __future__ import annotations

import numpy as np
import torch

import rnngrad
from rnngrad import registry

#: the backend that runs on CUDA devices, taking and returning device arrays
CUDA_BACKEND = "metal-cuda"

_FLOATS = (torch.float16, torch.float32, torch.float64)
_NUMPY = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def _cuda_reason() -> str:
    """Why ``metal-cuda`` is not available here, as the registry says it."""
    for name, ok, _, reason in registry.status():
        if name == CUDA_BACKEND:
            return reason or "not available"
    return "it is not part of this installation of rnngrad"


def cpu_backends() -> tuple:
    return tuple(b for b in rnngrad.available_backends() if b != CUDA_BACKEND)


def device_of(named: dict) -> torch.device:
    """The one device of the tensors in ``named`` ({argument: tensor or None}); a ``ValueError``
    naming each argument's device when they differ."""
    device = None
    for t in named.values():
        if t is None:
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            listing = ", ".join(f"{k} on {v.device}" for k, v in named.items() if v is not None)
            raise ValueError(f"tensors: expected every tensor on one device, got {listing}")
    return device


def backend_for(device: torch.device, backend):
    """The backend name to hand rnngrad for tensors on ``device`` (None: rnngrad picks among
    the CPU backends), or the error that says which backends would serve that device."""
    if device.type == "cpu":
        if backend == CUDA_BACKEND:
            raise ValueError(f"backend: {CUDA_BACKEND!r} runs on CUDA devices, got tensors on "
                             f"cpu; CPU backends here: {cpu_backends()}")
        return backend
    if device.type == "cuda":
        if backend is not None and backend != CUDA_BACKEND:
            raise ValueError(f"backend: {backend!r} runs on the CPU, got tensors on {device}; use "
                             f"backend={CUDA_BACKEND!r} or None, or move the tensors with .cpu()")
        if CUDA_BACKEND not in rnngrad.available_backends():
            raise RuntimeError(
                f"tensors on {device}: no rnngrad backend available here runs on CUDA devices "
                f"(the {CUDA_BACKEND!r} backend would: {_cuda_reason()}); the available backends "
                f"{cpu_backends()} run on the CPU: move the tensors there with .cpu()")
        return CUDA_BACKEND
    raise RuntimeError(
        f"tensors on {device}: no rnngrad backend runs on {device.type!r} devices; "
        f"{CUDA_BACKEND!r} serves CUDA tensors "
        f"({'available' if CUDA_BACKEND in rnngrad.available_backends() else 'not available here'}), "
        f"and {cpu_backends()} serve CPU tensors: move the tensors with .cpu()")


def check_dtype(name: str, t: torch.Tensor):
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name}: expected a floating tensor (float16, float32 or float64), "
                        f"got {t.dtype}")


def to_array(t, device: torch.device):
    """The backend's view of tensor ``t`` (None stays None), sharing its memory."""
    if t is None:
        return None
    t = t.detach()
    if device.type == "cpu":
        return t.numpy()  # shares memory, any strides; rnngrad copies only what is not C-contiguous
    import cupy  # the metal-cuda backend takes and returns CuPy arrays

    return cupy.from_dlpack(t)


def to_arrays(named: dict, device: torch.device) -> dict:
    """{argument: the backend's view of the tensor} for the tensors of ``named`` that are
    not None (see :func:`to_array`)."""
    if device.type == "cpu":
        return {k: t.detach().numpy() for k, t in named.items() if t is not None}
    return {k: to_array(t, device) for k, t in named.items() if t is not None}


def placeholder(shape, dtype: torch.dtype, device: torch.device):
    """A zero tensor of ``shape`` whose values are never read: on the CPU, NumPy's zeros
    (calloc: pages the op never touches cost nothing)."""
    if device.type == "cpu":
        return torch.from_numpy(np.zeros(shape, dtype=_NUMPY[dtype]))
    return torch.zeros(shape, dtype=dtype, device=device)


def transposed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aᵀ b for a [K,M], b [K,N] (a weight gradient: flat(dA)ᵀ flat(source))."""
    return a.t().mm(b)


def namespace(a, device: torch.device):
    """The array module of the backend's arrays on ``device``: NumPy, or CuPy."""
    if device.type == "cpu":
        return np
    import cupy

    return cupy


def torch_dtype(dtype) -> torch.dtype:
    return {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
            np.dtype(np.float64): torch.float64}[np.dtype(dtype)]


def to_tensor(a, device: torch.device) -> torch.Tensor:
    """A tensor sharing the memory of the backend's result ``a`` (a tensor stays itself)."""
    if isinstance(a, torch.Tensor):
        return a
    if device.type == "cpu":
        if a.flags.writeable:
            try:
                return torch.from_numpy(a)
            except ValueError:  # negative strides, which torch.from_numpy refuses
                pass
        return torch.from_numpy(np.array(a))  # a copy: read-only (a backend's view) or flipped
    return torch.from_dlpack(a)
