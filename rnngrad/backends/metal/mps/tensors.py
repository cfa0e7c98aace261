"""PyTorch tensors as the arrays of a backend that takes them where they are (``metal-mps``).

The public functions check their inputs and the Metal host drives its device through NumPy's
vocabulary (``shape``, ``dtype``, ``flags.c_contiguous``, ``reshape``, ``transpose``,
``astype``, ``xp.ascontiguousarray`` …), which NumPy and CuPy arrays speak. A tensor on a device
of :data:`DEVICES` (PyTorch's ``"mps"``) is wrapped as a :class:`TensorArray`, which speaks the
same words and keeps the tensor on its device, and :data:`NAMESPACE` is the array module of
such arrays (the host's ``xp`` on the ``metal-mps`` device). A backend's results are plain
tensors on the inputs' device: nothing crosses to the host.

Tensors of any other device are what they were: CPU tensors are read as NumPy arrays, CUDA
tensors through ``__cuda_array_interface__``. The ``metal-mps`` stand-in
(:mod:`rnngrad.backends.metal.harness.mps`, run by
``rnngrad.backends.metal.harness.contexts.mps_standin``) adds the device it runs on ("cpu" or "cuda") to
:data:`DEVICES` while it is in use (:func:`taking`), so that its tensors take the path of MPS
tensors.

This module imports PyTorch only when a tensor reaches it.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

#: torch device types whose tensors the backends take as they are (see the module docstring)
DEVICES = {"mps"}

_TORCH_DTYPES = {}  # np.dtype -> torch.dtype, filled on first use


def _torch():
    import torch

    return torch


def is_device_tensor(value) -> bool:
    """Whether ``value`` is a torch tensor on a device of :data:`DEVICES`, or a
    :class:`TensorArray`."""
    if type(value) is TensorArray:
        return True
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(value, torch.Tensor)
            and value.device.type in DEVICES)


@contextlib.contextmanager
def taking(device_type: str):
    """Within the block, tensors on ``device_type`` are taken as they are, as MPS tensors are."""
    added = device_type not in DEVICES
    DEVICES.add(device_type)
    try:
        yield
    finally:
        if added:
            DEVICES.discard(device_type)


def torch_dtype(dtype):
    """The torch dtype of a NumPy dtype (or of a torch dtype, itself)."""
    torch = _torch()
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = np.dtype(dtype)
    if not _TORCH_DTYPES:
        for name in ("float16", "float32", "float64", "uint8", "int32", "int64", "bool"):
            _TORCH_DTYPES[np.dtype(name)] = getattr(torch, name)
        _TORCH_DTYPES[np.dtype(np.uint32)] = torch.uint32
    return _TORCH_DTYPES[dtype]


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype."""
    return np.dtype(str(dtype).replace("torch.", ""))


class _Flags:
    __slots__ = ("c_contiguous",)

    def __init__(self, c_contiguous):
        self.c_contiguous = c_contiguous


class _Data:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class TensorArray:
    """A torch tensor with the NumPy attributes the checks and the Metal host read. ``tensor``
    is the tensor itself; every operation returns a TensorArray of a tensor on the same device
    (a view where NumPy's would be one)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __repr__(self):
        return f"TensorArray({self.tensor!r})"

    shape = property(lambda self: tuple(self.tensor.shape))
    ndim = property(lambda self: self.tensor.dim())
    size = property(lambda self: self.tensor.numel())
    nbytes = property(lambda self: self.tensor.numel() * self.tensor.element_size())
    dtype = property(lambda self: numpy_dtype(self.tensor.dtype))
    flags = property(lambda self: _Flags(self.tensor.is_contiguous()))
    #: ``data.ptr``: the address of the first element (rnngrad.problem.address)
    data = property(lambda self: _Data(self.tensor.data_ptr()))
    device = property(lambda self: self.tensor.device)

    def __len__(self):
        return len(self.tensor)

    def __getitem__(self, index):
        return TensorArray(self.tensor[index])

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return TensorArray(self.tensor.reshape(shape))

    def transpose(self, axes=None):
        if axes is None:
            axes = tuple(reversed(range(self.tensor.dim())))
        return TensorArray(self.tensor.permute(tuple(axes)))

    def astype(self, dtype, copy=True):
        t = self.tensor.to(torch_dtype(dtype))
        return TensorArray(t.clone() if copy and t is self.tensor else t)

    def copy(self):
        return TensorArray(self.tensor.clone())

    def get(self):
        """A NumPy copy on the host (CuPy's ``get``)."""
        return _to_numpy(self.tensor)


def _tensor(a):
    return a.tensor if type(a) is TensorArray else a


def _to_numpy(t) -> np.ndarray:
    """A NumPy copy of tensor ``t``; uint32 (the completion marks) crosses as int32, which
    every device copies, and is viewed back."""
    torch = _torch()
    t = t.detach()
    if t.dtype == torch.uint32:
        return t.view(torch.int32).cpu().numpy().view(np.uint32)
    return t.cpu().numpy()


class _Namespace:
    """The array module of :class:`TensorArray` (NumPy's names, on the arrays' device): what
    the checks (``rnngrad.validation.array_module``) and the Metal host (``host.xp``) call.
    Functions that make a new array take the device of their array argument, else
    :attr:`device`'s."""

    float32 = property(lambda self: _torch().float32)
    uint32 = property(lambda self: _torch().uint32)
    uint8 = property(lambda self: _torch().uint8)

    def __init__(self, device=None):
        self.device = device

    def _device(self, a=None):
        if a is not None:
            return _tensor(a).device
        return self.device if self.device is not None else "mps"

    def zeros(self, shape, dtype=np.float32):
        return TensorArray(_torch().zeros(shape, dtype=torch_dtype(dtype), device=self._device()))

    def ascontiguousarray(self, a, dtype=None):
        t = _tensor(a)
        if dtype is not None:
            t = t.to(torch_dtype(dtype))
        return TensorArray(t.contiguous())

    def asarray(self, a, dtype=None):
        """A tensor on the device: a TensorArray's own, or a NumPy array's copy."""
        if type(a) is TensorArray:
            t = a.tensor
        elif isinstance(a, np.ndarray):
            t = _torch().from_numpy(np.ascontiguousarray(a)).to(self._device())
        else:
            t = _torch().as_tensor(a, device=self._device())
        return t if dtype is None else t.to(torch_dtype(dtype))

    def array(self, a):
        """A copy of ``a``, as a tensor."""
        return _tensor(a).clone()

    def asnumpy(self, a):
        """A NumPy copy on the host (CuPy's ``asnumpy``)."""
        return _to_numpy(_tensor(a))

    def broadcast_to(self, a, shape):
        try:
            return TensorArray(_tensor(a).expand(shape))
        except RuntimeError as exc:
            raise ValueError(str(exc)) from None

    def concatenate(self, arrays, axis=0):
        return _torch().cat([_tensor(a) for a in arrays], dim=axis)


#: the array module of TensorArrays
NAMESPACE = _Namespace()


def wrap(value):
    """``value`` as a :class:`TensorArray` (a tensor on a device of :data:`DEVICES`), made
    C-contiguous."""
    t = _tensor(value)
    return TensorArray(t if t.is_contiguous() else t.contiguous())
