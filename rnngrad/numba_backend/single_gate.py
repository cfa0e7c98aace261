"""singleGateRNN forward and gradient kernels, one direction, whole time loop compiled.

Equations: contract 2.2 and 3.3 (``rnngrad/reference/single_gate.py`` is the readable version).
Conventions: ``common.py``. Per step and row block (forward): ``rec = hm @ Rᵀ`` (BLAS), then per
row a = x' + b + rec (to z_state), h = f(a), and the next step's ``hm = h ⊙ m``.
Per step and row block (gradients): per row f'(a), da = dh ⊙ f'(a) into dX and the GEMM buffer
E, h[t−1] ⊙ m into HM (h[t−1] = f(z_state[t−1]) is rebuilt), then ``gr = E @ R`` (BLAS).
"""

import numba
import numpy as np

from .activations import JIT, activate_inplace, ZERO, activate_row, activate_row_with_derivative
from .common import block_rows, mask_at, step_index


@numba.njit(**JIT)
def _forward_rows(b, n0, n1, xp, xoff, bx, x_rev, Rt, h0, m, m_mode, act, h, zs, out_rev, off, hm,
                  rec, k):
    T = h.shape[0]
    H = Rt.shape[0]
    for n in range(n0, n1):
        for j in range(H):
            hm[b, n - n0, j] = h0[n, off + j] * mask_at(m, m_mode, 0, n, off + j, k)
    for s in range(T):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        np.dot(hm[b], Rt, rec[b])
        for n in range(n0, n1):
            a, x, zrow, hrow = rec[b, n - n0], xp[ti, n], zs[to, n], h[to, n]
            for j in range(H):
                v = a[j] + x[xoff + j] + bx[xoff + j]
                a[j] = v
                zrow[off + j] = v
            activate_row(act, a, 0, hrow, off, H, k)
            if s < T - 1:
                for j in range(H):
                    hm[b, n - n0, j] = hrow[off + j] * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(parallel=True, **JIT)
def forward(xp, xoff, bx, x_rev, Rt, h0, m, m_mode, act, h, zs, out_rev, off, hm, rec, k, nblk):
    """Shapes: xp [T,N,DH] (bias bx [DH] added here); Rt [H,H] = R[d]ᵀ; h0 [N,DH];
    m [1 or T,N,DH]; outputs h, zs [T,N,DH]; scratch hm, rec [N,H]."""
    N = h.shape[1]
    if nblk == 1:
        _forward_rows(0, 0, N, xp, xoff, bx, x_rev, Rt, h0, m, m_mode, act, h, zs, out_rev, off, hm,
                      rec, k)
        return
    for b in numba.prange(nblk):
        n0, n1 = block_rows(b, nblk, N)
        _forward_rows(b, n0, n1, xp, xoff, bx, x_rev, Rt, h0, m, m_mode, act, h, zs, out_rev, off,
                      hm, rec, k)


@numba.njit(**JIT)
def _backward_rows(b, n0, n1, dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM, out_rev, off,
                   dh_carry, gr, E, DY, hp, k):
    T = dh_in.shape[0]
    H = R.shape[1]
    for s in range(T - 1, -1, -1):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tp = step_index(s - 1, T, out_rev)
        for n in range(n0, n1):
            e, dy, hprev = E[b, n - n0], DY[b, n - n0], hp[b, n - n0]
            activate_row_with_derivative(act, zs[to, n], off, e, dy, 0, H, k)  # e: scratch
            if s == 0:
                for j in range(H):
                    hprev[j] = h0[n, off + j]
            else:
                activate_row(act, zs[tp, n], off, hprev, 0, H, k)
            dhrow, xrow = dh_in[to, n], dX[ti, n]
            for j in range(H):
                dh = dhrow[off + j] + dh_carry[n, j]
                if s < T - 1:
                    dh += gr[b, n - n0, j] * mask_at(m, m_mode, s + 1, n, off + j, k)
                da = dh * dy[j]
                e[j] = da
                xrow[xoff + j] = da
                dh_carry[n, j] = k[ZERO]  # all of the next dh comes through the GEMM
                HM[ti, n, j] = hprev[j] * mask_at(m, m_mode, s, n, off + j, k)
        np.dot(E[b], R, gr[b])
    for n in range(n0, n1):
        for j in range(H):
            dh_carry[n, j] += gr[b, n - n0, j] * mask_at(m, m_mode, 0, n, off + j, k)


@numba.njit(parallel=True, **JIT)
def backward(dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM, out_rev, off, dh_carry, gr,
             E, DY, hp, k, nblk):
    """Shapes: dh_in, zs [T,N,DH]; h0 [N,DH]; R [H,H]; outputs dX [T,N,DH] and HM [T,N,H]
    (input time); dh_carry [N,H] holds the state gradient on entry and d h0 on exit;
    scratch gr, E, DY, hp [N,H]."""
    N = dh_in.shape[1]
    if nblk == 1:
        _backward_rows(0, 0, N, dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM, out_rev, off,
                       dh_carry, gr, E, DY, hp, k)
        return
    for b in numba.prange(nblk):
        n0, n1 = block_rows(b, nblk, N)
        _backward_rows(b, n0, n1, dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM, out_rev,
                       off, dh_carry, gr, E, DY, hp, k)
