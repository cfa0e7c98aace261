"""The op schedule: which dispatches run a cell's forward or gradient op, on which buffers.

Each op is a small number of dispatches (the kernel files for the math):

==========================  =======================================================================
forward                     [strided_gemm: x' = source·Wᵀ + b, when input_weight is given]
                            <cell>_forward: the sequence, both directions, in as few dispatches
                            as the work budget allows (one unless T is long: see below)
gradients                   <cell>_backward: the BPTT recurrence, both directions, split alike
                            strided_gemm: dR = Σ lhsᵀ rhs over T·N rows, batched over directions
                            [strided_gemm ×2: d_source = dA·W, dW = dAᵀ·source, with input_weight]
                            [strided_gemm: db = Σ dA, with bias]
                            [strided_gemm: dpeephole / d_secondary_bias from per-row partials]
==========================  =======================================================================

:func:`forward_plan` and :func:`gradients_plan` write this down once per problem signature as a
:class:`~rnngrad.backends.metal.plan.Plan` (the host keeps it and runs it for every call of the
signature). Everything is float32. An absent optional input is bound as a kept constant, zeros
(init states, bias, secondary bias) or ones (mask); flags in the parameter struct cover the
inputs whose absence is not a neutral value (peephole, per-step cell gradient). T = 0 and N = 0
are answered on the host (:func:`trivial_forward`, :func:`trivial_gradients`; SEMANTICS.md §4
beside the reference): there is nothing to dispatch.

Dispatch budget. The recurrence kernels run a range of processing steps ``[s_begin, s_end)``;
the state crosses from one dispatch to the next in the buffers the kernels write anyway (h and c
forward; dh, dc and the per-row partial sums backward). The work of one step is estimated as
``units = max(D·N·H, 1024) · max(G·H, 32)`` (:func:`step_units`): threads times the
multiply-adds of each thread's recurrent dot product, where fewer than one full threadgroup of
threads, or fewer than 32 multiply-adds, take no less time per step. A dispatch gets
``max(1, budget // units)`` steps, so an op makes ``ceil(T / max(1, budget // units))``
recurrence dispatches: one while ``T · units <= budget``, then one more for every further
``budget // units`` steps (linear in T). The default budget, :data:`DISPATCH_BUDGET` = 2**34
units, keeps one dispatch of v1 an order of magnitude inside the GPU watchdog that public
reports describe, at an assumed 4·10**10 multiply-adds per second on one GPU core (an estimate,
not a measurement: a quarter of an M1 core's peak, since v1 makes three loads per multiply-add;
more cores only shorten it). Every default ``rnngrad bench`` shape stays in one dispatch (the
largest, LSTM 200x64x512x512, is 1.3·10**10 units; bidirectional, two). Override it with the
environment variable ``RNNGRAD_METAL_DISPATCH_BUDGET`` (read at every op) or the host's
``dispatch_budget`` attribute (``HOST.dispatch_budget = 2**30``; ``None`` restores the variable
or the default). The budget applies to every device. Splitting gives bitwise the same results.
strided_gemm is never split: its threads run in parallel, each a loop of K multiply-adds
(K = T·N for the weight gradients).
"""

from __future__ import annotations

import logging

import numpy as np

from ...descriptors import Activation
from ...problem import ForwardArrays, GradientArrays, on_gpu
from . import library, versions
from .gemm import copies_weight, gemm
from .plan import Constant, Plan

F32 = np.float32

#: default work budget of one recurrence dispatch, in units (see the module docstring)
DISPATCH_BUDGET = 2 ** 34
#: environment variable that overrides :data:`DISPATCH_BUDGET`
BUDGET_ENV = "RNNGRAD_METAL_DISPATCH_BUDGET"
#: where the host logs each kernel version it chooses, with the reason (DEBUG)
_LOG = logging.getLogger(__package__)


def _f32(a):
    if on_gpu(a):
        return a.astype(F32)
    return np.ascontiguousarray(a, dtype=F32)


def step_units(problem) -> int:
    """Estimated work of one processing step of a recurrence kernel (module docstring)."""
    threads = problem.D * problem.N * problem.H
    return max(threads, 1024) * max(problem.G * problem.H, 32)


def step_ranges(T: int, units: int, budget: int) -> list:
    """[(s_begin, s_end)]: T processing steps in dispatches of at most ``budget`` units each
    (at least one step per dispatch)."""
    per = max(1, budget // max(units, 1))
    return [(s, min(s + per, T)) for s in range(0, T, per)]


def recurrence(host, plan, problem, direction):
    """(choice, threads, {R's buffer name: slot}) of the op's recurrence dispatches: the
    version versions.recurrence picks (a versions.Choice, logged at DEBUG level when the
    plan is made), and R in the layout its kernel reads (its buffer table names it R or
    Rt)."""
    sizes = dict(cell=problem.cell, direction=direction, D=problem.D, N=problem.N,
                 H=problem.H)
    reset_after = bool(getattr(problem.descriptor, "reset_after", True))  # the GRU's
    choice = versions.recurrence(**sizes, device=host.name, reset_after=reset_after,
                                 peephole=problem.cell == "lstm" and problem.peephole is not None,
                                 declined=frozenset(host.declined))
    _LOG.debug("%s: %s", host.name, choice)
    name = library.BUFFERS[choice.kernel][3 if direction == "forward" else 1]
    weight = plan.input("recurrent_weight", (0, 2, 1) if name == "Rt" else None)  # [D,GH,H]
    return choice, versions.recurrence_count(choice, **sizes), {name: weight}


def _recurrence_launches(host, plan, problem, direction, slots):
    """Add to ``plan`` the recurrence dispatches of ``direction`` with the buffers
    ``slots`` besides R and the parameter struct: the version :func:`recurrence` picks, R
    in its layout, one parameter struct per range of steps (:func:`recurrence_spans`)."""
    choice, count, weight = recurrence(host, plan, problem, direction)
    blocks, spans = recurrence_spans(host, problem, choice, direction)
    for span in spans:
        p = plan.keep(host.params(library.RECURRENCE_PARAMS,
                                  recurrence_values(problem, count, span, blocks)))
        plan.launch(choice.kernel, count, steps=span[1] - span[0], span=span, p=p, **slots,
                    **weight)


def recurrence_spans(host, problem, choice, direction):
    """(unit_blocks, [(s_begin, s_end)] in processing order) of the recurrence dispatches
    under ``choice``: a kernel's own grid (0) over the budget's step ranges, or v3's one-step
    grid (its unit blocks) a step a dispatch, the backward ending with the carry of step 0
    alone (0, 0)."""
    T = problem.T
    if choice.version == "v3":
        blocks = versions.tile_blocks(cell=problem.cell, direction=direction, D=problem.D,
                                      N=problem.N, H=problem.H)[1]
    else:
        spans = host.step_ranges(problem)
        return 0, spans if direction == "forward" else spans[::-1]
    if direction == "forward":
        return blocks, [(s, s + 1) for s in range(T)]
    return blocks, [(s, s + 1) for s in reversed(range(T))] + [(0, 0)]


def recurrence_values(problem, count, span=None, unit_blocks=0):
    """The fields of the RecurrenceParams struct (``library.RECURRENCE_PARAMS``) of one
    dispatch running processing steps ``span`` = ``(s_begin, s_end)`` (default all T), as a
    tuple of ints in the struct's order; ``unit_blocks``: 0 for a kernel's own grid, else a
    one-step grid (v3) with that many blocks of units to a group of rows (a span
    of one step, or none: a backward's last carry)."""
    desc, cell = problem.descriptor, problem.cell
    acts = [Activation.NONE] * 5
    gates = [0, 0, 0, 0]
    values = dict(count=count, T=problem.T, N=problem.N, H=problem.H, D=problem.D,
                  G=problem.G, Z=problem.Z, reverse=int(desc.reverse and problem.D == 1),
                  training=int(desc.training), mask_per_step=int(problem.mask_per_step),
                  has_peephole=0, cell_gradient_per_step=0, reset_after=0, flip_z=0)
    if cell == "single_gate":
        acts[0] = desc.activation
    elif cell == "gru":
        acts[:3] = [desc.update_gate_activation, desc.reset_gate_activation,
                    desc.output_gate_activation]
        gates[:3] = [desc.gate_index[k] for k in "zro"]
        values["reset_after"] = desc.reset_after
        values["flip_z"] = desc.flip_z
    else:
        acts = [desc.input_gate_activation, desc.forget_gate_activation,
                desc.cell_gate_activation, desc.output_gate_activation, desc.activation]
        gates = [desc.gate_index[k] for k in "ifzo"]
        values["has_peephole"] = problem.peephole is not None
        values["cell_gradient_per_step"] = problem.cell_gradient_per_step
    values["s_begin"], values["s_end"] = span if span is not None else (0, problem.T)
    if unit_blocks and values["s_end"] - values["s_begin"] > 1:
        raise ValueError(f"recurrence_values: {unit_blocks} unit block(s) need at most one "
                         f"step a dispatch, got steps {values['s_begin']}..{values['s_end']}")
    values["unit_blocks"] = unit_blocks
    for k in range(5):
        values[f"act{k}"] = acts[k]
    for k in range(4):
        values[f"gate{k}"] = gates[k]
    return tuple(int(values[name]) for name in library.RECURRENCE_PARAMS.names)


def _given(host, plan, problem, field, absent: Constant):
    """The slot of input ``field``, or of the kept constant ``absent`` where it is not
    given (kernels only read it)."""
    if getattr(problem, field) is not None:
        return plan.input(field)
    return plan.keep(host.buffer(absent))


def _common(host, plan, problem):
    """Slots of what every recurrence reads: h0 (zeros when absent) and the mask (ones)."""
    N, DH = problem.N, problem.D * problem.H
    return (_given(host, plan, problem, "init_state", Constant(N * DH)),
            _given(host, plan, problem, "mask", Constant(N * DH, 1.0)))


def forward_plan(host, problem) -> Plan:
    T, N, H, D, G, Z = problem.T, problem.N, problem.H, problem.D, problem.G, problem.Z
    cell, desc = problem.cell, problem.descriptor
    DH, DGH = D * H, D * G * H
    plan = Plan(f"{cell}_forward")
    if problem.input_weight is not None:
        x = plan.empty(T * N * DGH)
        bias = plan.input("bias") if problem.bias is not None else None
        I = problem.I
        if copies_weight(T * N, DGH, I, bias is not None):  # Wᵀ [I,DGH]
            W, b_k, b_col = plan.input("input_weight", (1, 0)), DGH, 1
        else:  # Wᵀ read in place through its strides
            W, b_k, b_col = plan.input("input_weight"), 1, I
        gemm(host, plan, plan.input("source"), W, x, batch=1, M=T * N, P=DGH, K=I, a_row=I,
             a_k=1, b_k=b_k, b_col=b_col, bias=bias)
        x_bias = plan.keep(host.buffer(Constant(DGH)))
    else:
        x = plan.input("source")
        x_bias = _given(host, plan, problem, "bias", Constant(DGH))
    h0, mask = _common(host, plan, problem)
    h = plan.empty(T * N * DH)
    keeps_z = desc.training or cell == "gru"  # GRU stages a_r in z_state
    zs = plan.empty(T * N * D * Z * H) if keeps_z else plan.empty(1)
    if cell == "single_gate":
        slots = dict(x=x, bias=x_bias, h0=h0, mask=mask, h=h, zs=zs)
    elif cell == "gru":
        slots = dict(x=x, bias=x_bias, h0=h0, mask=mask, h=h, zs=zs,
                     b2=_given(host, plan, problem, "secondary_bias", Constant(DH)))
    else:
        c = plan.empty(T * N * DH)
        slots = dict(x=x, bias=x_bias, h0=h0, mask=mask, h=h, c=c, zs=zs,
                     c0=_given(host, plan, problem, "init_cell", Constant(N * DH)),
                     peephole=_given(host, plan, problem, "peephole", Constant(D * 4 * H)))
        if desc.training or desc.produce_cell:
            plan.output("c", c, (T, N, DH))
    # Steps upward; each dispatch starts from the h (and c) the previous one wrote.
    _recurrence_launches(host, plan, problem, "forward", slots)
    plan.output("h", h, (T, N, DH))
    if desc.training:
        plan.output("z_state", zs, (T, N, D * Z * H))
    return plan


def gradients_plan(host, problem) -> Plan:
    T, N, H, D, G = problem.T, problem.N, problem.H, problem.D, problem.G
    cell, desc = problem.cell, problem.descriptor
    DH, GH, DGH = D * H, G * H, D * G * H
    plan = Plan(f"{cell}_gradients")
    h0, mask = _common(host, plan, problem)
    dy = plan.input("source_gradient")
    zs = plan.input("z_state")
    # dhn: written (dh carries over in it), so a copy of state_gradient
    given_sg = problem.state_gradient is not None
    dhn = plan.input("state_gradient", written=True) if given_sg else plan.zeroed(N * DH)
    dx = plan.empty(T * N * DGH)
    lhs = dx  # the left factor of dR: da, except GRU's o block with reset_after
    # rhs: h[t−1] ⊙ m per direction; GRU without reset_after adds blocks so that its o
    # gate reads h[t−1] ⊙ r ⊙ m: [hm, hm, hm ⊙ r].
    rhs_blocks = 3 if (cell == "gru" and not desc.reset_after) else 1
    rhs = plan.empty(T * N * D * rhs_blocks * H)
    prow = None
    if cell == "single_gate":
        slots = dict(h0=h0, mask=mask, dy=dy, zs=zs, dx=dx, rhs=rhs, dhn=dhn)
    elif cell == "gru":
        lhs = plan.empty(T * N * DGH)
        prow = plan.zeroed(D * N * H)
        slots = dict(h0=h0, mask=mask, dy=dy, zs=zs, hfwd=plan.input("output_fwd"), dx=dx,
                     lhs=lhs, rhs=rhs, dhn=dhn, work=plan.empty(D * N * H), prow=prow)
    else:
        cg = problem.cell_gradient
        final = cg is not None and cg.ndim == 2
        # dcn: written, so a copy of a final cell_gradient
        dcn = plan.input("cell_gradient", written=True) if final else plan.zeroed(N * DH)
        prow = plan.zeroed(D * N * 4 * H)
        slots = dict(
            h0=h0, mask=mask, dy=dy, zs=zs, dx=dx, rhs=rhs, dhn=dhn, dcn=dcn, prow=prow,
            c0=_given(host, plan, problem, "init_cell", Constant(N * DH)),
            peephole=_given(host, plan, problem, "peephole", Constant(D * 4 * H)),
            cfwd=plan.input("cell_output_fwd"),
            cg=plan.input("cell_gradient") if problem.cell_gradient_per_step
            else plan.empty(1))
    # Steps downward; dh (dc) and the per-row partial sums carry over in dhn (dcn), prow.
    _recurrence_launches(host, plan, problem, "backward", slots)
    rows = T * N
    dR = plan.empty(D * GH * H)
    gemm(host, plan, lhs, rhs, dR, batch=D, M=GH, P=H, K=rows, a_batch=GH, a_row=1,
         a_k=DGH, b_batch=rhs_blocks * H, b_k=D * rhs_blocks * H, b_col=1, block=H,
         b_block=H if rhs_blocks == 3 else 0)
    plan.output("recurrent_weight", dR, (D, GH, H))
    ones = plan.keep(host.buffer(Constant(1, 1.0)))
    if problem.input_weight is not None:
        I = problem.I
        W = plan.input("input_weight")
        d_source = plan.empty(rows * I)
        gemm(host, plan, dx, W, d_source, batch=1, M=rows, P=I, K=DGH, a_row=DGH,
             a_k=1, b_k=I, b_col=1)
        dW = plan.empty(DGH * I)
        gemm(host, plan, dx, plan.input("source"), dW, batch=1, M=DGH, P=I, K=rows, a_row=1,
             a_k=DGH, b_k=I, b_col=1)
        plan.output("source", d_source, (T, N, I))
        plan.output("input_weight", dW, (DGH, I))
    else:
        plan.output("source", dx, (T, N, DGH))
    if problem.bias is not None:
        db = plan.empty(DGH)
        gemm(host, plan, ones, dx, db, batch=1, M=1, P=DGH, K=rows, b_k=DGH, b_col=1)
        plan.output("bias", db, (1, 1, DGH))
    if problem.init_state is not None:
        plan.output("init_state", dhn, (N, DH))
    if cell == "lstm" and problem.init_cell is not None:
        plan.output("init_cell", dcn, (N, DH))
    if cell == "lstm" and problem.peephole is not None:
        dp = plan.empty(D * 4 * H)
        gemm(host, plan, ones, prow, dp, batch=D, M=1, P=4 * H, K=N, b_batch=N * 4 * H,
             b_k=4 * H, b_col=1)
        plan.output("peephole", dp, (D, 4 * H))
    if cell == "gru" and problem.secondary_bias is not None:
        db2 = plan.empty(DH)
        gemm(host, plan, ones, prow, db2, batch=D, M=1, P=H, K=N, b_batch=N * H, b_k=H,
             b_col=1)
        plan.output("secondary_bias", db2, (DH,))
    return plan


def trivial_forward(problem) -> ForwardArrays:
    """T = 0 or N = 0: empty outputs (SEMANTICS.md §4)."""
    T, N, D, desc = problem.T, problem.N, problem.D, problem.descriptor
    wants_c = problem.cell == "lstm" and (desc.training or desc.produce_cell)
    empty = np.zeros((T, N, D * problem.H), F32)
    return ForwardArrays(empty, empty.copy() if wants_c else None,
                         np.zeros((T, N, D * problem.Z * problem.H), F32)
                         if desc.training else None)


def trivial_gradients(problem) -> GradientArrays:
    """T = 0 or N = 0: nothing flows through the recurrence (SEMANTICS.md §4)."""
    N, H, D, G = problem.N, problem.H, problem.D, problem.G
    DH, DGH = D * H, D * G * H
    zeros = lambda *shape: np.zeros(shape, F32)  # noqa: E731
    out = GradientArrays(source=zeros(*problem.source.shape),
                         recurrent_weight=zeros(D, G * H, H))
    if problem.input_weight is not None:
        out.input_weight = zeros(DGH, problem.I)
    if problem.bias is not None:
        out.bias = zeros(1, 1, DGH)
    if problem.init_state is not None:
        sg = problem.state_gradient
        out.init_state = _f32(sg) if sg is not None else zeros(N, DH)
    if problem.init_cell is not None:
        cg = problem.cell_gradient
        final = cg is not None and cg.ndim == 2
        out.init_cell = _f32(cg) if final else zeros(N, DH)
    if problem.peephole is not None:
        out.peephole = zeros(D, 4 * H)
    if problem.secondary_bias is not None:
        out.secondary_bias = zeros(DH)
    return out
