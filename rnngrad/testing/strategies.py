"""Hypothesis strategies that draw complete problems for the six ops, and the regression set.

Use them to fuzz any RNN implementation against rnngrad's float64 reference::

    from hypothesis import given, settings
    import rnngrad.testing.strategies as rs
    from rnngrad.testing import assert_matches_reference

    @settings(max_examples=200, deadline=None)
    @given(rs.cases("lstm_gradients", dtypes=("float32",)))
    def test_my_lstm(case):
        assert_matches_reference(my_lstm_gradients, case, "lstm_gradients")

or let :func:`rnngrad.testing.check_backend` do all of it. Every strategy draws a
:class:`rnngrad.testing.cases.Case`: the cell, every descriptor option, each optional input present or
absent, the sizes (small by default, with the boundary sizes T ∈ {0, 1}, N ∈ {0, 1, 31, 32, 33},
H and I ∈ {1, 31, 32, 33} drawn now and then, all under one global cap on the number of
elements), the dtype, the values and, for LSTM, both forms of ``cell_gradient``. Every knob is
keyword-only and may be a fixed value or a strategy. Shrinking goes towards the smallest sizes,
the descriptor defaults and absent optional inputs, so a failure shrinks to a short
reproduction. :func:`rnngrad.testing.case_source` gives Python that rebuilds a case exactly
(empty arrays and NaN included; ``repr(case)`` loses the shape of empty arrays) and
:func:`rnngrad.testing.reproduction` writes the whole script.

Values (``values=``):

- ``"contractive"`` (default): unit-normal inputs, recurrent weights scaled by 0.5/√H, so the
  recurrence neither explodes nor saturates and every gradient is informative;
- ``"saturating"``: inputs and biases large enough to drive gates to 0 or 1 and hard_sigmoid past
  its edges;
- ``"nonfinite"``: contractive, plus one NaN, +Inf or −Inf in the source of one batch row.

The regression set (:data:`REGRESSIONS`, :func:`regression_cases`) is a list of explicit,
named problems, one per bug class that real RNN backends have shipped.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .cases import CELLS, OPS, Case, op_info, op_name, random_case
from ..descriptors import DESCRIPTORS, Activation

try:
    from hypothesis import strategies as st
except ImportError:  # the regression set works without hypothesis
    st = None


#: sizes drawn now and then, per dimension: the degenerate ones and those around a SIMD width of 32
BOUNDARY_SIZES = {"T": (0, 1), "N": (0, 1, 31, 32, 33), "I": (1, 31, 32, 33), "H": (1, 31, 32, 33)}

#: optional inputs of each cell (mask_per_step chooses the [T,N,D·H] mask form)
OPTIONAL = {
    "single_gate": ("input_weight", "bias", "init_state", "mask", "mask_per_step", "state_gradient"),
    "gru": ("input_weight", "bias", "init_state", "mask", "mask_per_step", "secondary_bias",
            "state_gradient"),
    "lstm": ("input_weight", "bias", "init_state", "init_cell", "mask", "mask_per_step",
             "peephole", "state_gradient", "cell_gradient"),
}

VALUES = ("contractive", "saturating", "nonfinite")

# Activations a field may take while the recurrence stays bounded; the default comes first so
# that shrinking goes to it.
_ALL = (Activation.TANH, Activation.SIGMOID, Activation.HARD_SIGMOID, Activation.RELU, Activation.NONE)
_GATE = (Activation.SIGMOID, Activation.HARD_SIGMOID, Activation.TANH)
_ACTIVATION_CHOICES = {
    "single_gate": {"activation": (Activation.RELU, Activation.TANH, Activation.SIGMOID,
                                   Activation.HARD_SIGMOID, Activation.NONE)},
    "gru": {"update_gate_activation": _GATE,
            "reset_gate_activation": _GATE + (Activation.NONE,),
            "output_gate_activation": _ALL},
    "lstm": {"input_gate_activation": _GATE, "forget_gate_activation": _GATE,
             "cell_gate_activation": _ALL, "output_gate_activation": _GATE, "activation": _ALL},
}


def _require_hypothesis():
    if st is None:
        raise ImportError("rnngrad.testing.strategies needs hypothesis (pip install hypothesis)")


def _fixed_or(draw, value, default_strategy):
    """A knob: None draws from the default strategy, a strategy is drawn from, a value is used."""
    if value is None:
        return draw(default_strategy)
    if isinstance(value, st.SearchStrategy):
        return draw(value)
    return value


def descriptors(cell, **fixed):
    """A strategy of descriptors of ``cell`` with every option drawn, except those in ``fixed``
    (values or strategies). Shrinks to MPSGraph's defaults."""
    _require_hypothesis()
    if cell not in CELLS:
        raise ValueError(f"cell: expected one of {CELLS}, got {cell!r}")
    cls = DESCRIPTORS[cell]
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = set(fixed) - set(fields)
    if unknown:
        raise ValueError(f"descriptor options: expected fields of {cls.__name__} {fields}, got {sorted(unknown)}")

    @st.composite
    def draw_descriptor(draw):
        options = {}
        for name in fields:
            if name in _ACTIVATION_CHOICES[cell]:
                default = st.sampled_from(_ACTIVATION_CHOICES[cell][name])
            else:
                default = st.booleans()
            options[name] = _fixed_or(draw, fixed.get(name), default)
        return cls(**options)

    return draw_descriptor()


def _elements(T, N, I, H, D, G, Z):
    """A size measure of a problem: the sequences plus the weights."""
    return T * N * (D * Z * H + (I or 0) + D * H) + D * G * H * (H + (I or 0))


def cases(op=None, *, cells=None, T=None, N=None, I=None, H=None, max_size=4,
          boundary=True, max_elements=6000, dtypes=("float32",), values="contractive",
          descriptor=None, optional=None, cell_gradient_form=None, zero_source_gradient=None,
          empty=True):
    """A strategy of complete problems (:class:`rnngrad.testing.cases.Case`).

    op: an op name (``"gru_gradients"``) fixes the cell; or ``cells``, a tuple of cells to draw
        from (default all three).
    T, N, I, H: fixed sizes or strategies; None draws 1..max_size, or now and then (when
        ``boundary``) one of :data:`BOUNDARY_SIZES`, as long as the problem stays under
        ``max_elements`` (see ``_elements``). I is only used with an input_weight.
    dtypes: the dtypes to draw (inputs are rounded to it; the reference computes in float64).
    values: one of :data:`VALUES`.
    descriptor: a descriptor, a strategy of them, or a dict of fixed options (the others drawn).
    optional: {name: bool} forcing optional inputs present or absent (names in :data:`OPTIONAL`).
    cell_gradient_form: "per_step" or "final" (LSTM); None draws it.
    zero_source_gradient: True makes source_gradient zero (only the final state and cell carry
        upstream gradients); None draws it (one problem in eight).
    empty: False never draws T = 0 or N = 0.
    """
    _require_hypothesis()
    if op is not None:
        cells = (op_info(op)[0],)
    cells = tuple(cells or CELLS)
    for cell in cells:
        if cell not in CELLS:
            raise ValueError(f"cells: expected cells among {CELLS}, got {cell!r}")
    if values not in VALUES:
        raise ValueError(f"values: expected one of {VALUES}, got {values!r}")
    if cell_gradient_form not in (None, "per_step", "final"):
        raise ValueError(f"cell_gradient_form: expected None, 'per_step' or 'final', got {cell_gradient_form!r}")
    dtypes = tuple(np.dtype(d) for d in dtypes)
    optional = dict(optional or {})
    known = set().union(*OPTIONAL.values())
    if set(optional) - known:
        raise ValueError(f"optional: expected names among {sorted(known)}, got {sorted(set(optional) - known)}")

    @st.composite
    def draw_case(draw):
        cell = draw(st.sampled_from(cells))
        if descriptor is None or isinstance(descriptor, dict):
            desc = draw(descriptors(cell, **(descriptor or {})))
        else:
            desc = _fixed_or(draw, descriptor, None)
        D, G = (2 if desc.bidirectional else 1), desc.gates
        Z = 4 if (cell == "gru" and desc.reset_after) else G
        present = {}
        for name in OPTIONAL[cell]:
            present[name] = _fixed_or(draw, optional.get(name), st.booleans())
        sizes = {"T": T, "N": N, "I": I, "H": H}
        chosen = {"T": 1, "N": 1, "I": 1 if present["input_weight"] else None, "H": 1}
        for dim in ("H", "N", "T", "I"):
            if dim == "I" and not present["input_weight"]:
                continue
            given = sizes[dim]
            if given is not None:
                chosen[dim] = _fixed_or(draw, given, None)
                continue
            lo = 0 if dim in ("T", "N") else 1

            def fits(value, dim=dim):
                trial = dict(chosen, **{dim: value})
                return _elements(trial["T"], trial["N"], trial["I"], trial["H"], D, G, Z) <= max_elements

            special = [s for s in BOUNDARY_SIZES[dim] if s > 1 and fits(s)] if boundary else []
            # Most draws are small; about one in eight is empty (T, N) and one in six takes a
            # size around the SIMD width (N, H, I). Shrinks to 1.
            pick = draw(st.integers(0, 23))
            if boundary and empty and lo == 0 and pick in (21, 22, 23):
                chosen[dim] = 0
            elif special and pick in (17, 18, 19, 20):
                chosen[dim] = draw(st.sampled_from(special))
            else:
                small = [s for s in range(1, max_size + 1) if fits(s)] or [lo]
                chosen[dim] = draw(st.sampled_from(small))
        form = cell_gradient_form
        if cell == "lstm" and present.get("cell_gradient") and form is None:
            form = draw(st.sampled_from(("per_step", "final")))
        # One in eight problems has upstream gradients on the final state (and cell) only.
        zero_output_gradient = _fixed_or(draw, zero_source_gradient, st.integers(0, 7).map(lambda k: k == 7))
        dtype = draw(st.sampled_from(dtypes))
        seed = draw(st.integers(0, 2**32 - 1))
        case = random_case(seed, cell, T=chosen["T"], N=chosen["N"], I=chosen["I"] or 1,
                           H=chosen["H"], descriptor=desc, optional=present, dtype=np.float64,
                           scale=0.5 if values != "saturating" else 1.0, cell_gradient_form=form)
        if zero_output_gradient:
            case = dataclasses.replace(case, source_gradient=np.zeros_like(case.source_gradient))
        rng = np.random.default_rng(seed + 1)
        if values == "saturating":
            case = _saturate(case)
        elif values == "nonfinite" and case.T > 0 and case.inputs["source"].shape[1] > 0:
            kind = draw(st.sampled_from((np.nan, np.inf, -np.inf)))
            case = _poison(case, rng, kind)
        return case.astype(dtype)

    return draw_case()


def _saturate(case: Case) -> Case:
    """Pre-activations of several units: gates at 0 or 1, hard_sigmoid beyond ±2.5."""
    inputs = dict(case.inputs)
    inputs["source"] = inputs["source"] * 6.0
    if "bias" in inputs:
        inputs["bias"] = inputs["bias"] * 6.0
    return dataclasses.replace(case, inputs=inputs)


def _poison(case: Case, rng, value, row=None) -> Case:
    """One NaN or infinity in the source of one batch row (at one step, one feature)."""
    source = case.inputs["source"].copy()
    T, N, F = source.shape
    n = int(rng.integers(N)) if row is None else row
    source[int(rng.integers(T)), n, int(rng.integers(F))] = value
    return dataclasses.replace(case, inputs=dict(case.inputs, source=source))


def ops(gradients=None):
    """A strategy of op names (all six, or only forward / only gradient ops)."""
    _require_hypothesis()
    return st.sampled_from([op for op, (_, g) in OPS.items() if gradients is None or g == gradients])


# -- the regression set -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Regression:
    """A named bug class and how to build its explicit problem for a cell."""

    name: str
    description: str
    cells: tuple
    sizes: dict
    descriptor: dict
    optional: dict
    cell_gradient_form: str = "final"
    zero_source_gradient: bool = False
    binary_mask: bool = False
    nan_row: bool = False


_ALL_ON = {"input_weight": True, "bias": True, "init_state": True, "init_cell": True,
           "state_gradient": True, "cell_gradient": True, "peephole": True, "secondary_bias": False}

REGRESSIONS = (
    Regression("batch_first_backward",
               "T ≠ N with every input: a [T,N] ↔ [N,T] mix-up in the backward pass changes values",
               CELLS, dict(T=3, N=2, I=3, H=3), dict(training=True), dict(_ALL_ON, mask=False)),
    Regression("batch_first_square",
               "T = N: a transposed source gradient keeps its shape, only the values tell",
               CELLS, dict(T=3, N=3, I=2, H=2), dict(training=True),
               dict(_ALL_ON, input_weight=False, mask=False)),
    Regression("bidirectional_alignment",
               "bidirectional outputs aligned with input time, backward half reversed back",
               CELLS, dict(T=4, N=2, I=3, H=2), dict(bidirectional=True, training=True),
               dict(_ALL_ON, mask=False)),
    Regression("bidirectional_final_state",
               "the backward direction's final state is at t = 0: only state gradients upstream",
               CELLS, dict(T=3, N=2, I=2, H=2), dict(bidirectional=True, training=True),
               dict(_ALL_ON, mask=False), zero_source_gradient=True),
    Regression("final_state_only",
               "only the final state (and final cell) has an upstream gradient; source_gradient is 0",
               CELLS, dict(T=4, N=2, I=2, H=3), dict(training=True), dict(_ALL_ON, mask=False),
               zero_source_gradient=True),
    Regression("reverse_final_state",
               "reverse: outputs stay in processing order; the final state is h[T−1]",
               CELLS, dict(T=4, N=2, I=2, H=2), dict(reverse=True, training=True),
               dict(_ALL_ON, mask=False), zero_source_gradient=False),
    Regression("no_bias",
               "no bias given: no bias gradient may be returned and the others keep their slots",
               CELLS, dict(T=3, N=2, I=2, H=2), dict(training=True),
               dict(_ALL_ON, bias=False, mask=False)),
    Regression("gru_secondary_bias",
               "reset_after with secondary_bias: b2 sits inside r ⊙ (h R_oᵀ + b2), not in the bias",
               ("gru",), dict(T=3, N=2, I=2, H=3), dict(reset_after=True, training=True),
               dict(_ALL_ON, secondary_bias=True, mask=False)),
    Regression("gru_secondary_bias_unused",
               "secondary_bias with reset_after = False is unused and gets a zero gradient",
               ("gru",), dict(T=3, N=2, I=2, H=2), dict(reset_after=False, training=True),
               dict(_ALL_ON, secondary_bias=True, mask=False)),
    Regression("gru_reset_before",
               "reset_after = False: r multiplies h before the matrix product",
               ("gru",), dict(T=3, N=2, I=2, H=3), dict(reset_after=False, training=True),
               dict(_ALL_ON, mask=False)),
    Regression("gru_reset_after",
               "reset_after = True: r multiplies the matrix product",
               ("gru",), dict(T=3, N=2, I=2, H=3), dict(reset_after=True, training=True),
               dict(_ALL_ON, mask=False)),
    Regression("mask_backward",
               "a 0/1 mask must be applied in the backward pass as in the forward",
               CELLS, dict(T=3, N=3, I=2, H=3), dict(training=True),
               dict(_ALL_ON, mask=True, mask_per_step=False), binary_mask=True),
    Regression("mask_per_step",
               "a [T,N,D·H] mask is indexed by processing step, also for the backward direction",
               CELLS, dict(T=3, N=2, I=2, H=2), dict(bidirectional=True, training=True),
               dict(_ALL_ON, mask=True, mask_per_step=True), binary_mask=True),
    Regression("empty_sequence",
               "T = 0: empty outputs, zero weight gradients, d init_state = state_gradient",
               CELLS, dict(T=0, N=2, I=2, H=2), dict(training=True), dict(_ALL_ON, mask=False)),
    Regression("empty_batch",
               "N = 0: empty outputs and zero weight gradients, no error",
               CELLS, dict(T=2, N=0, I=2, H=2), dict(training=True), dict(_ALL_ON, mask=False)),
    Regression("nan_row",
               "a NaN in one batch row stays in that row (and the parameter gradients)",
               CELLS, dict(T=3, N=3, I=2, H=2), dict(training=True),
               dict(_ALL_ON, mask=False), nan_row=True),
)


def regression_case(regression, cell, *, dtype=np.float32, seed=0) -> Case:
    """The explicit problem of one regression (a :class:`Regression` or its name) for a cell."""
    if isinstance(regression, str):
        by_name = {r.name: r for r in REGRESSIONS}
        if regression not in by_name:
            raise ValueError(f"regression: expected one of {tuple(by_name)}, got {regression!r}")
        regression = by_name[regression]
    if cell not in regression.cells:
        raise ValueError(f"cell: regression {regression.name!r} applies to {regression.cells}, got {cell!r}")
    cls = DESCRIPTORS[cell]
    fields = {f.name for f in dataclasses.fields(cls)}
    desc = cls(**{k: v for k, v in regression.descriptor.items() if k in fields})
    if cell == "lstm":
        desc = dataclasses.replace(desc, produce_cell=True)
    optional = {k: v for k, v in regression.optional.items() if k in OPTIONAL[cell]}
    rng = np.random.default_rng([seed, CELLS.index(cell), [r.name for r in REGRESSIONS].index(regression.name)])
    case = random_case(rng, cell, descriptor=desc, optional=optional, dtype=np.float64,
                       cell_gradient_form=regression.cell_gradient_form, **regression.sizes)
    if regression.zero_source_gradient:
        case = dataclasses.replace(case, source_gradient=np.zeros_like(case.source_gradient))
    if regression.binary_mask:
        mask = case.inputs["mask"]
        mask = (rng.random(mask.shape) > 0.4).astype(np.float64)  # 0/1, about 40% zeros
        case = dataclasses.replace(case, inputs=dict(case.inputs, mask=mask))
    if regression.nan_row:
        case = _poison(case, rng, np.nan, row=1)
    return case.astype(dtype)


def regression_cases(op=None, *, cell=None, dtype=np.float32, seed=0) -> list:
    """[(regression name, Case)] for every regression that applies to the op's (or cell's)
    cell; all cells when neither is given. For a forward op, the regressions that differ only
    in their upstream gradients are left out and the others named for what a forward shows
    (``batch_first`` for ``batch_first_backward``)."""
    forward = False
    if op is not None:
        cell, forward = op_info(op)[0], not op_info(op)[1]
    chosen = (cell,) if cell is not None else CELLS
    out = []
    for c in chosen:
        for r in REGRESSIONS:
            if c not in r.cells or (forward and r.zero_source_gradient):
                continue
            name = r.name.replace("_backward", "") if forward else r.name
            out.append((name if cell is not None else f"{name}[{c}]",
                        regression_case(r, c, dtype=dtype, seed=seed)))
    return out


def regressions(op=None, *, cell=None, dtype=np.float32):
    """A strategy that draws one of the regression problems (for ``@given``)."""
    _require_hypothesis()
    return st.sampled_from([case for _, case in regression_cases(op, cell=cell, dtype=dtype)])


__all__ = ["OPS", "BOUNDARY_SIZES", "OPTIONAL", "VALUES", "REGRESSIONS", "Regression", "cases",
           "descriptors", "ops", "op_info", "op_name", "regression_case", "regression_cases",
           "regressions"]
