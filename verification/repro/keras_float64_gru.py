"""Keras 3 off TensorFlow: a float64 GRU(reset_after=False) computes part of its arithmetic in
float32.

Its output is ~1e-8 off a float64 computation of the same GRU (NumPy below), where float64
arithmetic would be ~1e-16 off. keras.backend.result_type("float64", "float64") is "float32"
on the torch and jax backends; on torch, keras.ops.matmul of two float64 tensors returns
float32. (rnngrad's conformance table finds the same ~1e-8 in every float64 Keras layer on jax,
and in SimpleRNN, GRU(reset_after=False) and every masked layer on torch.)

    KERAS_BACKEND=torch python verification/repro/keras_float64_gru.py
    KERAS_BACKEND=jax python verification/repro/keras_float64_gru.py
"""
import os

os.environ.setdefault("KERAS_BACKEND", "torch")
if os.environ["KERAS_BACKEND"] == "jax":
    import jax

    jax.config.update("jax_enable_x64", True)  # float64 at all in jax

import keras  # noqa: E402
import numpy as np  # noqa: E402

a = keras.ops.convert_to_tensor(np.full((1, 1), 1 / 3), dtype="float64")
print("keras", keras.__version__, keras.backend.backend())
print("result_type(float64, float64):", keras.backend.result_type("float64", "float64"))
print("matmul(float64, float64).dtype:", keras.backend.standardize_dtype(keras.ops.matmul(a, a).dtype))

rng = np.random.default_rng(0)
N, T, I, H = 2, 3, 3, 3
x = rng.standard_normal((N, T, I))
layer = keras.layers.GRU(H, reset_after=False, return_sequences=True, dtype="float64")
layer.build((None, None, I))
W, U, b = (np.asarray(keras.ops.convert_to_numpy(v)) for v in layer.weights)
W, U, b = rng.standard_normal(W.shape) * 0.5, rng.standard_normal(U.shape) * 0.5, rng.standard_normal(b.shape) * 0.3
layer.set_weights([W, U, b])
got = np.asarray(keras.ops.convert_to_numpy(layer(x)))

sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
h, want = np.zeros((N, H)), []
for t in range(T):  # Keras's GRU, reset_after=False: gates z, r, h
    xz, xr, xh = np.split(x[:, t] @ W + b, 3, axis=-1)
    Uz, Ur, Uh = np.split(U, 3, axis=-1)
    z, r = sigmoid(xz + h @ Uz), sigmoid(xr + h @ Ur)
    hh = np.tanh(xh + (r * h) @ Uh)
    h = z * h + (1 - z) * hh
    want.append(h)
want = np.stack(want, axis=1)
print("output dtype:", got.dtype, " max |keras - float64 NumPy|:", np.max(np.abs(got - want)),
      "(float64 arithmetic: ~1e-16; float32: ~1e-8)")
