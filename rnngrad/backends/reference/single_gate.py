"""singleGateRNN and singleGateRNNGradients: the NumPy reference.

Notation
    T steps, N batch, H hidden units, one gate. ``x'`` is the projected input of one direction
    in processing order (the wrapper in ``directions.py`` applies W, b, reverse and
    bidirectional). ``m`` is the mask (ones if None), ``f`` the descriptor's activation.

Equations (SEMANTICS.md §2.2 and §3.3), for t = 0 … T−1, ``h[−1] = init_state``:
    a[t] = x'[t] + (h[t−1] ⊙ m) Rᵀ
    h[t] = f(a[t])
    backward, t = T−1 … 0, dh = source_gradient'[t] + dh_next:
    da = dh ⊙ f'(a);  dR += daᵀ (h[t−1] ⊙ m);  dh_next = (da R) ⊙ m

Layouts
    R [H,H]; z_state[t] = a[t], [T,N,H] per direction. The gradient op receives no forward
    output: it rebuilds h[t−1] = f(z_state[t−1]) (and init_state at t = 0).

Deviations and decisions
    - Activation defaults to relu, as MPSGraph's descriptor does.
    - Bidirectional state_gradient: its backward half is added at the backward direction's final
      processing step (aligned index 0), as GRU and LSTM do. MPSGraph's singleGate wrapper (iOS
      26.1 decompile) adds it at aligned index T−1 instead, which looks like a bug; a user with a
      Mac should check this case.
    - A per-step mask [T,N,H] is indexed by processing step [decision].
"""

import numpy as np

from .activations import activate, derivative


def core_forward(d, desc):
    T, N = d.x.shape[:2]
    H = d.R.shape[1]
    h = np.empty((T, N, H))  # [T,N,H]
    a = np.empty((T, N, H))  # [T,N,H]
    hp = d.h0  # [N,H]
    for t in range(T):
        a[t] = d.x[t] + (hp * d.mask(t)) @ d.R.T
        h[t] = activate(desc.activation, a[t])
        hp = h[t]
    return h, None, a


def core_backward(d, desc):
    T, N = d.dh_in.shape[:2]
    H = d.R.shape[1]
    dx = np.empty((T, N, H))  # [T,N,H]
    dR = np.zeros((H, H))  # [H,H]
    dh_next = d.initial_dh()  # [N,H]
    for t in range(T - 1, -1, -1):
        a = d.zs[t]  # [N,H]
        hp = activate(desc.activation, d.zs[t - 1]) if t > 0 else d.h0  # [N,H]
        m = d.mask(t)
        dh = d.dh_in[t] + dh_next
        da = dh * derivative(desc.activation, a)  # [N,H]
        dR += da.T @ (hp * m)
        dh_next = (da @ d.R) * m
        dx[t] = da
    return {"dx": dx, "dR": dR, "dh0": dh_next}
