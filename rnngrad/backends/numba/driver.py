"""The numba backend's wrapper (SEMANTICS.md §2.1 and the end of §3.3), shared by the three cells.

What runs where:

- the input projection ``x' = source Wᵀ`` for all steps and both directions is one GEMM
  before the recurrence; the bias is added inside the kernels;
- each direction's recurrence is one call of a compiled kernel (``lstm.py``, ``gru.py``,
  ``single_gate.py``) that runs the whole time loop; when the problem is large enough
  (:func:`schedule`) the hidden units are split into parts that run in parallel, each with a
  single-threaded BLAS GEMM per step for its units' weight columns over the whole batch, then
  the gate math of its units (``common.py``);
- after the recurrence, the weight gradients (dR = Σ dXᵀ HM, dW = dXᵀ source) and the source
  gradient (dX W) are large GEMMs, and the bias gradient a sum over T·N rows;
- with enough batch rows, the rows are split instead (forward and gradients): each thread
  runs its rows through every step with all of R and never waits for the other inside the
  loop (:func:`forward_schedule`, :func:`gradient_schedule`);
- small problems (one thread, R unpacked, nothing beside: :func:`in_one_call`) run each op
  in one compiled call, projection, loop and weight products together (each cell's
  ``forward_op`` and ``gradient_op``), with no Python between the pieces;
- when a direction's recurrence runs on one thread and the products are large, the
  projection (first direction) and the weight gradients run beside it on the other core
  instead, a chunk of steps ahead or behind (``overlap.py``); a gradient recurrence runs on
  one thread for that whenever its weight gradients outweigh it enough
  (:func:`gradient_schedule`).

Everything computes in the problem's dtype (float32 or float64). Everything runs on numba's
thread pool: the large GEMMs too (``gemm.py``, one single-threaded BLAS call per thread), so
that no other pool's spinning threads take the cores a recurrence kernel is waiting for.
"""

from __future__ import annotations

import contextlib
import functools

import numba
import numpy as np

from ... import machine
from ...problem import ForwardArrays, GradientArrays
from . import blas, gru, lstm, overlap, single_gate
from .gemm import add_transposed_times, product, rows_times
from .common import MASK_NONE, MASK_PER_STEP, MASK_SHARED, through_first_product

#: below this many floating-point operations in one step's recurrent product (2·N·H·G·H) a
#: kernel runs on one thread: a parallel region per step costs more than the split saves.
PARALLEL_MIN_FLOPS = 4_000_000
#: fewest hidden units per part: narrower parts make GEMMs too thin to gain from the split
#: (verification/PERFORMANCE.md, "numba's thresholds")
MIN_PART_UNITS = 128
#: a gradient recurrence runs on one thread beside its weight-gradient products when those
#: take at least this many times its own FLOPs (:func:`gradient_schedule`); a forward gains
#: nothing from it and keeps :func:`schedule` (verification/PERFORMANCE.md, "numba's
#: thresholds")
SERIAL_GRADIENTS_SHARE = 1.5
#: … and when a step's recurrent product (2·N·G·H·H) takes at least this many FLOPs: below it,
#: splitting the batch rows was faster (verification/PERFORMANCE.md, "numba's thresholds")
SERIAL_GRADIENTS_MIN_STEP_FLOPS = 10_000_000
#: a forward splits the batch rows between the threads (:func:`forward_schedule`) when each
#: gets at least this many rows …
MIN_PART_ROWS = 8
#: … and the whole loop's recurrent products take at least this many floating-point
#: operations (2·T·N·G·H·H): one parallel region for the whole loop, entered once
ROW_PARTS_MIN_FLOPS = 4_000_000


def schedule(N: int, H: int, G: int) -> int:
    """The number of parts the hidden units are split into (1: one thread)."""
    if 2 * N * H * G * H < PARALLEL_MIN_FLOPS:
        return 1
    threads = numba.get_num_threads()
    return 1 if threads < 2 or H < MIN_PART_UNITS * threads else threads


def forward_schedule(T: int, N: int, H: int, G: int) -> tuple[int, int]:
    """(parts of the hidden units, parts of the batch rows) of a forward recurrence. Batch rows
    never depend on each other, so with enough rows (``MIN_PART_ROWS`` per thread) and work
    (``ROW_PARTS_MIN_FLOPS``) the rows are split: each thread runs its rows through every step
    with all of R, and the threads never meet inside the loop (no wait at each step for the
    slower one, one parallel region in all). Otherwise :func:`schedule` splits the units, or
    not. Rows beat split units and one thread wherever both thresholds hold
    (verification/PERFORMANCE.md, "numba's thresholds")."""
    if N >= 2 * MIN_PART_ROWS and 2.0 * T * N * G * H * H >= ROW_PARTS_MIN_FLOPS:
        rows = min(numba.get_num_threads(), N // MIN_PART_ROWS)
        if rows >= 2:
            return 1, rows
    return schedule(N, H, G), 1


def gradient_schedule(P) -> tuple[int, int]:
    """(parts of the hidden units, parts of the batch rows) of a gradient recurrence. One part
    when its weight-gradient products (dR and dW: ``2·T·N·G·H·(H + I)`` FLOPs) are at least
    ``SERIAL_GRADIENTS_SHARE`` times the recurrence's own products, a step's product takes at
    least ``SERIAL_GRADIENTS_MIN_STEP_FLOPS``, and dR and dW can run beside it
    (``overlap.bounds``): the recurrence then runs on one thread, with no per-step meeting,
    while the other core works through dR and dW. Otherwise the batch rows, or the units, are
    split as in :func:`forward_schedule` (rows never depend on each other in the gradients
    either; verification/PERFORMANCE.md, "numba's thresholds", has the measurements)."""
    parts, row_parts = forward_schedule(P.T, P.N, P.H, P.G)
    if parts * row_parts == 1:
        return 1, 1
    step = 2.0 * P.N * P.G * P.H * P.H
    own = P.T * step
    beside = _weight_gradient_flops(P)  # dR (own) and dW
    if beside >= SERIAL_GRADIENTS_SHARE * own and step >= SERIAL_GRADIENTS_MIN_STEP_FLOPS \
            and overlap.bounds(P.T, P.N, 1, beside) is not None:
        return 1, 1
    return parts, row_parts


def in_one_call(P, parts: int, flops: float) -> bool:
    """Whether an op runs whole in one compiled call on the calling thread (each cell's
    ``forward_op`` and ``gradient_op``): when its recurrence runs on one thread (``parts``, the
    schedule's parts of units times parts of rows, is 1), with R unpacked (``blas.packs``),
    and nothing beside it (``overlap.bounds`` of the ``flops`` that would run there). These
    are the small problems, where the Python between the kernels and the products is a
    visible share of the op (verification/PERFORMANCE.md, "numba: warm-up, one-call ops,
    splits")."""
    return parts == 1 and not blas.packs(P.H, P.G * P.H, P.N, P.T, P.dtype) \
        and overlap.bounds(P.T, P.N, 1, flops) is None


def _projection_flops(P) -> float:
    return 0.0 if P.input_weight is None else 2.0 * P.T * P.N * P.I * P.D * P.G * P.H


def _weight_gradient_flops(P) -> float:
    """The FLOPs of one direction's dR and dW."""
    return 2.0 * P.T * P.N * P.G * P.H * (P.H + (P.I or 0))  # P.I is None without W


def _single_threaded_blas(dtype):
    """Around a whole op where SciPy's OpenBLAS runs products of its ``dtype``: the kernels and
    ``gemm.py`` call it from each of numba's threads, one BLAS thread each, so that its thread
    pool never competes with numba's. (MKL runs sequential, oneDNN one thread a call: nothing
    to limit.)"""
    return machine.blas_threads("scipy", 1) if blas.uses_openblas(dtype) \
        else contextlib.nullcontext()


def _writable(a):
    """Numba compiles read-only arrays as a type of their own; hand it writable ones."""
    return a if a is None or a.flags.writeable else a.copy()


def _units(p, P, H):
    return p * H // P, (p + 1) * H // P


def _columns_t(R, G, P, rows, steps):
    """[P,S]: part p's columns of Rᵀ (R [G·H,H]), block b at columns b·hc …, padded with zero
    columns to hc = ⌈H/P⌉ units ([H,G·hc] per part), prepared by ``blas.pack_parts`` for
    ``steps`` products with ``rows`` rows — the forward's per-step GEMM operand."""
    H = R.shape[1]
    if P == 1:
        return blas.pack_parts(R.T[None], rows, steps)  # one part: all of Rᵀ
    hc = -(-H // P)
    cols = np.zeros((P, H, G * hc), R.dtype)  # [P,H,Ghc]
    for p in range(P):
        j0, j1 = _units(p, P, H)
        for b in range(G):
            cols[p, :, b * hc:b * hc + j1 - j0] = R[b * H + j0:b * H + j1].T
    return blas.pack_parts(cols, rows, steps)


def _forward_weights(R, G, parts, row_parts, N, steps):
    """The forward's per-step GEMM operand for a recurrence in ``parts`` parts of the units
    (:func:`_columns_t`) or ``row_parts`` parts of the N batch rows (:func:`_whole`, all of
    Rᵀ): [P or Q,S]."""
    if row_parts == 1:
        return _columns_t(R, G, parts, N, steps)
    return _whole(R.T, row_parts, N, steps)


def _gradient_weights(R, parts, row_parts, N, steps):
    """The gradients' per-step GEMM operand for a recurrence in ``parts`` parts of the units
    (:func:`_columns`) or ``row_parts`` parts of the N batch rows (:func:`_whole`, all of R):
    [P or Q,S]."""
    if row_parts == 1:
        return _columns(R, parts, N, steps)
    return _whole(R, row_parts, N, steps)


def _whole(B, row_parts, N, steps):
    """[Q,S]: all of B [K,M] (any strides) for each of ``row_parts`` parts of the N batch rows,
    prepared by ``blas.pack_parts`` for that part's own number of rows."""
    counts = [j1 - j0 for j0, j1 in (_units(q, row_parts, N) for q in range(row_parts))]
    return blas.pack_parts(np.broadcast_to(B, (row_parts,) + B.shape), counts, steps)


def _columns(R, P, rows, steps):
    """[P,S]: part p's columns j0 … j1−1 of R [K,H], padded with zero columns ([K,hc] per
    part), prepared by ``blas.pack_parts`` for ``steps`` products with ``rows`` rows — the
    gradients' per-step GEMM operand."""
    K, H = R.shape
    if P == 1:
        return blas.pack_parts(R[None], rows, steps)
    hc = -(-H // P)
    cols = np.zeros((P, K, hc), R.dtype)  # [P,K,hc]
    for p in range(P):
        j0, j1 = _units(p, P, H)
        cols[p, :, :j1 - j0] = R[:, j0:j1]
    return blas.pack_parts(cols, rows, steps)


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


def _bias(P):
    return np.zeros(P.D * P.G * P.H, P.dtype) if P.bias is None else _writable(P.bias)  # [DGH]


def _input_weight(P):
    """(W [DGH,I] or a stand-in, whether given)."""
    return (_dummy(P.dtype, 2), False) if P.input_weight is None else (_writable(P.input_weight), True)


def _weight_gradient(P, weight):
    """dW [DGH,I] (accumulated into) of weight = (dW, source rows), or a stand-in."""
    return _dummy(P.dtype, 2) if weight is None else weight[0]


def _peepholes(P):
    """(peephole [D,4H] or zeros, whether given)."""
    if P.peephole is None:
        return np.zeros((P.D, 4 * P.H), P.dtype), False  # [D,4H]
    return _writable(P.peephole), True


def _project(problem, parts):
    """(x' without bias [T,N,DGH], bias [DGH], projection) — the bias is added in the kernels.
    Without an input weight x' is the source; with one, x' = source Wᵀ is computed here
    (projection None), or, when it can run beside the first direction's recurrence
    (:func:`_recur`; the recurrence runs in ``parts`` parts), only allocated, and projection =
    (``fill(t0, t1)``, which fills its input-time rows t0 … t1−1, and the chunk boundaries)."""
    P = problem
    T, N, DGH = P.T, P.N, P.D * P.G * P.H
    bx = _bias(P)  # [DGH]
    if P.input_weight is None:
        return _writable(P.source), bx, None  # [T,N,DGH]
    src, Wt = P.source.reshape(T * N, P.I), P.input_weight.T  # [TN,I], [I,DGH]
    b = overlap.bounds(T, N, parts, _projection_flops(P))
    if b is None:
        return rows_times(src, Wt).reshape(T, N, DGH), bx, None  # [T,N,DGH]
    src, Wt = _writable(np.ascontiguousarray(src)), _writable(np.ascontiguousarray(Wt))
    xp = np.empty((T, N, DGH), P.dtype)  # [T,N,DGH]
    rows = xp.reshape(T * N, DGH)  # [TN,DGH] a view

    def fill(t0, t1):
        product(src[t0 * N:t1 * N], Wt, rows[t0 * N:t1 * N])
    return xp, bx, (fill, b)


def _recur(P, x_rev, recur, projection):
    """One direction's recurrence, ``recur(s0, s1)`` over the steps s0 … s1−1; with a
    projection (:func:`_project`), the projection beside it, one chunk ahead."""
    if projection is None:
        recur(0, P.T)
        return
    fill, b = projection
    overlap.forward(recur, lambda s0, s1: fill(*overlap.times(s0, s1, P.T, x_rev)), b)


def _recur_gradients(P, parts, x_rev, recur, products):
    """One direction's gradient recurrence, ``recur(s0, s1)`` over the steps s0 … s1−1, and
    its weight gradients ``out += Aᵀ B`` for each (out [M,K], A [T·N,M], B [T·N,K]) of
    ``products`` (rows in input time): beside the recurrence, one chunk behind it, when
    :func:`overlap.bounds` allows, else after it on all threads."""
    b = overlap.bounds(P.T, P.N, parts,
                       sum(2.0 * a.shape[0] * a.shape[1] * m.shape[1] for _, a, m in products))
    if b is None:
        recur(0, P.T)
        for out, a, m in products:
            add_transposed_times(a, m, out)
        return
    overlap.gradients(recur, products, b, P.T, P.N, x_rev)


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
        with _single_threaded_blas(dt):
            _FORWARD[P.cell](P, h, c, zs)
    keep_c = P.cell == "lstm" and (desc.training or desc.produce_cell)
    return ForwardArrays(h=h, c=c if keep_c else None, z_state=zs if desc.training else None)


def _forward_single_gate(P, h, c, zs):
    dt, N, H = P.dtype, P.N, P.H
    parts, row_parts = forward_schedule(P.T, N, H, 1)
    h0, (m, mode) = _state(P.init_state, P), _mask(P)
    act = int(P.descriptor.activation)
    if in_one_call(P, parts * row_parts, _projection_flops(P)):
        single_gate.forward_op(_writable(P.source), *_input_weight(P), _bias(P),
                               _writable(P.recurrent_weight), h0, m, mode, act,
                               P.descriptor.reverse, h, zs)
        return
    xp, bx, projection = _project(P, parts * row_parts)
    ones = np.ones(H, dt)  # [H]
    hc, slots = -(-H // parts), max(parts, row_parts)
    hm, rec = np.zeros((2, N, H), dt), np.zeros((slots, N, hc), dt)  # [2,N,H], [P or Q,N,hc]
    for d, x_rev, out_rev in _directions(P):
        Rt = _forward_weights(P.recurrent_weight[d], 1, parts, row_parts, N, P.T)  # [P or Q,S]
        _recur(P, x_rev, lambda s0, s1: single_gate.forward(
            xp, d * H, bx, x_rev, Rt, h0, m, mode, act, h, zs, out_rev, d * H, hm, rec, ones,
            s0, s1, row_parts), projection if d == 0 else None)


@functools.lru_cache(maxsize=64)
def _lstm_codes(desc):
    """(activation codes [5], gate blocks [4]) of a descriptor (cached: the kernels only read
    them)."""
    acts = np.array([desc.input_gate_activation, desc.forget_gate_activation,
                     desc.cell_gate_activation, desc.output_gate_activation, desc.activation],
                    np.int64)  # [5]
    gi = np.array([desc.gate_index[g] for g in "ifzo"], np.int64)  # [4]
    return acts, gi


def _forward_lstm(P, h, c, zs):
    dt, N, H = P.dtype, P.N, P.H
    parts, row_parts = forward_schedule(P.T, N, H, 4)
    h0, c0, (m, mode) = _state(P.init_state, P), _state(P.init_cell, P), _mask(P)
    acts, gi = _lstm_codes(P.descriptor)
    if in_one_call(P, parts * row_parts, _projection_flops(P)):
        lstm.forward_op(_writable(P.source), *_input_weight(P), _bias(P),
                        _writable(P.recurrent_weight), h0, c0, m, mode, *_peepholes(P), acts, gi,
                        P.descriptor.reverse, h, c, zs)
        return
    xp, bx, projection = _project(P, parts * row_parts)
    hc, slots = -(-H // parts), max(parts, row_parts)
    hm, rec = np.zeros((2, N, H), dt), np.zeros((slots, N, 4 * hc), dt)  # [2,N,H], [P or Q,N,4hc]
    Y, ones = np.zeros((slots, 5 * hc), dt), np.ones(H, dt)  # [P or Q,5hc], [H]
    pp, has_p = _peepholes(P)  # [D,4H]
    for d, x_rev, out_rev in _directions(P):
        Rt = _forward_weights(P.recurrent_weight[d], 4, parts, row_parts, N, P.T)  # [P or Q,S]
        _recur(P, x_rev, lambda s0, s1: lstm.forward(
            xp, d * 4 * H, bx, x_rev, Rt, h0, c0, m, mode, pp[d], has_p, acts, gi, h, c, zs, out_rev,
            d * H, d * 4 * H, hm, rec, Y, ones, s0, s1, row_parts), projection if d == 0 else None)


@functools.lru_cache(maxsize=64)
def _gru_codes(desc):
    """(activation codes [3], z block, r block) of a descriptor (cached: the kernels only read
    them)."""
    acts = np.array([desc.update_gate_activation, desc.reset_gate_activation,
                     desc.output_gate_activation], np.int64)  # [3]
    return acts, desc.gate_index["z"], desc.gate_index["r"]


def _forward_gru(P, h, c, zs):
    dt, N, H, Z, desc = P.dtype, P.N, P.H, P.Z, P.descriptor
    parts, row_parts = forward_schedule(P.T, N, H, 3)
    h0, (m, mode) = _state(P.init_state, P), _mask(P)
    b2 = np.zeros(P.D * H, dt) if P.secondary_bias is None else _writable(P.secondary_bias)  # [DH]
    acts, gz, gr = _gru_codes(desc)
    ra = desc.reset_after
    if in_one_call(P, parts * row_parts, _projection_flops(P)):
        gru.forward_op(_writable(P.source), *_input_weight(P), _bias(P), _writable(P.recurrent_weight),
                       b2, h0, m, mode, acts, gz, gr, desc.flip_z, ra, desc.reverse, h, zs)
        return
    xp, bx, projection = _project(P, parts * row_parts)
    ones = np.ones(H, dt)  # [H]
    hc, slots = -(-H // parts), max(parts, row_parts)
    hm, hmr = np.zeros((2, N, H), dt), np.zeros((N, H), dt)  # [2,N,H], [N,H]
    rec = np.zeros((slots, N, (3 if ra else 2) * hc), dt)  # [P or Q,N,3hc] or [P or Q,N,2hc]
    reco, Zb = np.zeros((slots, N, hc), dt), np.zeros((slots, N, hc), dt)  # [P or Q,N,hc]
    Y = np.zeros((slots, 2 * hc), dt)  # [P or Q,2hc]
    for d, x_rev, out_rev in _directions(P):
        R = P.recurrent_weight[d]  # [3H,H]
        if ra:
            Rt, Rt_o = _forward_weights(R, 3, parts, row_parts, N, P.T), _dummy(dt, 2)  # [P or Q,S]
        else:
            Rt = _forward_weights(R[:2 * H], 2, parts, row_parts, N, P.T)  # [P or Q,S]
            Rt_o = _forward_weights(R[2 * H:], 1, parts, row_parts, N, P.T)  # [P or Q,S]
        _recur(P, x_rev, lambda s0, s1: gru.forward(
            xp, d * 3 * H, bx, x_rev, Rt, Rt_o, b2, h0, m, mode, acts, gz, gr, desc.flip_z, ra,
            h, zs, out_rev, d * H, d * Z * H, hm, rec, hmr, reco, Zb, Y, ones, s0, s1, row_parts),
            projection if d == 0 else None)


_FORWARD = {"single_gate": _forward_single_gate, "lstm": _forward_lstm, "gru": _forward_gru}


# -- gradients --------------------------------------------------------------------------------

def gradients(problem) -> GradientArrays:
    with _single_threaded_blas(problem.dtype):
        return _gradients(problem)


def _gradients(problem) -> GradientArrays:
    P, dt = problem, problem.dtype
    T, N, H, D, G = P.T, P.N, P.H, P.D, P.G
    GH = G * H
    dX = np.empty((T, N, D * GH), dt)  # [T,N,DGH] gate gradients, input time, all written
    out = {"recurrent_weight": np.zeros((D, GH, H), dt)}  # [D,GH,H]
    dh0 = np.zeros((N, D * H), dt) if P.state_gradient is None else P.state_gradient.copy()  # [N,DH]
    dc0 = np.zeros((N, D * H), dt)  # [N,DH]
    if P.cell_gradient is not None and not P.cell_gradient_per_step:
        dc0 = P.cell_gradient.copy()  # [N,DH] final-cell gradient
    weight = None  # (dW, source rows): the input weight's gradient and its product's operand
    if P.input_weight is not None:
        out["input_weight"] = np.zeros((D * GH, P.I), dt)  # [DGH,I]
        weight = (out["input_weight"],
                  _writable(np.ascontiguousarray(P.source.reshape(T * N, P.I))))  # [TN,I]
    extra = {}
    if T > 0 and N > 0:
        extra = _BACKWARD[P.cell](P, dX, out["recurrent_weight"], weight, dh0, dc0)
    rows = dX.reshape(T * N, D * GH)  # [TN,DGH]
    if P.input_weight is not None:
        out["source"] = rows_times(rows, P.input_weight).reshape(T, N, P.I)  # [T,N,I]
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


def _input_weight_product(dX, cols, weight):
    """The weight-gradient product of dW's rows ``cols`` (:func:`_recur_gradients`): dW[cols]
    += dX[:, :, cols]ᵀ source, for weight = (dW, source rows); none without an input weight."""
    if weight is None:
        return []
    dW, src = weight
    return [(dW[cols], _rows(dX, cols), src)]


def _backward_single_gate(P, dX, dR, weight, dh0, dc0):
    dt, T, N, H = P.dtype, P.T, P.N, P.H
    h0, (m, mode) = _state(P.init_state, P), _mask(P)
    dh_in, zs = _writable(P.source_gradient), _writable(P.z_state)
    act = int(P.descriptor.activation)
    parts, row_parts = gradient_schedule(P)
    if in_one_call(P, parts * row_parts, _weight_gradient_flops(P)):
        single_gate.gradient_op(_writable(P.source), weight is not None,
                                _writable(P.recurrent_weight), dh_in, zs, h0, m, mode, act,
                                P.descriptor.reverse, dX, dR, _weight_gradient(P, weight), dh0)
        return {}
    HM, ones = np.empty((T, N, H), dt), np.ones(H, dt)  # [T,N,H] h[t−1] ⊙ m, input time; [H]
    hc, slots = -(-H // parts), max(parts, row_parts)
    E, gr = np.zeros((2, N, H), dt), np.zeros((slots, N, hc), dt)  # [2,N,H], [P or Q,N,hc]
    Y = np.zeros((slots, 2 * hc), dt)  # [P or Q,2hc]
    for d, x_rev, out_rev in _directions(P):
        carry = np.ascontiguousarray(dh0[:, d * H:(d + 1) * H])  # [N,H]
        R = _gradient_weights(P.recurrent_weight[d], parts, row_parts, N, T)  # [P or Q,S]
        cols = slice(d * H, (d + 1) * H)
        _recur_gradients(P, parts * row_parts, x_rev, lambda s0, s1: single_gate.backward(
            dh_in, zs, h0, m, mode, R, act, dX, d * H, x_rev, HM, out_rev, d * H, carry, E, gr,
            Y, ones, s0, s1, row_parts),
            [(dR[d], _rows(dX, cols), _rows(HM))] + _input_weight_product(dX, cols, weight))
        through_first_product(E[0], _writable(P.recurrent_weight[d]), m, mode, d * H,
                              dh0[:, d * H:(d + 1) * H])
    return {}


def _backward_lstm(P, dX, dR, weight, dh0, dc0):
    dt, T, N, H, D = P.dtype, P.T, P.N, P.H, P.D
    h0, c0, (m, mode) = _state(P.init_state, P), _state(P.init_cell, P), _mask(P)
    acts, gi = _lstm_codes(P.descriptor)
    dh_in, zs, cf = _writable(P.source_gradient), _writable(P.z_state), _writable(P.cell_output_fwd)
    per_step = P.cell_gradient_per_step
    dc_in = _writable(P.cell_gradient) if per_step else _dummy(dt, 3)
    parts, row_parts = gradient_schedule(P)
    pp, has_p = _peepholes(P)  # [D,4H]
    dp = np.zeros((D, 4 * H), dt)  # [D,4H]
    if in_one_call(P, parts * row_parts, _weight_gradient_flops(P)):
        lstm.gradient_op(_writable(P.source), weight is not None, _writable(P.recurrent_weight),
                         dh_in, zs, cf, h0, c0, m, mode, pp, has_p, dc_in, per_step, acts, gi,
                         P.descriptor.reverse, dX, dR, _weight_gradient(P, weight), dh0, dc0, dp)
        return {"peephole": dp}
    HM = np.empty((T, N, H), dt)  # [T,N,H] h[t−1] ⊙ m, input time
    hc, slots = -(-H // parts), max(parts, row_parts)
    E, gr = np.zeros((2, N, 4 * H), dt), np.zeros((slots, N, hc), dt)  # [2,N,4H], [P or Q,N,hc]
    Y, ones = np.zeros((slots, 11 * hc), dt), np.ones(H, dt)  # [P or Q,11hc], [H]
    for d, x_rev, out_rev in _directions(P):
        cols = slice(d * 4 * H, (d + 1) * 4 * H)
        dh_carry = np.ascontiguousarray(dh0[:, d * H:(d + 1) * H])  # [N,H]
        dc_carry = np.ascontiguousarray(dc0[:, d * H:(d + 1) * H])  # [N,H]
        R = _gradient_weights(P.recurrent_weight[d], parts, row_parts, N, T)  # [P or Q,S]
        _recur_gradients(P, parts * row_parts, x_rev, lambda s0, s1: lstm.backward(
            dh_in, zs, cf, h0, c0, m, mode, pp[d], has_p, dc_in, per_step, R, acts, gi, dX, d * 4 * H,
            x_rev, HM, out_rev, d * H, d * 4 * H, dh_carry, dc_carry, E, gr, Y, ones, s0, s1,
            row_parts),
            [(dR[d], _rows(dX, cols), _rows(HM))] + _input_weight_product(dX, cols, weight))
        through_first_product(E[0], _writable(P.recurrent_weight[d]), m, mode, d * H,
                              dh0[:, d * H:(d + 1) * H])
        dc0[:, d * H:(d + 1) * H] = dc_carry
        if has_p:
            lstm.peephole_gradient(dX, d * 4 * H, x_rev, cf, c0, out_rev, d * H, gi, dp[d])
    return {"peephole": dp}


def _backward_gru(P, dX, dR, weight, dh0, dc0):
    dt, T, N, H, D, Z, desc = P.dtype, P.T, P.N, P.H, P.D, P.Z, P.descriptor
    h0, (m, mode) = _state(P.init_state, P), _mask(P)
    acts, gz, grr = _gru_codes(desc)
    ra = desc.reset_after
    dh_in, zs, hf = _writable(P.source_gradient), _writable(P.z_state), _writable(P.output_fwd)
    db2 = np.zeros(D * H, dt)  # [DH]
    parts, row_parts = gradient_schedule(P)
    if in_one_call(P, parts * row_parts, _weight_gradient_flops(P)):
        gru.gradient_op(_writable(P.source), weight is not None, _writable(P.recurrent_weight), dh_in,
                        zs, hf, h0, m, mode, acts, gz, grr, desc.flip_z, ra, desc.reverse, dX, dR,
                        _weight_gradient(P, weight), dh0, db2)
        return {"secondary_bias": db2}
    HM, ones = np.empty((T, N, H), dt), np.ones(H, dt)  # [T,N,H] h[t−1] ⊙ m, input time; [H]
    HMR = np.empty((T, N, H), dt) if not ra else _dummy(dt, 3)  # [T,N,H] h[t−1] ⊙ r ⊙ m
    DQ = np.empty((T, N, H), dt) if ra else _dummy(dt, 3)  # [T,N,H] dq
    hc, slots = -(-H // parts), max(parts, row_parts)
    E = np.zeros((2, N, (3 if ra else 2) * H), dt)  # [2,N,3H] or [2,N,2H]
    Eo = np.zeros((N, H), dt)  # [N,H] da_o
    gr, g = np.zeros((slots, N, hc), dt), np.zeros((slots, N, hc), dt)  # [P or Q,N,hc]
    Rb = np.zeros((slots, 2, N, hc), dt)  # [P or Q,2,N,hc]
    Y = np.zeros((slots, 7 * hc), dt)  # [P or Q,7hc]
    for d, x_rev, out_rev in _directions(P):
        base = d * 3 * H
        carry = dh0[:, d * H:(d + 1) * H].copy()  # [N,H] (d h0 is rewritten below)
        R = _writable(P.recurrent_weight[d])  # [3H,H]
        R_main = _gradient_weights(R if ra else R[:2 * H], parts, row_parts, N, T)  # [P or Q,S]
        R_o = _dummy(dt, 2) if ra else \
            _gradient_weights(R[2 * H:], parts, row_parts, N, T)  # [P or Q,S]
        o_product = (_rows(DQ), _rows(HM)) if ra else \
            (_rows(dX, slice(base + 2 * H, base + 3 * H)), _rows(HMR))
        _recur_gradients(P, parts * row_parts, x_rev, lambda s0, s1: gru.backward(
            dh_in, zs, hf, h0, m, mode, R_main, R_o, acts, gz, grr, desc.flip_z, ra, dX, base,
            x_rev, HM, HMR, DQ, out_rev, d * H, d * Z * H, carry, E, Eo, gr, g, Rb, Y, ones,
            s0, s1, row_parts),
            [(dR[d, :2 * H], _rows(dX, slice(base, base + 2 * H)), _rows(HM)),
             (dR[d, 2 * H:], *o_product)]
            + _input_weight_product(dX, slice(base, base + 3 * H), weight))
        through_first_product(E[0], R if ra else R[:2 * H], m, mode, d * H,
                              dh0[:, d * H:(d + 1) * H])
        dh0[:, d * H:(d + 1) * H] += carry
        if ra:
            db2[d * H:(d + 1) * H] = _rows(DQ).sum(axis=0)
    return {"secondary_bias": db2}


_BACKWARD = {"single_gate": _backward_single_gate, "lstm": _backward_lstm, "gru": _backward_gru}
