"""Where a call's memory lies (rnngrad.backends.metal.layout), for the plans of every cell and
option set, forward and gradients, at sizes that put buffers on both sides of OWN_BYTES: each
buffer and status buffer aligned, inside its region, overlapping no other; the marks first, in
dispatch order, each as long as its dispatch's threadgroups need; large buffers and the results
kept apart on their own; on a device without regions, everything on its own."""

from __future__ import annotations

import numpy as np
import pytest

from rnngrad.backends.metal import layout as L
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal.plan import NEW
from rnngrad.testing.cases import CELLS, random_case, random_descriptor
from rnngrad.validation import forward_problem, gradient_problem

from draws import ALL_OPTIONAL

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")


def _plans(cell, optional, T, N, H, I):
    rng = np.random.default_rng(T * 7 + H)
    desc = random_descriptor(rng, cell, bidirectional=H % 2 == 0, training=True)
    case = random_case(rng, cell, descriptor=desc, T=T, N=N, H=H, I=I, dtype=np.float32,
                       optional={k: optional for k in ALL_OPTIONAL})
    h, c, z = case.training_forward("reference")
    kwargs = {k: v for k, v in case.gradient_kwargs(h, c, z).items() if v is not None}
    problems = (forward_problem(cell, desc, **case.inputs)[0],
                gradient_problem(cell, kwargs.pop("descriptor"), **kwargs)[0])
    with EMULATED_HOST.using(metalcompute.Device(max_threads_per_threadgroup=64)):
        return [EMULATED_HOST.plan(p) for p in problems]


def _spans(layout, plan, region):
    spans = [(where[1], where[1] + nbytes) for where, (nbytes, _) in zip(layout.new, plan.buffers)
             if where[0] == region]
    if region == L.ZEROED:
        spans += [(where[1], where[1] + 8 * run["marks"])
                  for where, run in zip(layout.status, layout.runs)]
    return sorted(spans)


@pytest.mark.parametrize("optional", [True, False])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("shape", [(3, 2, 5, 4), (9, 33, 70, 40)])
def test_every_buffer_lies_aligned_in_its_region_and_apart_from_the_others(cell, optional, shape):
    for plan in _plans(cell, optional, *shape):
        sizes = [64 if "_v2_" not in k else 256 for k, *_ in plan.launches]
        results = frozenset(i for _, (kind, i), _ in plan.outputs if kind == NEW)
        for own in (frozenset(), results):
            layout = L.Layout(plan, sizes, True, own)
            for where, (nbytes, zeroed), i in zip(layout.new, plan.buffers, range(len(plan.buffers))):
                assert where is not None, i
                if nbytes > L.OWN_BYTES or i in own:
                    assert where == (L.OWN, nbytes, zeroed), (i, where)
                else:
                    assert where[0] == (L.ZEROED if zeroed else L.SLAB), (i, where)
            for region, end in ((L.ZEROED, layout.zeroed), (L.SLAB, layout.slab)):
                spans = _spans(layout, plan, region)
                assert all(a % L.ALIGN == 0 for a, _ in spans), spans
                assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:])), spans  # no overlap
                assert all(0 <= a and b <= end for a, b in spans), (spans, end)
            offsets = [where[1] for where in layout.status]
            assert offsets == sorted(offsets) and offsets[0] == 0
            assert layout.marks == L.aligned(8 * layout.runs[-1]["marks"]) + offsets[-1]
            for (kernel, count, steps, span, _), run, size in zip(plan.launches, layout.runs, sizes):
                assert run["marks"] == -(-count // size) and run["steps"] == steps
                assert (run["kernel"], run["count"], run["span"]) == (kernel, count, span)
            np.testing.assert_array_equal(layout.table[:, 0], np.array(offsets) // 4)
        plain = L.Layout(plan, sizes, False)
        assert all(where[0] == L.OWN for where in plain.new + plain.status)
        assert plain.table is None and plain.zeroed == plain.slab == 0


def test_large_buffers_exist_at_the_larger_shape():
    """The shapes above reach both sides of OWN_BYTES (else the test would check one side)."""
    sizes = [n for cell in CELLS for plan in _plans(cell, True, 9, 33, 70, 40) for n, _ in plan.buffers]
    assert max(sizes) > L.OWN_BYTES and min(sizes) <= L.OWN_BYTES
