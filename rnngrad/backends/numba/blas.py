"""The GEMMs the compiled kernels call, on the library measured fastest on this CPU.

The libraries (``libraries.py``: Intel MKL, SciPy's OpenBLAS, oneDNN) and the rule that picks one
for each kind of product (``rule.py``: the per-step recurrent products and the large ones, per
dtype, by their rates at the recurrences' shapes, kept in the kernel cache per CPU) are apart;
this module binds the choice to the names the compiled code calls, packs recurrent weights for
MKL, and gives the compiled code its entry points.

Why packing: a recurrence multiplies by the same recurrent weight at every step, and MKL can
pack a matrix into its GEMM kernel's panel layout once (``cblas_?gemm_pack``) and multiply by
the packed matrix at every step (``cblas_?gemm_compute``); the other libraries re-pack both
operands on every call. The rule weighs MKL's packed product as a candidate of its own
("mkl-packed").

How the kernels reach them: the compiled code calls the C symbols ``rnngrad_?gemm`` (the large
products), ``rnngrad_?gemm_step`` (a step's product), ``rnngrad_?gemm_small`` (a step's product
of at most ``SMALL_PRODUCT`` multiply-adds) — all with the CBLAS ``?gemm`` signature — and
``rnngrad_?gemm_compute`` (the CBLAS ``?gemm_compute`` signature) by name, and this module binds
those names at import. Binding by name keeps the kernels cacheable (numba's cache stores no
function addresses) and lets one compiled kernel serve every library.

All operands are row-major (CBLAS ``CblasRowMajor``). Integers are 32-bit (MKL's LP64
interface).
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from numba.core import types
from numba.extending import overload

from . import libraries, rule
from .activations import JIT
from .libraries import B_MATRIX, NO_TRANS, PACKED_B, ROW_MAJOR, TRANS

_i, _p = types.intc, types.intp  # pointers cross as integers (the same registers in every ABI)
_GEMM = {t: types.void(_i, _i, _i, _i, _i, _i, t, _p, _i, _p, _i, t, _p, _i)
         for t in (types.float32, types.float64)}
_COMPUTE = {t: types.void(_i, _i, _i, _i, _i, _i, _p, _i, _p, _i, t, _p, _i)
            for t in (types.float32, types.float64)}
_PREFIX = {types.float32: "s", types.float64: "d"}

_gemm_fn = {t: types.ExternalFunction(f"rnngrad_{_PREFIX[t]}gemm", _GEMM[t]) for t in _GEMM}
_step_fn = {t: types.ExternalFunction(f"rnngrad_{_PREFIX[t]}gemm_step", _GEMM[t]) for t in _GEMM}
_small_fn = {t: types.ExternalFunction(f"rnngrad_{_PREFIX[t]}gemm_small", _GEMM[t]) for t in _GEMM}
_compute_fn = {t: types.ExternalFunction(f"rnngrad_{_PREFIX[t]}gemm_compute", _COMPUTE[t])
               for t in _COMPUTE}

#: a step's product of at most this many multiply-adds (M·K·N) runs on MKL's plain GEMM where
#: MKL is installed (and ``RNNGRAD_BLAS`` names no other library), else on a compiled loop: at
#: that size a call's fixed costs decide, which the rule's shapes do not measure
#: (verification/PERFORMANCE.md, "numba's thresholds")
SMALL_PRODUCT = 1 << 16


# -- binding ------------------------------------------------------------------------------------

LIBRARIES, WHY_NOT = libraries.load_all()
MKL = LIBRARIES["mkl"].mkl if "mkl" in LIBRARIES else None


CHOICE = None  # the rule's rnngrad.backends.numba.rule.Choice, made by bind()
_OPENBLAS = {}  # dtype -> uses_openblas(dtype) under CHOICE
_FOLDER = None  # where it keeps its rates


def bind(folder):
    """Choose the libraries (``rule.choose``, the rates kept in ``folder``, the kernel cache)
    and bind the names the compiled code calls to them. The package calls it once at import,
    before any kernel is compiled or loaded (that is when the names are resolved)."""
    global CHOICE, _FOLDER
    CHOICE, _FOLDER = rule.choose(LIBRARIES, folder), folder
    _OPENBLAS.clear()
    for p in "sd":
        llvm.add_symbol(f"rnngrad_{p}gemm", LIBRARIES[CHOICE.library("large", p)].gemm[p])
        llvm.add_symbol(f"rnngrad_{p}gemm_step", LIBRARIES[CHOICE.library("step", p)].gemm[p])
        small = MKL.address(f"cblas_{p}gemm") if MKL is not None \
            and CHOICE.forced in ("", "mkl") else libraries.small_loop(p)
        llvm.add_symbol(f"rnngrad_{p}gemm_small", small)
        # without MKL nothing is packed, and the packed product is never called
        compute = MKL.address(f"cblas_{p}gemm_compute") if MKL is not None else small
        llvm.add_symbol(f"rnngrad_{p}gemm_compute", compute)


def remeasure() -> rule.Choice:
    """The candidates measured again, the new choice kept (``rnngrad info --measure-gemm``):
    it takes effect in the processes started after this one, which has bound its symbols."""
    return rule.choose(LIBRARIES, _FOLDER, remeasure=True)


def uses_openblas(dtype) -> bool:
    """Whether SciPy's OpenBLAS runs any product of ``dtype`` (the driver limits it to one
    thread around such ops), answered once per dtype: the choice is bound for the process."""
    known = _OPENBLAS.get(dtype)
    if known is None:
        p = "s" if np.dtype(dtype) == np.float32 else "d"
        known = _OPENBLAS[dtype] = any(CHOICE.library(kind, p) == "openblas"
                                       for kind in ("step", "large"))
    return known


def library(choice=None) -> str:
    """What the kernels' GEMMs run on (``choice``, by default this process's), for ``rnngrad
    info``: one line per kind and dtype, then how the choice was made, then the libraries found
    and not found."""
    lines = (choice or CHOICE).describe()
    lines += [f"{name}: {lib.detail}" for name, lib in LIBRARIES.items()]
    lines += [f"{name}: {why}" for name, why in WHY_NOT.items()]
    return "\n".join(lines)


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


def packs(K, N, rows, steps, dtype=np.float32) -> bool:
    """Whether :func:`pack_parts` packs a [K,N] operand of ``dtype`` for ``steps`` products
    with ``rows`` rows (MKL's packed product chosen for the steps, and :func:`worth_packing`)."""
    p = "s" if np.dtype(dtype) == np.float32 else "d"
    return CHOICE.step[p] == rule.PACKED and worth_packing(K, N, rows, steps)


def pack_parts(b: np.ndarray, rows, steps: int) -> np.ndarray:
    """[P, S]: each part b[p] of b [P,K,N] (float32 or float64, any strides) in the layout the
    per-step product (``common.dot``) multiplies by, for ``steps`` products with ``rows`` rows
    (one count for every part, or a sequence of one per part).

    - MKL's packed panels when :func:`packs`: each part starts on a
      64-byte boundary and S ≠ K·N. MKL packs straight into place: a packed buffer must not be
      moved.
    - Otherwise B itself, row-major, S = K·N (which tells ``common.dot`` to run a plain GEMM).
    """
    P, K, N = b.shape
    counts = [int(rows)] * P if isinstance(rows, (int, np.integer)) else [int(r) for r in rows]
    if not packs(K, N, min(counts), steps, b.dtype):
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


def step_product(a, b, out):
    """out = a @ b inside compiled code, for a step's product (operands as for :func:`gemm`):
    on the library chosen for the steps, or for at most ``SMALL_PRODUCT`` multiply-adds of
    operands with unit stride along their rows, on the one for tiny products."""
    raise NotImplementedError("step_product is only callable from numba-compiled code")


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


def _gemm_overload(beta, table=_gemm_fn):
    """The overload of out = a @ b + beta · out (beta 0 or 1) on the functions of ``table``."""
    def typer(a, b, out):
        T = out.dtype
        if T not in table:
            return None
        fn, one, b_ = table[T], T.cast_python_value(1.0), T.cast_python_value(beta)
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


def _step_any(a, b, out):
    """out = a @ b on the library chosen for the steps."""
    raise NotImplementedError("only callable from numba-compiled code")


overload(_step_any, inline="always")(_gemm_overload(0.0, _step_fn))


def _small_gemm(a, b, out):
    """out = a @ b on the functions for tiny products."""
    raise NotImplementedError("only callable from numba-compiled code")


overload(_small_gemm, inline="always")(_gemm_overload(0.0, _small_fn))


@overload(step_product, inline="always")
def _step_impl(a, b, out):
    if out.dtype not in _step_fn:
        return None

    def impl(a, b, out):
        item = out.itemsize
        if a.shape[0] * a.shape[1] * b.shape[1] <= SMALL_PRODUCT and a.strides[1] == item \
                and b.strides[1] == item:
            _small_gemm(a, b, out)
        else:
            _step_any(a, b, out)
    return impl


@overload(packed_product, inline="always")
def _packed_impl(a, packed, out):
    T = out.dtype
    if T not in _compute_fn:
        return None
    fn, zero = _compute_fn[T], T.cast_python_value(0.0)

    def impl(a, packed, out):
        M, K = a.shape
        N = out.shape[1]
        fn(ROW_MAJOR, NO_TRANS, PACKED_B, M, N, K, a.ctypes.data, K, packed.ctypes.data, N, zero,
           out.ctypes.data, N)
    return impl
