"""Run unchanged Metal Shading Language kernels on the CPU, behind metalcompute's Python API.

There is no Metal outside macOS, so this module is how the project's ``.metal`` kernels run and
are tested on Linux. It presents metalcompute 0.2.9's API, so host code written for Metal runs
unchanged::

    from rnngrad.backends.metal.harness import cpu as metalcompute

    dev = metalcompute.Device()
    fn = dev.kernel(source).function("name")      # compiles; raises metalcompute.error
    out = dev.buffer(4 * n)                       # shared memory, zero-copy: np.frombuffer(out, np.float32)
    handle = fn(n, dev.buffer(x), params, out)    # non-Buffer arguments are copied for this call
    del handle                                    # waits (here: the call already finished)
    call = fn.prepare(n, None, params, None)      # beyond metalcompute's API (as the CUDA
    call(dev.buffer(x), (out, 0))                 # target's): None slots bound at each call

How a kernel runs
    The source is compiled as C++17 against a stand-in ``<metal_stdlib>`` (``metal_stdlib.h``:
    address spaces, MSL scalar and vector types with Metal's sizes, ``metal::``, ``fast::`` and
    ``precise::`` math, barriers, ``simd_*`` collectives, ``simdgroup_matrix``) with the system
    C++ compiler at ``-O2``, and cached in ``$XDG_CACHE_HOME/rnngrad/metal-emulator`` (default
    ``~/.cache``), a directory created with mode 0700; the cache key hashes the source, the
    headers, the runtime, the compiler and its flags. Dispatch follows metalcompute: a 1-D grid of
    ``count`` threads padded to whole threadgroups (threads with ``gid >= count`` run); threadgroup
    size ``32 * (min(1024, max_total_threads_per_threadgroup, Device max) // 32)``; buffers bound
    to ``[[buffer(i)]]`` in call order. A kernel whose code (followed through the functions it
    calls) uses no barrier or SIMD collective runs as a plain loop; otherwise every GPU thread of
    a threadgroup is a fiber, and ``threadgroup_barrier`` / ``simd_*`` wait exactly until all
    participants arrive. Calls are synchronous; one dispatch runs at a time per process.
    Beyond metalcompute's API, ``fn.dispatch_threads(count, group, *buffers)`` dispatches as
    Metal's ``dispatchThreads`` (the ``torch.mps`` stand-in's calls): exactly ``count``
    threads in threadgroups of any ``group`` size, the last threadgroup partial and a
    threadgroup's last SIMD-group short where the sizes say so, the threads past them absent.

What it checks
    - ``Device(schedule="adversarial", seed=S)`` releases SIMD-groups (and threadgroups) in a
      seeded random order after every barrier, exposing a missing barrier (a write-after-read
      race); ``"lanes"`` (default) and ``"reverse"`` are the plain orders.
    - ``Device(max_threads_per_threadgroup=64)`` forces smaller threadgroups, exposing kernels
      that assume a size instead of reading ``[[threads_per_threadgroup]]``.
    - Always: threadgroup memory is filled with NaN at the start of each threadgroup; each
      buffer ends at a guard page, so reading or writing past it faults (``guard_pages=False``
      lays buffers out in whole 16 KiB pages as Metal does); a barrier that not
      every thread reaches, lanes of a SIMD-group at different collectives (or some returned),
      and more than 32 KiB of threadgroup memory raise ``error``; a binding count smaller than
      the kernel's highest ``[[buffer(i)]]`` raises ``error``.
    - A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL) inside a kernel raises ``error`` naming the
      kernel, the GPU thread and, for a guard page, the buffer and byte offset. The handlers are
      installed only during a dispatch and jump back to it (``siglongjmp``) from an alternate
      signal stack; memory the kernel wrote before the fault stays written.

Failures it can inject
    A real GPU can stop a dispatch part-way: a fault, or the system's watchdog stopping a
    command buffer that ran too long. metalcompute 0.2.9 never looks at a command buffer's
    status, so the caller then gets whatever the kernel had written. Two options make the harness
    do the same to one dispatch, chosen by its number on this device (0 for the first call since
    the device was made; ``dev.trace.clear()`` does not reset it):

    - ``Device(stop=(i, k))``: dispatch ``i`` runs only threadgroups ``0 .. k-1`` of its grid
      (all of them when it has no more than k); the others never run, and nothing is
      reported, as on a Mac. (The kernel sees
      ``[[threadgroups_per_grid]]`` = k: a kernel that splits its work by that builtin would
      spread it over the threadgroups that run, so the stop would go unseen in its outputs.)
    - ``Device(timeout=i)``: dispatch ``i``'s handle reports the error the watchdog gives a
      command buffer it stopped (``handle.error``, a string; ``None`` otherwise), as a
      metalcompute that checked the status would. Give both options the same ``i`` for a
      timeout that also cut the work short, as a real one does.

    ``Dispatch.injected`` in the trace says what was done to a dispatch.

What it cannot check
    Apple's compiler may reject code that C++ accepts (and the reverse for rare MSL syntax:
    swizzles beyond two or three components, template kernels, ``[[threadgroup(i)]]``
    arguments). Math is IEEE single precision, not Metal's fast math (``fast::tanh`` returns
    NaN for large inputs on a GPU, not here); ``half`` is ``_Float16`` with C++ rounding;
    ``simd_sum`` adds in lane order; ``simdgroup_matrix`` is emulated per lane; register
    pressure that lowers the real threadgroup size is not modelled; nothing here says anything
    about performance. The final check is one run on an Apple-silicon Mac::

        pip install metalcompute && rnngrad verify --backend metal

Dispatch trace
    ``Device.trace`` is a list with one ``Dispatch`` per call, in call order: ``kernel`` (name),
    ``count``, ``threadgroup_size``, ``threadgroups`` (of the grid), ``threadgroup_memory`` (bytes
    declared), ``path`` (``"loop"`` or ``"fibers"``), ``seconds`` and ``injected`` (an injected
    failure, or ``""``). Clear it with ``dev.trace.clear()``. It keeps the newest
    ``Device(trace_limit=...)`` dispatches (4096 by default; None keeps every one).
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import operator
import threading
import time
from collections import namedtuple
from typing import NamedTuple

import numpy as np

from ...msl import dispatch
from . import _loader

__all__ = ["Device", "Kernel", "Function", "Buffer", "RunHandle", "Dispatch", "error", "get_devices"]

SCHEDULES = {"lanes": 0, "reverse": 1, "adversarial": 2}
_MAX_BUFFERS = dispatch.MAX_BUFFERS
_PAGE = mmap.PAGESIZE
_METAL_PAGE = 16384
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_dispatch_lock = threading.Lock()  # the runtime's state is per library, not per OS thread


class error(Exception):
    """A compile error, unknown function, bad call or a defect found while a kernel ran."""


DeviceInfo = namedtuple(
    "DeviceInfo", "deviceName recommendedWorkingSetSize maxTransferRate hasUnifiedMemory")

_DEVICE_NAME = "rnngrad CPU Metal harness"


def get_devices() -> tuple:
    """The one device this harness offers, as metalcompute describes devices."""
    return (DeviceInfo(_DEVICE_NAME, 1 << 34, 0, True),)


class Dispatch(NamedTuple):
    """One kernel call, as recorded in ``Device.trace``."""
    kernel: str
    count: int
    threadgroup_size: int
    threadgroups: int
    threadgroup_memory: int
    path: str
    seconds: float
    injected: str = ""  # "stopped after k of n threadgroups", "reported a timeout", both, or ""


class _Launch(ctypes.Structure):
    _fields_ = [("bufs", ctypes.c_void_p * _MAX_BUFFERS), ("count", ctypes.c_uint),
                ("tg_size", ctypes.c_uint), ("n_tg", ctypes.c_uint), ("schedule", ctypes.c_uint),
                ("seed", ctypes.c_ulonglong), ("exact", ctypes.c_uint)]


class _Outcome(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("signo", ctypes.c_int), ("fault_addr", ctypes.c_void_p),
                ("tg_memory", ctypes.c_uint), ("tg_failed", ctypes.c_uint),
                ("msg", ctypes.c_char * 2048)]


#: what a command buffer stopped by the GPU watchdog reports (MTLCommandBuffer.error on macOS)
TIMEOUT_ERROR = ("Execution of the command buffer was aborted due to an error during execution. "
                 "Caused GPU Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)")

_SIGNALS = {11: "SIGSEGV (invalid memory access)", 7: "SIGBUS (invalid memory access)",
            8: "SIGFPE (arithmetic trap, e.g. integer division by zero)",
            4: "SIGILL (illegal instruction, e.g. __builtin_trap)"}


class Buffer(np.ndarray):
    """Shared memory a kernel reads and writes: a 1-D uint8 array whose end is a guard page.

    Exposes the buffer protocol like metalcompute's Buffer (``np.frombuffer(buf, np.float32)``
    and ``memoryview(buf).cast('f')`` are zero-copy views).
    """

    def __repr__(self) -> str:
        return f"metalcompute.Buffer(length={self.nbytes})"

    __str__ = __repr__


def _guarded(nbytes: int, exact: bool = True) -> Buffer:
    """``nbytes`` of zeroed memory followed by a PROT_NONE page.

    exact: the data ends where the guard page begins, so one byte past the end faults.
    Otherwise the data starts at the region's start and the region is a whole number of Apple
    GPU pages (16 KiB), as Metal allocates, so small overruns go unnoticed as on a Mac.
    """
    span = nbytes if exact else -(-max(nbytes, 1) // _METAL_PAGE) * _METAL_PAGE
    data_pages = -(-span // _PAGE)
    region = mmap.mmap(-1, (data_pages + 1) * _PAGE)
    anchor = ctypes.c_char.from_buffer(region)
    base = ctypes.addressof(anchor)
    del anchor
    if _libc.mprotect(base + data_pages * _PAGE, _PAGE, 0) != 0:
        raise error(f"mprotect of a guard page failed (errno {ctypes.get_errno()})")
    pad = data_pages * _PAGE - nbytes if exact else 0
    buf = np.frombuffer(region, np.uint8, nbytes, pad).view(Buffer)
    buf._mc_addr = base + pad
    return buf


def _at(buf: Buffer, offset: int) -> Buffer:
    """``buf``'s bytes from ``offset`` on, as a buffer at that address (a prepared call's
    ``(buffer, byte offset)`` slot)."""
    view = buf[offset:]
    view._mc_addr = buf._mc_addr + offset
    return view


class RunHandle:
    """Returned by a call; deleting it waits for completion (here the call already completed).

    ``error``: ``None``, or what the run reported when it failed (only with ``Device(timeout=...)``;
    metalcompute 0.2.9's handles have no such attribute).
    """

    def __init__(self, function: "Function", error: str | None = None):
        self.function = function
        self.error = error

    def __repr__(self) -> str:
        return f"metalcompute.RunHandle({self.function.name})"


class Device:
    """The harness's one device. Keyword-only extras expose defects (see the module docstring).

    Args:
        device_index: metalcompute's device index; -1 (default device) or 0.
        schedule: order in which SIMD-groups run between synchronisation points:
            "lanes" (ascending, default), "reverse", or "adversarial" (seeded random).
        seed: seed of the adversarial order.
        max_threads_per_threadgroup: cap on the threadgroup size, a multiple of 32 in [32, 1024].
        guard_pages: end every buffer exactly at a guard page, so any access past its end
            faults (default). False lays buffers out as Metal does (whole 16 KiB pages), so
            overruns within the last page pass silently, as they would on a Mac.
        stop: ``(i, k)``: dispatch number ``i`` runs only its first ``k`` threadgroups and
            reports nothing (see "Failures it can inject" in the module docstring).
        timeout: ``i``: dispatch number ``i``'s handle reports a GPU timeout.
        trace_limit: dispatches ``trace`` keeps, the newest (None: every one).
    """

    def __init__(self, device_index: int = -1, *, schedule: str = "lanes", seed: int = 0,
                 max_threads_per_threadgroup: int = 1024, guard_pages: bool = True,
                 stop: tuple[int, int] | None = None, timeout: int | None = None,
                 trace_limit: int | None = dispatch.TRACE_LIMIT):
        if device_index not in (-1, 0):
            raise error(f"Device not found: index {device_index}, expected -1 or 0 (one device)")
        if schedule not in SCHEDULES:
            raise error(f"schedule: expected one of {sorted(SCHEDULES)}, got {schedule!r}")
        if not (32 <= max_threads_per_threadgroup <= 1024 and max_threads_per_threadgroup % 32 == 0):
            raise error("max_threads_per_threadgroup: expected a multiple of 32 in [32, 1024], "
                        f"got {max_threads_per_threadgroup}")
        if stop is not None and not (isinstance(stop, tuple) and len(stop) == 2
                                     and all(isinstance(v, int) and v >= 0 for v in stop)):
            raise error(f"stop: expected (dispatch number, threadgroups that run), two ints >= 0, "
                        f"got {stop!r}")
        if timeout is not None and not (isinstance(timeout, int) and timeout >= 0):
            raise error(f"timeout: expected a dispatch number, an int >= 0, got {timeout!r}")
        self.deviceName = _DEVICE_NAME
        self.schedule = schedule
        self.seed = int(seed)
        self.max_threads_per_threadgroup = max_threads_per_threadgroup
        self.guard_pages = bool(guard_pages)
        self.stop = stop
        self.timeout = timeout
        try:
            self.trace = dispatch.Trace(trace_limit)
        except ValueError as exc:
            raise error(str(exc)) from None
        self._dispatches = 0
        self._fault = None
        #: what each dispatch since the last check_marks reported (the newest)
        self._reported = collections.deque(maxlen=4096)

    def __repr__(self) -> str:
        return f"metalcompute.Device({self.deviceName}, schedule={self.schedule!r})"

    def check_marks(self, marks, table, serial: int) -> None:
        """The CUDA target's check of an op's completion marks (``marks``: a buffer or a
        ``(buffer, byte offset)`` pair; ``table``: see ``msl.dispatch.first_wrong_mark``), made
        at once: calls here have finished when they return. The first op found wrong is what
        :meth:`fault` says. Not in metalcompute's API: the host checks completion so where it
        does not wait for an op (``RNNGRAD_LAUNCH_BLOCKING=0``)."""
        buf, offset = marks if type(marks) is tuple else (marks, 0)
        words = int((table[:, 0] + 2 * table[:, 1]).max()) if len(table) else 0
        found = dispatch.first_wrong_mark(
            np.frombuffer(buf, np.uint32, count=words, offset=offset), table)
        # what the op's dispatches (the table's, the newest) reported, as a GPU's errors
        reported = list(self._reported)[-len(table):]
        self._reported.clear()
        said = next(((row, text) for row, text in enumerate(reported) if text), None)
        if said is not None and (found is None or said[0] <= found[0]):
            found = (said[0], 0, 0, said[1])
        if found is not None and self._fault is None:
            self._fault = (int(serial), *found)

    def fault(self):
        """``(serial, row, threadgroup, word[, reported])`` of the first op :meth:`check_marks`
        found wrong (with what a dispatch reported, where it did), or None."""
        return self._fault

    def clear_fault(self) -> None:
        self._fault = None

    def synchronize(self) -> None:
        """Nothing to wait for: calls here are synchronous."""

    def kernel(self, source: str) -> "Kernel":
        """Compile an MSL source string (cached)."""
        return Kernel(self, source)

    def buffer(self, data) -> Buffer:
        """A new buffer: ``data`` is a size in bytes, or a buffer-protocol object to copy."""
        if isinstance(data, int):
            if data < 0:
                raise error(f"buffer: expected a size >= 0 bytes, got {data}")
            return _guarded(data, self.guard_pages)
        try:
            src = memoryview(data).cast("B")
        except TypeError as exc:
            raise error(f"buffer: expected a size in bytes or a buffer-protocol object, got "
                        f"{type(data).__name__}") from exc
        buf = _guarded(src.nbytes, self.guard_pages)
        buf[:] = np.frombuffer(src, np.uint8)
        return buf


class Kernel:
    """A compiled source; ``function(name)`` picks one of its kernels."""

    def __init__(self, device: Device, source: str):
        if not isinstance(source, str):
            raise error(f"kernel: expected the MSL source as str, got {type(source).__name__}")
        self.device = device
        try:
            self._library, kernels = _loader.load(source)
        except _loader.CompileError as exc:
            raise error(str(exc)) from None
        self._kernels = {k.name: k for k in kernels}

    def function(self, name: str) -> "Function":
        try:
            return Function(self, dispatch.kernel_info(self._kernels, name))
        except ValueError as exc:
            raise error(str(exc)) from None


class Function:
    """One kernel; call it as ``fn(count, *buffers)``."""

    def __init__(self, kernel: Kernel, info):
        self.kernel = kernel
        self.name = info.name
        self._info = info
        lib = kernel._library
        self._dispatch = getattr(lib, f"__emu_dispatch_{info.name}")
        self._dispatch.argtypes = (ctypes.POINTER(_Launch), ctypes.POINTER(_Outcome))
        self._dispatch.restype = ctypes.c_int
        max_threads = getattr(lib, f"__emu_max_threads_{info.name}")
        max_threads.restype = ctypes.c_uint
        self.max_total_threads_per_threadgroup = int(max_threads())

    def threadgroup_size(self) -> int:
        """metalcompute's rule: 32 x floor(min(1024, kernel limit, device limit) / 32)."""
        return dispatch.threadgroup_size(self.max_total_threads_per_threadgroup,
                                         self.kernel.device.max_threads_per_threadgroup)

    def __call__(self, count, *buffers) -> RunHandle:
        tg = self.threadgroup_size()
        try:
            count = dispatch.check_call(self.name, count, len(buffers), self._info.n_buffers, tg,
                                        self.max_total_threads_per_threadgroup)
        except ValueError as exc:
            raise error(str(exc)) from None
        return self._run(count, tg, False, buffers)

    def dispatch_threads(self, count, group: int, *buffers) -> RunHandle:
        """Metal's ``dispatchThreads`` (beyond metalcompute's API; the ``torch.mps`` stand-in
        calls it): exactly ``count`` threads in threadgroups of ``group`` threads, any size
        from 1 to the kernel's and the device's limits. The threads past ``count`` do not
        exist: the last threadgroup has ``count % group`` threads when that is not 0, a
        threadgroup whose size is not a multiple of 32 ends in a short SIMD-group, and there
        ``[[threads_per_threadgroup]]``, ``[[threads_per_simdgroup]]`` and
        ``[[simdgroups_per_threadgroup]]`` are the actual sizes; barriers and ``simd_*``
        collectives are among the threads that exist (a collective that reads a lane that does
        not exist gets NaN bytes, a value Metal leaves undefined). ``[[threads_per_grid]]``
        is ``count``."""
        limit = min(1024, self.max_total_threads_per_threadgroup,
                    self.kernel.device.max_threads_per_threadgroup)
        group = operator.index(group)
        if not 1 <= group <= limit:
            raise error(f"kernel '{self.name}': group: expected a threadgroup size in [1, "
                        f"{limit}] (the kernel's and the device's limits), got {group}")
        try:
            count = dispatch.check_call(self.name, count, len(buffers), self._info.n_buffers,
                                        group, self.max_total_threads_per_threadgroup)
        except ValueError as exc:
            raise error(str(exc)) from None
        return self._run(count, group, True, buffers)

    def _run(self, count: int, tg: int, exact: bool, buffers) -> RunHandle:
        device = self.kernel.device
        bound = [b if isinstance(b, Buffer) and hasattr(b, "_mc_addr") else device.buffer(b)
                 for b in buffers]
        launch = _Launch()
        for i, b in enumerate(bound):
            launch.bufs[i] = b._mc_addr
        launch.count, launch.tg_size, launch.exact = count, tg, int(exact)
        grid = -(-count // tg)
        number = device._dispatches
        injected = []
        launch.n_tg = grid
        if device.stop is not None and device.stop[0] == number and device.stop[1] < grid:
            launch.n_tg = device.stop[1]
            injected.append(f"stopped after {launch.n_tg} of {grid} threadgroups")
        reported = None
        if device.timeout == number:
            reported = TIMEOUT_ERROR
            injected.append("reported a timeout")
        device._reported.append(reported)
        launch.schedule = SCHEDULES[device.schedule]
        launch.seed = (device.seed * 1_000_003 + number) & (2 ** 64 - 1)
        device._dispatches += 1
        outcome = _Outcome()
        start = time.perf_counter()
        with _dispatch_lock:
            code = self._dispatch(ctypes.byref(launch), ctypes.byref(outcome))
        seconds = time.perf_counter() - start
        path = "fibers" if self._info.needs_fibers else "loop"
        device.trace.append(Dispatch(self.name, count, tg, grid, outcome.tg_memory, path,
                                     seconds, ", ".join(injected)))
        if code:
            raise error(self._describe(outcome, count, tg, bound))
        return RunHandle(self, reported)

    def prepare(self, count, *buffers) -> dispatch.Prepared:
        """This kernel's call over ``count`` threads with ``buffers`` bound once, each None an
        open slot that every call binds: a buffer, or a ``(buffer, byte offset)`` pair (the
        buffer's bytes from that offset on). The CUDA target's ``Function.prepare``, which
        the Metal host uses where a device has it; here each call is a plain call."""
        return dispatch.Prepared(self, count, buffers, _at, error)

    def _describe(self, outcome: _Outcome, count: int, tg: int, bound) -> str:
        head = f"kernel '{self.name}' (count {count}, threadgroup size {tg}): "
        msg = outcome.msg.decode(errors="replace")
        if outcome.code == 1:
            return head + msg
        what = _SIGNALS.get(outcome.signo, f"signal {outcome.signo}")
        addr = outcome.fault_addr or 0
        for i, b in enumerate(bound):
            end = b._mc_addr + b.nbytes
            if end <= addr < end + _PAGE:
                return (head + f"crashed with {what}: access at byte {addr - b._mc_addr} of "
                        f"buffer {i}, which has {b.nbytes} bytes (past its end); in {msg}")
        # Past every guard page: a read that far past a buffer's end skips its guard page, so
        # name the buffer that ends closest below the address (the likeliest source, not a proof).
        below = [(addr - (b._mc_addr + b.nbytes), i, b) for i, b in enumerate(bound)
                 if b._mc_addr + b.nbytes <= addr]
        if below:
            gap, i, b = min(below, key=lambda x: x[0])
            return (head + f"crashed with {what} at address {addr:#x}, {gap} bytes past the end "
                    f"of buffer {i} ({b.nbytes} bytes), the nearest below it, beyond its guard "
                    f"page; in {msg}")
        return head + f"crashed with {what} at address {addr:#x}; in {msg}"
