"""The Metal device of the ``metal-mps`` backend: rnngrad's kernels on PyTorch's ``"mps"`` tensors.

PyTorch (2.7 and later) compiles Metal source at run time with ``torch.mps.compile_shader``
and encodes each kernel call into its own MPS command stream, on the tensors' memory.
:class:`Device` puts metalcompute's API, the one the Metal host drives
(:mod:`rnngrad.backends.metal.host`), on any object with that function's API, so the host code
runs unchanged:

- buffers are uint8 tensors on the device (the host's byte slices are tensor views, bound at
  their storage offset); an input already on the device that the kernels only read is bound
  where it is (:meth:`Device.wrap`), and results stay there: nothing crosses to the host but
  the completion marks;
- parameter structs are small uint8 tensors, made once per device and kept by the host;
- each result is a tensor of its own (``results_apart``): an op's scratch buffers are slices of
  one slab, but no two results share memory, as PyTorch's operators require of their outputs;
- a call of ``count`` threads runs a grid of whole threadgroups of the function's threadgroup
  size (metalcompute's rule: 32 x floor(min(1024, the pipeline's limit) / 32)): ``threads``
  is ``count`` rounded up to a multiple of it, as metalcompute pads its grids; the kernels
  check ``gid < count`` themselves;
- calls are asynchronous, in order on PyTorch's stream, and an op returns without a wait:
  :meth:`Device.check_marks` queues a copy of its completion marks (one zeroed region made by
  :meth:`Device.zeros`) to the host and an event behind it, checked once the event has passed,
  at a later call, ``rnngrad.synchronize()`` or exit. With ``RNNGRAD_LAUNCH_BLOCKING=1`` the
  host reads the marks before the op returns, a read that waits for the stream. A dispatch
  that did not finish every threadgroup raises
  :class:`~rnngrad.backends.metal.IncompleteDispatch`. ``compile_shader`` reports no command
  buffer status, so a stopped dispatch is seen by its marks alone.

``Device()`` runs on ``torch.mps.compile_shader`` and ``"mps"``;
``Device(StandIn("cpu"), "cpu")`` on the harness stand-in
(:mod:`rnngrad.backends.metal.harness.mps`), which presents the same API on the CPU (or CUDA)
target, so the backend and ``rnngrad.torch`` run end to end without a Mac:
:func:`rnngrad.backends.metal.harness.contexts.mps_standin`.
"""

from __future__ import annotations

import os

import numpy as np

from ..msl import dispatch
from . import tensors

#: environment variable: "cpu" or "cuda" runs ``metal-mps`` on the harness stand-in of that
#: torch device (for ``rnngrad verify --backend metal-mps`` without a Mac)
STANDIN_ENV = "RNNGRAD_MPS_STANDIN"

#: the threadgroup size used where a kernel object has no ``max_threads_per_threadgroup``
#: (a PyTorch without it); a pipeline that allows fewer threads refuses the dispatch with
#: PyTorch's ValueError ("Threadgroup size exceeds …") rather than running it
UNKNOWN_LIMIT = 256
#: the devices ``rnngrad.backends.metal.harness.contexts.mps_standin`` runs metal-mps on, innermost last
_ACTIVE = []


class RunHandle:
    """What a call returns: nothing to wait on (the host reads the marks), no error."""

    __slots__ = ("function",)
    error = None

    def __init__(self, function):
        self.function = function


class Dispatch(tuple):
    """One call, as ``Device.trace`` records it: (kernel, count, threads, group_size)."""

    kernel = property(lambda self: self[0])
    count = property(lambda self: self[1])
    threads = property(lambda self: self[2])
    threadgroup_size = property(lambda self: self[3])
    threadgroups = property(lambda self: self[2] // max(self[3], 1))


class Device:
    """metalcompute's API on ``compile_shader`` (``torch.mps.compile_shader`` by default) for
    tensors on ``device``. ``poison``: fill new buffers with 0xFF bytes (NaN as float32), so a
    result the kernels never wrote shows (the stand-in's default; ``torch.empty`` on a Mac)."""

    #: each result in memory of its own, not a slice of an op's slab: the results are tensors,
    #: and a PyTorch operator's outputs may not share memory (torch.library.custom_op)
    results_apart = True

    def __init__(self, compile_shader=None, device="mps", *, poison=False,
                 trace_limit=dispatch.TRACE_LIMIT):
        import torch

        self.compile_shader = compile_shader if compile_shader is not None \
            else torch.mps.compile_shader
        self.torch_device = torch.device(device)
        self.poison = bool(poison)
        self.trace = dispatch.Trace(trace_limit)
        self._checks = []  # (marks copied to the host, table, serial, event): see check_marks
        self._fault = None
        #: the array module of the buffers and results (the host's ``xp``)
        self.array_module = tensors._Namespace(self.torch_device)
        if compile_shader is None:
            name = getattr(torch._C, "_mps_get_name", lambda: "Apple GPU")()
            self.deviceName = f"{name} (torch.mps.compile_shader)"
        else:
            self.deviceName = f"{compile_shader!r} on {self.torch_device}"

    def __repr__(self):
        return f"mps.Device({self.deviceName})"

    def kernel(self, source: str) -> "Library":
        return Library(self, self.compile_shader(source))

    def _torch(self):
        import torch

        return torch

    def buffer(self, data):
        """A new uint8 tensor on the device: ``data`` is a size in bytes, or what to copy (a
        tensor or TensorArray, a NumPy array or any buffer-protocol object)."""
        torch = self._torch()
        if isinstance(data, (int, np.integer)):
            n = int(data)
            if n < 0:
                raise ValueError(f"buffer: expected a size >= 0 bytes, got {n}")
            if self.poison:
                return torch.full((max(n, 1),), 0xFF, dtype=torch.uint8,
                                  device=self.torch_device)[:n]
            return torch.empty(max(n, 1), dtype=torch.uint8, device=self.torch_device)[:n]
        t = getattr(data, "tensor", data)
        if isinstance(t, torch.Tensor):
            return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()
        try:
            host = np.frombuffer(memoryview(data).cast("B"), np.uint8)
        except TypeError:
            host = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return torch.from_numpy(host.copy()).to(self.torch_device)

    def zeros(self, nbytes: int):
        """``nbytes`` zero bytes on the device (no copy from the host)."""
        torch = self._torch()
        return torch.zeros(max(int(nbytes), 1), dtype=torch.uint8,
                           device=self.torch_device)[:int(nbytes)]

    def full(self, n: int, value: float):
        """``n`` float32 elements equal to ``value``, as bytes on the device."""
        torch = self._torch()
        return torch.full((max(int(n), 1),), float(value), dtype=torch.float32,
                          device=self.torch_device).view(torch.uint8)[:4 * int(n)]

    def wrap(self, array):
        """A tensor's memory as a buffer, without a copy where it is C-contiguous (for inputs a
        kernel only reads); another layout is copied into that one on the device."""
        torch = self._torch()
        t = getattr(array, "tensor", array)
        if not t.is_contiguous():
            t = t.contiguous()
        return t.detach().reshape(-1).view(torch.uint8)

    def finish(self, handles) -> None:
        """The calls of ``handles`` are in PyTorch's stream, in order: nothing to wait on here
        (the read of the completion marks waits); empties the list."""
        del handles[:]

    def synchronize(self) -> None:
        torch = self._torch()
        if self.torch_device.type == "mps":
            torch.mps.synchronize()
        elif self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)
        self._found(wait=True)

    #: calls run in PyTorch's stream after they return (the host then checks completion
    #: without a wait)
    asynchronous = True

    def check_marks(self, marks, table, serial: int) -> None:
        """Queue, behind the op's calls in PyTorch's stream, a copy of its completion marks to
        the host and an event after it; :meth:`fault` checks them once the event has passed,
        without a wait (``marks``: a tensor or a ``(tensor, byte offset)`` pair; ``table``:
        see ``msl.dispatch.first_wrong_mark``)."""
        torch = self._torch()
        buf, offset = marks if type(marks) is tuple else (marks, 0)
        words = int((table[:, 0] + 2 * table[:, 1]).max()) if len(table) else 0
        on_host = torch.empty(4 * words, dtype=torch.uint8,
                              pin_memory=self.torch_device.type == "cuda")
        on_host.copy_(buf[offset:offset + 4 * words], non_blocking=True)
        event = self._event()
        self._checks.append((on_host, table, serial, event))
        self._found()

    def _event(self):
        """An event recorded now in PyTorch's stream of the device, or None where copies to the
        host are synchronous (CPU tensors)."""
        torch = self._torch()
        kind = self.torch_device.type
        if kind == "mps":
            event = torch.mps.Event()
        elif kind == "cuda":
            event = torch.cuda.Event()
        else:
            return None
        event.record()
        return event

    def _found(self, wait=False):
        """Check the queued marks whose copies have arrived (all of them with ``wait``)."""
        while self._checks:
            on_host, table, serial, event = self._checks[0]
            if event is not None and not wait and not event.query():
                return
            if event is not None:
                event.synchronize()
            self._checks.pop(0)
            found = dispatch.first_wrong_mark(on_host.numpy().view(np.uint32), table)
            if found is not None and self._fault is None:
                self._fault = (serial, *found)

    def fault(self):
        """``(serial, row, threadgroup, word)`` of the first op whose marks :meth:`check_marks`
        found wrong so far (no wait), or None."""
        self._found()
        return self._fault

    def clear_fault(self) -> None:
        self._fault = None


class Library:
    """A compiled source; ``function(name)`` picks one of its kernels."""

    def __init__(self, device: Device, compiled):
        self.device, self.compiled = device, compiled

    def function(self, name: str) -> "Function":
        try:
            kernel = getattr(self.compiled, name)
        except (AttributeError, RuntimeError) as exc:
            raise ValueError(f"Function not found: no kernel named {name!r} in the source "
                             f"({exc})") from None
        return Function(self.device, name, kernel)


class Function:
    """One kernel: ``fn(count, *buffers)`` encodes one dispatch of a whole number of
    threadgroups covering ``count`` threads."""

    def __init__(self, device: Device, name: str, kernel):
        self.device, self.name, self.kernel = device, name, kernel
        #: the pipeline's limit; :data:`UNKNOWN_LIMIT` where the kernel object does not say it
        self.max_total_threads_per_threadgroup = int(
            getattr(kernel, "max_threads_per_threadgroup", UNKNOWN_LIMIT))
        self._size = dispatch.threadgroup_size(self.max_total_threads_per_threadgroup)

    def threadgroup_size(self) -> int:
        """metalcompute's rule: 32 x floor(min(1024, the pipeline's limit) / 32)."""
        return self._size

    def __call__(self, count, *buffers) -> RunHandle:
        size = self._size
        if size == 0:
            raise ValueError(f"kernel '{self.name}': its pipeline allows "
                             f"{self.max_total_threads_per_threadgroup} threads a threadgroup, "
                             f"below the SIMD width {dispatch.SIMD_WIDTH}")
        count = int(count)
        threads = -(-count // size) * size
        if threads:
            self.kernel(*buffers, threads=threads, group_size=size)
        self.device.trace.append(Dispatch((self.name, count, threads, size)))
        return RunHandle(self)


def _standin_target() -> str:
    return os.environ.get(STANDIN_ENV, "").strip()


def default_device() -> Device:
    """``metal-mps``'s device: on ``torch.mps.compile_shader``, or on the stand-in of
    ``$RNNGRAD_MPS_STANDIN``'s device."""
    target = _standin_target()
    if target:
        from ..harness.mps import StandIn

        return Device(StandIn(target), target, poison=True)
    return Device()


def unavailable(host):
    """None when ``metal-mps`` runs here (on ``host``), else why not."""
    if _ACTIVE:
        return None
    target = _standin_target()
    if target:
        if target not in ("cpu", "cuda"):
            return f"{STANDIN_ENV}={target!r}: expected 'cpu' or 'cuda' (a harness target)"
    else:
        try:
            import torch
        except ImportError as exc:
            return f"PyTorch does not import ({exc}); it needs PyTorch 2.7 or later on a Mac"
        if not hasattr(getattr(torch, "mps", None), "compile_shader"):
            return (f"PyTorch {torch.__version__} has no torch.mps.compile_shader (PyTorch 2.7 "
                    f"or later has it)")
        if not torch.backends.mps.is_available():
            return (f"PyTorch {torch.__version__} finds no MPS device "
                    f"(torch.backends.mps.is_available() is False); it needs macOS on Apple "
                    f"silicon")
    try:
        host.function("strided_gemm")  # compiles the library once
    except Exception as exc:
        return (f"the Metal kernels do not compile through "
                f"{'the stand-in' if target else 'torch.mps.compile_shader'} "
                f"({type(exc).__name__}: {exc})")
    return None
