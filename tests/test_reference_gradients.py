"""The reference's gradients equal central finite differences of its own forward, in float64."""


import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from draws import cases
from rnngrad.testing.cases import random_case
from rnngrad.testing.gradcheck import TOLERANCE, directional_check, elementwise_check


@given(case=cases(), direction=st.integers(0, 2**32 - 1))
def test_directional_derivative_matches_finite_differences(case, direction):
    result = directional_check(case, rng=direction)
    assert result.error <= TOLERANCE, f"{result}\n{case!r}"


@settings(max_examples=10)
@given(case=cases(max_size=2))
def test_every_element_matches_finite_differences(case):
    for result in elementwise_check(case):
        assert result.error <= TOLERANCE, f"{result}\n{case!r}"


@pytest.mark.parametrize("cell", ["single_gate", "gru", "lstm"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_every_optional_input_at_once(cell, direction):
    """All optional inputs present, in each direction mode, element by element."""
    from rnngrad.testing.cases import random_descriptor

    descriptor = random_descriptor(np.random.default_rng(3), cell, reverse=direction == "reverse",
                                   bidirectional=direction == "bidirectional")
    everything = {k: True for k in ("input_weight", "bias", "init_state", "init_cell", "mask",
                                    "peephole", "secondary_bias", "state_gradient", "cell_gradient")}
    case = random_case(3, cell, T=3, N=2, I=2, H=2, descriptor=descriptor, optional=everything)
    for result in elementwise_check(case):
        assert result.error <= TOLERANCE, f"{result}\n{case!r}"


@pytest.mark.parametrize("form", ["per_step", "final"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_both_cell_gradient_forms(form, bidirectional):
    from rnngrad import LSTMDescriptor

    case = random_case(11, "lstm", T=4, N=2, I=3, H=3, cell_gradient_form=form,
                       descriptor=LSTMDescriptor(bidirectional=bidirectional, reverse=True),
                       optional={"cell_gradient": True, "init_cell": True, "peephole": True})
    assert case.cell_gradient.ndim == (3 if form == "per_step" else 2)
    for result in elementwise_check(case):
        assert result.error <= TOLERANCE, f"{result}\n{case!r}"


def test_the_check_detects_a_wrong_gradient(monkeypatch):
    """A gradient off by 1e-4 relative fails the directional check: the check can fail."""
    import rnngrad.api as api

    case = random_case(5, "gru", T=3, N=2, I=2, H=3, optional={"input_weight": True})
    real = api.gru_gradients

    def wrong(*args, **kwargs):
        out = real(*args, **kwargs)
        return type(out)([(n, a * (1 + 1e-4) if n == "recurrent_weight" else a)
                          for n, a in out.as_dict().items()])

    assert directional_check(case, rng=1).error <= TOLERANCE
    monkeypatch.setattr(api, "gru_gradients", wrong)
    assert directional_check(case, rng=1).error > TOLERANCE
