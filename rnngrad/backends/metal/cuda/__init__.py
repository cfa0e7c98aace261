"""Run unchanged Metal Shading Language kernels on an NVIDIA GPU, behind metalcompute's Python API.

The ``metal-cuda`` backend's device: the same ``.metal`` source as on a Mac, translated to CUDA
C++ (:mod:`._build`) against the stand-in ``<metal_stdlib>`` (:mod:`rnngrad.backends.metal.msl`)
and compiled with NVRTC through CuPy. It presents the device interface of
:mod:`rnngrad.backends.metal.device`, as the test harness's CPU target does, so the Metal host
code drives it unchanged::

    from rnngrad.backends.metal import cuda as metalcompute

    dev = metalcompute.Device()
    fn = dev.kernel(source).function("name")  # compiles (NVRTC, cached); raises error
    out = dev.buffer(4 * n)                       # GPU memory: a CuPy uint8 array
    handle = fn(n, dev.buffer(x), params, out)    # non-Buffer arguments are copied for this call
    dev.finish([handle])                          # waits, and raises error if the kernel faulted
    zero = dev.zeros(4 * n)                       # zeroed on the GPU (beyond metalcompute's API)

Dispatch follows metalcompute: a 1-D grid of ``count`` threads padded to whole threadgroups
(threads with ``gid >= count`` run); threadgroup size ``32 × ⌊min(1024,
max_total_threads_per_threadgroup, the compiled kernel's limit) / 32⌋`` (registers can lower
it, as on a Mac); buffers bound to ``[[buffer(i)]]`` in call order. A threadgroup is a CUDA
block, a SIMD-group a warp, threadgroup memory ``__shared__``. Apple's limits hold here too: at
most 32 KiB of threadgroup memory (an error above it, though the GPU has more), SIMD width 32.
Nothing may rely on threadgroups running together: a kernel that waits for another threadgroup
may hang here as on a Mac.

Calls, copies and fills are asynchronous, in order, on CuPy's current stream of the device's GPU
(:attr:`Device.stream`): the caller's stream, so a kernel bound to a caller's GPU array in place
(:meth:`Device.wrap`) reads it after the caller's kernels that wrote it (``rnngrad.torch`` makes it
PyTorch's current stream around an op, and its allocations PyTorch's). The device never waits
unless asked: :meth:`Device.check_marks` queues the check of an op's completion marks on the GPU,
which records a failed op in pinned host memory that :meth:`Device.fault` reads without a wait (in
CUDA graphs' replays too). A fault inside a kernel (an illegal address) surfaces when the device
waits: :meth:`Device.finish` raises :class:`error` naming the kernel, and the device refuses every
later call, since the CUDA context is then unusable. ``Device(check_each_dispatch=True)`` waits
after every dispatch instead, so that a fault is attributed to exactly one kernel. New buffers are
filled with 0xFF bytes (NaN as float32), so a result the kernels never wrote shows;
``poison=False`` leaves them uninitialised, for compute-sanitizer's initcheck.
``Device.zeros(nbytes)`` and ``Device.full(n, value)`` (the optional methods of
:mod:`rnngrad.backends.metal.device`) fill buffers on the GPU. ``Function.prepare(count,
*buffers)`` binds a call's fixed buffers once and leaves the slots given as None open
(:class:`Prepared`): each launch then writes only the open slots' pointers, a buffer or a
``(buffer, byte offset)`` pair each, and calls the driver. ``Device.fetch(buf, nbytes)`` queues a
copy to pinned host memory behind the calls, there once the device is waited on. The Metal host
prepares every dispatch of an op's plan and fetches its completion marks so.

A kernel's ``constant T&`` buffer (a parameter struct) is a by-value parameter of its CUDA
launcher, in the kernel parameter space, which the GPU reads through its constant cache, as
Metal reads the ``constant`` address space (:mod:`._build`). A call passes it host data, or
``Device.constant(data)`` (beyond metalcompute's API: what the Metal host makes its structs
with), whose bytes go with the launch; a GPU buffer there is copied back first (the stream
waits). Every call launches through ``cuLaunchKernel``.

``Device(fast_math=True)`` compiles as metalcompute does on a Mac: metal:: math is fast::, denormals
flushed, division and square root approximate (Apple's fast math remains the Mac's to check).

``Device.trace`` keeps the newest ``trace_limit`` (4096; None: all) ``Dispatch`` records (kernel,
count, threadgroup size and count, threadgroup memory, path ``"cuda"``, ``seconds``: GPU time from
CUDA events, read when asked). ``Device(timing=False)`` (the ``metal-cuda`` backend's device)
records one event per call, none while ``Device.events`` is off, and ``seconds`` are None.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import numpy as np

from ..msl import dispatch, translate
from . import _build
from ._kernels import (HOST_TABLE_BYTES, _check_kernel, _HostTables, _swaps_last_axes,
                       _transposed_copy)
from ._launch import Constant, _launch_params, _pointer, _struct

__all__ = ["Device", "Kernel", "Function", "Prepared", "RunHandle", "Dispatch", "Constant", "error",
           "get_devices", "available"]

#: bytes of each pinned host block that Device.fetch hands out copies from
STAGING_BYTES = 1 << 16


class error(Exception):
    """A compile error, unknown function, bad call, or a kernel that faulted on the GPU."""


def _cupy():
    import cupy

    return cupy


def available():
    """None when CuPy imports and sees a CUDA device, else the reason it does not."""
    try:
        cp = _cupy()
    except ImportError as exc:
        return f"CuPy does not import ({exc}); pip install 'rnngrad[cuda]'"
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        return f"CuPy imports but finds no CUDA device ({type(exc).__name__}: {exc})"
    if n == 0:
        return "CuPy imports but finds no CUDA device"
    return None


def get_devices() -> tuple:
    """The CUDA devices, as metalcompute describes devices (name, memory, transfer rate, unified)."""
    cp = _cupy()
    out = []
    for i in range(cp.cuda.runtime.getDeviceCount()):
        props = cp.cuda.runtime.getDeviceProperties(i)
        out.append((props["name"].decode(), props["totalGlobalMem"], 0, False))
    return tuple(out)


class Dispatch:
    """One kernel call, as recorded in ``Device.trace``."""

    __slots__ = ("kernel", "count", "threadgroup_size", "threadgroups", "threadgroup_memory",
                 "path", "_events", "_seconds")

    def __init__(self, kernel, count, tg, n_tg, tg_memory, events):
        self.kernel, self.count, self.threadgroup_size = kernel, count, tg
        self.threadgroups, self.threadgroup_memory, self.path = n_tg, tg_memory, "cuda"
        self._events, self._seconds = events, None

    @property
    def seconds(self) -> float | None:
        """The kernel's GPU time in seconds (waits for it); None on a device made with
        ``timing=False``, which records no start."""
        if self._seconds is None and self._events is not None:
            start, end = self._events
            end.synchronize()
            self._seconds = _cupy().cuda.get_elapsed_time(start, end) / 1e3
        return self._seconds

    def __repr__(self):
        return (f"Dispatch({self.kernel!r}, count={self.count}, threadgroup_size="
                f"{self.threadgroup_size}, threadgroups={self.threadgroups})")


class RunHandle:
    """Returned by a call; :meth:`Device.finish` waits for it and reports a fault."""

    def __init__(self, function: "Function", event, dispatch_record):
        self.function, self.event, self.dispatch = function, event, dispatch_record

    def __repr__(self) -> str:
        return f"metalcompute.RunHandle({self.function.name})"


class Device:
    """One CUDA GPU behind metalcompute's API.

    Args:
        device_index: -1 (the current CUDA device) or a CUDA device index.
        fast_math: compile as metalcompute does on a Mac (see the module docstring).
        check_each_dispatch: wait after every dispatch, so a fault names exactly its kernel.
        poison: fill new buffers with 0xFF (NaN as float32); False leaves them uninitialised.
        max_threads_per_threadgroup: cap on the threadgroup size, a multiple of 32 in [32, 1024].
        trace_limit: dispatches ``trace`` keeps, the newest (None: every one).
        timing: record two CUDA events around every call for ``Dispatch.seconds``; False
            records only the end (no timing), one CUDA call fewer per dispatch and a cheaper one.
    """

    array_module = property(lambda self: _cupy())

    def __init__(self, device_index: int = -1, *, fast_math: bool = False,
                 check_each_dispatch: bool = False, poison: bool = True,
                 max_threads_per_threadgroup: int = 1024, trace_limit: int | None = dispatch.TRACE_LIMIT,
                 timing: bool = True):
        reason = available()
        if reason:
            raise error(reason)
        cp = _cupy()
        count = cp.cuda.runtime.getDeviceCount()
        if not (device_index == -1 or 0 <= device_index < count):
            raise error(f"Device not found: index {device_index}, expected -1 or 0..{count - 1}")
        if not (32 <= max_threads_per_threadgroup <= 1024 and max_threads_per_threadgroup % 32 == 0):
            raise error("max_threads_per_threadgroup: expected a multiple of 32 in [32, 1024], "
                        f"got {max_threads_per_threadgroup}")
        self._cuda = cp.cuda.Device(cp.cuda.runtime.getDevice() if device_index == -1 else device_index)
        with self._cuda:
            props = cp.cuda.runtime.getDeviceProperties(self._cuda.id)
            # where check_marks records the first op that did not finish: pinned host memory,
            # which kernels write directly (unified addressing) and the host reads without a wait
            self._fault_memory = cp.cuda.alloc_pinned_memory(64)
        self._fault_words = np.frombuffer(self._fault_memory, np.uint64, count=8)
        self._fault_words[:] = 0
        self._tables = {}  # check_marks' tables on the GPU, by their bytes
        self._own_malloc = cp.get_default_memory_pool().malloc  # CuPy's pool: persistent()
        self._host_tables = _HostTables(cp, HOST_TABLE_BYTES)  # those first met in a capture
        self.deviceName = props["name"].decode()
        self.fast_math = bool(fast_math)
        self.check_each_dispatch = bool(check_each_dispatch)
        self.poison = bool(poison)
        self.timing = bool(timing)
        self.max_threads_per_threadgroup = max_threads_per_threadgroup
        try:
            self.trace = dispatch.Trace(trace_limit)
        except ValueError as exc:
            raise error(str(exc)) from None
        self.broken = None  # why the CUDA context is unusable, once a kernel faulted
        #: record an event after every call (for finish; the host turns it off while it checks
        #: completion on the GPU instead: check_marks)
        self.events = True
        self._lock = threading.Lock()
        self._staging = (None, 0, 0)  # (pinned host block, its address, bytes handed out): fetch

    def __repr__(self) -> str:
        return f"metalcompute.Device({self.deviceName}, CUDA device {self._cuda.id})"

    #: calls run on the GPU after they return (the host then checks completion without a wait)
    asynchronous = True

    @property
    def results_apart(self) -> bool:
        """Each result in memory of its own (no slice of the op's slab) where a caller's allocator
        makes the op's memory (PyTorch's, under rnngrad.torch) or a graph is captured: their
        pools know a tensor by its allocation (torch.compile's CUDA graphs check each output)."""
        return _cupy().cuda.get_allocator() != self._own_malloc or self.capturing()

    @property
    def stream(self):
        """The stream every call, copy and fill of the device goes on: CuPy's current stream of
        its GPU (``rnngrad.torch`` makes it PyTorch's current stream around an op)."""
        return _cupy().cuda.get_current_stream(self._cuda.id)

    def capturing(self) -> bool:  # whether the current stream is captured into a CUDA graph
        return self.stream.is_capturing()

    @contextlib.contextmanager
    def persistent(self):
        """A block whose allocations come from CuPy's own pool whatever allocator is current
        (the host's kept constants outlive any op, and a caller's allocator may be a graph's
        pool); an error inside a CUDA graph's capture, which could not fill them."""
        if self.capturing():
            raise error("a kept buffer (constants of a new op signature) would be made inside a "
                        "CUDA graph's capture, where its contents are never written: run the op "
                        "once before the capture (a warm-up, as torch.cuda.graph asks)")
        with _cupy().cuda.using_allocator(self._own_malloc):
            yield

    def check_marks(self, marks, table: np.ndarray, serial: int) -> None:
        """Queue on the stream a check of an op's completion marks: ``marks`` (a buffer or a
        ``(buffer, byte offset)`` pair) holds, per row of ``table`` (uint32 [n, 5]: word offset,
        marks, threadgroups, threadgroup size, steps), one (DONE | steps, size) pair a
        threadgroup and zeros past them. The first op whose marks differ (``serial``, the row
        and threadgroup, the word found) is recorded where :meth:`fault` reads it, without a
        wait; the check runs in CUDA graphs' replays as any call. Not in metalcompute's API."""
        key = table.tobytes()
        kept = self._tables.get(key)
        if kept is None and not self.capturing():
            with self.persistent():
                kept = self._tables[key] = _cupy().asarray(table.reshape(-1))
        # a capture can neither allocate nor copy: a new table there is read from host memory
        address = kept.data.ptr if kept is not None else self._host_tables.address(key)
        with self._cuda:
            _check_kernel()((1,), (256,), (np.uint64(_pointer(marks)), np.uint64(address),
                                           np.uint32(table.shape[0]), np.uint64(serial),
                                           np.uint64(self._fault_memory.ptr)),
                            stream=self.stream)

    def fault(self):
        """``(serial, row, threadgroup, word)`` of the first op whose marks :meth:`check_marks`
        found wrong, or None: what the GPU has written so far (no wait)."""
        words = self._fault_words
        if not words[0]:
            return None
        return tuple(int(w) for w in words[:4])

    def clear_fault(self) -> None:
        self._fault_words[:] = 0

    def kernel(self, source: str) -> "Kernel":
        """Compile an MSL source string (NVRTC; CuPy caches the binary)."""
        return Kernel(self, source)

    def buffer(self, data):
        """A new GPU buffer (a CuPy uint8 array): ``data`` is a size in bytes, or an object to copy
        (a NumPy array or buffer-protocol object, a CuPy array, or anything with
        ``__cuda_array_interface__``)."""
        cp = _cupy()
        self._check_usable()
        with self._cuda, self.stream:
            if isinstance(data, (int, np.integer)):
                if data < 0:
                    raise error(f"buffer: expected a size >= 0 bytes, got {data}")
                buf = cp.empty(max(int(data), 1), cp.uint8)[:int(data)]
                if self.poison and data:  # one memset: a fill kernel costs the host ~4x more
                    buf.data.memset_async(0xFF, int(data), self.stream)
                return buf
            if hasattr(data, "__cuda_array_interface__") or isinstance(data, cp.ndarray):
                src = cp.ascontiguousarray(cp.asarray(data))
                return src.reshape(-1).view(cp.uint8).copy()
            try:
                host = np.frombuffer(memoryview(data).cast("B"), np.uint8)
            except TypeError as exc:
                raise error(f"buffer: expected a size in bytes or a buffer-protocol object, got "
                            f"{type(data).__name__}") from exc
            return cp.asarray(host)

    def zeros(self, nbytes: int):
        """A new GPU buffer of ``nbytes`` zero bytes, zeroed on the device's stream (no copy from
        the host). Its byte slices are buffers too: a kernel bound to ``buf[a:b]`` sees
        that range. Not in metalcompute's API: the Metal host uses it where a device has it."""
        self._check_usable()
        if nbytes < 0:
            raise error(f"zeros: expected a size >= 0 bytes, got {nbytes}")
        with self._cuda, self.stream:
            return _cupy().zeros(max(int(nbytes), 1), np.uint8)[:int(nbytes)]

    def full(self, n: int, value: float):
        """A new GPU buffer of ``n`` float32 elements equal to ``value``, filled on the device's
        stream (no copy from the host). Not in metalcompute's API, like :meth:`zeros`."""
        self._check_usable()
        if n < 0:
            raise error(f"full: expected n >= 0 elements, got {n}")
        with self._cuda, self.stream:
            return _cupy().full(max(int(n), 1), value, np.float32).view(np.uint8)[:4 * int(n)]

    def constant(self, data) -> "Constant":
        """Read-only bytes (a parameter struct) for kernels to take as ``constant T&``: the
        launcher takes them by value, in CUDA's kernel parameter space, with no copy to the GPU
        (:mod:`._build`); bound to a pointer parameter, a GPU copy. Not in metalcompute's API:
        the Metal host makes its parameter structs so where a device has it."""
        self._check_usable()
        return Constant(self, data)

    def wrap(self, array):
        """A GPU array's memory as a buffer, without a copy (for inputs a kernel only reads): a
        C-contiguous CuPy array as it is (a kernel binds its first byte), another C-contiguous
        array as its bytes; any other array is copied into that layout on the device's stream.
        Not in metalcompute's API: the Metal host binds inputs already on the GPU through it."""
        cp = _cupy()
        if type(array) is cp.ndarray and array.flags.c_contiguous:
            return array  # a kernel binds its first byte: no view needed
        a = cp.asarray(array)
        if not a.flags.c_contiguous:
            with self._cuda, self.stream:
                a = _transposed_copy(a) if _swaps_last_axes(a) else cp.ascontiguousarray(a)
        return a.reshape(-1).view(cp.uint8)

    def fetch(self, buf, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of ``buf`` (a CuPy array, or a ``(buffer, byte offset)`` pair)
        as a NumPy uint8 array in pinned host memory, copied on the device's stream after the
        calls before it: its bytes are there once :meth:`finish` or :meth:`synchronize` returns.
        One copy the stream queues, no wait of its own (a CuPy ``get`` waits). Each fetch has
        host memory of its own, which the array keeps. Not in metalcompute's API: the Metal
        host reads the completion marks so."""
        cp = _cupy()
        self._check_usable()
        nbytes = int(nbytes)
        if nbytes <= 0:
            return np.zeros(0, np.uint8)
        block, address, used = self._staging
        if block is None or used + nbytes > block.size:
            memory = cp.cuda.alloc_pinned_memory(max(nbytes, STAGING_BYTES))
            block, address, used = np.frombuffer(memory, np.uint8), memory.ptr, 0
        self._staging = (block, address, used + -(-nbytes // 256) * 256)
        src = _pointer(buf)
        with self._cuda:
            cp.cuda.runtime.memcpyAsync(address + used, src, nbytes,
                                        cp.cuda.runtime.memcpyDeviceToHost, self.stream.ptr)
        return block[used:used + nbytes]

    def finish(self, handles) -> None:
        """Wait for the calls in ``handles``, in order, and empty the list; raise :class:`error`
        naming the kernel if one faulted.

        The calls of one device run in order on its stream, so waiting on the last of them
        waits on all: one wait, not one per call. Only when that wait fails are the calls waited
        on one at a time, in order, to name the first that reports the fault (CUDA reports a
        fault to later waits too, so an earlier kernel may be named:
        ``check_each_dispatch=True`` attributes a fault exactly)."""
        try:
            if handles:
                self._check_usable()
            last = None
            for handle in handles:  # another device's call (its own stream) is waited on itself
                if handle.function.kernel.device is self:
                    last = handle
                else:
                    self._wait(handle)
            if last is None:
                return
            try:
                self._wait(last)
            except error:
                # wait again, in order, to name the first call that reports the fault
                broken, self.broken = self.broken, None
                try:
                    for handle in handles:
                        self._wait(handle)
                finally:
                    self.broken = self.broken or broken
                raise
        finally:
            del handles[:]

    def synchronize(self) -> None:
        """Wait for everything queued on the GPU (every stream)."""
        self._check_usable()
        try:
            self._cuda.synchronize()
        except Exception as exc:
            raise self._fault("a kernel of this device", exc) from None

    def _wait(self, handle) -> None:
        self._check_usable()
        try:
            if handle.event is None:  # a call made with events off: wait for the stream
                self.stream.synchronize()
            else:
                handle.event.synchronize()
        except Exception as exc:
            raise self._fault(f"kernel '{handle.function.name}' (count {handle.dispatch.count}, "
                              f"threadgroup size {handle.dispatch.threadgroup_size})", exc) from None

    def _fault(self, what, exc) -> error:
        self.broken = f"{what} failed on the GPU: {exc}"
        return error(f"{self.broken}. The CUDA context is now unusable: no later call on this "
                     f"device can run; restart the Python process")

    def _check_usable(self):
        if self.broken:
            raise error(f"this CUDA device is unusable since {self.broken}; restart the Python process")


class Kernel:
    """A compiled source; ``function(name)`` picks one of its kernels."""

    def __init__(self, device: Device, source: str):
        if not isinstance(source, str):
            raise error(f"kernel: expected the MSL source as str, got {type(source).__name__}")
        cp = _cupy()
        self.device = device
        try:
            unit, kernels = _build.translate_source(source)
        except translate.CompileError as exc:
            raise error(str(exc)) from None
        try:
            with device._cuda:
                self._module = cp.RawModule(code=unit, options=_build.options(device.fast_math))
                self._module.compile()
        except cp.cuda.compiler.CompileException as exc:
            raise error(f"NVRTC failed to compile the translated MSL:\n{exc}") from None
        self._kernels = {k.name: k for k in kernels}

    def function(self, name: str) -> "Function":
        try:
            return Function(self, dispatch.kernel_info(self._kernels, name))
        except ValueError as exc:
            raise error(str(exc)) from None


class Function:
    """One kernel; call it as ``fn(count, *buffers)``."""

    def __init__(self, kernel: Kernel, info):
        cp = _cupy()
        self.kernel = kernel
        self.name = info.name
        self._info = info
        with kernel.device._cuda:
            self._raw = kernel._module.get_function(_build.LAUNCHER_PREFIX + info.name)
            limit = kernel._module.get_global(_build.LIMIT_PREFIX + info.name)
            self.max_total_threads_per_threadgroup = int(
                cp.ndarray((1,), cp.uint32, limit).get()[0])
            self.threadgroup_memory = int(self._raw.attributes["shared_size_bytes"])
            self.registers = int(self._raw.attributes["num_regs"])
            # bytes of local memory per thread: register spills and arrays indexed at run time
            self.local_memory = self._raw.attributes.get("local_size_bytes")  # None if not given
            self._compiled_limit = int(self._raw.attributes["max_threads_per_block"])
            # buffer index -> sizeof(T) of each `constant T&` the launcher takes by value
            self._structs = {
                q.index: int(cp.ndarray((1,), cp.uint32, kernel._module.get_global(
                    f"{_build.SIZEOF_PREFIX}{info.name}_{q.index}")).get()[0])
                for q in info.params if _build.by_value(q)}
            self._pointer = self._raw.kernel.ptr  # the CUfunction: launched by the driver
        self._kept_size = None  # ((device cap, kernel limit), threadgroup size): see threadgroup_size

    def threadgroup_size(self) -> int:
        """metalcompute's rule: 32 x floor(min(1024, kernel limit, device limit, the compiled
        kernel's limit) / 32); kept for the two attributes it was computed under (the device's
        cap and the kernel's limit; the compiled limit does not change), so that a launch, and a
        host sizing its completion marks, pay for it once."""
        limits = (self.kernel.device.max_threads_per_threadgroup,
                  self.max_total_threads_per_threadgroup)
        kept = self._kept_size
        if kept is None or kept[0] != limits:
            kept = self._kept_size = (limits, dispatch.threadgroup_size(*limits,
                                                                        self._compiled_limit))
        return kept[1]

    def __call__(self, count, *buffers) -> RunHandle:
        """One call: :class:`Prepared` with every buffer bound (None too, as a buffer to make,
        which ``Device.buffer`` refuses), launched once."""
        return Prepared(self, count, buffers, opens=False)()

    def prepare(self, count, *buffers) -> "Prepared":
        """This kernel's call over ``count`` threads with ``buffers`` bound once, each None an
        open slot that every launch binds (:class:`Prepared`). Not in metalcompute's API."""
        return Prepared(self, count, buffers)


class Prepared:
    """A call of one kernel with its thread count and its fixed buffers bound once
    (:meth:`Function.prepare`): ``prepared(*open)`` launches it with the open slots bound, in
    order, each to a buffer (a CuPy array, bound at its first byte) or a ``(buffer, byte
    offset)`` pair (bound at that byte: a slice without making one). Everything a call of the
    function checks is checked once, at ``prepare``; a launch only writes the open slots'
    device pointers into the parameters it keeps and launches, as a Metal encoder sets a
    pipeline's buffers. Not in metalcompute's API: the Metal host prepares each dispatch of an
    op's plan where a device's functions have it. A plain call (:meth:`Function.__call__`) is
    one with no open slot (``opens=False``), launched once."""

    __slots__ = ("function", "count", "n_tg", "tg", "open", "_pointers", "_params", "_address",
                 "_keep")

    def __init__(self, function: "Function", count, buffers, opens: bool = True):
        cp = _cupy()
        device = function.kernel.device
        device._check_usable()
        tg = function.threadgroup_size()
        n = function._info.n_buffers
        try:
            count = dispatch.check_call(function.name, count, len(buffers), n, tg,
                                        function.max_total_threads_per_threadgroup)
            if function.threadgroup_memory > dispatch.THREADGROUP_MEMORY:
                dispatch.check_threadgroup_memory(function.name, function.threadgroup_memory)
        except ValueError as exc:
            raise error(str(exc)) from None
        self.function, self.count, self.tg, self.n_tg = function, count, tg, -(-count // tg)
        self._pointers = (ctypes.c_void_p * n)()  # the device pointers of the buffers
        self._params = (ctypes.c_void_p * n)()  # the address of each parameter's value
        self._address = ctypes.addressof(self._params)
        base = ctypes.addressof(self._pointers)
        self.open, self._keep = [], []
        structs = function._structs
        for i, b in enumerate(buffers[:n]):
            if b is None and opens:
                if i in structs:
                    raise error(f"kernel '{function.name}': buffer {i} is its `constant` struct, "
                                f"which a prepared call binds once: expected it given, got None")
                self.open.append(i)
                self._params[i] = base + 8 * i
                continue
            try:
                bound = (_struct(b, structs[i], function.name, i) if i in structs
                         else b if isinstance(b, cp.ndarray)
                         else b.buffer() if isinstance(b, Constant) else device.buffer(b))
            except ValueError as exc:
                raise error(str(exc)) from None
            self._keep.append(bound)
            if isinstance(bound, np.ndarray):
                self._params[i] = bound.ctypes.data
            else:
                self._pointers[i] = bound.data.ptr
                self._params[i] = base + 8 * i
        self.open = tuple(self.open)

    def __call__(self, *bound) -> RunHandle:
        function = self.function
        device = function.kernel.device
        if device.broken:
            device._check_usable()
        if len(bound) != len(self.open):
            raise error(dispatch.open_count_error(function.name, len(self.open), len(bound)))
        pointers = self._pointers
        for i, b in zip(self.open, bound):
            pointers[i] = _pointer(b)
        cp = _cupy()
        stream = device.stream
        with device._cuda:
            start = end = None
            if device.timing:
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record(stream)
            elif device.events or device.check_each_dispatch:
                end = cp.cuda.Event(disable_timing=True)
            if self.n_tg:
                try:
                    _launch_params(function._pointer, self.n_tg, self.tg, stream, self._address)
                except Exception as exc:
                    raise error(f"kernel '{function.name}' (count {self.count}, threadgroup size "
                                f"{self.tg}): launch failed: {exc}") from None
            if end is not None:
                end.record(stream)
        record = Dispatch(function.name, self.count, self.tg, self.n_tg,
                          function.threadgroup_memory, (start, end) if start is not None else None)
        device.trace.append(record)
        handle = RunHandle(function, end, record)
        if device.check_each_dispatch:
            device._wait(handle)
        return handle
