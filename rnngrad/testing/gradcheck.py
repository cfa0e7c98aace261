"""Central finite differences of a :class:`~rnngrad.testing.cases.Case`'s loss, in float64.

The difference is the fourth-order central stencil
``(8(L(θ+εv) − L(θ−εv)) − (L(θ+2εv) − L(θ−2εv))) / 12ε``: its truncation error is O(ε⁴), so
strongly curved losses (non-contractive activations such as a tanh update gate) still check to
about 1e-9.

``directional_check`` compares ⟨∇L, v⟩ from a gradient op with (L(θ+εv) − L(θ−εv)) / 2ε for a
random direction v over every differentiable input at once; ``elementwise_check`` compares every
element of every gradient, for tiny problems. Both return the relative error, measured against
the size of the terms involved, so that a gradient that is zero by symmetry is not a division by
zero.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .cases import PARAMETERS, Case

#: central-difference step in float64: the truncation error ε² and the round-off error eps/ε
#: balance near 1e-5 for functions of unit scale.
STEPS = (1e-5, 1e-6)
#: largest relative error accepted between a gradient and its central difference in float64
#: (truncation ~STEP², round-off ~1e-16/STEP, both well below this for contractive problems)
TOLERANCE = 1e-6
#: see _stencil
ROUNDOFF_MARGIN = 1e-2


@dataclasses.dataclass
class FDResult:
    quantity: str
    analytic: float
    numeric: float
    error: float  # relative to the scale of the terms

    def __str__(self):
        return (f"{self.quantity}: analytic {self.analytic:.12g}, finite difference "
                f"{self.numeric:.12g}, relative error {self.error:.3g}")


def _stencil(loss_at, step):
    """(fourth-order central difference of k -> loss_at(k) at 0 with spacing step, a floor for
    the scale of the comparison). The round-off of the difference is about 1e-16·|L|/step; the
    floor ROUNDOFF_MARGIN·|L| keeps it a thousand times below the tolerance."""
    l1, lm1, l2, lm2 = loss_at(1), loss_at(-1), loss_at(2), loss_at(-2)
    derivative = (8 * (l1 - lm1) - (l2 - lm2)) / (12 * step)
    return derivative, ROUNDOFF_MARGIN * max(abs(l1), abs(lm1))


def _gradients_by_name(case: Case, backend):
    result = case.astype(np.float64).gradients(backend=backend)
    return {name: np.asarray(value, np.float64) for name, value in result.as_dict().items()}


def directional_check(case: Case, rng=0, backend="reference", steps=STEPS) -> FDResult:
    """One random direction through every differentiable input that is present; the best of
    ``steps`` (a pre-activation within a step of a relu or hard-sigmoid kink spoils one step,
    not all; a wrong gradient fails at every step)."""
    case = case.astype(np.float64)
    rng = np.random.default_rng(rng)
    grads = _gradients_by_name(case, backend)
    names = [n for n in PARAMETERS if n in case.inputs]
    v = {n: rng.standard_normal(case.inputs[n].shape) for n in names}
    analytic = sum(float(np.sum(grads[n].reshape(v[n].shape) * v[n])) for n in names)
    best = None
    for step in steps:
        shifted = lambda k: case.loss(dict(case.inputs, **{n: case.inputs[n] + k * step * v[n] for n in names}))  # noqa: E731
        numeric, size = _stencil(shifted, step)
        scale = max(abs(analytic), abs(numeric), size, 1e-3)
        result = FDResult("directional", analytic, numeric, abs(analytic - numeric) / scale)
        if best is None or not result.error >= best.error:
            best = result
    return best


def elementwise_check(case: Case, backend="reference", step=STEPS[0]) -> list:
    """Every element of every gradient; returns the worst FDResult per input."""
    case = case.astype(np.float64)
    grads = _gradients_by_name(case, backend)
    worst = []
    for name in (n for n in PARAMETERS if n in case.inputs):
        base = case.inputs[name]
        g = grads[name].reshape(base.shape)
        numeric = np.empty_like(base)
        for index in np.ndindex(base.shape):
            def shifted(k):
                moved = base.copy()
                moved[index] += k * step
                return case.loss(dict(case.inputs, **{name: moved}))
            numeric[index], _ = _stencil(shifted, step)
        scale = max(float(np.max(np.abs(numeric), initial=0.0)), float(np.max(np.abs(g), initial=0.0)), 1e-3)
        err = np.abs(g - numeric) / scale
        if err.size:
            at = np.unravel_index(np.argmax(err), err.shape)
            worst.append(FDResult(f"{name}{list(at)}", float(g[at]), float(numeric[at]), float(err[at])))
    return worst
