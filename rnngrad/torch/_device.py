"""Where a call runs: the tensors' device picks the rnngrad backend, and tensors cross into the
backend's arrays and back without copies (:class:`Arrays`, one per kind of device).

- CPU tensors: the chosen CPU backend (``backend=None`` picks as everywhere in rnngrad). A
  tensor becomes a NumPy array sharing its memory (``Tensor.numpy()``); results come back as
  tensors sharing the NumPy arrays' memory (``torch.from_numpy``).
- CUDA tensors: the ``metal-cuda`` backend, where it is available. A tensor becomes a CuPy array
  over its memory (that backend takes CuPy arrays and returns them), and results come back
  through DLPack: nothing goes through the host. Around an op (:meth:`Arrays.on`) CuPy works on
  PyTorch's current stream and allocates through PyTorch's caching allocator, so the op's
  kernels queue behind PyTorch's work, its outputs and scratch are PyTorch's memory (a CUDA
  graph's pool while one is captured), and the op returns without waiting for the GPU.
- MPS tensors: the ``metal-mps`` backend, where it is available (PyTorch 2.7 or later on a
  Mac). Tensors cross as they are (:mod:`rnngrad.backends.metal.mps.tensors`) and results come
  back as tensors on the device: nothing goes through the host. The same holds for the tensors
  of a device that ``rnngrad.backends.metal.harness.contexts.mps_standin`` runs ``metal-mps``
  on (CPU or CUDA tensors, without a Mac).
- Any other device (``meta``, XLA …), CUDA without ``metal-cuda`` or MPS without
  ``metal-mps``: a ``RuntimeError`` naming the device and the backends that would serve it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

import rnngrad
from rnngrad import registry
from rnngrad.backends.metal.mps import tensors
from rnngrad.torch import _internals

#: the backend that runs on CUDA devices, taking and returning device arrays
CUDA_BACKEND = "metal-cuda"
#: the backend that runs on MPS devices, taking and returning tensors
MPS_BACKEND = "metal-mps"

#: dtypes computed in float32 and returned in their own (no backend computes in them)
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NUMPY = {torch.float32: np.float32, torch.float64: np.float64}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a tensor of ``dtype`` is computed in: float32 for float16 and bfloat16."""
    return torch.float32 if dtype in AUTOCAST_DTYPES else dtype


def _reason(backend: str) -> str:
    """Why ``backend`` is not available here, as the registry says it."""
    for name, ok, _, reason in registry.status():
        if name == backend:
            return reason or "not available"
    return "it is not part of this installation of rnngrad"


def cpu_backends() -> tuple:
    return tuple(b for b in rnngrad.available_backends() if b not in (CUDA_BACKEND, MPS_BACKEND))


def takes_tensors(device: torch.device) -> bool:
    """Whether tensors on ``device`` go to ``metal-mps`` as they are: MPS tensors, and those of
    the device the stand-in runs on."""
    return device.type in tensors.DEVICES


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
    if takes_tensors(device):
        if backend is not None and backend != MPS_BACKEND:
            raise ValueError(f"backend: tensors on {device} run on {MPS_BACKEND!r}, got "
                             f"backend={backend!r}; use backend={MPS_BACKEND!r} or None, or "
                             f"move the tensors with .cpu()")
        if MPS_BACKEND not in rnngrad.available_backends():
            raise RuntimeError(
                f"tensors on {device}: no rnngrad backend available here runs on MPS devices "
                f"(the {MPS_BACKEND!r} backend would: {_reason(MPS_BACKEND)}); the "
                f"available backends {cpu_backends()} run on the CPU: move the tensors there "
                f"with .cpu()")
        return MPS_BACKEND
    if device.type == "cpu":
        if backend in (CUDA_BACKEND, MPS_BACKEND):
            raise ValueError(f"backend: {backend!r} runs on "
                             f"{'CUDA' if backend == CUDA_BACKEND else 'MPS'} devices, got "
                             f"tensors on cpu; CPU backends here: {cpu_backends()}")
        return backend
    if device.type == "cuda":
        if backend is not None and backend != CUDA_BACKEND:
            raise ValueError(f"backend: {backend!r} runs on the CPU, got tensors on {device}; use "
                             f"backend={CUDA_BACKEND!r} or None, or move the tensors with .cpu()")
        if CUDA_BACKEND not in rnngrad.available_backends():
            raise RuntimeError(
                f"tensors on {device}: no rnngrad backend available here runs on CUDA devices "
                f"(the {CUDA_BACKEND!r} backend would: {_reason(CUDA_BACKEND)}); the available "
                f"backends {cpu_backends()} run on the CPU: move the tensors there with .cpu()")
        return CUDA_BACKEND
    here = rnngrad.available_backends()
    state = {b: "available" if b in here else "not available here"
             for b in (CUDA_BACKEND, MPS_BACKEND)}
    raise RuntimeError(
        f"tensors on {device}: no rnngrad backend runs on {device.type!r} devices; "
        f"{CUDA_BACKEND!r} serves CUDA tensors ({state[CUDA_BACKEND]}), {MPS_BACKEND!r} MPS "
        f"tensors ({state[MPS_BACKEND]}), and {cpu_backends()} serve CPU tensors: move the "
        f"tensors with .cpu()")


def check_dtype(name: str, t: torch.Tensor):
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name}: expected a floating tensor, got {t.dtype}, which no rnngrad "
                        f"backend computes in: float32 and float64 are computed as they are, "
                        f"float16 and bfloat16 in float32; cast it (for example .float())")


def check_served(given: dict, device: torch.device):
    """The dtypes of ``given`` ({argument: tensor or None}, the mask excepted), as rnngrad's
    checks cannot see them once float16 and bfloat16 are cast to float32: one dtype for all,
    and on CUDA no float64 (``metal-cuda`` computes in float32)."""
    source = given["source"]
    for name, t in given.items():
        if t is not None and name != "mask" and t.dtype != source.dtype \
                and (source.dtype in AUTOCAST_DTYPES or t.dtype in AUTOCAST_DTYPES):
            raise TypeError(f"{name}: expected dtype {source.dtype} (the source's: all array "
                            f"inputs share one floating dtype), got {t.dtype}")
    gpu = MPS_BACKEND if takes_tensors(device) else CUDA_BACKEND if device.type == "cuda" \
        else None
    if gpu is not None and source.dtype == torch.float64:
        raise TypeError(f"source: float64 tensors on {device}: {gpu!r} computes in "
                        f"float32 (float16 and bfloat16 too, returned in their dtype); cast "
                        f"with .float(), or move the tensors to the CPU (.cpu()), where the "
                        f"CPU backends compute in float64")


# -- the arrays of each kind of device -----------------------------------------------------------

_NOTHING = contextlib.nullcontext()  # reusable: the CPU's arrays need no block


class Arrays:
    """The arrays a backend takes for the tensors of one kind of device, and the way back:
    ``xp`` (their array module), ``view(t)`` (a tensor's memory as one, no copy), ``tensor(a)``
    (a result's memory as a tensor, no copy), ``copied(a)`` (a tensor of a copy) and ``on(device)``
    (the block in which new arrays are made on that device)."""

    xp = np

    @staticmethod
    def view(t):
        return t.detach().numpy()  # shares memory, any strides

    @staticmethod
    def tensor(a):
        return from_numpy(a)  # replaced by from_numpy itself below: one call less

    @staticmethod
    def copied(a):
        return torch.from_numpy(np.array(a))

    @staticmethod
    def on(device):
        return _NOTHING


class _Cuda(Arrays):
    """A CUDA device's arrays: CuPy views of the tensors (``metal-cuda`` takes and returns CuPy
    arrays), tensors over the results' memory through DLPack."""

    def __init__(self):
        import cupy

        self.xp = cupy
        self._streams = {}  # (device index, PyTorch's stream handle) -> CuPy's view of it
        self._allocators = {}  # device index -> malloc through PyTorch's caching allocator

    @staticmethod
    def view(t):
        return _cupy_view(t.detach())

    @staticmethod
    def tensor(a):
        return _from_cupy(a)

    @staticmethod
    def copied(a):
        return _from_cupy(a.copy())

    @contextlib.contextmanager
    def on(self, device):
        """The block of an op on ``device``: CuPy on that GPU, on PyTorch's current stream, its
        allocations from PyTorch's caching allocator (module docstring)."""
        cupy = self.xp
        index = device.index if device.index is not None else torch.cuda.current_device()
        handle = _internals.raw_stream(index)
        stream = self._streams.get((index, handle))
        if stream is None:
            if len(self._streams) > 64:
                self._streams.clear()
            stream = self._streams[(index, handle)] = cupy.cuda.ExternalStream(handle, index)
        malloc = self._allocators.get(index)
        if malloc is None:
            malloc = self._allocators[index] = _torch_malloc(torch.device("cuda", index), index)
        with cupy.cuda.Device(index), stream, cupy.cuda.using_allocator(malloc):
            yield


def _torch_malloc(device: torch.device, index: int):
    """CuPy's malloc through PyTorch's caching allocator on ``device``: each allocation a uint8
    tensor that the memory keeps alive, on PyTorch's current stream (the op's)."""
    import cupy

    empty = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, index), 0)

    def malloc(nbytes):
        if nbytes == 0:
            return empty
        t = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, index), 0)
    return malloc


class _Tensors(Arrays):
    """Tensors ``metal-mps`` takes where they are (MPS tensors, or those of its stand-in's
    device): the backend's arrays are the tensors themselves."""

    xp = torch

    @staticmethod
    def view(t):
        return t.detach()

    @staticmethod
    def tensor(a):
        return a

    @staticmethod
    def copied(a):
        return a.clone()


_ARRAYS = {"cpu": Arrays()}
_TENSORS = _Tensors()


def arrays_of(device: torch.device) -> Arrays:
    """The :class:`Arrays` of ``device``'s tensors."""
    kind = device.type
    if kind in tensors.DEVICES:  # takes_tensors, inlined: a call per op argument
        return _TENSORS
    arrays = _ARRAYS.get(kind)
    if arrays is None:
        arrays = _ARRAYS[kind] = _Cuda()
    return arrays


def to_array(t, device: torch.device):
    """The backend's view of tensor ``t`` (None stays None), sharing its memory (a float32
    copy for float16 and bfloat16)."""
    if t is None:
        return None
    if t.dtype in AUTOCAST_DTYPES:
        t = t.detach().float()
    return arrays_of(device).view(t)


def to_arrays(named: dict, device: torch.device) -> dict:
    """{argument: the backend's view of the tensor} for the tensors of ``named`` that are
    not None (see :func:`to_array`)."""
    return {k: to_array(t, device) for k, t in named.items() if t is not None}


def to_tensor(a, device: torch.device, dtype: torch.dtype = None) -> torch.Tensor:
    """A tensor sharing the memory of the backend's result ``a`` (a tensor stays itself), cast
    to ``dtype`` when given (float16 and bfloat16 results come back from float32)."""
    if not isinstance(a, torch.Tensor):
        a = from_numpy(a) if device.type == "cpu" else _from_cupy(a)
    return a if dtype is None or a.dtype == dtype else a.to(dtype)


_CUPY_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int32: np.int32,
                torch.int64: np.int64, torch.uint8: np.uint8, torch.bool: np.bool_}


def _cupy_view(t: torch.Tensor):
    """A CuPy array over CUDA tensor ``t``'s memory (the metal-cuda backend takes and returns
    CuPy arrays), made directly from the tensor's address and strides: the backend works on
    PyTorch's current stream (:meth:`_Cuda.on`), so no stream needs ordering, and DLPack's
    handshake costs several times the direct view (an op takes up to eleven tensors)."""
    import cupy

    dtype = _CUPY_DTYPES.get(t.dtype)
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if dtype is None:
        return cupy.from_dlpack(t)
    size = t.element_size()
    extent = 0 if t.numel() == 0 else size * (1 + sum((n - 1) * s for n, s in
                                                      zip(t.shape, t.stride())))
    memory = cupy.cuda.UnownedMemory(t.data_ptr(), extent, t, index)
    return cupy.ndarray(tuple(t.shape), dtype, cupy.cuda.MemoryPointer(memory, 0),
                        tuple(size * s for s in t.stride()))


def placeholder(shape, dtype: torch.dtype, device: torch.device):
    """A zero tensor of ``shape`` whose values are never read: on the CPU, NumPy's zeros
    (calloc: pages the op never touches cost nothing)."""
    if device.type == "cpu" and dtype in _NUMPY:
        return torch.from_numpy(np.zeros(shape, dtype=_NUMPY[dtype]))
    return torch.zeros(shape, dtype=dtype, device=device)


def transposed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """aᵀ b for a [K,M], b [K,N] (a weight gradient: flat(dA)ᵀ flat(source))."""
    return a.t().mm(b)


def from_numpy(a) -> torch.Tensor:
    """A CPU tensor sharing NumPy array ``a``'s memory; a copy when ``a`` is read-only (a
    backend's view) or has negative strides, which ``torch.from_numpy`` refuses."""
    if a.flags.writeable:
        try:
            return torch.from_numpy(a)
        except ValueError:
            pass
    return torch.from_numpy(np.array(a))


def _from_cupy(a) -> torch.Tensor:
    """A CUDA tensor over CuPy array ``a``'s memory, through DLPack without the stream
    handshake: the backend made it on PyTorch's current stream (:meth:`_Cuda.on`)."""
    return _internals.from_dlpack_unsynchronised(a)


Arrays.tensor = staticmethod(from_numpy)
