"""The Metal host's work per call: what it copies from the host to the device.

A harness device with the CUDA target's extras (``finish``; ``zeros`` and ``full``, which make
buffers without host data; buffers whose slices are buffers, as CuPy's are) counts the buffers it
is asked to make from host data. On it, from the second call of an op on, the host copies only
the arrays the caller passed: the zeros and ones of absent inputs, the parameter structs and the
completion-status buffers are made on the device or kept from the first call. On a device without
those extras (metalcompute; the plain harness) each call still copies a zeroed status buffer per
dispatch and the zeroed buffers the kernels write, and nothing else beyond the caller's arrays.
Also: the same results and the same IncompleteDispatch messages either way, and the kept
constants' bound and their drop when the host changes device.
"""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest

from rnngrad import api
from rnngrad.backends.metal import IncompleteDispatch
from rnngrad.backends.metal import completion, host as metal_host, layout as layout_module, library
from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.backends.metal.plan import Constant
from rnngrad.testing.cases import CELLS, FORWARD_OPS, random_case, random_descriptor

from draws import ALL_OPTIONAL

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")

BACKEND = "metal-emulated"
OPTIONAL = {"all": ALL_OPTIONAL, "none": {k: False for k in ALL_OPTIONAL}}
SMALL_GROUPS = dict(max_threads_per_threadgroup=32)
#: the buffers a gradient kernel writes that start at zero, made anew each call: dhn (no
#: state_gradient), dcn (LSTM, no final cell_gradient), prow (GRU, LSTM)
WRITTEN_ZEROS = {"single_gate": 1, "gru": 2, "lstm": 3}


class _ViewBuffer(metalcompute.Buffer):
    """A harness buffer whose slices are buffers at their own address, as CuPy slices are."""

    def __array_finalize__(self, parent):
        base = getattr(parent, "_mc_addr", None)
        if base is not None:
            offset = self.__array_interface__["data"][0] - parent.__array_interface__["data"][0]
            self._mc_addr = base + offset


class _CountingDevice(metalcompute.Device):
    """The plain harness device, counting the buffers made from host data (``copies``)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.copies = 0

    def buffer(self, data):
        if not isinstance(data, int):
            self.copies += 1
        return super().buffer(data)


class _CudaLikeDevice(_CountingDevice):
    """With the CUDA target's extras: finish, and zeros / full, which make buffers from no host
    data (the harness's new memory is zeroed; full writes its value there)."""

    def buffer(self, data):
        return super().buffer(data).view(_ViewBuffer)

    def zeros(self, nbytes):
        return metalcompute.Device.buffer(self, int(nbytes)).view(_ViewBuffer)

    def full(self, n, value):
        buf = self.zeros(4 * n)
        buf.view(np.float32).fill(value)
        return buf

    def finish(self, handles):
        del handles[:]


class _FetchingDevice(_CudaLikeDevice):
    """With ``fetch`` too: the marks' copies queued before the wait (calls here have finished
    already, so the copy is made at once), counted in ``fetches`` (bytes of each)."""

    def __init__(self, **options):
        super().__init__(**options)
        self.fetches = []

    def fetch(self, buf, nbytes):
        if type(buf) is tuple:
            buf = buf[0][buf[1]:]
        self.fetches.append(nbytes)
        return np.array(buf[:nbytes], np.uint8)


def _case(cell, optional, T=4):
    rng = np.random.default_rng(len(cell) + 10 * len(optional))
    desc = random_descriptor(rng, cell, bidirectional=True, training=True)
    return random_case(rng, cell, descriptor=desc, T=T, N=3, H=6, I=4, dtype=np.float32,
                       optional=OPTIONAL[optional], cell_gradient_form="final")


def _fwd_grad(case, device):
    """Outputs of a training forward and the gradient op on ``device``, and per op: (buffers
    made from host data, dispatches, arrays the caller passed)."""
    counts = []

    def counted(fn):
        def call(**kwargs):
            copies, dispatches = device.copies, len(device.trace)
            out = fn(**kwargs)
            arrays = sum(isinstance(v, np.ndarray) for v in kwargs.values())
            counts.append((device.copies - copies, len(device.trace) - dispatches, arrays))
            return out
        return call

    desc = dataclasses.replace(case.descriptor, training=True)
    forward = case.forward(BACKEND, desc, fn=counted(getattr(api, FORWARD_OPS[case.cell])))
    kwargs = case.gradient_kwargs(forward.state, forward.cell, forward.z_state)
    grads = counted(getattr(api, FORWARD_OPS[case.cell] + "_gradients"))(**kwargs, backend=BACKEND)
    return list(forward) + list(grads), counts


@pytest.mark.parametrize("device_kind", [_CudaLikeDevice, _FetchingDevice])
@pytest.mark.parametrize("optional", OPTIONAL)
@pytest.mark.parametrize("cell", CELLS)
def test_from_the_second_call_only_the_callers_arrays_are_copied(cell, optional, device_kind):
    """Also: an op's marks are read once (a read after the wait, or one fetch queued before it,
    where the device fetches), and its prepared dispatches bind (buffer, offset) pairs."""
    case = _case(cell, optional)
    device = device_kind()
    reads, pairs = [], []
    words = EMULATED_HOST.words
    launch = completion.Runs.launch

    def spied(runs, number, buffers, prepared=None):
        pairs.append(prepared is not None and sum(type(b) is tuple for b in buffers))
        return launch(runs, number, buffers, prepared)

    with EMULATED_HOST.using(device), \
            mock.patch.object(completion.Runs, "launch", spied):
        first, first_counts = _fwd_grad(case, device)
        fetched = len(getattr(device, "fetches", ()))
        EMULATED_HOST.words = lambda buf, n: reads.append(n) or words(buf, n)
        try:
            second, counts = _fwd_grad(case, device)
        finally:
            del EMULATED_HOST.words
        plans = list(EMULATED_HOST._plans.values())
    fetches = getattr(device, "fetches", [])[fetched:]
    assert len(reads) + len(fetches) == 2  # the marks of all an op's dispatches in one read
    assert not (reads and fetches)
    assert all(plan.prepared for plan in plans)
    assert all(pairs), pairs  # every dispatch prepared, binding at least its new buffers as pairs
    for (copies, dispatches, arrays), (first_copies, _, _) in zip(counts, first_counts):
        assert copies <= arrays, counts
        # The first call copies one parameter struct per distinct dispatch besides.
        assert first_copies <= arrays + dispatches, first_counts
    with EMULATED_HOST.using(_CountingDevice()) as plain:
        want, plain_counts = _fwd_grad(case, plain)
        _, plain_counts = _fwd_grad(case, plain)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(first, want))
    assert all(g.tobytes() == w.tobytes() for g, w in zip(second, want))
    (forward, forward_dispatches, forward_arrays), (grads, grad_dispatches, grad_arrays) = plain_counts
    # Without the extras: a status buffer per dispatch, and the zeroed buffers the kernels write.
    assert forward <= forward_arrays + forward_dispatches, plain_counts
    assert grads <= grad_arrays + grad_dispatches + WRITTEN_ZEROS[cell], plain_counts


def _dispatches(case):
    with EMULATED_HOST.using(metalcompute.Device(**SMALL_GROUPS)) as dev:
        case.gradients(backend=BACKEND)
    return [d.threadgroups for d in dev.trace]


@pytest.mark.parametrize("cell", CELLS)
def test_status_slices_of_one_region_give_the_same_failures_and_messages(cell):
    """Every dispatch of a training forward and the gradient op, stopped part-way or reporting
    a timeout: the same IncompleteDispatch, message and fields, as with a status buffer each."""
    case = _case(cell, "all", T=3)
    for i, groups in enumerate(_dispatches(case)):
        for failure in (dict(stop=(i, groups // 2)), dict(timeout=i)):
            errors = []
            for kind in (metalcompute.Device, _CudaLikeDevice, _FetchingDevice):
                device = kind(**SMALL_GROUPS, **failure)
                with EMULATED_HOST.using(device):
                    with pytest.raises(IncompleteDispatch) as info:
                        case.gradients(backend=BACKEND)
                e = info.value
                errors.append((str(e), e.kernel, e.op, e.sizes, e.dispatch, e.steps, e.missing,
                               e.reported))
            assert errors[0] == errors[1] == errors[2]


def test_a_call_makes_one_zeroed_region_and_one_slab_and_reads_the_marks_once(monkeypatch):
    """v1's recurrences one step a dispatch (LSTM T=7: 14 recurrence dispatches and the GEMMs of
    the gradient op): one zeroed region holds every dispatch's marks, read back once; buffers
    over OWN_BYTES (patched to 600) are allocated on their own, the rest come from the one
    zeroed region and the one slab. The results are those of a status buffer per dispatch."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v1")
    monkeypatch.setattr(layout_module, "OWN_BYTES", 600)
    monkeypatch.setattr(EMULATED_HOST, "dispatch_budget", 1024 * 32)  # one step per dispatch
    case = _case("lstm", "all", T=7)
    made, reads = [], []
    device = _CudaLikeDevice(**SMALL_GROUPS)
    zeros, buffer = device.zeros, device.buffer
    device.zeros = lambda nbytes: made.append(("zeros", nbytes)) or zeros(nbytes)
    device.buffer = lambda data: (isinstance(data, int) and made.append(("buffer", data))
                                  or buffer(data))
    # on the class: monkeypatch would restore an instance attribute (the bound method), which
    # would then shadow the class's for the rest of the session
    words = metal_host.MetalHost.words
    monkeypatch.setattr(metal_host.MetalHost, "words",
                        lambda host, buf, n: reads.append(n) or words(host, buf, n))
    with EMULATED_HOST.using(device):
        kwargs = case.gradient_kwargs(*case.training_forward(BACKEND))
        api.lstm_gradients(**kwargs, backend=BACKEND)  # the plan made
        made.clear(), reads.clear()
        got = api.lstm_gradients(**kwargs, backend=BACKEND)
        plan, = [p for p in EMULATED_HOST._plans.values() if p.op.endswith("_gradients")]
        read_back = list(reads)
    with EMULATED_HOST.using(metalcompute.Device(**SMALL_GROUPS)):
        want = api.lstm_gradients(**kwargs, backend=BACKEND)
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    assert sum(d.kernel.startswith("lstm_") for d in device.trace) >= 2 * 7
    marks = [8 * -(-d.count // 32) for d in device.trace[-len(plan.launches):]]
    assert len(read_back) == 1 and 4 * read_back[0] >= sum(marks), (read_back, marks)
    large = [(("zeros" if zeroed else "buffer"), n) for n, zeroed in plan.buffers if n > 600]
    small = [(n, zeroed) for n, zeroed in plan.buffers if n <= 600]
    assert large and any(zeroed for _, zeroed in small) and any(not z for _, z in small)
    regions = [m for m in made if m not in large or made.count(m) > large.count(m)]
    assert sorted(made) == sorted(large + regions), made
    assert [kind for kind, _ in regions].count("zeros") == 1, made  # marks and small zeroed
    assert [kind for kind, _ in regions].count("buffer") == 1, made  # the slab


def test_kept_constants_are_bounded_and_dropped_with_the_device(monkeypatch):
    monkeypatch.setattr(metal_host, "CONSTANTS_KEPT", 4)
    device = _CountingDevice()
    with EMULATED_HOST.using(device):
        first = [EMULATED_HOST.buffer(Constant(n)) for n in range(1, 7)]
        assert device.copies == 6 and len(EMULATED_HOST._constants) == 4
        assert EMULATED_HOST.buffer(Constant(6)) is first[5]  # kept: no copy
        assert EMULATED_HOST.buffer(Constant(3)) is first[2]
        assert device.copies == 6
        EMULATED_HOST.buffer(Constant(1))  # dropped first (least recently used): made again
        assert device.copies == 7
        assert EMULATED_HOST.buffer(Constant(4)) is not first[3]  # dropped to make room for 1
        assert EMULATED_HOST.buffer(Constant(6, 1.0)) is not first[5]  # another value
        params = np.zeros(1, library.GEMM_PARAMS)
        assert EMULATED_HOST.buffer(params) is EMULATED_HOST.buffer(params.copy())
        kept = EMULATED_HOST._constants
        other = _CountingDevice()
        with EMULATED_HOST.using(other):
            assert len(EMULATED_HOST._constants) == 0
            assert EMULATED_HOST.buffer(Constant(6)) is not first[5] and other.copies == 1
        assert EMULATED_HOST._constants is kept  # leaving the block restores the device's own
        EMULATED_HOST.use(other)
        assert len(EMULATED_HOST._constants) == 0
