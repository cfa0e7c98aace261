"""The Metal backends: host code that runs the kernels of ``kernels/`` through metalcompute's API.

Four backends share this code and differ only in the device they are given:

- ``"metal"``: a real Apple GPU through ``metalcompute`` (macOS on Apple silicon); chosen by
  ``backend=None`` when available.
- ``"metal-emulated"``: the same kernels and host code on the CPU target of the harness,
  :mod:`rnngrad.backends.metal.harness.cpu` (any machine with a C++ compiler); only when asked for.
- ``"metal-cuda"``: the same kernels and host code on an NVIDIA GPU through the harness's CUDA
  target, :mod:`rnngrad.backends.metal.harness.cuda` (CuPy); only when asked for. It takes arrays
  already in GPU memory (CuPy arrays, CUDA tensors: anything with ``__cuda_array_interface__``)
  and returns CuPy arrays on the GPU for them, with no copy through the host; NumPy inputs are
  copied to the GPU once per call and the results come back as NumPy arrays. An op runs on
  the CUDA device its arrays are on (NumPy inputs: the current device), one host per device.
- ``"metal-mps"``: the same kernels and host code on PyTorch's ``"mps"`` tensors through
  ``torch.mps.compile_shader`` (PyTorch 2.7 or later on a Mac), :mod:`rnngrad.backends.metal.mps`;
  only when asked for, and by ``rnngrad.torch`` for MPS tensors. It takes MPS tensors and
  returns tensors on the device (NumPy inputs are copied there and come back as NumPy
  arrays), like ``"metal-cuda"``; :func:`mps_standin` runs it on the harness without a Mac.

Each op is a small number of dispatches (the kernel files for the math):

==========================  =======================================================================
forward                     [strided_gemm: x' = source·Wᵀ + b, when input_weight is given]
                            <cell>_forward: the sequence, both directions, in as few dispatches
                            as the work budget allows (one unless T is long: see below)
gradients                   <cell>_backward: the BPTT recurrence, both directions, split alike
                            strided_gemm: dR = Σ lhsᵀ rhs over T·N rows, batched over directions
                            [strided_gemm ×2: d_source = dA·W, dW = dAᵀ·source, with input_weight]
                            [strided_gemm: db = Σ dA, with bias]
                            [strided_gemm: dpeephole / d_secondary_bias from per-row partials]
==========================  =======================================================================

Everything is float32 (the backends declare ``dtypes=(float32,)``). An absent optional input is
bound as zeros (init states, bias, secondary bias) or ones (mask); flags in the parameter struct
cover the inputs whose absence is not a neutral value (peephole, per-step cell gradient).
Those zeros and ones, and the parameter structs, are buffers no kernel writes: the host makes
each once per device and keeps it (:meth:`MetalHost.buffer`), on the device itself where it can
fill memory (the CUDA target's ``zeros`` and ``full``), so that from the second call of a shape
on an op copies to the device only the arrays its caller passed. Of those, an array already in
GPU memory that the kernels only read is bound where it is (the CUDA target's ``wrap``; see
:meth:`MetalHost.read_only`): only the two inputs a kernel writes (state_gradient, a final
cell_gradient) and the weights read transposed (R where the version reads Rᵀ; W only for a
large untiled projection, :meth:`MetalHost._copies_weight`) are copied there. The buffers an
op's kernels write are slices of one slab and one zeroed arena per op on the CUDA target (see
:class:`_Runs`). T = 0 and N = 0 are answered on the host (SEMANTICS.md §4 beside the reference): there is
nothing to dispatch.

Plans. Everything above but the arrays follows from the problem's signature (sizes, descriptor,
which optional inputs are given), the work budget and the version settings. The host decides
it once, on an op's first call of a signature, as a :class:`~rnngrad.backends.metal.plan.Plan`
(kernel versions and thread counts, parameter structs, constants, each dispatch's buffers by
slot, the outputs), keeps :data:`PLANS_KEPT` of them per device, and from then on a call only
binds its arrays, makes its new buffers, dispatches, waits and checks (:meth:`MetalHost._call`).
The version choices are logged (DEBUG) when a plan is made.

Prepared dispatches. Where the device's functions have ``prepare`` (both harness targets;
metalcompute has none), the host prepares each dispatch of a plan once, on first use
(:meth:`MetalHost.prepared`): the kept buffers (constants, parameter structs) bound, the call's
arrays, new buffers and status buffer left open. A call then binds only the open slots, and on
a device that slices (the CUDA target) binds its slices as ``(buffer, byte offset)`` pairs
without making a view of each; the CUDA target's prepared call writes those pointers into the
parameters it keeps and launches, as a Metal encoder sets a pipeline's buffers. Where the device
also has ``fetch`` (the CUDA target), the completion marks' copy is queued behind the op's
dispatches, into pinned host memory, before the one wait: the marks need no read of their own.

Completion checks. metalcompute 0.2.9 never checks a command buffer's status, so a dispatch
that faults or that the GPU watchdog stops would return partial outputs silently. Every kernel
marks, in a status buffer the host binds last, that each of its threadgroups reached its end and
with how many steps (common.metal). On metalcompute the host runs an op's dispatches one at a
time, in order, and checks each one's marks (and the handle's ``error``, where the device reports
one) before it opens the next; the CUDA target runs them back to back and the marks are checked
in order at the end. A missing or wrong mark raises
:class:`~rnngrad.backends.metal.IncompleteDispatch` naming the kernel, the op, the problem size,
the dispatch and the threadgroups, and nothing is returned. Cost: one 8-byte store per
threadgroup, one barrier at the end of the kernels that had none there, ``8·ceil(count/32)``
bytes of marks per dispatch and their check; on metalcompute (and the CPU harness) a status
buffer per dispatch copied from host zeros and read back on its own, and one wait per dispatch;
on the CUDA target a slice per dispatch of a status arena zeroed on the GPU, and one read-back
of the arena for all of an op's dispatches (see :class:`_Runs`).

Dispatch budget. The recurrence kernels run a range of processing steps ``[s_begin, s_end)``;
the state crosses from one dispatch to the next in the buffers the kernels write anyway (h and c
forward; dh, dc and the per-row partial sums backward). The host estimates the work of one step
as ``units = max(D·N·H, 1024) · max(G·H, 32)``: threads times the multiply-adds of each thread's
recurrent dot product, where fewer than one full threadgroup of threads, or fewer than 32
multiply-adds, take no less time per step. A dispatch gets ``max(1, budget // units)`` steps, so
an op makes ``ceil(T / max(1, budget // units))`` recurrence dispatches: one while
``T · units <= budget``, then one more for every further ``budget // units`` steps (linear in T).
The default budget, :data:`DISPATCH_BUDGET` = 2**34 units, keeps one dispatch of v1 an order of
magnitude inside the GPU watchdog that public reports describe, at an assumed 4·10**10
multiply-adds per second on one GPU core (an estimate, not a measurement: a quarter of an M1
core's peak, since v1 makes three loads per multiply-add; more cores only shorten it). Every default ``rnngrad bench`` shape stays in
one dispatch (the largest, LSTM 200x64x512x512, is 1.3·10**10 units; bidirectional, two).
Override it with the environment variable ``RNNGRAD_METAL_DISPATCH_BUDGET`` (read at every op)
or the host's ``dispatch_budget`` attribute (``HOST.dispatch_budget = 2**30``; ``None`` restores
the variable or the default). The budget applies to every device, the CUDA target too. Splitting
gives bitwise the same results. strided_gemm is never split: its threads run in parallel, each
a loop of K multiply-adds (K = T·N for the weight gradients).

To run the emulated backend on a particular harness device (an adversarial schedule, a forced
threadgroup size), use :func:`emulated_device`.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import threading
from typing import NamedTuple

import numpy as np

from ... import registry
from ...descriptors import Activation
from ...problem import ForwardArrays, GradientArrays, address, on_gpu
from ...tensors import TensorArray
from . import library, versions
from .plan import INPUT, KEPT, NEW, Plan, signature
from .errors import IncompleteDispatch, ranges

F32 = np.float32

#: default work budget of one recurrence dispatch, in units (see the module docstring)
DISPATCH_BUDGET = 2 ** 34
#: environment variable that overrides :data:`DISPATCH_BUDGET`
BUDGET_ENV = "RNNGRAD_METAL_DISPATCH_BUDGET"
#: where the host logs each kernel version it chooses, with the reason (DEBUG)
_LOG = logging.getLogger(__package__)
#: read-only constant buffers (zeros, ones, parameter structs) a host keeps per device, least
#: recently used dropped first
CONSTANTS_KEPT = 256
#: bytes of one status arena (see _Runs); a dispatch that needs more gets an arena of its own
ARENA_BYTES = 1 << 18
#: alignment of each dispatch's slice of a status arena, in bytes (as cudaMalloc aligns)
ARENA_ALIGN = 256
#: alignment in bytes of a caller's GPU array bound in place (read_only): the float4 reads of
#: rg_dots (kernels/common.metal) need 16; any other address is copied to a new buffer
BIND_ALIGN = 16
#: bytes of one slab of new (uninitialised, or poisoned by the device) memory that an op's small
#: output and scratch buffers are sliced from (see _Runs); a buffer over a quarter of it is made
#: on its own. A result keeps its slab alive: at most this much memory per op whose results are
#: held
SLAB_BYTES = 1 << 18
#: op plans a host keeps (see MetalHost.plan), least recently used dropped first
PLANS_KEPT = 64


class Constant(NamedTuple):
    """``n`` float32 elements equal to ``value``, bound where an input a kernel only reads is
    absent (zeros for init states and biases, ones for the mask). :meth:`MetalHost.buffer` makes
    it once per device and keeps it; never bind one where a kernel writes."""

    n: int
    value: float = 0.0


def _f32(a):
    if on_gpu(a):
        return a.astype(F32)
    return np.ascontiguousarray(a, dtype=F32)


def step_units(problem) -> int:
    """Estimated work of one processing step of a recurrence kernel (module docstring)."""
    threads = problem.D * problem.N * problem.H
    return max(threads, 1024) * max(problem.G * problem.H, 32)


def step_ranges(T: int, units: int, budget: int) -> list:
    """[(s_begin, s_end)]: T processing steps in dispatches of at most ``budget`` units each
    (at least one step per dispatch)."""
    per = max(1, budget // max(units, 1))
    return [(s, min(s + per, T)) for s in range(0, T, per)]


class _Declined(Exception):
    """The threadgroups of a v2 entry point's dispatch declined to run its body (``rg_declines``
    in common.metal): the device gave the pipeline ``threads`` threads a threadgroup, not the
    size the rule chose the entry for. The host runs the op again with v1 for it."""

    def __init__(self, kernel: str, threads: int):
        super().__init__(f"{kernel} declined threadgroups of {threads} threads")
        self.kernel, self.threads = kernel, threads


class _Runs:
    """The dispatches of one op, each checked for its completion marks once waited on.

    On metalcompute (and the CPU harness, whose calls are synchronous anyway) the runs go one at
    a time, in order: each is waited on, dropped and checked before the next is opened. That
    keeps one run of this process in flight, so metalcompute's completion handler (which walks
    its table of runs without a lock) is not scanning while Python inserts the next run, except
    during the handler's own last moments; and a failed dispatch stops the op before any later
    one is opened. A device that waits on several runs itself and reports a kernel that faulted
    (``device.finish``: the CUDA target) gets the op's dispatches back to back, and the marks
    are checked in order once it has finished them all: no host wait between dispatches there.
    Used as a context manager: leaving it waits on what is in flight, and checks it unless an
    error is on its way.

    Status buffers. Where the device also zeroes memory itself (``device.zeros``: the CUDA
    target), each dispatch's status buffer is a slice of a zeroed arena of :data:`ARENA_BYTES`
    (a dispatch that needs more gets an arena of its own), and each arena is read back once,
    when the op's runs are waited on: no copy to the device, one read from it. Elsewhere each
    dispatch gets a buffer copied from host zeros (metalcompute does not zero new buffers), read
    back after its run.

    New buffers. On such a device the op's other new buffers are slices too (:meth:`new`), so
    that an op asks the device for one or two allocations instead of one per buffer: those that
    start at zero from the top of the same arenas (growing down, so the read of the marks,
    ``[0, marks' end)``, leaves them out), the others from a slab of :data:`SLAB_BYTES` made by
    ``device.buffer`` (which the CUDA target fills with NaN: the poison covers every slice). A
    buffer over a quarter of an arena or slab is made on its own. Every slice is aligned to
    :data:`ARENA_ALIGN` bytes and is the op's own: no other op's buffer shares its slab.
    """

    def __init__(self, host: "MetalHost", op: str, problem):
        self.host = host
        self.op = op
        self.sizes = dict(T=problem.T, N=problem.N,
                          I=problem.I if problem.input_weight is not None else None,
                          H=problem.H, D=problem.D)
        self.count = 0  # dispatches opened
        self._pending = []  # [(handle, run)] not yet waited on
        self._finish = getattr(host.device, "finish", None)
        self._arena_zeros = getattr(host.device, "zeros", None) if self._finish else None
        #: whether the op's new buffers are slices of arenas and slabs (see new)
        self.slices = self._arena_zeros is not None
        #: whether a slice is a (buffer, byte offset) pair rather than a buffer of its own: on a
        #: device that binds pairs (its functions' prepared calls) and reads marks by fetch
        self.pairs = False
        self._fetch = getattr(host.device, "fetch", None) if self._finish else None
        # [[buffer, marks' end, zeroed slices' start]] since the last wait: marks grow up from
        # 0, zeroed buffers down from the end
        self._arenas = []
        self._slab = None  # [buffer, bytes handed out]: where new() slices uninitialised buffers

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        self.wait(check=kind is None)
        return False

    def launch(self, kernel, count, buffers, steps, span, prepared=None):
        """Dispatch ``kernel`` over ``count`` threads with ``buffers`` and a status buffer; with
        ``prepared`` (the dispatch's prepared call, MetalHost.prepared), ``buffers`` are its
        open slots only."""
        if self._finish is None:
            self.wait()
        # One uint2 mark per threadgroup, zeroed here: one per threadgroup of the size the
        # device launches with where it tells it (the harness), else enough for threadgroups of
        # MIN_THREADGROUP or more (metalcompute picks the size at the call).
        if prepared is not None:
            size = max(prepared.tg, library.MIN_THREADGROUP)
        else:
            function = self.host.function(kernel)
            size = getattr(function, "threadgroup_size", None)
            size = max(size(), library.MIN_THREADGROUP) if size is not None else library.MIN_THREADGROUP
        marks = -(-count // size)
        status, where = self._status(8 * marks)
        handle = (prepared(*buffers, status) if prepared is not None
                  else function(count, *buffers, status))
        self._pending.append((handle, dict(kernel=kernel, count=count, status=where,
                                           marks=marks, steps=steps, span=span,
                                           number=self.count)))
        self.count += 1

    def _status(self, nbytes):
        """A zeroed status buffer of ``nbytes`` for one dispatch, and where its marks are read:
        ``(arena index, byte offset)`` for a slice of an arena, else the buffer itself."""
        if not self.slices:
            status = self.new(nbytes, True)
            return status, status
        last = self._arena(nbytes)
        offset = last[1]
        last[1] = offset + -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN
        return self._slice(last[0], offset, nbytes), (len(self._arenas) - 1, offset)

    def _arena(self, nbytes):
        """The newest arena if ``nbytes`` fit between its marks and its zeroed slices, else a
        new one (of its own size where ``nbytes`` exceed :data:`ARENA_BYTES`)."""
        last = self._arenas[-1] if self._arenas else None
        if last is None or last[1] + nbytes > last[2]:
            buf = self._arena_zeros(max(ARENA_BYTES, nbytes))
            last = [buf, 0, len(buf) // ARENA_ALIGN * ARENA_ALIGN]
            self._arenas.append(last)
        return last

    def new(self, nbytes, zeroed, own=False):
        """A new buffer of ``nbytes`` for this op's kernels to write (``zeroed``: all zeros;
        else uninitialised, or poisoned by the device), sliced from an arena or the op's slab
        where the device allows (``slices``; see the class docstring), else made on its own
        (also where ``own``: a result on a device whose results must not share memory)."""
        device = self.host.device
        if not self.slices:
            return self.host._filled(nbytes // 4, 0.0) if zeroed else device.buffer(nbytes)
        if zeroed:
            if own or nbytes > ARENA_BYTES // 4:
                return self._arena_zeros(nbytes)
            last = self._arena(nbytes)
            last[2] -= -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN
            return self._slice(last[0], last[2], nbytes)
        if own or nbytes > SLAB_BYTES // 4:
            return device.buffer(nbytes)
        slab = self._slab
        if slab is None or slab[1] + nbytes > len(slab[0]):
            slab = self._slab = [device.buffer(SLAB_BYTES), 0]
        offset = slab[1]
        slab[1] = offset + -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN
        return self._slice(slab[0], offset, nbytes)

    def _slice(self, buf, offset, nbytes):
        """``nbytes`` of ``buf`` from byte ``offset``: a ``(buffer, offset)`` pair where the op's
        dispatches bind pairs (:attr:`pairs`), else a slice of the buffer."""
        return (buf, offset) if self.pairs else buf[offset:offset + nbytes]

    def _read_arenas(self, fetched=None):
        """The marks of each arena since the last wait as uint32 words (NumPy; None for an
        arena that holds only zeroed buffers): one read per arena, or the copies ``fetched``
        (the device's ``fetch``, queued before the wait)."""
        arenas, self._arenas = self._arenas, []
        if fetched is not None:
            return [words.view(np.uint32) if words is not None else None for words in fetched]
        return [self.host.words(buf, min(used, len(buf)) // 4) if used else None
                for buf, used, _ in arenas]

    def _words(self, runs, read):
        """Each run's marks as uint32 words [marks, 2] (NumPy): from ``read`` (the arenas'
        words), or one read per run where the runs have buffers of their own."""
        out = []
        for run in runs:
            where, n = run["status"], 2 * run["marks"]
            if isinstance(where, tuple):
                index, offset = where
                words = read[index][offset // 4:offset // 4 + n]
            else:
                words = self.host.words(where, n)
            out.append(words.reshape(run["marks"], 2))
        return out

    def _all_marked(self, runs, read):
        """Whether every run's marks are exactly as expected: each of its threadgroups (of the
        one size its first mark gives, at least MIN_THREADGROUP) marked with the steps asked
        for, and every other word of the arenas' marks zero (what :meth:`_check` passes), in
        one comparison per arena. False sends the runs to :meth:`_check` one at a time, which
        finds what is off and words the error; it passes what this leaves out."""
        layout = []
        for run in runs:
            where = run["status"]
            if not isinstance(where, tuple):
                return False
            layout.append((where, run["count"], run["steps"]))
        sizes = tuple(int(read[index][offset // 4 + 1]) for (index, offset), _, _ in layout)
        key = (tuple(layout), sizes,
               tuple(len(words) if words is not None else -1 for words in read))
        kept = self.host._marks
        expected = kept.get(key)
        if expected is None:
            expected = self._expected(layout, sizes, read)
            if len(kept) >= CONSTANTS_KEPT:
                kept.clear()
            kept[key] = expected
        if expected is False:
            return False
        return all(words is None or np.array_equal(words, want)
                   for words, want in zip(read, expected))

    @staticmethod
    def _expected(layout, sizes, read):
        """The arenas' words when every run marked as :meth:`_all_marked` expects, or False
        where no run's marks can be (a size below MIN_THREADGROUP, more threadgroups than
        marks: :meth:`_check` words what is off)."""
        expected = [np.zeros_like(words) if words is not None else None for words in read]
        for ((index, offset), count, steps), size in zip(layout, sizes):
            if size < library.MIN_THREADGROUP:
                return False
            groups = -(-count // size)
            start = offset // 4
            expected[index][start:start + 2 * groups:2] = library.DONE | steps
            expected[index][start + 1:start + 2 * groups:2] = size
        return expected

    def wait(self, check=True):
        """Wait on the runs in flight (if any), drop them, and check their completion marks in
        order."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        # What each run reported: the harness's runs have completed by now (calls there are
        # synchronous); metalcompute 0.2.9's handles report nothing.
        reported = [getattr(handle, "error", None) for handle, _ in pending]
        handles = [handle for handle, _ in pending]
        runs = [run for _, run in pending]
        del pending
        fetched = None
        if check and self._fetch is not None:  # the marks' copies, queued behind the runs
            fetched = [self._fetch(buf, min(used, len(buf))) if used else None
                       for buf, used, _ in self._arenas]
        if self._finish is not None:  # waits, and raises naming a kernel that faulted
            self._finish(handles)
        del handles[:]  # the last references: metalcompute waits for the command buffer here
        if not check:
            self._arenas = []
            return
        read = self._read_arenas(fetched)
        if not any(reported) and self._all_marked(runs, read):
            return
        for run, said, words in zip(runs, reported, self._words(runs, read)):
            self._check(reported=said, words=words, **run)

    def _check(self, kernel, count, status, marks, steps, span, number, reported, words):
        # The usual case in a few array operations: every threadgroup of one size marked, with
        # the steps asked for, and nothing past them (what the full analysis below would pass).
        size = int(words[0, 1]) if len(words) else 0
        if not reported and size >= library.MIN_THREADGROUP:
            groups = -(-count // size)
            if (groups <= len(words) and (words[:groups, 0] == library.DONE | steps).all()
                    and (words[:groups, 1] == size).all() and not words[groups:, 0].any()):
                return
        declined = words[:, 0] == library.DECLINED
        if not reported and declined.any():
            raise _Declined(kernel, int(words[declined, 1][0]))
        done = (words[:, 0] & library.DONE) != 0
        problems, missing = [], ()
        if reported:
            problems.append(f"the device reported: {reported}")
        if not done.any():
            missing = tuple(range(marks))
            problems.append("expected a completion mark from every threadgroup, got none "
                            "(no threadgroup finished)")
        else:
            sizes = [int(v) for v in np.unique(words[done, 1])]
            if len(sizes) != 1 or sizes[0] < library.MIN_THREADGROUP:
                problems.append(f"expected one threadgroup size of at least "
                                f"{library.MIN_THREADGROUP} in the marks, got {sizes}")
            else:
                groups = -(-count // sizes[0])
                missing = tuple(int(g) for g in np.flatnonzero(~done[:groups]))
                if missing:
                    problems.append(f"expected a completion mark from each of the {groups} "
                                    f"threadgroups (of {sizes[0]} threads), got none from "
                                    f"threadgroup(s) {ranges(missing)}")
                ran = words[:groups, 0] & ~np.uint32(library.DONE)
                wrong = np.flatnonzero(done[:groups] & (ran != steps))
                if wrong.size:
                    problems.append(f"expected marks of {steps} steps, got "
                                    f"{sorted(set(int(v) for v in ran[wrong]))} from "
                                    f"threadgroup(s) {ranges(wrong)}")
                extra = np.flatnonzero(done[groups:]) + groups
                if extra.size:
                    problems.append(f"expected no mark past threadgroup {groups - 1}, got marks "
                                    f"from {ranges(extra)}")
        if not problems:
            return
        size = ", ".join(f"{k}={v}" for k, v in self.sizes.items() if v is not None)
        if span is None:
            where, hint = "", ""
        else:
            T = self.sizes["T"]
            where = (f"processing steps [{span[0]}, {span[1]}) of T={T}, " if span[0] != span[1]
                     # v3: a backward's last dispatch runs no step, only the carry
                     else f"no step, the carry of processing step {span[1]} of T={T}, ")
            hint = (f" A long sequence runs in shorter dispatches with a smaller work budget "
                    f"({BUDGET_ENV}; now {self.host.budget()}).")
        raise IncompleteDispatch(
            f"{self.op}: kernel {kernel} did not finish on the device (dispatch {number} of the "
            f"op, counting from 0; {where}{count} threads; problem {size}): "
            + "; ".join(problems) + ". No result is returned: the outputs may be partly "
            "written, as when a GPU fault or the system's watchdog stops a dispatch." + hint,
            kernel=kernel, op=self.op, sizes=self.sizes, dispatch=number, steps=span,
            missing=missing, reported=reported)


class MetalHost:
    """Runs rnngrad's kernels on one metalcompute-compatible device.

    ``device_factory`` makes the device on first use (``metalcompute.Device`` or the harness's
    ``Device``); nothing else differs between the real GPU and the harness.
    """

    def __init__(self, device_factory, name: str):
        self._factory = device_factory
        self.name = name
        self._device = None
        self._functions = {}
        self._constants = collections.OrderedDict()  # key -> read-only buffer (see buffer)
        self._plans = collections.OrderedDict()  # (signature, budget, settings) -> Plan
        #: (runs' layout, threadgroup sizes, arenas' lengths) -> the marks expected when all
        #: went well (see _Runs._all_marked), or False
        self._marks = {}
        self._lock = threading.Lock()
        #: v2 entry point -> the threadgroup size this device gave it, where it declined that
        #: size (see versions): the rule runs v1 for it from then on
        self.declined = {}
        self._device_lock = threading.Lock()
        #: work budget of one recurrence dispatch in units; None: $RNNGRAD_METAL_DISPATCH_BUDGET,
        #: else DISPATCH_BUDGET (module docstring)
        self.dispatch_budget = None

    # -- device and kernels -------------------------------------------------------------------
    @property
    def device(self):
        """The one device of this host, made on first use (one per process: metalcompute keeps
        every device's runs in one table)."""
        if self._device is None:
            with self._device_lock:
                if self._device is None:
                    self._device = self._factory()
        return self._device

    def budget(self) -> int:
        """The work budget of one recurrence dispatch, in units."""
        if self.dispatch_budget is not None:
            value, source = self.dispatch_budget, "dispatch_budget"
        else:
            value, source = os.environ.get(BUDGET_ENV, "").strip() or DISPATCH_BUDGET, BUDGET_ENV
        try:
            budget = int(str(value).replace("_", ""), 0)
        except ValueError:
            budget = 0
        if budget < 1:
            raise ValueError(f"{source}: expected a positive integer (work units per dispatch), "
                             f"got {value!r}")
        return budget

    def step_ranges(self, problem) -> list:
        """[(s_begin, s_end)] of the recurrence dispatches of ``problem``, in processing order."""
        return step_ranges(problem.T, step_units(problem), self.budget())

    def use(self, device):
        """Run on ``device`` from now on (its kernels are compiled again on first use, its
        constant buffers made again)."""
        self._device = device
        self._functions = {}
        self._constants = collections.OrderedDict()
        self._plans = collections.OrderedDict()
        self.declined = {}

    def function(self, name):
        if name not in self._functions:
            if "__library__" not in self._functions:
                self._functions["__library__"] = self.device.kernel(library.source())
            self._functions[name] = self._functions["__library__"].function(name)
        return self._functions[name]

    @property
    def xp(self):
        """The array module of the device's buffers: NumPy, or CuPy on the CUDA target."""
        return getattr(self.device, "array_module", np)

    def buffer(self, array):
        """A device buffer holding a copy of ``array`` (float32 unless it is a params struct).

        Read-only constants are made once per device and kept (:data:`CONSTANTS_KEPT` of them,
        least recently used dropped first): a :class:`Constant`, made on the device where it can
        fill memory itself, and a params struct, kept by its bytes (every kernel's ``p`` is
        ``constant``). A buffer a kernel writes must be new each call: a plan's new buffer
        (:meth:`Plan.empty <rnngrad.backends.metal.plan.Plan.empty>`, ``Plan.zeroed``: each
        call makes its own), or a copy of an array."""
        if isinstance(array, Constant):
            n, value = max(int(array.n), 1), float(array.value)
            return self._kept(("fill", value, n), lambda: self._filled(n, value))
        if on_gpu(array):  # already on the GPU: copied there
            xp = self.xp
            if not array.size:
                return self.device.buffer(xp.zeros(1, F32))
            wrap = getattr(self.device, "wrap", None)
            if wrap is None or (array.dtype == F32 and array.flags.c_contiguous):
                return self.device.buffer(xp.ascontiguousarray(array, dtype=F32))
            # Another layout or dtype: the conversion is a new array, the op's own (one copy),
            # made by wrap for a float32 array in another layout (Rᵀ: its copy is one kernel).
            return wrap(array if array.dtype == F32 else xp.ascontiguousarray(array, dtype=F32))
        array = np.ascontiguousarray(array)
        if array.dtype.names is not None:  # a params struct: plain bytes for metalcompute
            return self.params(array.dtype, tuple(array.reshape(-1)[0].tolist()))
        array = array.astype(F32, copy=False)
        if array.nbytes == 0:
            array = np.zeros(1, F32)  # Metal has no empty buffers; never read
        return self.device.buffer(array)

    def read_only(self, array):
        """A device buffer of ``array`` for kernels that only read it (``const device`` in every
        kernel it is bound to): a GPU array already C-contiguous float32 is bound in place where
        the device can bind one without a copy (``device.wrap``: the CUDA target); anything else,
        a :class:`Constant` included, as :meth:`buffer` makes it: an array at an address off
        :data:`BIND_ALIGN` too (a slice may start anywhere; kernels read some inputs as float4).
        Never for a buffer a kernel writes (the caller's array would change)."""
        if (on_gpu(array) and array.dtype == F32 and array.flags.c_contiguous and array.size
                and address(array) % BIND_ALIGN == 0):
            wrap = getattr(self.device, "wrap", None)
            if wrap is not None:
                return wrap(array)
        return self.buffer(array)

    def params(self, struct, values):
        """The device buffer of a parameter struct (``library.GEMM_PARAMS`` or
        ``RECURRENCE_PARAMS``) holding ``values`` (a tuple in field order), kept as
        :meth:`buffer` keeps a struct, without building the struct when it is kept; made by
        ``device.constant`` where the device has it (the CUDA target: the launch takes the bytes
        by value)."""
        make = getattr(self.device, "constant", None) or self.device.buffer
        return self._kept(("params", struct, values),
                          lambda: make(np.array([values], struct).view(np.uint8)))

    def _kept(self, key, make):
        """The constant buffer under ``key``, made by ``make()`` when not kept (LRU)."""
        kept = self._constants
        if key in kept:
            kept.move_to_end(key)
            return kept[key]
        buf = kept[key] = make()
        while len(kept) > CONSTANTS_KEPT:
            kept.popitem(last=False)
        return buf

    def _filled(self, n, value):
        """A new device buffer of ``n`` float32 elements equal to ``value``: filled on the device
        where it can (``device.zeros``, ``device.full``: the CUDA target), else copied from the
        host, since metalcompute does not zero new buffers."""
        make = getattr(self.device, "zeros" if value == 0 else "full", None)
        if make is None:
            return self.device.buffer(np.full(n, value, F32))
        return make(4 * n) if value == 0 else make(n, value)

    def runs(self, op, problem) -> _Runs:
        """The dispatches of one op (a context manager; see :class:`_Runs`)."""
        return _Runs(self, op, problem)

    def read(self, buf, shape):
        """The first prod(shape) floats of a buffer the op made: a NumPy copy, or on the CUDA
        target a CuPy view (the buffer is the op's own)."""
        n, xp = math.prod(shape), self.xp
        offset = 0
        if type(buf) is tuple:  # (buffer, byte offset): see _Runs.pairs
            buf, offset = buf
        if xp is np:
            return np.frombuffer(buf, F32, count=n, offset=offset).reshape(shape).copy()
        return buf.view(xp.float32)[offset // 4:offset // 4 + n].reshape(shape)

    def recurrence(self, plan, problem, direction):
        """(choice, threads, {R's buffer name: slot}) of the op's recurrence dispatches: the
        version versions.recurrence picks (a versions.Choice, logged at DEBUG level when the
        plan is made), and R in the layout its kernel reads (its buffer table names it R or
        Rt)."""
        sizes = dict(cell=problem.cell, direction=direction, D=problem.D, N=problem.N,
                     H=problem.H)
        reset_after = bool(getattr(problem.descriptor, "reset_after", True))  # the GRU's
        choice = versions.recurrence(**sizes, device=self.name, reset_after=reset_after,
                                     peephole=problem.cell == "lstm" and problem.peephole is not None,
                                     declined=frozenset(self.declined))
        _LOG.debug("%s: %s", self.name, choice)
        name = library.BUFFERS[choice.kernel][3 if direction == "forward" else 1]
        weight = plan.input("recurrent_weight", (0, 2, 1) if name == "Rt" else None)  # [D,GH,H]
        return choice, versions.recurrence_count(choice, **sizes), {name: weight}

    def _recurrence_launches(self, plan, problem, direction, slots):
        """Add to ``plan`` the recurrence dispatches of ``direction`` with the buffers
        ``slots`` besides R and the parameter struct: the version :meth:`recurrence` picks, R
        in its layout, one parameter struct per range of steps (:meth:`recurrence_spans`)."""
        choice, count, weight = self.recurrence(plan, problem, direction)
        blocks, spans = self.recurrence_spans(problem, choice, direction)
        for span in spans:
            p = plan.keep(self.params(library.RECURRENCE_PARAMS,
                                      self.recurrence_values(problem, count, span, blocks)))
            plan.launch(choice.kernel, count, steps=span[1] - span[0], span=span, p=p, **slots,
                        **weight)

    def recurrence_spans(self, problem, choice, direction):
        """(unit_blocks, [(s_begin, s_end)] in processing order) of the recurrence dispatches
        under ``choice``: a kernel's own grid (0) over the budget's step ranges, or v3's one-step
        grid (its unit blocks) a step a dispatch, the backward ending with the carry of step 0
        alone (0, 0)."""
        T = problem.T
        if choice.version == "v3":
            blocks = versions.tile_blocks(cell=problem.cell, direction=direction, D=problem.D,
                                          N=problem.N, H=problem.H)[1]
        else:
            spans = self.step_ranges(problem)
            return 0, spans if direction == "forward" else spans[::-1]
        if direction == "forward":
            return blocks, [(s, s + 1) for s in range(T)]
        return blocks, [(s, s + 1) for s in reversed(range(T))] + [(0, 0)]

    def words(self, buf, n):
        """The first ``n`` uint32 words of a buffer, as a NumPy copy (from the GPU too)."""
        xp = self.xp
        if xp is np:
            return np.frombuffer(buf, np.uint32, count=n).copy()
        return self._to_host(buf.view(xp.uint32)[:n])

    def _to_host(self, a):
        """A NumPy copy of device array ``a``: a CuPy array's ``get``, else the array module's
        ``asnumpy`` (a tensor's: rnngrad.tensors)."""
        return a.get() if hasattr(a, "get") else self.xp.asnumpy(a)

    def to_caller(self, problem, out):
        """Results where the inputs were: GPU inputs get GPU arrays (tensors for tensors:
        rnngrad.tensors), host inputs NumPy arrays."""
        gpu = problem.on_gpu
        for field in dataclasses.fields(out):
            value = getattr(out, field.name)
            if value is None:
                continue
            if gpu and (isinstance(value, np.ndarray) or type(value) is TensorArray):
                setattr(out, field.name, self.xp.asarray(value))
            elif not gpu and not isinstance(value, np.ndarray):
                setattr(out, field.name, self._to_host(value))
        return out

    def gemm(self, plan, A, B, C, *, batch, M, P, K, a_batch=0, a_row=0, a_k=0, b_batch=0,
             b_k=0, b_col=0, block=None, b_block=0, bias=None, product=""):
        """Add to ``plan`` the dispatch of C[batch,M,P] = strided A·B (+ bias) (slots; see
        GemmParams in common.metal). The kernel version is
        :func:`rnngrad.backends.metal.versions.gemm`'s choice for the shape (``product`` names
        it in the reason, logged at DEBUG level when the plan is made)."""
        if batch * M * P == 0:
            return
        block = block or max(M, 1)
        choice = versions.gemm(batch=batch, M=M, P=P, K=K, product=product,
                               has_bias=bias is not None, block=block, b_block=b_block)
        slices, k_split = 1, 0
        if choice.version == "v5":
            slices, k_split = versions.wide_slices(batch=batch, M=M, P=P, K=K, block=block,
                                                   b_block=b_block, has_bias=bias is not None)
        count = versions.gemm_threads(choice, batch=batch, M=M, P=P, block=block, b_block=b_block,
                                      slices=slices)
        _LOG.debug("%s: %s%s", self.name, choice,
                   f"; {slices} slices of {k_split} k, added by a second product" if slices > 1 else "")
        values = dict(count=count, batch=batch, M=M, P=P, K=K, a_batch=a_batch, a_row=a_row,
                      a_k=a_k, b_batch=b_batch, b_k=b_k, b_col=b_col,
                      block=block, b_block=b_block, has_bias=int(bias is not None),
                      k_split=k_split)
        params = plan.keep(self.params(library.GEMM_PARAMS,
                                       tuple(int(values[k]) for k in library.GEMM_PARAMS.names)))
        parts = plan.empty(slices * batch * M * P) if slices > 1 else C
        plan.launch(choice.kernel, count, steps=K, p=params, A=A, B=B,
                    bias=bias if bias is not None else plan.keep(self.buffer(Constant(1))),
                    C=parts)
        if slices > 1:  # C = the slices' sum, in slice order: 1ᵀ · parts[slices, batch·M·P]
            self.gemm(plan, plan.keep(self.buffer(Constant(1, 1.0))), parts, C, batch=1, M=1,
                      P=batch * M * P, K=slices, b_k=batch * M * P, b_col=1,
                      product=f"the sum of {product or 'a product'}'s {slices} slices of K")

    # -- parameters ---------------------------------------------------------------------------
    @staticmethod
    def recurrence_values(problem, count, span=None, unit_blocks=0):
        """The fields of the RecurrenceParams struct (``library.RECURRENCE_PARAMS``) of one
        dispatch running processing steps ``span`` = ``(s_begin, s_end)`` (default all T), as a
        tuple of ints in the struct's order; ``unit_blocks``: 0 for a kernel's own grid, else a
        one-step grid (v3) with that many blocks of units to a group of rows (a span
        of one step, or none: a backward's last carry)."""
        desc, cell = problem.descriptor, problem.cell
        acts = [Activation.NONE] * 5
        gates = [0, 0, 0, 0]
        values = dict(count=count, T=problem.T, N=problem.N, H=problem.H, D=problem.D,
                      G=problem.G, Z=problem.Z, reverse=int(desc.reverse and problem.D == 1),
                      training=int(desc.training), mask_per_step=int(problem.mask_per_step),
                      has_peephole=0, cell_gradient_per_step=0, reset_after=0, flip_z=0)
        if cell == "single_gate":
            acts[0] = desc.activation
        elif cell == "gru":
            acts[:3] = [desc.update_gate_activation, desc.reset_gate_activation,
                        desc.output_gate_activation]
            gates[:3] = [desc.gate_index[k] for k in "zro"]
            values["reset_after"] = desc.reset_after
            values["flip_z"] = desc.flip_z
        else:
            acts = [desc.input_gate_activation, desc.forget_gate_activation,
                    desc.cell_gate_activation, desc.output_gate_activation, desc.activation]
            gates = [desc.gate_index[k] for k in "ifzo"]
            values["has_peephole"] = problem.peephole is not None
            values["cell_gradient_per_step"] = problem.cell_gradient_per_step
        values["s_begin"], values["s_end"] = span if span is not None else (0, problem.T)
        if unit_blocks and values["s_end"] - values["s_begin"] > 1:
            raise ValueError(f"recurrence_values: {unit_blocks} unit block(s) need at most one "
                             f"step a dispatch, got steps {values['s_begin']}..{values['s_end']}")
        values["unit_blocks"] = unit_blocks
        for k in range(5):
            values[f"act{k}"] = acts[k]
        for k in range(4):
            values[f"gate{k}"] = gates[k]
        return tuple(int(values[name]) for name in library.RECURRENCE_PARAMS.names)

    def _given(self, plan, problem, field, absent: Constant):
        """The slot of input ``field``, or of the kept constant ``absent`` where it is not
        given (kernels only read it)."""
        if getattr(problem, field) is not None:
            return plan.input(field)
        return plan.keep(self.buffer(absent))

    def _common(self, plan, problem):
        """Slots of what every recurrence reads: h0 (zeros when absent) and the mask (ones)."""
        N, DH = problem.N, problem.D * problem.H
        return (self._given(plan, problem, "init_state", Constant(N * DH)),
                self._given(plan, problem, "mask", Constant(N * DH, 1.0)))

    @staticmethod
    def _copies_weight(M, P, K, has_bias) -> bool:
        """Whether the input projection x' = source·Wᵀ [M,P] over K reads a transposed copy of
        W [P,K] (made on the device every call) rather than W in place (Wᵀ with b_k = 1): only
        for an untiled version (v1, v4: consecutive threads read consecutive columns of B) over
        at least ``versions.TILED_MIN_WORK`` multiply-adds. The tiled versions stage B along
        whichever index is unit stride, and below that work the copy costs more host time than
        its coalesced reads save on the device."""
        if M * P * K < versions.TILED_MIN_WORK:
            return False
        return versions.gemm(batch=1, M=M, P=P, K=K, has_bias=has_bias).version in ("v1", "v4")

    # -- plans and their calls ----------------------------------------------------------------
    def plan(self, problem) -> Plan:
        """The :class:`~rnngrad.backends.metal.plan.Plan` of ``problem``'s op: kept per
        signature, budget and version settings (:data:`PLANS_KEPT` of them, least recently used
        dropped first), made on first use. Call under the host's lock."""
        key = (signature(problem), self.budget(), versions.settings(), frozenset(self.declined))
        plans = self._plans
        try:
            plan = plans.get(key)
        except TypeError:  # a setting set to an unhashable value (a list): its repr stands in
            key = key[:2] + (repr(key[2]),) + key[3:]
            plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
            return plan
        plan = (self._gradients_plan if problem.gradients else self._forward_plan)(problem)
        plans[key] = plan
        while len(plans) > PLANS_KEPT:
            plans.popitem(last=False)
        return plan

    def _call(self, problem) -> dict:
        """Run ``problem``'s op by its plan (:meth:`_run`); where a v2 entry point declines the
        device's threadgroups, note it in :attr:`declined` and run the op again, by a plan that
        runs v1 for it."""
        with self._lock:
            while True:
                try:
                    return self._run(problem)
                except _Declined as declined:
                    if declined.kernel in self.declined:
                        raise RuntimeError(f"{declined}, again: the rule chose it although it "
                                           f"had declined") from None
                    self.declined[declined.kernel] = declined.threads
                    _LOG.warning("%s: %s; the host runs v1 for it on this device", self.name,
                                 declined)

    def _run(self, problem) -> dict:
        """Run ``problem``'s op by its plan: bind the call's inputs and make its new buffers as
        the dispatches first need them (so that the first dispatch is on the device while the
        host readies the next), dispatch, wait and check; the outputs by field (see
        :meth:`read`). Call under the host's lock."""
        plan = self.plan(problem)
        prepared = self.prepared(plan)
        with self.runs(plan.op, problem) as runs:
            runs.pairs = runs.slices and prepared is not None
            kept, inputs, made = plan.kept, [None] * len(plan.inputs), [None] * len(plan.buffers)
            # the new buffers results are read from, where results must not share memory (a
            # PyTorch operator's outputs alias neither each other: metal-mps's tensors)
            own = {i for _, (kind, i), _ in plan.outputs if kind == NEW} \
                if getattr(self.device, "results_apart", False) else ()

            def buffer(kind, i):
                if kind == KEPT:
                    return kept[i]
                if kind == INPUT:
                    if inputs[i] is None:
                        field, axes, written = plan.inputs[i]
                        array = getattr(problem, field)
                        if axes is not None:
                            array = array.transpose(axes)
                        inputs[i] = self.buffer(array) if written else self.read_only(array)
                    return inputs[i]
                if made[i] is None:
                    made[i] = runs.new(*plan.buffers[i], i in own)
                return made[i]

            # a prepared dispatch has its kept buffers bound already: only its open slots
            calls = prepared or [(None, launch[4]) for launch in plan.launches]
            for (kernel, count, steps, span, _), (call, slots) in zip(plan.launches, calls):
                runs.launch(kernel, count, [buffer(k, i) for k, i in slots], steps, span, call)
            runs.wait()  # waits for the GPU and checks every dispatch's marks
            return {field: self.read(buffer(*slot), shape)
                    for field, slot, shape in plan.outputs}

    def prepared(self, plan):
        """``[(prepared call, open slots)]`` per dispatch of ``plan``: each prepared once on this
        host's device with its kept buffers (constants, parameter structs) bound and its other
        slots and the status buffer open (the device's ``Function.prepare``), kept in the plan;
        None where the device's functions do not prepare (metalcompute), whose calls bind every
        buffer each time. Call under the host's lock."""
        if plan.prepared is None:
            calls = []
            for kernel, count, _, _, slots in plan.launches:
                prepare = getattr(self.function(kernel), "prepare", None)
                if prepare is None:
                    calls = False
                    break
                fixed = [plan.kept[i] if kind == KEPT else None for kind, i in slots]
                calls.append((prepare(count, *fixed, None),
                              tuple(slot for slot in slots if slot[0] != KEPT)))
            plan.prepared = calls
        return plan.prepared or None

    # -- forward ------------------------------------------------------------------------------
    def forward(self, problem) -> ForwardArrays:
        T, N, D = problem.T, problem.N, problem.D
        desc = problem.descriptor
        if T == 0 or N == 0:
            wants_c = problem.cell == "lstm" and (desc.training or desc.produce_cell)
            empty = np.zeros((T, N, D * problem.H), F32)
            return self.to_caller(problem, ForwardArrays(
                empty, empty.copy() if wants_c else None,
                np.zeros((T, N, D * problem.Z * problem.H), F32) if desc.training else None))
        return self.to_caller(problem, ForwardArrays(**self._call(problem)))

    def _forward_plan(self, problem) -> Plan:
        T, N, H, D, G, Z = problem.T, problem.N, problem.H, problem.D, problem.G, problem.Z
        cell, desc = problem.cell, problem.descriptor
        DH, DGH = D * H, D * G * H
        plan = Plan(f"{cell}_forward")
        if problem.input_weight is not None:
            x = plan.empty(T * N * DGH)
            bias = plan.input("bias") if problem.bias is not None else None
            I = problem.I
            if self._copies_weight(T * N, DGH, I, bias is not None):  # Wᵀ [I,DGH]
                W, b_k, b_col = plan.input("input_weight", (1, 0)), DGH, 1
            else:  # Wᵀ read in place through its strides
                W, b_k, b_col = plan.input("input_weight"), 1, I
            self.gemm(plan, plan.input("source"), W, x, batch=1, M=T * N, P=DGH, K=I, a_row=I,
                      a_k=1, b_k=b_k, b_col=b_col, bias=bias)
            x_bias = plan.keep(self.buffer(Constant(DGH)))
        else:
            x = plan.input("source")
            x_bias = self._given(plan, problem, "bias", Constant(DGH))
        h0, mask = self._common(plan, problem)
        h = plan.empty(T * N * DH)
        keeps_z = desc.training or cell == "gru"  # GRU stages a_r in z_state
        zs = plan.empty(T * N * D * Z * H) if keeps_z else plan.empty(1)
        if cell == "single_gate":
            slots = dict(x=x, bias=x_bias, h0=h0, mask=mask, h=h, zs=zs)
        elif cell == "gru":
            slots = dict(x=x, bias=x_bias, h0=h0, mask=mask, h=h, zs=zs,
                         b2=self._given(plan, problem, "secondary_bias", Constant(DH)))
        else:
            c = plan.empty(T * N * DH)
            slots = dict(x=x, bias=x_bias, h0=h0, mask=mask, h=h, c=c, zs=zs,
                         c0=self._given(plan, problem, "init_cell", Constant(N * DH)),
                         peephole=self._given(plan, problem, "peephole", Constant(D * 4 * H)))
            if desc.training or desc.produce_cell:
                plan.output("c", c, (T, N, DH))
        # Steps upward; each dispatch starts from the h (and c) the previous one wrote.
        self._recurrence_launches(plan, problem, "forward", slots)
        plan.output("h", h, (T, N, DH))
        if desc.training:
            plan.output("z_state", zs, (T, N, D * Z * H))
        return plan

    # -- gradients ----------------------------------------------------------------------------
    def gradients(self, problem) -> GradientArrays:
        if problem.T == 0 or problem.N == 0:
            return self.to_caller(problem, self._trivial_gradients(problem))
        return self.to_caller(problem, GradientArrays(**self._call(problem)))

    def _gradients_plan(self, problem) -> Plan:
        T, N, H, D, G = problem.T, problem.N, problem.H, problem.D, problem.G
        cell, desc = problem.cell, problem.descriptor
        DH, GH, DGH = D * H, G * H, D * G * H
        plan = Plan(f"{cell}_gradients")
        h0, mask = self._common(plan, problem)
        dy = plan.input("source_gradient")
        zs = plan.input("z_state")
        # dhn: written (dh carries over in it), so a copy of state_gradient
        given_sg = problem.state_gradient is not None
        dhn = plan.input("state_gradient", written=True) if given_sg else plan.zeroed(N * DH)
        dx = plan.empty(T * N * DGH)
        lhs = dx  # the left factor of dR: da, except GRU's o block with reset_after
        # rhs: h[t−1] ⊙ m per direction; GRU without reset_after adds blocks so that its o
        # gate reads h[t−1] ⊙ r ⊙ m: [hm, hm, hm ⊙ r].
        rhs_blocks = 3 if (cell == "gru" and not desc.reset_after) else 1
        rhs = plan.empty(T * N * D * rhs_blocks * H)
        prow = None
        if cell == "single_gate":
            slots = dict(h0=h0, mask=mask, dy=dy, zs=zs, dx=dx, rhs=rhs, dhn=dhn)
        elif cell == "gru":
            lhs = plan.empty(T * N * DGH)
            prow = plan.zeroed(D * N * H)
            slots = dict(h0=h0, mask=mask, dy=dy, zs=zs, hfwd=plan.input("output_fwd"), dx=dx,
                         lhs=lhs, rhs=rhs, dhn=dhn, work=plan.empty(D * N * H), prow=prow)
        else:
            cg = problem.cell_gradient
            final = cg is not None and cg.ndim == 2
            # dcn: written, so a copy of a final cell_gradient
            dcn = plan.input("cell_gradient", written=True) if final else plan.zeroed(N * DH)
            prow = plan.zeroed(D * N * 4 * H)
            slots = dict(
                h0=h0, mask=mask, dy=dy, zs=zs, dx=dx, rhs=rhs, dhn=dhn, dcn=dcn, prow=prow,
                c0=self._given(plan, problem, "init_cell", Constant(N * DH)),
                peephole=self._given(plan, problem, "peephole", Constant(D * 4 * H)),
                cfwd=plan.input("cell_output_fwd"),
                cg=plan.input("cell_gradient") if problem.cell_gradient_per_step
                else plan.empty(1))
        # Steps downward; dh (dc) and the per-row partial sums carry over in dhn (dcn), prow.
        self._recurrence_launches(plan, problem, "backward", slots)
        rows = T * N
        dR = plan.empty(D * GH * H)
        self.gemm(plan, lhs, rhs, dR, batch=D, M=GH, P=H, K=rows, a_batch=GH, a_row=1,
                  a_k=DGH, b_batch=rhs_blocks * H, b_k=D * rhs_blocks * H, b_col=1, block=H,
                  b_block=H if rhs_blocks == 3 else 0)
        plan.output("recurrent_weight", dR, (D, GH, H))
        ones = plan.keep(self.buffer(Constant(1, 1.0)))
        if problem.input_weight is not None:
            I = problem.I
            W = plan.input("input_weight")
            d_source = plan.empty(rows * I)
            self.gemm(plan, dx, W, d_source, batch=1, M=rows, P=I, K=DGH, a_row=DGH,
                      a_k=1, b_k=I, b_col=1)
            dW = plan.empty(DGH * I)
            self.gemm(plan, dx, plan.input("source"), dW, batch=1, M=DGH, P=I, K=rows, a_row=1,
                      a_k=DGH, b_k=I, b_col=1)
            plan.output("source", d_source, (T, N, I))
            plan.output("input_weight", dW, (DGH, I))
        else:
            plan.output("source", dx, (T, N, DGH))
        if problem.bias is not None:
            db = plan.empty(DGH)
            self.gemm(plan, ones, dx, db, batch=1, M=1, P=DGH, K=rows, b_k=DGH, b_col=1)
            plan.output("bias", db, (1, 1, DGH))
        if problem.init_state is not None:
            plan.output("init_state", dhn, (N, DH))
        if cell == "lstm" and problem.init_cell is not None:
            plan.output("init_cell", dcn, (N, DH))
        if cell == "lstm" and problem.peephole is not None:
            dp = plan.empty(D * 4 * H)
            self.gemm(plan, ones, prow, dp, batch=D, M=1, P=4 * H, K=N, b_batch=N * 4 * H,
                      b_k=4 * H, b_col=1)
            plan.output("peephole", dp, (D, 4 * H))
        if cell == "gru" and problem.secondary_bias is not None:
            db2 = plan.empty(DH)
            self.gemm(plan, ones, prow, db2, batch=D, M=1, P=H, K=N, b_batch=N * H, b_k=H,
                      b_col=1)
            plan.output("secondary_bias", db2, (DH,))
        return plan

    @staticmethod
    def _trivial_gradients(problem):
        """T = 0 or N = 0: nothing flows through the recurrence (SEMANTICS.md §4)."""
        N, H, D, G = problem.N, problem.H, problem.D, problem.G
        DH, DGH = D * H, D * G * H
        zeros = lambda *shape: np.zeros(shape, F32)  # noqa: E731
        out = GradientArrays(source=zeros(*problem.source.shape),
                             recurrent_weight=zeros(D, G * H, H))
        if problem.input_weight is not None:
            out.input_weight = zeros(DGH, problem.I)
        if problem.bias is not None:
            out.bias = zeros(1, 1, DGH)
        if problem.init_state is not None:
            sg = problem.state_gradient
            out.init_state = _f32(sg) if sg is not None else zeros(N, DH)
        if problem.init_cell is not None:
            cg = problem.cell_gradient
            final = cg is not None and cg.ndim == 2
            out.init_cell = _f32(cg) if final else zeros(N, DH)
        if problem.peephole is not None:
            out.peephole = zeros(D, 4 * H)
        if problem.secondary_bias is not None:
            out.secondary_bias = zeros(DH)
        return out

    # -- the registry's view ------------------------------------------------------------------
    def implementations(self):
        impl = {}
        for cell in registry.CELLS:
            impl[(cell, "forward")] = self.forward
            impl[(cell, "gradients")] = self.gradients
        return impl


# -- the three devices ----------------------------------------------------------------------------

def _metal_device():
    import metalcompute

    return metalcompute.Device()


def _probe_metal():
    try:
        import metalcompute  # noqa: F401
    except ImportError as exc:
        return f"metalcompute does not import ({exc}); it needs macOS on Apple silicon"
    try:
        HOST.device
    except Exception as exc:  # metalcompute.error, or no device
        return f"metalcompute imports but no Metal device was found ({exc})"
    return None


def _emulator_device():
    from .harness import cpu as emulator

    return emulator.Device()


def _probe_emulated():
    try:
        from .harness import cpu as emulator  # noqa: F401
    except ImportError as exc:
        return f"the Metal execution harness does not import ({exc})"
    try:
        emulator._loader.compiler()
    except Exception as exc:  # the harness names what to install
        return f"the Metal execution harness has no C++ compiler ({exc})"
    return None


def _cuda_device():
    from .harness import cuda

    return cuda.Device(timing=False)  # no Dispatch.seconds: one CUDA event a dispatch, not two


def _probe_cuda():
    try:
        from .harness import cuda
    except ImportError as exc:
        return f"the harness's CUDA target does not import ({exc})"
    reason = cuda.available()
    if reason:
        return reason
    try:
        CUDA_HOST.function("strided_gemm")  # compiles the library once: NVRTC must work
    except Exception as exc:
        return f"the Metal kernels do not compile for this GPU ({type(exc).__name__}: {exc})"
    return None


#: the fewest multiply-adds of an op for which ``backend=None`` runs it on the Apple GPU
METAL_MIN_WORK = 2 ** 24
#: environment variable that overrides :data:`METAL_MIN_WORK` (0: every op on the GPU)
MIN_WORK_ENV = "RNNGRAD_METAL_MIN_WORK"


def op_work(problem) -> int:
    """Multiply-adds of one op: the recurrence's T·D·N·G·H·H plus the input projection's
    T·D·N·G·H·I (with input_weight). The gradients do about twice that; the rule uses the same
    count for both so that an op and its gradients run on the same backend."""
    I = problem.I if problem.input_weight is not None else 0
    return problem.T * problem.D * problem.N * problem.G * problem.H * (problem.H + I)


def metal_suits(problem):
    """``backend=None``'s size rule for the Apple GPU: None (run on "metal") when the op has at
    least ``$RNNGRAD_METAL_MIN_WORK`` (default :data:`METAL_MIN_WORK` = 2**24, about 1.7·10**7)
    multiply-adds, else why numba is expected to be faster. Each op makes 2 to 8 dispatches,
    each its own command buffer in metalcompute, a fixed cost a dispatch that public reports
    describe and that numba (which runs an op of 2**24 multiply-adds in about as long on one
    core) does not pay. The threshold is that estimate, not a measurement
    on a Mac: ``rnngrad bench --backends metal numba`` there measures the crossover, and
    ``RNNGRAD_METAL_MIN_WORK`` moves it (0 sends every op to the GPU)."""
    value = os.environ.get(MIN_WORK_ENV, "").strip()
    try:
        least = int(value.replace("_", ""), 0) if value else METAL_MIN_WORK
    except ValueError:
        least = -1
    if least < 0:
        raise ValueError(f"{MIN_WORK_ENV}: expected a non-negative integer (multiply-adds), "
                         f"got {value!r}")
    work = op_work(problem)
    if work >= least:
        return None
    return (f"{work} multiply-adds < {MIN_WORK_ENV} = {least}: too small for the GPU's dispatch "
            f"cost")


HOST = MetalHost(_metal_device, "metal")
EMULATED_HOST = MetalHost(_emulator_device, "metal-emulated")
CUDA_HOST = MetalHost(_cuda_device, "metal-cuda")
#: metal-cuda's hosts on the other CUDA devices, by device index: an op runs on the device its
#: arrays are on (CUDA_HOST runs on the device current at its first use)
_CUDA_HOSTS = {}
_CUDA_HOSTS_LOCK = threading.Lock()


def _array_device(a) -> int:
    """The CUDA device index of GPU array ``a`` (a CuPy array's ``device``, else the driver's
    answer for its address), or the current device for a host array."""
    import cupy

    if on_gpu(a):
        device = getattr(a, "device", None)
        index = getattr(device, "id", None)
        if isinstance(index, int):
            return index
        return cupy.cuda.runtime.pointerGetAttributes(address(a)).device
    return cupy.cuda.runtime.getDevice()


def cuda_host(problem) -> MetalHost:
    """The metal-cuda host on the CUDA device of ``problem``'s arrays."""
    index = _array_device(problem.source)
    if CUDA_HOST.device._cuda.id == index:
        return CUDA_HOST
    host = _CUDA_HOSTS.get(index)
    if host is None:
        with _CUDA_HOSTS_LOCK:
            host = _CUDA_HOSTS.get(index)
            if host is None:
                from .harness import cuda

                host = _CUDA_HOSTS[index] = MetalHost(
                    lambda: cuda.Device(index, timing=False), "metal-cuda")
    return host


def _cuda_implementations() -> dict:
    forward = lambda problem: cuda_host(problem).forward(problem)  # noqa: E731
    gradients = lambda problem: cuda_host(problem).gradients(problem)  # noqa: E731
    return {(cell, kind): run for cell in registry.CELLS
            for kind, run in (("forward", forward), ("gradients", gradients))}

BACKEND = registry.Backend(
    name="metal",
    dtypes=(np.dtype(F32),),
    implementations=HOST.implementations(),
    probe=_probe_metal,
    summary="hand-written MSL kernels on the Apple GPU through metalcompute (float32)",
    suits=metal_suits,
)

EMULATED_BACKEND = registry.Backend(
    name="metal-emulated",
    dtypes=(np.dtype(F32),),
    implementations=EMULATED_HOST.implementations(),
    probe=_probe_emulated,
    summary="the Metal kernels on the CPU execution harness (float32; for testing, slow)",
)


CUDA_BACKEND = registry.Backend(
    name="metal-cuda",
    dtypes=(np.dtype(F32),),
    implementations=_cuda_implementations(),
    probe=_probe_cuda,
    summary="the Metal kernels on an NVIDIA GPU through the harness's CUDA target (float32)",
    gpu=True,
    device=lambda: f"{CUDA_HOST.device.deviceName} (CUDA device {CUDA_HOST.device._cuda.id})",
)


def _mps_device():
    from . import mps

    return mps.default_device()


def _probe_mps():
    from . import mps

    return mps.unavailable(MPS_HOST)


MPS_HOST = MetalHost(_mps_device, "metal-mps")

MPS_BACKEND = registry.Backend(
    name="metal-mps",
    dtypes=(np.dtype(F32),),
    implementations=MPS_HOST.implementations(),
    probe=_probe_mps,
    summary="the Metal kernels on PyTorch's \"mps\" tensors through torch.mps.compile_shader "
            "(float32)",
    gpu=True,
    device=lambda: MPS_HOST.device.deviceName,
)


@contextlib.contextmanager
def _running_on(host, device):
    previous = host._device, host._functions, host._constants, host._plans, host.declined
    host.use(device)
    try:
        yield device
    finally:
        host._device, host._functions, host._constants, host._plans, host.declined = previous


def emulated_device(**options):
    """Run ``"metal-emulated"`` on ``rnngrad.backends.metal.harness.cpu.Device(**options)`` inside
    the block (for example ``schedule="adversarial", seed=3, max_threads_per_threadgroup=64``);
    yields the device, whose ``trace`` lists the dispatches."""
    from .harness import cpu as emulator

    return _running_on(EMULATED_HOST, emulator.Device(**options))


def cuda_device(**options):
    """Run ``"metal-cuda"`` on ``rnngrad.backends.metal.harness.cuda.Device(**options)`` inside
    the block (for example ``fast_math=True``, ``check_each_dispatch=True``,
    ``max_threads_per_threadgroup=64``, ``timing=False``); yields the device, whose ``trace``
    lists the dispatches with their GPU times (unless ``timing=False``, which the backend's own
    device uses: one CUDA event a dispatch instead of two)."""
    from .harness import cuda

    return _running_on(CUDA_HOST, cuda.Device(**options))


def mps_device(compile_shader=None, device="mps", **options):
    """Run ``"metal-mps"`` on ``rnngrad.backends.metal.mps.Device(compile_shader, device,
    **options)`` inside the block (``compile_shader``: ``torch.mps.compile_shader`` by default,
    or anything with its API); yields the device, whose ``trace`` lists the dispatches."""
    from . import mps

    return _running_on(MPS_HOST, mps.Device(compile_shader, device, **options))


@contextlib.contextmanager
def mps_standin(device="cpu", *, poison=True, drop=None, **harness_options):
    """Run ``"metal-mps"`` inside the block on the harness stand-in of
    ``torch.mps.compile_shader`` (:class:`rnngrad.backends.metal.harness.mps.StandIn`) for
    tensors on ``device`` ("cpu": the CPU target; "cuda": the CUDA target), and take tensors on
    that device as MPS tensors are taken: the public functions and ``rnngrad.torch`` (layers,
    functions, custom ops) run them on ``"metal-mps"``, which the registry lists as available
    there. ``drop`` and ``harness_options`` go to the stand-in (``drop=i``, ``stop=(i, k)``,
    ``timeout=``, ``max_threads_per_threadgroup=`` …); ``poison``: new buffers filled with NaN.
    Yields the :class:`rnngrad.backends.metal.mps.Device`; its ``compile_shader`` is the
    stand-in, whose ``trace`` lists the harness's dispatches."""
    from . import mps
    from .harness.mps import StandIn
    from ... import tensors

    standin = StandIn(device, drop=drop, **harness_options)
    with mps_device(standin, standin.torch_device, poison=poison) as dev, \
            tensors.taking(dev.torch_device.type):
        mps._ACTIVE.append(dev)
        registry.reprobe("metal-mps")
        try:
            yield dev
        finally:
            mps._ACTIVE.remove(dev)
            registry.reprobe("metal-mps")
