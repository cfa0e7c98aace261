"""MLX: mlx.core.sigmoid of a float64 array is only float32-accurate on the CPU.

mx.sigmoid(x) for float64 x is ~6e-9 off 1 / (1 + exp(-x)) computed in float64 (mx.tanh is
exact), so MLX's float64 GRU and LSTM layers, whose gates are sigmoids, are ~1e-8 off a
float64 computation.

    python verification/repro/mlx_sigmoid_float64.py
"""
import mlx.core as mx
import numpy as np

x = np.linspace(-3, 3, 13)
with mx.stream(mx.cpu):
    sig = np.array(mx.sigmoid(mx.array(x, dtype=mx.float64)))
    tanh = np.array(mx.tanh(mx.array(x, dtype=mx.float64)))
print("mlx", mx.__version__, "dtype", sig.dtype)
print("max |mx.sigmoid - float64|:", np.max(np.abs(sig - 1 / (1 + np.exp(-x)))), "(float64: ~1e-16)")
print("max |mx.tanh - float64|:   ", np.max(np.abs(tanh - np.tanh(x))))
