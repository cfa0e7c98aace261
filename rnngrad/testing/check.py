"""Checking a candidate against the float64 reference: one problem, a fuzzed run, a reproduction.

For the authors of other RNN implementations:

- :func:`assert_matches_reference` checks one problem (a :class:`rnngrad.testing.cases.Case`)
  and raises :class:`ReferenceMismatch` (an ``AssertionError``) naming the quantity, the worst
  index, both values, the tolerance and a runnable reproduction;
- :func:`check_backend` fuzzes a candidate (a backend name, or any callable with the signature of
  the rnngrad function named by ``op``) with the regression set and then with
  :mod:`rnngrad.testing.strategies`, and raises the shrunk, minimal reproduction of the first
  mismatch.

``check_case`` is the one comparison under both, under the golden vectors
(:mod:`rnngrad.testing.vectors`) and under ``rnngrad verify``. The tolerances are
:mod:`rnngrad.testing.compare`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib

import numpy as np

from .. import api
from ..results import ForwardResult, GradientResult
from .cases import _repr_descriptor, op_info, op_name
from .compare import Mismatch, compare_results


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


class Unsupported(Exception):
    """Raised by a candidate (a callable of :func:`check_backend`, or a layer or factory of
    :func:`rnngrad.testing.check_module`) for a problem it does not implement: the problem is
    counted as unsupported, not failed. Say why in the message."""


#: input_sensitivity at or above which a mismatch is the problem's, not the candidate's: the
#: reference itself moves that much of the tolerance when its inputs move by half an ulp
ILL_CONDITIONED = 0.5


def _op_of(case, op):
    if op is None:
        return op_name(case.cell, False), False
    cell, gradients = op_info(op)
    if cell != case.cell:
        raise ValueError(f"op: {op!r} computes a {cell} cell, got a case of cell {case.cell!r}")
    return op, gradients


def _public(op, backend):
    """The rnngrad function ``op`` bound to a backend name."""
    return functools.partial(getattr(api, op), backend=backend)


def _named(result, want, op):
    """The candidate's result as a ForwardResult/GradientResult: as returned when it names its
    entries, else a sequence taken in MPSGraph's order (the reference's entry names)."""
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
    out = list(out) + [None, None]  # a forward of its own may return only h (and c): no z_state
    return (out[0], out[1], out[2]) if case.cell == "lstm" else (out[0], None, out[1])


def run_candidate(case, op, candidate, *, forward=None):
    """The candidate's result for ``case``: ``candidate`` is a backend name or a callable with the
    signature of the rnngrad function ``op``. For a gradient op, z_state (and output_fwd /
    cell_output_fwd) come from ``forward`` (a backend name or a callable with the forward op's
    signature); by default from the candidate's own backend when it is a name, else from the
    reference."""
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
    gradients = op_info(op)[1]
    reference = case.astype(np.float64)
    return reference.gradients(backend="reference") if gradients else reference.forward(backend="reference")


def input_sensitivity(case, gradients: bool, *, seed: int = 0) -> float:
    """How far the float64 reference itself moves when every floating-point input (and upstream
    gradient) of ``case`` is nudged by up to half a unit in the last place of the case's dtype
    (relative 2⁻²⁴ for float32), and, in a second run, when every tanh and sigmoid value it
    computes is: the worse of the two ratios of the nudged reference's error to the allowed
    error, as :func:`check_case` reports it. An implementation in that dtype rounds its inputs
    and every step at least that much, and its tanh may differ from NumPy's in the last bit, so
    a case near or above 1 is too ill-conditioned for the dtype's tolerance: an exploding
    recurrence (a GRU whose tanh update gate lets 1 − z reach 2), or a saturated tanh gate whose
    derivative 1 − tanh² (taken from the value, as every implementation takes it) meets upstream
    gradients large enough to turn the value's last bit into more than the tolerance. No
    implementation can be expected to match such a case. Well-conditioned cases sit near
    10⁻³."""
    op = op_name(case.cell, gradients)
    want = reference_result(case, op)
    rng = np.random.default_rng(seed)
    half_ulp = float(np.finfo(case.dtype).eps) / 2

    def nudge(a):
        if not isinstance(a, np.ndarray) or a.dtype.kind != "f":
            return a
        return a * (1.0 + half_ulp * rng.uniform(-1.0, 1.0, a.shape))

    nudged = case.astype(np.float64).mapped(nudge)
    inputs = compare_results(reference_result(nudged, op), want, case.dtype)[0]
    with _nudged_activations(nudge):
        values = compare_results(reference_result(case, op), want, case.dtype)[0]
    return max(inputs, values)


def is_ill_conditioned(case, op) -> bool:
    """Whether ``case`` is too ill-conditioned for its dtype's tolerance on ``op``: its
    :func:`input_sensitivity` is at least :data:`ILL_CONDITIONED`."""
    return input_sensitivity(case, op_info(op)[1]) >= ILL_CONDITIONED


@contextlib.contextmanager
def _nudged_activations(nudge):
    """Within the block the reference's cells see every tanh and sigmoid value passed through
    ``nudge`` (their forward values, and the values their gradients take the derivatives from).
    The cells' own name for the activation function is replaced, so the reference's code is
    the same inside the block as outside it."""
    from ..backends.reference import activations, gru, lstm, single_gate
    from ..descriptors import Activation

    smooth = (Activation.TANH, Activation.SIGMOID)

    def activate(kind, x):
        y = activations.activate(kind, x)
        return nudge(np.asarray(y)) if kind in smooth else y

    cells = (gru, lstm, single_gate)
    kept = [cell.activate for cell in cells]
    for cell in cells:
        cell.activate = activate
    try:
        yield
    finally:
        for cell, fn in zip(cells, kept):
            cell.activate = fn


def check_case(case, backend, gradients: bool, *, forward_backend=None, forward=None,
               z_state=True):
    """Run one :class:`~rnngrad.testing.cases.Case` through ``backend`` (a backend name, or a callable
    with the signature of the rnngrad function) and through the float64 reference on the same
    dtype-rounded inputs. Returns (worst ratio to the allowed error, [Mismatch]).

    ``z_state``: compare the training forward's z_state with the reference's (rnngrad's own
    layout; False compares only h and c, the outputs MPSGraph defines).

    For gradients, the candidate's own training forward feeds its gradient op when ``backend``
    is a name; ``forward_backend`` (a name) or ``forward`` (a callable with the forward op's
    signature) choose another one, for mixed pipelines; a callable candidate without either is
    fed by the reference forward. The reference's gradient op is fed by the reference forward,
    so a wrong z_state shows up as a gradient mismatch. Exceptions of the candidate propagate.
    """
    dtype = case.dtype
    op = op_name(case.cell, gradients)
    got = run_candidate(case, op, backend, forward=forward if forward is not None else forward_backend)
    want = reference_result(case, op)
    named = _named(got, want, op)
    if named is None and not z_state and not gradients and "z_state" in want.names:
        named = _named(got, _without_z_state(want), op)  # h (and c): what it computes
    if named is None:
        return np.inf, [Mismatch("entries", (), np.nan, np.nan, 0.0, 0.0, 0.0, "entries",
                                 f"got {len(list(got))} entries, reference has {len(want.names)}: "
                                 f"{tuple(want.names)}")]
    for name, entry in zip(named.names, named):
        if np.asarray(entry).dtype != dtype:
            return np.inf, [Mismatch(name, (), np.nan, np.nan, 0.0, 0.0, 0.0, "dtype",
                                     f"got dtype {np.asarray(entry).dtype}, expected {dtype}")]
    if not z_state and not gradients:
        named, want = _without_z_state(named), _without_z_state(want)
    return compare_results(named, want, dtype)


def _without_z_state(result):
    return ForwardResult([(name, value) for name, value in zip(result.names, result)
                          if name != "z_state"])


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
    lines = ["Case(", f"    cell={case.cell!r},", f"    descriptor={_repr_descriptor(case.descriptor)},",
             "    inputs={"]
    lines += [f"        {k!r}: {_array_source(v)}," for k, v in case.inputs.items()]
    lines.append("    },")
    for name in ("source_gradient", "state_gradient", "cell_gradient"):
        lines.append(f"    {name}={_array_source(getattr(case, name))},")
    return "\n".join(lines + [")"])


def _case_repr(case):
    return case_source(case)


def _import_source(fn, name):
    """Python that binds ``name`` to ``fn`` by importing it, or None when ``fn`` cannot be
    imported by its module and qualified name (a lambda, a nested function, a bound method).
    A callable made by a function says how to make it again in ``source``, a pair (import
    line, expression); a ``functools.partial`` of an importable function is rebuilt from its
    arguments' reprs."""
    source = getattr(fn, "source", None)
    if isinstance(source, tuple) and len(source) == 2:
        return f"{source[0]}\n{name} = {source[1]}\n"
    if isinstance(fn, functools.partial):
        inner = _import_source(fn.func, "_function")
        args = [repr(a) for a in fn.args] + [f"{k}={v!r}" for k, v in fn.keywords.items()]
        if inner is None or not all(_evaluates(a) for a in args):
            return None
        return f"import functools\n{inner}{name} = functools.partial(_function, {', '.join(args)})\n"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        return None
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # not importable as named: the stub below says what to put there
        return None
    if found is not fn:
        return None
    if "." not in qualname:
        return f"from {module} import {qualname} as {name}\n"
    return f"import {module}\n{name} = {module}.{qualname}\n"


def _evaluates(text):
    """Whether a repr is Python that rebuilds its value (literals and their containers)."""
    import ast

    try:
        ast.literal_eval(text.split("=", 1)[1] if "=" in text.split("(")[0] else text)
    except (ValueError, SyntaxError):
        return False
    return True


def _callable_source(fn, name, role):
    """Python that defines ``name``: ``fn`` imported, else a stub that says what it stands for
    (``role``: what it must be, e.g. "the signature of rnngrad.lstm")."""
    source = _import_source(fn, name)
    if source is not None:
        return source
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    what = f"{module}.{qualname}" if module and qualname else repr(fn)
    return (f"def {name}(*args, **kwargs):  # stands for {what}\n"
            f"    raise NotImplementedError({f'replace this stub with {what} ({role})'!r})\n")


def reproduction(case, op, candidate=None, *, forward=None, z_state=None) -> str:
    """A Python script that rebuilds ``case`` and repeats the check of ``op``. It runs as
    printed: a callable ``candidate`` or ``forward`` is imported when its module and name find
    it, else defined as a stub that raises NotImplementedError naming what to put there."""
    setup = ""
    if isinstance(candidate, str):
        target = repr(candidate)
    else:
        target = "candidate"
        setup += _callable_source(candidate, "candidate", f"the signature of rnngrad.{op}")
    extra = ""
    if isinstance(forward, str):
        extra = f", forward={forward!r}"
    elif forward is not None:
        setup += _callable_source(forward, "forward",
                                  f"the signature of rnngrad.{op_name(op_info(op)[0], False)}")
        extra = ", forward=forward"
    if z_state is not None and z_state != isinstance(candidate, str):
        extra += f", z_state={bool(z_state)!r}"
    return ("import numpy as np\nimport rnngrad as rg\nfrom numpy import nan, inf\n"
            "from rnngrad.testing import Case, assert_matches_reference\n"
            f"{setup}\ncase = {_case_repr(case)}\n"
            f"assert_matches_reference({target}, case, {op!r}{extra})\n")


def _summary(case):
    N = case.inputs["source"].shape[1]
    return f"{case.dtype}, T={case.T} N={N} H={case.H}, {type(case.descriptor).__name__}"


def _compares_z_state(candidate, z_state):
    """The ``z_state`` knob resolved: None compares z_state for a backend name (rnngrad's own
    backends write its layout) and not for a callable (an implementation of its own)."""
    return isinstance(candidate, str) if z_state is None else bool(z_state)


def _require_forward(op, candidate, forward, z_state):
    """A callable gradient op with a z_state layout of its own must be fed by its own forward."""
    if op_info(op)[1] and forward is None and not isinstance(candidate, str) and not z_state:
        forward_op = op_name(op_info(op)[0], False)
        raise ValueError(f"forward: expected the forward of the implementation whose {op} is "
                         f"checked (a callable with the signature of rnngrad.{forward_op}, whose "
                         f"training z_state feeds the gradient op), got None; pass z_state=True "
                         f"instead if the gradient op reads rnngrad's z_state layout")


def assert_matches_reference(candidate, case, op=None, *, forward=None, label=None, z_state=None):
    """Check one problem; raise :class:`ReferenceMismatch` (an AssertionError) on a mismatch.

    candidate: a backend name or a callable with the signature of ``rnngrad.<op>``, returning a
        result in MPSGraph's order (a sequence of arrays, or an rnngrad result object).
    case: a :class:`rnngrad.testing.cases.Case` (from :mod:`rnngrad.testing.strategies` or ``random_case``).
    op: the op name, e.g. ``"lstm_gradients"``; default the case's forward op.
    forward: for gradient ops, what makes z_state (see :func:`run_candidate`); needed for a
        callable gradient op unless ``z_state`` is true.
    label: a name for the problem in the message (the regression's name).
    z_state: compare the forward's z_state with the reference's, i.e. the candidate writes and
        reads rnngrad's z_state layout (then a callable gradient op without ``forward`` is fed
        by the reference forward). None: True for a backend name, False for a callable; when
        False, the forward is checked on h and c only and the gradient op is fed by the
        candidate's own forward.
    """
    op, gradients = _op_of(case, op)
    compares = _compares_z_state(candidate, z_state)
    _require_forward(op, candidate, forward, compares)
    where = f" [regression {label!r}]" if label else ""
    repro = functools.partial(reproduction, case, op, candidate, forward=forward, z_state=compares)
    try:
        worst, mismatches = check_case(case, candidate, gradients, forward=forward, z_state=compares)
    except Unsupported:
        raise
    except Exception as exc:  # a crash on valid input is a failure like any other
        message = (f"{op}{where} raised {type(exc).__name__}: {exc}\n  on {_summary(case)}\n"
                   f"Reproduce with:\n{repro()}")
        raise ReferenceMismatch(message, op=op, case=case, label=label, candidate=candidate) from exc
    if not mismatches:
        return worst
    lines = [f"{op}{where} differs from the float64 reference on {_summary(case)} "
             f"({len(mismatches)} quantit{'y' if len(mismatches) == 1 else 'ies'}):"]
    lines += [f"  {m}" for m in mismatches]
    lines.append(f"Reproduce with:\n{repro()}")
    raise ReferenceMismatch("\n".join(lines), op=op, case=case, label=label,
                            mismatches=mismatches, candidate=candidate)


# -- fuzzing ------------------------------------------------------------------------------------

def _present(case, name):
    """Whether the optional input (or upstream gradient) ``name`` is part of ``case``."""
    if name == "mask_per_step":
        return "mask" in case.inputs and np.ndim(case.inputs["mask"]) == 3
    if name in ("state_gradient", "cell_gradient"):
        return getattr(case, name) is not None
    return name in case.inputs


def _within(case, descriptor, optional):
    """A regression problem fitted to check_backend's ``descriptor`` (a dict of options or a
    descriptor; strategies fix nothing) and ``optional`` knobs: None when a fixed descriptor
    option or a required optional input contradicts it; optional inputs fixed absent removed."""
    if isinstance(descriptor, dict):
        fixed = descriptor
    elif dataclasses.is_dataclass(descriptor):
        fixed = {f.name: getattr(descriptor, f.name) for f in dataclasses.fields(descriptor)}
    else:
        fixed = {}
    for name, value in fixed.items():
        if not hasattr(value, "example") and getattr(case.descriptor, name, value) != value:
            return None
    inputs, upstream = dict(case.inputs), {}
    for name, value in (optional or {}).items():
        if not isinstance(value, bool) or _present(case, name) == value:
            continue
        if value or name == "mask_per_step":
            return None
        if name in ("state_gradient", "cell_gradient"):
            upstream[name] = None
        else:
            inputs.pop(name, None)
    return dataclasses.replace(case, inputs=inputs, **upstream)


def check_backend(candidate, op, *, max_examples=100, seed=None, forward=None,
                  dtypes=("float32",), values="contractive", regressions=True, max_size=4,
                  boundary=True, max_elements=6000, descriptor=None, optional=None,
                  progress=None, z_state=None, cell_gradient_form=None, empty=True,
                  ill_conditioned="skip") -> int:
    """Fuzz ``candidate`` against the float64 reference on ``op``; return the number of
    problems checked, or raise :class:`ReferenceMismatch` with a minimal reproduction.

    candidate: a backend name (``"numba"``) or any callable with the signature of the rnngrad
        function named by ``op`` (``"single_gate_rnn"``, ``"gru_gradients"``, ...).
    max_examples: random problems drawn by hypothesis after the regression set.
    seed: makes the draws reproducible (None: a fresh random seed).
    forward: for gradient ops, what makes z_state / output_fwd / cell_output_fwd: a backend name
        or a callable with the forward op's signature (the candidate's own forward); default as
        :func:`run_candidate`. Required for a callable gradient op unless ``z_state`` is true.
    z_state: whether the candidate writes and reads rnngrad's z_state layout, as rnngrad's own
        backends do. True: the forward's z_state is compared with the reference's, and a
        callable gradient op may be fed by the reference forward. False: z_state is the
        candidate's own business (MPSGraph's is opaque): the forward is compared on h and c
        only, and the gradient op is fed by ``forward``, so a wrong z_state shows up as wrong
        gradients. None (default): True for a backend name, False for a callable.
    dtypes, values, max_size, boundary, max_elements, descriptor, optional: passed to
        :func:`rnngrad.testing.strategies.cases`.
    regressions: check the named regression set (:data:`rnngrad.testing.strategies.REGRESSIONS`)
        first; a regression problem whose descriptor options or optional inputs contradict
        fixed values of ``descriptor`` (a dict or a descriptor) or ``optional`` is skipped, so
        an implementation of part of the options is checked on that part.
    progress: called with the number of problems checked so far, after each one.
    cell_gradient_form: ``"final"`` draws only the final-cell form of an LSTM's cell_gradient
        (for an implementation without per-step cells); None draws both.
    empty: False leaves out T = 0 and N = 0 (the regressions and the draws), for an
        implementation that refuses them.
    ill_conditioned: ``"skip"``: a mismatch on a problem whose :func:`input_sensitivity` is at
        least :data:`ILL_CONDITIONED` is the problem's (the reference itself moves by that much
        of the tolerance under half-ulp changes of its inputs): the problem is skipped;
        ``"fail"`` reports it like any other.

    A callable may raise :class:`Unsupported` for a problem it does not implement: skipped.
    Skipped problems are not counted.

    The regression problems fail fast without shrinking; a random problem that fails is shrunk by
    hypothesis (to the smallest sizes, default options and fewest optional inputs that still
    fail) before it is raised. ``ReferenceMismatch.examples`` says how many problems had been
    checked when the first failure appeared.
    """
    from . import strategies

    op_info(op)
    compares = _compares_z_state(candidate, z_state)
    _require_forward(op, candidate, forward, compares)
    count = 0

    def tick():
        nonlocal count
        count += 1
        if progress is not None:
            progress(count)
        return count

    if ill_conditioned not in ("skip", "fail"):
        raise ValueError(f"ill_conditioned: expected 'skip' or 'fail', got {ill_conditioned!r}")
    def one(case, label=None):
        """True when checked, False when skipped (unsupported or ill-conditioned)."""
        try:
            assert_matches_reference(candidate, case, op, forward=forward, label=label,
                                     z_state=compares)
        except Unsupported:
            return False
        except ReferenceMismatch as exc:
            if ill_conditioned == "skip" and exc.mismatches and is_ill_conditioned(case, op):
                return False
            raise
        return True

    def fits(case):
        if not empty and (case.T == 0 or case.inputs["source"].shape[1] == 0):
            return False
        cg = case.cell_gradient
        return not (cell_gradient_form == "final" and cg is not None and cg.ndim == 3
                    and cg.shape[0] == case.T and case.T != 1)

    if regressions:
        for dtype in dtypes:
            for label, case in strategies.regression_cases(op, dtype=dtype):
                case = _within(case, descriptor, optional)
                if case is None or not fits(case):
                    continue
                try:
                    if one(case, label):
                        tick()
                except ReferenceMismatch as exc:
                    exc.examples = count + 1
                    raise
    if max_examples <= 0:
        return count

    fuzz_draws(strategies.cases(op, dtypes=dtypes, values=values, max_size=max_size,
                                boundary=boundary, max_elements=max_elements,
                                descriptor=descriptor, optional=optional,
                                cell_gradient_form=cell_gradient_form, empty=empty),
               one, ReferenceMismatch, max_examples=max_examples, seed=seed, tick=tick)
    return count


def fuzz_draws(strategy, check, error, *, max_examples: int, seed, tick) -> None:
    """Run ``check`` on up to ``max_examples`` hypothesis draws of ``strategy`` (seeded with
    ``seed`` unless None; no example database), calling ``tick()``, which returns the count so
    far, after each draw that ``check`` did not skip (by returning False) until one fails. The
    first ``error`` is shrunk and raised with ``examples``: the count when the first failing
    draw appeared, itself included."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    first, last = [], [0]

    @settings(max_examples=max_examples, deadline=None, database=None,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate, Phase.shrink))
    @given(strategy)
    def fuzz(value):
        try:
            checked = check(value)
        except error:
            if not first:
                first.append(last[0] + 1)
            raise
        if checked is not False and not first:
            last[0] = tick()

    if seed is not None:
        fuzz = hypothesis_seed(seed)(fuzz)
    try:
        fuzz()
    except error as exc:
        exc.examples = first[0] if first else last[0]
        raise


__all__ = ["Unsupported", "ILL_CONDITIONED", "is_ill_conditioned", "check_case", "run_candidate", "reference_result", "reproduction", "case_source",
           "ReferenceMismatch", "assert_matches_reference", "check_backend"]
