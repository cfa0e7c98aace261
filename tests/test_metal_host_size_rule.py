"""``backend=None`` on a Mac: the Apple GPU ("metal") only for ops of at least
``$RNNGRAD_METAL_MIN_WORK`` multiply-adds, numba below. No Mac here: a stand-in "metal" backend
with the real size rule takes the registry's place, its implementations recording the call."""

from __future__ import annotations

import numpy as np
import pytest

import rnngrad as rg
from rnngrad import registry
from rnngrad.backends.metal import backends as host
from rnngrad.testing.cases import random_case


@pytest.fixture
def stand_in_metal(monkeypatch):
    """A "metal" backend available here: the real size rule, implementations that record the
    problem and answer with the reference's result."""
    calls = []
    reference = registry.get("reference")

    def recorded(kind):
        def run(problem):
            calls.append((kind, problem.cell))
            return reference.implementations[(problem.cell, kind)](problem)
        return run

    fake = registry.Backend(
        name="metal", dtypes=(np.dtype(np.float32),),
        implementations={(c, k): recorded(k) for c in registry.CELLS for k in registry.KINDS},
        suits=host.metal_suits)
    monkeypatch.setitem(registry._loaded, "metal", (fake, None))
    monkeypatch.delenv(host.MIN_WORK_ENV, raising=False)
    return calls


def _lstm(T, N, H, I):
    case = random_case(0, "lstm", T=T, N=N, H=H, I=I, dtype=np.float32,
                       optional=dict(input_weight=True))
    return case


def test_op_work_counts_recurrence_and_projection():
    case = _lstm(T=10, N=3, H=5, I=7)
    problem = rg.validation.forward_problem("lstm", case.descriptor, **case.inputs)[0]
    D = 2 if case.descriptor.bidirectional else 1
    assert host.op_work(problem) == 10 * D * 3 * 4 * 5 * (5 + 7)


def test_small_ops_go_to_the_next_backend_and_large_ones_to_the_gpu(stand_in_metal, monkeypatch):
    small = _lstm(T=3, N=2, H=4, I=3)
    small.forward(backend=None)
    small.gradients(backend=None)
    assert stand_in_metal == []  # numba (or the reference) ran them
    problem = rg.validation.forward_problem("lstm", small.descriptor, **small.inputs)[0]
    assert "too small for the GPU's dispatch cost" in host.metal_suits(problem)
    monkeypatch.setenv(host.MIN_WORK_ENV, "0")  # every op on the GPU
    small.forward(backend=None)
    small.gradients(backend=None)  # a training forward, then the gradient op
    assert stand_in_metal == [("forward", "lstm"), ("forward", "lstm"), ("gradients", "lstm")]
    stand_in_metal.clear()
    monkeypatch.setenv(host.MIN_WORK_ENV, str(host.op_work(problem) + 1))
    small.forward(backend=None)
    assert stand_in_metal == []
    monkeypatch.setenv(host.MIN_WORK_ENV, str(host.op_work(problem)))  # at the threshold: GPU
    small.forward(backend=None)
    assert stand_in_metal == [("forward", "lstm")]


def test_the_default_threshold_and_a_named_backend(stand_in_metal):
    problem = rg.validation.forward_problem("lstm", _lstm(3, 2, 4, 3).descriptor,
                                     **_lstm(3, 2, 4, 3).inputs)[0]
    assert host.op_work(problem) < host.METAL_MIN_WORK
    # 1000x8x128x128 LSTM: 1000·8·512·256 ≈ 1.0·10**9 multiply-adds, well past 2**24.
    big = registry.resolve(None, "lstm", "forward", np.float32, problem=type(
        "P", (), dict(T=1000, D=1, N=8, G=4, H=128, I=128, input_weight=True))())
    assert big[0] == "metal"
    # A named backend runs whatever it is given, whatever the rule says.
    _lstm(3, 2, 4, 3).forward(backend="metal")
    assert stand_in_metal == [("forward", "lstm")]


def test_a_bad_threshold_is_refused(stand_in_metal, monkeypatch):
    monkeypatch.setenv(host.MIN_WORK_ENV, "lots")
    with pytest.raises(ValueError, match="RNNGRAD_METAL_MIN_WORK: expected a non-negative "
                                         "integer \\(multiply-adds\\), got 'lots'"):
        _lstm(3, 2, 4, 3).forward(backend=None)
