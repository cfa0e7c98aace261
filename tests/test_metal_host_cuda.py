"""The host's work per call on the harness's CUDA target ("metal-cuda"): what only a GPU shows.

Marked ``gpu``: skipped where CuPy or a CUDA device is missing (the same checks on a CPU
stand-in are in tests/test_metal_host_gpu_inputs.py). Inputs already in GPU memory that the
kernels only read are bound in place and the caller's arrays are left as they were; an op asks
for one slab and one zeroed region beside its large buffers; a device times its dispatches
unless made with ``timing=False``, as the backend's own device is.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import rnngrad as rg
from rnngrad.backends.metal import backends, layout
from rnngrad.backends.metal.harness import contexts
from rnngrad.backends.metal import cuda as metalcompute
from rnngrad.testing.cases import random_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(metalcompute.available() is not None,
                                 reason=f"needs an NVIDIA GPU with CuPy: {metalcompute.available()}")]

ALL_OPTIONAL = dict(input_weight=True, bias=True, init_state=True, init_cell=True, mask=True,
                    peephole=True, secondary_bias=False, state_gradient=True, cell_gradient=True)


def _lstm_pair(case, inputs, upstream):
    desc = dataclasses.replace(case.descriptor, training=True)
    out = rg.lstm(**inputs, descriptor=desc, backend="metal-cuda")
    grads = rg.lstm_gradients(inputs["source"], inputs["recurrent_weight"], z_state=out.z_state,
                              cell_output_fwd=out.cell, descriptor=desc, backend="metal-cuda",
                              **upstream, **{k: v for k, v in inputs.items()
                                             if k not in ("source", "recurrent_weight")})
    return list(out) + list(grads)


def test_gpu_inputs_are_bound_in_place_and_left_unchanged():
    import cupy as cp

    case = random_case(5, "lstm", T=5, N=3, I=4, H=6, dtype=np.float32, optional=ALL_OPTIONAL,
                       cell_gradient_form="final")
    upstream = dict(source_gradient=case.source_gradient, state_gradient=case.state_gradient,
                    cell_gradient=case.cell_gradient)
    want = _lstm_pair(case, case.inputs, upstream)
    inputs = {k: cp.asarray(v) for k, v in case.inputs.items()}
    gpu_upstream = {k: cp.asarray(v) for k, v in upstream.items()}
    before = {k: cp.asnumpy(v) for k, v in {**inputs, **gpu_upstream}.items()}
    with contexts.cuda_device(timing=False) as dev:
        bound = []
        wrap = dev.wrap
        dev.wrap = lambda a: bound.append(a.data.ptr) or wrap(a)
        got = _lstm_pair(case, inputs, gpu_upstream)
    for g, w in zip(got, want):
        assert isinstance(g, cp.ndarray)
        assert cp.asnumpy(g).tobytes() == w.tobytes()
    for k, v in {**inputs, **gpu_upstream}.items():
        assert np.array_equal(cp.asnumpy(v), before[k]), k  # nothing the caller passed written
    for k in ("source", "recurrent_weight", "bias", "init_state", "init_cell", "peephole",
              "source_gradient"):
        assert inputs.get(k, gpu_upstream.get(k)).data.ptr in bound, k
    for k in ("state_gradient", "cell_gradient"):  # written by the kernels: copied
        assert gpu_upstream[k].data.ptr not in bound, k


def test_an_op_makes_one_slab_and_one_zeroed_region_beside_its_large_buffers():
    """LSTM 50x1x64x64 on CuPy: from the second call on, each op asks the device for one zeroed
    region (its dispatches' marks and small zeroed buffers), at most one slab (its other small
    buffers), and an allocation for each buffer over layout.OWN_BYTES alone."""
    import cupy as cp

    case = random_case(6, "lstm", T=50, N=1, I=64, H=64, dtype=np.float32,
                       optional={k: k in ("input_weight", "bias") for k in ALL_OPTIONAL})
    inputs = {k: cp.asarray(v) for k, v in case.inputs.items()}
    upstream = dict(source_gradient=cp.asarray(case.source_gradient))
    with contexts.cuda_device(timing=False) as dev:
        _lstm_pair(case, inputs, upstream)
        made = []
        buffer, zeros = dev.buffer, dev.zeros
        dev.buffer = lambda data: made.append(("buffer", type(data).__name__)) or buffer(data)
        dev.zeros = lambda n: made.append(("zeros", n)) or zeros(n)
        _lstm_pair(case, inputs, upstream)
        plans = list(backends.CUDA_HOST._plans.values())
    assert len(plans) == 2
    large = sum(n > layout.OWN_BYTES for plan in plans for n, _ in plan.buffers)
    assert all(kind == "zeros" or what == "int" for kind, what in made), made  # nothing copied
    assert sum(kind == "zeros" for kind, _ in made) >= 2, made  # a zeroed region per op
    assert len(made) <= 2 * 2 + large, (made, large)


def test_a_device_times_its_dispatches_unless_made_without_timing():
    case = random_case(8, "gru", T=3, N=2, I=3, H=4, dtype=np.float32)
    for timing in (True, False):
        with contexts.cuda_device(timing=timing) as dev:
            case.gradients("metal-cuda")
        seconds = [d.seconds for d in dev.trace]
        assert seconds
        if timing:
            assert all(isinstance(s, float) and s > 0 for s in seconds), seconds
        else:
            assert all(s is None for s in seconds), seconds
    assert backends._cuda_device().timing is False  # the backend's own device
