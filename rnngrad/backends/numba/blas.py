"""The GEMMs the compiled kernels call: Intel MKL where it is installed, else OpenBLAS.

Why MKL: a recurrence multiplies by the same recurrent weight at every step, and MKL can pack
a matrix into its GEMM kernel's panel layout once (``cblas_?gemm_pack``) and multiply by the
packed matrix at every step (``cblas_?gemm_compute``). OpenBLAS re-packs both operands on every
call; for a step's product of a [N,H] state by a [H,G·H] weight that re-packing is a third of
the call, so the packed product is the fastest of the three at the recurrences' shapes
(verification/PERFORMANCE.md, the numba BLAS entry, has the rates measured).

MKL is loaded through its single dynamic library (``libmkl_rt``) with the sequential threading
layer: every call runs on the calling thread (one of numba's), so no MKL thread pool competes
for the cores. When MKL is absent (its wheels exist for x86-64 only), when ``RNNGRAD_BLAS=openblas``
is set, or when something else in the process already started MKL with a threaded layer, the
same entry points run NumPy-compatible OpenBLAS products through numba's ``np.dot`` instead,
with "packing" a plain copy.

How the kernels reach them: the compiled code calls the C symbols ``rnngrad_sgemm``,
``rnngrad_dgemm`` (the CBLAS ``?gemm`` signature) and ``rnngrad_sgemm_compute``,
``rnngrad_dgemm_compute`` (the CBLAS ``?gemm_compute`` signature) by name, and this module binds
those names at import, to MKL's functions or to numba ``cfunc`` fallbacks. Binding by name keeps
the kernels cacheable (numba's cache stores no function addresses) and lets one compiled kernel
serve both libraries.

All operands are row-major (CBLAS ``CblasRowMajor``). Integers are 32-bit (MKL's LP64
interface).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

import llvmlite.binding as llvm
import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from .activations import JIT

ROW_MAJOR, NO_TRANS, TRANS, PACKED, B_MATRIX = 101, 111, 112, 151, 162
_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL

_i, _p = types.intc, types.intp  # pointers cross as integers (the same registers in every ABI)
_GEMM = {t: types.void(_i, _i, _i, _i, _i, _i, t, _p, _i, _p, _i, t, _p, _i)
         for t in (types.float32, types.float64)}
_COMPUTE = {t: types.void(_i, _i, _i, _i, _i, _i, _p, _i, _p, _i, t, _p, _i)
            for t in (types.float32, types.float64)}
_PREFIX = {types.float32: "s", types.float64: "d"}

_gemm_fn = {t: types.ExternalFunction(f"rnngrad_{_PREFIX[t]}gemm", _GEMM[t]) for t in _GEMM}
_compute_fn = {t: types.ExternalFunction(f"rnngrad_{_PREFIX[t]}gemm_compute", _COMPUTE[t])
               for t in _COMPUTE}


# -- MKL ----------------------------------------------------------------------------------------

def _mkl_candidates():
    names = ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so", "libmkl_rt.dylib",
             "libmkl_rt.2.dylib", "mkl_rt.3.dll", "mkl_rt.2.dll", "mkl_rt.dll")
    folders = [os.path.join(sys.prefix, "lib"), os.path.join(sys.prefix, "Library", "bin")]
    if sys.base_prefix != sys.prefix:
        folders.append(os.path.join(sys.base_prefix, "lib"))
    for folder in folders:
        for name in names:
            yield os.path.join(folder, name)
    found = ctypes.util.find_library("mkl_rt")
    if found:
        yield found
    yield from glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "*",
                                      "libmkl_rt.so*"))


class _Mkl:
    """libmkl_rt through ctypes, started with the sequential threading layer."""

    def __init__(self, path):
        self.path = path
        self.lib = lib = ctypes.CDLL(path)
        lib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
        lib.MKL_Set_Threading_Layer.restype = ctypes.c_int
        # returns the layer in effect: another one if MKL was already started by someone else
        self.layer = lib.MKL_Set_Threading_Layer(_SEQUENTIAL)
        self.version = self._version()
        for p, c in (("s", ctypes.c_float), ("d", ctypes.c_double)):
            size = getattr(lib, f"cblas_{p}gemm_pack_get_size")
            size.argtypes, size.restype = [ctypes.c_int] * 4, ctypes.c_size_t
            pack = getattr(lib, f"cblas_{p}gemm_pack")
            pack.argtypes = [ctypes.c_int] * 6 + [c, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
            pack.restype = None

    def _version(self):
        buf = ctypes.create_string_buffer(256)
        try:
            self.lib.mkl_get_version_string(buf, 256)
        except AttributeError:
            return "MKL"
        return buf.value.decode(errors="replace").strip()

    def address(self, name):
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value


def _load_mkl():
    """(_Mkl or None, why not)."""
    if os.environ.get("RNNGRAD_BLAS", "").lower() == "openblas":
        return None, "RNNGRAD_BLAS=openblas"
    tried = []
    for path in _mkl_candidates():
        if not os.path.exists(path) and os.sep in path:
            continue
        try:
            mkl = _Mkl(path)
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue
        if mkl.layer != _SEQUENTIAL:
            return None, (f"MKL was already started in this process with threading layer "
                          f"{mkl.layer}, not the sequential one rnngrad runs it with")
        return mkl, ""
    return None, "MKL is not installed (pip install mkl)" + (f"; tried {'; '.join(tried)}" if tried else "")


# -- the OpenBLAS fallbacks, with the same C signatures -------------------------------------------

#: without MKL, a step's product of at most this many multiply-adds (M·K·N) is a compiled loop
#: rather than an OpenBLAS call, whose checks, set-up and operand copies cost more than a
#: [1,64]·[64,256] product takes (MKL's GEMM is faster than the loop at every size, so this
#: applies without MKL only; verification/PERFORMANCE.md, "numba's thresholds")
SMALL_PRODUCT = 1 << 16


def _fallbacks(T):
    """cfuncs with the CBLAS ``gemm`` and ``gemm_compute`` signatures for float type T, computing
    with numba's ``np.dot`` (SciPy's OpenBLAS); a plain product of at most ``SMALL_PRODUCT``
    multiply-adds is a compiled loop (a BLAS call and its operand copies cost more than that).
    (``compute`` is never reached without MKL, as nothing is packed then; it multiplies by B
    itself, row-major [K,N] with ``ldb = N``.)"""
    ptr = types.CPointer(T)
    gemm_sig = types.void(_i, _i, _i, _i, _i, _i, T, ptr, _i, ptr, _i, T, ptr, _i)
    compute_sig = types.void(_i, _i, _i, _i, _i, _i, ptr, _i, ptr, _i, T, ptr, _i)

    @numba.njit(cache=True, error_model="numpy")
    def operand(p, trans, rows, cols, ld):
        if trans == NO_TRANS:
            full = numba.carray(p, (rows, ld))
            return np.ascontiguousarray(full[:, :cols])
        full = numba.carray(p, (cols, ld))
        return np.ascontiguousarray(full[:, :rows].T)

    @numba.njit(cache=True, error_model="numpy")
    def product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
        a = operand(A, ta, M, K, lda)
        b = operand(B, tb, K, N, ldb)
        c = numba.carray(C, (M, ldc))[:, :N]
        r = np.dot(a, b)
        if beta == 0:
            c[:] = alpha * r
        else:
            c[:] = alpha * r + beta * c

    @numba.njit(cache=True, error_model="numpy")
    def small_product(M, N, K, A, lda, B, ldb, C, ldc):
        a, b = numba.carray(A, (M, lda)), numba.carray(B, (K, ldb))
        c = numba.carray(C, (M, ldc))
        for i in range(M):
            o, ai = c[i, :N], a[i]
            for j in range(N):
                o[j] = 0
            for k in range(K):
                v, bk = ai[k], b[k]
                for j in range(N):
                    o[j] += v * bk[j]

    @numba.cfunc(gemm_sig, cache=True, error_model="numpy")
    def gemm(layout, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
        if M > 0 and N > 0:
            if ta == NO_TRANS and tb == NO_TRANS and alpha == 1 and beta == 0 and \
                    M * K * N <= SMALL_PRODUCT:
                small_product(M, N, K, A, lda, B, ldb, C, ldc)
            else:
                product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)

    @numba.cfunc(compute_sig, cache=True, error_model="numpy")
    def compute(layout, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc):
        if M > 0 and N > 0:
            product(ta, NO_TRANS, M, N, K, T(1), A, lda, B, N, beta, C, ldc)

    return gemm, compute


# -- binding ------------------------------------------------------------------------------------

MKL, WHY_NOT_MKL = _load_mkl()


def _bind():
    if MKL is not None:
        for p in "sd":
            llvm.add_symbol(f"rnngrad_{p}gemm", MKL.address(f"cblas_{p}gemm"))
            llvm.add_symbol(f"rnngrad_{p}gemm_compute", MKL.address(f"cblas_{p}gemm_compute"))
        return
    for T, p in ((types.float32, "s"), (types.float64, "d")):
        gemm, compute = _fallbacks(T)
        llvm.add_symbol(f"rnngrad_{p}gemm", gemm.address)
        llvm.add_symbol(f"rnngrad_{p}gemm_compute", compute.address)


_bind()


def library() -> str:
    """What the kernels' GEMMs run on, for ``rnngrad info``."""
    if MKL is not None:
        return f"{MKL.version} ({MKL.path}), sequential, packed recurrent weights"
    return f"SciPy's OpenBLAS through numba's np.dot (MKL not used: {WHY_NOT_MKL})"


# -- Python side: packing -------------------------------------------------------------------------

#: bytes of alignment of a packed buffer (one cache line, one AVX-512 register)
_ALIGN = 64


def _aligned(nbytes, dtype):
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    shift = (-raw.ctypes.data) % _ALIGN
    return raw[shift:shift + nbytes].view(dtype)


def _packed_size(K, N, rows, dtype):
    """Elements of dtype one packed [K,N] operand takes."""
    p = "s" if dtype == np.float32 else "d"
    size = getattr(MKL.lib, f"cblas_{p}gemm_pack_get_size")(B_MATRIX, rows, N, K)
    return -(-size // dtype.itemsize)


def _pack_into(b, rows, dest):
    """MKL packs b [K,N] (rows or columns contiguous, else copied) straight into dest."""
    p = "s" if b.dtype == np.float32 else "d"
    K, N = b.shape
    item = b.dtype.itemsize
    if b.strides[1] == item and b.strides[0] >= N * item:
        trans, ld, src = NO_TRANS, b.strides[0] // item, b
    elif b.strides[0] == item and b.strides[1] >= K * item:
        trans, ld, src = TRANS, b.strides[1] // item, b  # bᵀ is row-major: R.T, for one
    else:
        src = np.ascontiguousarray(b)
        trans, ld = NO_TRANS, N
    getattr(MKL.lib, f"cblas_{p}gemm_pack")(ROW_MAJOR, B_MATRIX, trans, rows, N, K, 1.0,
                                            src.ctypes.data, ld, dest.ctypes.data)


def worth_packing(K, N, rows, steps):
    """Whether packing B [K,N] pays for itself over ``steps`` products with ``rows`` rows:
    packing has a fixed cost of calls plus a cost per element of B, and the packed product saves
    a little on every multiply-add, so pack when the saving over all steps, at its measured low
    end, exceeds both costs (the constants: verification/PERFORMANCE.md, "numba's
    thresholds")."""
    return steps * rows * K * N > 5_000_000 + 250 * K * N


def packs(K, N, rows, steps) -> bool:
    """Whether :func:`pack_parts` packs a [K,N] operand for ``steps`` products with ``rows``
    rows (MKL in use and :func:`worth_packing`)."""
    return MKL is not None and worth_packing(K, N, rows, steps)


def pack_parts(b: np.ndarray, rows, steps: int) -> np.ndarray:
    """[P, S]: each part b[p] of b [P,K,N] (float32 or float64, any strides) in the layout the
    per-step product (``common.dot``) multiplies by, for ``steps`` products with ``rows`` rows
    (one count for every part, or a sequence of one per part).

    - MKL's packed panels when MKL is in use and :func:`worth_packing`: each part starts on a
      64-byte boundary and S ≠ K·N. MKL packs straight into place: a packed buffer must not be
      moved.
    - Otherwise B itself, row-major, S = K·N (which tells ``common.dot`` to run a plain GEMM).
    """
    P, K, N = b.shape
    counts = [int(rows)] * P if isinstance(rows, (int, np.integer)) else [int(r) for r in rows]
    if not packs(K, N, min(counts), steps):
        return _row_major(b).reshape(P, K * N)  # [P,S]
    size = max(_packed_size(K, N, r, b.dtype) for r in counts)
    per = _ALIGN // b.dtype.itemsize
    stride = -(-size // per) * per
    if stride == K * N:
        stride += per  # S = K·N would read as B itself
    out = _aligned(P * stride * b.dtype.itemsize, b.dtype).reshape(P, stride)  # [P,S]
    for p in range(P):
        _pack_into(b[p], counts[p], out[p])
    return out


def _row_major(b: np.ndarray) -> np.ndarray:
    """b [P,K,N] as a new C-contiguous writable array (b itself when it is one). Parts whose
    transpose is C-contiguous (b[p] = Rᵀ, say) are transposed in tiles (:func:`transpose`)."""
    if b.flags.c_contiguous and b.flags.writeable:
        return b
    P, K, N = b.shape
    if P == 0 or K == 0 or N == 0 or not b[0].T.flags.c_contiguous:
        return np.array(b, order="C")
    out = np.empty((P, K, N), b.dtype)  # [P,K,N]
    for p in range(P):
        transpose(b[p].T, out[p])
    return out


@numba.njit(**JIT)
def transpose(a, out):
    """out = aᵀ for C-contiguous a [M,K] and out [K,M], in 8×8 tiles: faster than NumPy's
    strided copy of the transpose (verification/PERFORMANCE.md, "numba's thresholds")."""
    M, K = a.shape
    Mt, Kt = M - M % 8, K - K % 8
    for i0 in range(0, Mt, 8):
        for j0 in range(0, Kt, 8):
            for j in range(j0, j0 + 8):
                for i in range(i0, i0 + 8):
                    out[j, i] = a[i, j]
    for i in range(Mt, M):
        for j in range(K):
            out[j, i] = a[i, j]
    for i in range(Mt):
        for j in range(Kt, K):
            out[j, i] = a[i, j]


# -- compiled side -----------------------------------------------------------------------------


def gemm(a, b, out):
    """out = a @ b inside compiled code, for 2-D a [M,K], b [K,N], out [M,N], each with unit
    stride along one axis (rows or columns)."""
    raise NotImplementedError("gemm is only callable from numba-compiled code")


def gemm_add(a, b, out):
    """out += a @ b inside compiled code (operands as for :func:`gemm`)."""
    raise NotImplementedError("gemm_add is only callable from numba-compiled code")


def packed_product(a, packed, out):
    """out = a @ B inside compiled code, for C-contiguous a [M,K], out [M,N] and B packed by
    MKL (:func:`pack_parts`) for M rows."""
    raise NotImplementedError("packed_product is only callable from numba-compiled code")


@numba.njit(inline="always")
def _layout(x, item):
    """(transpose code, leading dimension) of a 2-D operand."""
    if x.strides[1] == item or x.shape[1] <= 1:
        return NO_TRANS, max(x.strides[0] // item, x.shape[1], 1)
    return TRANS, max(x.strides[1] // item, x.shape[0], 1)


def _gemm_overload(beta):
    """The overload of out = a @ b + beta · out (beta 0 or 1)."""
    def typer(a, b, out):
        T = out.dtype
        if T not in _gemm_fn:
            return None
        fn, one, b_ = _gemm_fn[T], T.cast_python_value(1.0), T.cast_python_value(beta)
        clear = beta == 0

        def impl(a, b, out):
            M, K = a.shape
            N = b.shape[1]
            if M == 0 or N == 0:
                return
            if K == 0:
                if clear:
                    out[:] = 0
                return
            item = out.itemsize
            ta, lda = _layout(a, item)
            tb, ldb = _layout(b, item)
            fn(ROW_MAJOR, ta, tb, M, N, K, one, a.ctypes.data, lda, b.ctypes.data, ldb, b_,
               out.ctypes.data, out.strides[0] // item)
        return impl
    return typer


overload(gemm, inline="always")(_gemm_overload(0.0))
overload(gemm_add, inline="always")(_gemm_overload(1.0))


@overload(packed_product, inline="always")
def _packed_impl(a, packed, out):
    T = out.dtype
    if T not in _compute_fn:
        return None
    fn, zero = _compute_fn[T], T.cast_python_value(0.0)

    def impl(a, packed, out):
        M, K = a.shape
        N = out.shape[1]
        fn(ROW_MAJOR, NO_TRANS, PACKED, M, N, K, a.ctypes.data, K, packed.ctypes.data, N, zero,
           out.ctypes.data, N)
    return impl
