"""The error the Metal backends raise instead of returning a result a dispatch did not finish.

metalcompute 0.2.9 never checks a command buffer's status: a kernel that faults, or that the
GPU watchdog stops, leaves its outputs partly written and the call returns as if nothing
happened. rnngrad's kernels therefore leave a completion mark per threadgroup (common.metal),
and the host raises :class:`IncompleteDispatch` when one is missing; no partial result is
returned.
"""

from __future__ import annotations


class IncompleteDispatch(RuntimeError):
    """A Metal dispatch did not run to its end, so the op returns nothing.

    Attributes:
        kernel: the kernel's name, e.g. ``"lstm_backward"``.
        op: the op, e.g. ``"lstm_gradients"``.
        sizes: the problem size, ``{"T", "N", "I", "H", "D"}`` (``I`` is None without
            input_weight).
        dispatch: the dispatch's number within the op, from 0.
        steps: ``(s_begin, s_end)``, the processing steps the dispatch ran, or None for a
            kernel that runs no steps (strided_gemm).
        missing: the threadgroups that left no completion mark, as a tuple of indices (empty
            when only the device's report or a wrong mark failed the check). When no
            threadgroup left one, the grid's size is unknown to the host and this is every
            slot of the status buffer, ``range(ceil(count / 32))``.
        reported: what the device reported about the run (``handle.error``), or None.
        late: True where the op had returned before its marks were checked (the GPU's check,
            read at a later rnngrad call on the device, at ``rnngrad.synchronize()`` or at
            exit); ``missing`` then names the first threadgroup found wrong.
    """

    def __init__(self, message: str, *, kernel: str, op: str, sizes: dict, dispatch: int,
                 steps: tuple[int, int] | None, missing: tuple[int, ...], reported: str | None,
                 late: bool = False):
        super().__init__(message)
        self.late = late
        self.kernel = kernel
        self.op = op
        self.sizes = dict(sizes)
        self.dispatch = dispatch
        self.steps = steps
        self.missing = tuple(missing)
        self.reported = reported


def ranges(indices) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    out, run = [], []
    for i in map(int, indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return ", ".join(out)
