"""The Metal host's plans (rnngrad/backends/metal/plan.py), on the CPU harness.

A plan is made on an op's first call of a signature and kept: later calls of that signature with
other arrays make none and still match the float64 reference (a call binds its own arrays; no
array of an earlier call leaks into it), written inputs included. Another signature (sizes, an
optional input, the mask's step axis), another version setting (a module setting, an environment
variable), another work budget or another device each get a plan of their own, and the kernels
they run follow the new setting. The input projection reads W in place except for a large
untiled product.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rnngrad.backends.metal import gemm, host as metal_host, schedule
from rnngrad.backends.metal import versions
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.backends.metal.harness.contexts import emulated_device
from rnngrad.backends.metal.plan import signature
from rnngrad.testing import assert_matches_reference
from rnngrad.testing.cases import CELLS, op_name, random_case, random_descriptor
from rnngrad.validation import forward_problem

from draws import ALL_OPTIONAL

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")

BACKEND = "metal-emulated"


def _case(cell, seed, **sizes):
    rng = np.random.default_rng(seed)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True)
    return random_case(rng, cell, descriptor=desc, dtype=np.float32, optional=ALL_OPTIONAL,
                       cell_gradient_form="final", **(dict(T=4, N=3, H=6, I=4) | sizes))


def _other_values(case, seed):
    """``case`` with other values in every array but the mask (the same signature)."""
    rng = np.random.default_rng(seed)
    nudge = lambda a: (a + 0.1 * rng.standard_normal(a.shape)).astype(a.dtype)  # noqa: E731
    other = case.mapped(nudge)
    if "mask" in case.inputs:
        other.inputs["mask"] = case.inputs["mask"]
    return other


def _with_mask(case, mask):
    return dataclasses.replace(case, inputs=dict(case.inputs, mask=mask))


def _assert_matches(case, gradients):
    assert_matches_reference(BACKEND, case, op_name(case.cell, gradients))


@pytest.fixture
def made(monkeypatch):
    """The plans EMULATED_HOST makes, as the ops they are for (a list, appended to)."""
    out = []
    for name in ("forward_plan", "gradients_plan"):
        build = getattr(schedule, name)

        def counting(host, problem, build=build):
            plan = build(host, problem)
            if host is EMULATED_HOST:
                out.append(plan.op)
            return plan
        monkeypatch.setattr(schedule, name, counting)
    return out


@pytest.mark.parametrize("cell", CELLS)
def test_a_plan_is_made_once_and_each_call_binds_its_own_arrays(cell, made):
    first = _case(cell, 1)
    with emulated_device():
        _assert_matches(first, True)  # a forward, then its gradients: two plans
        assert len(made) == 2, made
        for seed in (2, 3):  # other values, the same signature: no plan made, each one right
            other = _other_values(first, seed)
            before = {k: np.array(v) for k, v in other.inputs.items() if v is not None}
            _assert_matches(other, True)
            assert all(np.array_equal(other.inputs[k], v) for k, v in before.items())
        assert len(made) == 2, made
        # each step of the signature's forward, then gradients, on the device's kept plans
        assert set(made) == {f"{cell}_forward", f"{cell}_gradients"}


def test_another_signature_gets_its_own_plan(made):
    case = _with_mask(_case("lstm", 4), np.ones((3, 12), np.float32))  # N, D·H
    with emulated_device():
        case.forward(BACKEND)
        _assert_matches(_other_values(case, 9), False)
        assert len(made) == 1
        _assert_matches(_case("lstm", 4, T=5), False)  # T
        assert len(made) == 2
        no_mask = dataclasses.replace(case, inputs={k: v for k, v in case.inputs.items()
                                                    if k != "mask"})
        _assert_matches(no_mask, False)
        per_step = _with_mask(case, np.ones((4, 3, 12), np.float32))  # T, N, D·H
        _assert_matches(per_step, False)
        assert len(made) == 4


def test_signature_tells_every_plan_input_apart():
    case = _case("gru", 5)
    base = forward_problem("gru", case.descriptor, **case.inputs)[0]
    variants = [
        dataclasses.replace(base, T=base.T + 1),
        dataclasses.replace(base, bias=None),
        dataclasses.replace(base, mask=np.ones((base.T, base.N, 2 * base.H)[base.mask.ndim - 2:],
                                               np.float32)),  # the other form of the mask
        dataclasses.replace(base, descriptor=dataclasses.replace(
            base.descriptor, reverse=not base.descriptor.reverse)),
        dataclasses.replace(base, gradients=True),
    ]
    keys = {signature(p) for p in [base, *variants]}
    assert len(keys) == 1 + len(variants)
    same = forward_problem("gru", case.descriptor,
                           **{k: (v + 1 if v is not None else None) for k, v in case.inputs.items()})[0]
    assert signature(same) == signature(base)


def test_a_changed_setting_takes_effect_on_the_next_call(made, monkeypatch):
    """A version setting changed between two calls of one signature (as tests and the bench
    change them) gives a new plan whose kernels follow it: an override of the rules, a
    threshold within it, the environment variable and the work budget; leaving an override
    gives the plan of the rules before it again, made once."""
    case = _case("lstm", 6, N=2, H=8)
    with emulated_device() as device:
        def kernels():
            device.trace.clear()
            _assert_matches(case, False)
            return [d.kernel for d in device.trace]

        assert "lstm_forward" in kernels()
        with versions.overrides(recurrence="v2"):
            assert "lstm_forward_v2_spread_512" in kernels()  # H = 8 <= v2_512_h
            with versions.overrides(v2_512_h={}):
                assert "lstm_forward_v2_spread" in kernels()
        monkeypatch.setenv(versions.RECURRENCE_ENV, "v2")
        assert "lstm_forward_v2_spread_512" in kernels()
        monkeypatch.delenv(versions.RECURRENCE_ENV)
        count = len(made)
        assert "lstm_forward" in kernels() and len(made) == count  # the first plan, kept
        monkeypatch.setattr(EMULATED_HOST, "dispatch_budget", 1)  # one step a dispatch
        assert kernels().count("lstm_forward") == case.T


def test_plans_belong_to_their_device(made):
    case = _case("single_gate", 7)
    with emulated_device():
        case.forward(BACKEND)
        kept = EMULATED_HOST._plans
        with emulated_device():
            assert len(EMULATED_HOST._plans) == 0
            case.forward(BACKEND)
        assert EMULATED_HOST._plans is kept and len(kept) == 1
        case.forward(BACKEND)
    assert len(made) == 2


def test_plans_kept_are_bounded(made, monkeypatch):
    monkeypatch.setattr(metal_host, "PLANS_KEPT", 2)
    with emulated_device():
        for T in (2, 3, 4, 2):
            _case("single_gate", 8, T=T).forward(BACKEND)
        assert len(EMULATED_HOST._plans) == 2
    assert len(made) == 4  # T = 2 was dropped (least recently used) and made again


@pytest.mark.parametrize("M, P, K, bias, copies", [
    (50, 256, 64, True, False),       # 819,200 multiply-adds: below tiled_min_work
    (8000, 512, 128, True, False),    # tiled
    (20, 1024, 1024, False, True),    # 20 rows: too few tiles, untiled over a large product
])
def test_the_projection_copies_w_only_for_a_large_untiled_product(M, P, K, bias, copies):
    choice = versions.gemm(batch=1, M=M, P=P, K=K, has_bias=bias)
    assert (choice.version in ("v1", "v4")) == copies or M * P * K < versions.rules().tiled_min_work
    assert gemm.copies_weight(M, P, K, bias) == copies
