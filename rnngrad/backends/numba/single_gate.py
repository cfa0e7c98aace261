"""singleGateRNN forward and gradient kernels, one direction, whole time loop compiled.

Equations: SEMANTICS.md §2.2 and §3.3 (``rnngrad/backends/reference/single_gate.py`` is the
readable version).
Conventions (parts of the hidden units, double buffers, row views): ``common.py``.
Per step and part (forward): ``rec = hm @ Rtₚ`` (BLAS, [N,H]·[H,hc]), then per row
a = rec + x' + b (to z_state), h = f(a), and the next step's ``hm = h ⊙ m``.
Per step and part (gradients): ``gr = E_next @ Rₚ`` (BLAS, [N,H]·[H,hc]), then per row
dh = dh_in + gr ⊙ m, da = dh ⊙ f'(a) into dX and this step's E, and HM, h[t−1] ⊙ m of each
step's recurrent input (h = f(z_state) is rebuilt once per step, by the step that produced it).
"""

import numba
import numpy as np

from .activations import JIT, activate, activate_with_derivative
from .common import (ONE_I, ZERO_I, add_input_weight_gradient, add_pre_activation,
                     add_weight_gradient, as_part, copy, direction, dot, mask_row, multiply,
                     part_units, project, step_index, through_first_product, transposed, unowned)


@numba.njit(**JIT)
def _forward_part(k, p, P, n0, n1, s, xp, xoff, bx, x_rev, Rt, m, m_mode, act, h, zs, out_rev,
                  off, hm, rec, ones):
    T, H = h.shape[0], hm.shape[2]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to = step_index(s, T, x_rev), step_index(s, T, out_rev)
    dot(hm[s % 2, n0:n1], Rt[k], rec[k, n0:n1])  # [n1−n0,hc]
    nxt = hm[(s + 1) % 2]
    bb = bx[xoff + j0:xoff + j1]
    for n in range(n0, n1):
        a, xb = rec[k, n, :w], xp[ti, n, xoff + j0:xoff + j1]
        zb, hrow = zs[to, n, off + j0:off + j1], h[to, n, off + j0:off + j1]
        add_pre_activation(a, xb, bb, zb)
        activate(act, a, hrow)
        if s < T - 1:
            multiply(hrow, mask_row(m, m_mode, s + 1, n, off + j0, w, ones), nxt[n, j0:j1])


@numba.njit(parallel=True, **JIT)
def forward(xp, xoff, bx, x_rev, Rt, h0, m, m_mode, act, h, zs, out_rev, off, hm, rec, ones,
            s0, s1, Q):
    """Shapes: xp [T,N,DH] (bias bx [DH] added here); Rt [P,S] = the parts' columns of R[d]ᵀ
    ([H,hc] each), or with Q row parts all of R[d]ᵀ for each ([Q,S]), prepared by
    ``blas.pack_parts``; h0 [N,DH]; m [1 or T,N,DH]; outputs h, zs [T,N,DH]; scratch
    hm [2,N,H], rec [P or Q,N,hc]; ones [H]."""
    # borrowed views (no reference counting on the views taken per row and step)
    xp, bx, Rt, h0, m = unowned(xp), unowned(bx), unowned(Rt), unowned(h0), unowned(m)
    h, zs, hm, rec, ones = unowned(h), unowned(zs), unowned(hm), unowned(rec), unowned(ones)
    N = h.shape[1]
    P, H = Rt.shape[0], hm.shape[2]
    if s0 == 0:
        for n in range(N):
            multiply(h0[n, off:off + H], mask_row(m, m_mode, 0, n, off, H, ones), hm[0, n])
    if Q > 1:  # row parts: each runs its batch rows through every step, no meeting
        for q in numba.prange(Q):
            n0, n1 = part_units(q, Q, N)
            for s in range(s0, s1):
                _forward_part(np.int64(q), ZERO_I, ONE_I, n0, n1, s, xp, xoff, bx, x_rev, Rt, m, m_mode,
                              act, h, zs, out_rev, off, hm, rec, ones)
        return
    for s in range(s0, s1):
        if P == 1:
            _forward_part(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, m, m_mode, act, h,
                          zs, out_rev, off, hm, rec, ones)
        else:
            for p in numba.prange(P):
                _forward_part(np.int64(p), np.int64(p), P, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, m,
                              m_mode, act, h, zs, out_rev, off, hm, rec, ones)


@numba.njit(**JIT)
def _backward_part(k, p, P, n0, n1, s, dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM,
                   out_rev, off, dh_carry, E, gr, Y, ones):
    T, H = dh_in.shape[0], E.shape[2]
    hc = gr.shape[2]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to = step_index(s, T, x_rev), step_index(s, T, out_rev)
    last = s == T - 1
    if not last:
        dot(E[(s + 1) % 2, n0:n1], R[k], gr[k, n0:n1])  # [n1−n0,hc]
    e = E[s % 2]
    y = Y[k]  # [2hc] row scratch
    ya, da = y[0:w], y[hc:hc + w]
    for n in range(n0, n1):
        activate_with_derivative(act, zs[to, n, off + j0:off + j1], ya, da)
        # HM: h[s] ⊙ m[s+1] is step s+1's recurrent input (so h is rebuilt once per step)
        if not last:
            multiply(ya, mask_row(m, m_mode, s + 1, n, off + j0, w, ones),
                     HM[step_index(s + 1, T, x_rev), n, j0:j1])
        if s == 0:
            multiply(h0[n, off + j0:off + j1], mask_row(m, m_mode, 0, n, off + j0, w, ones),
                     HM[ti, n, j0:j1])
        dhin = dh_in[to, n, off + j0:off + j1]
        if last:
            dhc = dh_carry[n, j0:j1]  # the state gradient
            for j in range(w):
                da[j] *= dhin[j] + dhc[j]
        else:
            grr, mr = gr[k, n, :w], mask_row(m, m_mode, s + 1, n, off + j0, w, ones)
            for j in range(w):
                da[j] *= dhin[j] + grr[j] * mr[j]
        copy(da, dX[ti, n, xoff + j0:xoff + j1])
        copy(da, e[n, j0:j1])


@numba.njit(parallel=True, **JIT)
def backward(dh_in, zs, h0, m, m_mode, R, act, dX, xoff, x_rev, HM, out_rev, off, dh_carry, E,
             gr, Y, ones, s0, s1, Q):
    """Shapes: dh_in, zs [T,N,DH]; h0 [N,DH]; R [P,S] = the parts' columns of R[d] ([H,hc]
    each), or with Q row parts all of R[d] for each ([Q,S]), prepared by ``blas.pack_parts``;
    outputs dX [T,N,DH] and HM [T,N,H] (input time); dh_carry [N,H] holds the state gradient
    on entry (d h0 = (E[0] R) ⊙ m[0] is the driver's); scratch E [2,N,H], gr [P or Q,N,hc],
    Y [P or Q,2hc]; ones [H]."""
    # borrowed views (no reference counting on the views taken per row and step)
    dh_in, zs, h0, m, R = unowned(dh_in), unowned(zs), unowned(h0), unowned(m), unowned(R)
    dX, HM, dh_carry, E, gr = unowned(dX), unowned(HM), unowned(dh_carry), unowned(E), unowned(gr)
    Y, ones = unowned(Y), unowned(ones)
    N, P = dh_in.shape[1], R.shape[0]
    if Q > 1:  # row parts: each runs its batch rows through every step, no meeting
        for q in numba.prange(Q):
            n0, n1 = part_units(q, Q, N)
            for s in range(s1 - 1, s0 - 1, -1):
                _backward_part(np.int64(q), ZERO_I, ONE_I, n0, n1, s, dh_in, zs, h0, m, m_mode, R,
                               act, dX, xoff, x_rev, HM, out_rev, off, dh_carry, E, gr, Y, ones)
        return
    for s in range(s1 - 1, s0 - 1, -1):
        if P == 1:
            _backward_part(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, dh_in, zs, h0, m, m_mode, R, act, dX,
                           xoff, x_rev, HM, out_rev, off, dh_carry, E, gr, Y, ones)
        else:
            for p in numba.prange(P):
                _backward_part(np.int64(p), np.int64(p), P, ZERO_I, N, s, dh_in, zs, h0, m, m_mode,
                               R, act, dX, xoff, x_rev, HM, out_rev, off, dh_carry, E, gr, Y, ones)


@numba.njit(**JIT)
def forward_op(source, W, has_w, bx, R, h0, m, m_mode, act, reverse, h, zs):
    """The whole forward op in one call on the calling thread (``driver.in_one_call``): the
    projection, then each direction's :func:`forward` with all of R[d]ᵀ, unpacked. Shapes as
    for :func:`forward`, and source [T,N,I] with W [DH,I] (has_w) or [T,N,DH]; R [D,H,H]."""
    T, N = h.shape[0], h.shape[1]
    D, H = R.shape[0], R.shape[2]
    xp = project(source, W, has_w, D * H)  # [T,N,DH]
    hm, rec = np.zeros((2, N, H), h.dtype), np.zeros((1, N, H), h.dtype)  # [2,N,H], [1,N,H]
    ones = np.ones(H, h.dtype)  # [H]
    for d in range(D):
        x_rev, out_rev = direction(d, D, reverse)
        forward(xp, d * H, bx, x_rev, transposed(R[d]), h0, m, m_mode, act, h, zs, out_rev, d * H, hm,
                rec, ones, ZERO_I, T, ONE_I)


@numba.njit(**JIT)
def gradient_op(source, has_w, R, dh_in, zs, h0, m, m_mode, act, reverse, dX, dR, dW, dh0):
    """The whole gradient op but the source's and the bias's gradients in one call on the
    calling thread (``driver.in_one_call``): each direction's :func:`backward` with all of R[d],
    unpacked, then its dR, dW and d h0. Shapes as for :func:`backward`, and source [T,N,I]
    (has_w); R [D,H,H]; outputs dX [T,N,DH], dR [D,H,H], dW [DH,I] (accumulated), dh0 [N,DH]
    (the final-state gradient on entry)."""
    T, N = dX.shape[0], dX.shape[1]
    D, H = R.shape[0], R.shape[2]
    HM = np.empty((T, N, H), dX.dtype)  # [T,N,H] h[t−1] ⊙ m, input time
    E, gr = np.zeros((2, N, H), dX.dtype), np.zeros((1, N, H), dX.dtype)  # [2,N,H], [1,N,H]
    Y, ones = np.zeros((1, 2 * H), dX.dtype), np.ones(H, dX.dtype)  # [1,2H], [H]
    for d in range(D):
        x_rev, out_rev = direction(d, D, reverse)
        backward(dh_in, zs, h0, m, m_mode, as_part(R[d]), act, dX, d * H, x_rev, HM, out_rev, d * H,
                 dh0[:, d * H:(d + 1) * H].copy(), E, gr, Y, ones, ZERO_I, T, ONE_I)
        add_weight_gradient(dX, d * H, (d + 1) * H, HM, dR[d])
        add_input_weight_gradient(dX, d * H, (d + 1) * H, source, has_w, dW)
        through_first_product(E[0], R[d], m, m_mode, d * H, dh0[:, d * H:(d + 1) * H])
