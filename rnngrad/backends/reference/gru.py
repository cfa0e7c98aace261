"""GRU and GRUGradients: the NumPy reference.

Notation
    T steps, N batch, H hidden units, three gates. ``x'`` is the projected input of one
    direction in processing order (``directions.py`` applies W, b, reverse and bidirectional).
    ``m`` is the mask (ones if None), ``b2`` the secondary bias (zeros if None).

Equations (SEMANTICS.md §2.2 and §3.3), for t = 0 … T−1, ``h[−1] = init_state``:
    a_z = x'_z[t] + (h[t−1] ⊙ m) R_zᵀ        z = f_update(a_z)
    a_r = x'_r[t] + (h[t−1] ⊙ m) R_rᵀ        r = f_reset(a_r)
    reset_after = False:  c = (h[t−1] ⊙ r ⊙ m) R_oᵀ
    reset_after = True:   q = (h[t−1] ⊙ m) R_oᵀ + b2;   c = q ⊙ r
    a_o = x'_o[t] + c                         o = f_output(a_o)
    flip_z = False:  h[t] = z ⊙ h[t−1] + (1 − z) ⊙ o
    flip_z = True:   h[t] = (1 − z) ⊙ h[t−1] + z ⊙ o
    backward, t = T−1 … 0, dh = source_gradient'[t] + dh_next, hp = h[t−1]:
    flip_z = False:  da_o = dh ⊙ (1 − z) ⊙ f_output'(a_o)   da_z = dh ⊙ (hp − o) ⊙ f_update'(a_z)
                     keep = z
    flip_z = True:   da_o = dh ⊙ z ⊙ f_output'(a_o)         da_z = dh ⊙ (o − hp) ⊙ f_update'(a_z)
                     keep = 1 − z
    reset_after = False:
        e = da_o R_o;   da_r = e ⊙ hp ⊙ m ⊙ f_reset'(a_r);   dR_o += da_oᵀ (hp ⊙ r ⊙ m)
        dh_next = dh ⊙ keep + e ⊙ r ⊙ m + (da_z R_z + da_r R_r) ⊙ m
    reset_after = True:
        da_r = da_o ⊙ q ⊙ f_reset'(a_r);   dq = da_o ⊙ r
        dR_o += dqᵀ (hp ⊙ m);   db2 += Σ_n dq
        dh_next = dh ⊙ keep + (dq R_o + da_z R_z + da_r R_r) ⊙ m
    both: dR_z += da_zᵀ (hp ⊙ m);   dR_r += da_rᵀ (hp ⊙ m)

Layouts
    Gate blocks ``[z, r, o]``, or ``[r, z, o]`` with reset_gate_first, in x', W, b and R
    ([3H,H]). z_state[t] = [a_z, a_r, a_o] in that layout, then q when reset_after:
    [T,N,3H] or [T,N,4H] per direction. h[t−1] comes from output_fwd (init_state at t = 0).

Deviations and decisions
    - flip_z = False is the GRU op documentation's form, h = z ⊙ h[t−1] + (1 − z) ⊙ o (the
      convention of PyTorch, cuDNN and ONNX); MPSGraph's descriptor documentation states the
      opposite [decision]. This is the first thing to check on a Mac.
    - z_state has a fourth block q with reset_after (MPSGraph's documentation says 3H).
    - A secondary_bias given with reset_after = False is unused and gets a zero gradient.
    - The mask does not touch the h[t−1] of the final interpolation.
    - A per-step mask [T,N,H] is indexed by processing step [decision].
"""

import numpy as np

from .activations import activate, derivative


def _blocks(a, desc, H):
    """Split a [..., 3H] (or 4H) array into its gates by name; q is the fourth block."""
    out = {k: a[..., j * H:(j + 1) * H] for k, j in desc.gate_index.items()}
    if a.shape[-1] == 4 * H:
        out["q"] = a[..., 3 * H:4 * H]
    return out


def _rows(R, desc, H):
    """The [H,H] row blocks of a packed [3H,H] matrix, by gate name."""
    return {k: R[j * H:(j + 1) * H] for k, j in desc.gate_index.items()}


def core_forward(d, desc):
    T, N = d.x.shape[:2]
    H = d.R.shape[1]
    Z = 4 if desc.reset_after else 3
    R = _blocks(d.R.T, desc, H)  # R_kᵀ, each [H,H]
    b2 = d.b2 if d.b2 is not None else np.zeros(H)  # [H]
    h = np.empty((T, N, H))  # [T,N,H]
    zs = np.empty((T, N, Z * H))  # [T,N,ZH]
    hp = d.h0  # [N,H]
    for t in range(T):
        x = _blocks(d.x[t], desc, H)
        s = _blocks(zs[t], desc, H)  # views into z_state[t]
        hm = hp * d.mask(t)  # [N,H]
        s["z"][...] = x["z"] + hm @ R["z"]
        s["r"][...] = x["r"] + hm @ R["r"]
        z = activate(desc.update_gate_activation, s["z"])
        r = activate(desc.reset_gate_activation, s["r"])
        if desc.reset_after:
            s["q"][...] = hm @ R["o"] + b2
            s["o"][...] = x["o"] + s["q"] * r
        else:
            s["o"][...] = x["o"] + (hm * r) @ R["o"]
        o = activate(desc.output_gate_activation, s["o"])
        h[t] = (1 - z) * hp + z * o if desc.flip_z else z * hp + (1 - z) * o
        hp = h[t]
    return h, None, zs


def core_backward(d, desc):
    T, N = d.dh_in.shape[:2]
    H = d.R.shape[1]
    R = _rows(d.R, desc, H)  # R_k, each [H,H]
    dx = np.empty((T, N, 3 * H))  # [T,N,3H]
    dR = np.zeros((3 * H, H))  # [3H,H]
    dR_k = _rows(dR, desc, H)  # views into dR
    db2 = np.zeros(H)  # [H]
    dh_next = d.initial_dh()  # [N,H]
    for t in range(T - 1, -1, -1):
        s = _blocks(d.zs[t], desc, H)
        z = activate(desc.update_gate_activation, s["z"])  # [N,H]
        r = activate(desc.reset_gate_activation, s["r"])  # [N,H]
        o = activate(desc.output_gate_activation, s["o"])  # [N,H]
        hp = d.h_fwd[t - 1] if t > 0 else d.h0  # [N,H]
        m = d.mask(t)
        hm = hp * m  # [N,H]
        dh = d.dh_in[t] + dh_next
        da = _blocks(dx[t], desc, H)  # views into dx[t]
        if desc.flip_z:
            da["o"][...] = dh * z * derivative(desc.output_gate_activation, s["o"], o)
            da["z"][...] = dh * (o - hp) * derivative(desc.update_gate_activation, s["z"], z)
            keep = 1 - z
        else:
            da["o"][...] = dh * (1 - z) * derivative(desc.output_gate_activation, s["o"], o)
            da["z"][...] = dh * (hp - o) * derivative(desc.update_gate_activation, s["z"], z)
            keep = z
        if desc.reset_after:
            da["r"][...] = da["o"] * s["q"] * derivative(desc.reset_gate_activation, s["r"], r)
            dq = da["o"] * r  # [N,H]
            dR_k["o"] += dq.T @ hm
            db2 += dq.sum(axis=0)
            dh_next = dh * keep + (dq @ R["o"] + da["z"] @ R["z"] + da["r"] @ R["r"]) * m
        else:
            g = da["o"] @ R["o"]  # [N,H]
            da["r"][...] = g * hp * m * derivative(desc.reset_gate_activation, s["r"], r)
            dR_k["o"] += da["o"].T @ (hm * r)
            dh_next = dh * keep + g * r * m + (da["z"] @ R["z"] + da["r"] @ R["r"]) * m
        dR_k["z"] += da["z"].T @ hm
        dR_k["r"] += da["r"].T @ hm
    return {"dx": dx, "dR": dR, "dh0": dh_next, "db2": db2}
