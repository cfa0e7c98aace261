"""Helpers shared by the compiled kernels of the three cells.

Conventions of every kernel (one direction of one op, the whole time loop compiled):

- ``s`` is the processing step, 0 … T−1. The projected input ``xp`` and the gate gradients
  ``dX`` are indexed by input time ``ti = T−1−s`` when ``x_rev`` (reverse, or the backward
  direction), else ``s``. Outputs (h, c, z_state) and the gradient op's per-step inputs are
  indexed by output time ``to = T−1−s`` when ``out_rev`` (the backward direction of a
  bidirectional op), else ``s``. The mask is indexed by ``s`` (SEMANTICS.md §2.2).
- A call runs the steps ``s0 … s1−1`` of the loop (the forward upward, the gradients
  downward); the state carried from step to step lives in the driver's scratch arrays, so the
  loop may run in pieces, one call each (``overlap.py``), or whole (``s0, s1 = 0, T``).
- Full-width arrays ([T,N,D·H], [T,N,D·Z·H], [T,N,D·G·H]) are passed whole with the column
  offset of this direction (``off``, ``zoff``, ``xoff``), so the kernels write the final
  layout directly and nothing is concatenated or flipped afterwards.
- Parallel split by hidden units: the H units are cut into ``P`` parts (``part_units``), and
  part p owns units j0 … j1−1 of every gate, for all batch rows. Per step, part p computes its
  columns of the recurrent product as one single-threaded BLAS GEMM over the whole batch
  (``[N,H]·[H,G·hc]``, the weight columns of its units gathered into one contiguous matrix by
  the driver, ``hc = ⌈H/P⌉``, padded with zero columns) and then the gate math of its units.
  Each part keeps its slice of the weights hot in its core's cache, and the GEMMs have the
  whole batch as rows, which BLAS runs much faster than a few rows. The parts meet once per
  step (the end of a ``prange`` over parts): the next step's product needs every unit of
  h (forward) or of dA (gradients), which are double-buffered (index ``s % 2``) so that a part
  never overwrites what another is still reading. ``P == 1`` runs the same code without a
  parallel region.
- Parallel split by batch rows (forward and gradient kernels, ``Q`` row parts): part q owns
  the batch rows n0 … n1−1 (``part_units(q, Q, N)``) and all the units, and runs them through
  every step with all of R (prepared for its own number of rows): rows never depend on each
  other, in the forward or in the gradients, so the parts never meet inside the loop. The
  part functions take both: the units part (p, P), the rows n0 … n1−1, and k, the part's slot
  in the packed weights and the scratch arrays.
- Elementwise loops run on row views (``row[a:b]``) indexed from 0, each reading a few arrays
  and writing one or two: that is what LLVM vectorises (an offset index like ``x[off + j]``,
  or many arrays in one loop, sends it to its scalar path). Nothing is allocated inside the
  time loop.
"""

import numba
import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from .activations import JIT
from .blas import gemm, gemm_add, packed_product, step_product, transpose

MASK_NONE, MASK_SHARED, MASK_PER_STEP = 0, 1, 2

#: part index and count of a kernel run on one thread: typed int64 like the parts of a
#: ``prange`` (which the kernels convert with ``np.int64(p)``), so that each part function is
#: compiled once, not once per integer type.
ZERO_I, ONE_I = np.int64(0), np.int64(1)


@intrinsic
def unowned(typingctx, a):
    """The array a as a borrowed view: the same data, shape and strides, with no reference
    count (a null meminfo). Every view numba takes of an owned array increments and later
    decrements its count with a locked (atomic) instruction; on the kernels' small row views
    that was a third of a [1,64]-row LSTM step, and two threads taking views of the same
    arrays contend for the count's cache line. The caller keeps the array alive for the call."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, args):
        view = context.make_array(signature.args[0])(context, builder, value=args[0])
        view.meminfo = cgutils.get_null_value(view.meminfo.type)
        view.parent = cgutils.get_null_value(view.parent.type)
        return view._getvalue()
    return a(a), codegen


@numba.njit(inline="always", **JIT)
def mask_row(m, mode, s, n, lo, w, ones):
    """The mask at processing step s, batch row n, columns lo … lo+w−1, as a view (ones[:w]
    without a mask)."""
    if mode == MASK_NONE:
        return ones[:w]
    if mode == MASK_SHARED:
        return m[0, n, lo:lo + w]
    return m[s, n, lo:lo + w]


@numba.njit(inline="always", **JIT)
def step_index(s, T, rev):
    return T - 1 - s if rev else s


@numba.njit(inline="always", **JIT)
def part_units(p, P, H):
    """(j0, j1): the hidden units of part p."""
    return p * H // P, (p + 1) * H // P


@numba.njit(inline="always", **JIT)
def multiply(a, b, out):
    """out = a ⊙ b along row views."""
    for j in range(out.shape[0]):
        out[j] = a[j] * b[j]


@numba.njit(inline="always", **JIT)
def add_pre_activation(a, x, b, z):
    """a = a + x + b (the recurrent product plus the projected input and its bias), also
    stored into the z_state row z, along row views."""
    for j in range(a.shape[0]):
        v = a[j] + x[j] + b[j]
        a[j] = v
        z[j] = v


@numba.njit(inline="always", **JIT)
def copy(src, dst):
    for j in range(dst.shape[0]):
        dst[j] = src[j]


@numba.njit(inline="always", **JIT)
def dot(a, packed, out):
    """out = a @ B for C-contiguous a [M,K] and out [M,N], with B prepared by
    :func:`blas.pack_parts` for M rows: B itself, row-major, when its length is K·N (a plain
    GEMM on the library chosen for the steps), else MKL's packed panels."""
    K, N = a.shape[1], out.shape[1]
    if packed.shape[0] == K * N:
        step_product(a, packed.reshape((K, N)), out)
    else:
        packed_product(a, packed, out)


# -- the one-call ops ----------------------------------------------------------------------------
# (each cell's ``forward_op`` and ``gradient_op``: a whole op in one compiled call on the calling
# thread, for problems whose recurrence runs on one thread with R unpacked and nothing beside it;
# ``driver.in_one_call``)

@numba.njit(inline="always", **JIT)
def direction(d, D, reverse):
    """(x_rev, out_rev) of direction d, as ``driver._directions``."""
    return d == 1 or (D == 1 and reverse), d == 1


@numba.njit(**JIT)
def project(source, W, has_w, DGH):
    """x' [T,N,DGH] without bias: source [T,N,I] Wᵀ (W [DGH,I]), one GEMM over all steps, with
    an input weight; else the source itself ([T,N,DGH])."""
    if not has_w:
        return source
    T, N, I = source.shape
    xp = np.empty((T, N, DGH), source.dtype)  # [T,N,DGH]
    gemm(source.reshape((T * N, I)), W.T, xp.reshape((T * N, DGH)))
    return xp


@numba.njit(**JIT)
def transposed(B):
    """[1,M·K]: Bᵀ (B [K,M], C-contiguous) row-major, a forward's per-step operand for one part,
    unpacked (``blas.pack_parts``' plain form)."""
    K, M = B.shape
    Bt = np.empty((1, M * K), B.dtype)  # [1,M·K]
    transpose(B, Bt[0].reshape((M, K)))
    return Bt


@numba.njit(inline="always", **JIT)
def as_part(B):
    """[1,K·M]: B [K,M] (C-contiguous) itself, a gradient recurrence's per-step operand for
    one part, unpacked."""
    return B.reshape((1, B.shape[0] * B.shape[1]))


@numba.njit(**JIT)
def add_weight_gradient(dX, c0, c1, B, out):
    """out += dX[:, :, c0:c1]ᵀ B for dX [T,N,C] and B [T,N,K] (rows in input time), out
    [c1−c0,K]: a weight gradient after a direction's recurrence."""
    T, N = dX.shape[0], dX.shape[1]
    gemm_add(dX.reshape((T * N, dX.shape[2]))[:, c0:c1].T, B.reshape((T * N, B.shape[2])), out)


@numba.njit(**JIT)
def add_input_weight_gradient(dX, c0, c1, source, has_w, dW):
    """dW[c0:c1] += dX[:, :, c0:c1]ᵀ source, with an input weight (has_w)."""
    if has_w:
        add_weight_gradient(dX, c0, c1, source, dW[c0:c1])


@numba.njit(**JIT)
def through_first_product(E0, R, m, m_mode, off, out):
    """out = (E0 R) ⊙ m[0] for E0 [N,K] (the first processing step's dA), R [K,H] and out [N,H]
    (a view of d h0's columns off …): the gradient reaching h0 through the recurrent
    product, in both paths."""
    N, H = out.shape
    g = np.empty((N, H), out.dtype)  # [N,H]
    gemm(E0, R, g)
    for n in range(N):
        if m_mode == MASK_NONE:
            for j in range(H):
                out[n, j] = g[n, j]
        else:
            mr = m[0, n, off:off + H]
            for j in range(H):
                out[n, j] = g[n, j] * mr[j]
