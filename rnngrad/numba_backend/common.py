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
- Batch rows are independent through the whole recurrence, so the batch is split into
  ``nblk`` blocks of rows and each block runs the entire time loop on its own thread
  (one parallel region per kernel call, no barrier per step). Per step, a block's recurrent
  product is one single-threaded BLAS GEMM on its rows (``np.dot`` into a preallocated
  buffer), followed by the gate math as vectorised loops along each row. Nothing is allocated
  inside the time loop.
"""

import numba

from .activations import JIT, ONE

MASK_NONE, MASK_SHARED, MASK_PER_STEP = 0, 1, 2


@numba.njit(inline="always", **JIT)
def mask_at(m, mode, s, n, col, k):
    """The mask at processing step s, batch row n, column col (1 without a mask)."""
    if mode == MASK_NONE:
        return k[ONE]
    if mode == MASK_SHARED:
        return m[0, n, col]
    return m[s, n, col]


@numba.njit(inline="always", **JIT)
def step_index(s, T, rev):
    return T - 1 - s if rev else s


@numba.njit(inline="always", **JIT)
def block_rows(b, nblk, N):
    """(first row, end row) of row block b."""
    return b * N // nblk, (b + 1) * N // nblk
