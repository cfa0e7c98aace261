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
and one wait per dispatch; on a device that zeroes memory itself (the CUDA target, metal-mps) a
slice per dispatch of the call's zeroed region (:mod:`.layout`), and one read-back, or one check
on the device, for all of an op's dispatches.
"""

from __future__ import annotations

import os

import numpy as np

from ...problem import on_gpu
from . import library
from .errors import IncompleteDispatch, ranges
from .layout import OWN, ZEROED
from .schedule import BUDGET_ENV

#: environment variable: 1 checks every op's marks before it returns (the host waits for the
#: GPU), 0 never waits where the device can check them itself; unset: the device says
LAUNCH_BLOCKING_ENV = "RNNGRAD_LAUNCH_BLOCKING"


def regions(device) -> bool:
    """Whether an op's calls on ``device`` slice their memory from regions (:mod:`.layout`):
    where the device zeroes memory itself and waits on several runs at once."""
    return callable(getattr(device, "finish", None)) and callable(getattr(device, "zeros", None))


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


#: the expected words of a layout's marks a host keeps, per threadgroup sizes the marks report
EXPECTED_KEPT = 16


class Declined(Exception):
    """The threadgroups of a v2 entry point's dispatch declined to run its body (``rg_declines``
    in common.metal): the device gave the pipeline ``threads`` threads a threadgroup, not the
    size the rule chose the entry for. The host runs the op again with v1 for it."""

    def __init__(self, kernel: str, threads: int):
        super().__init__(f"{kernel} declined threadgroups of {threads} threads")
        self.kernel, self.threads = kernel, threads


class Runs:
    """The dispatches of one call of an op, each checked for its completion marks once waited
    on; its memory placed by the plan's :class:`~rnngrad.backends.metal.layout.Layout`.

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

    Where the device also zeroes memory itself (``device.zeros``: :attr:`regions`), a call
    allocates the layout's zeroed region and slab (two allocations) and binds every status
    buffer and small new buffer as a slice of them; all the marks are read back in one read
    (or one ``device.fetch`` queued before the wait), or checked on the device by one
    ``device.check_marks``. Elsewhere each dispatch gets a status buffer copied from host
    zeros (metalcompute does not zero new buffers), read back after its run.
    """

    def __init__(self, host, op: str, problem, layout=None, prepared: bool = False):
        self.host = host
        self.op = op
        self.sizes = dict(T=problem.T, N=problem.N,
                          I=problem.I if problem.input_weight is not None else None,
                          H=problem.H, D=problem.D)
        self.layout = layout
        self._pending = []  # [(handle, run)] not yet waited on
        device = host.device
        self._finish = getattr(device, "finish", None)
        #: whether status and small new buffers are slices of the call's regions
        self.regions = layout is not None and layout.table is not None
        #: the device's own check of the marks, where the op does not wait (launch_blocking)
        self._check_marks = getattr(device, "check_marks", None) \
            if self.regions and not launch_blocking(device, problem) else None
        if hasattr(device, "events"):  # events to wait on, only where the op waits
            device.events = self._check_marks is None
        #: whether a slice is a (buffer, byte offset) pair rather than a buffer of its own: on a
        #: device that binds pairs (its functions' prepared calls)
        self.pairs = self.regions and prepared
        self._fetch = getattr(device, "fetch", None) if self._finish else None
        self._made = [None] * len(layout.new) if layout is not None else []
        self._zeroed = self._slab = None
        if self.regions:
            self._zeroed = device.zeros(layout.zeroed)
            if layout.slab:
                self._slab = device.buffer(layout.slab)

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        self.wait(check=kind is None)
        return False

    def launch(self, number, buffers, prepared=None):
        """Dispatch the layout's dispatch ``number`` with ``buffers`` and its status buffer;
        with ``prepared`` (the dispatch's prepared call, MetalHost.prepared), ``buffers`` are
        its open slots only."""
        if self._finish is None:
            self.wait()
        run = self.layout.runs[number]
        where = self.layout.status[number]
        if where[0] == ZEROED:
            status = self._slice(self._zeroed, where[1], 8 * run["marks"])
        else:
            status = self._own(*where[1:])
            run = dict(run, status=status)
        handle = (prepared(*buffers, status) if prepared is not None
                  else self.host.function(run["kernel"])(run["count"], *buffers, status))
        self._pending.append((handle, run))

    def new(self, i):
        """The call's new buffer ``i`` of the plan (made on first use, then the same): a slice
        of a region, or an allocation of its own."""
        made = self._made[i]
        if made is None:
            where = self.layout.new[i]
            if where[0] == OWN:
                made = self._own(*where[1:])
            else:
                made = self._slice(self._zeroed if where[0] == ZEROED else self._slab, where[1],
                                   self.layout.nbytes[i])
            self._made[i] = made
        return made

    def _own(self, nbytes, zeroed):
        if not zeroed:
            return self.host.device.buffer(nbytes)
        return self.host.device.zeros(nbytes) if self.regions \
            else self.host.filled(nbytes // 4, 0.0)

    def _slice(self, buf, offset, nbytes):
        """``nbytes`` of ``buf`` from byte ``offset``: a ``(buffer, offset)`` pair where the op's
        dispatches bind pairs (:attr:`pairs`), else a slice of the buffer."""
        return (buf, offset) if self.pairs else buf[offset:offset + nbytes]

    def _words(self, runs, read):
        """Each run's marks as uint32 words [marks, 2] (NumPy): from ``read`` (the zeroed
        region's marks), or one read per run where the runs have buffers of their own."""
        out = []
        for run in runs:
            where, n = run["status"], 2 * run["marks"]
            if type(where) is tuple:
                words = read[where[1] // 4:where[1] // 4 + n]
            else:
                words = self.host.words(where, n)
            out.append(words.reshape(run["marks"], 2))
        return out

    def _all_marked(self, runs, read):
        """Whether every run's marks are exactly as expected: each of its threadgroups (of the
        one size its first mark gives, at least MIN_THREADGROUP) marked with the steps asked
        for, and every other word of the marks zero (what :meth:`_check` passes), in one
        comparison. False sends the runs to :meth:`_check` one at a time, which finds what is
        off and words the error; it passes what this leaves out."""
        if read is None or len(runs) != len(self.layout.runs):
            return False
        sizes = tuple(int(read[run["status"][1] // 4 + 1]) for run in runs)
        kept = self.layout.expected
        expected = kept.get(sizes)
        if expected is None:
            expected = self._expected(runs, sizes, len(read))
            if len(kept) >= EXPECTED_KEPT:
                kept.clear()
            kept[sizes] = expected
        return expected is not False and np.array_equal(read, expected)

    @staticmethod
    def _expected(runs, sizes, n):
        """The marks' words when every run marked as :meth:`_all_marked` expects, or False
        where no run's marks can be (a size below MIN_THREADGROUP, more threadgroups than
        marks: :meth:`_check` words what is off)."""
        expected = np.zeros(n, np.uint32)
        for run, size in zip(runs, sizes):
            if size < library.MIN_THREADGROUP or -(-run["count"] // size) > run["marks"]:
                return False
            groups = -(-run["count"] // size)
            start = run["status"][1] // 4
            expected[start:start + 2 * groups:2] = library.DONE | run["steps"]
            expected[start + 1:start + 2 * groups:2] = size
        return expected

    def wait(self, check=True):
        """Wait on the runs in flight (if any), drop them, and check their completion marks in
        order; where the op does not wait, queue the device's check of them instead."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        if self._check_marks is not None:
            if check:
                table = self.layout.table[:len(pending)]
                serial = self.host.remember(self.op, self.sizes, self.layout.described)
                self._check_marks((self._zeroed, 0), table, serial)
            return
        # What each run reported: the harness's runs have completed by now (calls there are
        # synchronous); metalcompute 0.2.9's handles report nothing.
        reported = [getattr(handle, "error", None) for handle, _ in pending]
        handles = [handle for handle, _ in pending]
        runs = [run for _, run in pending]
        del pending
        marks = self.layout.marks if self._zeroed is not None else 0
        fetched = None
        if check and marks and self._fetch is not None:  # the marks' copy, queued behind the runs
            fetched = self._fetch(self._zeroed, marks)
        if self._finish is not None:  # waits, and raises naming a kernel that faulted
            self._finish(handles)
        del handles[:]  # the last references: metalcompute waits for the command buffer here
        if not check:
            return
        read = None
        if marks:
            read = fetched.view(np.uint32) if fetched is not None \
                else self.host.words(self._zeroed, marks // 4)
        if not any(reported) and self._all_marked(runs, read):
            return
        for run, said, words in zip(runs, reported, self._words(runs, read)):
            self._check(reported=said, words=words, **run)

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
