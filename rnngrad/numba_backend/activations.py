"""The five MPSGraphRNNActivation functions and their derivatives, as numba loops over a row.

The kernels apply one activation to a contiguous row of pre-activations at a time
(:func:`activate_row`, :func:`activate_row_with_derivative`): the activation kind is switched
once per row, so each branch is a plain loop that LLVM vectorises. ``exp`` and ``tanh`` are
computed here, branch-free, rather than by the C library, which has no vector form in numba:

    expm1(y), y ≤ 0:  u = expm1(y / 1024) by its Taylor series (|y/1024| ≤ 0.73, 17 terms),
                      then ten doublings u ← u (2 + u)   [(1+u)² − 1]; relative error ≈ 1e-15,
                      also for tiny |y| (no cancellation), and u → −1 as y → −∞.
    exp(y), y ≤ 0:    the same series with its leading 1, then ten squarings (relative error
                      ≈ 3e-13 over the whole range, including tiny results)
    sigmoid(x)     =  1 / (1 + e)  (x ≥ 0)  or  e / (1 + e)  (x < 0),  e = exp(−|x|)
    tanh(x)        =  sign(x) · (−u) / (2 + u),  u = expm1(−2|x|)

They evaluate in float64 (the literals promote) and are stored in the kernel's dtype.
NaN propagates through every function and every derivative, as in the reference
(``rnngrad.reference.activations``): every comparison is written so that NaN takes the branch
that keeps it. Kernels are compiled with ``error_model="numpy"`` (no ZeroDivisionError checks,
which would stop vectorisation) and without fastmath (which may turn NaN into numbers).
"""

import numba
import numpy as np

from ..reference.activations import HARD_SIGMOID_EDGE, HARD_SIGMOID_OFFSET, HARD_SIGMOID_SLOPE

NONE, RELU, TANH, SIGMOID, HARD_SIGMOID = 0, 1, 2, 3, 4

# Indices into the constants array of a kernel's dtype.
ZERO, ONE, SLOPE, OFFSET, EDGE = 0, 1, 2, 3, 4

JIT = dict(cache=True, error_model="numpy")


def constants(dtype) -> np.ndarray:
    """[5] constants in the kernel's dtype (a Python float literal would promote to float64)."""
    return np.array([0.0, 1.0, HARD_SIGMOID_SLOPE, HARD_SIGMOID_OFFSET, HARD_SIGMOID_EDGE],
                    dtype=dtype)  # [5]


@numba.njit(inline="always", **JIT)
def expm1_nonpositive(y):
    """e^y − 1 for y ≤ 0 (or NaN), in float64, branch-free."""
    y = -746.0 if y < -746.0 else y  # NaN < −746 is False: NaN stays NaN
    r = y * (1.0 / 1024.0)
    p = 1.0 / 355687428096000.0
    p = p * r + 1.0 / 20922789888000.0
    p = p * r + 1.0 / 1307674368000.0
    p = p * r + 1.0 / 87178291200.0
    p = p * r + 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    u = p * r
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    u = u * (2.0 + u)
    return u


@numba.njit(inline="always", **JIT)
def exp_nonpositive(y):
    """e^y for y ≤ 0 (or NaN), in float64, branch-free; relative error ≈ 3e-13."""
    y = -746.0 if y < -746.0 else y
    r = y * (1.0 / 1024.0)
    p = 1.0 / 355687428096000.0
    p = p * r + 1.0 / 20922789888000.0
    p = p * r + 1.0 / 1307674368000.0
    p = p * r + 1.0 / 87178291200.0
    p = p * r + 1.0 / 6227020800.0
    p = p * r + 1.0 / 479001600.0
    p = p * r + 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    p = p * p
    return p


@numba.njit(inline="always", **JIT)
def sigmoid(x):
    e = exp_nonpositive(-abs(x))
    num = 1.0 if x >= 0.0 else e  # NaN takes the second branch and stays NaN
    return num / (1.0 + e)


@numba.njit(inline="always", **JIT)
def tanh(x):
    u = expm1_nonpositive(-2.0 * abs(x))
    t = -u / (2.0 + u)
    return -t if x < 0.0 else t


@numba.njit(**JIT)
def activate_row(kind, a, ao, y, yo, n, k):
    """y[yo:yo+n] = f(a[ao:ao+n]) along one row (y and a must not overlap)."""
    src, dst = a[ao:ao + n], y[yo:yo + n]  # views: offset indices would stop vectorisation
    if kind == TANH:
        for j in range(n):
            dst[j] = tanh(src[j])
    elif kind == SIGMOID:
        for j in range(n):
            dst[j] = sigmoid(src[j])
    elif kind == RELU:
        for j in range(n):
            v = src[j]
            dst[j] = k[ZERO] if v < k[ZERO] else v
    elif kind == HARD_SIGMOID:
        for j in range(n):
            v = k[SLOPE] * src[j] + k[OFFSET]
            v = k[ZERO] if v < k[ZERO] else v
            dst[j] = k[ONE] if v > k[ONE] else v
    else:
        for j in range(n):
            dst[j] = src[j]


@numba.njit(**JIT)
def activate_inplace(kind, a, ao, n, k):
    """a[ao:ao+n] = f(a[ao:ao+n]). A separate loop from activate_row: when input and output
    overlap, LLVM's runtime alias check sends activate_row to its scalar path."""
    seg = a[ao:ao + n]
    if kind == TANH:
        for j in range(n):
            seg[j] = tanh(seg[j])
    elif kind == SIGMOID:
        for j in range(n):
            seg[j] = sigmoid(seg[j])
    elif kind == RELU:
        for j in range(n):
            v = seg[j]
            seg[j] = k[ZERO] if v < k[ZERO] else v
    elif kind == HARD_SIGMOID:
        for j in range(n):
            v = k[SLOPE] * seg[j] + k[OFFSET]
            v = k[ZERO] if v < k[ZERO] else v
            seg[j] = k[ONE] if v > k[ONE] else v
    else:
        for j in range(n):
            seg[j] = seg[j]


@numba.njit(**JIT)
def activate_row_with_derivative(kind, a, ao, y, dy, yo, n, k):
    """y[yo:yo+n] = f(a[ao:ao+n]), dy[yo:yo+n] = f'(a[ao:ao+n]), NaN where a is NaN."""
    src, dst, der = a[ao:ao + n], y[yo:yo + n], dy[yo:yo + n]
    if kind == TANH:
        for j in range(n):
            t = tanh(src[j])
            dst[j] = t
            der[j] = k[ONE] - t * t
    elif kind == SIGMOID:
        for j in range(n):
            s = sigmoid(src[j])
            dst[j] = s
            der[j] = s * (k[ONE] - s)
    elif kind == RELU:
        for j in range(n):
            v = src[j]
            dst[j] = k[ZERO] if v < k[ZERO] else v
            d = k[ONE] if v > k[ZERO] else k[ZERO]
            der[j] = v if v != v else d
    elif kind == HARD_SIGMOID:
        for j in range(n):
            v = src[j]
            s = k[SLOPE] * v + k[OFFSET]
            s = k[ZERO] if s < k[ZERO] else s
            dst[j] = k[ONE] if s > k[ONE] else s
            d = k[SLOPE] if abs(v) <= k[EDGE] else k[ZERO]
            der[j] = v if v != v else d
    else:
        for j in range(n):
            v = src[j]
            dst[j] = v
            der[j] = v if v != v else k[ONE]
