"""The five MPSGraphRNNActivation functions and their derivatives, as numba loops over a row.

The kernels apply one activation to a contiguous row view at a time (:func:`activate`,
:func:`activate_with_derivative`): the activation kind is switched once per row, so each branch
is a plain loop that LLVM vectorises (AVX-512: 16 float32 or 8 float64 lanes). ``exp`` and
``tanh`` are computed here, branch-free and in the row's own dtype, rather than by the C
library, which has no vector form in numba:

    exp(y), y ≤ 0:    n = round(y / ln 2), r = y − n ln 2 (two-part ln 2, |r| ≤ 0.35),
                      exp(r) by its Taylor polynomial (degree 7 in float32, 12 in float64),
                      times 2ⁿ built from the exponent bits (:func:`times_pow2`).
                      y is clamped to −87 (float32) / −708 (float64) so that 2ⁿ stays normal;
                      below that e^y is under 2e-38 / 4e-308, far inside every tolerance.
    expm1(y), y ≤ 0:  2ⁿ (e^r − 1) + (2ⁿ − 1), with e^r − 1 by its polynomial without the 1:
                      for small |y| (n = 0) this is the polynomial itself, no cancellation.
    sigmoid(x)     =  1 / (1 + e)  (x ≥ 0)  or  e / (1 + e)  (x < 0),  e = exp(−|x|)
    tanh(x)        =  sign(x) · (−u) / (2 + u),  u = expm1(−2|x|)

Relative error: ≈ 2e-7 in float32, ≈ 5e-16 in float64 (``tests/test_numba_activations.py``).
Every constant is typed in the row's dtype (float32 arithmetic stays float32).
NaN propagates through every function and every derivative, as in the reference
(``rnngrad.backends.reference.activations``): every comparison is written so that NaN takes the branch
that keeps it, and a NaN exponent is replaced by 0 before it is turned into bits. Kernels are
compiled with ``error_model="numpy"`` (no ZeroDivisionError checks, which would stop
vectorisation) and without fastmath (which may turn NaN into numbers).
"""

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from ..reference.activations import HARD_SIGMOID_EDGE, HARD_SIGMOID_OFFSET, HARD_SIGMOID_SLOPE

NONE, RELU, TANH, SIGMOID, HARD_SIGMOID = 0, 1, 2, 3, 4

# Indices into the constants array of a kernel's dtype.
ZERO, ONE, SLOPE, OFFSET, EDGE = 0, 1, 2, 3, 4

#: every compiled function: cached on disk; nogil, so that a recurrence on the calling thread
#: and the products on the helper thread (``overlap.py``) run at the same time
JIT = dict(cache=True, error_model="numpy", nogil=True)


def constants(dtype) -> np.ndarray:
    """[5] constants in the kernel's dtype (a Python float literal would promote to float64)."""
    return np.array([0.0, 1.0, HARD_SIGMOID_SLOPE, HARD_SIGMOID_OFFSET, HARD_SIGMOID_EDGE],
                    dtype=dtype)  # [5]


@intrinsic
def times_pow2(typingctx, x, n):
    """x · 2ⁿ for a float x and an integral-valued float n of the same type, with 2ⁿ normal
    (−126 ≤ n ≤ 127 in float32, −1022 ≤ n ≤ 1023 in float64): 2ⁿ is assembled from its exponent
    bits, which vectorises (the C library's ldexp does not)."""
    if not (isinstance(x, types.Float) and x == n):
        return None

    def codegen(context, builder, signature, args):
        xv, nv = args
        bits, bias, shift = (32, 127, 23) if x.bitwidth == 32 else (64, 1023, 52)
        ity = ir.IntType(bits)
        e = builder.add(builder.fptosi(nv, ity), ir.Constant(ity, bias))
        scale = builder.bitcast(builder.shl(e, ir.Constant(ity, shift)), xv.type)
        return builder.fmul(xv, scale)

    return x(x, n), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """a·b + c rounded once (LLVM's fma: one vector instruction on CPUs with FMA). Used only
    inside the polynomials below, where it halves the latency of each Horner step; fastmath
    stays off everywhere else."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [t], ir.FunctionType(t, [t, t, t]))
        return builder.call(fn, args)

    return a(a, b, c), codegen


def _scalar_functions(F):
    """exp and expm1 of y ≤ 0, sigmoid, tanh and the derivatives, with constants of type F."""
    single = F == np.float32
    lo = F(-87.0 if single else -708.0)
    log2e, ln2_hi, ln2_lo = F(1.0 / math.log(2.0)), F(0.693145751953125), F(1.428606820309417e-06)
    degree = 7 if single else 12
    coef = [F(1.0 / math.factorial(k)) for k in range(degree, 0, -1)]  # 1/d!, …, 1/1!
    zero, half, one, two = F(0.0), F(0.5), F(1.0), F(2.0)
    slope, offset, edge = F(HARD_SIGMOID_SLOPE), F(HARD_SIGMOID_OFFSET), F(HARD_SIGMOID_EDGE)
    c = tuple(coef)

    def reduce(y):
        y = lo if y < lo else y  # NaN < lo is False: NaN stays NaN
        n = np.floor(y * log2e + half)
        n = zero if n != n else n  # a NaN exponent would turn into arbitrary bits
        r = fma(-n, ln2_lo, fma(-n, ln2_hi, y))
        # e^r − 1 = r (1 + r/2 + r²/6 + …), Horner
        q = c[0]
        for k in range(1, degree):
            q = fma(q, r, c[k])
        return n, q * r

    def exp_neg(y):
        n, q = reduce(y)
        return times_pow2(q + one, n)

    def expm1_neg(y):
        n, q = reduce(y)
        return times_pow2(q, n) + (times_pow2(one, n) - one)

    def sigmoid(x):
        e = exp_neg(-abs(x))
        num = one if x >= zero else e  # NaN takes the second branch and stays NaN
        return num / (one + e)

    def tanh(x):
        u = expm1_neg(-two * abs(x))
        t = -u / (two + u)
        return -t if x < zero else t

    def relu(x):
        return zero if x < zero else x

    def hard_sigmoid(x):
        v = slope * x + offset
        v = zero if v < zero else v
        return one if v > one else v

    def tanh_d(x):
        t = tanh(x)
        return t, one - t * t

    def sigmoid_d(x):
        s = sigmoid(x)
        return s, s * (one - s)

    def relu_d(x):
        d = one if x > zero else zero
        return relu(x), (x if x != x else d)

    def hard_sigmoid_d(x):
        d = slope if abs(x) <= edge else zero
        return hard_sigmoid(x), (x if x != x else d)

    def none_d(x):
        return x, (x if x != x else one)

    functions = dict(exp_neg=exp_neg, expm1_neg=expm1_neg, sigmoid=sigmoid, tanh=tanh,
                     relu=relu, hard_sigmoid=hard_sigmoid, tanh_d=tanh_d, sigmoid_d=sigmoid_d,
                     relu_d=relu_d, hard_sigmoid_d=hard_sigmoid_d, none_d=none_d)
    # the functions above call each other through these names: compiled versions from here on
    jit = numba.njit(inline="always", error_model="numpy")
    reduce, exp_neg, expm1_neg = jit(reduce), jit(exp_neg), jit(expm1_neg)
    sigmoid, tanh, relu, hard_sigmoid = jit(sigmoid), jit(tanh), jit(relu), jit(hard_sigmoid)
    return functions


_IMPLS = {types.float32: _scalar_functions(np.float32), types.float64: _scalar_functions(np.float64)}


def _generic(name):
    """A function callable from compiled code whose float32 and float64 versions are those of
    :func:`_scalar_functions` (compiled inline into the caller's loop)."""
    def stub(x):
        raise NotImplementedError(f"{name} is only callable from numba-compiled code")
    stub.__name__ = name

    @overload(stub, inline="always")
    def _choose(x):
        impl = _IMPLS.get(x)
        return None if impl is None else impl[name]
    return stub


exp_neg, expm1_neg, sigmoid, tanh = (_generic(n) for n in ("exp_neg", "expm1_neg", "sigmoid", "tanh"))
relu, hard_sigmoid = _generic("relu"), _generic("hard_sigmoid")
tanh_d, sigmoid_d, relu_d, hard_sigmoid_d, none_d = (
    _generic(n) for n in ("tanh_d", "sigmoid_d", "relu_d", "hard_sigmoid_d", "none_d"))


@numba.njit(**JIT)
def activate(kind, src, dst):
    """dst = f(src) for two row views of the same length (they must not overlap)."""
    n = src.shape[0]
    if kind == TANH:
        for j in range(n):
            dst[j] = tanh(src[j])
    elif kind == SIGMOID:
        for j in range(n):
            dst[j] = sigmoid(src[j])
    elif kind == RELU:
        for j in range(n):
            dst[j] = relu(src[j])
    elif kind == HARD_SIGMOID:
        for j in range(n):
            dst[j] = hard_sigmoid(src[j])
    else:
        for j in range(n):
            dst[j] = src[j]


@numba.njit(**JIT)
def activate_with_derivative(kind, src, dst, der):
    """dst = f(src), der = f'(src) (NaN where src is NaN), for row views of the same length."""
    n = src.shape[0]
    if kind == TANH:
        for j in range(n):
            dst[j], der[j] = tanh_d(src[j])
    elif kind == SIGMOID:
        for j in range(n):
            dst[j], der[j] = sigmoid_d(src[j])
    elif kind == RELU:
        for j in range(n):
            dst[j], der[j] = relu_d(src[j])
    elif kind == HARD_SIGMOID:
        for j in range(n):
            dst[j], der[j] = hard_sigmoid_d(src[j])
    else:
        for j in range(n):
            dst[j], der[j] = none_d(src[j])
