"""How the CUDA target binds a call's arguments: parameter structs by value (:class:`Constant`),
buffers and ``(buffer, byte offset)`` pairs by address, and one ``cuLaunchKernel`` a call."""

from __future__ import annotations

import numpy as np


def _cupy():
    import cupy

    return cupy


def _struct(arg, size: int, kernel: str, index: int) -> np.ndarray:
    """The bytes of a ``constant T&`` buffer argument (sizeof(T) = ``size``), which the launcher
    takes by value: a :class:`Constant`'s or host data's own, a GPU buffer's copied back (the
    stream waits for it)."""
    if isinstance(arg, Constant):
        data = arg.bytes
    elif isinstance(arg, _cupy().ndarray):
        data = arg.reshape(-1).view(np.uint8).get()
    else:
        try:
            data = np.frombuffer(memoryview(arg).cast("B"), np.uint8)
        except TypeError:
            data = np.ascontiguousarray(arg).reshape(-1).view(np.uint8)
    if data.nbytes < size:
        raise ValueError(f"kernel '{kernel}': buffer {index} is its `constant` struct: expected "
                         f"at least {size} bytes (its sizeof), got {data.nbytes}")
    return data


def _pointer(buf) -> int:
    """The device address a buffer (a CuPy array) or a ``(buffer, byte offset)`` pair binds."""
    return buf.data.ptr if type(buf) is not tuple else buf[0].data.ptr + buf[1]


def _launch_params(function: int, n_tg: int, tg: int, stream, params: int) -> None:
    """cuLaunchKernel of ``n_tg`` blocks of ``tg`` threads on ``stream``, ``params`` the address
    of the array of pointers to the parameters' values (every launch of the target)."""
    _cupy().cuda.driver.launchKernel(function, n_tg, 1, 1, tg, 1, 1, 0, stream.ptr, params, 0)


class Constant:
    """Read-only bytes for kernels' ``constant T&`` parameters (:meth:`Device.constant`): a
    launcher takes them by value; a kernel that takes the buffer as a pointer gets a GPU copy,
    made on first use."""

    __slots__ = ("bytes", "_device", "_buffer")

    def __init__(self, device, data):
        self.bytes = np.frombuffer(bytes(memoryview(data).cast("B")), np.uint8)
        self._device, self._buffer = device, None

    def buffer(self):
        """The bytes as a GPU buffer (made once, kept: in the device's own memory)."""
        if self._buffer is None:
            with self._device.persistent():
                self._buffer = self._device.buffer(self.bytes)
        return self._buffer
