"""The device interface the Metal host drives: metalcompute's Python API, and what a device may
add to it.

Four devices implement it:

- :class:`rnngrad.backends.metal.apple.Device`: an Apple GPU through metalcompute (``metal``);
- :class:`rnngrad.backends.metal.harness.cpu.Device`: the test harness's CPU target
  (``metal-emulated``);
- :class:`rnngrad.backends.metal.cuda.Device`: an NVIDIA GPU, the MSL translated to CUDA
  (``metal-cuda``);
- :class:`rnngrad.backends.metal.mps.Device`: ``torch.mps.compile_shader`` (``metal-mps``).

:class:`Device`, :class:`Function` and :class:`Handle` are what every device has (metalcompute
0.2.9's API). The rest is optional: the host looks each optional method up on the device and,
where it is missing, does what metalcompute needs instead (:class:`GPUDevice` lists them with
that fallback). ``isinstance(device, Device)`` checks the required part at run time.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable


@runtime_checkable
class Handle(Protocol):
    """What a call returns. metalcompute waits for the command buffer when the last reference
    to it goes; a device may report a failed run as ``error`` (a string, or None)."""


@runtime_checkable
class Function(Protocol):
    """One entry point of a compiled library: ``fn(count, *buffers)`` dispatches ``count``
    threads (a 1-D grid padded to whole threadgroups), binding ``buffers`` to
    ``[[buffer(i)]]`` in order.

    Optional:

    - ``threadgroup_size() -> int``: the threads a threadgroup of this function will have (the
      host sizes the completion marks by it; without it, for threadgroups of at least
      ``library.MIN_THREADGROUP``);
    - ``prepare(count, *buffers) -> Prepared``: the call with its thread count and the buffers
      that are not None bound once; ``prepared(*open)`` binds the open slots (a buffer or a
      ``(buffer, byte offset)`` pair each) and dispatches. ``prepared.tg`` is its threadgroup
      size. Without it, every call binds every buffer.
    """

    def __call__(self, count: int, *buffers: Any) -> Handle: ...


@runtime_checkable
class Library(Protocol):
    """A compiled MSL source."""

    def function(self, name: str) -> Function: ...


@runtime_checkable
class Device(Protocol):
    """One GPU (or a stand-in of one) with metalcompute's API.

    - ``kernel(source)`` compiles a whole MSL source;
    - ``buffer(data)`` makes a buffer: ``data`` a size in bytes (contents undefined: the
      targets that can poison it with NaN do) or an object to copy (buffer protocol; a GPU
      array on a GPU device);
    - ``deviceName``: what ``rnngrad info`` shows.
    """

    deviceName: str

    def kernel(self, source: str) -> Library: ...

    def buffer(self, data: Any) -> Any: ...


class GPUDevice(Device, Protocol):
    """The optional part of a device, each with what the host does where it is missing.

    ============================  ===============================================================
    ``array_module``              the array module of its buffers (CuPy, a tensor namespace);
                                  missing: NumPy
    ``finish(handles)``           wait for the calls in ``handles`` (the list is emptied) and
                                  raise naming a kernel that faulted; missing: the host waits on
                                  each run before it opens the next (dropping its handle)
    ``zeros(nbytes)``             a zeroed buffer made on the device; missing: a copy of host
                                  zeros. With ``finish``, the status marks and zeroed scratch are
                                  slices of a zeroed region (:mod:`.layout`)
    ``full(n, value)``            n float32 ``value``\\ s made on the device; missing: a copy
    ``fetch(buf, nbytes)``        a host copy of a buffer's first bytes queued behind the calls,
                                  there once ``finish`` returns; missing: read after the wait
    ``wrap(array)``               a GPU array's memory bound as a buffer without a copy;
                                  missing: ``buffer(array)``, a copy
    ``constant(data)``            read-only bytes for a ``constant T&`` parameter (a struct);
                                  missing: ``buffer(data)``
    ``results_apart``             True where results must not share memory (tensors that
                                  PyTorch's operators return); missing: False
    ``trace``                     the newest dispatches, for tools and tests
    ``check_marks(marks, table,   queue a check of an op's completion marks on the device; the
    serial)``, ``fault()``,       first op found wrong is what ``fault()`` says, without a wait,
    ``clear_fault()``,            and ``synchronize()`` waits for every call. With ``finish`` and
    ``synchronize()``             ``zeros``, an op need not wait for its dispatches (completion
                                  checked later: ``MetalHost.check_late``); missing: every op
                                  waits and the host reads the marks
    ``asynchronous``              True where calls run after they return (a GPU): ops then do
                                  not wait unless ``RNNGRAD_LAUNCH_BLOCKING=1``; missing: False
    ``events``                    set by the host: whether calls record events to wait on
                                  (``finish``); off while the device checks marks itself
    ``capturing()``               whether the calls are being captured into a CUDA graph (the
                                  host keeps such ops' descriptions); missing: never
    ``persistent()``              a block whose allocations outlive any op (the host's kept
                                  constants), whatever allocator a caller made current
    ============================  ===============================================================
    """

    array_module: Any
    results_apart: bool
    asynchronous: bool
    events: bool

    def finish(self, handles: list) -> None: ...

    def zeros(self, nbytes: int) -> Any: ...

    def full(self, n: int, value: float) -> Any: ...

    def fetch(self, buf: Any, nbytes: int) -> Any: ...

    def wrap(self, array: Any) -> Any: ...

    def constant(self, data: Any) -> Any: ...

    def check_marks(self, marks: Any, table: Any, serial: int) -> None: ...

    def fault(self) -> Any: ...

    def clear_fault(self) -> None: ...

    def synchronize(self) -> None: ...

    def capturing(self) -> bool: ...

    def persistent(self) -> Any: ...


def optional_methods(device) -> Sequence[str]:
    """The optional methods of :class:`GPUDevice` that ``device`` has."""
    return tuple(name for name in ("finish", "zeros", "full", "fetch", "wrap", "constant",
                                   "check_marks", "fault", "clear_fault", "synchronize",
                                   "capturing", "persistent")
                 if callable(getattr(device, name, None)))
