"""LSTM forward and gradient kernels, one direction, whole time loop compiled.

Equations: contract 2.2 and 3.3 (``rnngrad/reference/lstm.py`` is the readable version).
``gi`` [4] holds the block index of the gates i, f, z, o in the packed layout; ``acts`` [5] the
activation codes of i, f, z, o and of the cell activation g. Conventions: ``common.py``.

Per step and row block (forward): ``rec = hm @ Rᵀ`` (BLAS, [n,H]·[H,4H]); per row, the
pre-activations a = x' + b + rec (+ p ⊙ c[t−1]) overwrite rec and go to z_state, the
activations overwrite them in place, then c, g(c) (in the i block), h, and the next step's
``hm = h ⊙ m``.
Per step and row block (gradients): per row, the activations and derivatives of the four gates
and of the cell (Y, DY [N,5H], the cell in the fifth block), dA into dX and the GEMM buffer E,
dc carried, h[t−1] ⊙ m into HM; then ``gr = E @ R`` (BLAS, [n,4H]·[4H,H]), masked in the
next step. dR = Σ dXᵀ HM and dX's products with W and source are large GEMMs after the loop.
"""

import numba
import numpy as np

from .activations import JIT, activate_inplace, ZERO, activate_row, activate_row_with_derivative
from .common import block_rows, mask_at, step_index


@numba.njit(**JIT)
def _forward_rows(b, n0, n1, xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, p, has_p, acts, gi,
                  h, c, zs, out_rev, off, zoff, hm, rec, k):
    T = h.shape[0]
    H = Rt.shape[0]
    ci, cf, cz, co = gi[0] * H, gi[1] * H, gi[2] * H, gi[3] * H
    for n in range(n0, n1):
        for j in range(H):
            hm[b, n - n0, j] = h0[n, off + j] * mask_at(m, m_mode, 0, n, off + j, k)
    for s in range(T):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tp = step_index(s - 1, T, out_rev)
        np.dot(hm[b], Rt, rec[b])
        for n in range(n0, n1):
            a = rec[b, n - n0]  # [4H] becomes the pre-activations, then the activations
            x = xp[ti, n]
            zrow = zs[to, n]
            cp = c0[n] if s == 0 else c[tp, n]  # [DH] row, read at off + j
            for col in range(4 * H):
                a[col] += x[xoff + col] + bx[xoff + col]
            if has_p:
                for g in range(4):
                    for j in range(H):
                        a[g * H + j] += p[g * H + j] * cp[off + j]
            for col in range(4 * H):
                zrow[zoff + col] = a[col]
            for g in range(4):
                activate_inplace(acts[g], a, gi[g] * H, H, k)
            crow = c[to, n]
            for j in range(H):
                cn = a[cf + j] * cp[off + j] + a[ci + j] * a[cz + j]
                crow[off + j] = cn
                a[ci + j] = cn
            activate_inplace(acts[4], a, ci, H, k)
            hrow = h[to, n]
            for j in range(H):
                hrow[off + j] = a[co + j] * a[ci + j]
            if s < T - 1:
                for j in range(H):
                    hm[b, n - n0, j] = hrow[off + j] * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(parallel=True, **JIT)
def forward(xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, p, has_p, acts, gi,
            h, c, zs, out_rev, off, zoff, hm, rec, k, nblk):
    """Shapes: xp [T,N,DGH] (bias bx [DGH] added here); Rt [H,4H] = R[d]ᵀ; h0, c0 [N,DH];
    m [1 or T,N,DH]; p [4H]; outputs h, c [T,N,DH], zs [T,N,D4H]; scratch hm [N,H], rec [N,4H]."""
    N = h.shape[1]
    if nblk == 1:
        _forward_rows(0, 0, N, xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, p, has_p, acts, gi,
                      h, c, zs, out_rev, off, zoff, hm, rec, k)
        return
    for b in numba.prange(nblk):
        n0, n1 = block_rows(b, nblk, N)
        _forward_rows(b, n0, n1, xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, p, has_p, acts, gi,
                      h, c, zs, out_rev, off, zoff, hm, rec, k)


@numba.njit(**JIT)
def _backward_rows(b, n0, n1, dh_in, zs, cf, h0, c0, m, m_mode, p, has_p, dc_in, has_dc_in, R,
                   acts, gi, dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry, dc_carry, gr, E,
                   Y, DY, hp, k):
    T = dh_in.shape[0]
    H = R.shape[1]
    ci, cf_, cz, co = gi[0] * H, gi[1] * H, gi[2] * H, gi[3] * H
    for s in range(T - 1, -1, -1):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tp = step_index(s - 1, T, out_rev)
        for n in range(n0, n1):
            y, dy, e, hprev = Y[b, n - n0], DY[b, n - n0], E[b, n - n0], hp[b, n - n0]
            zrow = zs[to, n]
            for g in range(4):
                activate_row_with_derivative(acts[g], zrow, zoff + gi[g] * H, y, dy, gi[g] * H, H, k)
            # h[t−1] = o[t−1] ⊙ g(c[t−1]), rebuilt from the forward's z_state and c
            if s == 0:
                for j in range(H):
                    hprev[j] = h0[n, off + j]
                cp = c0[n]
            else:
                cp = cf[tp, n]
                activate_row(acts[3], zs[tp, n], zoff + co, hprev, 0, H, k)
                activate_row(acts[4], cp, off, e, 0, H, k)  # e as scratch, rewritten below
                for j in range(H):
                    hprev[j] *= e[j]
            ct = cf[to, n]
            activate_row_with_derivative(acts[4], ct, off, y, dy, 4 * H, H, k)  # g(c[t]), g'(c[t])
            dhrow = dh_in[to, n]
            for j in range(H):
                dh = dhrow[off + j] + dh_carry[n, j]
                if s < T - 1:
                    dh += gr[b, n - n0, j] * mask_at(m, m_mode, s + 1, n, off + j, k)
                gc, dgc = y[4 * H + j], dy[4 * H + j]
                dc = dh * y[co + j] * dgc + dc_carry[n, j]
                if has_dc_in:
                    dc += dc_in[to, n, off + j]
                # da_o goes to Y's o block (o is no longer needed) and dc to E's second block
                Y[b, n - n0, co + j] = dh * gc * dy[co + j]  # da_o (y_o is no longer needed)
                e[H + j] = dc
                dh_carry[n, j] = k[ZERO]
            for j in range(H):
                dc = e[H + j]
                da_o = y[co + j]
                da_i = dc * y[cz + j] * dy[ci + j]
                da_f = dc * cp[off + j] * dy[cf_ + j]
                da_z = dc * y[ci + j] * dy[cz + j]
                dcn = dc * y[cf_ + j]
                if has_p:
                    dcn += (da_i * p[ci + j] + da_f * p[cf_ + j] + da_z * p[cz + j]
                            + da_o * p[co + j])
                dc_carry[n, j] = dcn
                dy[ci + j] = da_i
                dy[cf_ + j] = da_f
                dy[cz + j] = da_z
                dy[co + j] = da_o
                HM[ti, n, j] = hprev[j] * mask_at(m, m_mode, s, n, off + j, k)
            xrow = dX[ti, n]
            for col in range(4 * H):
                e[col] = dy[col]
                xrow[xoff + col] = dy[col]
        np.dot(E[b], R, gr[b])
    for n in range(n0, n1):
        for j in range(H):
            dh_carry[n, j] += gr[b, n - n0, j] * mask_at(m, m_mode, 0, n, off + j, k)


@numba.njit(parallel=True, **JIT)
def backward(dh_in, zs, cf, h0, c0, m, m_mode, p, has_p, dc_in, has_dc_in, R, acts, gi,
             dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry, dc_carry, gr, E, Y, DY, hp, k,
             nblk):
    """Shapes: dh_in, cf [T,N,DH]; zs [T,N,D4H]; h0, c0 [N,DH]; R [4H,H]; outputs dX
    [T,N,DGH] and HM [T,N,H] (input time); dh_carry, dc_carry [N,H] hold the final-state
    gradients on entry and d h0, d c0 on exit; scratch gr, hp [N,H], E [N,4H], Y, DY [N,5H]."""
    N = dh_in.shape[1]
    if nblk == 1:
        _backward_rows(0, 0, N, dh_in, zs, cf, h0, c0, m, m_mode, p, has_p, dc_in, has_dc_in, R,
                       acts, gi, dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry, dc_carry, gr,
                       E, Y, DY, hp, k)
        return
    for b in numba.prange(nblk):
        n0, n1 = block_rows(b, nblk, N)
        _backward_rows(b, n0, n1, dh_in, zs, cf, h0, c0, m, m_mode, p, has_p, dc_in, has_dc_in, R,
                       acts, gi, dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry, dc_carry, gr,
                       E, Y, DY, hp, k)


@numba.njit(parallel=True, **JIT)
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
