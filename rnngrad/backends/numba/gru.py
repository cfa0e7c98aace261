"""GRU forward and gradient kernels, one direction, whole time loop compiled.

Equations: SEMANTICS.md §2.2 and §3.3 (``rnngrad/backends/reference/gru.py`` is the readable
version).
Conventions (parts of the hidden units, double buffers, row views): ``common.py``. ``bz``/``br``
are the block indices of the z and r gates (0 or 1: they are the first two blocks in both
layouts); the o block is 2 and, with reset_after, q is block 3 of z_state. ``acts`` [3] holds
the activation codes of the update, reset and output gates.

Per step and part, forward:
  reset_after: one GEMM ``rec = hm @ Rtₚ`` ([N,H]·[H,3hc]); q = rec_o + b2; then the gates and h.
  otherwise:   ``rec = hm @ Rt_zrₚ`` ([N,H]·[H,2hc]); z, r and ``hmr = hm ⊙ r``; the parts meet;
               ``reco = hmr @ Rt_oₚ`` ([N,H]·[H,hc]); then o and h (two parallel regions a step).
Gradients mirror this: reset_after one GEMM per step (``gr = E @ Rₚ``, E = [da_z, da_r, dq]);
otherwise ``g = da_o @ R_oₚ`` after the parts meet (da_r needs it), then ``gr = [da_z, da_r]
@ R_zrₚ`` at the start of the next step.
"""

import numba
import numpy as np

from .activations import JIT, activate, activate_with_derivative
from .common import (ONE_I, ZERO_I, add_input_weight_gradient, add_pre_activation,
                     add_weight_gradient, as_part, copy, direction, dot, mask_row, multiply,
                     part_units, project, step_index, through_first_product, transposed, unowned)


@numba.njit(inline="always", **JIT)
def _mix(z, hp, o, flip_z, one, out):
    """h = z ⊙ h[t−1] + (1 − z) ⊙ o, or with z and 1 − z exchanged (flip_z)."""
    if flip_z:
        for j in range(out.shape[0]):
            out[j] = (one - z[j]) * hp[j] + z[j] * o[j]
    else:
        for j in range(out.shape[0]):
            out[j] = z[j] * hp[j] + (one - z[j]) * o[j]


@numba.njit(**JIT)
def _forward_gates(k, p, P, n0, n1, s, xp, xoff, bx, x_rev, Rt, b2, m, m_mode, acts, bz, br,
                   reset_after, zs, out_rev, off, zoff, hm, rec, hmr, Zb, ones):
    """The z and r gates of the part's units and rows n0 … n1−1 (and q with reset_after): z
    into Zb [·,N,hc]; r into the o block of rec with reset_after, else hmr = hm ⊙ r for the
    second GEMM. k: the part's slot in the packed weights and the scratch arrays."""
    T = zs.shape[0]
    H = hm.shape[2]
    hc = Zb.shape[2]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to = step_index(s, T, x_rev), step_index(s, T, out_rev)
    cur = hm[s % 2]
    dot(cur[n0:n1], Rt[k], rec[k, n0:n1])  # [n1−n0,3hc] or [n1−n0,2hc]
    for n in range(n0, n1):
        a, xrow, zrow = rec[k, n], xp[ti, n], zs[to, n]
        for blk in range(2):  # the z and r blocks
            ab = a[blk * hc:blk * hc + w]
            col = blk * H + j0
            xb, bb = xrow[xoff + col:xoff + col + w], bx[xoff + col:xoff + col + w]
            zb = zrow[zoff + col:zoff + col + w]
            add_pre_activation(ab, xb, bb, zb)
        if reset_after:
            aq, bq = a[2 * hc:2 * hc + w], b2[off + j0:off + j1]
            zq = zrow[zoff + 3 * H + j0:zoff + 3 * H + j1]
            for j in range(w):
                v = aq[j] + bq[j]
                aq[j] = v
                zq[j] = v
        activate(acts[0], a[bz * hc:bz * hc + w], Zb[k, n, :w])
        if reset_after:
            # r ⊙ q into the z block of rec (its pre-activation is in z_state already)
            r = a[bz * hc:bz * hc + w]
            activate(acts[1], a[br * hc:br * hc + w], r)
            aq = a[2 * hc:2 * hc + w]
            for j in range(w):
                r[j] *= aq[j]
        else:
            r = a[bz * hc:bz * hc + w]
            activate(acts[1], a[br * hc:br * hc + w], r)
            multiply(cur[n, j0:j1], r, hmr[n, j0:j1])


@numba.njit(**JIT)
def _forward_output(k, p, P, n0, n1, s, xp, xoff, bx, x_rev, Rt_o, h0, m, m_mode, acts, bz,
                    flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec, hmr, reco, Zb, Y, ones):
    """The o gate and h of the part's units and rows n0 … n1−1; without reset_after after
    ``reco = hmr @ Rt_oₚ``."""
    T, H = zs.shape[0], hm.shape[2]
    hc = Zb.shape[2]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to, tp = step_index(s, T, x_rev), step_index(s, T, out_rev), step_index(s - 1, T, out_rev)
    if not reset_after:
        dot(hmr[n0:n1], Rt_o[k], reco[k, n0:n1])  # [n1−n0,hc]
    nxt = hm[(s + 1) % 2]
    y = Y[k]
    ao, o = y[0:w], y[hc:hc + w]
    one = ones[0]
    for n in range(n0, n1):
        xrow, zrow = xp[ti, n], zs[to, n]
        col = 2 * H + j0
        xb, bb = xrow[xoff + col:xoff + col + w], bx[xoff + col:xoff + col + w]
        zb = zrow[zoff + col:zoff + col + w]
        rq = rec[k, n, bz * hc:bz * hc + w] if reset_after else reco[k, n, :w]
        for j in range(w):
            v = xb[j] + bb[j] + rq[j]
            ao[j] = v
            zb[j] = v
        activate(acts[2], ao, o)
        hprev = (h0[n] if s == 0 else h[tp, n])[off + j0:off + j1]
        hrow = h[to, n, off + j0:off + j1]
        _mix(Zb[k, n, :w], hprev, o, flip_z, one, hrow)
        if s < T - 1:
            multiply(hrow, mask_row(m, m_mode, s + 1, n, off + j0, w, ones), nxt[n, j0:j1])


@numba.njit(parallel=True, **JIT)
def forward(xp, xoff, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, bz, br, flip_z, reset_after,
            h, zs, out_rev, off, zoff, hm, rec, hmr, reco, Zb, Y, ones, s0, s1, Q):
    """Shapes: xp [T,N,D3H] (bias bx added here); Rt [P,S] = the parts' columns of R[d]ᵀ
    ([H,3hc] each) with reset_after, else of R_zrᵀ ([H,2hc]) and Rt_o [P,S] of R_oᵀ ([H,hc]),
    or with Q row parts all of those columns for each ([Q,S]), prepared by
    ``blas.pack_parts``; b2 [DH]; h0 [N,DH]; m [1 or T,N,DH]; outputs h [T,N,DH],
    zs [T,N,DZH]; scratch hm [2,N,H], rec [P or Q,N,·], hmr [N,H], reco [P or Q,N,hc],
    Zb [P or Q,N,hc], Y [P or Q,2hc]; ones [H]."""
    # borrowed views (no reference counting on the views taken per row and step)
    xp, bx, Rt, Rt_o, b2 = unowned(xp), unowned(bx), unowned(Rt), unowned(Rt_o), unowned(b2)
    h0, m, acts = unowned(h0), unowned(m), unowned(acts)
    h, zs, hm, rec, hmr = unowned(h), unowned(zs), unowned(hm), unowned(rec), unowned(hmr)
    reco, Zb, Y, ones = unowned(reco), unowned(Zb), unowned(Y), unowned(ones)
    N = h.shape[1]
    P, H = Rt.shape[0], hm.shape[2]
    if s0 == 0:
        for n in range(N):
            multiply(h0[n, off:off + H], mask_row(m, m_mode, 0, n, off, H, ones), hm[0, n])
    if Q > 1:  # row parts: each runs its batch rows through every step, no meeting
        for q in numba.prange(Q):
            k = np.int64(q)
            n0, n1 = part_units(q, Q, N)
            for s in range(s0, s1):
                _forward_gates(k, ZERO_I, ONE_I, n0, n1, s, xp, xoff, bx, x_rev, Rt, b2, m, m_mode, acts,
                               bz, br, reset_after, zs, out_rev, off, zoff, hm, rec, hmr, Zb, ones)
                _forward_output(k, ZERO_I, ONE_I, n0, n1, s, xp, xoff, bx, x_rev, Rt_o, h0, m, m_mode,
                                acts, bz, flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec,
                                hmr, reco, Zb, Y, ones)
        return
    for s in range(s0, s1):
        if P == 1:
            _forward_gates(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, b2, m, m_mode, acts,
                           bz, br, reset_after, zs, out_rev, off, zoff, hm, rec, hmr, Zb, ones)
            _forward_output(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt_o, h0, m, m_mode,
                            acts, bz, flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec, hmr,
                            reco, Zb, Y, ones)
        elif reset_after:
            for p in numba.prange(P):
                k = np.int64(p)
                _forward_gates(k, k, P, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, b2, m, m_mode, acts, bz,
                               br, reset_after, zs, out_rev, off, zoff, hm, rec, hmr, Zb, ones)
                _forward_output(k, k, P, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt_o, h0, m, m_mode, acts,
                                bz, flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec, hmr,
                                reco, Zb, Y, ones)
        else:
            for p in numba.prange(P):
                k = np.int64(p)
                _forward_gates(k, k, P, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, b2, m, m_mode, acts, bz,
                               br, reset_after, zs, out_rev, off, zoff, hm, rec, hmr, Zb, ones)
            for p in numba.prange(P):
                k = np.int64(p)
                _forward_output(k, k, P, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt_o, h0, m, m_mode, acts,
                                bz, flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec, hmr,
                                reco, Zb, Y, ones)


@numba.njit(**JIT)
def _backward_main(k, p, P, n0, n1, s, dh_in, zs, hf, h0, m, m_mode, R, acts, bz, br, flip_z,
                   reset_after, dX, xoff, x_rev, HM, DQ, out_rev, off, zoff, dh_carry, E, Eo, gr,
                   Rb, Y, ones):
    """dh, da_z, da_o and the carried dh of the part's units; with reset_after also da_r and
    dq, else da_o into Eo [N,H] and r, r' into Rb [P or Q,2,N,hc] for :func:`_backward_reset`."""
    T = dh_in.shape[0]
    H, hc = dh_carry.shape[1], gr.shape[2]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to, tp = step_index(s, T, x_rev), step_index(s, T, out_rev), step_index(s - 1, T, out_rev)
    last = s == T - 1
    if not last:
        dot(E[(s + 1) % 2, n0:n1], R[k], gr[k, n0:n1])  # [n1−n0,hc]
    e = E[s % 2]
    y = Y[k]  # [7hc] row scratch
    yz, yr, yo = y[0:w], y[hc:hc + w], y[2 * hc:2 * hc + w]
    dz, dr, do = y[3 * hc:3 * hc + w], y[4 * hc:4 * hc + w], y[5 * hc:5 * hc + w]
    dh = y[6 * hc:6 * hc + w]
    one = ones[0]
    for n in range(n0, n1):
        zrow = zs[to, n]
        for g in range(3):
            blk = bz if g == 0 else (br if g == 1 else 2)
            src = zrow[zoff + blk * H + j0:zoff + blk * H + j1]
            activate_with_derivative(acts[g], src, y[g * hc:g * hc + w], y[(3 + g) * hc:(3 + g) * hc + w])
        hprev = (h0[n] if s == 0 else hf[tp, n])[off + j0:off + j1]
        dhin, carry = dh_in[to, n, off + j0:off + j1], dh_carry[n, j0:j1]
        if last:
            for j in range(w):
                dh[j] = dhin[j] + carry[j]
        else:
            grr, mr = gr[k, n, :w], mask_row(m, m_mode, s + 1, n, off + j0, w, ones)
            for j in range(w):
                dh[j] = dhin[j] + carry[j] + grr[j] * mr[j]
        if flip_z:
            for j in range(w):
                do[j] *= dh[j] * yz[j]  # da_o
            for j in range(w):
                dz[j] *= dh[j] * (yo[j] - hprev[j])  # da_z
            for j in range(w):
                carry[j] = dh[j] * (one - yz[j])
        else:
            for j in range(w):
                do[j] *= dh[j] * (one - yz[j])
            for j in range(w):
                dz[j] *= dh[j] * (hprev[j] - yo[j])
            for j in range(w):
                carry[j] = dh[j] * yz[j]
        xrow, erow = dX[ti, n], e[n]
        copy(dz, xrow[xoff + bz * H + j0:xoff + bz * H + j1])
        copy(dz, erow[bz * H + j0:bz * H + j1])
        copy(do, xrow[xoff + 2 * H + j0:xoff + 2 * H + j1])
        mr = mask_row(m, m_mode, s, n, off + j0, w, ones)
        hmv = HM[ti, n, j0:j1]
        multiply(hprev, mr, hmv)
        if reset_after:
            q = zrow[zoff + 3 * H + j0:zoff + 3 * H + j1]
            for j in range(w):
                dr[j] *= do[j] * q[j]  # da_r
            dq = DQ[ti, n, j0:j1]
            multiply(do, yr, dq)
            copy(dr, xrow[xoff + br * H + j0:xoff + br * H + j1])
            copy(dr, erow[br * H + j0:br * H + j1])
            copy(dq, erow[2 * H + j0:2 * H + j1])
        else:
            copy(do, Eo[n, j0:j1])
            copy(yr, Rb[k, 0, n, :w])
            copy(dr, Rb[k, 1, n, :w])


@numba.njit(**JIT)
def _backward_reset(k, p, P, n0, n1, s, m, m_mode, R_o, br, dX, xoff, x_rev, HM, HMR, out_rev,
                    off, dh_carry, E, Eo, g, Rb, ones):
    """Without reset_after: ``g = da_o R_o`` (own units), then da_r = g ⊙ (h[t−1] ⊙ m) ⊙ r'
    and the carried dh += g ⊙ r ⊙ m."""
    T, H = dX.shape[0], dh_carry.shape[1]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti = step_index(s, T, x_rev)
    dot(Eo[n0:n1], R_o[k], g[k, n0:n1])  # [n1−n0,hc]
    e = E[s % 2]
    for n in range(n0, n1):
        gg, r, dr = g[k, n, :w], Rb[k, 0, n, :w], Rb[k, 1, n, :w]
        hmv, mr, carry = HM[ti, n, j0:j1], mask_row(m, m_mode, s, n, off + j0, w, ones), \
            dh_carry[n, j0:j1]
        for j in range(w):
            dr[j] *= gg[j] * hmv[j]  # da_r
        for j in range(w):
            carry[j] += gg[j] * r[j] * mr[j]
        multiply(hmv, r, HMR[ti, n, j0:j1])
        copy(dr, dX[ti, n, xoff + br * H + j0:xoff + br * H + j1])
        copy(dr, e[n, br * H + j0:br * H + j1])


@numba.njit(parallel=True, **JIT)
def backward(dh_in, zs, hf, h0, m, m_mode, R, R_o, acts, bz, br, flip_z, reset_after, dX, xoff,
             x_rev, HM, HMR, DQ, out_rev, off, zoff, dh_carry, E, Eo, gr, g, Rb, Y, ones,
             s0, s1, Q):
    """Shapes: dh_in, hf (output_fwd) [T,N,DH]; zs [T,N,DZH]; h0 [N,DH]; R [P,S] = the
    parts' columns of R[d] ([3H,hc] each) with reset_after, else of R_zr ([2H,hc]) and R_o
    [P,S] of R_o ([H,hc]), or with Q row parts all of them for each ([Q,S]), prepared by
    ``blas.pack_parts``; outputs dX [T,N,D3H], HM, HMR, DQ [T,N,H] (input time); dh_carry
    [N,H] holds the state gradient on entry and the part of d h0 that bypasses R on exit (the
    driver adds (E[0] R) ⊙ m[0]); scratch E [2,N,R's rows], Eo [N,H], gr, g [P or Q,N,hc],
    Rb [P or Q,2,N,hc], Y [P or Q,7hc]; ones [H]."""
    # borrowed views (no reference counting on the views taken per row and step)
    dh_in, zs, hf, h0, m = unowned(dh_in), unowned(zs), unowned(hf), unowned(h0), unowned(m)
    R, R_o, acts = unowned(R), unowned(R_o), unowned(acts)
    dX, HM, HMR, DQ = unowned(dX), unowned(HM), unowned(HMR), unowned(DQ)
    dh_carry, E, Eo, gr, g = unowned(dh_carry), unowned(E), unowned(Eo), unowned(gr), unowned(g)
    Rb, Y, ones = unowned(Rb), unowned(Y), unowned(ones)
    N, P = dh_in.shape[1], R.shape[0]
    if Q > 1:  # row parts: each runs its batch rows through every step, no meeting
        for q in numba.prange(Q):
            k = np.int64(q)
            n0, n1 = part_units(q, Q, N)
            for s in range(s1 - 1, s0 - 1, -1):
                _backward_main(k, ZERO_I, ONE_I, n0, n1, s, dh_in, zs, hf, h0, m, m_mode, R, acts, bz,
                               br, flip_z, reset_after, dX, xoff, x_rev, HM, DQ, out_rev, off, zoff,
                               dh_carry, E, Eo, gr, Rb, Y, ones)
                if not reset_after:
                    _backward_reset(k, ZERO_I, ONE_I, n0, n1, s, m, m_mode, R_o, br, dX, xoff, x_rev,
                                    HM, HMR, out_rev, off, dh_carry, E, Eo, g, Rb, ones)
        return
    for s in range(s1 - 1, s0 - 1, -1):
        if P == 1:
            _backward_main(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, dh_in, zs, hf, h0, m, m_mode, R, acts,
                           bz, br, flip_z, reset_after, dX, xoff, x_rev, HM, DQ, out_rev, off, zoff,
                           dh_carry, E, Eo, gr, Rb, Y, ones)
            if not reset_after:
                _backward_reset(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, m, m_mode, R_o, br, dX, xoff,
                                x_rev, HM, HMR, out_rev, off, dh_carry, E, Eo, g, Rb, ones)
        else:
            for p in numba.prange(P):
                k = np.int64(p)
                _backward_main(k, k, P, ZERO_I, N, s, dh_in, zs, hf, h0, m, m_mode, R, acts, bz, br,
                               flip_z, reset_after, dX, xoff, x_rev, HM, DQ, out_rev, off, zoff,
                               dh_carry, E, Eo, gr, Rb, Y, ones)
            if not reset_after:
                for p in numba.prange(P):
                    k = np.int64(p)
                    _backward_reset(k, k, P, ZERO_I, N, s, m, m_mode, R_o, br, dX, xoff, x_rev, HM,
                                    HMR, out_rev, off, dh_carry, E, Eo, g, Rb, ones)


@numba.njit(**JIT)
def forward_op(source, W, has_w, bx, R, b2, h0, m, m_mode, acts, bz, br, flip_z, reset_after,
               reverse, h, zs):
    """The whole forward op in one call on the calling thread (``driver.in_one_call``): the
    projection, then each direction's :func:`forward` with all of R[d]ᵀ (reset_after), or of
    R_zrᵀ and R_oᵀ, unpacked. Shapes as for :func:`forward`, and source [T,N,I] with W [D3H,I]
    (has_w) or [T,N,D3H]; R [D,3H,H]."""
    T, N = h.shape[0], h.shape[1]
    D, H = R.shape[0], R.shape[2]
    Z = 4 if reset_after else 3
    xp = project(source, W, has_w, D * 3 * H)  # [T,N,D3H]
    hm, hmr = np.zeros((2, N, H), h.dtype), np.zeros((N, H), h.dtype)  # [2,N,H], [N,H]
    rec = np.zeros((1, N, (3 if reset_after else 2) * H), h.dtype)  # [1,N,3H] or [1,N,2H]
    reco, Zb = np.zeros((1, N, H), h.dtype), np.zeros((1, N, H), h.dtype)  # [1,N,H]
    Y, ones = np.zeros((1, 2 * H), h.dtype), np.ones(H, h.dtype)  # [1,2H], [H]
    for d in range(D):
        x_rev, out_rev = direction(d, D, reverse)
        if reset_after:
            Rt, Rt_o = transposed(R[d]), np.zeros((1, 1), h.dtype)
        else:
            Rt, Rt_o = transposed(R[d, :2 * H]), transposed(R[d, 2 * H:])
        forward(xp, d * 3 * H, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, bz, br, flip_z,
                reset_after, h, zs, out_rev, d * H, d * Z * H, hm, rec, hmr, reco, Zb, Y, ones,
                ZERO_I, T, ONE_I)


@numba.njit(**JIT)
def gradient_op(source, has_w, R, dh_in, zs, hf, h0, m, m_mode, acts, bz, br, flip_z,
                reset_after, reverse, dX, dR, dW, dh0, db2):
    """The whole gradient op but the source's and the bias's gradients in one call on the
    calling thread (``driver.in_one_call``): each direction's :func:`backward` with all of R[d]
    (reset_after), or of R_zr and R_o, unpacked, then its dR, dW, d h0 and (reset_after) the
    secondary bias's gradient. Shapes as for :func:`backward`, and source [T,N,I] (has_w);
    R [D,3H,H]; outputs dX [T,N,D3H], dR [D,3H,H], dW [D3H,I] (accumulated), dh0 [N,DH] (the
    final-state gradient on entry), db2 [DH]."""
    T, N = dX.shape[0], dX.shape[1]
    D, H = R.shape[0], R.shape[2]
    ra = reset_after
    Z = 4 if ra else 3
    HM = np.empty((T, N, H), dX.dtype)  # [T,N,H] h[t−1] ⊙ m, input time
    steps = (T, N, H)  # [T,N,H] where used, else a [1,1,1] stand-in
    HMR = np.empty(steps if not ra else (1, 1, 1), dX.dtype)  # h[t−1] ⊙ r ⊙ m
    DQ = np.empty(steps if ra else (1, 1, 1), dX.dtype)  # dq
    E = np.zeros((2, N, (3 if ra else 2) * H), dX.dtype)  # [2,N,3H] or [2,N,2H]
    Eo = np.zeros((N, H), dX.dtype)  # [N,H] da_o
    gr, g = np.zeros((1, N, H), dX.dtype), np.zeros((1, N, H), dX.dtype)  # [1,N,H]
    Rb, Y = np.zeros((1, 2, N, H), dX.dtype), np.zeros((1, 7 * H), dX.dtype)  # [1,2,N,H], [1,7H]
    ones = np.ones(H, dX.dtype)  # [H]
    for d in range(D):
        base = d * 3 * H
        x_rev, out_rev = direction(d, D, reverse)
        carry = dh0[:, d * H:(d + 1) * H].copy()  # [N,H]
        if ra:
            R_main, R_o = as_part(R[d]), np.zeros((1, 1), dX.dtype)
        else:
            R_main, R_o = as_part(R[d, :2 * H]), as_part(R[d, 2 * H:])
        backward(dh_in, zs, hf, h0, m, m_mode, R_main, R_o, acts, bz, br, flip_z, ra, dX, base,
                 x_rev, HM, HMR, DQ, out_rev, d * H, d * Z * H, carry, E, Eo, gr, g, Rb, Y, ones,
                 ZERO_I, T, ONE_I)
        add_weight_gradient(dX, base, base + 2 * H, HM, dR[d, :2 * H])
        if ra:
            add_weight_gradient(DQ, 0, H, HM, dR[d, 2 * H:])
            rows = DQ.reshape((T * N, H))
            for r in range(T * N):
                for j in range(H):
                    db2[d * H + j] += rows[r, j]
        else:
            add_weight_gradient(dX, base + 2 * H, base + 3 * H, HMR, dR[d, 2 * H:])
        add_input_weight_gradient(dX, base, base + 3 * H, source, has_w, dW)
        out = dh0[:, d * H:(d + 1) * H]
        through_first_product(E[0], R[d] if ra else R[d, :2 * H], m, m_mode, d * H, out)
        for n in range(N):
            for j in range(H):
                out[n, j] += carry[n, j]
