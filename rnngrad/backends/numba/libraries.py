"""The GEMM libraries the numba kernels can call, each found and loaded here; a library that is
not installed is skipped with the reason, never an error.

- ``mkl``: Intel MKL's single dynamic library (``libmkl_rt``, the ``mkl`` wheel), started with
  the sequential threading layer, so that every call runs on the calling thread (one of
  numba's). It alone packs a matrix once into its kernel's panel layout
  (``cblas_?gemm_pack``) and multiplies by it at every step (``cblas_?gemm_compute``): a
  recurrence multiplies by the same recurrent weight at every step. On AMD CPUs MKL runs its
  AVX2 code.
- ``openblas``: SciPy's bundled OpenBLAS, called through its CBLAS symbol; the driver limits it
  to one thread around every op (``machine.blas_threads``). Where no CBLAS symbol is found, the
  same products run through numba's ``np.dot`` (SciPy's BLAS, operands copied).
- ``onednn``: oneDNN's ``dnnl_sgemm`` (the ``onednn-cpu-gomp`` wheel: the ``onednn`` extra),
  float32 only, through an adapter with the CBLAS signature that runs each call on the calling
  thread (OpenMP's thread count set to one around it, and put back). A oneDNN built on TBB or a
  thread pool is skipped: its products would start threads of their own inside numba's.

Every function here has the CBLAS ``?gemm`` signature, row-major, 32-bit integers (MKL's LP64
interface): ``Library.gemm[p]`` holds its address for p = "s" (float32) and "d" (float64), or
None where the library has no such product. Which library runs which product is measured
(``rule.py``) and bound by ``blas.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os
import sys

import numba
import numpy as np
from numba.core import types

#: CBLAS's enumerators: row-major order, no transpose, transpose, a packed operand (MKL's
#: ``?gemm_compute``), and the B matrix (MKL's ``?gemm_pack``)
ROW_MAJOR, NO_TRANS, TRANS, PACKED_B, B_MATRIX = 101, 111, 112, 151, 162
_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
#: oneDNN's CPU runtimes whose products run on the calling thread once OpenMP's count is one
_DNNL_SEQ, _DNNL_OMP = 1, 2

_i, _p = types.intc, types.intp  # pointers cross as integers (the same registers in every ABI)
#: the ctypes form of the CBLAS ``?gemm`` signature, for calls from Python (``rule.py``)
CBLAS = {p: ctypes.CFUNCTYPE(None, *[ctypes.c_int] * 6, c, ctypes.c_void_p, ctypes.c_int,
                             ctypes.c_void_p, ctypes.c_int, c, ctypes.c_void_p, ctypes.c_int)
         for p, c in (("s", ctypes.c_float), ("d", ctypes.c_double))}


class Library:
    """One GEMM library: ``name``, ``detail`` (version and file), ``gemm`` {p: address or
    None}, ``mkl`` (the :class:`Mkl` that packs, for "mkl" only)."""

    def __init__(self, name, detail, gemm, mkl=None):
        self.name, self.detail, self.gemm, self.mkl = name, detail, gemm, mkl

    def function(self, p):
        """The library's ``?gemm`` as a ctypes function (None where it has none)."""
        address = self.gemm.get(p)
        return None if address is None else CBLAS[p](address)


# -- MKL ------------------------------------------------------------------------------------------

def _mkl_candidates():
    names = ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so", "libmkl_rt.dylib",
             "libmkl_rt.2.dylib", "mkl_rt.3.dll", "mkl_rt.2.dll", "mkl_rt.dll")
    for folder in _prefix_folders():
        for name in names:
            yield os.path.join(folder, name)
    found = ctypes.util.find_library("mkl_rt")
    if found:
        yield found
    yield from glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "*",
                                      "libmkl_rt.so*"))


def _prefix_folders():
    folders = [os.path.join(sys.prefix, "lib"), os.path.join(sys.prefix, "Library", "bin")]
    if sys.base_prefix != sys.prefix:
        folders.append(os.path.join(sys.base_prefix, "lib"))
    return folders


class Mkl:
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
            compute = getattr(lib, f"cblas_{p}gemm_compute")
            compute.argtypes = [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_int,
                                                     ctypes.c_void_p, ctypes.c_int, c,
                                                     ctypes.c_void_p, ctypes.c_int]
            compute.restype = None

    def _version(self):
        buf = ctypes.create_string_buffer(256)
        try:
            self.lib.mkl_get_version_string(buf, 256)
        except AttributeError:
            return "MKL"
        return buf.value.decode(errors="replace").strip()

    def address(self, name):
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value


def load_mkl():
    """(:class:`Library` or None, why not)."""
    tried = []
    for path in _mkl_candidates():
        if not os.path.exists(path) and os.sep in path:
            continue
        try:
            mkl = Mkl(path)
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue
        if mkl.layer != _SEQUENTIAL:
            return None, (f"MKL was already started in this process with threading layer "
                          f"{mkl.layer}, not the sequential one rnngrad runs it with")
        gemm = {p: mkl.address(f"cblas_{p}gemm") for p in "sd"}
        return Library("mkl", f"{mkl.version} ({mkl.path}), sequential", gemm, mkl), ""
    return None, "not installed (pip install mkl)" + (f"; tried {'; '.join(tried)}" if tried else "")


# -- OpenBLAS -------------------------------------------------------------------------------------

def load_openblas():
    """(:class:`Library` or None, why not): SciPy's OpenBLAS through its CBLAS symbols, else
    numba's ``np.dot`` (:func:`_np_dot_functions`)."""
    from ... import machine

    lib = machine.blas_libraries().get("scipy")
    if lib is not None:
        handle = ctypes.CDLL(lib.path)
        for prefix in ("scipy_cblas_", "cblas_"):
            try:
                gemm = {p: ctypes.cast(getattr(handle, f"{prefix}{p}gemm"), ctypes.c_void_p).value
                        for p in "sd"}
            except AttributeError:
                continue
            return Library("openblas", f"SciPy's {lib.config.strip()}, core type {lib.corename} "
                           f"({lib.path}), one thread", gemm), ""
    try:
        import scipy.linalg.cython_blas  # noqa: F401 (what numba's np.dot calls)
    except ImportError:
        return None, "SciPy is not installed (pip install scipy)"
    gemm = {p: _np_dot_functions(T)[0].address
            for p, T in (("s", types.float32), ("d", types.float64))}
    return Library("openblas", "SciPy's BLAS through numba's np.dot (no CBLAS symbol found)",
                   gemm), ""


# The compiled functions below read only globals: numba keys a cached closure by its cells'
# pickled contents, which differ in every process for a dispatcher or an ExternalFunction, so
# a closure would be compiled again, and its cache entries grow, in every process.

@numba.njit(cache=True, error_model="numpy")
def _operand(p, trans, rows, cols, ld):
    """The operand at ``p`` as a contiguous [rows, cols] array (copied, transposed if asked)."""
    if trans == NO_TRANS:
        full = numba.carray(p, (rows, ld))
        return np.ascontiguousarray(full[:, :cols])
    full = numba.carray(p, (cols, ld))
    return np.ascontiguousarray(full[:, :rows].T)


@functools.lru_cache(maxsize=None)
def _np_dot_functions(T):
    """cfuncs with the CBLAS ``gemm`` signature for float type T: the product through numba's
    ``np.dot`` (SciPy's BLAS), and a compiled loop for ``NO_TRANS`` products with alpha 1 and
    beta 0 (``blas.SMALL_PRODUCT``: a BLAS call and its checks cost more than a tiny product)."""
    ptr = types.CPointer(T)
    gemm_sig = types.void(_i, _i, _i, _i, _i, _i, T, ptr, _i, ptr, _i, T, ptr, _i)

    @numba.cfunc(gemm_sig, cache=True, error_model="numpy")
    def gemm(layout, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
        if M > 0 and N > 0:
            a = _operand(A, ta, M, K, lda)
            b = _operand(B, tb, K, N, ldb)
            c = numba.carray(C, (M, ldc))[:, :N]
            r = np.dot(a, b)
            if beta == 0:
                c[:] = alpha * r
            else:
                c[:] = alpha * r + beta * c

    @numba.cfunc(gemm_sig, cache=True, error_model="numpy")
    def loop(layout, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
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

    return gemm, loop


def small_loop(p):
    """The address of the compiled loop for tiny ``NO_TRANS`` products (alpha 1, beta 0)."""
    return _np_dot_functions(types.float32 if p == "s" else types.float64)[1].address


# -- oneDNN ---------------------------------------------------------------------------------------

class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]


def _onednn_candidates():
    for folder in _prefix_folders():
        for name in ("libdnnl.so.3", "libdnnl.so"):
            yield os.path.join(folder, name)
    found = ctypes.util.find_library("dnnl")
    if found:
        yield found


_DNNL = types.intc(types.char, types.char, types.int64, types.int64, types.int64, types.float32,
                   _p, types.int64, _p, types.int64, types.float32, _p, types.int64)
_dnnl_sgemm = types.ExternalFunction("rnngrad_dnnl_sgemm", _DNNL)
_omp_get = types.ExternalFunction("rnngrad_omp_get_max_threads", types.intc())
_omp_set = types.ExternalFunction("rnngrad_omp_set_num_threads", types.void(types.intc))


@functools.lru_cache(maxsize=None)
def _onednn_adapter():
    """The cfunc with the CBLAS row-major ``sgemm`` signature on ``dnnl_sgemm`` (row-major
    too, 'N' or 'T' for each operand, 64-bit sizes), on the calling thread. Made once the
    symbols it calls are bound (a cfunc is compiled, and linked, when it is made)."""
    @numba.cfunc(types.void(_i, _i, _i, _i, _i, _i, types.float32, _p, _i, _p, _i,
                            types.float32, _p, _i), cache=True, error_model="numpy")
    def sgemm(layout, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc):
        threads = _omp_get()
        _omp_set(1)
        _dnnl_sgemm(np.int8(84 if ta == TRANS else 78), np.int8(84 if tb == TRANS else 78),
                    M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)  # 84 'T', 78 'N'
        _omp_set(threads)
    return sgemm


def load_onednn():
    """(:class:`Library` or None, why not). Binds the adapter's symbols (``llvmlite``) when
    oneDNN is found."""
    import llvmlite.binding as llvm

    tried = []
    for path in _onednn_candidates():
        if os.sep in path and not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            lib.dnnl_version.restype = ctypes.POINTER(_Version)
            version = lib.dnnl_version().contents
            sgemm = ctypes.cast(lib.dnnl_sgemm, ctypes.c_void_p).value
            if version.cpu_runtime not in (_DNNL_SEQ, _DNNL_OMP):
                tried.append(f"{path}: its CPU runtime ({version.cpu_runtime}) is neither "
                             "sequential nor OpenMP (pip install onednn-cpu-gomp)")
                continue
            omp = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                   for name in ("omp_get_max_threads", "omp_set_num_threads")} \
                if version.cpu_runtime == _DNNL_OMP else None
        except (OSError, AttributeError) as exc:
            tried.append(f"{path}: {exc}")
            continue
        llvm.add_symbol("rnngrad_dnnl_sgemm", sgemm)
        if omp is None:  # sequential: nothing to limit
            omp = {name: fn.address for name, fn in _no_omp().items()}
        for name, address in omp.items():
            llvm.add_symbol(f"rnngrad_{name}", address)
        detail = (f"oneDNN {version.major}.{version.minor}.{version.patch} ({path}), "
                  "one thread a call")
        return Library("onednn", detail, {"s": _onednn_adapter().address, "d": None}), ""
    return None, "not installed (pip install onednn-cpu-gomp, or rnngrad's onednn extra)" + (
        f"; tried {'; '.join(tried)}" if tried else "")


@functools.lru_cache(maxsize=None)
def _no_omp():
    """Stand-ins for OpenMP's thread count around a sequential oneDNN's products."""
    @numba.cfunc(types.intc(), cache=True)
    def one():
        return 1

    @numba.cfunc(types.void(types.intc), cache=True)
    def ignore(n):
        pass
    return {"omp_get_max_threads": one, "omp_set_num_threads": ignore}


def load_all():
    """({name: Library}, {name: why not}) of every candidate, in the order ties are broken."""
    found, why = {}, {}
    for name, load in (("mkl", load_mkl), ("openblas", load_openblas), ("onednn", load_onednn)):
        lib, reason = load()
        if lib is None:
            why[name] = reason
        else:
            found[name] = lib
    return found, why
