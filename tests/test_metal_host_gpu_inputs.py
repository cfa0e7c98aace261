"""The Metal host with inputs already in GPU memory, on a CPU stand-in for the CUDA target.

``tests/gpu_like.py`` gives a harness device with the CUDA target's extras (``wrap``, ``zeros``,
``full``, ``finish``) that counts what the host asks of it, and a stand-in for CuPy whose arrays
live in that device's memory. On it: every input a kernel only reads that is already C-contiguous
float32 is bound at the caller's own address (no copy), the two inputs a kernel writes
(state_gradient, a final cell_gradient) are copied and the caller's arrays stay as they were; an
op asks for one slab of new memory, one zeroed arena and one read of the marks at these sizes;
the results are bitwise those of the plain harness with NumPy inputs; a dispatch stopped
part-way raises the same IncompleteDispatch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rnngrad.backends.metal import IncompleteDispatch
from rnngrad.backends.metal import completion
from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.testing.cases import CELLS, random_case, random_descriptor
from rnngrad.validation import forward_problem, gradient_problem

from draws import ALL_OPTIONAL
from gpu_like import DeviceArray, GpuLikeDevice, cupy_is

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")

#: the inputs a gradient kernel writes (dhn, dcn): copied, never bound in place
WRITTEN = ("state_gradient", "cell_gradient")


def _case(cell, optional):
    rng = np.random.default_rng(len(cell) + 7)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True)
    return random_case(rng, cell, descriptor=desc, T=4, N=3, H=6, I=4, dtype=np.float32,
                       optional=optional, cell_gradient_form="final")


def _pair(cell, desc, inputs, upstream):
    """Training forward, then gradients, through the checks and the host (the registry sends
    GPU inputs only to GPU backends, which the emulated one is not)."""
    forward = EMULATED_HOST.forward(forward_problem(cell, desc, **inputs)[0])
    kw = dict(inputs, **upstream, z_state=forward.z_state)
    if cell == "gru":
        kw["output_fwd"] = forward.h
    if cell == "lstm":
        kw["cell_output_fwd"] = forward.c
    grads = EMULATED_HOST.gradients(gradient_problem(cell, desc, **kw)[0])
    return forward, grads


def _arrays(out):
    return {f.name: np.asarray(getattr(out, f.name)).view(np.ndarray).copy()
            for f in dataclasses.fields(out) if getattr(out, f.name) is not None}


def _run(case, device, on_gpu):
    """(forward arrays, gradient arrays, (the caller's arrays, addresses bound in place)) of a
    training forward and gradients on ``device``, with inputs in its memory when ``on_gpu``."""
    if EMULATED_HOST._device is not device:
        with EMULATED_HOST.using(device):
            return _run(case, device, on_gpu)
    desc = dataclasses.replace(case.descriptor, training=True)
    upstream = dict(source_gradient=case.source_gradient, state_gradient=case.state_gradient,
                    cell_gradient=case.cell_gradient)
    upstream = {k: v for k, v in upstream.items() if v is not None}
    if not on_gpu:
        forward, grads = _pair(case.cell, desc, case.inputs, upstream)
        return _arrays(forward), _arrays(grads), None
    with cupy_is(device.array_module):
        inputs = {k: device.array(v) for k, v in case.inputs.items() if v is not None}
        upstream = {k: device.array(v) for k, v in upstream.items()}
        given = dict(inputs, **upstream)
        before = {k: np.array(v) for k, v in given.items()}
        bound = []
        wrap = device.wrap
        device.wrap = lambda a: bound.append(a._mc_addr) or wrap(a)
        try:
            forward, grads = _pair(case.cell, desc, inputs, upstream)
        finally:
            del device.wrap
        for k, v in given.items():  # nothing the caller passed was written
            assert np.array_equal(np.array(v), before[k]), k
        return _arrays(forward), _arrays(grads), (given, bound)


@pytest.mark.parametrize("optional", ["all", "none"])
@pytest.mark.parametrize("cell", CELLS)
def test_gpu_inputs_kernels_only_read_are_bound_in_place(cell, optional):
    case = _case(cell, ALL_OPTIONAL if optional == "all" else {k: False for k in ALL_OPTIONAL})
    want = _run(case, metalcompute.Device(), on_gpu=False)
    got = _run(case, GpuLikeDevice(), on_gpu=True)
    for w, g in zip(want[:2], got[:2]):
        assert w.keys() == g.keys()
        for k in w:
            assert g[k].tobytes() == w[k].tobytes(), k
    given, bound = got[2]
    for name, array in given.items():
        if name in WRITTEN:
            assert array._mc_addr not in bound, name  # copied: the kernel writes the copy
        elif name != "mask":  # maybe broadcast
            assert array._mc_addr in bound, name  # W too: a small projection reads it in place


def test_an_op_asks_for_one_slab_one_zeroed_region_and_one_read_at_small_sizes():
    case = _case("lstm", ALL_OPTIONAL)
    device = GpuLikeDevice()
    with EMULATED_HOST.using(device):
        _run(case, device, on_gpu=True)  # kernels compiled, constants kept
        device.ops.clear()
        DeviceArray.reads = 0
        _run(case, device, on_gpu=True)
    # Per op: one slab (the CUDA target fills it with NaN: one fill), one zeroed region (the
    # marks, and dhn, dcn, prow where they start at zero), one read of the marks; nothing made
    # from the host's data. The copies on the device: the two written inputs, and Rᵀ where the
    # version reads it (W is read in place at this size), at most three.
    assert device.ops["new"] == 2 and device.ops["zeros"] == 2, device.ops
    assert DeviceArray.reads == 2
    assert device.ops["full"] == 0 and device.ops["copy"] <= 3, device.ops


@pytest.mark.parametrize("cell", CELLS)
def test_a_stopped_dispatch_with_gpu_inputs_raises_as_on_the_plain_harness(cell):
    case = _case(cell, ALL_OPTIONAL)
    with EMULATED_HOST.using(metalcompute.Device(max_threads_per_threadgroup=32)) as d:
        _run(case, d, on_gpu=False)
    groups = [x.threadgroups for x in d.trace]
    for i in (0, len(groups) // 2, len(groups) - 1):
        errors = []
        for kind, on_gpu in ((metalcompute.Device, False), (GpuLikeDevice, True)):
            device = kind(max_threads_per_threadgroup=32, stop=(i, groups[i] // 2))
            with pytest.raises(IncompleteDispatch) as info:
                _run(case, device, on_gpu=on_gpu)
            e = info.value
            errors.append((str(e), e.kernel, e.op, e.dispatch, e.steps, e.missing))
        assert errors[0] == errors[1]


def test_a_gpu_input_off_the_float4_alignment_is_copied():
    """A caller's array 4 bytes past a 16-byte boundary (a slice may start anywhere) is copied to
    an aligned buffer, not bound in place: v2 reads R as float4. The results are bitwise those of
    the aligned inputs."""
    case = _case("lstm", {k: False for k in ALL_OPTIONAL})
    device = GpuLikeDevice()
    desc = dataclasses.replace(case.descriptor, training=True)
    upstream = dict(source_gradient=case.source_gradient)
    results = []
    with EMULATED_HOST.using(device), cupy_is(device.array_module):
        for offset in (0, 1):
            inputs = {k: device.array(v) for k, v in case.inputs.items() if v is not None}
            R = case.inputs["recurrent_weight"]
            padded = device.array(np.zeros(R.size + 8, R.dtype))
            address = padded.__cuda_array_interface__["data"][0]
            start = (-address % 16) // 4 + offset  # floats to the next 16-byte boundary, + offset
            inputs["recurrent_weight"] = padded[start:start + R.size].reshape(R.shape)
            inputs["recurrent_weight"][...] = R
            assert inputs["recurrent_weight"].__cuda_array_interface__["data"][0] % 16 == 4 * offset
            bound = []
            wrap = device.wrap
            device.wrap = lambda a: (lambda b: bound.append(b._mc_addr) or b)(wrap(a))
            try:
                forward, grads = _pair("lstm", desc, inputs,
                                       {k: device.array(v) for k, v in upstream.items()})
            finally:
                del device.wrap
            assert (inputs["recurrent_weight"]._mc_addr in bound) == (offset == 0)
            results.append((_arrays(forward), _arrays(grads)))
    for w, g in zip(*results):
        assert w.keys() == g.keys() and all(w[k].tobytes() == g[k].tobytes() for k in w)


@pytest.mark.parametrize("cell", CELLS)
def test_marks_all_as_expected_are_checked_in_one_pass(cell, monkeypatch):
    """When every dispatch of an op marked as expected, the arenas' marks are compared with the
    expected words in one pass per arena: the per-dispatch analysis (completion.Runs._check, which words
    the errors) is not reached. Its errors when a mark is off: the stopped-dispatch test above."""
    case = _case(cell, {k: False for k in ALL_OPTIONAL})
    desc = dataclasses.replace(case.descriptor, training=True)
    device = GpuLikeDevice()

    def per_dispatch(*args, **kwargs):
        raise AssertionError("the per-dispatch check ran")

    monkeypatch.setattr(completion.Runs, "_check", per_dispatch)
    with EMULATED_HOST.using(device), cupy_is(device.array_module):
        for _ in range(2):  # the expected marks made, then kept
            inputs = {k: device.array(v) for k, v in case.inputs.items() if v is not None}
            _pair(cell, desc, inputs, dict(source_gradient=device.array(case.source_gradient)))
