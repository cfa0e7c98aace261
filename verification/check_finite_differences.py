"""The float64 reference against central finite differences of its own forward, over every
descriptor option.

The draw is this module's own (a fixed enumeration, not the unit tests' hypothesis draw): for
each cell, every combination of the structural options (``reverse``, ``bidirectional``; GRU
``reset_gate_first``, ``reset_after``, ``flip_z``; LSTM ``forget_gate_last``), with every
activation value of every activation field appearing in some case, every optional input
present, the mask alternating between its every-step and per-step forms and the LSTM cell
gradient between its final and per-step forms. Each case is checked along random directions
through every differentiable input at once (``rnngrad.testing.gradcheck.directional_check``, the better
of two steps, see ``rnngrad.testing.gradcheck.STEPS``) and, for the first case of each cell, element by element.

    python -m verification.check_finite_differences
"""

from __future__ import annotations

import dataclasses
import itertools
import sys

import numpy as np

from rnngrad.testing import gradcheck
from rnngrad.testing.cases import random_case
from rnngrad.descriptors import Activation, GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor
from verification.common import FINITE_DIFFERENCE_TOLERANCE, Comparison, Tally, progress, report

AGAINST = "central differences, float64"
ACTIVATIONS = tuple(Activation)
_STRUCTURE = {
    "single_gate": ("reverse", "bidirectional"),
    "gru": ("reverse", "bidirectional", "reset_gate_first", "reset_after", "flip_z"),
    "lstm": ("reverse", "bidirectional", "forget_gate_last"),
}
_ACTIVATION_FIELDS = {
    "single_gate": ("activation",),
    "gru": ("update_gate_activation", "reset_gate_activation", "output_gate_activation"),
    "lstm": ("input_gate_activation", "forget_gate_activation", "cell_gate_activation",
             "output_gate_activation", "activation"),
}
_DESCRIPTORS = {"single_gate": SingleGateRNNDescriptor, "gru": GRUDescriptor, "lstm": LSTMDescriptor}
_EVERYTHING = ("input_weight", "bias", "init_state", "init_cell", "mask", "peephole",
               "secondary_bias", "state_gradient", "cell_gradient")


def descriptors(cell):
    """Every structural combination; activations cycle so every value of every field appears
    (single-gate: every activation with every structure)."""
    structure = _STRUCTURE[cell]
    fields = _ACTIVATION_FIELDS[cell]
    combos = list(itertools.product((False, True), repeat=len(structure)))
    rounds = len(ACTIVATIONS) if cell == "single_gate" else max(2, -(-len(ACTIVATIONS) // len(combos)))
    k = 0
    for _ in range(rounds):
        for combo in combos:
            acts = {f: ACTIVATIONS[(k + j) % len(ACTIVATIONS)] for j, f in enumerate(fields)}
            if cell == "single_gate":
                acts = {"activation": ACTIVATIONS[k // len(combos)]}
            k += 1
            yield _DESCRIPTORS[cell](**dict(zip(structure, combo)), **acts)


def cases(cell, seed):
    rng = np.random.default_rng(seed)
    for n, desc in enumerate(descriptors(cell)):
        optional = {name: True for name in _EVERYTHING}
        optional["mask_per_step"] = bool(n % 2)
        yield random_case(rng, cell, T=4, N=2, I=3, H=3, descriptor=desc, optional=optional,
                          cell_gradient_form="per_step" if (n // 2) % 2 else "final")


def describe(case):
    desc = case.descriptor
    defaults = type(desc)()
    changed = [f"{f.name}={getattr(desc, f.name).name.lower() if isinstance(getattr(desc, f.name), Activation) else getattr(desc, f.name)}"
               for f in dataclasses.fields(desc) if getattr(desc, f.name) != getattr(defaults, f.name)]
    mask = "per-step mask" if case.inputs["mask"].ndim == 3 else "every-step mask"
    extra = [mask]
    if case.cell == "lstm":
        extra.append("per-step cell gradient" if case.cell_gradient.ndim == 3 else "final cell gradient")
    return f"{type(desc).__name__}({', '.join(changed)}), {', '.join(extra)}"


def check_case(case, directions=2, seed=0, elementwise=False):
    out = []
    for d in range(directions):
        # the better of gradcheck.STEPS: a relu or hard-sigmoid kink spoils one step, not all
        r = gradcheck.directional_check(case, rng=seed + d)
        out.append(Comparison(f"direction {d}", r.error, FINITE_DIFFERENCE_TOLERANCE,
                              r.error <= FINITE_DIFFERENCE_TOLERANCE, str(r)))
    if elementwise:
        for r in gradcheck.elementwise_check(case):
            out.append(Comparison(r.quantity, r.error, FINITE_DIFFERENCE_TOLERANCE,
                                  r.error <= FINITE_DIFFERENCE_TOLERANCE, str(r)))
    return out


def run(seed=20260101) -> list:
    rows = []
    for index, cell in enumerate(("single_gate", "gru", "lstm")):
        tally = Tally(f"finite differences: {cell}", AGAINST)
        for n, case in enumerate(cases(cell, seed + index)):
            tally.case(describe(case), check_case(case, seed=seed + n, elementwise=n == 0))
        rows.append(tally.done())
        progress(f"  finite differences: {cell}: {tally.row.cases} descriptors, {tally.row.status}")
    return rows


def main(argv=None) -> int:
    return report(run())


if __name__ == "__main__":
    sys.exit(main())
