"""The numba backend against the float64 reference: every cell, option and optional input,
float32 and float64, mixed pipelines, boundary sizes, NaN confinement and bad-input parity."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("numba")

from hypothesis import given, settings, strategies as st  # noqa: E402

import rnngrad as rg  # noqa: E402
from rnngrad.testing.cases import CELLS, random_case  # noqa: E402
from rnngrad.testing import check_case  # noqa: E402
from draws import conditioned  # noqa: E402

DTYPES = (np.float32, np.float64)
SETTINGS = settings(max_examples=25, deadline=None)


def _assert_ok(case, result):
    worst, mismatches = result
    assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES),
       gradients=st.booleans())
def test_random_cases_match_reference(seed, cell, dtype, gradients):
    case = conditioned(random_case(seed, cell, dtype=dtype))
    _assert_ok(case, check_case(case, "numba", gradients))


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES))
def test_mixed_pipelines(seed, cell, dtype):
    case = conditioned(random_case(seed, cell, dtype=dtype))
    _assert_ok(case, check_case(case, "reference", True, forward_backend="numba"))
    _assert_ok(case, check_case(case, "numba", True, forward_backend="reference"))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("every", [True, False])
def test_all_optional_inputs_present_or_absent(cell, dtype, every):
    names = ("input_weight", "bias", "init_state", "init_cell", "mask", "mask_per_step",
             "peephole", "secondary_bias", "state_gradient", "cell_gradient")
    for seed in range(3):
        case = random_case(seed, cell, dtype=dtype, optional={n: every for n in names})
        _assert_ok(case, check_case(case, "numba", False))
        _assert_ok(case, check_case(case, "numba", True))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("T,N,H", [(0, 3, 4), (3, 0, 4), (4, 3, 1), (3, 31, 5), (3, 32, 5),
                                   (3, 33, 5), (2, 3, 31), (2, 3, 32), (2, 3, 33), (2, 40, 40)])
def test_boundary_sizes(cell, T, N, H):
    for dtype in DTYPES:
        case = random_case(T * 100 + N * 10 + H, cell, T=T, N=N, H=H, I=3, dtype=dtype)
        _assert_ok(case, check_case(case, "numba", False))
        _assert_ok(case, check_case(case, "numba", True))


@pytest.mark.parametrize("cell", CELLS)
def test_parallel_row_blocks(cell):
    """Large enough that the batch is split into parallel row blocks."""
    for dtype in DTYPES:
        case = random_case(7, cell, T=4, N=37, I=8, H=64, dtype=dtype)
        _assert_ok(case, check_case(case, "numba", False))
        _assert_ok(case, check_case(case, "numba", True))


@pytest.mark.parametrize("cell", CELLS)
def test_nan_stays_in_its_row(cell):
    """Contract §4: a NaN in batch row n reaches only row n, and stays NaN."""
    case = random_case(11, cell, T=5, N=4, I=3, H=6, dtype=np.float64,
                       optional={"mask": False, "input_weight": True})
    case.inputs["source"][2, 1, 0] = np.nan
    out = case.forward("numba")
    want = case.forward("reference")
    h = out.state
    assert np.array_equal(np.isnan(h), np.isnan(want.state))
    rows = np.isnan(h).any(axis=(0, 2))
    assert rows[1] and not rows[[0, 2, 3]].any()
    grads = case.gradients("numba")
    ref = case.gradients("reference")
    for name in ("source", "init_state", "init_cell"):
        got = getattr(grads, name)
        if got is not None:
            assert np.array_equal(np.isnan(got), np.isnan(getattr(ref, name))), name
            assert not np.isnan(np.delete(got, 1, axis=-2)).any(), name


def _error(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type and message are what is compared
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("cell", CELLS)
def test_bad_input_errors_match_reference(cell):
    case = random_case(3, cell, T=3, N=2, I=3, H=4, dtype=np.float32,
                       optional={"input_weight": True})
    bad = [
        dict(case.inputs, recurrent_weight=case.inputs["recurrent_weight"][:-1]),
        dict(case.inputs, source=case.inputs["source"].astype(np.float64)),
        dict(case.inputs, source=case.inputs["source"][0]),
        dict(case.inputs, init_state=np.zeros((5, 7), np.float32)),
    ]
    for inputs in bad:
        broken = dataclasses.replace(case, inputs=inputs)
        want = _error(lambda: broken.forward("reference"))
        got = _error(lambda: broken.forward("numba"))
        assert want is not None and got == want
    wrong_z = lambda backend: getattr(rg, {"single_gate": "single_gate_rnn", "gru": "gru",  # noqa: E731
                                           "lstm": "lstm"}[cell] + "_gradients")(
        **dict(case.gradient_kwargs(*case.training_forward("reference")),
               z_state=np.zeros((3, 2, 1), np.float32)), backend=backend)
    assert _error(lambda: wrong_z("numba")) == _error(lambda: wrong_z("reference")) is not None


def test_float16_is_refused_with_a_message():
    case = random_case(1, "lstm", dtype=np.float16)
    with pytest.raises(TypeError, match="numba"):
        case.forward("numba")
