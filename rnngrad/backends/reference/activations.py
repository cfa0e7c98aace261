"""The five MPSGraphRNNActivation functions and their derivatives, in float64 NumPy.

Notation
    x is a pre-activation, s = sigmoid(x).

Equations (SEMANTICS.md §1)
    none: x, derivative 1;  relu: max(x, 0), derivative 1 where x > 0 else 0
    tanh: tanh(x), derivative 1 − tanh²(x);  sigmoid: 1/(1 + e^(−x)), derivative s(1 − s)
    hard_sigmoid: clamp(0.2·x + 0.5, 0, 1), derivative 0.2 where |x| ≤ 2.5 else 0

Layouts
    Element-wise: every function returns an array of x's shape.

Deviations and decisions
    - hard_sigmoid's slope 0.2 and offset 0.5 (ONNX's HardSigmoid defaults; Apple does not
      document them) [decision].
    - Derivatives are taken from the pre-activation x, not from the activation's output.
    - NaN propagates through every function and every derivative: a NaN pre-activation gives a
      NaN derivative, never 0, so a NaN is never turned into a number on the way back
      (SEMANTICS.md §4).
"""
import numpy as np

from ...descriptors import Activation

#: hard_sigmoid(x) = clamp(HARD_SIGMOID_SLOPE * x + HARD_SIGMOID_OFFSET, 0, 1)   [decision]
HARD_SIGMOID_SLOPE = 0.2
HARD_SIGMOID_OFFSET = 0.5
#: |x| at which hard_sigmoid saturates; its derivative is the slope for |x| <= this, else 0.
HARD_SIGMOID_EDGE = HARD_SIGMOID_OFFSET / HARD_SIGMOID_SLOPE


def sigmoid(x):
    """1/(1+e^(−x)) without overflow for large |x|."""
    e = np.exp(-np.abs(x))
    r = 1.0 / (1.0 + e)
    return np.where(x >= 0, r, e * r)


def activate(kind: Activation, x):
    if kind == Activation.NONE:
        return x.copy()
    if kind == Activation.RELU:
        return np.maximum(x, 0.0)  # np.maximum propagates NaN
    if kind == Activation.TANH:
        return np.tanh(x)
    if kind == Activation.SIGMOID:
        return sigmoid(x)
    if kind == Activation.HARD_SIGMOID:
        return np.clip(HARD_SIGMOID_SLOPE * x + HARD_SIGMOID_OFFSET, 0.0, 1.0)
    raise ValueError(f"activation: unknown value {kind!r}")


def derivative(kind: Activation, x, y=None):
    """f'(x) from the pre-activation x; NaN where x is NaN. ``y``, when given, is f(x) already
    computed: sigmoid and tanh then take their derivative from it (s(1−s), 1−y²)."""
    if kind == Activation.NONE:
        d = np.ones_like(x)
    elif kind == Activation.RELU:
        d = (x > 0).astype(x.dtype)
    elif kind == Activation.TANH:
        y = np.tanh(x) if y is None else y
        d = 1.0 - y * y
    elif kind == Activation.SIGMOID:
        y = sigmoid(x) if y is None else y
        d = y * (1.0 - y)
    elif kind == Activation.HARD_SIGMOID:
        d = np.where(np.abs(x) <= HARD_SIGMOID_EDGE, HARD_SIGMOID_SLOPE, 0.0)
    else:
        raise ValueError(f"activation: unknown value {kind!r}")
    return np.where(np.isnan(x), np.nan, d)
