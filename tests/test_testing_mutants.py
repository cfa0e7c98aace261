"""The mutation study in the default suite: check_backend, with its default settings, catches
every planted fault of rnngrad.testing.mutants and passes the unmodified reference.
(verification/mutations.py prints the table with timings and the fuzz-only column.)"""

import pytest

from rnngrad.testing.mutants import FAULT_LIST, FAULTS
from rnngrad.testing.strategies import OPS
from rnngrad.testing import ReferenceMismatch, check_backend


def _caught(fault, **settings):
    forward_op, gradient_op = fault.ops
    for op, extra in ((forward_op, {}), (gradient_op, {"forward": fault.function(forward_op)})):
        try:
            check_backend(fault.function(op), op, **extra, **settings)
        except ReferenceMismatch as exc:
            return exc
    return None


def test_there_are_at_least_twenty_faults_in_distinct_classes():
    assert len(FAULT_LIST) >= 20
    assert len({f.bug_class for f in FAULT_LIST}) >= 15


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_every_fault_is_caught_with_default_settings(name):
    exc = _caught(FAULTS[name], seed=20261122)
    assert exc is not None, f"{name} escaped check_backend"
    assert exc.case is not None and "Reproduce with" in str(exc)


@pytest.mark.parametrize("name", ["lstm_gate_order", "gru_gate_order", "flip_z_inverted",
                                  "hard_sigmoid_slope_sixth", "bias_gradient_squeezed",
                                  "peephole_on_current_cell", "batch_first_backward",
                                  "mask_not_on_recurrent_gradient", "reverse_outputs_realigned"])
def test_random_draws_alone_find_faults(name):
    assert _caught(FAULTS[name], seed=7, regressions=False) is not None


@pytest.mark.parametrize("op", list(OPS))
def test_the_unmodified_reference_passes_with_default_settings(op):
    assert check_backend("reference", op, seed=20261122) > 100
