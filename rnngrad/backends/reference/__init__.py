"""The NumPy reference backend: the oracle every other backend is compared with.

It computes in float64 whatever the input dtype and returns the inputs' dtype. Each cell module
(``single_gate``, ``gru``, ``lstm``) holds the core op of one direction in processing order and
opens with its Notation, Equations, Layouts and Deviations and decisions; ``directions`` is
the wrapper shared by all three (projection, reverse, bidirectional, source/weight gradients).
The statement they implement, with every decision taken where MPSGraph is silent, is
``SEMANTICS.md`` in this folder.
"""

import numpy as np

from ...problem import ForwardArrays, GradientArrays
from ...registry import Backend, every_cell
from . import directions, gru, lstm, single_gate

_CELLS = {"single_gate": single_gate, "gru": gru, "lstm": lstm}


def _cast(a, dtype):
    return None if a is None else np.asarray(a, dtype=dtype)


# A NaN or Inf in the inputs propagates by definition (SEMANTICS.md §4): NumPy's "invalid
# value" warnings (inf − inf, 0 · inf, in products and matmuls) report exactly that, so they are
# silenced; the values are unchanged.
_NONFINITE_IS_DEFINED = dict(invalid="ignore", over="ignore")


def forward(problem) -> ForwardArrays:
    cell = _CELLS[problem.cell]
    with np.errstate(**_NONFINITE_IS_DEFINED):
        h, c, z = directions.forward(problem, cell.core_forward)
    dtype, desc = problem.dtype, problem.descriptor
    keep_c = problem.cell == "lstm" and (desc.training or desc.produce_cell)
    return ForwardArrays(
        h=_cast(h, dtype),
        c=_cast(c, dtype) if keep_c else None,
        z_state=_cast(z, dtype) if desc.training else None,
    )


def gradients(problem) -> GradientArrays:
    with np.errstate(**_NONFINITE_IS_DEFINED):
        grads = directions.gradients(problem, _CELLS[problem.cell].core_backward)
    return GradientArrays(**{k: _cast(v, problem.dtype) for k, v in grads.items()})


BACKEND = Backend(
    name="reference",
    dtypes=(np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)),
    implementations=every_cell(forward, gradients),
    summary="NumPy, float64 internally: the oracle",
)
