"""The backend's large matrix products (projection, weight and source gradients) on numba's
own threads.

Why not NumPy's ``@``: NumPy's multithreaded OpenBLAS keeps its worker threads spinning for a
while after each call. A recurrence kernel started right after it then shares its cores with
those spinning threads, and its once-per-step meeting of the parts waits for a descheduled
thread: the parallel kernels ran 2–6× slower after a NumPy GEMM than after a single-threaded
one. Here every product is cut into as many pieces as numba has threads, each a
single-threaded GEMM (``blas.gemm``: MKL's sequential one, or SciPy's OpenBLAS) inside one
``prange``, so the whole backend runs on one thread pool; small products are one such GEMM on
the calling thread. Without MKL, callers limit SciPy's BLAS to one thread around these calls
(``machine.blas_threads("scipy", 1)``).
"""

import numba
import numpy as np

from .activations import JIT
from .blas import gemm, gemm_add

#: below this many floating-point operations a product runs on one thread, outside any
#: parallel region (entering one, and waking idle threads, costs more than such a product)
PARALLEL_MIN_FLOPS = 2_000_000


@numba.njit(**JIT)
def product(a, b, out):
    """out = a @ b on the calling thread (operands as for ``blas.gemm``)."""
    gemm(a, b, out)


@numba.njit(**JIT)
def accumulate(x, b, out):
    """out += xᵀ @ b on the calling thread, for x [K,M], b [K,N], out [M,N] (operands as for
    ``blas.gemm``)."""
    gemm_add(x.T, b, out)


@numba.njit(parallel=True, **JIT)
def _rows_times(a, b, out, parts):
    M = a.shape[0]
    for p in numba.prange(parts):
        r0, r1 = p * M // parts, (p + 1) * M // parts
        if r1 > r0:
            gemm(a[r0:r1], b, out[r0:r1])


@numba.njit(parallel=True, **JIT)
def _add_transposed_times(x, b, out, parts):
    M = x.shape[1]
    for p in numba.prange(parts):
        m0, m1 = p * M // parts, (p + 1) * M // parts
        if m1 > m0:
            gemm_add(x[:, m0:m1].T, b, out[m0:m1])


def _parts(flops, limit):
    """Pieces for a product of ``flops`` along an axis of ``limit`` entries (1: serial)."""
    if flops < PARALLEL_MIN_FLOPS:
        return 1
    return max(1, min(numba.get_num_threads(), limit))


def _contiguous(a):
    if a.flags.c_contiguous or a.flags.f_contiguous:
        return a
    return np.ascontiguousarray(a)


def rows_times(a, b):
    """a @ b for a [M,K] and b [K,N] (any strides) → [M,N], split by rows of a."""
    M, K = a.shape
    out = np.empty((M, b.shape[1]), np.result_type(a, b))  # [M,N]
    if M == 0 or out.shape[1] == 0:
        return out
    if K == 0:
        out[:] = 0
        return out
    a, b = np.ascontiguousarray(a), _contiguous(b)
    parts = _parts(2.0 * M * K * out.shape[1], M)
    if parts == 1:
        product(a, b, out)
    else:
        _rows_times(a, b, out, parts)
    return out


def add_transposed_times(x, b, out):
    """out += xᵀ @ b for x [K,M], b [K,N] (any strides) and out [M,N] with unit stride along
    its rows, split by rows of out (by columns of x), which measured faster than splitting K
    and summing partial products (verification/PERFORMANCE.md, "numba's thresholds")."""
    K, M = x.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return
    x, b = np.ascontiguousarray(x), np.ascontiguousarray(b)
    parts = _parts(2.0 * M * K * N, M)
    if parts == 1:
        accumulate(x, b, out)
    else:
        _add_transposed_times(x, b, out, parts)
