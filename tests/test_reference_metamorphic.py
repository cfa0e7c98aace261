"""Metamorphic relations of the reference: each option equals a rearrangement of another run.

Each test builds the same problem two ways and compares the results with the float64 tolerance
table of ``rnngrad.testing`` (the two runs are different computations, so they agree to
round-off, not bitwise).
"""

import dataclasses

import numpy as np
from hypothesis import given, strategies as st

import rnngrad as rg
from draws import cases
from rnngrad.testing.cases import Case, random_case
from rnngrad.results import GradientResult
from rnngrad.testing import compare_results


def assert_same(got, want):
    worst, mismatches = compare_results(got, want, np.float64)
    assert not mismatches, "\n".join(str(m) for m in mismatches)


def assert_arrays(quantity, got, want):
    from rnngrad.testing import compare_array

    _, mismatch = compare_array(quantity, got, want, np.float64)
    assert mismatch is None, str(mismatch)


def with_descriptor(case, **changes):
    return dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, **changes))


def blocks(a, H, axis, order):
    """Reorder the H-blocks of ``a`` along ``axis`` (per direction block of len(order)·H)."""
    a = np.asarray(a)
    n = a.shape[axis] // (len(order) * H)
    pieces = np.split(a, n * len(order), axis=axis)
    out = []
    for d in range(n):
        out += [pieces[d * len(order) + j] for j in order]
    return np.concatenate(out, axis=axis)


def permute_case(case, order, with_peephole=True):
    """The case with every gate-packed input's blocks reordered by ``order``."""
    H = case.H
    inputs = dict(case.inputs)
    if "input_weight" in inputs:
        inputs["input_weight"] = blocks(inputs["input_weight"], H, 0, order)
    else:
        inputs["source"] = blocks(inputs["source"], H, -1, order)
    inputs["recurrent_weight"] = blocks(inputs["recurrent_weight"], H, -2, order)
    if "bias" in inputs:
        inputs["bias"] = blocks(inputs["bias"], H, 0, order)
    if with_peephole and "peephole" in inputs:
        inputs["peephole"] = blocks(inputs["peephole"], H, -1, order)
    return dataclasses.replace(case, inputs=inputs)


def permute_gradients(grads, H, order):
    entries = []
    for name, value in grads.as_dict().items():
        if name == "source" and value.shape[-1] % (len(order) * H) == 0 and "input_weight" not in grads.names:
            value = blocks(value, H, -1, order)
        elif name in ("input_weight", "bias", "peephole"):
            value = blocks(value, H, 0 if name == "input_weight" else -1, order)
        elif name == "recurrent_weight":
            value = blocks(value, H, -2, order)
        entries.append((name, value))
    return GradientResult(entries)


# -- gate layouts -------------------------------------------------------------------------------

@given(case=cases(cells=("lstm",), options={"training": True}))
def test_forget_gate_last_equals_row_permuted_weights(case):
    """[i,z,f,o] weights with forget_gate_last == the same weights as [i,f,z,o] without."""
    last = with_descriptor(case, forget_gate_last=True, training=True)
    plain = permute_case(with_descriptor(case, forget_gate_last=False, training=True), [0, 2, 1, 3])
    a, b = last.forward(backend="reference"), plain.forward(backend="reference")
    assert_arrays("state", a.state, b.state)
    assert_arrays("z_state", blocks(a.z_state, case.H, -1, [0, 2, 1, 3]), b.z_state)
    assert_same(permute_gradients(last.gradients("reference"), case.H, [0, 2, 1, 3]),
                plain.gradients("reference"))


@given(case=cases(cells=("gru",), options={"training": True}))
def test_reset_gate_first_equals_row_permuted_weights(case):
    first = with_descriptor(case, reset_gate_first=True, training=True)
    plain = permute_case(with_descriptor(case, reset_gate_first=False, training=True), [1, 0, 2])
    a, b = first.forward(backend="reference"), plain.forward(backend="reference")
    assert_arrays("state", a.state, b.state)
    assert_same(permute_gradients(first.gradients("reference"), case.H, [1, 0, 2]),
                plain.gradients("reference"))


# -- flip_z -------------------------------------------------------------------------------------

def negate_update_gate(case):
    """Negate every parameter that feeds the update gate's pre-activation."""
    H, G = case.H, 3
    z = case.descriptor.gate_index["z"]
    sign = np.ones(G * H)
    sign[z * H:(z + 1) * H] = -1
    sign = np.tile(sign, case.D)  # [D·3H]
    inputs = dict(case.inputs)
    if "input_weight" in inputs:
        inputs["input_weight"] = inputs["input_weight"] * sign[:, None]
    else:
        inputs["source"] = inputs["source"] * sign
    R = inputs["recurrent_weight"]
    inputs["recurrent_weight"] = R * sign.reshape(case.D, G * H, 1).reshape(R.shape[:-1] + (1,))
    if "bias" in inputs:
        inputs["bias"] = inputs["bias"] * sign
    return dataclasses.replace(case, inputs=inputs), sign


@given(case=cases(cells=("gru",)))
def test_flip_z_equals_negated_update_gate(case):
    """With a sigmoid update gate, 1 − σ(a) = σ(−a): flip_z on θ == no flip_z on θ with the
    update gate's parameters negated, and the gradients map back through the same negation."""
    case = with_descriptor(case, update_gate_activation=rg.Activation.SIGMOID)
    flipped = with_descriptor(case, flip_z=True)
    plain, sign = negate_update_gate(with_descriptor(case, flip_z=False))
    assert_arrays("state", flipped.forward(backend="reference").state, plain.forward(backend="reference").state)
    g = plain.gradients("reference").as_dict()
    entries = []
    for name, value in g.items():
        if name == "source" and "input_weight" not in g:
            value = value * sign
        elif name == "input_weight":
            value = value * sign[:, None]
        elif name == "bias":
            value = value * sign
        elif name == "recurrent_weight":
            value = value * sign.reshape(value.shape[:-1] + (1,))
        entries.append((name, value))
    assert_same(flipped.gradients("reference"), GradientResult(entries))


# -- time direction -----------------------------------------------------------------------------

@given(case=cases(options={"bidirectional": False, "training": True}))
def test_reverse_equals_forward_on_time_flipped_input(case):
    """reverse on x == forward on x[::-1], outputs in processing order (not flipped back); the
    source gradient comes back in input order."""
    rev = with_descriptor(case, reverse=True)
    fwd = with_descriptor(case, reverse=False)
    fwd = dataclasses.replace(fwd, inputs=dict(fwd.inputs, source=fwd.inputs["source"][::-1]))
    a, b = rev.forward(backend="reference"), fwd.forward(backend="reference")
    assert_same(a, b)
    ga, gb = rev.gradients("reference").as_dict(), fwd.gradients("reference").as_dict()
    gb["source"] = gb["source"][::-1]
    assert_same(GradientResult(list(ga.items())), GradientResult(list(gb.items())))


def halves(case, d):
    """Direction d of a bidirectional case as a unidirectional case (reverse for d = 1), with
    its aligned inputs in that direction's processing order."""
    H, G, T = case.H, case.descriptor.gates, case.T
    part = lambda a: a[..., d * H:(d + 1) * H]  # noqa: E731
    flip = (lambda a: a[::-1]) if d == 1 else (lambda a: a)  # noqa: E731
    inputs = {}
    for name, value in case.inputs.items():
        if name == "source":
            inputs[name] = value if "input_weight" in case.inputs else value[..., d * G * H:(d + 1) * G * H]
        elif name == "input_weight":
            inputs[name] = value[d * G * H:(d + 1) * G * H]
        elif name == "bias":
            inputs[name] = value[d * G * H:(d + 1) * G * H]
        elif name in ("recurrent_weight", "peephole"):
            inputs[name] = value[d]
        else:  # init_state, init_cell, mask (never time-reversed), secondary_bias
            inputs[name] = part(value)
    cg = case.cell_gradient
    if cg is not None:
        cg = flip(part(cg)) if cg.ndim == 3 and cg.shape[0] == T and T != 1 else part(cg)
    return Case(case.cell, dataclasses.replace(case.descriptor, bidirectional=False, reverse=d == 1,
                                               training=True),
                inputs, flip(part(case.source_gradient)),
                None if case.state_gradient is None else part(case.state_gradient), cg)


@given(case=cases(options={"bidirectional": True, "training": True}))
def test_bidirectional_equals_two_unidirectional_runs(case):
    both = case.forward(backend="reference")
    runs = [halves(case, d).forward(backend="reference") for d in (0, 1)]
    assert_arrays("state", both.state, np.concatenate([runs[0].state, runs[1].state[::-1]], -1))
    assert_arrays("z_state", both.z_state, np.concatenate([runs[0].z_state, runs[1].z_state[::-1]], -1))
    g = case.gradients("reference").as_dict()
    parts = [halves(case, d).gradients("reference").as_dict() for d in (0, 1)]
    assert_arrays("recurrent_weight", g["recurrent_weight"],
                  np.stack([parts[0]["recurrent_weight"], parts[1]["recurrent_weight"]]))
    for name in ("input_weight", "bias", "init_state", "init_cell", "secondary_bias"):
        if name in g:
            axis = 0 if name == "input_weight" else -1
            assert_arrays(name, g[name], np.concatenate([parts[0][name], parts[1][name]], axis))
    if "peephole" in g:
        assert_arrays("peephole", g["peephole"], np.stack([parts[0]["peephole"], parts[1]["peephole"]]))
    if "input_weight" in g:
        assert_arrays("source", g["source"], parts[0]["source"] + parts[1]["source"])
    else:
        assert_arrays("source", g["source"], np.concatenate([parts[0]["source"], parts[1]["source"]], -1))


# -- inputs that must not matter -----------------------------------------------------------------

@given(case=cases(optional={"input_weight": True}))
def test_pre_projected_source_without_input_weight_equals_full_op(case):
    case = with_descriptor(case, training=True)
    W = case.inputs["input_weight"]
    projected = dict(case.inputs, source=case.inputs["source"] @ W.T)
    del projected["input_weight"]
    pre = dataclasses.replace(case, inputs=projected)
    assert_same(case.forward(backend="reference"), pre.forward(backend="reference"))
    full, part = case.gradients("reference"), pre.gradients("reference")
    assert_arrays("source", full.source, part.source @ W)
    assert_arrays("recurrent_weight", full.recurrent_weight, part.recurrent_weight)


@given(case=cases(optional={"mask": False}), per_step=st.booleans())
def test_mask_of_ones_equals_no_mask(case, per_step):
    case = with_descriptor(case, training=True)
    shape = (case.T,) if per_step else ()
    ones = dataclasses.replace(case, inputs=dict(case.inputs, mask=np.ones(shape + (case.source_gradient.shape[1], case.D * case.H))))
    assert_same(case.forward(backend="reference"), ones.forward(backend="reference"))
    assert_same(case.gradients("reference"), ones.gradients("reference"))


@given(case=cases(N=3))
def test_batch_rows_are_independent(case):
    """Each batch row run alone gives that row of the batched outputs and per-row gradients;
    parameter gradients are the sum over rows."""
    case = with_descriptor(case, training=True)
    whole = case.forward(backend="reference")
    grads = case.gradients("reference").as_dict()
    total = {k: 0 for k in ("recurrent_weight", "input_weight", "bias", "peephole", "secondary_bias") if k in grads}
    for n in range(3):
        row = row_case(case, n)
        alone = row.forward(backend="reference")
        assert_arrays("state", alone.state, whole.state[:, n:n + 1])
        g = row.gradients("reference").as_dict()
        assert_arrays("source", g["source"], grads["source"][:, n:n + 1])
        for name in ("init_state", "init_cell"):
            if name in g:
                assert_arrays(name, g[name], grads[name][n:n + 1])
        for name in total:
            total[name] = total[name] + g[name]
    for name, value in total.items():
        assert_arrays(name, value, grads[name])


def row_case(case, n):
    batch_axis = {"source": 1, "init_state": 0, "init_cell": 0}
    inputs = {}
    for name, value in case.inputs.items():
        if name in batch_axis:
            inputs[name] = np.take(value, [n], axis=batch_axis[name])
        elif name == "mask":
            inputs[name] = np.take(value, [n], axis=value.ndim - 2)
        else:
            inputs[name] = value
    cg = case.cell_gradient
    if cg is not None:
        cg = np.take(cg, [n], axis=cg.ndim - 2)
    return Case(case.cell, case.descriptor, inputs, case.source_gradient[:, n:n + 1],
                None if case.state_gradient is None else case.state_gradient[n:n + 1], cg)


@given(case=cases(), a=st.floats(-2, 2), b=st.floats(-2, 2))
def test_gradients_are_linear_in_the_upstream_gradient(case, a, b):
    other = random_case(7, case.cell, T=case.T, N=case.source_gradient.shape[1], I=1, H=case.H,
                        descriptor=case.descriptor,
                        optional={"state_gradient": case.state_gradient is not None,
                                  "cell_gradient": case.cell_gradient is not None},
                        cell_gradient_form="per_step" if case.cell_gradient is not None and case.cell_gradient.ndim == 3 else "final")
    upstream = ("source_gradient", "state_gradient", "cell_gradient")
    mix = lambda x, y: None if x is None else a * x + b * y  # noqa: E731
    combined = dataclasses.replace(case, **{u: mix(getattr(case, u), getattr(other, u)) for u in upstream})
    second = dataclasses.replace(case, **{u: getattr(other, u) if getattr(case, u) is not None else None for u in upstream})
    g1, g2 = case.gradients("reference").as_dict(), second.gradients("reference").as_dict()
    expected = GradientResult([(k, a * g1[k] + b * g2[k]) for k in g1])
    got = combined.gradients("reference")
    # a·g1 + b·g2 cancels; compare with a tolerance scaled by the terms, not the result
    for name in expected.names:
        scale = np.abs(a * g1[name]) + np.abs(b * g2[name])
        assert_arrays(name, getattr(got, name) / (1 + scale), getattr(expected, name) / (1 + scale))
