"""Helpers shared by the compiled kernels of the three cells.

Conventions of every kernel (one direction of one op, the whole time loop compiled):

- ``s`` is the processing step, 0 … T−1. The projected input ``xp`` and the gate gradients
  ``dX`` are indexed by input time ``ti = T−1−s`` when ``x_rev`` (reverse, or the backward
  direction), else ``s``. Outputs (h, c, z_state) and the gradient op's per-step inputs are
  indexed by output time ``to = T−1−s`` when ``out_rev`` (the backward direction of a
  bidirectional op), else ``s``. The mask is indexed by ``s`` (contract 2.2).
- Full-width arrays ([T,N,D·H], [T,N,D·Z·H], [T,N,D·G·H]) are passed whole with the column
  offset of this direction (``off``, ``zoff``, ``xoff``), so the kernels write the final
  layout directly and nothing is concatenated or flipped afterwards.
- Per step, the recurrent product is one BLAS GEMM (``np.dot`` into a preallocated buffer),
  then the gate math runs over work items ``w`` = (batch row, chunk of hidden units): in a
  ``prange`` when ``par`` is set, else in a plain loop. No parallel region is open while the
  GEMM runs, and nothing is allocated inside the time loop.
"""

import numba

from .activations import ONE

MASK_NONE, MASK_SHARED, MASK_PER_STEP = 0, 1, 2


@numba.njit(inline="always", cache=True)
def mask_at(m, mode, s, n, col, k):
    """The mask at processing step s, batch row n, column col (1 without a mask)."""
    if mode == MASK_NONE:
        return k[ONE]
    if mode == MASK_SHARED:
        return m[0, n, col]
    return m[s, n, col]


@numba.njit(inline="always", cache=True)
def step_index(s, T, rev):
    return T - 1 - s if rev else s


@numba.njit(inline="always", cache=True)
def chunk(w, nchunk, H):
    """(row n, first unit, end unit) of work item w."""
    n = w // nchunk
    size = (H + nchunk - 1) // nchunk
    j0 = (w % nchunk) * size
    j1 = min(H, j0 + size)
    return n, j0, j1
