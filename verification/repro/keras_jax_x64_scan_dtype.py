"""Keras 3 on the jax backend with jax_enable_x64: recurrent layers raise in jax.lax.scan.

With float64 enabled in jax (needed for any float64 layer), a float32 GRU without bias and a
float64 SimpleRNN both raise "scan body function carry input and carry output must have equal
types": part of the step's arithmetic comes out in the other precision than the carry.

    KERAS_BACKEND=jax python verification/repro/keras_jax_x64_scan_dtype.py
"""
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import keras  # noqa: E402
import numpy as np  # noqa: E402

print("keras", keras.__version__, "jax", jax.__version__)
x = np.random.default_rng(0).standard_normal((1, 3, 2))
for what, layer, dtype in (
        ("GRU(use_bias=False), float32", keras.layers.GRU(2, use_bias=False), "float32"),
        ("SimpleRNN(dtype='float64')", keras.layers.SimpleRNN(2, dtype="float64"), "float64")):
    try:
        out = layer(x.astype(dtype))
        print(f"{what}: ran, output {out.dtype}")
    except Exception as exc:  # noqa: BLE001 - the point is to show the error
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        print(f"{what}: {type(exc).__name__}: {next((l for l in lines if 'scan' in l), lines[0])}")
