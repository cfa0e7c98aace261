"""What every check shares: comparing arrays with the one tolerance table, collecting the worst
error of a check, and printing the table.

A check produces :class:`Row` s: what was checked, against what, on how many cases, the worst
error, the tolerance and the verdict. The error shown is normwise:
``max|got − want| / max|want|`` over one quantity (so 1e-15 means float64 round-off); the
verdict uses ``rnngrad.testing.compare_array``, the same criterion and the same
``rnngrad.testing.TOLERANCES`` as the unit tests.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Optional

import numpy as np

from rnngrad.testing.cases import Case
from rnngrad.testing.gradcheck import TOLERANCE as FINITE_DIFFERENCE_TOLERANCE  # noqa: F401 (re-exported)
from rnngrad.testing import compare_array, tolerance

PASS, FAIL, SKIP = "pass", "FAIL", "skipped"
#: verdicts on a [decision] of SEMANTICS.md (check_mpsgraph): the real op equals the reference,
#: equals the alternative reading instead, or equals neither
CONFIRMED, REFUTED, NEITHER = "confirmed", "REFUTED", "neither"
PASSING = (PASS, CONFIRMED)


@dataclasses.dataclass
class Row:
    """One line of the table."""

    check: str
    against: str
    cases: int = 0
    worst: float = 0.0  # normwise relative error of the worst quantity
    tolerance: float = 0.0
    status: str = PASS
    note: str = ""  # the worst quantity and case, or why the check was skipped, or what failed

    @property
    def failed(self) -> bool:
        return self.status not in PASSING + (SKIP,)


@dataclasses.dataclass
class Comparison:
    quantity: str
    error: float  # normwise relative error
    rtol: float
    passed: bool
    detail: str = ""


def relative_error(got, want) -> float:
    """max|got − want| / max|want| (NaN where the other is not NaN counts as infinite)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return np.inf
    if want.size == 0:
        return 0.0
    if np.any(np.isnan(got) != np.isnan(want)):
        return np.inf
    finite = np.isfinite(want) & np.isfinite(got)
    diff = float(np.max(np.abs(got - want)[finite], initial=0.0))
    scale = float(np.max(np.abs(want[finite]), initial=0.0))
    return diff / scale if scale > 0 else diff


def compare(quantity, got, want, dtype, label="") -> Comparison:
    """Compare one array with the tolerance of rnngrad quantity ``quantity`` (state, cell,
    source, init_state, recurrent_weight, …) in ``dtype``."""
    _, rtol, _ = tolerance(dtype, quantity)
    if got is None or want is None:
        ok = got is None and want is None
        return Comparison(label or quantity, 0.0 if ok else np.inf, rtol, ok,
                          "" if ok else f"{label or quantity}: one side is missing")
    ratio, mismatch = compare_array(quantity, got, want, dtype)
    return Comparison(label or quantity, relative_error(got, want), rtol, mismatch is None,
                      "" if mismatch is None else f"{label or quantity}: {mismatch}")


class Tally:
    """Accumulates the comparisons of one check into one :class:`Row`."""

    def __init__(self, check: str, against: str, tolerance: Optional[float] = None):
        self.row = Row(check, against, tolerance=tolerance or 0.0)
        self.failures: list = []
        self._worst = -1.0

    def case(self, description: str, comparisons) -> bool:
        """Record one case's comparisons; True when they all pass."""
        self.row.cases += 1
        ok = True
        for c in comparisons:
            if c.error > self._worst:
                self._worst = c.error
                self.row.worst = c.error
                self.row.note = f"worst: {c.quantity} in {description}"
            self.row.tolerance = max(self.row.tolerance, c.rtol)
            if not c.passed:
                ok = False
                self.failures.append(f"{description}: {c.detail or c.quantity}")
        if not ok:
            self.row.status = FAIL
        return ok

    def done(self) -> Row:
        if self.failures:
            self.row.note = self.failures[0] + (f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else "")
        return self.row


def skipped(check: str, against: str, reason: str) -> Row:
    return Row(check, against, status=SKIP, worst=np.nan, tolerance=np.nan, note=reason)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- comparing an rnngrad-shaped result with the reference ---------------------------------------

def reference(case: Case, gradients: bool):
    """The float64 reference's result for ``case`` (forward with its descriptor, or the
    gradient op fed by the reference's training forward)."""
    ref = case.astype(np.float64)
    return ref.gradients(backend="reference") if gradients else ref.forward(backend="reference")


def compare_result(got, want, dtype) -> list:
    """Every entry of two results of the same op (ForwardResult or GradientResult), by name."""
    if tuple(got.names) != tuple(want.names):
        return [Comparison("entries", np.inf, 0.0, False,
                           f"entries {tuple(got.names)}, reference {tuple(want.names)}")]
    return [compare(name, getattr(got, name), getattr(want, name), dtype) for name in want.names]


def matches(got, want, dtype) -> bool:
    return all(c.passed for c in compare_result(got, want, dtype))


# -- the table ------------------------------------------------------------------------------------

def format_table(rows) -> str:
    head = ("check", "against", "cases", "worst error", "tolerance", "result")
    body = []
    for r in rows:
        worst = "—" if r.status == SKIP else f"{r.worst:.1e}"
        tol = "—" if r.status == SKIP else f"{r.tolerance:.0e}"
        body.append((r.check, r.against, str(r.cases), worst, tol, r.status))
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(b) for b in body]
    notes = [f"- {r.check}: {r.note}" for r in rows if r.note and r.status not in PASSING]
    if notes:
        out += ["", *notes]
    return "\n".join(out)


def report(rows) -> int:
    """Print the table; exit status 1 when any row failed."""
    print(format_table(rows))
    failed = [r for r in rows if r.failed]
    passed = sum(r.status in PASSING for r in rows)
    skipped_n = sum(r.status == SKIP for r in rows)
    print(f"\n{passed} passed, {len(failed)} failed, {skipped_n} skipped")
    return 1 if failed else 0
