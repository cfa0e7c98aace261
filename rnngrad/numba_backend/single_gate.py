"""singleGateRNN forward and gradient kernels, one direction, whole time loop compiled.

Equations: contract 2.2 and 3.3 (``rnngrad/reference/single_gate.py`` is the readable version).
Per step (forward): ``rec = hm @ Rᵀ`` (BLAS), then a = x' + rec, h = f(a) and the next step's
``hm`` = h ⊙ m per unit. Per step (gradients): da = dh ⊙ f'(a) into dX and the GEMM buffer E,
h[t−1] ⊙ m into HM (h[t−1] = f(z_state[t−1]) is rebuilt), then ``gr = E @ R`` (BLAS).
"""

import numba
import numpy as np

from .activations import ZERO, activate, activate_and_derivative
from .common import chunk, mask_at, step_index


@numba.njit(cache=True)
def _forward_units(n, j0, j1, s, xp, ti, xoff, bx, rec, m, m_mode, last, act, h, zs, to, off,
                   hm, k):
    for j in range(j0, j1):
        a = xp[ti, n, xoff + j] + bx[xoff + j] + rec[n, j]
        zs[to, n, off + j] = a
        hn = activate(act, a, k)
        h[to, n, off + j] = hn
        if not last:
            hm[n, j] = hn * mask_at(m, m_mode, s + 1, n, off + j, k)


@numba.njit(parallel=True, cache=True)
def forward(xp, xoff, bx, x_rev, Rt, h0, m, m_mode, act, h, zs, out_rev, off, hm, rec, k, par,
            nchunk):
    """Shapes: xp [T,N,DH] (bias bx [DH] added here); Rt [H,H] = R[d]ᵀ; h0 [N,DH];
    m [1 or T,N,DH]; outputs h, zs [T,N,DH]; scratch hm, rec [N,H]."""
    T, N = h.shape[0], h.shape[1]
    H = Rt.shape[0]
    for n in range(N):
        for j in range(H):
            hm[n, j] = h0[n, off + j] * mask_at(m, m_mode, 0, n, off + j, k)
    for s in range(T):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        last = s == T - 1
        np.dot(hm, Rt, rec)
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_units(n, j0, j1, s, xp, ti, xoff, bx, rec, m, m_mode, last, act, h, zs,
                               to, off, hm, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _forward_units(n, j0, j1, s, xp, ti, xoff, bx, rec, m, m_mode, last, act, h, zs,
                               to, off, hm, k)


@numba.njit(cache=True)
def _backward_units(n, j0, j1, s, T, dh_in, zs, tprev, h0, m, m_mode, dh_carry, gr, act, dX, ti,
                    xoff, E, HM, to, off, k):
    for j in range(j0, j1):
        _, da_dx = activate_and_derivative(act, zs[to, n, off + j], k)
        hp = h0[n, off + j] if s == 0 else activate(act, zs[tprev, n, off + j], k)
        dh = dh_in[to, n, off + j] + dh_carry[n, j]
        if s < T - 1:
            dh += gr[n, j] * mask_at(m, m_mode, s + 1, n, off + j, k)
        da = dh * da_dx
        E[n, j] = da
        dX[ti, n, xoff + j] = da
        dh_carry[n, j] = k[ZERO]  # all of the next dh comes through the GEMM
        HM[ti, n, j] = hp * mask_at(m, m_mode, s, n, off + j, k)


@numba.njit(parallel=True, cache=True)
def backward(dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM, out_rev, off, dh_carry, gr,
             E, k, par, nchunk):
    """Shapes: dh_in, zs [T,N,DH]; h0 [N,DH]; R [H,H]; outputs dX [T,N,DH] and HM [T,N,H]
    (input time); dh_carry [N,H] holds the state gradient on entry and d h0 on exit."""
    T, N = dh_in.shape[0], dh_in.shape[1]
    H = R.shape[1]
    for s in range(T - 1, -1, -1):
        ti = step_index(s, T, x_rev)
        to = step_index(s, T, out_rev)
        tprev = step_index(s - 1, T, out_rev)
        if par:
            for w in numba.prange(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_units(n, j0, j1, s, T, dh_in, zs, tprev, h0, m, m_mode, dh_carry, gr,
                                act, dX, ti, xoff, E, HM, to, off, k)
        else:
            for w in range(N * nchunk):
                n, j0, j1 = chunk(w, nchunk, H)
                _backward_units(n, j0, j1, s, T, dh_in, zs, tprev, h0, m, m_mode, dh_carry, gr,
                                act, dX, ti, xoff, E, HM, to, off, k)
        np.dot(E, R, gr)
    for n in range(N):
        for j in range(H):
            dh_carry[n, j] += gr[n, j] * mask_at(m, m_mode, 0, n, off + j, k)
