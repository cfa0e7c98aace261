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
number, contract section 4). Numba's cache checks only the source file of each cached
function, not the helpers it inlines from other files, so :func:`_drop_stale_cache` removes
this package's cached kernels whenever any of its source files changed.
"""

import hashlib
import os

import numpy as np


def _drop_stale_cache():
    """Delete ``__pycache__/*.nbi, *.nbc`` when the package's sources differ from the ones
    they were compiled from (a hash of every ``*.py`` here, kept in ``__pycache__``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
    stamp = digest.hexdigest()
    cache = os.path.join(here, "__pycache__")
    path = os.path.join(cache, "numba_sources.sha256")
    try:
        with open(path) as f:
            if f.read().strip() == stamp:
                return
    except OSError:
        pass
    try:
        os.makedirs(cache, exist_ok=True)
        for name in os.listdir(cache):
            if name.endswith((".nbi", ".nbc")):
                os.remove(os.path.join(cache, name))
        with open(path, "w") as f:
            f.write(stamp + "\n")
    except OSError:
        pass  # a read-only installation: numba keeps its cache elsewhere, or none


_drop_stale_cache()


def _prefer_openmp():
    """Numba picks TBB over OpenMP for its thread pool when both are installed (MKL's wheel
    brings TBB along). The kernels meet their parts once per step, and OpenMP's spinning
    workers answer that in about 2 µs where TBB's sleeping ones took up to a step's whole GEMM:
    LSTM 100×32×256×256 ran 121 ms with OpenMP against 154 ms with TBB. Unless the user chose
    a layer (``NUMBA_THREADING_LAYER``), OpenMP goes first."""
    import numba

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
