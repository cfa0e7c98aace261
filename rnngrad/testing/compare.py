"""Comparing a result with the float64 reference: the one tolerance table.

The reference is always evaluated in float64 on the candidate's dtype-rounded inputs, so the
tolerance only has to cover the candidate's own arithmetic. Quantities come in three kinds:

- ``output``: h, c, z_state: ``|got − want| ≤ atol + rtol·|want|`` element-wise;
- ``state``: the gradients of source, init_state, init_cell: the same form;
- ``parameter``: the gradients of recurrent_weight, input_weight, bias, peephole, secondary_bias,
  which sum over T·N rows: ``|got − want| ≤ rtol·max|want| + atol``, i.e. relative to their
  magnitude.

NaN must be NaN in both (a NaN where the reference has a number, or the reverse, is a mismatch);
infinities must be equal.
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
    #: set for a mismatch that has no worst element (a shape, a dtype, the list of entries):
    #: what was expected and what was got, said in words
    message: str = None
    #: where the worst element is in the implementation's own terms (a framework's parameter)
    where: str = None

    def __str__(self):
        if self.message is not None:
            return f"{self.quantity}: {self.message}"
        where = f" (= {self.where})" if self.where else ""
        return (f"{self.quantity}{list(self.index)}{where}: got {self.got!r}, reference {self.want!r}, "
                f"|difference| {abs(self.got - self.want):.3g} > allowed {self.allowed:.3g} "
                f"({self.kind} tolerance: atol={self.atol:g}, rtol={self.rtol:g})")


def compare_array(quantity, got, want, dtype):
    """(worst error as a fraction of the allowed error, Mismatch or None)."""
    atol, rtol, kind = tolerance(dtype, quantity)
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        return np.inf, Mismatch(quantity, (), np.nan, np.nan, 0.0, atol, rtol, "shape",
                                f"got shape {got.shape}, reference shape {want.shape}")
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
        return np.inf, [Mismatch("entries", (), np.nan, np.nan, 0.0, 0.0, 0.0, "entries",
                                 f"got {tuple(got.names)}, reference {tuple(want.names)}")]
    worst, mismatches = 0.0, []
    for name in want.names:
        ratio, mismatch = compare_array(name, getattr(got, name), getattr(want, name), dtype)
        worst = max(worst, ratio)
        if mismatch:
            mismatches.append(mismatch)
    return worst, mismatches
