"""GRU forward and gradient kernels, one direction, whole time loop compiled.

Equations: contract 2.2 and 3.3 (``rnngrad/reference/gru.py`` is the readable version).
Conventions: ``common.py``. ``cz``/``cr`` are the column offsets of the z and r blocks (0 or H:
they are the first two blocks in both layouts); the o block is at 2H and, with reset_after, q
at 3H of z_state. ``acts`` [3] holds the activation codes of the update, reset and output gates.

Per step and row block, forward:
  reset_after: one GEMM ``rec = hm @ Rᵀ`` ([n,H]·[H,3H]); q = rec_o + b2; then the gates and h.
  otherwise:   ``rec = hm @ R_zrᵀ`` ([n,H]·[H,2H]); z, r and ``hmr = hm ⊙ r``;
               ``reco = hmr @ R_oᵀ`` ([n,H]·[H,H]); then o and h.
Gradients mirror this: reset_after one GEMM per step (``gr = E @ R``, E = [da_z, da_r, dq]);
otherwise ``g = da_o @ R_o`` first (da_r needs it), then ``gr = [da_z, da_r] @ R_zr``.
"""

import numba
import numpy as np

from .activations import JIT, activate_inplace, ONE, activate_row, activate_row_with_derivative
from .common import block_rows, mask_at, step_index


@numba.njit(inline="always", **JIT)
def _mix(z, hp, o, flip_z, k):
    if flip_z:
        return (k[ONE] - z) * hp + z * o
    return z * hp + (k[ONE] - z) * o


@numba.njit(**JIT)
def _forward_rows(b, n0, n1, xp, xoff, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, cz, cr, flip_z,
                  reset_after, h, zs, out_rev, off, zoff, hm, rec, reco, hmr, k):
    T = h.shape[0]
    H = Rt.shape[0]
    co = 2 * H
    for n in range(n0, n1):
        for j in range(H):
            hm[b, n - n0, j] = h0[n, off + j] * mask_at(m, m_mode, 0, n, off + j, k)
    for s in range(T):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tp = step_index(s - 1, T, out_rev)
        np.dot(hm[b], Rt, rec[b])
        for n in range(n0, n1):
            a, x, zrow = rec[b, n - n0], xp[ti, n], zs[to, n]
            for j in range(2 * H):  # the z and r blocks
                v = a[j] + x[xoff + j] + bx[xoff + j]
                a[j] = v
                zrow[zoff + j] = v
            if reset_after:
                for j in range(H):
                    q = a[co + j] + b2[off + j]
                    a[co + j] = q
                    zrow[zoff + 3 * H + j] = q
            activate_inplace(acts[0], a, cz, H, k)
            activate_inplace(acts[1], a, cr, H, k)
            if not reset_after:
                for j in range(H):
                    hmr[b, n - n0, j] = hm[b, n - n0, j] * a[cr + j]
        if not reset_after:
            np.dot(hmr[b], Rt_o, reco[b])
        for n in range(n0, n1):
            a, x, zrow, hrow = rec[b, n - n0], xp[ti, n], zs[to, n], h[to, n]
            hprev = h0[n] if s == 0 else h[tp, n]
            o = reco[b, n - n0]  # [H] becomes a_o, then o
            for j in range(H):
                c = a[co + j] * a[cr + j] if reset_after else o[j]
                v = x[xoff + co + j] + bx[xoff + co + j] + c
                o[j] = v
                zrow[zoff + co + j] = v
            activate_inplace(acts[2], o, 0, H, k)
            for j in range(H):
                hrow[off + j] = _mix(a[cz + j], hprev[off + j], o[j], flip_z, k)
            if s < T - 1:
                for j in range(H):
                    hm[b, n - n0, j] = hrow[off + j] * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(parallel=True, **JIT)
def forward(xp, xoff, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, cz, cr, flip_z, reset_after,
            h, zs, out_rev, off, zoff, hm, rec, reco, hmr, k, nblk):
    """Shapes: xp [T,N,D3H] (bias bx added here); Rt [H,3H] = R[d]ᵀ with reset_after, else
    [H,2H] = R_zrᵀ and Rt_o [H,H] = R_oᵀ; b2 [DH]; h0 [N,DH]; m [1 or T,N,DH]; outputs
    h [T,N,DH], zs [T,N,DZH]; scratch hm, reco, hmr [N,H], rec [N, Rt's columns]."""
    N = h.shape[1]
    if nblk == 1:
        _forward_rows(0, 0, N, xp, xoff, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, cz, cr,
                      flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec, reco, hmr, k)
        return
    for b in numba.prange(nblk):
        n0, n1 = block_rows(b, nblk, N)
        _forward_rows(b, n0, n1, xp, xoff, bx, x_rev, Rt, Rt_o, b2, h0, m, m_mode, acts, cz, cr,
                      flip_z, reset_after, h, zs, out_rev, off, zoff, hm, rec, reco, hmr, k)


@numba.njit(**JIT)
def _backward_rows(b, n0, n1, dh_in, zs, hf, h0, m, m_mode, R, R_o, acts, cz, cr, flip_z,
                   reset_after, dX, xoff, x_rev, HM, HMR, DQ, out_rev, off, zoff, dh_carry, gr, E,
                   Eo, g, Y, DY, k):
    T = dh_in.shape[0]
    H = R.shape[1]
    co = 2 * H
    for s in range(T - 1, -1, -1):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tp = step_index(s - 1, T, out_rev)
        for n in range(n0, n1):
            y, dy, e, zrow, xrow, dhrow = Y[b, n - n0], DY[b, n - n0], E[b, n - n0], zs[to, n], dX[ti, n], dh_in[to, n]
            hprev = h0[n] if s == 0 else hf[tp, n]
            for blk in range(3):
                activate_row_with_derivative(acts[blk], zrow, zoff + (cz, cr, co)[blk], y, dy,
                                             blk * H, H, k)  # Y, DY blocks: z, r, o
            for j in range(H):
                z, dz, r, dr, o, do = y[j], dy[j], y[H + j], dy[H + j], y[co + j], dy[co + j]
                hp = hprev[off + j]
                dh = dhrow[off + j] + dh_carry[n, j]
                if s < T - 1:
                    dh += gr[b, n - n0, j] * mask_at(m, m_mode, s + 1, n, off + j, k)
                if flip_z:
                    da_o = dh * z * do
                    da_z = dh * (o - hp) * dz
                    keep = k[ONE] - z
                else:
                    da_o = dh * (k[ONE] - z) * do
                    da_z = dh * (hp - o) * dz
                    keep = z
                e[cz + j] = da_z
                xrow[xoff + cz + j] = da_z
                xrow[xoff + co + j] = da_o
                dh_carry[n, j] = dh * keep
                if reset_after:
                    q = zrow[zoff + 3 * H + j]
                    mm = mask_at(m, m_mode, s, n, off + j, k)
                    da_r = da_o * q * dr
                    dq = da_o * r
                    e[cr + j] = da_r
                    e[co + j] = dq
                    xrow[xoff + cr + j] = da_r
                    DQ[ti, n, j] = dq
                    HM[ti, n, j] = hp * mm
                else:
                    Eo[b, n - n0, j] = da_o
        if reset_after:
            np.dot(E[b], R, gr[b])
            continue
        np.dot(Eo[b], R_o, g[b])
        for n in range(n0, n1):
            y, dy, e, xrow = Y[b, n - n0], DY[b, n - n0], E[b, n - n0], dX[ti, n]
            hprev = h0[n] if s == 0 else hf[tp, n]
            for j in range(H):
                mm = mask_at(m, m_mode, s, n, off + j, k)
                hm = hprev[off + j] * mm
                r = y[H + j]
                da_r = g[b, n - n0, j] * hm * dy[H + j]
                e[cr + j] = da_r
                xrow[xoff + cr + j] = da_r
                dh_carry[n, j] += g[b, n - n0, j] * r * mm
                HM[ti, n, j] = hm
                HMR[ti, n, j] = hm * r
        np.dot(E[b], R, gr[b])
    for n in range(n0, n1):
        for j in range(H):
            dh_carry[n, j] += gr[b, n - n0, j] * mask_at(m, m_mode, 0, n, off + j, k)


@numba.njit(parallel=True, **JIT)
def backward(dh_in, zs, hf, h0, m, m_mode, R, R_o, acts, cz, cr, flip_z, reset_after, dX, xoff,
             x_rev, HM, HMR, DQ, out_rev, off, zoff, dh_carry, gr, E, Eo, g, Y, DY, k, nblk):
    """Shapes: dh_in, hf (output_fwd) [T,N,DH]; zs [T,N,DZH]; h0 [N,DH]; R [3H,H] with
    reset_after, else R_zr [2H,H] and R_o [H,H]; outputs dX [T,N,D3H], HM, HMR, DQ [T,N,H]
    (input time); dh_carry [N,H] holds the state gradient on entry and d h0 on exit;
    scratch gr, Eo, g [N,H], E [N, R's rows], Y, DY [N,3H] (blocks z, r, o)."""
    N = dh_in.shape[1]
    if nblk == 1:
        _backward_rows(0, 0, N, dh_in, zs, hf, h0, m, m_mode, R, R_o, acts, cz, cr, flip_z,
                       reset_after, dX, xoff, x_rev, HM, HMR, DQ, out_rev, off, zoff, dh_carry, gr,
                       E, Eo, g, Y, DY, k)
        return
    for b in numba.prange(nblk):
        n0, n1 = block_rows(b, nblk, N)
        _backward_rows(b, n0, n1, dh_in, zs, hf, h0, m, m_mode, R, R_o, acts, cz, cr, flip_z,
                       reset_after, dX, xoff, x_rev, HM, HMR, DQ, out_rev, off, zoff, dh_carry, gr,
                       E, Eo, g, Y, DY, k)
