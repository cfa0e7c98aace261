"""Comparing a backend's results with the float64 reference: one tolerance table.

The reference is always evaluated in float64 on the candidate's dtype-rounded inputs, so the
tolerance only has to cover the candidate's own arithmetic. Quantities come in three kinds:

- ``output``: h, c, z_state: ``|got − want| ≤ atol + rtol·|want|`` element-wise;
- ``state``: the gradients of source, init_state, init_cell: the same form;
- ``parameter``: the gradients of recurrent_weight, input_weight, bias, peephole, secondary_bias,
  which sum over T·N rows: ``|got − want| ≤ rtol·max|want| + atol``, i.e. relative to their
  magnitude.

NaN must be NaN in both (a NaN where the reference has a number, or the reverse, is a mismatch);
infinities must be equal.

On top of the table, for the authors of other RNN implementations:

- :func:`assert_matches_reference` checks one problem (a :class:`rnngrad.cases.Case`) and raises
  :class:`ReferenceMismatch` (an ``AssertionError``) naming the quantity, the worst index, both
  values, the tolerance and a runnable reproduction;
- :func:`check_backend` fuzzes a candidate (a backend name, or any callable with the signature of
  the rnngrad function named by ``op``) with the regression set and then with
  :mod:`rnngrad.strategies`, and raises the shrunk, minimal reproduction of the first mismatch;
- :func:`load_vectors` and :func:`check_vectors` read the golden vectors written by
  ``rnngrad export-vectors`` and check a candidate against them, without hypothesis.

``check_case`` is the one comparison under all of them, and under ``rnngrad verify``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

KINDS = {
    "state": "output", "cell": "output", "z_state": "output",
    "source": "state", "init_state": "state", "init_cell": "state",
    "recurrent_weight": "parameter", "input_weight": "parameter", "bias": "parameter",
    "peephole": "parameter", "secondary_bias": "parameter",
}

#: (dtype, kind) -> (atol, rtol)
TOLERANCES = {
    ("float64", "output"): (1e-11, 1e-9),
    ("float64", "state"): (1e-11, 1e-9),
    ("float64", "parameter"): (1e-11, 1e-9),
    ("float32", "output"): (5e-5, 2e-4),
    ("float32", "state"): (5e-5, 2e-4),
    ("float32", "parameter"): (5e-5, 2e-4),
    ("float16", "output"): (5e-3, 1e-2),
    ("float16", "state"): (5e-3, 1e-2),
    ("float16", "parameter"): (5e-3, 1e-2),
}


def tolerance(dtype, quantity):
    """(atol, rtol, kind) for a quantity name (an attribute of a result) in a dtype."""
    kind = KINDS[quantity]
    atol, rtol = TOLERANCES[(np.dtype(dtype).name, kind)]
    return atol, rtol, kind


@dataclasses.dataclass
class Mismatch:
    quantity: str
    index: tuple
    got: float
    want: float
    allowed: float
    atol: float
    rtol: float
    kind: str

    def __str__(self):
        return (f"{self.quantity}{list(self.index)}: got {self.got!r}, reference {self.want!r}, "
                f"|difference| {abs(self.got - self.want):.3g} > allowed {self.allowed:.3g} "
                f"({self.kind} tolerance: atol={self.atol:g}, rtol={self.rtol:g})")


def compare_array(quantity, got, want, dtype):
    """(worst error as a fraction of the allowed error, Mismatch or None)."""
    atol, rtol, kind = tolerance(dtype, quantity)
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return np.inf, Mismatch(quantity, (), np.nan, np.nan, 0.0, atol, rtol, f"shape {got.shape} vs {want.shape}")
    if want.size == 0:
        return 0.0, None
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    bad_nan = nan_g != nan_w
    inf_w = np.isinf(want) | np.isinf(got)
    bad_inf = inf_w & ~nan_w & ~nan_g & (got != want)
    finite = ~(nan_g | nan_w | inf_w)
    if kind == "parameter":
        scale = float(np.max(np.abs(want[finite]), initial=0.0))
        allowed = np.full(want.shape, atol + rtol * scale)
    else:
        allowed = atol + rtol * np.abs(np.where(finite, want, 0.0))
    with np.errstate(invalid="ignore"):  # inf − inf where not finite, masked out here
        diff = np.where(finite, np.abs(got - want), 0.0)
    ratio = diff / allowed
    ratio = np.where(bad_nan | bad_inf, np.inf, ratio)
    at = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    worst = float(ratio[at])
    if worst <= 1.0:
        return worst, None
    return worst, Mismatch(quantity, tuple(int(i) for i in at), float(got[at]), float(want[at]),
                           float(allowed[at]), atol, rtol, kind)


def compare_results(got, want, dtype):
    """Compare two results of the same op (ForwardResult or GradientResult).
    Returns (worst ratio, [Mismatch]); names and order must agree too."""
    if tuple(got.names) != tuple(want.names):
        return np.inf, [Mismatch("entries", (), np.nan, np.nan, 0.0, 0.0, 0.0,
                                 f"entries {got.names} vs reference {want.names}")]
    worst, mismatches = 0.0, []
    for name in want.names:
        ratio, mismatch = compare_array(name, getattr(got, name), getattr(want, name), dtype)
        worst = max(worst, ratio)
        if mismatch:
            mismatches.append(mismatch)
    return worst, mismatches


class ReferenceMismatch(AssertionError):
    """A candidate's result differs from the float64 reference (or the candidate raised).

    Attributes: ``op``; ``case`` (the problem, shrunk when found by :func:`check_backend`);
    ``label`` (the regression's name, or None); ``mismatches`` ([:class:`Mismatch`], one per
    quantity); ``examples`` (how many problems :func:`check_backend` had checked when it met the
    first failing one, or None).
    """

    def __init__(self, message, *, op, case, label=None, mismatches=(), candidate=None):
        super().__init__(message)
        self.op, self.case, self.label = op, case, label
        self.mismatches = list(mismatches)
        self.candidate = candidate
        self.examples = None


def _op_of(case, op):
    from .strategies import op_info, op_name

    if op is None:
        return op_name(case.cell, False), False
    cell, gradients = op_info(op)
    if cell != case.cell:
        raise ValueError(f"op: {op!r} computes a {cell} cell, got a case of cell {case.cell!r}")
    return op, gradients


def _public(op, backend):
    """The rnngrad function ``op`` bound to a backend name."""
    import functools

    from . import api

    return functools.partial(getattr(api, op), backend=backend)


def _named(result, want, op):
    """The candidate's result as a ForwardResult/GradientResult: as returned when it names its
    entries, else a sequence taken in MPSGraph's order (the reference's entry names)."""
    from .results import ForwardResult, GradientResult

    if hasattr(result, "names") and hasattr(result, "as_dict"):
        return result
    entries = [np.asarray(e) for e in result]
    if len(entries) != len(want.names):
        return None
    cls = GradientResult if isinstance(want, GradientResult) else ForwardResult
    return cls(list(zip(want.names, entries)))


def _training_outputs(case, forward):
    """(h, c or None, z_state) of a training forward through the callable ``forward``."""
    desc = dataclasses.replace(case.descriptor, training=True)
    out = forward(**case.inputs, descriptor=desc)
    if hasattr(out, "z_state"):
        return out.state, out.cell, out.z_state
    out = list(out)
    return (out[0], out[1], out[2]) if case.cell == "lstm" else (out[0], None, out[1])


def run_candidate(case, op, candidate, *, forward=None):
    """The candidate's result for ``case``: ``candidate`` is a backend name or a callable with the
    signature of the rnngrad function ``op``. For a gradient op, z_state (and output_fwd /
    cell_output_fwd) come from ``forward`` (a backend name or a callable with the forward op's
    signature); by default from the candidate's own backend when it is a name, else from the
    reference."""
    from .strategies import op_info, op_name

    cell, gradients = op_info(op)
    fn = _public(op, candidate) if isinstance(candidate, str) else candidate
    if not gradients:
        return fn(**case.inputs, descriptor=case.descriptor)
    if forward is None:
        forward = candidate if isinstance(candidate, str) else "reference"
    if isinstance(forward, str):
        forward = _public(op_name(cell, False), forward)
    h, c, z = _training_outputs(case, forward)
    return fn(**case.gradient_kwargs(h, c, z))


def reference_result(case, op):
    """The float64 reference's result for the case's inputs (already rounded to its dtype)."""
    from .strategies import op_info

    gradients = op_info(op)[1]
    reference = case.astype(np.float64)
    return reference.gradients(backend="reference") if gradients else reference.forward(backend="reference")


def check_case(case, backend, gradients: bool, *, forward_backend=None, forward=None):
    """Run one :class:`~rnngrad.cases.Case` through ``backend`` (a backend name, or a callable
    with the signature of the rnngrad function) and through the float64 reference on the same
    dtype-rounded inputs. Returns (worst ratio to the allowed error, [Mismatch]).

    For gradients, the candidate's own training forward feeds its gradient op when ``backend``
    is a name; ``forward_backend`` (a name) or ``forward`` (a callable with the forward op's
    signature) choose another one, for mixed pipelines; a callable candidate without either is
    fed by the reference forward. The reference's gradient op is fed by the reference forward,
    so a wrong z_state shows up as a gradient mismatch. Exceptions of the candidate propagate.
    """
    from .strategies import op_name

    dtype = case.dtype
    op = op_name(case.cell, gradients)
    got = run_candidate(case, op, backend, forward=forward if forward is not None else forward_backend)
    want = reference_result(case, op)
    named = _named(got, want, op)
    if named is None:
        return np.inf, [Mismatch("entries", (), np.nan, np.nan, 0.0, 0.0, 0.0,
                                 f"{len(list(got))} entries, reference has {want.names}")]
    for name, entry in zip(named.names, named):
        if np.asarray(entry).dtype != dtype:
            return np.inf, [Mismatch(name, (), np.nan, np.nan, 0.0, 0.0, 0.0,
                                     f"dtype {np.asarray(entry).dtype}, expected {dtype}")]
    return compare_results(named, want, dtype)


# -- assertions and reproductions ---------------------------------------------------------------

def _array_source(a):
    if a is None:
        return "None"
    a = np.asarray(a)
    if a.size == 0:  # array2string drops the shape of an empty array
        return f"np.empty({a.shape}, dtype=np.{a.dtype})"
    body = np.array2string(a, separator=", ", threshold=np.inf, floatmode="unique", max_line_width=100)
    return f"np.array({body}, dtype=np.{a.dtype})"


def case_source(case) -> str:
    """Python that rebuilds ``case`` exactly (with ``np``, ``rg``, ``Case``, ``nan`` and ``inf``
    in scope), empty arrays and non-finite values included."""
    from .cases import _repr_descriptor

    lines = ["Case(", f"    cell={case.cell!r},", f"    descriptor={_repr_descriptor(case.descriptor)},",
             "    inputs={"]
    lines += [f"        {k!r}: {_array_source(v)}," for k, v in case.inputs.items()]
    lines.append("    },")
    for name in ("source_gradient", "state_gradient", "cell_gradient"):
        lines.append(f"    {name}={_array_source(getattr(case, name))},")
    return "\n".join(lines + [")"])


def _case_repr(case):
    return case_source(case)


def reproduction(case, op, candidate=None, *, forward=None) -> str:
    """A Python script that rebuilds ``case`` and repeats the check of ``op``."""
    if isinstance(candidate, str):
        target = repr(candidate)
        setup = ""
    else:
        where = getattr(candidate, "__module__", None), getattr(candidate, "__qualname__", None)
        hint = f"{where[0]}.{where[1]}" if all(where) else "your function"
        target = "candidate"
        setup = f"candidate = ...  # {hint}, with the signature of rnngrad.{op}\n"
    extra = f", forward={forward!r}" if isinstance(forward, str) else (", forward=...  # your forward" if forward else "")
    return ("import numpy as np\nimport rnngrad as rg\nfrom numpy import nan, inf\n"
            "from rnngrad.cases import Case\nfrom rnngrad.testing import assert_matches_reference\n\n"
            f"{setup}case = {_case_repr(case)}\n"
            f"assert_matches_reference({target}, case, {op!r}{extra})\n")


def _summary(case):
    N = case.inputs["source"].shape[1]
    return f"{case.dtype}, T={case.T} N={N} H={case.H}, {type(case.descriptor).__name__}"


def assert_matches_reference(candidate, case, op=None, *, forward=None, label=None):
    """Check one problem; raise :class:`ReferenceMismatch` (an AssertionError) on a mismatch.

    candidate: a backend name or a callable with the signature of ``rnngrad.<op>``, returning a
        result in MPSGraph's order (a sequence of arrays, or an rnngrad result object).
    case: a :class:`rnngrad.cases.Case` (from :mod:`rnngrad.strategies` or ``random_case``).
    op: the op name, e.g. ``"lstm_gradients"``; default the case's forward op.
    forward: for gradient ops, what makes z_state (see :func:`run_candidate`).
    label: a name for the problem in the message (the regression's name).
    """
    op, gradients = _op_of(case, op)
    where = f" [regression {label!r}]" if label else ""
    try:
        worst, mismatches = check_case(case, candidate, gradients, forward=forward)
    except Exception as exc:  # a crash on valid input is a failure like any other
        message = (f"{op}{where} raised {type(exc).__name__}: {exc}\n  on {_summary(case)}\n"
                   f"Reproduce with:\n{reproduction(case, op, candidate, forward=forward)}")
        raise ReferenceMismatch(message, op=op, case=case, label=label, candidate=candidate) from exc
    if not mismatches:
        return worst
    lines = [f"{op}{where} differs from the float64 reference on {_summary(case)} "
             f"({len(mismatches)} quantit{'y' if len(mismatches) == 1 else 'ies'}):"]
    lines += [f"  {m}" for m in mismatches]
    lines.append(f"Reproduce with:\n{reproduction(case, op, candidate, forward=forward)}")
    raise ReferenceMismatch("\n".join(lines), op=op, case=case, label=label,
                            mismatches=mismatches, candidate=candidate)


# -- fuzzing ------------------------------------------------------------------------------------

def check_backend(candidate, op, *, max_examples=100, seed=None, forward=None,
                  dtypes=("float32",), values="contractive", regressions=True, max_size=4,
                  boundary=True, max_elements=6000, descriptor=None, optional=None,
                  progress=None) -> int:
    """Fuzz ``candidate`` against the float64 reference on ``op``; return the number of
    problems checked, or raise :class:`ReferenceMismatch` with a minimal reproduction.

    candidate: a backend name (``"numba"``) or any callable with the signature of the rnngrad
        function named by ``op`` (``"single_gate_rnn"``, ``"gru_gradients"``, ...).
    max_examples: random problems drawn by hypothesis after the regression set.
    seed: makes the draws reproducible (None: a fresh random seed).
    forward: for gradient ops, what makes z_state / output_fwd / cell_output_fwd: a backend name
        or a callable with the forward op's signature; default as :func:`run_candidate`.
    dtypes, values, max_size, boundary, max_elements, descriptor, optional: passed to
        :func:`rnngrad.strategies.cases`.
    regressions: check the named regression set (:data:`rnngrad.strategies.REGRESSIONS`) first.
    progress: called with the number of problems checked so far, after each one.

    The regression problems fail fast without shrinking; a random problem that fails is shrunk by
    hypothesis (to the smallest sizes, default options and fewest optional inputs that still
    fail) before it is raised. ``ReferenceMismatch.examples`` says how many problems had been
    checked when the first failure appeared.
    """
    from . import strategies

    strategies.op_info(op)
    count = 0

    def tick():
        nonlocal count
        count += 1
        if progress is not None:
            progress(count)

    if regressions:
        for dtype in dtypes:
            for label, case in strategies.regression_cases(op, dtype=dtype):
                tick()
                try:
                    assert_matches_reference(candidate, case, op, forward=forward, label=label)
                except ReferenceMismatch as exc:
                    exc.examples = count
                    raise
    if max_examples <= 0:
        return count

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    first = []

    @settings(max_examples=max_examples, deadline=None, database=None,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate, Phase.shrink))
    @given(strategies.cases(op, dtypes=dtypes, values=values, max_size=max_size, boundary=boundary,
                            max_elements=max_elements, descriptor=descriptor, optional=optional))
    def fuzz(case):
        if not first:
            tick()
        try:
            assert_matches_reference(candidate, case, op, forward=forward)
        except ReferenceMismatch:
            if not first:
                first.append(count)
            raise

    if seed is not None:
        fuzz = hypothesis_seed(seed)(fuzz)
    try:
        fuzz()
    except ReferenceMismatch as exc:
        exc.examples = first[0] if first else count
        raise
    return count


# -- golden vectors -----------------------------------------------------------------------------

def load_vectors(directory, *, verify_hashes=True):
    """The golden vectors in ``directory`` (see :func:`rnngrad.vectors.load_vectors`)."""
    from .vectors import load_vectors as load

    return load(directory, verify_hashes=verify_hashes)


def check_vectors(candidate, vectors, *, op=None, forward=None):
    """Check a candidate against golden vectors (see :func:`rnngrad.vectors.check_vectors`)."""
    from .vectors import check_vectors as check

    return check(candidate, vectors, op=op, forward=forward)


__all__ = ["TOLERANCES", "KINDS", "tolerance", "Mismatch", "compare_array", "compare_results",
           "check_case", "run_candidate", "reference_result", "reproduction", "case_source", "ReferenceMismatch",
           "assert_matches_reference", "check_backend", "load_vectors", "check_vectors"]
