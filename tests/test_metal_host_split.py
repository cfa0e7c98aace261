"""A long sequence split into several recurrence dispatches by the work budget gives bitwise the
results of one dispatch: every cell, forward and gradients, uni- and bidirectional, reverse,
with and without the optional inputs, on plain and adversarial harness devices. Also the budget
itself: the estimate, its overrides, and how the dispatch count grows with T.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import zlib

import numpy as np
import pytest

from rnngrad.backends.metal import host as metal_host
from rnngrad.backends.metal.schedule import BUDGET_ENV, DISPATCH_BUDGET, step_ranges, step_units
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.backends.metal.harness.contexts import emulated_device
from rnngrad.testing.cases import CELLS, random_case, random_descriptor

from draws import ALL_OPTIONAL, recurrence_kernel, threadgroups_of

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")
#: the tests that run a recurrence run it with v1 and with v2
both_versions = pytest.mark.usefixtures("recurrence_version")


@pytest.fixture(params=["v1", "v2"])
def recurrence_version(request, monkeypatch):
    """conftest's, without v3: v3 runs one step a dispatch whatever the budget, so it has no
    range of steps to split."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", request.param)
    return request.param


BACKEND = "metal-emulated"
NO_OPTIONAL = {k: False for k in ALL_OPTIONAL}
OPTIONAL = {"all": ALL_OPTIONAL, "none": NO_OPTIONAL,
            "mask-per-step": dict(ALL_OPTIONAL, mask_per_step=True)}
DEVICES = {"lanes": dict(), "harsh": dict(schedule="adversarial", seed=3)}  # + threadgroups of 32
T = 7


def _units(case):
    """step_units of the case's problem."""
    G = case.descriptor.gates
    N = case.inputs["source"].shape[1]
    return step_units(types.SimpleNamespace(D=case.D, N=N, H=case.H, G=G))


def _run(case, budget, device):
    """(forward outputs, gradient outputs, recurrence dispatches per op) at ``budget``."""
    EMULATED_HOST.dispatch_budget = budget
    try:
        caps = threadgroups_of(32) if device and "max_threads_per_threadgroup" not in device else {}
        with emulated_device(**device, **caps) as dev:
            desc = dataclasses.replace(case.descriptor, training=False)
            forward = case.forward(backend=BACKEND, descriptor=desc)
            gradients = case.gradients(backend=BACKEND)
    finally:
        EMULATED_HOST.dispatch_budget = None
    kernels = [d.kernel for d in dev.trace]
    per_op = kernels.count(recurrence_kernel(case, "backward"))
    assert kernels.count(recurrence_kernel(case, "forward")) == 2 * per_op  # forward, training forward
    return list(zip(forward.names, forward)) + list(zip(gradients.names, gradients)), per_op


def _cases():
    """Every cell × direction(s) × order × optional inputs (× the LSTM's cell-gradient form).
    The default run takes the half where ``reverse`` is the parity of the other two choices,
    which still holds every pair of values of any two of them for each cell; the rest is marked
    slow."""
    for cell, bidirectional, reverse, optional in itertools.product(
            CELLS, (False, True), (False, True), OPTIONAL):
        forms = ["per_step", "final"] if cell == "lstm" and optional != "none" else [None]
        covering = reverse == (bidirectional + list(OPTIONAL).index(optional)) % 2
        for form in forms:
            yield pytest.param(cell, bidirectional, reverse, optional, form,
                               id=f"{cell}-{'bi' if bidirectional else 'uni'}-"
                                  f"{'reverse' if reverse else 'forward'}-{optional}"
                                  + (f"-{form}" if form else ""),
                               marks=() if covering else pytest.mark.slow)


@both_versions
@pytest.mark.parametrize("cell, bidirectional, reverse, optional, form", list(_cases()))
def test_split_equals_one_dispatch_bitwise(cell, bidirectional, reverse, optional, form):
    rng = np.random.default_rng(zlib.crc32(repr((cell, bidirectional, reverse, optional, form)).encode()))
    desc = random_descriptor(rng, cell, bidirectional=bidirectional, reverse=reverse)
    case = random_case(rng, cell, descriptor=desc, T=T, N=3, H=4, I=3, dtype=np.float32,
                       optional=OPTIONAL[optional], cell_gradient_form=form)
    units = _units(case)
    for name, device in DEVICES.items():
        want, dispatches = _run(case, None, device)
        assert dispatches == 1
        # 1 step per dispatch, and 3 (an uneven split: [0, 3), [3, 6), [6, 7)).
        for steps in (1, 3):
            got, dispatches = _run(case, steps * units, device)
            assert dispatches == -(-T // steps)
            assert [n for n, _ in got] == [n for n, _ in want]
            for (n, g), (_, w) in zip(got, want):
                assert g.tobytes() == w.tobytes(), (
                    f"{name} device, {steps} step(s) per dispatch: {n} differs from one dispatch, "
                    f"worst |diff| {np.nanmax(np.abs(g.astype(np.float64) - w)):.3g}\n{case!r}")


@pytest.mark.parametrize("cell", CELLS)
def test_split_with_several_threadgroups_per_dispatch(cell):
    """D·N·H = 2·17·5 = 170 threads of v1 in threadgroups of 32 (and of 64, released in an
    adversarial order): rows split over several threadgroups, every one carrying its own rows'
    state across dispatches. (v2 gives each row a threadgroup of its own.)"""
    rng = np.random.default_rng(9)
    desc = random_descriptor(rng, cell, bidirectional=True)
    case = random_case(rng, cell, descriptor=desc, T=5, N=17, H=5, I=2, dtype=np.float32,
                       optional=ALL_OPTIONAL, cell_gradient_form="per_step")
    for device in (dict(), dict(schedule="adversarial", seed=5)):
        caps = dict(max_threads_per_threadgroup=32 if not device else 64)
        want, _ = _run(case, None, {**device, **caps})
        got, dispatches = _run(case, 2 * _units(case), {**device, **caps})
        assert dispatches == 3
        assert all(g.tobytes() == w.tobytes() for (_, g), (_, w) in zip(got, want))


# -- the budget ----------------------------------------------------------------------------------

def test_step_ranges_cover_T_in_order():
    assert step_ranges(7, 10, 30) == [(0, 3), (3, 6), (6, 7)]
    assert step_ranges(7, 10, 70) == [(0, 7)]
    assert step_ranges(3, 10, 5) == [(0, 1), (1, 2), (2, 3)]  # at least one step per dispatch
    assert step_ranges(0, 10, 30) == []


def test_step_units_estimate():
    shape = lambda D, N, H, G: types.SimpleNamespace(D=D, N=N, H=H, G=G)  # noqa: E731
    assert step_units(shape(1, 64, 512, 4)) == 64 * 512 * 4 * 512  # a full GPU: threads · G·H
    assert step_units(shape(1, 1, 64, 4)) == 1024 * 256  # less than one threadgroup of threads
    assert step_units(shape(1, 1, 2, 1)) == 1024 * 32  # and a short dot product
    # Every default `rnngrad bench` shape runs in one dispatch at the default budget.
    for T, N, _, H in ((100, 32, 256, 256), (50, 1, 64, 64), (200, 64, 512, 512), (1000, 8, 128, 128)):
        for G in (1, 3, 4):
            assert len(step_ranges(T, step_units(shape(1, N, H, G)), DISPATCH_BUDGET)) == 1


def test_budget_overrides(monkeypatch):
    host = metal_host.MetalHost(lambda: None, "test")
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    assert host.budget() == DISPATCH_BUDGET
    monkeypatch.setenv(BUDGET_ENV, "1_000_000")
    assert host.budget() == 10 ** 6
    host.dispatch_budget = 2 ** 20  # the attribute wins over the variable
    assert host.budget() == 2 ** 20
    host.dispatch_budget = None
    for bad in ("abc", "0", "-5", "1e9"):
        monkeypatch.setenv(BUDGET_ENV, bad)
        with pytest.raises(ValueError, match=f"{BUDGET_ENV}: expected a positive integer "
                                             rf"\(work units per dispatch\), got '{bad}'"):
            host.budget()
    host.dispatch_budget = 0
    with pytest.raises(ValueError, match="dispatch_budget: expected a positive integer"):
        host.budget()


def test_dispatch_count_grows_with_T_only_past_the_budget(monkeypatch):
    """At a budget of 250 steps' units: one recurrence dispatch per op up to T = 250, then one
    more per 250 further steps (v1; the budget is the same for every version)."""
    rng = np.random.default_rng(0)
    desc = random_descriptor(rng, "gru", bidirectional=True)
    counts = {}
    for steps in (1, 250, 251, 1000):
        case = random_case(1, "gru", descriptor=desc, T=steps, N=1, H=2, I=2, dtype=np.float32,
                           optional=NO_OPTIONAL)
        monkeypatch.setenv(BUDGET_ENV, str(250 * _units(case)))
        with emulated_device(max_threads_per_threadgroup=32) as dev:
            case.gradients(backend=BACKEND)
        counts[steps] = [d.kernel for d in dev.trace].count(recurrence_kernel(case, "backward"))
    assert counts == {1: 1, 250: 1, 251: 2, 1000: 4}
