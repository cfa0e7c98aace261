"""A CPU stand-in for the CUDA target, for counting what the Metal host asks of a GPU device.

``GpuLikeDevice`` is the CPU harness with the CUDA target's extras (``finish``; ``zeros``,
``full``; ``wrap``, which binds a GPU array in place; ``array_module``) and a count of the device
operations the host asks for (``ops``): buffers copied from data (``copy``), new buffers
(``new``; the CUDA target fills each with NaN besides), ``zeros``, ``full``, ``wrap`` (a view:
no device work), reads back to the host (``read``). Launches are its ``trace``.

``fake_cupy(device)`` is a module that stands for CuPy where an array in the device's memory
(``DeviceArray``: harness memory with ``__cuda_array_interface__``) is a GPU array, so that the
input checks and the host take the path of inputs already on the GPU. A kernel reads a wrapped
input at the caller's own address, so a test can see that it was not copied.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import types

import numpy as np

from rnngrad.backends.metal.harness import cpu as metalcompute


class DeviceArray(metalcompute.Buffer):
    """Harness memory seen as a GPU array; its views and slices keep their own address."""

    reads = 0  # .get() calls since the last reset, over every DeviceArray

    def __array_finalize__(self, parent):
        base = getattr(parent, "_mc_addr", None)
        if base is not None:
            offset = self.__array_interface__["data"][0] - parent.__array_interface__["data"][0]
            self._mc_addr = base + offset

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self.__array_interface__["data"][0], False),
                "strides": None if self.flags.c_contiguous else self.strides}

    def get(self):
        DeviceArray.reads += 1
        return np.array(self).view(np.ndarray)

    def __repr__(self):
        return f"DeviceArray({np.asarray(self).view(np.ndarray)!r})"


class GpuLikeDevice(metalcompute.Device):
    """The CPU harness with the CUDA target's extras, counting device operations (``ops``)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.ops = collections.Counter()
        self.array_module = fake_cupy(self)

    def _memory(self, nbytes):
        return metalcompute.Device.buffer(self, int(nbytes)).view(DeviceArray)

    def buffer(self, data):
        if isinstance(data, (int, np.integer)):
            self.ops["new"] += 1
            return self._memory(data)
        self.ops["copy"] += 1
        return metalcompute.Device.buffer(self, data).view(DeviceArray)

    def zeros(self, nbytes):
        self.ops["zeros"] += 1
        return self._memory(nbytes)

    def full(self, n, value):
        self.ops["full"] += 1
        buf = self._memory(4 * n)
        buf.view(np.float32).fill(value)
        return buf

    def wrap(self, array):
        """As the CUDA target's: a C-contiguous array as it is, any other copied (a copy)."""
        self.ops["wrap"] += 1
        assert isinstance(array, DeviceArray), type(array)
        if not array.flags.c_contiguous:
            self.ops["copy"] += 1
            array = self.array(np.asarray(array))
        return array.reshape(-1).view(np.uint8)

    def finish(self, handles):
        del handles[:]

    def array(self, value):
        """``value`` (NumPy) copied into this device's memory, as a GPU array."""
        value = np.ascontiguousarray(value)
        buf = self._memory(max(value.nbytes, 1))[:value.nbytes]
        out = buf.view(value.dtype).reshape(value.shape)
        out[...] = value
        return out

    def counts(self, trace_start=0):
        """The operations so far: ops, plus launches and reads."""
        return dict(self.ops, launch=len(self.trace) - trace_start, read=DeviceArray.reads)


def fake_cupy(device):
    """A module standing for CuPy on ``device`` (what rnngrad's checks and host call)."""
    xp = types.ModuleType("cupy")
    xp.ndarray = DeviceArray
    xp.float32, xp.uint32, xp.uint8 = np.float32, np.uint32, np.uint8

    def asarray(a, dtype=None):
        if isinstance(a, DeviceArray) and (dtype is None or a.dtype == dtype):
            return a
        if isinstance(a, np.ndarray) and hasattr(a, "_mc_addr") and dtype is None:
            return a.view(DeviceArray)
        device.ops["copy"] += 1
        return device.array(np.asarray(a, dtype))

    def ascontiguousarray(a, dtype=None):
        a = asarray(a)
        if a.flags.c_contiguous and (dtype is None or a.dtype == dtype):
            return a
        device.ops["copy"] += 1
        return device.array(np.asarray(a, dtype))

    xp.asarray, xp.ascontiguousarray = asarray, ascontiguousarray
    xp.broadcast_to = lambda a, shape: np.broadcast_to(a, shape, subok=True)
    xp.zeros = lambda shape, dtype=np.float64: device.array(np.zeros(shape, dtype))
    return xp


@contextlib.contextmanager
def cupy_is(module):
    """``import cupy`` gives ``module`` inside the block."""
    saved = sys.modules.get("cupy")
    sys.modules["cupy"] = module
    try:
        yield module
    finally:
        if saved is None:
            del sys.modules["cupy"]
        else:
            sys.modules["cupy"] = saved
