"""The ``metal`` backend's device: metalcompute (macOS on Apple silicon) as the host drives it.

metalcompute 0.2.9 offers only the required part of the device interface
(:class:`rnngrad.backends.metal.device.Device`): ``kernel``, ``buffer`` and calls whose handle
waits when dropped. So on it the host runs an op's dispatches one at a time, copies its zeros,
ones and status buffers from the host, and reads each dispatch's completion marks after its
wait (:mod:`rnngrad.backends.metal.completion`). What remains metalcompute's: it builds a
pipeline state and a command buffer for every call, never checks a command buffer's status
(the completion marks stand in), and keeps every finished run in a table until the process
ends (its issue #36).
"""

from __future__ import annotations


class Device:
    """metalcompute's device with its name under the interface's attribute (``deviceName``);
    kernels, buffers and calls are metalcompute's own, unwrapped (a call costs nothing more)."""

    def __init__(self, index: int = -1):
        import metalcompute  # noqa: F401  (the probe: does it import here)

        self._device = metalcompute.Device() if index == -1 else metalcompute.Device(index)
        self.deviceName = str(getattr(self._device, "deviceName", "Apple GPU"))

    def kernel(self, source: str):
        return self._device.kernel(source)

    def buffer(self, data):
        return self._device.buffer(data)

    def __repr__(self) -> str:
        return f"apple.Device({self.deviceName})"


def unavailable(host) -> str | None:
    """None when metalcompute finds a Metal device here (``host``'s), else why not."""
    try:
        import metalcompute  # noqa: F401
    except ImportError as exc:
        return f"metalcompute does not import ({exc}); it needs macOS on Apple silicon"
    try:
        host.device
    except Exception as exc:  # metalcompute.error, or no device
        return f"metalcompute imports but no Metal device was found ({exc})"
    return None
