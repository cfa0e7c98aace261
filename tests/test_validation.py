"""Wrong input raises before any work, naming the argument (SEMANTICS.md §5); any memory
layout gives bitwise the same results; inputs are never modified."""

import dataclasses
import sys
import types

import numpy as np
import pytest

import rnngrad as rg
from rnngrad import validation
from rnngrad.testing.cases import random_case

CELLS = ("single_gate", "gru", "lstm")
EVERYTHING = {k: True for k in ("input_weight", "bias", "init_state", "init_cell", "mask",
                                "peephole", "secondary_bias", "state_gradient", "cell_gradient")}


def full_case(cell, bidirectional=False, seed=0):
    desc = {"single_gate": rg.SingleGateRNNDescriptor, "gru": rg.GRUDescriptor,
            "lstm": rg.LSTMDescriptor}[cell](bidirectional=bidirectional, training=True)
    return random_case(seed, cell, T=3, N=2, I=4, H=3, descriptor=desc, optional=EVERYTHING)


def gradient_call(case, **override):
    h, c, z = case.training_forward("reference")
    kwargs = dict(case.gradient_kwargs(h, c, z), **override)
    fn = getattr(rg, {"single_gate": "single_gate_rnn", "gru": "gru", "lstm": "lstm"}[case.cell] + "_gradients")
    return fn(**kwargs, backend="reference")


def forward_call(case, **override):
    fn = getattr(rg, {"single_gate": "single_gate_rnn", "gru": "gru", "lstm": "lstm"}[case.cell])
    return fn(**dict(case.inputs, **override), descriptor=case.descriptor, backend="reference")


def wrong_shapes(case):
    """(argument, a wrongly shaped value) for every array argument of the case."""
    N, H, D = 2, case.H, case.D
    out = []
    for name, value in list(case.inputs.items()) + [("source_gradient", case.source_gradient),
                                                     ("state_gradient", case.state_gradient),
                                                     ("cell_gradient", case.cell_gradient)]:
        if value is None:
            continue
        if name == "mask":
            bad = np.ones((N, D * H + 1))
        else:
            shape = list(value.shape)
            shape[0 if name == "input_weight" else -1] += 1  # I of input_weight is free
            bad = np.ones(shape)
        out.append((name, bad))
    return out


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_every_wrong_shape_is_a_value_error_naming_the_argument(cell, bidirectional):
    case = full_case(cell, bidirectional)
    for name, bad in wrong_shapes(case):
        call = gradient_call if name in ("source_gradient", "state_gradient", "cell_gradient") else forward_call
        with pytest.raises(ValueError, match=rf"^{name}: expected .*got"):
            call(case, **{name: bad})
        if call is forward_call:
            with pytest.raises(ValueError, match=rf"^{name}: expected .*got"):
                gradient_call(case, **{name: bad})


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_wrong_forward_outputs_are_value_errors(cell):
    case = full_case(cell)
    name = "output_fwd" if cell == "gru" else "cell_output_fwd"
    with pytest.raises(ValueError, match=rf"^{name}: expected shape \(3, 2, 3\)"):
        gradient_call(case, **{name: np.ones((3, 2, 4))})
    with pytest.raises(ValueError, match=r"^z_state: expected shape"):
        gradient_call(case, z_state=np.ones((3, 2, 5)))


def test_z_state_of_the_other_reset_after_is_named():
    case = full_case("gru")
    other = dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, reset_after=True))
    _, _, z = other.training_forward("reference")
    with pytest.raises(ValueError, match="made with reset_after=True"):
        gradient_call(case, z_state=z)


def test_missing_required_argument_is_a_type_error():
    case = full_case("lstm")
    with pytest.raises(TypeError, match="cell_output_fwd: expected an array, got None"):
        gradient_call(case, cell_output_fwd=None)
    with pytest.raises(TypeError, match="source: expected an array, got None"):
        forward_call(case, source=None)


def test_recurrent_weight_message_gives_the_expected_shape():
    case = full_case("gru")
    with pytest.raises(ValueError, match=r"recurrent_weight: expected shape .*\(9, 3\).*got \(12, 3\)"):
        forward_call(case, recurrent_weight=np.ones((12, 3)))


def test_bidirectional_mask_must_split_into_two_halves():
    case = full_case("single_gate", bidirectional=True)
    with pytest.raises(ValueError, match=r"mask: expected the last axis to be 2\*H = 6"):
        forward_call(case, mask=np.ones((2, 1)))


def test_mask_broadcasts():
    case = full_case("lstm")
    full = forward_call(case, mask=np.broadcast_to(case.inputs["mask"][0], (2, 3)).copy())
    broadcast = forward_call(case, mask=case.inputs["mask"][0])  # [H] -> [N,H]
    assert np.array_equal(full.state, broadcast.state)


def layouts(a):
    """The same values as a Fortran-ordered, a strided, a negatively strided and a read-only array."""
    fortran = np.asfortranarray(a)
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype) if a.ndim else a.copy()
    if a.ndim:
        wide[..., ::2] = a
        strided = wide[..., ::2]
    else:
        strided = wide
    flipped = np.flip(np.flip(a).copy())
    readonly = a.copy()
    readonly.flags.writeable = False
    return {"fortran": fortran, "strided": strided, "negative": flipped, "readonly": readonly}


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("layout", ["fortran", "strided", "negative", "readonly"])
def test_memory_layout_gives_bitwise_the_same_results(cell, layout):
    case = full_case(cell, seed=3)
    want_f, want_g = forward_call(case), gradient_call(case)
    h, c, z = case.training_forward("reference")
    kwargs = case.gradient_kwargs(h, c, z)
    relaid = {k: layouts(v)[layout] if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    if layout == "negative":
        assert relaid["source"].strides[0] < 0
    got_f = forward_call(case, **{k: relaid[k] for k in case.inputs})
    fn = getattr(rg, {"single_gate": "single_gate_rnn", "gru": "gru", "lstm": "lstm"}[cell] + "_gradients")
    got_g = fn(**relaid, backend="reference")
    for a, b in zip(got_f + got_g, want_f + want_g):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("cell", CELLS)
def test_inputs_are_never_modified(cell):
    case = full_case(cell, seed=4)
    h, c, z = case.training_forward("reference")
    kwargs = case.gradient_kwargs(h, c, z)
    before = {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    forward_call(case)
    fn = getattr(rg, {"single_gate": "single_gate_rnn", "gru": "gru", "lstm": "lstm"}[cell] + "_gradients")
    fn(**kwargs, backend="reference")
    for k, v in before.items():
        assert np.array_equal(kwargs[k], v), k


class _OnGPU:
    """Stands for a GPU array: what rnngrad looks at before anything touches the data."""

    shape = (2, 1, 3)
    dtype = np.dtype(np.float32)
    __cuda_array_interface__ = {"shape": (2, 1, 3), "typestr": "<f4", "data": (0, False), "version": 3}


def test_inputs_split_between_gpu_and_host_are_refused_naming_each():
    R = np.zeros((3, 3), np.float32)
    with pytest.raises(TypeError, match="all array inputs must be on one device, got source on the GPU, "
                                        "recurrent_weight on the host"):
        rg.single_gate_rnn(_OnGPU(), R, backend="reference")


# -- checks once per signature (rnngrad.validation.checked_problem) ------------------------------

def _given(case, gradients):
    """The case's arguments as the checks take them: {name: array}, no mask."""
    if not gradients:
        given = dict(case.inputs)
    else:
        h, c, z = case.training_forward("reference")
        given = case.gradient_kwargs(h, c, z)
        given.pop("descriptor", None)
    return {k: v for k, v in given.items() if isinstance(v, np.ndarray) and k != "mask"}


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("gradients", [False, True])
def test_a_signature_seen_before_gives_the_problem_the_checks_give(cell, gradients):
    case = full_case(cell, bidirectional=True, seed=5)
    given = _given(case, gradients)
    want, want_original = validation._build(cell, case.descriptor, given, gradients)
    for _ in range(2):  # the first call checks, the second uses what the first found
        got, original = validation.checked_problem(cell, case.descriptor, given, gradients)
        assert original == want_original
        for field in dataclasses.fields(want):
            a, b = getattr(got, field.name), getattr(want, field.name)
            if isinstance(b, np.ndarray):
                assert a.shape == b.shape and np.shares_memory(a, given[field.name]), field.name
            else:
                assert a == b, field.name


class _CupyArray:
    """Stands for a CuPy array over a NumPy one: what the checks read (shape, dtype, flags,
    reshape), and not a NumPy array."""

    __cuda_array_interface__ = {}

    def __init__(self, a):
        self.a = a
        self.shape, self.dtype, self.ndim, self.flags = a.shape, a.dtype, a.ndim, a.flags

    def reshape(self, *shape):
        return _CupyArray(self.a.reshape(*shape))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("gradients", [False, True])
def test_a_gpu_signature_seen_before_is_reshaped_as_the_checks_reshape_it(cell, gradients,
                                                                         monkeypatch):
    # a CuPy array is cached like a NumPy one; a later call's must come back in the checks'
    # shapes too (recurrent_weight [G·H,H] → [1,G·H,H], which the Metal host transposes)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(ndarray=_CupyArray))
    case = full_case(cell, seed=9)
    given = {k: _CupyArray(v) for k, v in _given(case, gradients).items()}
    first, _ = validation.checked_problem(cell, case.descriptor, given, gradients)
    again, _ = validation.checked_problem(cell, case.descriptor, dict(given), gradients)
    for name, value in given.items():
        assert getattr(again, name).shape == getattr(first, name).shape, name
    assert again.recurrent_weight.shape == (1,) + given["recurrent_weight"].shape


@pytest.mark.parametrize("cell", CELLS)
def test_a_non_contiguous_argument_is_checked_once_per_signature_too(cell, monkeypatch):
    # a gradient PyTorch expands from a sum has stride 0 at every call of a training loop
    case = full_case(cell, seed=7)
    given = _given(case, True)
    seen = validation.checked_problem(cell, case.descriptor, given, True)[0]
    expanded = np.broadcast_to(given["source_gradient"][:1], given["source_gradient"].shape)
    builds = []
    build = validation._build
    monkeypatch.setattr(validation, "_build", lambda *a: builds.append(1) or build(*a))
    for _ in range(3):
        got, _ = validation.checked_problem(cell, case.descriptor,
                                            dict(given, source_gradient=expanded), True)
        assert got.source_gradient.flags.c_contiguous
        assert np.array_equal(got.source_gradient, expanded)
        assert got.T == seen.T and got.H == seen.H
    assert len(builds) == 0


@pytest.mark.parametrize("cell", CELLS)
def test_a_mask_is_checked_once_per_signature_and_broadcast_as_the_checks_do(cell, monkeypatch):
    case = full_case(cell, bidirectional=True, seed=8)
    given = _given(case, False)
    T, N, DH = case.inputs["source"].shape[0], case.inputs["source"].shape[1], \
        2 * case.inputs["recurrent_weight"].shape[-1]
    rng = np.random.default_rng(8)
    dtype = given["source"].dtype
    builds = []
    build = validation._build
    monkeypatch.setattr(validation, "_build", lambda *a: builds.append(1) or build(*a))
    for shape in [(N, DH), (1, DH), (T, N, DH), (T, 1, DH)]:
        mask = (rng.random(shape) > 0.4).astype(dtype)
        want, _ = build(cell, case.descriptor, dict(given, mask=mask), False)
        for _ in range(3):
            got, _ = validation.checked_problem(cell, case.descriptor, dict(given, mask=mask),
                                                False)
            assert got.mask.shape == want.mask.shape and np.array_equal(got.mask, want.mask)
    assert len(builds) == 4  # one a signature
    with pytest.raises(ValueError, match="^mask: expected"):
        validation.checked_problem(cell, case.descriptor,
                                   dict(given, mask=np.ones((N, DH + 1), dtype)), False)


@pytest.mark.parametrize("cell", CELLS)
def test_a_signature_seen_before_does_not_excuse_another(cell):
    """After a good call, each argument with a wrong shape or another dtype is still refused by
    name: the shapes and dtypes are the signature."""
    case = full_case(cell, seed=6)
    given = _given(case, False)
    validation.checked_problem(cell, case.descriptor, given, False)
    for name, value in given.items():
        shape = list(value.shape)
        shape[0 if name == "input_weight" else -1] += 1
        with pytest.raises(ValueError, match=f"^{name}: expected shape"):
            validation.checked_problem(cell, case.descriptor,
                                       dict(given, **{name: np.ones(shape)}), False)
        other = np.float32 if value.dtype == np.float64 else np.float64
        with pytest.raises(TypeError, match="share one floating dtype"):
            validation.checked_problem(cell, case.descriptor,
                                       dict(given, **{name: value.astype(other)}), False)
    # a descriptor of another cell, a non-contiguous array: checked as every call is
    with pytest.raises(TypeError, match="descriptor: expected an rnngrad"):
        validation.checked_problem(cell, rg.LSTMDescriptor() if cell != "lstm"
                                   else rg.GRUDescriptor(), given, False)
    strided = dict(given, source=np.asfortranarray(given["source"]))
    got, _ = validation.checked_problem(cell, case.descriptor, strided, False)
    assert got.source.flags.c_contiguous and np.array_equal(got.source, given["source"])
