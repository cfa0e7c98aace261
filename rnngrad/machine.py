"""What this machine's linear algebra runs on: the BLAS libraries, their core type and threads.

NumPy and SciPy wheels each bundle their own OpenBLAS (``numpy.libs/libscipy_openblas64_*``
and ``scipy.libs/libscipy_openblas*``). NumPy's computes ``@``; SciPy's is the one numba calls
for ``np.dot`` inside compiled code (through ``scipy.linalg.cython_blas``), so the numba backend
uses both. OpenBLAS picks its kernels ("core type") at load time from the CPU; inside some
virtual machines it falls back to an older type, and ``OPENBLAS_CORETYPE`` (read when the library
loads) overrides the choice: on a CPU with AVX-512 the ``SkylakeX`` kernels are much faster than
``Haswell``'s. :func:`blas_report` says which one is in use and how to get the faster one.

:func:`blas_threads` limits the threads of a library for the duration of a ``with`` block (the
numba backend runs its per-row-block GEMMs single-threaded inside its own parallel region, so
that two thread pools never compete for the cores).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

_lock = threading.Lock()
_libraries = None


class BlasLibrary:
    """One loaded OpenBLAS: ``owner`` (numpy or scipy), ``path`` and its ctypes functions."""

    def __init__(self, owner: str, path: str):
        self.owner = owner
        self.path = path
        self._lib = ctypes.CDLL(path)
        suffix = "64_" if "openblas64_" in os.path.basename(path) else ""
        self._fn = {}
        for name, restype in (("get_config", ctypes.c_char_p), ("get_corename", ctypes.c_char_p),
                              ("get_num_threads", ctypes.c_int), ("set_num_threads", None)):
            for prefix in ("scipy_openblas_", "openblas_"):
                fn = getattr(self._lib, prefix + name + suffix, None)
                if fn is not None:
                    fn.restype = restype
                    self._fn[name] = fn
                    break

    def _call(self, name, *args):
        fn = self._fn.get(name)
        if fn is None:
            return None
        value = fn(*args)
        return value.decode() if isinstance(value, bytes) else value

    @property
    def config(self) -> str:
        return self._call("get_config") or "unknown"

    @property
    def corename(self) -> str:
        return self._call("get_corename") or "unknown"

    @property
    def num_threads(self):
        return self._call("get_num_threads")

    def set_num_threads(self, n: int) -> None:
        if "set_num_threads" in self._fn:
            self._fn["set_num_threads"](ctypes.c_int(int(n)))


def _find(module_name: str, folder: str):
    try:
        module = __import__(module_name)
    except ImportError:
        return None
    base = os.path.dirname(os.path.dirname(module.__file__))
    for path in sorted(glob.glob(os.path.join(base, folder, "*openblas*.so*"))):
        try:
            return BlasLibrary(module_name, path)
        except OSError:
            continue
    return None


def blas_libraries() -> dict:
    """{"numpy": BlasLibrary or None, "scipy": BlasLibrary or None} (the bundled OpenBLAS)."""
    global _libraries
    if _libraries is None:
        _libraries = {"numpy": _find("numpy", "numpy.libs"), "scipy": _find("scipy", "scipy.libs")}
    return _libraries


def cpu_flags() -> set:
    """The CPU's feature flags (Linux /proc/cpuinfo), or an empty set."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


#: core types that use AVX-512 kernels
_AVX512_CORES = ("skylakex", "cooperlake", "sapphirerapids", "zen4", "zen5")


def faster_coretype(corename: str):
    """The OPENBLAS_CORETYPE worth setting on this CPU, or None when the current one is as good."""
    flags = cpu_flags()
    if "avx512f" in flags and "avx512bw" in flags and "avx512vl" in flags \
            and corename.lower() not in _AVX512_CORES:
        return "SkylakeX"
    if "avx2" in flags and "fma" in flags and corename.lower() in ("prescott", "core2", "nehalem",
                                                                    "sandybridge", "atom", "unknown"):
        return "Haswell"
    return None


def blas_report() -> list:
    """Human-readable lines: each BLAS library, version, core type, threads, and how to get a
    faster core type where the CPU supports one."""
    lines = [f"CPU: {cpu_name()}, {os.cpu_count()} logical cores"
             + (", AVX-512" if "avx512f" in cpu_flags() else (", AVX2" if "avx2" in cpu_flags() else ""))]
    for owner, lib in blas_libraries().items():
        role = "NumPy's @" if owner == "numpy" else "SciPy, and np.dot inside numba-compiled code"
        if lib is None:
            lines.append(f"{owner}: no bundled OpenBLAS found (BLAS used by {role} unknown)")
            continue
        lines.append(f"{owner} BLAS ({role}): {lib.config.strip()}")
        lines.append(f"  core type {lib.corename}, {lib.num_threads} threads"
                     + (f" (OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']})"
                        if os.environ.get("OPENBLAS_CORETYPE") else ""))
        better = faster_coretype(lib.corename)
        if better:
            lines.append(f"  this CPU supports faster {better} kernels: set OPENBLAS_CORETYPE={better} "
                         f"in the environment before Python starts")
    return lines


def blas_threads(owner: str, n: int):
    """Limit the named library's (``"numpy"`` or ``"scipy"``) threads to ``n`` inside the block
    (a context manager)."""
    return _Threads(blas_libraries().get(owner), n)


class _Threads:
    """:func:`blas_threads`' block: a class rather than a generator, since the numba backend
    enters one around every op."""

    __slots__ = ("lib", "n", "before")

    def __init__(self, lib, n: int):
        self.lib, self.n, self.before = lib, n, None

    def __enter__(self):
        if self.lib is not None:
            with _lock:
                self.before = self.lib.num_threads
                if self.before is not None:
                    self.lib.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            with _lock:
                self.lib.set_num_threads(self.before)
        return False


if __name__ == "__main__":
    print("\n".join(blas_report()))
