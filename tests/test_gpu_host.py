"""verification/gpu_host.py's phase timers (no GPU needed): each phase's functions are timed
while the block runs, a nested call of one phase counts once, and everything is restored."""

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "verification"))

import gpu_host  # noqa: E402

from rnngrad import api  # noqa: E402
from rnngrad.backends.metal import completion, host as metal_host  # noqa: E402
from rnngrad.backends.metal import cuda  # noqa: E402
from rnngrad.testing.cases import random_case  # noqa: E402


def test_phases_time_an_op_and_are_restored_after_the_block():
    originals = (api.checked_problem, metal_host.MetalHost.plan,
                 completion.Runs.launch, cuda.Device.finish, metal_host.MetalHost.words)
    case = random_case(np.random.default_rng(4), "gru", T=3, N=2, H=5, I=3, dtype=np.float32)
    totals = {}
    with gpu_host.timed_phases(totals):
        case.gradients(backend="metal-emulated")
    assert set(totals) == {"checks", "plan", "launch", "marks read"}  # no CUDA device: no finish
    assert all(v > 0 for v in totals.values())
    assert (api.checked_problem, metal_host.MetalHost.plan,
            completion.Runs.launch, cuda.Device.finish, metal_host.MetalHost.words) == originals


def test_a_nested_call_of_a_phase_counts_once(monkeypatch):
    spans = {}

    def slow(cell, descriptor, given, gradients, depth=0):
        start = time.perf_counter()
        time.sleep(0.02)
        if depth == 0:  # through the timer again
            api.checked_problem(cell, descriptor, given, gradients, depth=1)
        spans[depth] = time.perf_counter() - start

    monkeypatch.setattr(api, "checked_problem", slow)
    totals = {}
    with gpu_host.timed_phases(totals):
        api.checked_problem("gru", None, {}, False)
    assert sorted(spans) == [0, 1]
    # the outer call's time (which holds the inner one's), not the two added
    assert spans[0] <= totals["checks"] < spans[0] + spans[1] / 2
