"""GRU forward and gradient kernels, one direction, whole time loop compiled.

Equations: contract 2.2 and 3.3 (``rnngrad/reference/gru.py`` is the readable version).
``cz``/``cr`` are the column offsets of the z and r blocks (0 or H: they are the first two blocks
in both layouts), the o block is at 2H and, with reset_after, q at 3H of z_state. ``acts`` [3]
holds the activation codes of the update, reset and output gates.

reset_after: one GEMM per step, ``rec = hm @ Rᵀ`` ([N,H]·[H,3H]); q = rec_o + b2.
Otherwise two: ``rec = hm @ R_zrᵀ`` ([N,H]·[H,2H]), then the gates z, r and ``hmr = hm ⊙ r``,
then ``reco = hmr @ R_oᵀ`` ([N,H]·[H,H]), then o and h.
Gradients mirror this: reset_after one GEMM per step (``gr = E @ R`` with E = [da_z, da_r, dq]);
otherwise ``g = da_o @ R_o`` first (da_r needs it), then ``gr = [da_z, da_r] @ R_zr``.
"""

import numba
import numpy as np

from .activations import ONE, activate, activate_and_derivative
from .common import chunk, mask_at, step_index


@numba.njit(inline="always", cache=True)
def _mix(z, hp, o, flip_z, k):
    if flip_z:
        return (k[ONE] - z) * hp + z * o
    return z * hp + (k[ONE] - z) * o


# -- forward ----------------------------------------------------------------------------------

@numba.njit(cache=True)
def _forward_after_units(n, j0, j1, s, xp, ti, xoff, bx, rec, b2, hprev, m, m_mode, last, acts,
                         cz, cr, flip_z, h, zs, to, off, zoff, hm, k):
    H = hm.shape[1]
    for j in range(j0, j1):
        hp = hprev[n, off + j]
        a_z = xp[ti, n, xoff + cz + j] + bx[xoff + cz + j] + rec[n, cz + j]
        a_r = xp[ti, n, xoff + cr + j] + bx[xoff + cr + j] + rec[n, cr + j]
        q = rec[n, 2 * H + j] + b2[off + j]
        z = activate(acts[0], a_z, k)
        r = activate(acts[1], a_r, k)
        a_o = xp[ti, n, xoff + 2 * H + j] + bx[xoff + 2 * H + j] + q * r
        o = activate(acts[2], a_o, k)
        hn = _mix(z, hp, o, flip_z, k)
        zs[to, n, zoff + cz + j] = a_z
        zs[to, n, zoff + cr + j] = a_r
        zs[to, n, zoff + 2 * H + j] = a_o
        zs[to, n, zoff + 3 * H + j] = q
        h[to, n, off + j] = hn
        if not last:
            hm[n, j] = hn * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(cache=True)
def _forward_gates_units(n, j0, j1, xp, ti, xoff, bx, rec, acts, cz, cr, zs, to, zoff, hm, hmr,
                         zb, k):
    for j in range(j0, j1):
        a_z = xp[ti, n, xoff + cz + j] + bx[xoff + cz + j] + rec[n, cz + j]
        a_r = xp[ti, n, xoff + cr + j] + bx[xoff + cr + j] + rec[n, cr + j]
        zs[to, n, zoff + cz + j] = a_z
        zs[to, n, zoff + cr + j] = a_r
        zb[n, j] = activate(acts[0], a_z, k)
        hmr[n, j] = hm[n, j] * activate(acts[1], a_r, k)


@numba.njit(cache=True)
def _forward_output_units(n, j0, j1, s, xp, ti, xoff, bx, reco, hprev, m, m_mode, last, acts,
                          flip_z, h, zs, to, off, zoff, hm, zb, k):
    H = hm.shape[1]
    for j in range(j0, j1):
        a_o = xp[ti, n, xoff + 2 * H + j] + bx[xoff + 2 * H + j] + reco[n, j]
        zs[to, n, zoff + 2 * H + j] = a_o
        hn = _mix(zb[n, j], hprev[n, off + j], activate(acts[2], a_o, k), flip_z, k)
        h[to, n, off + j] = hn
        if not last:
            hm[n, j] = hn * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(parallel=True, cache=True)
def forward(xp, xoff, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, cz, cr, flip_z, reset_after,
            h, zs, out_rev, off, zoff, hm, rec, reco, hmr, zb, k, par, nchunk):
    """Shapes: xp [T,N,D3H] (bias bx added here); Rt [H,3H] = R[d]ᵀ with reset_after, else
    [H,2H] = R_zrᵀ and Rt_o [H,H] = R_oᵀ; b2 [DH]; h0 [N,DH]; m [1 or T,N,DH]; outputs
    h [T,N,DH], zs [T,N,DZH]; scratch hm, reco, hmr, zb [N,H], rec [N, Rt's columns]."""
    T, N = h.shape[0], h.shape[1]
    H = Rt.shape[0]
    for n in range(N):
        for j in range(H):
            hm[n, j] = h0[n, off + j] * mask_at(m, m_mode, 0, n, off + j, k)
    for s in range(T):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        hprev = h0 if s == 0 else h[step_index(s - 1, T, out_rev)]
        last = s == T - 1
        np.dot(hm, Rt, rec)
        if reset_after:
            if par:
                for w in numba.prange(N * nchunk):
                    n, j0, j1 = chunk(w, nchunk, H)
                    _forward_after_units(n, j0, j1, s, xp, ti, xoff, bx, rec, b2, hprev, m, m_mode,
                                         last, acts, cz, cr, flip_z, h, zs, to, off, zoff, hm, k)
            else:
                for w in range(N * nchunk):
                    n, j0, j1 = chunk(w, nchunk, H)
                    _forward_after_units(n, j0, j1, s, xp, ti, xoff, bx, rec, b2, hprev, m, m_mode,
                                         last, acts, cz, cr, flip_z, h, zs, to, off, zoff, hm, k)
            continue
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_gates_units(n, j0, j1, xp, ti, xoff, bx, rec, acts, cz, cr, zs, to, zoff,
                                     hm, hmr, zb, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_gates_units(n, j0, j1, xp, ti, xoff, bx, rec, acts, cz, cr, zs, to, zoff,
                                     hm, hmr, zb, k)
        np.dot(hmr, Rt_o, reco)
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_output_units(n, j0, j1, s, xp, ti, xoff, bx, reco, hprev, m, m_mode, last,
                                      acts, flip_z, h, zs, to, off, zoff, hm, zb, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_output_units(n, j0, j1, s, xp, ti, xoff, bx, reco, hprev, m, m_mode, last,
                                      acts, flip_z, h, zs, to, off, zoff, hm, zb, k)


# -- gradients --------------------------------------------------------------------------------

@numba.njit(inline="always", cache=True)
def _dh(n, j, s, T, dh_in, to, off, dh_carry, gr, m, m_mode, k):
    dh = dh_in[to, n, off + j] + dh_carry[n, j]
    if s < T - 1:
        dh += gr[n, j] * mask_at(m, m_mode, s + 1, n, off + j, k)
    return dh


@numba.njit(cache=True)
def _backward_after_units(n, j0, j1, s, T, dh_in, zs, hprev, m, m_mode, dh_carry, gr, acts, cz,
                          cr, flip_z, dX, ti, xoff, E, HM, DQ, to, off, zoff, k):
    H = dh_carry.shape[1]
    for j in range(j0, j1):
        z, dz = activate_and_derivative(acts[0], zs[to, n, zoff + cz + j], k)
        r, dr = activate_and_derivative(acts[1], zs[to, n, zoff + cr + j], k)
        o, do = activate_and_derivative(acts[2], zs[to, n, zoff + 2 * H + j], k)
        q = zs[to, n, zoff + 3 * H + j]
        hp = hprev[n, off + j]
        hm = hp * mask_at(m, m_mode, s, n, off + j, k)
        dh = _dh(n, j, s, T, dh_in, to, off, dh_carry, gr, m, m_mode, k)
        if flip_z:
            da_o = dh * z * do
            da_z = dh * (o - hp) * dz
            keep = k[ONE] - z
        else:
            da_o = dh * (k[ONE] - z) * do
            da_z = dh * (hp - o) * dz
            keep = z
        da_r = da_o * q * dr
        dq = da_o * r
        E[n, cz + j] = da_z
        E[n, cr + j] = da_r
        E[n, 2 * H + j] = dq
        dX[ti, n, xoff + cz + j] = da_z
        dX[ti, n, xoff + cr + j] = da_r
        dX[ti, n, xoff + 2 * H + j] = da_o
        DQ[ti, n, j] = dq
        HM[ti, n, j] = hm
        dh_carry[n, j] = dh * keep


@numba.njit(cache=True)
def _backward_update_units(n, j0, j1, s, T, dh_in, zs, hprev, m, m_mode, dh_carry, gr, acts, cz,
                           flip_z, dX, ti, xoff, E, Eo, to, off, zoff, k):
    H = dh_carry.shape[1]
    for j in range(j0, j1):
        z, dz = activate_and_derivative(acts[0], zs[to, n, zoff + cz + j], k)
        o, do = activate_and_derivative(acts[2], zs[to, n, zoff + 2 * H + j], k)
        hp = hprev[n, off + j]
        dh = _dh(n, j, s, T, dh_in, to, off, dh_carry, gr, m, m_mode, k)
        if flip_z:
            da_o = dh * z * do
            da_z = dh * (o - hp) * dz
            keep = k[ONE] - z
        else:
            da_o = dh * (k[ONE] - z) * do
            da_z = dh * (hp - o) * dz
            keep = z
        Eo[n, j] = da_o
        E[n, cz + j] = da_z
        dX[ti, n, xoff + cz + j] = da_z
        dX[ti, n, xoff + 2 * H + j] = da_o
        dh_carry[n, j] = dh * keep


@numba.njit(cache=True)
def _backward_reset_units(n, j0, j1, s, zs, hprev, m, m_mode, g, dh_carry, acts, cr, dX, ti, xoff,
                          E, HM, HMR, to, off, zoff, k):
    for j in range(j0, j1):
        r, dr = activate_and_derivative(acts[1], zs[to, n, zoff + cr + j], k)
        mm = mask_at(m, m_mode, s, n, off + j, k)
        hm = hprev[n, off + j] * mm
        da_r = g[n, j] * hm * dr
        E[n, cr + j] = da_r
        dX[ti, n, xoff + cr + j] = da_r
        dh_carry[n, j] += g[n, j] * r * mm
        HM[ti, n, j] = hm
        HMR[ti, n, j] = hm * r


@numba.njit(parallel=True, cache=True)
def backward(dh_in, zs, hf, h0, m, m_mode, R, R_o, acts, cz, cr, flip_z, reset_after, dX, xoff,
             x_rev, HM, HMR, DQ, out_rev, off, zoff, dh_carry, gr, E, Eo, g, k, par, nchunk):
    """Shapes: dh_in, hf (output_fwd) [T,N,DH]; zs [T,N,DZH]; h0 [N,DH]; R [3H,H] with
    reset_after, else R_zr [2H,H] and R_o [H,H]; outputs dX [T,N,D3H], HM, HMR, DQ [T,N,H]
    (input time); dh_carry [N,H] holds the state gradient on entry and d h0 on exit;
    scratch gr, Eo, g [N,H], E [N, R's rows]."""
    T, N = dh_in.shape[0], dh_in.shape[1]
    H = R.shape[1]
    for s in range(T - 1, -1, -1):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        hprev = h0 if s == 0 else hf[step_index(s - 1, T, out_rev)]
        if reset_after:
            if par:
                for w in numba.prange(N * nchunk):
                    n, j0, j1 = chunk(w, nchunk, H)
                    _backward_after_units(n, j0, j1, s, T, dh_in, zs, hprev, m, m_mode, dh_carry,
                                          gr, acts, cz, cr, flip_z, dX, ti, xoff, E, HM, DQ, to,
                                          off, zoff, k)
            else:
                for w in range(N * nchunk):
                    n, j0, j1 = chunk(w, nchunk, H)
                    _backward_after_units(n, j0, j1, s, T, dh_in, zs, hprev, m, m_mode, dh_carry,
                                          gr, acts, cz, cr, flip_z, dX, ti, xoff, E, HM, DQ, to,
                                          off, zoff, k)
            np.dot(E, R, gr)
            continue
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_update_units(n, j0, j1, s, T, dh_in, zs, hprev, m, m_mode, dh_carry, gr,
                                       acts, cz, flip_z, dX, ti, xoff, E, Eo, to, off, zoff, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_update_units(n, j0, j1, s, T, dh_in, zs, hprev, m, m_mode, dh_carry, gr,
                                       acts, cz, flip_z, dX, ti, xoff, E, Eo, to, off, zoff, k)
        np.dot(Eo, R_o, g)
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_reset_units(n, j0, j1, s, zs, hprev, m, m_mode, g, dh_carry, acts, cr,
                                      dX, ti, xoff, E, HM, HMR, to, off, zoff, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_reset_units(n, j0, j1, s, zs, hprev, m, m_mode, g, dh_carry, acts, cr,
                                      dX, ti, xoff, E, HM, HMR, to, off, zoff, k)
        np.dot(E, R, gr)
    for n in range(N):
        for j in range(H):
            dh_carry[n, j] += gr[n, j] * mask_at(m, m_mode, 0, n, off + j, k)
