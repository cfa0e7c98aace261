"""rnngrad.testing: the tolerance table, assert_matches_reference and check_backend."""

import dataclasses

import numpy as np
import pytest

import rnngrad as rg
from rnngrad.testing.cases import random_case
from rnngrad.testing.strategies import OPS
from rnngrad.testing import (TOLERANCES, ReferenceMismatch, assert_matches_reference, check_backend,
                             check_case, compare_array, tolerance)


@pytest.mark.parametrize("op", list(OPS))
def test_the_reference_passes_by_name_and_as_a_callable(op):
    assert check_backend("reference", op, max_examples=15, seed=1) > 15
    assert check_backend(getattr(rg, op), op, max_examples=15, seed=2, regressions=False,
                         z_state=True) == 15


def _reverse_lstm_off_by_a_little(*args, **kwargs):
    """A candidate whose forward is wrong by 1% in the last step with reverse only."""
    result = rg.lstm(*args, **kwargs)
    if kwargs["descriptor"].reverse and len(result[0]):
        result[0][-1] *= 1.01
    return result


def test_a_mismatch_names_quantity_index_values_tolerance_and_reproduces():
    with pytest.raises(ReferenceMismatch) as info:
        check_backend(_reverse_lstm_off_by_a_little, "lstm", seed=0, regressions=False)
    exc, message = info.value, str(info.value)
    assert isinstance(exc, AssertionError)
    m = exc.mismatches[0]
    assert m.quantity == "state" and m.index[0] == exc.case.T - 1
    atol, rtol, _ = tolerance(np.float32, "state")
    assert f"atol={atol:g}" in message and f"rtol={rtol:g}" in message
    assert repr(m.got) in message and repr(m.want) in message
    # shrunk: the smallest problem that still shows the fault
    assert exc.case.descriptor == rg.LSTMDescriptor(reverse=True)
    assert exc.case.inputs["source"].shape[1] == 1 and exc.case.H == 1
    assert exc.examples >= 1
    # the reproduction runs and fails the same way
    script = message.split("Reproduce with:\n", 1)[1]
    namespace = {}
    with pytest.raises(ReferenceMismatch):
        exec(script.replace("candidate = ...", "candidate = _reverse_lstm_off_by_a_little"),
             {"_reverse_lstm_off_by_a_little": _reverse_lstm_off_by_a_little, **namespace})


def test_plain_sequences_in_mpsgraph_order_are_accepted():
    def as_tuple(*args, **kwargs):
        return tuple(np.array(a) for a in rg.gru_gradients(*args, **kwargs))
    assert check_backend(as_tuple, "gru_gradients", max_examples=10, seed=3, z_state=True) > 10


def test_crashes_wrong_dtypes_and_wrong_entries_are_failures():
    case = random_case(0, "single_gate", dtype=np.float32, optional={"bias": True})

    def crashes(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    with pytest.raises(ReferenceMismatch, match="raised RuntimeError: kernel launch failed"):
        assert_matches_reference(crashes, case, "single_gate_rnn")

    def widens(*args, **kwargs):
        return [np.asarray(a, np.float64) for a in rg.single_gate_rnn(*args, **kwargs)]

    with pytest.raises(ReferenceMismatch, match="dtype float64, expected float32"):
        assert_matches_reference(widens, case, "single_gate_rnn")

    def drops_bias(*args, **kwargs):
        return [g for name, g in rg.single_gate_rnn_gradients(*args, **kwargs).as_dict().items() if name != "bias"]

    with pytest.raises(ReferenceMismatch, match="entries"):
        assert_matches_reference(drops_bias, case, "single_gate_rnn_gradients", z_state=True)
    with pytest.raises(ValueError, match="op: 'gru' computes a gru cell"):
        assert_matches_reference("reference", case, "gru")


def test_gradient_ops_can_be_fed_by_the_candidates_own_forward():
    case = random_case(1, "lstm", dtype=np.float32, descriptor=rg.LSTMDescriptor())

    def bad_forward(*args, **kwargs):
        out = rg.lstm(*args, **kwargs)
        return (out.state, out.cell * 1.5, out.z_state)  # a wrong cell_output_fwd

    assert_matches_reference(rg.lstm_gradients, case, "lstm_gradients", z_state=True)
    with pytest.raises(ReferenceMismatch):
        assert_matches_reference(rg.lstm_gradients, case, "lstm_gradients", forward=bad_forward)


def test_compare_array_uses_the_table_and_catches_nan_differences():
    atol, rtol = TOLERANCES[("float32", "output")]
    want = np.array([1.0, -2.0, np.nan, np.inf])
    got = want + np.array([atol + rtol * 1.0, 0.0, 0.0, 0.0]) * 0.99
    assert compare_array("state", got, want, np.float32)[1] is None
    assert compare_array("state", got * np.array([1.0, 1.0, 1.0, 1.0]) + [3 * atol, 0, 0, 0], want,
                         np.float32)[1].index == (0,)
    assert compare_array("state", np.array([1.0, -2.0, 0.0, np.inf]), want, np.float32)[1].index == (2,)
    assert compare_array("state", np.array([1.0, -2.0, np.nan, -np.inf]), want, np.float32)[1].index == (3,)
    # parameter gradients: relative to the largest magnitude of the array
    patol, prtol = TOLERANCES[("float32", "parameter")]
    big = np.array([1000.0, 1e-6])
    assert compare_array("recurrent_weight", big + [0, 0.5 * prtol * 1000], big, np.float32)[1] is None
    assert compare_array("init_state", big + [0, 0.5 * prtol * 1000], big, np.float32)[1] is not None


def test_check_case_keeps_its_meaning_for_named_backends():
    case = random_case(4, "gru", dtype=np.float32)
    for gradients in (False, True):
        worst, mismatches = check_case(case, "reference", gradients)
        assert mismatches == [] and worst <= 1.0
    bad = dataclasses.replace(case, source_gradient=case.source_gradient)
    worst, mismatches = check_case(bad, lambda **kw: rg.gru_gradients(**dict(kw, source_gradient=kw["source_gradient"] * 2)), True)
    assert mismatches or not np.any(case.source_gradient)


def _exploding_gru():
    """Seed 569's float32 GRU: a tanh update gate with flip_z lets 1 − z reach 2, and the state
    grows to about 10⁴ over 8 steps."""
    rng = np.random.default_rng(569)
    return random_case(569, "gru", dtype=np.float32, N=int(rng.integers(2, 9)))


def test_input_sensitivity_tells_an_exploding_recurrence_from_a_tame_one():
    """The float64 reference moves by about 10⁻³ of the float32 tolerance under a half-ulp
    nudge of the inputs of ordinary cases, by more than the whole tolerance for an exploding
    GRU (where a float32 candidate then fails, numba's by 1.7× the tolerance), and by less than
    the tolerance for the same GRU in float64, where numba's gradients are 0.26 of it off (its
    tanh's last bit, which the sensitivity's second run puts at 0.26 to 0.7 of it)."""
    from rnngrad.testing import check_case, input_sensitivity

    for seed in range(3):
        for cell in ("single_gate", "gru", "lstm"):
            case = random_case(seed, cell, dtype=np.float32)
            assert input_sensitivity(case, False) < 0.01 and input_sensitivity(case, True) < 0.01
    wild = _exploding_gru()
    assert wild.descriptor.update_gate_activation == rg.Activation.TANH
    assert input_sensitivity(wild, False) > 1 and input_sensitivity(wild, True) > 10
    ratio, mismatches = check_case(wild, "numba", False)
    assert mismatches and ratio > 1  # what the sensitivity predicts for any float32 candidate
    calm = wild.astype(np.float64)
    assert input_sensitivity(calm, True) < 1 and not check_case(calm, "numba", True)[1]
    # a different nudge gives the same verdict
    assert input_sensitivity(wild, False, seed=1) > 0.5


def test_input_sensitivity_sees_a_saturated_tanh_gate_under_huge_gradients():
    """Seed 1201150993's float64 GRU (a tanh update gate, linear reset and output gates, states
    near 10¹⁰): its inputs' half-ulp nudge moves the reference's gradients by 5·10⁻⁴ of the
    tolerance, yet numba's gradients miss it by 10⁵ times the tolerance at one element, and
    the reference given numba's tanh (which differs from NumPy's in the last bit) gives numba's
    value exactly: 1 − tanh² of a saturated gate turns that bit into the difference. The
    sensitivity counts the activations' last bit too, and so calls the case ill-conditioned."""
    from rnngrad.testing import check_case, input_sensitivity

    seed = 1201150993
    rng = np.random.default_rng(seed)
    case = random_case(seed, "gru", dtype=np.float64, N=int(rng.integers(3, 9)))
    assert case.descriptor.update_gate_activation == rg.Activation.TANH
    ratio, mismatches = check_case(case, "numba", True)
    assert mismatches and ratio > 1e3  # what an ill-conditioned verdict must foresee
    assert input_sensitivity(case, True) > 1
    for seed in range(3):  # ordinary cases stay well-conditioned
        for cell in ("single_gate", "gru", "lstm"):
            tame = random_case(seed, cell, dtype=np.float64)
            assert input_sensitivity(tame, True) < 0.01
