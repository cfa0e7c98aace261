"""The backend's large matrix products (projection, weight and source gradients) on numba's
own threads.

Why not NumPy's ``@``: NumPy's multithreaded OpenBLAS keeps its worker threads spinning for a
while after each call. A recurrence kernel started right after it then shares its cores with
those spinning threads, and its once-per-step meeting of the parts waits for a descheduled
thread: the parallel kernels ran 2–6× slower after a NumPy GEMM than after a single-threaded
one. Here every product is cut into as many pieces as numba has threads, each a
single-threaded GEMM (``blas.gemm``: MKL's sequential one, or SciPy's OpenBLAS) inside one
``prange``, so the whole backend runs on one thread pool. Callers limit SciPy's BLAS to one
thread around these calls (``machine.blas_threads("scipy", 1)``).
"""

import numba
import numpy as np

from .activations import JIT
from .blas import gemm

#: below this many floating-point operations a product runs on one thread
PARALLEL_MIN_FLOPS = 2_000_000
#: at most this many multiply-adds, NumPy's ``@`` (which OpenBLAS runs on one thread at this
#: size: no spinning workers afterwards) is cheaper than entering compiled code
SMALL_PRODUCT = 1 << 18


@numba.njit(parallel=True, **JIT)
def _rows_times(a, b, out, parts):
    M = a.shape[0]
    for p in numba.prange(parts):
        r0, r1 = p * M // parts, (p + 1) * M // parts
        if r1 > r0:
            gemm(a[r0:r1], b, out[r0:r1])


@numba.njit(parallel=True, **JIT)
def _transposed_times(x, b, partial, parts):
    K = x.shape[0]
    for p in numba.prange(parts):
        k0, k1 = p * K // parts, (p + 1) * K // parts
        if k1 > k0:
            gemm(x[k0:k1].T, b[k0:k1], partial[p])
        else:
            partial[p][:] = 0


def _parts(flops):
    threads = numba.get_num_threads()
    return threads if threads > 1 and flops >= PARALLEL_MIN_FLOPS else 1


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
    if M * K * out.shape[1] <= SMALL_PRODUCT:
        np.dot(a, b, out)  # NumPy's BLAS runs products this small on one thread
        return out
    _rows_times(np.ascontiguousarray(a), _contiguous(b), out,
                min(_parts(2.0 * M * K * out.shape[1]), M))
    return out


def transposed_times(x, b):
    """xᵀ @ b for x [K,M] and b [K,N] (any strides) → [M,N], split along K with one partial
    product per thread, summed at the end."""
    K, M = x.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return np.zeros((M, N), np.result_type(x, b))  # [M,N]
    if M * K * N <= SMALL_PRODUCT:
        return x.T @ b  # NumPy's BLAS runs products this small on one thread
    parts = _parts(2.0 * M * K * N)
    partial = np.empty((parts, M, N), np.result_type(x, b))  # [P,M,N]
    _transposed_times(np.ascontiguousarray(x), np.ascontiguousarray(b), partial, parts)
    return partial[0] if parts == 1 else partial.sum(axis=0)
