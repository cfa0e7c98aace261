"""metalcompute's dispatch rule and call checks, shared by every harness target.

A call ``fn(count, *buffers)`` runs a 1-D grid of ``count`` threads padded to whole threadgroups
of ``threadgroup_size(...)`` threads; buffers bind to ``[[buffer(i)]]`` in call order.
"""

from __future__ import annotations

import collections
import operator

MAX_BUFFERS = 31
SIMD_WIDTH = 32
#: Apple's limit on threadgroup memory per threadgroup, enforced on every target
THREADGROUP_MEMORY = 32768
#: dispatches a device's trace keeps by default (the newest): enough for any op's profile, and a
#: training loop that runs through one device for hours holds bounded memory
TRACE_LIMIT = 4096


class Trace(collections.deque):
    """A device's dispatch trace: the newest ``limit`` dispatches, oldest first (``limit=None``
    keeps every one). A deque that also takes slices and compares equal to a list of the same
    dispatches."""

    def __init__(self, limit: int | None = TRACE_LIMIT):
        if limit is not None and not (isinstance(limit, int) and limit >= 1):
            raise ValueError(f"trace_limit: expected an int >= 1 or None (keep every dispatch), "
                             f"got {limit!r}")
        super().__init__((), limit)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return list(self)[index]
        return super().__getitem__(index)

    def __eq__(self, other):
        if isinstance(other, list):
            return list(self) == other
        return super().__eq__(other)

    __hash__ = None


def threadgroup_size(*limits: int) -> int:
    """metalcompute's rule: 32 × ⌊min(1024, limits...) / 32⌋ (the kernel's
    max_total_threads_per_threadgroup, the device's or the compiled kernel's limit)."""
    return SIMD_WIDTH * (min(1024, *limits) // SIMD_WIDTH)


def check_call(kernel: str, count, n_given: int, n_needed: int, tg: int, kernel_limit: int) -> int:
    """The call's thread count, after the checks metalcompute's callers rely on; a ValueError
    naming the kernel otherwise."""
    count = operator.index(count)
    if not 0 <= count < 2 ** 32:
        raise ValueError(f"kernel '{kernel}': count must be in [0, 2**32), got {count}")
    if n_given > MAX_BUFFERS:
        raise ValueError(f"kernel '{kernel}': at most {MAX_BUFFERS} buffers, got {n_given}")
    if n_given < n_needed:
        raise ValueError(f"kernel '{kernel}' reads [[buffer({n_needed - 1})]] but the call passed "
                         f"{n_given} buffer(s); buffers bind in call order")
    if tg == 0:
        raise ValueError(f"kernel '{kernel}': max_total_threads_per_threadgroup({kernel_limit}) is "
                         f"below the SIMD width {SIMD_WIDTH}")
    return count


def kernel_info(kernels: dict, name: str):
    """The KernelInfo of ``name`` in a compiled source's ``{name: info}``; a ValueError in
    metalcompute's words otherwise."""
    if name not in kernels:
        raise ValueError(f"Function not found: no kernel named {name!r} in the source; kernels: "
                         f"{sorted(kernels) or 'none'}")
    return kernels[name]


def check_threadgroup_memory(kernel: str, nbytes: int) -> None:
    if nbytes > THREADGROUP_MEMORY:
        raise ValueError(f"kernel '{kernel}' declares {nbytes} bytes of threadgroup memory; Apple "
                         f"GPUs allow {THREADGROUP_MEMORY} per threadgroup")


def open_count_error(kernel: str, n_open: int, n_given: int) -> str:
    return (f"kernel '{kernel}': its prepared call has {n_open} open buffer(s), got {n_given}")


class Prepared:
    """A call of ``function`` over ``count`` threads with its fixed buffers bound once
    (``Function.prepare``; None marks an open slot): ``prepared(*open)`` calls the function
    with the open slots filled in order, each a buffer or a ``(buffer, byte offset)`` pair,
    which ``at(buffer, offset)`` makes a buffer of. For targets whose calls cost the host
    little; the CUDA target prepares its launches itself."""

    __slots__ = ("function", "count", "tg", "open", "_buffers", "_at", "_error")

    def __init__(self, function, count, buffers, at, error=ValueError):
        self.function, self.count, self._at, self._error = function, count, at, error
        self.tg = function.threadgroup_size()
        self._buffers = list(buffers)
        self.open = tuple(i for i, b in enumerate(self._buffers) if b is None)

    def __call__(self, *bound):
        if len(bound) != len(self.open):
            raise self._error(open_count_error(self.function.name, len(self.open), len(bound)))
        buffers = list(self._buffers)
        for i, b in zip(self.open, bound):
            buffers[i] = self._at(*b) if type(b) is tuple else b
        return self.function(self.count, *buffers)


#: a threadgroup's completion mark, first word: this bit and the steps it ran (common.metal)
DONE = 0x80000000


def first_wrong_mark(words, table):
    """``(row, threadgroup, word)`` of the first mark word of ``words`` (uint32, an op's status
    marks) that differs from what ``table`` (uint32 [n, 5] per dispatch: word offset, marks,
    threadgroups, threadgroup size, steps) expects, or None: (DONE | steps, size) for each of a
    dispatch's threadgroups, zeros past them. What a device's ``check_marks`` computes."""
    import numpy as np

    for row, (offset, marks, groups, size, steps) in enumerate(table.tolist()):
        got = np.asarray(words[offset:offset + 2 * marks], np.uint32).reshape(marks, 2)
        want = np.zeros((marks, 2), np.uint32)
        want[:groups, 0] = DONE | steps
        want[:groups, 1] = size
        wrong = np.flatnonzero((got != want).any(axis=1))
        if wrong.size:
            g = int(wrong[0])
            word = int(got[g, 0] if got[g, 0] != want[g, 0] else got[g, 1])
            return row, g, word
    return None
