"""The completion-mark protocol: every dispatch of an op checked for the marks its threadgroups
leave, and the memory an op's kernels write.

metalcompute 0.2.9 never checks a command buffer's status, so a dispatch that faults or that the
GPU watchdog stops would return partial outputs silently. Every kernel marks, in a status buffer
the host binds last, that each of its threadgroups reached its end and with how many steps
(``rg_mark`` in kernels/common.metal). :class:`Runs` holds one op's dispatches: it opens each,
binds its status buffer, waits, and checks the marks; a missing or wrong mark raises
:class:`~rnngrad.backends.metal.IncompleteDispatch` naming the kernel, the op, the problem size,
the dispatch and the threadgroups, and nothing is returned. A v2 entry whose threadgroups
declined the device's size raises :class:`Declined`, which the host answers by running v1.

Where the device checks marks itself (``device.check_marks``: the CUDA target, a check kernel
queued behind the op) the host does not wait for an op at all unless ``RNNGRAD_LAUNCH_BLOCKING``
is 1 (:func:`launch_blocking`): the op returns once its dispatches and their check are queued,
and a failure is raised at the next rnngrad call on that device, at ``rnngrad.synchronize()``
or at exit, as CUDA reports a faulting kernel at a later call
(``MetalHost.check_late``).

Cost: one 8-byte store per threadgroup, one barrier at the end of the kernels that had none
there, ``8·ceil(count/32)`` bytes of marks per dispatch and their check; on metalcompute (and
the CPU harness) a status buffer per dispatch copied from host zeros and read back on its own,
and one wait per dispatch; on a device that zeroes and fetches itself (the CUDA target) a slice
per dispatch of a status arena zeroed on the GPU, and one read-back of the arena for all of an
op's dispatches.
"""

from __future__ import annotations

import os

import numpy as np

from ...problem import on_gpu
from . import library
from .errors import IncompleteDispatch, ranges
from .schedule import BUDGET_ENV

#: environment variable: 1 checks every op's marks before it returns (the host waits for the
#: GPU), 0 never waits where the device can check them itself; unset: the device says
LAUNCH_BLOCKING_ENV = "RNNGRAD_LAUNCH_BLOCKING"


def launch_blocking(device, problem) -> bool:
    """Whether ``problem``'s op waits for its dispatches and checks their marks before it
    returns: always for host (NumPy) inputs, whose results are read back anyway; where
    ``$RNNGRAD_LAUNCH_BLOCKING`` is 1; and on a device that runs calls synchronously (the CPU
    harness) unless the variable is 0. An op that does not wait needs a device with
    ``check_marks``."""
    value = os.environ.get(LAUNCH_BLOCKING_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{LAUNCH_BLOCKING_ENV}: expected 0 or 1, got {value!r}")
    if value == "1" or not on_gpu(problem.source) and getattr(device, "asynchronous", False):
        return True
    if value == "0":
        return False
    return not getattr(device, "asynchronous", False)


#: bytes of one status arena (see Runs); a dispatch that needs more gets an arena of its own
ARENA_BYTES = 1 << 18
#: alignment of each dispatch's slice of a status arena, in bytes (as cudaMalloc aligns)
ARENA_ALIGN = 256
#: bytes of one slab of new (uninitialised, or poisoned by the device) memory that an op's small
#: output and scratch buffers are sliced from (see Runs); a buffer over a quarter of it is made
#: on its own. A result keeps its slab alive: at most this much memory per op whose results are
#: held
SLAB_BYTES = 1 << 18
#: marks layouts whose expected words a host keeps (see Runs._all_marked); all dropped past it
EXPECTED_KEPT = 256



def _aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a whole number of :data:`ARENA_ALIGN` blocks: a slice's extent."""
    return -(-nbytes // ARENA_ALIGN) * ARENA_ALIGN

class Declined(Exception):
    """The threadgroups of a v2 entry point's dispatch declined to run its body (``rg_declines``
    in common.metal): the device gave the pipeline ``threads`` threads a threadgroup, not the
    size the rule chose the entry for. The host runs the op again with v1 for it."""

    def __init__(self, kernel: str, threads: int):
        super().__init__(f"{kernel} declined threadgroups of {threads} threads")
        self.kernel, self.threads = kernel, threads


class Runs:
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

    def __init__(self, host, op: str, problem):
        self.host = host
        self.op = op
        self.sizes = dict(T=problem.T, N=problem.N,
                          I=problem.I if problem.input_weight is not None else None,
                          H=problem.H, D=problem.D)
        self.count = 0  # dispatches opened
        self._pending = []  # [(handle, run)] not yet waited on
        device = host.device
        self._finish = getattr(device, "finish", None)
        self._arena_zeros = getattr(device, "zeros", None) if self._finish else None
        #: whether the op's new buffers are slices of arenas and slabs (see new)
        self.slices = self._arena_zeros is not None
        #: the device's own check of the marks, where the op does not wait (launch_blocking)
        self._check_marks = getattr(device, "check_marks", None) \
            if self.slices and not launch_blocking(device, problem) else None
        if hasattr(device, "events"):  # events to wait on, only where the op waits
            device.events = self._check_marks is None
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
                                           number=self.count, size=size)))
        self.count += 1

    def _status(self, nbytes):
        """A zeroed status buffer of ``nbytes`` for one dispatch, and where its marks are read:
        ``(arena index, byte offset)`` for a slice of an arena, else the buffer itself."""
        if not self.slices:
            status = self.new(nbytes, True)
            return status, status
        last = self._arena(nbytes)
        offset = last[1]
        last[1] = offset + _aligned(nbytes)
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
            return self.host.filled(nbytes // 4, 0.0) if zeroed else device.buffer(nbytes)
        if zeroed:
            if own or nbytes > ARENA_BYTES // 4:
                return self._arena_zeros(nbytes)
            last = self._arena(nbytes)
            last[2] -= _aligned(nbytes)
            return self._slice(last[0], last[2], nbytes)
        if own or nbytes > SLAB_BYTES // 4:
            return device.buffer(nbytes)
        slab = self._slab
        if slab is None or slab[1] + nbytes > len(slab[0]):
            slab = self._slab = [device.buffer(SLAB_BYTES), 0]
        offset = slab[1]
        slab[1] = offset + _aligned(nbytes)
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
        kept = self.host.expected_marks
        expected = kept.get(key)
        if expected is None:
            expected = self._expected(layout, sizes, read)
            if len(kept) >= EXPECTED_KEPT:
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
        order; where the op does not wait, queue the device's check of them instead."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        if self._check_marks is not None:
            if check:
                self._defer([run for _, run in pending])
            self._arenas = []
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

    def _defer(self, runs):
        """Queue the device's check of ``runs``' marks, one per arena they are in, each under a
        serial number the host keeps a description for (``MetalHost.remember``)."""
        by_arena = {}
        for run in runs:
            index, offset = run["status"]
            by_arena.setdefault(index, []).append(run)
        for index, group in by_arena.items():
            rows = tuple((run["status"][1] // 4, run["marks"], run["marks"], run["size"],
                          run["steps"]) for run in group)
            serial = self.host.remember(self.op, self.sizes, group)
            self._check_marks((self._arenas[index][0], 0), self.host.check_table(rows), serial)

    def _check(self, kernel, count, status, marks, steps, span, number, reported, words,
               size=None):
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
            raise Declined(kernel, int(words[declined, 1][0]))
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
