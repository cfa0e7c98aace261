"""An op's plan: what the Metal host decides from a problem's shapes, made once per signature.

For one op (a cell's forward or gradients) everything but the arrays themselves follows from the
problem's *signature*: its sizes, its descriptor, which optional inputs are given (and whether
the mask and the cell gradient have a step axis), the work budget and the version rules'
settings (:func:`signature`). The host makes a :class:`Plan` for a signature on its first call
and keeps it (as MPSGraph compiles a graph once per shape): the kernel versions and their
thread counts, the parameter structs and absent inputs' constants as device buffers, the sizes
of the op's new buffers in the order they are made, each dispatch's buffers in its table's
order, and which buffer each output is read from. A later call only binds its arrays, makes the
new buffers, dispatches and reads.

A plan refers to a buffer by a *slot* ``(kind, index)``:

- ``(KEPT, i)``: a read-only device buffer the plan holds (a constant, a parameter struct);
- ``(INPUT, i)``: the call's array of a problem field, optionally transposed, bound read-only
  (in place where the device can) or, for the inputs a kernel writes, copied;
- ``(NEW, i)``: a buffer the call makes for the op's kernels to write (zeroed or not).

A call binds its inputs and makes its new buffers as its dispatches first need them
(:meth:`rnngrad.backends.metal.host.MetalHost.run`); the plan itself holds no array of any
call.
"""

from __future__ import annotations

from typing import NamedTuple

from . import library

KEPT, INPUT, NEW = 0, 1, 2


class Constant(NamedTuple):
    """``n`` float32 elements equal to ``value``, bound where an input a kernel only reads is
    absent (zeros for init states and biases, ones for the mask). The host makes it once per
    device and keeps it (``MetalHost.buffer``); never bind one where a kernel writes."""

    n: int
    value: float = 0.0


#: the problem fields an op may be given or not; a plan is made for one choice of them
OPTIONAL = ("input_weight", "bias", "init_state", "init_cell", "mask", "peephole",
            "secondary_bias", "state_gradient", "cell_gradient")


def signature(problem) -> tuple:
    """What a plan depends on in ``problem`` (besides the host's budget and the version
    settings): the op, the sizes, the descriptor, which optional inputs are given and the
    number of axes of the mask and the cell gradient (with or without a step axis)."""
    given = tuple(getattr(problem, name) is not None for name in OPTIONAL)
    mask, cg = problem.mask, problem.cell_gradient
    return (problem.cell, problem.gradients, problem.descriptor, problem.T, problem.N,
            problem.I, problem.H, problem.D, given, mask.ndim if mask is not None else 0,
            cg.ndim if cg is not None else 0)


class Plan:
    """The dispatches of one op for one signature (module docstring), filled in by the host's
    builders through :meth:`keep`, :meth:`input`, :meth:`empty`, :meth:`zeroed`,
    :meth:`launch` and :meth:`output`.

    - ``kept``: the read-only buffers it holds;
    - ``inputs``: ``(field, axes, written)`` per bound input: the problem field, the axes it is
      transposed by (None: as given), whether a kernel writes it (a copy every call);
    - ``buffers``: ``(nbytes, zeroed)`` per new buffer (a call makes each when a dispatch first
      binds it);
    - ``launches``: ``(kernel, count, steps, span, slots)`` per dispatch, in order, ``slots`` in
      the kernel's buffer-table order without the status buffer (the host binds it);
    - ``outputs``: ``(field, slot, shape)`` per result the op returns;
    - ``prepared``: the dispatches prepared on the host's device (see the attribute);
    - ``layouts``: where a call's memory lies (:mod:`~rnngrad.backends.metal.layout`).
    """

    def __init__(self, op: str):
        self.op = op
        self.kept = []
        self.inputs = []
        self.buffers = []
        self.launches = []
        self.outputs = []
        #: per dispatch, ``(prepared call, open slots)`` once the host has prepared them on a
        #: device whose functions prepare (MetalHost.prepared); False on one whose do not
        self.prepared = None
        #: where a call's memory lies (MetalHost.layout), by whether results are apart
        self.layouts = {}

    def keep(self, buffer) -> tuple:
        """The slot of a read-only device buffer the plan holds."""
        self.kept.append(buffer)
        return KEPT, len(self.kept) - 1

    def input(self, field: str, axes=None, written: bool = False) -> tuple:
        """The slot of the call's ``field`` (transposed by ``axes``): one slot per field and
        axes for inputs the kernels only read, a slot of its own for each written copy."""
        entry = (field, axes, bool(written))
        if not written and entry in self.inputs:
            return INPUT, self.inputs.index(entry)
        self.inputs.append(entry)
        return INPUT, len(self.inputs) - 1

    def empty(self, n: int) -> tuple:
        """The slot of a new float32 buffer of ``n`` elements (at least one), not initialised."""
        self.buffers.append((4 * max(int(n), 1), False))
        return NEW, len(self.buffers) - 1

    def zeroed(self, n: int) -> tuple:
        """The slot of a new float32 buffer of ``n`` zeros (at least one)."""
        self.buffers.append((4 * max(int(n), 1), True))
        return NEW, len(self.buffers) - 1

    def launch(self, kernel: str, count: int, *, steps: int, span=None, **slots):
        """Dispatch ``kernel`` over ``count`` threads with ``slots`` bound by the names of its
        buffer table (``library.BUFFERS``; the status buffer is bound by the host). ``steps``:
        what each threadgroup's completion mark must say; ``span``: the processing steps
        ``(s_begin, s_end)`` of a recurrence dispatch."""
        names = library.BUFFERS[kernel][:-1]  # the last is the status buffer
        if set(names) != set(slots):
            raise ValueError(f"{kernel}: expected buffers {names}, got {tuple(slots)}")
        self.launches.append((kernel, int(count), int(steps), span,
                              tuple(slots[name] for name in names)))

    def output(self, field: str, slot: tuple, shape: tuple):
        """Result ``field`` is read from the buffer of ``slot``, in ``shape``."""
        self.outputs.append((field, slot, tuple(int(s) for s in shape)))
