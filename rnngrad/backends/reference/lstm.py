"""LSTM and LSTMGradients: the NumPy reference.

Notation
    T steps, N batch, H hidden units, four gates. ``x'`` is the projected input of one
    direction in processing order (``directions.py`` applies W, b, reverse and bidirectional).
    ``m`` is the mask (ones if None), ``p`` the peephole (zeros if None), ``g`` the descriptor's
    ``activation`` applied to the cell.

Equations (SEMANTICS.md §2.2 and §3.3), for t = 0 … T−1, ``h[−1] = init_state``,
``c[−1] = init_cell``:
    a_k = x'_k[t] + (h[t−1] ⊙ m) R_kᵀ + p_k ⊙ c[t−1]          k in i, f, z, o
    i = f_in(a_i)   f = f_forget(a_f)   z = f_cell(a_z)   o = f_out(a_o)
    c[t] = f ⊙ c[t−1] + i ⊙ z
    h[t] = o ⊙ g(c[t])
    backward, t = T−1 … 0, dh = source_gradient'[t] + dh_next:
    dc   = dh ⊙ o ⊙ g'(c[t]) + dc_next (+ cell_gradient[t] when per step)
    da_o = dh ⊙ g(c[t]) ⊙ f_out'(a_o)      da_i = dc ⊙ z ⊙ f_in'(a_i)
    da_f = dc ⊙ c[t−1] ⊙ f_forget'(a_f)     da_z = dc ⊙ i ⊙ f_cell'(a_z)
    dR += dAᵀ (h[t−1] ⊙ m);   dh_next = (dA R) ⊙ m
    dc_next = dc ⊙ f + Σ_k da_k ⊙ p_k;   dp_k += Σ_n da_k ⊙ c[t−1]

Layouts
    Gate blocks ``[i, f, z, o]``, or ``[i, z, f, o]`` with forget_gate_last, in x', W, b, R
    ([4H,H]), the peephole ([4H]) and z_state. z_state[t] = [a_i, a_f, a_z, a_o] in that
    layout, [T,N,4H] per direction. The gradient op rebuilds h[t−1] = o[t−1] ⊙ g(c[t−1]) from
    z_state and cell_output_fwd.

Deviations and decisions
    - forget_gate_last puts the forget gate third, not last, as MPSGraph does.
    - All four gates read c[t−1] through the peephole (the output gate too).
    - cell_gradient [T,N,H] is a per-step dL/dc[t]; [N,H] or [1,N,H] is the gradient of the final
      cell only (added at the last processing step) [decision].
    - Bidirectional with a peephole: the peephole gradient is returned in its documented slot;
      MPSGraph (iOS 26.1 decompile) shifts the init_state/init_cell slots in this case.
    - A per-step mask [T,N,H] is indexed by processing step [decision].
"""

import numpy as np

from .activations import activate, derivative


def _blocks(a, desc, H):
    """Split a [..., 4H] array into its gates by name."""
    return {k: a[..., j * H:(j + 1) * H] for k, j in desc.gate_index.items()}


def _acts(desc):
    return {
        "i": desc.input_gate_activation,
        "f": desc.forget_gate_activation,
        "z": desc.cell_gate_activation,
        "o": desc.output_gate_activation,
    }


def core_forward(d, desc):
    T, N = d.x.shape[:2]
    H = d.R.shape[1]
    p = None if d.p is None else _blocks(d.p, desc, H)  # each [H]
    h = np.empty((T, N, H))  # [T,N,H]
    c = np.empty((T, N, H))  # [T,N,H]
    zs = np.empty((T, N, 4 * H))  # [T,N,4H]
    hp, cp = d.h0, d.c0  # [N,H]
    for t in range(T):
        a = d.x[t] + (hp * d.mask(t)) @ d.R.T  # [N,4H]
        blocks = _blocks(a, desc, H)  # views into a
        if p is not None:
            for k, block in blocks.items():
                block += p[k] * cp
        zs[t] = a
        g = {k: activate(act, blocks[k]) for k, act in _acts(desc).items()}
        c[t] = g["f"] * cp + g["i"] * g["z"]
        h[t] = g["o"] * activate(desc.activation, c[t])
        hp, cp = h[t], c[t]
    return h, c, zs


def core_backward(d, desc):
    T, N = d.dh_in.shape[:2]
    H = d.R.shape[1]
    p = None if d.p is None else _blocks(d.p, desc, H)  # each [H]
    acts = _acts(desc)
    dx = np.empty((T, N, 4 * H))  # [T,N,4H]
    dR = np.zeros((4 * H, H))  # [4H,H]
    dp = np.zeros(4 * H)  # [4H]
    dp_k = _blocks(dp, desc, H)
    dh_next = d.initial_dh()  # [N,H]
    dc_next = d.dc_final.copy() if d.dc_final is not None else np.zeros((N, H))  # [N,H]
    for t in range(T - 1, -1, -1):
        a = _blocks(d.zs[t], desc, H)  # pre-activations, each [N,H]
        g = {k: activate(act, a[k]) for k, act in acts.items()}
        cp = d.c_fwd[t - 1] if t > 0 else d.c0  # [N,H]
        if t > 0:
            o_prev = activate(acts["o"], _blocks(d.zs[t - 1], desc, H)["o"])
            hp = o_prev * activate(desc.activation, d.c_fwd[t - 1])  # [N,H]
        else:
            hp = d.h0
        m = d.mask(t)
        ct = d.c_fwd[t]  # [N,H]
        dh = d.dh_in[t] + dh_next
        gc = activate(desc.activation, ct)  # g(c[t]), [N,H]
        dc = dh * g["o"] * derivative(desc.activation, ct, gc) + dc_next
        if d.dc_in is not None:
            dc = dc + d.dc_in[t]
        dA = np.empty((N, 4 * H))  # [N,4H]
        da = _blocks(dA, desc, H)
        da["o"][...] = dh * gc * derivative(acts["o"], a["o"], g["o"])
        da["i"][...] = dc * g["z"] * derivative(acts["i"], a["i"], g["i"])
        da["f"][...] = dc * cp * derivative(acts["f"], a["f"], g["f"])
        da["z"][...] = dc * g["i"] * derivative(acts["z"], a["z"], g["z"])
        dR += dA.T @ (hp * m)
        dh_next = (dA @ d.R) * m
        dc_next = dc * g["f"]
        if p is not None:
            dc_next = dc_next + sum(da[k] * p[k] for k in "ifzo")
            for k in "ifzo":
                dp_k[k] += (da[k] * cp).sum(axis=0)
        dx[t] = dA
    return {"dx": dx, "dR": dR, "dh0": dh_next, "dc0": dc_next, "dp": dp}
