"""The numba CPU backend: every op of the contract, float32 and float64, computed in the
inputs' dtype.

Design (details in ``driver.py``, ``common.py`` and the kernel modules): the input projection
and the weight and source gradients are large GEMMs over all steps (``gemm.py``); each
direction's recurrence is one compiled kernel running the whole time loop, with the hidden
units split into parts that run in parallel, each computing its units' columns of the
recurrent product (one BLAS GEMM per step over the whole batch) and their gate math in
vectorised loops. Everything runs on numba's thread pool. z_state is written in exactly the
contract's layout, so a numba forward feeds any backend's gradients and the reverse.

Kernels are compiled with ``cache=True``; ``fastmath`` is off (it would let NaN become a
number, contract section 4). The cache is kept in rnngrad's per-user cache folder
(:func:`rnngrad._cache.user_cache_dir`), one folder per installation and state of the sources,
never inside the package: numba's cache checks only the source file of each cached function, not
the helpers it inlines from other files, so any edit of a file with compiled code gives a fresh
folder and removes the older ones. ``NUMBA_CACHE_DIR``, when set, is used instead, as numba does.
"""

import functools
import hashlib
import os
import re
import shutil
import warnings

import numba
import numpy as np
from numba.core import caching

from .._cache import UnsafeCacheError, user_cache_dir

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


def _prefer_openmp():
    """Numba picks TBB over OpenMP for its thread pool when both are installed (MKL's wheel
    brings TBB along). The kernels meet their parts once per step, and OpenMP's spinning
    workers answer that in about 2 µs where TBB's sleeping ones took up to a step's whole GEMM:
    LSTM 100×32×256×256 ran 121 ms with OpenMP against 154 ms with TBB. Unless the user chose
    a layer (``NUMBA_THREADING_LAYER``), OpenMP goes first."""
    if "NUMBA_THREADING_LAYER" not in os.environ and "NUMBA_THREADING_LAYER_PRIORITY" not in os.environ:
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


_prefer_openmp()

from ..registry import Backend  # noqa: E402
from . import driver  # noqa: E402

BACKEND = Backend(
    name="numba",
    dtypes=(np.dtype(np.float32), np.dtype(np.float64)),
    implementations={(cell, kind): fn for cell in ("single_gate", "gru", "lstm")
                     for kind, fn in (("forward", driver.forward), ("gradients", driver.gradients))},
    summary="CPU, numba-compiled time loops with BLAS GEMMs, float32 and float64",
)
