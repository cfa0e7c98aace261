"""The numba CPU backend: every op of the contract, float32 and float64, computed in the
inputs' dtype.

Design (details in ``driver.py`` and the kernel modules): the input projection and the weight
and source gradients are large BLAS GEMMs over all steps; each direction's recurrence is one
compiled kernel running the whole time loop, with the recurrent product as one BLAS GEMM per
step and the gate math fused per unit, parallel over batch rows (and over chunks of hidden
units when the batch is small). z_state is written in exactly the contract's layout, so a numba
forward feeds any backend's gradients and the reverse. Kernels are compiled with
``cache=True``; ``fastmath`` is off (it would let NaN become a number, contract section 4).
"""

import numpy as np

from ..registry import Backend
from . import driver

BACKEND = Backend(
    name="numba",
    dtypes=(np.dtype(np.float32), np.dtype(np.float64)),
    implementations={(cell, kind): fn for cell in ("single_gate", "gru", "lstm")
                     for kind, fn in (("forward", driver.forward), ("gradients", driver.gradients))},
    summary="CPU, numba-compiled time loops with BLAS GEMMs, float32 and float64",
)
