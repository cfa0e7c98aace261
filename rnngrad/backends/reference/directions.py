"""The wrapper shared by the three cells (SEMANTICS.md §2.1 and the end of §3.3).

MPSGraph builds its public ops from ordinary graph ops around a unidirectional core op that
runs forward in time. This module is that wrapper: the input projection ``x' = source Wᵀ + b``,
the time reversal of ``reverse`` and of the backward direction, the split of every per-direction
input, the reassembly of the outputs, and after the core gradient op the products that give the
source, input-weight and bias gradients. The cells (``single_gate``, ``gru``, ``lstm``) only
supply the core op of one direction, in processing order.

Notation
    T steps, N batch, I input features, H hidden units, G gates of a direction (1, 3, 4), D
    directions (2 when bidirectional); Z blocks of H in z_state per direction (G, or 4 for a
    GRU with reset_after). ``rev(a)`` reverses the time axis. Everything here is float64.

Equations
    forward:   x' = source Wᵀ (x' = source without input_weight);  x' = x' + b with a bias
      D = 1:   h, c, z = core(x')            or core(rev(x')) with reverse; not flipped back
      D = 2:   h_f, c_f, z_f = core(x'[..., 0:GH]),  h_b, c_b, z_b = core(rev(x'[..., GH:2GH]))
               h = [h_f, rev(h_b)] on the last axis, the same for c and z_state
    gradients: each direction's core gradient op gives dA [T,N,GH] in processing order
               dA = [dA_f, rev(dA_b)] (rev(dA) for a unidirectional reverse)
               d_source = dA W (dA without input_weight);  d_W = flat(dA)ᵀ flat(source)
               d_bias = Σ_(t,n) dA, kept dimensions;  d_R = [dR_f, dR_b] stacked

Layouts
    x', W, b: [T,N,D·G·H], [D·G·H,I], [D·G·H], the forward direction's G·H first. R [D,GH,H];
    init_state, init_cell, mask, secondary_bias split on the last axis into [0:H] and [H:2H];
    peephole [D,4H] on the first. h, c [T,N,D·H] and z_state [T,N,D·Z·H] are aligned with input
    time when bidirectional, in processing order when unidirectional; a bidirectional op's
    source_gradient, z_state, output_fwd, cell_output_fwd and per-step cell_gradient are read
    the same way (their backward halves flipped into processing order here). state_gradient
    enters at each direction's last processing step.

Deviations and decisions
    - A unidirectional reverse op's outputs stay in processing order, as MPSGraph returns them.
    - The mask is never time-reversed; a per-step mask [T,N,H] is indexed by processing step
      [decision].
    - With T = 0 the state gradient is the initial state's gradient (SEMANTICS.md §4).
    - The bias gradient keeps its dimensions: [1,1,D·G·H], as MPSGraph returns it.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np


@dataclasses.dataclass
class Direction:
    """One direction's inputs to the core op, in processing order (float64).

    x [T,N,GH]; R [GH,H]; h0, c0 [N,H]; m None, [N,H] or [T,N,H] (per processing step);
    p [4H] or None; b2 [H] or None. Gradients only: dh_in [T,N,H] (source_gradient);
    dh_final [N,H] (state_gradient, enters at the last processing step) or None; zs [T,N,ZH]; h_fwd [T,N,H] (GRU); c_fwd [T,N,H]
    (LSTM); dc_in [T,N,H] per-step cell gradient or None; dc_final [N,H] or None.
    """

    x: Optional[np.ndarray]
    R: np.ndarray
    h0: np.ndarray
    c0: np.ndarray
    m: Optional[np.ndarray]
    p: Optional[np.ndarray] = None
    b2: Optional[np.ndarray] = None
    dh_in: Optional[np.ndarray] = None
    dh_final: Optional[np.ndarray] = None
    zs: Optional[np.ndarray] = None
    h_fwd: Optional[np.ndarray] = None
    c_fwd: Optional[np.ndarray] = None
    dc_in: Optional[np.ndarray] = None
    dc_final: Optional[np.ndarray] = None

    def initial_dh(self):
        """dh_next before the last processing step: the state gradient, or zeros."""
        N, H = self.h0.shape
        return self.dh_final.copy() if self.dh_final is not None else np.zeros((N, H))  # [N,H]

    def mask(self, t):
        """The mask at processing step t: an array broadcastable to [N,H], or 1.0."""
        if self.m is None:
            return 1.0
        return self.m[t] if self.m.ndim == 3 else self.m


def f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)


def _halves(a, H, d):
    """Direction d's half [d·H:(d+1)·H] of the last axis, or None."""
    return None if a is None else a[..., d * H:(d + 1) * H]


def _in_processing_order(a, backward):
    """Time-reverse an aligned [T,…] array for the backward direction (or reverse)."""
    return None if a is None else (a[::-1] if backward else a)


def _directions(problem, x_proj):
    """Split the problem into its directions, each in processing order."""
    desc, H, D, G, Z, N = problem.descriptor, problem.H, problem.D, problem.G, problem.Z, problem.N
    h0 = f64(problem.init_state) if problem.init_state is not None else np.zeros((N, D * H))  # [N,DH]
    c0 = f64(problem.init_cell) if problem.init_cell is not None else np.zeros((N, D * H))  # [N,DH]
    # float64 once for all directions; each direction then takes its half
    m, b2, cg = f64(problem.mask), f64(problem.secondary_bias), f64(problem.cell_gradient)
    sg, zs = f64(problem.source_gradient), f64(problem.z_state)
    h_fwd, c_fwd, state_g = f64(problem.output_fwd), f64(problem.cell_output_fwd), f64(problem.state_gradient)
    dirs = []
    for d in range(D):
        # Unidirectional reverse and the backward direction both run over time-reversed input.
        backward = (d == 1) or (D == 1 and desc.reverse)
        # A unidirectional op's gradient inputs are already in processing order; only the
        # backward half of a bidirectional op is aligned with input time and must be flipped.
        flip_aligned = d == 1
        direction = Direction(
            x=None if x_proj is None else _in_processing_order(x_proj[..., d * G * H:(d + 1) * G * H], backward),
            R=f64(problem.recurrent_weight[d]),
            h0=h0[:, d * H:(d + 1) * H],
            c0=c0[:, d * H:(d + 1) * H],
            m=_halves(m, H, d),  # the mask is never time-reversed
            p=None if problem.peephole is None else f64(problem.peephole[d]),
            b2=_halves(b2, H, d),
        )
        if problem.gradients:
            direction.dh_in = _in_processing_order(_halves(sg, H, d), flip_aligned)
            # The state gradient enters at the final processing step; with T = 0 it is the
            # init_state gradient itself (SEMANTICS.md §4).
            direction.dh_final = _halves(state_g, H, d)
            direction.zs = _in_processing_order(None if zs is None else zs[..., d * Z * H:(d + 1) * Z * H], flip_aligned)
            direction.h_fwd = _in_processing_order(_halves(h_fwd, H, d), flip_aligned)
            direction.c_fwd = _in_processing_order(_halves(c_fwd, H, d), flip_aligned)
            if problem.cell_gradient_per_step:
                direction.dc_in = _in_processing_order(_halves(cg, H, d), flip_aligned)
            elif cg is not None:
                direction.dc_final = _halves(cg, H, d)
        dirs.append(direction)
    return dirs


def project(problem):
    """x' = source Wᵀ (+ b) over all steps: [T,N,D·G·H], float64."""
    x = f64(problem.source)  # [T,N,I] or [T,N,DGH]
    if problem.input_weight is not None:
        x = x @ f64(problem.input_weight).T  # [T,N,DGH]
    if problem.bias is not None:
        x = x + f64(problem.bias)  # [T,N,DGH]
    return x


def forward(problem, core_forward):
    """Run the forward op; ``core_forward(direction, descriptor) -> (h, c, z)`` in processing
    order, each [T,N,·] (c None for cells without one). Returns float64 (h, c, z_state)."""
    dirs = _directions(problem, project(problem))
    outs = [core_forward(d, problem.descriptor) for d in dirs]
    if problem.D == 1:
        return outs[0]  # processing order, not flipped back (SEMANTICS.md §2.1, step 3)
    (hf, cf, zf), (hb, cb, zb) = outs
    h = np.concatenate([hf, hb[::-1]], axis=-1)  # [T,N,2H]
    c = None if cf is None else np.concatenate([cf, cb[::-1]], axis=-1)  # [T,N,2H]
    z = np.concatenate([zf, zb[::-1]], axis=-1)  # [T,N,2ZH]
    return h, c, z


def gradients(problem, core_backward):
    """Run the gradient op; ``core_backward(direction, descriptor)`` returns a dict with
    dx [T,N,GH] (processing order), dR [GH,H], dh0 [N,H] and, where the cell has them, dc0 [N,H],
    dp [4H], db2 [H]. Returns a dict of float64 gradients in the normalised shapes."""
    dirs = _directions(problem, None)
    results = [core_backward(d, problem.descriptor) for d in dirs]
    # Back to input time: reverse, and the backward direction, ran over flipped input.
    flips = [d == 1 or (problem.D == 1 and problem.descriptor.reverse) for d in range(problem.D)]
    dA = np.concatenate([r["dx"][::-1] if f else r["dx"] for r, f in zip(results, flips)], axis=-1)  # [T,N,DGH]
    out = {"recurrent_weight": np.stack([r["dR"] for r in results])}  # [D,GH,H]
    if problem.input_weight is not None:
        source = f64(problem.source)  # [T,N,I]
        out["source"] = dA @ f64(problem.input_weight)  # [T,N,I]
        out["input_weight"] = dA.reshape(-1, dA.shape[-1]).T @ source.reshape(-1, source.shape[-1])  # [DGH,I]
    else:
        out["source"] = dA  # [T,N,DGH]
    if problem.bias is not None:
        out["bias"] = dA.sum(axis=(0, 1), keepdims=True)  # [1,1,DGH]
    if problem.init_state is not None:
        out["init_state"] = np.concatenate([r["dh0"] for r in results], axis=-1)  # [N,DH]
    if problem.init_cell is not None:
        out["init_cell"] = np.concatenate([r["dc0"] for r in results], axis=-1)  # [N,DH]
    if problem.peephole is not None:
        out["peephole"] = np.stack([r["dp"] for r in results])  # [D,4H]
    if problem.secondary_bias is not None:
        out["secondary_bias"] = np.concatenate([r["db2"] for r in results], axis=-1)  # [DH]
    return out
