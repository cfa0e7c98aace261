"""LSTM forward and gradient kernels, one direction, whole time loop compiled.

Equations: SEMANTICS.md §2.2 and §3.3 (``rnngrad/backends/reference/lstm.py`` is the readable
version).
``gi`` [4] holds the block index of the gates i, f, z, o in the packed layout; ``acts`` [5] the
activation codes of i, f, z, o and of the cell activation g. Conventions (parts of the hidden
units, double buffers, row views): ``common.py``.

Per step and part (forward): ``rec = hm @ Rtₚ`` (BLAS, [N,H]·[H,4hc], the part's columns of
Rᵀ in block order, prepared by ``blas.pack_parts``); per row, the pre-activations a = rec + x' + b (+ p ⊙ c[t−1]) in
place, to z_state; the activations into the row scratch Y (gate order i, f, z, o); c, g(c), h
and the next step's ``hm = h ⊙ m`` for the part's units.
Per step and part (gradients): ``gr = E_next @ Rₚ`` (BLAS, [N,4H]·[4H,hc], the part's columns
of R), then per row the activations and derivatives of the four gates and of the cell, dh, dc,
dA (to dX and to this step's E), dc carried, and h ⊙ m of the next step's input into HM.
dR = Σ dXᵀ HM and dX's products with W and source are large GEMMs after the loop
(``driver.py``).
"""

import numba
import numpy as np

from .activations import JIT, activate, activate_with_derivative
from .common import (ONE_I, ZERO_I, add_input_weight_gradient, add_pre_activation,
                     add_weight_gradient, as_part, direction, dot, mask_row, multiply, part_units,
                     project, step_index, through_first_product, transposed, unowned)


@numba.njit(**JIT)
def _forward_part(k, p, P, n0, n1, s, xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, pp, has_p,
                  acts, gi, h, c, zs, out_rev, off, zoff, hm, rec, Y, ones):
    T = h.shape[0]
    H, hc = hm.shape[2], rec.shape[2] // 4
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to, tp = step_index(s, T, x_rev), step_index(s, T, out_rev), step_index(s - 1, T, out_rev)
    dot(hm[s % 2, n0:n1], Rt[k], rec[k, n0:n1])  # [n1−n0,4hc]
    nxt = hm[(s + 1) % 2]
    y = Y[k]  # [5hc] row scratch: i, f, z, o, g(c)
    yi, yf, yz, yo, gc = y[0:w], y[hc:hc + w], y[2 * hc:2 * hc + w], y[3 * hc:3 * hc + w], \
        y[4 * hc:4 * hc + w]
    for n in range(n0, n1):
        a = rec[k, n]  # [4hc] becomes the pre-activations
        xrow, brow, zrow = xp[ti, n], bx, zs[to, n]
        cp = (c0[n] if s == 0 else c[tp, n])[off + j0:off + j1]
        for blk in range(4):
            ab = a[blk * hc:blk * hc + w]
            col = blk * H + j0
            if has_p:
                pb = pp[col:col + w]
                for j in range(w):
                    ab[j] += pb[j] * cp[j]
            xb, bb = xrow[xoff + col:xoff + col + w], brow[xoff + col:xoff + col + w]
            zb = zrow[zoff + col:zoff + col + w]
            add_pre_activation(ab, xb, bb, zb)
        for g in range(4):
            activate(acts[g], a[gi[g] * hc:gi[g] * hc + w], y[g * hc:g * hc + w])
        crow = c[to, n, off + j0:off + j1]
        for j in range(w):
            crow[j] = yf[j] * cp[j] + yi[j] * yz[j]
        activate(acts[4], crow, gc)
        hrow = h[to, n, off + j0:off + j1]
        multiply(yo, gc, hrow)
        if s < T - 1:
            multiply(hrow, mask_row(m, m_mode, s + 1, n, off + j0, w, ones), nxt[n, j0:j1])


@numba.njit(parallel=True, **JIT)
def forward(xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode, pp, has_p, acts, gi,
            h, c, zs, out_rev, off, zoff, hm, rec, Y, ones, s0, s1, Q):
    """Shapes: xp [T,N,DGH] (bias bx [DGH] added here); Rt [P,S] = the parts' columns of
    R[d]ᵀ ([H,4hc] each), or with Q row parts all of R[d]ᵀ for each ([Q,S]), prepared by
    ``blas.pack_parts``; h0, c0 [N,DH]; m [1 or T,N,DH]; pp [4H]; outputs h, c [T,N,DH],
    zs [T,N,D4H]; scratch hm [2,N,H], rec [P or Q,N,4hc], Y [P or Q,5hc]; ones [H]."""
    # borrowed views (no reference counting on the views taken per row and step)
    xp, bx, Rt, h0, c0 = unowned(xp), unowned(bx), unowned(Rt), unowned(h0), unowned(c0)
    m, pp, acts, gi, h = unowned(m), unowned(pp), unowned(acts), unowned(gi), unowned(h)
    c, zs, hm, rec, Y = unowned(c), unowned(zs), unowned(hm), unowned(rec), unowned(Y)
    ones = unowned(ones)
    N = h.shape[1]
    P, H = Rt.shape[0], hm.shape[2]
    if s0 == 0:
        for n in range(N):
            multiply(h0[n, off:off + H], mask_row(m, m_mode, 0, n, off, H, ones), hm[0, n])
    if Q > 1:  # row parts: each runs its batch rows through every step, no meeting
        for q in numba.prange(Q):
            n0, n1 = part_units(q, Q, N)
            for s in range(s0, s1):
                _forward_part(np.int64(q), ZERO_I, ONE_I, n0, n1, s, xp, xoff, bx, x_rev, Rt, h0, c0, m,
                              m_mode, pp, has_p, acts, gi, h, c, zs, out_rev, off, zoff, hm, rec, Y,
                              ones)
        return
    for s in range(s0, s1):
        if P == 1:
            _forward_part(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, h0, c0, m, m_mode,
                          pp, has_p, acts, gi, h, c, zs, out_rev, off, zoff, hm, rec, Y, ones)
        else:
            for p in numba.prange(P):
                _forward_part(np.int64(p), np.int64(p), P, ZERO_I, N, s, xp, xoff, bx, x_rev, Rt, h0, c0,
                              m, m_mode, pp, has_p, acts, gi, h, c, zs, out_rev, off, zoff, hm, rec,
                              Y, ones)


@numba.njit(**JIT)
def _backward_part(k, p, P, n0, n1, s, dh_in, zs, cf, h0, c0, m, m_mode, pp, has_p, dc_in,
                   has_dc_in, R, acts, gi, dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry,
                   dc_carry, E, gr, Y, ones):
    T = dh_in.shape[0]
    H, hc = dh_carry.shape[1], gr.shape[2]
    j0, j1 = part_units(p, P, H)
    w = j1 - j0
    ti, to, tp = step_index(s, T, x_rev), step_index(s, T, out_rev), step_index(s - 1, T, out_rev)
    last = s == T - 1
    if not last:
        dot(E[(s + 1) % 2, n0:n1], R[k], gr[k, n0:n1])  # [n1−n0,hc]: next step's dA · R, own units
    e = E[s % 2]
    y = Y[k]  # [11hc] row scratch
    yi, yf, yz, yo = y[0:w], y[hc:hc + w], y[2 * hc:2 * hc + w], y[3 * hc:3 * hc + w]
    di, df, dz, do = y[4 * hc:4 * hc + w], y[5 * hc:5 * hc + w], y[6 * hc:6 * hc + w], \
        y[7 * hc:7 * hc + w]
    gc, dgc, dh = y[8 * hc:8 * hc + w], y[9 * hc:9 * hc + w], y[10 * hc:10 * hc + w]
    for n in range(n0, n1):
        zrow = zs[to, n]
        for g in range(4):
            src = zrow[zoff + gi[g] * H + j0:zoff + gi[g] * H + j1]
            activate_with_derivative(acts[g], src, y[g * hc:g * hc + w], y[(4 + g) * hc:(4 + g) * hc + w])
        activate_with_derivative(acts[4], cf[to, n, off + j0:off + j1], gc, dgc)
        # HM: h[s] ⊙ m[s+1] = o ⊙ g(c) ⊙ m[s+1] is step s+1's recurrent input, rebuilt here from
        # the forward's z_state and c (once per step: this step needs o and g(c) anyway)
        if not last:
            hn, mn = HM[step_index(s + 1, T, x_rev), n, j0:j1], mask_row(m, m_mode, s + 1, n, off + j0, w, ones)
            for j in range(w):
                hn[j] = yo[j] * gc[j] * mn[j]
        if s == 0:
            cp = c0[n, off + j0:off + j1]
            multiply(h0[n, off + j0:off + j1], mask_row(m, m_mode, 0, n, off + j0, w, ones),
                     HM[ti, n, j0:j1])
        else:
            cp = cf[tp, n, off + j0:off + j1]
        dhin = dh_in[to, n, off + j0:off + j1]
        if last:
            dhc = dh_carry[n, j0:j1]  # the state gradient
            for j in range(w):
                dh[j] = dhin[j] + dhc[j]
        else:
            grr, mr = gr[k, n, :w], mask_row(m, m_mode, s + 1, n, off + j0, w, ones)
            for j in range(w):
                dh[j] = dhin[j] + grr[j] * mr[j]
        dc = dc_carry[n, j0:j1]  # dc of c[t] from the step after, becomes dc of c[t−1]
        for j in range(w):
            dc[j] += dh[j] * yo[j] * dgc[j]
        if has_dc_in:
            dcin = dc_in[to, n, off + j0:off + j1]
            for j in range(w):
                dc[j] += dcin[j]
        for j in range(w):
            do[j] *= dh[j] * gc[j]  # da_o
        for j in range(w):
            di[j] *= dc[j] * yz[j]  # da_i
        for j in range(w):
            df[j] *= dc[j] * cp[j]  # da_f
        for j in range(w):
            dz[j] *= dc[j] * yi[j]  # da_z
        for j in range(w):
            dc[j] *= yf[j]
        if has_p:
            for g in range(4):
                pg, dg = pp[gi[g] * H + j0:gi[g] * H + j1], y[(4 + g) * hc:(4 + g) * hc + w]
                for j in range(w):
                    dc[j] += dg[j] * pg[j]
        xrow, erow = dX[ti, n], e[n]
        for g in range(4):
            col = gi[g] * H + j0
            dg, xg, eg = y[(4 + g) * hc:(4 + g) * hc + w], xrow[xoff + col:xoff + col + w], \
                erow[col:col + w]
            for j in range(w):
                xg[j] = dg[j]
                eg[j] = dg[j]


@numba.njit(parallel=True, **JIT)
def backward(dh_in, zs, cf, h0, c0, m, m_mode, pp, has_p, dc_in, has_dc_in, R, acts, gi,
             dX, xoff, x_rev, HM, out_rev, off, zoff, dh_carry, dc_carry, E, gr, Y, ones,
             s0, s1, Q):
    """Shapes: dh_in, cf [T,N,DH]; zs [T,N,D4H]; h0, c0 [N,DH]; R [P,S] = the parts'
    columns of R[d] ([4H,hc] each), or with Q row parts all of R[d] for each ([Q,S]), prepared
    by ``blas.pack_parts``; outputs dX [T,N,DGH] and HM [T,N,H] (input time); dh_carry,
    dc_carry [N,H] hold the final-state gradients on entry, dh_carry is then used up and
    dc_carry holds d c0 on exit (d h0 = (E[0] R) ⊙ m[0] is the driver's); scratch E [2,N,4H],
    gr [P or Q,N,hc], Y [P or Q,11hc]; ones [H]."""
    # borrowed views (no reference counting on the views taken per row and step)
    dh_in, zs, cf, h0, c0 = unowned(dh_in), unowned(zs), unowned(cf), unowned(h0), unowned(c0)
    m, pp, dc_in, R, acts = unowned(m), unowned(pp), unowned(dc_in), unowned(R), unowned(acts)
    gi, dX, HM, dh_carry = unowned(gi), unowned(dX), unowned(HM), unowned(dh_carry)
    dc_carry, E, gr, Y, ones = unowned(dc_carry), unowned(E), unowned(gr), unowned(Y), unowned(ones)
    N, P = dh_in.shape[1], R.shape[0]
    if Q > 1:  # row parts: each runs its batch rows through every step, no meeting
        for q in numba.prange(Q):
            n0, n1 = part_units(q, Q, N)
            for s in range(s1 - 1, s0 - 1, -1):
                _backward_part(np.int64(q), ZERO_I, ONE_I, n0, n1, s, dh_in, zs, cf, h0, c0, m,
                               m_mode, pp, has_p, dc_in, has_dc_in, R, acts, gi, dX, xoff, x_rev,
                               HM, out_rev, off, zoff, dh_carry, dc_carry, E, gr, Y, ones)
        return
    for s in range(s1 - 1, s0 - 1, -1):
        if P == 1:
            _backward_part(ZERO_I, ZERO_I, ONE_I, ZERO_I, N, s, dh_in, zs, cf, h0, c0, m, m_mode, pp,
                           has_p, dc_in, has_dc_in, R, acts, gi, dX, xoff, x_rev, HM, out_rev, off,
                           zoff, dh_carry, dc_carry, E, gr, Y, ones)
        else:
            for p in numba.prange(P):
                _backward_part(np.int64(p), np.int64(p), P, ZERO_I, N, s, dh_in, zs, cf, h0, c0, m,
                               m_mode, pp, has_p, dc_in, has_dc_in, R, acts, gi, dX, xoff, x_rev,
                               HM, out_rev, off, zoff, dh_carry, dc_carry, E, gr, Y, ones)


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


@numba.njit(**JIT)
def forward_op(source, W, has_w, bx, R, h0, c0, m, m_mode, pp, has_p, acts, gi, reverse, h, c, zs):
    """The whole forward op in one call on the calling thread (``driver.in_one_call``): the
    projection, then each direction's :func:`forward` with all of R[d]ᵀ, unpacked. Shapes as
    for :func:`forward`, and source [T,N,I] with W [D4H,I] (has_w) or [T,N,D4H]; R [D,4H,H];
    pp [D,4H]."""
    T, N = h.shape[0], h.shape[1]
    D, GH, H = R.shape
    xp = project(source, W, has_w, D * GH)  # [T,N,D4H]
    hm, rec = np.zeros((2, N, H), h.dtype), np.zeros((1, N, GH), h.dtype)  # [2,N,H], [1,N,4H]
    Y, ones = np.zeros((1, 5 * H), h.dtype), np.ones(H, h.dtype)  # [1,5H], [H]
    for d in range(D):
        x_rev, out_rev = direction(d, D, reverse)
        forward(xp, d * GH, bx, x_rev, transposed(R[d]), h0, c0, m, m_mode, pp[d], has_p, acts, gi,
                h, c, zs, out_rev, d * H, d * GH, hm, rec, Y, ones, ZERO_I, T, ONE_I)


@numba.njit(**JIT)
def gradient_op(source, has_w, R, dh_in, zs, cf, h0, c0, m, m_mode, pp, has_p, dc_in, has_dc_in,
                acts, gi, reverse, dX, dR, dW, dh0, dc0, dp):
    """The whole gradient op but the source's and the bias's gradients in one call on the
    calling thread (``driver.in_one_call``): each direction's :func:`backward` with all of R[d],
    unpacked, then its dR, dW, d h0, d c0 and peephole gradient. Shapes as for
    :func:`backward`, and source [T,N,I] (has_w); R [D,4H,H]; pp, dp [D,4H]; outputs dX
    [T,N,D4H], dR [D,4H,H], dW [D4H,I] (accumulated), dh0, dc0 [N,DH] (the final-state
    gradients on entry)."""
    T, N = dX.shape[0], dX.shape[1]
    D, GH, H = R.shape
    HM = np.empty((T, N, H), dX.dtype)  # [T,N,H] h[t−1] ⊙ m, input time
    E, gr = np.zeros((2, N, GH), dX.dtype), np.zeros((1, N, H), dX.dtype)  # [2,N,4H], [1,N,H]
    Y, ones = np.zeros((1, 11 * H), dX.dtype), np.ones(H, dX.dtype)  # [1,11H], [H]
    for d in range(D):
        x_rev, out_rev = direction(d, D, reverse)
        dh_carry, dc_carry = dh0[:, d * H:(d + 1) * H].copy(), dc0[:, d * H:(d + 1) * H].copy()
        backward(dh_in, zs, cf, h0, c0, m, m_mode, pp[d], has_p, dc_in, has_dc_in, as_part(R[d]),
                 acts, gi, dX, d * GH, x_rev, HM, out_rev, d * H, d * GH, dh_carry, dc_carry, E, gr,
                 Y, ones, ZERO_I, T, ONE_I)
        add_weight_gradient(dX, d * GH, (d + 1) * GH, HM, dR[d])
        add_input_weight_gradient(dX, d * GH, (d + 1) * GH, source, has_w, dW)
        through_first_product(E[0], R[d], m, m_mode, d * H, dh0[:, d * H:(d + 1) * H])
        dc0[:, d * H:(d + 1) * H] = dc_carry
        if has_p:
            peephole_gradient(dX, d * GH, x_rev, cf, c0, out_rev, d * H, gi, dp[d])
