"""The public surface: descriptors, result orders and shapes, dtypes, edge cases, backends."""

import dataclasses
import pickle

import numpy as np
import pytest

import rnngrad as rg
from rnngrad.testing.cases import random_case
from rnngrad.testing import compare_array

CELLS = ("single_gate", "gru", "lstm")
ALL = {k: True for k in ("input_weight", "bias", "init_state", "init_cell", "peephole",
                         "secondary_bias", "state_gradient", "mask")}


# -- descriptors --------------------------------------------------------------------------------

def test_descriptor_defaults_are_mpsgraphs():
    s, l, g = rg.SingleGateRNNDescriptor(), rg.LSTMDescriptor(), rg.GRUDescriptor()
    for d in (s, l, g):
        assert (d.reverse, d.bidirectional, d.training) == (False, False, False)
    assert s.activation is rg.Activation.RELU
    assert (l.produce_cell, l.forget_gate_last) == (False, False)
    assert [l.input_gate_activation, l.forget_gate_activation, l.output_gate_activation] == [rg.Activation.SIGMOID] * 3
    assert (l.cell_gate_activation, l.activation) == (rg.Activation.TANH, rg.Activation.TANH)
    assert (g.reset_gate_first, g.reset_after, g.flip_z) == (False, False, False)
    assert (g.update_gate_activation, g.reset_gate_activation) == (rg.Activation.SIGMOID,) * 2
    assert g.output_gate_activation is rg.Activation.TANH


def test_activation_values_are_mpsgraphs():
    assert [(a.name, int(a)) for a in rg.Activation] == [
        ("NONE", 0), ("RELU", 1), ("TANH", 2), ("SIGMOID", 3), ("HARD_SIGMOID", 4)]


@pytest.mark.parametrize("value", [rg.Activation.HARD_SIGMOID, "hard_sigmoid", "HARD_SIGMOID", "hardSigmoid", 4, np.int64(4)])
def test_activation_accepts_enum_name_and_integer(value):
    assert rg.SingleGateRNNDescriptor(activation=value).activation is rg.Activation.HARD_SIGMOID


@pytest.mark.parametrize("value", [5, -1, "swish", 2.0, True, None])
def test_bad_activation_is_a_value_error_naming_the_field(value):
    with pytest.raises(ValueError, match="cell_gate_activation"):
        rg.LSTMDescriptor(cell_gate_activation=value)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_bad_option_is_a_value_error_naming_the_field(value):
    with pytest.raises(ValueError, match="GRUDescriptor.flip_z: expected a bool"):
        rg.GRUDescriptor(flip_z=value)


def test_descriptors_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        rg.GRUDescriptor().flip_z = True


def test_wrong_descriptor_class_is_a_type_error():
    case = random_case(0, "gru")
    with pytest.raises(TypeError, match="descriptor: expected an rnngrad.GRUDescriptor"):
        rg.gru(**case.inputs, descriptor=rg.LSTMDescriptor())


# -- result order, names, shapes ----------------------------------------------------------------

@pytest.mark.parametrize("cell,training,produce_cell", [
    (cell, training, produce) for cell in CELLS for training in (False, True)
    for produce in ((False, True) if cell == "lstm" else (False,))])
def test_forward_entries_in_mpsgraphs_order(cell, training, produce_cell):
    options = dict(training=training, **({"produce_cell": produce_cell} if cell == "lstm" else {}))
    case = random_case(1, cell, T=3, N=2, I=4, H=5)
    case = dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, **options))
    out = case.forward(backend="reference")
    has_cell = cell == "lstm" and (training or produce_cell)
    expected = ["state"] + (["cell"] if has_cell else []) + (["z_state"] if training else [])
    assert list(out.names) == expected and len(out) == len(expected)
    for i, name in enumerate(expected):
        assert out[i] is getattr(out, name)
    for name in {"state", "cell", "z_state"} - set(expected):
        assert getattr(out, name) is None
    D, H = case.D, case.H
    assert out.state.shape == (3, 2, D * H)
    if training:
        Z = 4 if cell == "gru" and case.descriptor.reset_after else case.descriptor.gates
        assert out.z_state.shape == (3, 2, D * Z * H)
    unpacked = tuple(out)
    assert len(unpacked) == len(expected)


ORDER = {
    "single_gate": ["source", "recurrent_weight", "input_weight", "bias", "init_state"],
    "gru": ["source", "recurrent_weight", "input_weight", "bias", "init_state", "secondary_bias"],
    "lstm": ["source", "recurrent_weight", "input_weight", "bias", "peephole", "init_state", "init_cell"],
}


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("seed", range(6))
def test_gradient_entries_in_mpsgraphs_order_and_shapes(cell, seed):
    rng = np.random.default_rng(seed)
    optional = {k: bool(rng.integers(2)) for k in ALL}
    case = random_case(seed, cell, T=3, N=2, I=4, H=3, optional=optional)
    grads = case.gradients("reference")
    expected = [n for n in ORDER[cell] if n in ("source", "recurrent_weight") or n in case.inputs]
    assert list(grads.names) == expected
    G, D, H = case.descriptor.gates, case.D, case.H
    for name in expected:
        want = (1, 1, D * G * H) if name == "bias" else case.inputs[name].shape
        assert getattr(grads, name).shape == want, name
    for name in set(GRADIENT_NAMES) - set(expected):
        assert getattr(grads, name) is None


GRADIENT_NAMES = ("source", "recurrent_weight", "input_weight", "bias", "peephole", "init_state",
                  "init_cell", "secondary_bias")


def test_states_given_as_1_n_dh_keep_that_shape():
    case = random_case(2, "lstm", T=3, N=2, I=2, H=3, optional={"init_state": True, "init_cell": True})
    inputs = dict(case.inputs, init_state=case.inputs["init_state"][None], init_cell=case.inputs["init_cell"][None])
    g = dataclasses.replace(case, inputs=inputs).gradients("reference")
    assert g.init_state.shape == (1, 2, case.D * 3) and g.init_cell.shape == (1, 2, case.D * 3)
    _, mismatch = compare_array("init_state", g.init_state[0], case.gradients("reference").init_state, np.float64)
    assert mismatch is None


def test_results_pickle_and_repr():
    out = random_case(3, "lstm", optional={"bias": True}).gradients("reference")
    again = pickle.loads(pickle.dumps(out))
    assert again.names == out.names and all(np.array_equal(a, b) for a, b in zip(again, out))
    assert "recurrent_weight" in repr(out)


def test_secondary_bias_without_reset_after_gets_a_zero_gradient():
    case = random_case(4, "gru", optional={"secondary_bias": True}, descriptor=rg.GRUDescriptor(reset_after=False))
    g = case.gradients("reference")
    assert g.secondary_bias.shape == case.inputs["secondary_bias"].shape and not g.secondary_bias.any()


# -- dtypes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_outputs_have_the_inputs_dtype(dtype):
    case = random_case(5, "gru", dtype=dtype, descriptor=rg.GRUDescriptor(training=True))
    assert all(a.dtype == dtype for a in case.forward(backend="reference"))
    assert all(a.dtype == dtype for a in case.gradients("reference"))


def test_reference_computes_in_float64_for_float32_inputs():
    """float32 in, float32 out, but the arithmetic is float64: equal to the float64 run rounded."""
    case = random_case(6, "lstm", T=20, dtype=np.float32)
    got = case.forward(backend="reference").state
    want = case.astype(np.float64).forward(backend="reference").state.astype(np.float32)
    assert np.array_equal(got, want)


def test_mixed_dtypes_are_a_type_error_naming_the_arguments():
    case = random_case(7, "lstm", optional={"bias": True})
    with pytest.raises(TypeError, match="bias=float32"):
        rg.lstm(**dict(case.inputs, bias=case.inputs["bias"].astype(np.float32)))


@pytest.mark.parametrize("bad", [np.int32, np.bool_, np.complex64])
def test_non_floating_dtype_is_a_type_error(bad):
    case = random_case(8, "single_gate", optional={"mask": True, "input_weight": True})
    with pytest.raises(TypeError, match="mask: expected a floating dtype"):
        rg.single_gate_rnn(**dict(case.inputs, mask=np.ones_like(case.inputs["mask"], dtype=bad)))


def test_lists_take_the_common_dtype():
    case = random_case(9, "single_gate", dtype=np.float32, optional={"bias": True})
    out = rg.single_gate_rnn(**dict(case.inputs, bias=case.inputs["bias"].tolist()), descriptor=case.descriptor,
                             backend="reference")
    assert out.state.dtype == np.float32
    assert np.array_equal(out.state, case.forward(backend="reference").state)


# -- backends ------------------------------------------------------------------------------------

def test_reference_is_always_available():
    assert "reference" in rg.available_backends()


def test_unknown_backend_lists_the_available_ones():
    case = random_case(10, "gru")
    with pytest.raises(ValueError, match=r"backend: unknown backend 'cuda'; available: \("):
        rg.gru(**case.inputs, descriptor=case.descriptor, backend="cuda")


# -- edge cases (SEMANTICS.md §4) -----------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("T,N", [(0, 3), (4, 0), (0, 0)])
def test_empty_time_or_batch(cell, T, N):
    case = random_case(11, cell, T=T, N=N, I=2, H=3, optional=dict(ALL, cell_gradient=True),
                       cell_gradient_form="final")
    case = dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, training=True))
    out = case.forward(backend="reference")
    assert out.state.shape == (T, N, case.D * 3)
    g = case.gradients("reference")
    assert g.source.shape == case.inputs["source"].shape
    for name in ("recurrent_weight", "input_weight", "bias", "peephole", "secondary_bias"):
        if getattr(g, name) is not None:
            assert not np.any(getattr(g, name)), name
    if T == 0:
        assert np.array_equal(g.init_state, case.state_gradient)
        if cell == "lstm":
            assert np.array_equal(g.init_cell, case.cell_gradient)


@pytest.mark.parametrize("cell", CELLS)
def test_nan_in_one_batch_row_stays_in_that_row(cell):
    case = random_case(12, cell, T=4, N=3, I=2, H=3, optional=dict(ALL, cell_gradient=True))
    case = dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, training=True))
    source = case.inputs["source"].copy()
    source[1, 1, 0] = np.nan
    poisoned = dataclasses.replace(case, inputs=dict(case.inputs, source=source))
    out = poisoned.forward(backend="reference")
    clean = case.forward(backend="reference")
    for a, b in zip(out, clean):
        assert np.array_equal(a[:, [0, 2]], b[:, [0, 2]])  # other rows untouched, bitwise
        assert np.isnan(a[:, 1]).any()
    g, gc = poisoned.gradients("reference"), case.gradients("reference")
    assert np.array_equal(g.source[:, [0, 2]], gc.source[:, [0, 2]])
    assert np.array_equal(g.init_state[[0, 2]], gc.init_state[[0, 2]])
    assert np.isnan(g.source[:, 1]).any()


@pytest.mark.parametrize("kind", list(rg.Activation))
def test_activations_never_turn_nan_into_a_number(kind):
    from rnngrad.backends.reference.activations import activate, derivative

    x = np.array([np.nan, -np.inf, -3.0, 0.0, 3.0, np.inf])
    assert np.isnan(activate(kind, x)[0]) and np.isnan(derivative(kind, x)[0])


def test_hard_sigmoid_constants():
    from rnngrad.backends.reference.activations import activate, derivative

    x = np.array([-3.0, -2.5, -1.0, 0.0, 1.0, 2.5, 3.0])
    assert np.allclose(activate(rg.Activation.HARD_SIGMOID, x), np.clip(0.2 * x + 0.5, 0, 1))
    assert list(derivative(rg.Activation.HARD_SIGMOID, x)) == [0, 0.2, 0.2, 0.2, 0.2, 0.2, 0]


def test_sigmoid_does_not_overflow():
    from rnngrad.backends.reference.activations import sigmoid

    with np.errstate(over="raise"):
        s = sigmoid(np.array([-1000.0, 0.0, 1000.0]))
    assert list(s) == [0.0, 0.5, 1.0]


@pytest.mark.parametrize("kind", list(rg.Activation))
def test_derivative_from_the_output_equals_derivative_from_the_input(kind):
    from rnngrad.backends.reference.activations import activate, derivative

    x = np.linspace(-6, 6, 101)
    _, mismatch = compare_array("state", derivative(kind, x, activate(kind, x)), derivative(kind, x), np.float64)
    assert mismatch is None, str(mismatch)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nonfinite_inputs_propagate_without_warnings(cell, value):
    """NaN and Inf propagate by definition (SEMANTICS.md §4): the reference says nothing."""
    import warnings

    case = random_case(3, cell, T=3, N=2, I=2, H=3, optional=dict(ALL, cell_gradient=True))
    case = dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, training=True))
    source = case.inputs["source"].copy()
    source[1, 0, :] = value
    poisoned = dataclasses.replace(case, inputs=dict(case.inputs, source=source))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = poisoned.forward(backend="reference")
        grads = poisoned.gradients("reference")
    assert not np.isfinite(out.state[:, 0]).all() and np.isfinite(out.state[:, 1]).all()
    assert np.isfinite(grads.source[:, 1]).all()
