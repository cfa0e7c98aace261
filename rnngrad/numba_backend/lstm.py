"""LSTM forward and gradient kernels, one direction, whole time loop compiled.

Equations: contract 2.2 and 3.3 (``rnngrad/reference/lstm.py`` is the readable version).
``gi`` [4] holds the block index of the gates i, f, z, o in the packed layout; ``acts`` [5] the
activation codes of i, f, z, o and of the cell activation g.

Per step (forward): ``rec = hm @ Rᵀ`` (BLAS, [N,H]·[H,4H]), then per unit the four
pre-activations, c, h, and ``hm`` = h ⊙ m of the next step, in place.
Per step (gradients): per unit dA (written to dX and to the GEMM buffer E), dc carried, and
h[t−1] ⊙ m kept in HM for the recurrent-weight gradient; then ``gr = E @ R`` (BLAS,
[N,4H]·[4H,H]), masked in the next step. dR = Σ dXᵀ HM and dX's products with W and source
are large GEMMs after the loop (``driver.py``).
"""

import numba
import numpy as np

from .activations import ONE, ZERO, activate, activate_and_derivative
from .common import chunk, mask_at, step_index


@numba.njit(cache=True)
def _forward_units(n, j0, j1, s, xp, ti, xoff, bx, rec, p, has_p, cprev, m, m_mode, last,
                   acts, gi, h, c, zs, to, off, zoff, hm, k):
    H = hm.shape[1]
    ci, cf, cz, co = gi[0] * H, gi[1] * H, gi[2] * H, gi[3] * H
    for j in range(j0, j1):
        cp = cprev[n, off + j]
        a_i = xp[ti, n, xoff + ci + j] + bx[xoff + ci + j] + rec[n, ci + j]
        a_f = xp[ti, n, xoff + cf + j] + bx[xoff + cf + j] + rec[n, cf + j]
        a_z = xp[ti, n, xoff + cz + j] + bx[xoff + cz + j] + rec[n, cz + j]
        a_o = xp[ti, n, xoff + co + j] + bx[xoff + co + j] + rec[n, co + j]
        if has_p:
            a_i += p[ci + j] * cp
            a_f += p[cf + j] * cp
            a_z += p[cz + j] * cp
            a_o += p[co + j] * cp
        zs[to, n, zoff + ci + j] = a_i
        zs[to, n, zoff + cf + j] = a_f
        zs[to, n, zoff + cz + j] = a_z
        zs[to, n, zoff + co + j] = a_o
        cn = activate(acts[1], a_f, k) * cp + activate(acts[0], a_i, k) * activate(acts[2], a_z, k)
        hn = activate(acts[3], a_o, k) * activate(acts[4], cn, k)
        c[to, n, off + j] = cn
        h[to, n, off + j] = hn
        if not last:
            hm[n, j] = hn * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(parallel=True, cache=True)
def forward(xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, p, has_p, acts, gi,
            h, c, zs, out_rev, off, zoff, hm, rec, k, par, nchunk):
    """Shapes: xp [T,N,DGH] (bias bx [DGH] added here); Rt [H,4H] = R[d]ᵀ; h0, c0 [N,DH];
    m [1 or T,N,DH]; p [4H]; outputs h, c [T,N,DH], zs [T,N,D4H]; scratch hm [N,H], rec [N,4H]."""
    T, N = h.shape[0], h.shape[1]
    H = Rt.shape[0]
    for n in range(N):
        for j in range(H):
            hm[n, j] = h0[n, off + j] * mask_at(m, m_mode, 0, n, off + j, k)
    for s in range(T):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        cprev = c0 if s == 0 else c[step_index(s - 1, T, out_rev)]
        last = s == T - 1
        np.dot(hm, Rt, rec)
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_units(n, j0, j1, s, xp, ti, xoff, bx, rec, p, has_p, cprev, m, m_mode,
                               last, acts, gi, h, c, zs, to, off, zoff, hm, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_units(n, j0, j1, s, xp, ti, xoff, bx, rec, p, has_p, cprev, m, m_mode,
                               last, acts, gi, h, c, zs, to, off, zoff, hm, k)


@numba.njit(cache=True)
def _backward_units(n, j0, j1, s, T, dh_in, zs, cf, tprev, h0, c0, m, m_mode, p, has_p,
                    dc_in, has_dc_in, dh_carry, dc_carry, gr, acts, gi, dX, ti, xoff, E, HM,
                    to, off, zoff, k):
    H = dh_carry.shape[1]
    ci, cfg, cz, co = gi[0] * H, gi[1] * H, gi[2] * H, gi[3] * H
    for j in range(j0, j1):
        i, di = activate_and_derivative(acts[0], zs[to, n, zoff + ci + j], k)
        f, df = activate_and_derivative(acts[1], zs[to, n, zoff + cfg + j], k)
        z, dz = activate_and_derivative(acts[2], zs[to, n, zoff + cz + j], k)
        o, do = activate_and_derivative(acts[3], zs[to, n, zoff + co + j], k)
        gc, dgc = activate_and_derivative(acts[4], cf[to, n, off + j], k)
        if s == 0:
            cp = c0[n, off + j]
            hp = h0[n, off + j]
        else:
            cp = cf[tprev, n, off + j]
            hp = activate(acts[3], zs[tprev, n, zoff + co + j], k) * activate(acts[4], cp, k)
        dh = dh_in[to, n, off + j] + dh_carry[n, j]
        if s < T - 1:
            dh += gr[n, j] * mask_at(m, m_mode, s + 1, n, off + j, k)
        dc = dh * o * dgc + dc_carry[n, j]
        if has_dc_in:
            dc += dc_in[to, n, off + j]
        da_o = dh * gc * do
        da_i = dc * z * di
        da_f = dc * cp * df
        da_z = dc * i * dz
        E[n, ci + j] = da_i
        E[n, cfg + j] = da_f
        E[n, cz + j] = da_z
        E[n, co + j] = da_o
        dX[ti, n, xoff + ci + j] = da_i
        dX[ti, n, xoff + cfg + j] = da_f
        dX[ti, n, xoff + cz + j] = da_z
        dX[ti, n, xoff + co + j] = da_o
        dcn = dc * f
        if has_p:
            dcn += da_i * p[ci + j] + da_f * p[cfg + j] + da_z * p[cz + j] + da_o * p[co + j]
        dc_carry[n, j] = dcn
        dh_carry[n, j] = k[ZERO]
        HM[ti, n, j] = hp * mask_at(m, m_mode, s, n, off + j, k)


@numba.njit(parallel=True, cache=True)
def backward(dh_in, zs, cf, h0, c0, m, m_mode, p, has_p, dc_in, has_dc_in, R, acts, gi,
             dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry, dc_carry, gr, E, k, par, nchunk):
    """Shapes: dh_in, cf [T,N,DH]; zs [T,N,D4H]; h0, c0 [N,DH]; R [4H,H]; outputs dX
    [T,N,DG H] (input time), HM [T,N,H] (input time); carries dh_carry, dc_carry [N,H] hold the
    final-state gradients on entry and d h0, d c0 (before masking of the last GEMM) on exit;
    gr [N,H] the last GEMM's result; E [N,4H] scratch."""
    T, N = dh_in.shape[0], dh_in.shape[1]
    H = R.shape[1]
    for s in range(T - 1, -1, -1):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tprev = step_index(s - 1, T, out_rev)
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_units(n, j0, j1, s, T, dh_in, zs, cf, tprev, h0, c0, m, m_mode, p,
                                has_p, dc_in, has_dc_in, dh_carry, dc_carry, gr, acts, gi, dX,
                                ti, xoff, E, HM, to, off, zoff, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_units(n, j0, j1, s, T, dh_in, zs, cf, tprev, h0, c0, m, m_mode, p,
                                has_p, dc_in, has_dc_in, dh_carry, dc_carry, gr, acts, gi, dX,
                                ti, xoff, E, HM, to, off, zoff, k)
        np.dot(E, R, gr)
    # d h0 = (dA[0] R) ⊙ m[0]
    for n in range(N):
        for j in range(H):
            dh_carry[n, j] += gr[n, j] * mask_at(m, m_mode, 0, n, off + j, k)


@numba.njit(parallel=True, cache=True)
def peephole_gradient(dX, xoff, x_rev, cf, c0, out_rev, off, gi, dp):
    """dp_g += Σ_t Σ_n dA_g ⊙ c[t−1] for one direction; dp [4H] accumulated in place."""
    T, N = dX.shape[0], dX.shape[1]
    H = dp.shape[0] // 4
    for j in numba.prange(H):
        for s in range(T):
            ti = step_index(s, T, x_rev)
            for n in range(N):
                cp = c0[n, off + j] if s == 0 else cf[step_index(s - 1, T, out_rev), n, off + j]
                for g in range(4):
                    col = gi[g] * H + j
                    dp[col] += dX[ti, n, xoff + col] * cp
