"""Keras 3 on the torch backend: a recurrent layer with unroll=True, go_backwards=True and a
mask raises (the unrolled loop reverses a tuple with torch.flip).

Bidirectional's backward layer is such a layer, so any masked Bidirectional(..., unroll=True)
fails the same way.

    KERAS_BACKEND=torch python verification/repro/keras_torch_unroll_backwards_mask.py
"""
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras  # noqa: E402
import numpy as np  # noqa: E402

print("keras", keras.__version__, keras.backend.backend())
x = np.random.default_rng(0).standard_normal((3, 4, 2)).astype("float32")
mask = np.arange(4)[None, :] < np.array([2, 4, 1])[:, None]
for go_backwards in (False, True):
    layer = keras.layers.LSTM(2, unroll=True, go_backwards=go_backwards, return_sequences=True)
    try:
        out = layer(x, mask=mask)
        print(f"unroll=True, go_backwards={go_backwards}, mask: ran, output {tuple(out.shape)}")
    except Exception as exc:  # noqa: BLE001 - the point is to show the error
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        print(f"unroll=True, go_backwards={go_backwards}, mask: {type(exc).__name__}: "
              f"{lines[1] if len(lines) > 1 else lines[0]}")
