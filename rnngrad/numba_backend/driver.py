"""The numba backend's wrapper (contract 2.1 and the end of 3.3), shared by the three cells.

What runs where:

- the input projection ``x' = source Wᵀ`` for all steps and both directions is one GEMM
  (NumPy's BLAS) before the recurrence; the bias is added inside the kernels;
- each direction's recurrence is one call of a compiled kernel (``lstm.py``, ``gru.py``,
  ``single_gate.py``) that runs the whole time loop; the batch is split into row blocks that
  run in parallel when the problem is large enough (:func:`schedule`), each with a
  single-threaded BLAS GEMM per step for its rows, then the gate math;
- after the recurrence, the weight gradients (dR = Σ dXᵀ HM, dW = dXᵀ source) and the source
  gradient (dX W) are large GEMMs, and the bias gradient a sum over T·N rows.

Everything computes in the problem's dtype (float32 or float64). The thread pools never
compete: the large GEMMs (NumPy's multithreaded BLAS) run between kernel calls, and while a
kernel's parallel region is open, the BLAS it calls (SciPy's) is limited to one thread.
"""

from __future__ import annotations

import math

import contextlib

import numba
import numpy as np

from .. import machine
from ..problem import ForwardArrays, GradientArrays
from . import gru, lstm, single_gate
from .activations import constants
from .common import MASK_NONE, MASK_PER_STEP, MASK_SHARED

#: below this many batch rows × gate units (N·G·H) a kernel runs on one thread: opening a
#: parallel region and splitting the GEMM costs more than it saves.
PARALLEL_MIN_UNITS = 4096


def schedule(N: int, H: int, G: int) -> int:
    """Row blocks to run in parallel (1: one thread)."""
    threads = numba.get_num_threads()
    if threads < 2 or N < 2 or N * G * H < PARALLEL_MIN_UNITS:
        return 1
    return min(threads, N)


def _threads_for(nblk):
    """While nblk > 1 row blocks run in parallel, each block's GEMMs are single-threaded."""
    return machine.blas_threads("scipy", 1) if nblk > 1 else contextlib.nullcontext()


def _writable(a):
    """Numba compiles read-only arrays as a type of their own; hand it writable ones."""
    return a if a is None or a.flags.writeable else a.copy()


def _scratch(nblk, N, cols, dtype):
    """[B,n,cols] zeros: one contiguous [n,cols] buffer per row block (n = ⌈N/B⌉), so that each
    block's GEMM operands are contiguous (numba's np.dot is slow on sliced operands)."""
    return np.zeros((nblk, -(-N // nblk), cols), dtype)  # [B,n,cols]


def _dummy(dtype, ndim):
    return np.zeros((1,) * ndim, dtype)  # stands for an absent optional input


def _mask(problem):
    """(mask [1 or T,N,DH], mode)."""
    m = problem.mask
    if m is None:
        return _dummy(problem.dtype, 3), MASK_NONE
    if m.ndim == 3:
        return _writable(m), MASK_PER_STEP
    return _writable(m)[None], MASK_SHARED  # [1,N,DH]


def _state(a, problem):
    """An optional [N,DH] initial state, or zeros."""
    N, DH = problem.N, problem.D * problem.H
    return np.zeros((N, DH), problem.dtype) if a is None else _writable(a)  # [N,DH]


def _project(problem):
    """(x' without bias [T,N,DGH], bias [DGH]) — the bias is added in the kernels."""
    P = problem
    DGH = P.D * P.G * P.H
    if P.input_weight is None:
        xp = _writable(P.source)  # [T,N,DGH]
    else:
        xp = (P.source.reshape(-1, P.I) @ P.input_weight.T).reshape(P.T, P.N, DGH)  # [T,N,DGH]
    bx = np.zeros(DGH, P.dtype) if P.bias is None else _writable(P.bias)  # [DGH]
    return xp, bx


def _directions(problem):
    """For each direction: (d, x_rev, out_rev). x_rev: x' and dX run backward in input time
    (reverse, or the backward direction); out_rev: outputs and per-step gradient inputs are
    aligned with input time and run backward (the backward direction of a bidirectional op)."""
    D, reverse = problem.D, problem.descriptor.reverse
    return [(d, d == 1 or (D == 1 and reverse), d == 1) for d in range(D)]


# -- forward ----------------------------------------------------------------------------------

def forward(problem) -> ForwardArrays:
    P, desc, dt = problem, problem.descriptor, problem.dtype
    T, N, H, D, Z = P.T, P.N, P.H, P.D, P.Z
    h = np.empty((T, N, D * H), dt)  # [T,N,DH]
    c = np.empty((T, N, D * H), dt) if P.cell == "lstm" else None  # [T,N,DH]
    zs = np.empty((T, N, D * Z * H), dt)  # [T,N,DZH]
    if T > 0 and N > 0:
        _FORWARD[P.cell](P, h, c, zs)
    keep_c = P.cell == "lstm" and (desc.training or desc.produce_cell)
    return ForwardArrays(h=h, c=c if keep_c else None, z_state=zs if desc.training else None)


def _forward_single_gate(P, h, c, zs):
    dt, N, H = P.dtype, P.N, P.H
    xp, bx = _project(P)
    h0, (m, mode), k = _state(P.init_state, P), _mask(P), constants(dt)
    nblk = schedule(N, H, 1)
    hm, rec = _scratch(nblk, N, H, dt), _scratch(nblk, N, H, dt)  # [B,n,H]
    for d, x_rev, out_rev in _directions(P):
        Rt = np.ascontiguousarray(P.recurrent_weight[d].T)  # [H,H]
        with _threads_for(nblk):
            single_gate.forward(xp, d * H, bx, x_rev, Rt, h0, m, mode,
                                int(P.descriptor.activation), h, zs, out_rev, d * H, hm, rec, k,
                                nblk)


def _lstm_codes(desc):
    acts = np.array([desc.input_gate_activation, desc.forget_gate_activation,
                     desc.cell_gate_activation, desc.output_gate_activation, desc.activation],
                    np.int64)  # [5]
    gi = np.array([desc.gate_index[g] for g in "ifzo"], np.int64)  # [4]
    return acts, gi


def _peephole(P, d):
    if P.peephole is None:
        return np.zeros(4 * P.H, P.dtype), False  # [4H]
    return np.ascontiguousarray(P.peephole[d]), True  # [4H]


def _forward_lstm(P, h, c, zs):
    dt, N, H = P.dtype, P.N, P.H
    xp, bx = _project(P)
    h0, c0, (m, mode), k = _state(P.init_state, P), _state(P.init_cell, P), _mask(P), constants(dt)
    acts, gi = _lstm_codes(P.descriptor)
    nblk = schedule(N, H, 4)
    hm, rec = _scratch(nblk, N, H, dt), _scratch(nblk, N, 4 * H, dt)  # [B,n,H], [B,n,4H]
    for d, x_rev, out_rev in _directions(P):
        Rt = np.ascontiguousarray(P.recurrent_weight[d].T)  # [H,4H]
        p, has_p = _peephole(P, d)
        with _threads_for(nblk):
            lstm.forward(xp, d * 4 * H, bx, x_rev, Rt, h0, c0, m, mode, p, has_p, acts, gi, h, c,
                         zs, out_rev, d * H, d * 4 * H, hm, rec, k, nblk)


def _gru_codes(desc):
    acts = np.array([desc.update_gate_activation, desc.reset_gate_activation,
                     desc.output_gate_activation], np.int64)  # [3]
    return acts, desc.gate_index["z"], desc.gate_index["r"]


def _forward_gru(P, h, c, zs):
    dt, N, H, Z, desc = P.dtype, P.N, P.H, P.Z, P.descriptor
    xp, bx = _project(P)
    h0, (m, mode), k = _state(P.init_state, P), _mask(P), constants(dt)
    b2 = np.zeros(P.D * H, dt) if P.secondary_bias is None else _writable(P.secondary_bias)  # [DH]
    acts, gz, gr = _gru_codes(desc)
    ra = desc.reset_after
    nblk = schedule(N, H, 3)
    hm, reco, hmr = (_scratch(nblk, N, H, dt) for _ in range(3))  # [B,n,H]
    rec = _scratch(nblk, N, (3 if ra else 2) * H, dt)  # [B,n,3H] or [B,n,2H]
    for d, x_rev, out_rev in _directions(P):
        R = P.recurrent_weight[d]  # [3H,H]
        Rt = np.ascontiguousarray((R if ra else R[:2 * H]).T)  # [H,3H] or [H,2H]
        Rt_o = np.ascontiguousarray(R[2 * H:].T)  # [H,H]
        with _threads_for(nblk):
            gru.forward(xp, d * 3 * H, bx, x_rev, Rt, Rt_o, b2, h0, m, mode, acts, gz * H, gr * H,
                        desc.flip_z, ra, h, zs, out_rev, d * H, d * Z * H, hm, rec, reco, hmr, k,
                        nblk)


_FORWARD = {"single_gate": _forward_single_gate, "lstm": _forward_lstm, "gru": _forward_gru}


# -- gradients --------------------------------------------------------------------------------

def gradients(problem) -> GradientArrays:
    P, dt = problem, problem.dtype
    T, N, H, D, G = P.T, P.N, P.H, P.D, P.G
    GH = G * H
    dX = np.zeros((T, N, D * GH), dt)  # [T,N,DGH] gate gradients, input time
    out = {"recurrent_weight": np.zeros((D, GH, H), dt)}  # [D,GH,H]
    dh0 = np.zeros((N, D * H), dt) if P.state_gradient is None else P.state_gradient.copy()  # [N,DH]
    dc0 = np.zeros((N, D * H), dt)  # [N,DH]
    if P.cell_gradient is not None and not P.cell_gradient_per_step:
        dc0 = P.cell_gradient.copy()  # [N,DH] final-cell gradient
    extra = {}
    if T > 0 and N > 0:
        extra = _BACKWARD[P.cell](P, dX, out["recurrent_weight"], dh0, dc0)
    rows = dX.reshape(T * N, D * GH)  # [TN,DGH]
    if P.input_weight is not None:
        out["source"] = (rows @ P.input_weight).reshape(T, N, P.I)  # [T,N,I]
        out["input_weight"] = rows.T @ P.source.reshape(T * N, P.I)  # [DGH,I]
    else:
        out["source"] = dX  # [T,N,DGH]
    if P.bias is not None:
        out["bias"] = rows.sum(axis=0).reshape(1, 1, D * GH)  # [1,1,DGH]
    if P.init_state is not None:
        out["init_state"] = dh0
    if P.init_cell is not None:
        out["init_cell"] = dc0
    if P.peephole is not None:
        out["peephole"] = extra.get("peephole", np.zeros((D, 4 * H), dt))  # [D,4H]
    if P.secondary_bias is not None:
        out["secondary_bias"] = extra.get("secondary_bias", np.zeros(D * H, dt))  # [DH]
    return GradientArrays(**out)


def _rows(a, cols=None):
    """[T,N,C] (or its columns ``cols``) as [T·N, C] rows, a view."""
    T, N = a.shape[:2]
    a = a if cols is None else a[:, :, cols]
    return a.reshape(T * N, a.shape[2])


def _backward_single_gate(P, dX, dR, dh0, dc0):
    dt, T, N, H = P.dtype, P.T, P.N, P.H
    h0, (m, mode), k = _state(P.init_state, P), _mask(P), constants(dt)
    dh_in, zs = _writable(P.source_gradient), _writable(P.z_state)
    HM = np.empty((T, N, H), dt)  # [T,N,H] h[t−1] ⊙ m, input time
    nblk = schedule(N, H, 1)
    gr, E, DY, hp = (_scratch(nblk, N, H, dt) for _ in range(4))  # [B,n,H]
    for d, x_rev, out_rev in _directions(P):
        carry = np.ascontiguousarray(dh0[:, d * H:(d + 1) * H])  # [N,H]
        gr[:] = 0
        R = np.ascontiguousarray(P.recurrent_weight[d])  # [H,H]
        with _threads_for(nblk):
            single_gate.backward(dh_in, zs, h0, m, mode, R, int(P.descriptor.activation), dX,
                                 d * H, x_rev, HM, out_rev, d * H, carry, gr, E, DY, hp, k, nblk)
        dh0[:, d * H:(d + 1) * H] = carry
        dR[d] = _rows(dX, slice(d * H, (d + 1) * H)).T @ _rows(HM)  # [H,H]
    return {}


def _backward_lstm(P, dX, dR, dh0, dc0):
    dt, T, N, H, D = P.dtype, P.T, P.N, P.H, P.D
    h0, c0, (m, mode), k = _state(P.init_state, P), _state(P.init_cell, P), _mask(P), constants(dt)
    acts, gi = _lstm_codes(P.descriptor)
    dh_in, zs, cf = _writable(P.source_gradient), _writable(P.z_state), _writable(P.cell_output_fwd)
    per_step = P.cell_gradient_per_step
    dc_in = _writable(P.cell_gradient) if per_step else _dummy(dt, 3)
    HM = np.empty((T, N, H), dt)  # [T,N,H] h[t−1] ⊙ m, input time
    nblk = schedule(N, H, 4)
    gr, hp = _scratch(nblk, N, H, dt), _scratch(nblk, N, H, dt)  # [B,n,H]
    E = _scratch(nblk, N, 4 * H, dt)  # [B,n,4H]
    Y, DY = _scratch(nblk, N, 5 * H, dt), _scratch(nblk, N, 5 * H, dt)  # [B,n,5H] gates, cell
    dp = np.zeros((D, 4 * H), dt)  # [D,4H]
    for d, x_rev, out_rev in _directions(P):
        cols = slice(d * 4 * H, (d + 1) * 4 * H)
        dh_carry = np.ascontiguousarray(dh0[:, d * H:(d + 1) * H])  # [N,H]
        dc_carry = np.ascontiguousarray(dc0[:, d * H:(d + 1) * H])  # [N,H]
        gr[:] = 0
        R = np.ascontiguousarray(P.recurrent_weight[d])  # [4H,H]
        p, has_p = _peephole(P, d)
        with _threads_for(nblk):
            lstm.backward(dh_in, zs, cf, h0, c0, m, mode, p, has_p, dc_in, per_step, R, acts, gi,
                          dX, d * 4 * H, x_rev, HM, out_rev, d * H, d * 4 * H, dh_carry, dc_carry,
                          gr, E, Y, DY, hp, k, nblk)
        dh0[:, d * H:(d + 1) * H] = dh_carry
        dc0[:, d * H:(d + 1) * H] = dc_carry
        dR[d] = _rows(dX, cols).T @ _rows(HM)  # [4H,H]
        if has_p:
            lstm.peephole_gradient(dX, d * 4 * H, x_rev, cf, c0, out_rev, d * H, gi, dp[d])
    return {"peephole": dp}


def _backward_gru(P, dX, dR, dh0, dc0):
    dt, T, N, H, D, Z, desc = P.dtype, P.T, P.N, P.H, P.D, P.Z, P.descriptor
    h0, (m, mode), k = _state(P.init_state, P), _mask(P), constants(dt)
    acts, gz, grr = _gru_codes(desc)
    ra = desc.reset_after
    dh_in, zs, hf = _writable(P.source_gradient), _writable(P.z_state), _writable(P.output_fwd)
    HM = np.empty((T, N, H), dt)  # [T,N,H] h[t−1] ⊙ m, input time
    HMR = np.empty((T, N, H), dt) if not ra else _dummy(dt, 3)  # [T,N,H] h[t−1] ⊙ r ⊙ m
    DQ = np.empty((T, N, H), dt) if ra else _dummy(dt, 3)  # [T,N,H] dq
    nblk = schedule(N, H, 3)
    gr, Eo, g = (_scratch(nblk, N, H, dt) for _ in range(3))  # [B,n,H]
    E = _scratch(nblk, N, (3 if ra else 2) * H, dt)  # [B,n,3H] or [B,n,2H]
    Y, DY = _scratch(nblk, N, 3 * H, dt), _scratch(nblk, N, 3 * H, dt)  # [B,n,3H]: z, r, o
    db2 = np.zeros(D * H, dt)  # [DH]
    for d, x_rev, out_rev in _directions(P):
        base = d * 3 * H
        carry = np.ascontiguousarray(dh0[:, d * H:(d + 1) * H])  # [N,H]
        gr[:] = 0
        R = P.recurrent_weight[d]  # [3H,H], C-contiguous rows
        R_main = np.ascontiguousarray(R if ra else R[:2 * H])  # [3H,H] or [2H,H]
        R_o = np.ascontiguousarray(R[2 * H:])  # [H,H]
        with _threads_for(nblk):
            gru.backward(dh_in, zs, hf, h0, m, mode, R_main, R_o, acts, gz * H, grr * H,
                         desc.flip_z, ra, dX, base, x_rev, HM, HMR, DQ, out_rev, d * H, d * Z * H,
                         carry, gr, E, Eo, g, Y, DY, k, nblk)
        dh0[:, d * H:(d + 1) * H] = carry
        dR[d, :2 * H] = _rows(dX, slice(base, base + 2 * H)).T @ _rows(HM)  # [2H,H]
        if ra:
            dR[d, 2 * H:] = _rows(DQ).T @ _rows(HM)  # [H,H]
            db2[d * H:(d + 1) * H] = _rows(DQ).sum(axis=0)
        else:
            dR[d, 2 * H:] = _rows(dX, slice(base + 2 * H, base + 3 * H)).T @ _rows(HMR)  # [H,H]
    return {"secondary_bias": db2}


_BACKWARD = {"single_gate": _backward_single_gate, "lstm": _backward_lstm, "gru": _backward_gru}
