"""The five MPSGraphRNNActivation functions and their derivatives as scalar numba functions.

Each takes the activation's integer code (``rnngrad.Activation``), the pre-activation ``x`` and
a constants array ``k`` of the kernel's dtype (:func:`constants`), so that a float32 kernel
computes in float32: a Python float literal would promote every expression to float64.
NaN propagates through every function and every derivative, as in the reference
(``rnngrad.reference.activations``): no comparison is written so that a NaN takes the
"number" branch.
"""

import math

import numba
import numpy as np

from ..reference.activations import HARD_SIGMOID_EDGE, HARD_SIGMOID_OFFSET, HARD_SIGMOID_SLOPE

NONE, RELU, TANH, SIGMOID, HARD_SIGMOID = 0, 1, 2, 3, 4

# Indices into the constants array.
ZERO, ONE, SLOPE, OFFSET, EDGE = 0, 1, 2, 3, 4


def constants(dtype) -> np.ndarray:
    """[5] the constants the activations need, in the kernel's dtype."""
    return np.array([0.0, 1.0, HARD_SIGMOID_SLOPE, HARD_SIGMOID_OFFSET, HARD_SIGMOID_EDGE],
                    dtype=dtype)  # [5]


@numba.njit(inline="always", cache=True)
def sigmoid(x, k):
    """1/(1+e^(−x)) without overflow; NaN stays NaN (it takes the second branch)."""
    e = math.exp(-abs(x))
    if x >= k[ZERO]:
        return k[ONE] / (k[ONE] + e)
    return e / (k[ONE] + e)


@numba.njit(inline="always", cache=True)
def activate(kind, x, k):
    if kind == TANH:
        return math.tanh(x)
    if kind == SIGMOID:
        return sigmoid(x, k)
    if kind == RELU:
        return k[ZERO] if x < k[ZERO] else x  # NaN < 0 is False: NaN stays NaN
    if kind == HARD_SIGMOID:
        y = k[SLOPE] * x + k[OFFSET]
        if y < k[ZERO]:
            return k[ZERO]
        if y > k[ONE]:
            return k[ONE]
        return y
    return x


@numba.njit(inline="always", cache=True)
def activate_and_derivative(kind, x, k):
    """(f(x), f'(x)) from the pre-activation x; both NaN where x is NaN."""
    if x != x:
        return x, x
    if kind == TANH:
        y = math.tanh(x)
        return y, k[ONE] - y * y
    if kind == SIGMOID:
        y = sigmoid(x, k)
        return y, y * (k[ONE] - y)
    if kind == RELU:
        if x > k[ZERO]:
            return x, k[ONE]
        return k[ZERO], k[ZERO]
    if kind == HARD_SIGMOID:
        y = k[SLOPE] * x + k[OFFSET]
        if y < k[ZERO]:
            y = k[ZERO]
        elif y > k[ONE]:
            y = k[ONE]
        return y, k[SLOPE] if abs(x) <= k[EDGE] else k[ZERO]
    return x, k[ONE]
