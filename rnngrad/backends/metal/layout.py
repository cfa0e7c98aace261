"""Where one call of an op puts its memory: worked out once per plan, so that a call makes two
allocations and binds by offsets.

An op's call needs a status buffer per dispatch (the completion marks, zeroed) and the plan's
new buffers (:meth:`Plan.empty <rnngrad.backends.metal.plan.Plan.empty>`, ``Plan.zeroed``).
Where the device zeroes memory itself and waits on several runs at once (``device.zeros``,
``device.finish``: the CUDA target, metal-mps), a :class:`Layout` places them, in the order the
dispatches first bind them, in two regions a call allocates whole:

- the **zeroed region**: every dispatch's marks from byte 0 up (so one read, or one check on
  the device, covers all of them), then the small zeroed buffers;
- the **slab**: the small buffers that need no initial value (uninitialised, or poisoned by the
  device: the CUDA target fills new memory with NaN).

A buffer over :data:`OWN_BYTES` is allocated on its own, so that a result an op returns keeps
alive beside itself at most its regions, which hold only buffers of that size or less; so is
each result on a device whose results must not share memory (``results_apart``: tensors a
PyTorch operator returns, the allocations of a caller's allocator). Every offset is a multiple
of :data:`ALIGN` bytes.

On any other device (metalcompute, the plain harness) every buffer is allocated on its own, a
status buffer per dispatch copied from host zeros.
"""

from __future__ import annotations

import numpy as np

from .plan import NEW

#: where a new buffer or a status buffer lies: (ZEROED, byte offset), (SLAB, byte offset), or
#: (OWN, bytes, zeroed): an allocation of its own
ZEROED, SLAB, OWN = 0, 1, 2
#: alignment of each buffer in a region, in bytes (as cudaMalloc aligns)
ALIGN = 256
#: a buffer over this many bytes is allocated on its own rather than placed in a region
OWN_BYTES = 1 << 16


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to whole :data:`ALIGN` blocks: a buffer's extent in a region."""
    return -(-nbytes // ALIGN) * ALIGN


class Layout:
    """One call's memory for ``plan`` (see the module docstring).

    Args:
        plan: the op's :class:`~rnngrad.backends.metal.plan.Plan`.
        sizes: per dispatch, the threadgroup size its marks are counted in.
        regions: whether the device's calls take slices of regions (else every buffer is its
            own allocation).
        own: indices of new buffers to allocate on their own whatever their size.

    Attributes: ``new`` (per new buffer, where it lies), ``status`` (per dispatch), ``zeroed``
    and ``slab`` (the regions' bytes; 0: none), ``marks`` (bytes of the zeroed region that hold
    marks), ``runs`` (per dispatch, what the completion check needs to know of it: kernel,
    count, status, marks, steps, span, number, size) and ``table`` (uint32 [dispatches, 5] for
    ``device.check_marks``: word offset, marks, threadgroups, threadgroup size, steps; None
    without regions).
    """

    def __init__(self, plan, sizes, regions: bool, own=frozenset()):
        self.new = [None] * len(plan.buffers)
        self.status, self.runs = [], []
        self.zeroed = self.slab = self.marks = 0

        def place(slot):
            kind, i = slot
            if kind == NEW and self.new[i] is None:
                self.new[i] = self._place(*plan.buffers[i], regions and i not in own)

        for number, ((kernel, count, steps, span, slots), size) in enumerate(
                zip(plan.launches, sizes)):
            for slot in slots:
                place(slot)
            marks = -(-count // size)
            if regions:  # the marks from byte 0 up, in dispatch order
                where, self.marks = (ZEROED, self.marks), self.marks + aligned(8 * marks)
            else:
                where = (OWN, 8 * marks, True)
            self.status.append(where)
            self.runs.append(dict(kernel=kernel, count=count, status=where, marks=marks,
                                  steps=steps, span=span, number=number, size=size))
        for _, slot, _ in plan.outputs:
            place(slot)
        # the zeroed buffers went after the marks: move them up by the marks' final extent
        self.new = [(ZEROED, self.marks + where[1]) if where[0] == ZEROED else where
                    for where in self.new]
        self.zeroed += self.marks
        self.table = np.array([(where[1] // 4, run["marks"], run["marks"], run["size"],
                                run["steps"]) for where, run in zip(self.status, self.runs)],
                              np.uint32).reshape(-1, 5) if regions else None
        self.nbytes = [nbytes for nbytes, _ in plan.buffers]
        #: what a late failure's message names of each dispatch (MetalHost.remember)
        self.described = [{k: run[k] for k in ("kernel", "count", "span", "number")}
                          for run in self.runs]
        #: the marks' expected words, by the threadgroup sizes they report (completion.Runs)
        self.expected = {}

    def _place(self, nbytes, zeroed, in_region):
        if not in_region or nbytes > OWN_BYTES:
            return OWN, nbytes, zeroed
        if zeroed:  # offset among the zeroed buffers; the marks' extent is added at the end
            where, self.zeroed = (ZEROED, self.zeroed), self.zeroed + aligned(nbytes)
        else:
            where, self.slab = (SLAB, self.slab), self.slab + aligned(nbytes)
        return where
