"""The numba CPU backend: every op of SEMANTICS.md, float32 and float64, computed in the
inputs' dtype.

Design (details in ``driver.py``, ``common.py`` and the kernel modules): the input projection
and the weight and source gradients are large GEMMs over all steps (``gemm.py``); each
direction's recurrence is one compiled kernel running the whole time loop, with the hidden
units split into parts that run in parallel, each computing its units' columns of the
recurrent product (one BLAS GEMM per step over the whole batch) and their gate math in
vectorised loops. Everything runs on numba's thread pool. z_state is written in exactly the
layout of SEMANTICS.md §2.3, so a numba forward feeds any backend's gradients and the reverse.

Kernels are compiled with ``cache=True``; ``fastmath`` is off (it would let NaN become a
number, SEMANTICS.md §4). The cache is kept in rnngrad's per-user cache folder
(:func:`rnngrad._cache.user_cache_dir`), one folder per installation and state of the sources,
never inside the package: numba's cache checks only the source file of each cached function, not
the helpers it inlines from other files, so any edit of a file with compiled code gives a fresh
folder and removes the older ones. ``NUMBA_CACHE_DIR``, when set, is used instead, as numba does.
In rnngrad's folder, each kernel's cache file is read and written under a file lock
(:class:`LockedCacheFile`), so that processes compiling at the same time cannot mix up their
entries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import sys
import warnings

try:
    import fcntl
except ImportError:  # not POSIX: numba's own unlocked cache files
    fcntl = None

import numba
import numpy as np
from numba.core import caching

from ..._cache import UnsafeCacheError, user_cache_dir

_HERE = os.path.dirname(os.path.abspath(__file__))


#: what marks a source file as compiled code: a numba decorator, overload or intrinsic
_COMPILED = re.compile(rb"(?m)^\s*(@numba\.|@overload|@intrinsic|overload\()")
#: files outside this package whose values the kernels freeze in when compiled
_FROZEN_IN = (os.path.join(os.path.dirname(_HERE), "reference", "activations.py"),)


def sources_stamp(folder: str = _HERE) -> str:
    """A hash of the names and contents of this package's (or ``folder``'s) ``*.py`` files
    that hold compiled code, and of the files whose constants the kernels read
    (``_FROZEN_IN``). Pure-Python files (the driver, the overlap helper, this one) do not
    count: editing them leaves the compiled kernels valid."""
    digest = hashlib.sha256()
    paths = [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(".py")]
    for path in paths + list(_FROZEN_IN):
        with open(path, "rb") as f:
            source = f.read()
        if path in _FROZEN_IN or _COMPILED.search(source):
            digest.update(os.path.basename(path).encode() + b"\0" + source)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def kernel_cache_dir() -> str:
    """``<user cache>/numba/<installation>/<sources>``: the installation is this folder's path
    (hashed, as numba names its own cache folders), the sources are :func:`sources_stamp`. A
    new state of the sources removes the folders of the installation's older ones."""
    installation = user_cache_dir("numba") / caching.UserWideCacheLocator.get_suitable_cache_subpath(
        os.path.join(_HERE, "__init__.py"))
    current = installation / sources_stamp()[:16]
    if not current.is_dir():
        if installation.is_dir():
            for older in installation.iterdir():
                shutil.rmtree(older, ignore_errors=True)
        current.mkdir(mode=0o700, parents=True, exist_ok=True)
    return str(current)


def kernel_folder() -> str | None:
    """rnngrad's kernel folder (:func:`kernel_cache_dir`), where the warm-up's markers and the
    GEMM rule's rates are kept; None where the kernels are in numba's own cache files, without
    the lock (``NUMBA_CACHE_DIR`` set, or no usable folder)."""
    if numba.config.CACHE_DIR:
        return None
    try:
        return kernel_cache_dir()
    except OSError:
        return None


def cache_location() -> str:
    """Where this package's compiled kernels are kept, for ``rnngrad info``."""
    if numba.config.CACHE_DIR:
        return f"{numba.config.CACHE_DIR} (NUMBA_CACHE_DIR)"
    try:
        return kernel_cache_dir()
    except OSError as exc:
        return f"numba's own locations ({exc})"


class KernelCacheLocator(caching.UserWideCacheLocator):
    """Puts numba's cache of this package's kernels in :func:`kernel_cache_dir`, ahead of
    numba's own ``__pycache__`` beside the source: a cache inside an installed package outlives
    ``pip uninstall`` (pip removes only the files it installed), and the folder it leaves shadows
    a later editable install of the same package as an empty namespace package. Other files,
    a set ``NUMBA_CACHE_DIR``, or a cache folder that cannot be had go to numba's own locators
    (a folder another user could write to with a warning)."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = kernel_cache_dir()

    @classmethod
    def from_function(cls, py_func, py_file):
        if numba.config.CACHE_DIR or os.path.dirname(os.path.abspath(py_file)) != _HERE:
            return None
        try:
            return super().from_function(py_func, py_file)
        except UnsafeCacheError as exc:
            warnings.warn(f"{exc} Falling back to numba's own cache locations.", stacklevel=2)
        except OSError:
            pass  # no writable cache folder (a read-only home): numba's own locators decide
        return None


def _register_cache_locator():
    locators = caching.CacheImpl._locator_classes
    if not any(c.__qualname__ == KernelCacheLocator.__qualname__ for c in locators):
        locators.insert(locators.index(caching.InTreeCacheLocator), KernelCacheLocator)


_register_cache_locator()


class LockedCacheFile(caching.IndexDataCacheFile):
    """numba's index-and-data cache file of one kernel, with each save under an exclusive and
    each load under a shared inter-process lock (``flock`` on ``.lock`` in the folder).

    numba's own save reads the index, takes the first free data-file number, writes the index,
    then the data. Two processes saving different signatures of one kernel at the same moment
    (a float32 and a float64 run started together on a cold cache) both take number 1: the
    index can end up pointing one signature at the other's compiled code, and every later call
    with it fails with "can't unbox array" until the folder is removed (numba issue #10128
    reports the same race for GUFuncs). Under the lock, saves follow one another, and a load
    never reads an index entry whose data is not written yet."""

    @contextlib.contextmanager
    def _locked(self, operation):
        fd = os.open(os.path.join(self._cache_path, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, operation)
            yield
        finally:
            os.close(fd)  # releases the lock

    def save(self, key, data):
        with self._locked(fcntl.LOCK_EX):
            super().save(key, data)

    def load(self, key):
        with self._locked(fcntl.LOCK_SH):
            return super().load(key)


def _lock_kernel_caches():
    """Give every kernel of this package cached by :class:`KernelCacheLocator` a
    :class:`LockedCacheFile` (numba makes the plain one when the kernel is defined, with no
    hook to choose another)."""
    if fcntl is None:
        return
    for name, module in list(sys.modules.items()):
        if name != __name__ and not name.startswith(__name__ + "."):
            continue
        for obj in vars(module).values():
            cache = getattr(obj, "_cache", None)
            if isinstance(cache, caching.FunctionCache) \
                    and isinstance(cache._impl.locator, KernelCacheLocator) \
                    and not isinstance(cache._cache_file, LockedCacheFile):
                cache._cache_file = LockedCacheFile(
                    cache_path=cache.cache_path, filename_base=cache._impl.filename_base,
                    source_stamp=cache._impl.locator.get_source_stamp())


def _prefer_openmp():
    """Numba picks TBB over OpenMP for its thread pool when both are installed (MKL's wheel
    brings TBB along). The kernels meet their parts once per step, and OpenMP's spinning
    workers answer at once where TBB's sleeping ones took up to a step's whole GEMM
    (verification/PERFORMANCE.md, "numba's thresholds"). Unless the user chose a layer
    (``NUMBA_THREADING_LAYER``), OpenMP goes first."""
    if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


def _start_thread_pool():
    """Start numba's thread pool now, before any kernel is loaded from the cache. A cached
    kernel that calls a parallel one but was compiled while the callee came from the cache
    does not record that it needs the pool (numba issues #8578 and #9938), and loaded in a fresh
    process before anything started the pool, it calls a null scheduler and crashes."""
    numba.get_num_threads()


_prefer_openmp()
_start_thread_pool()

from ...registry import Backend, every_cell  # noqa: E402
from . import blas, driver  # noqa: E402

blas.bind(kernel_folder())  # before any kernel is compiled or loaded

_lock_kernel_caches()  # every kernel module is imported by now (driver imports them all)

BACKEND = Backend(
    name="numba",
    dtypes=(np.dtype(np.float32), np.dtype(np.float64)),
    implementations=every_cell(driver.forward, driver.gradients),
    summary="CPU, numba-compiled time loops with BLAS GEMMs, float32 and float64",
)
