"""The ``metal-mps`` backend (rnngrad's kernels on PyTorch's "mps" tensors through
``torch.mps.compile_shader``), tested without a Mac through the harness stand-in of that API
(``rnngrad.backends.metal.harness.mps.StandIn``, through ``contexts.mps_standin``): on the
CPU target with CPU tensors here, on the CUDA target with CUDA tensors where a GPU is
(``gpu``-marked tests).

- the stand-in's own semantics, as PyTorch's source defines the API: tensors bound in order at
  their storage offsets, Python scalars and lists as ``constant`` values, ``threads`` and
  ``group_size``, partial last threadgroups and short SIMD-groups (the CPU target) against
  Metal's definitions of the builtins, and the refusals (those on the CUDA target, sizes above
  the pipeline's limit, ``[[threadgroup(i)]]`` arguments, unknown kernels);
- the device: every grid a whole number of threadgroups, inputs bound where they are, results
  tensors on the device;
- the backend against the float64 reference, through NumPy inputs (as ``rnngrad verify`` runs
  it) and through tensors, for every cell, descriptor option, optional input and direction;
- injected failures: a dispatch stopped part-way raises IncompleteDispatch;
- ``rnngrad.torch``'s layers on the stand-in's tensors against ``torch.nn`` and against the
  same layers on the reference, and a training step.

Every test name holds ``metal_mps``: ``python -m pytest -k metal_mps`` runs them.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnngrad  # noqa: E402
import rnngrad.torch as rt  # noqa: E402
from rnngrad import registry  # noqa: E402
from rnngrad.backends.metal import IncompleteDispatch  # noqa: E402
from rnngrad.backends.metal import backends  # noqa: E402
from rnngrad.backends.metal.harness import contexts
from rnngrad.backends.metal import mps  # noqa: E402
from rnngrad.backends.metal.harness.mps import StandIn  # noqa: E402
from rnngrad.testing import check_case, compare_array  # noqa: E402
from rnngrad.testing.cases import CELLS, random_case, random_descriptor  # noqa: E402
from rnngrad.testing.check import assert_matches_reference  # noqa: E402

from draws import ALL_OPTIONAL, option_variants  # noqa: E402

BACKEND = "metal-mps"
NO_OPTIONAL = {k: False for k in ALL_OPTIONAL}

pytestmark = pytest.mark.skipif(backends.EMULATED_BACKEND.probe() is not None,
                                reason=f"the CPU harness is unavailable: "
                                       f"{backends.EMULATED_BACKEND.probe()}")


def _cuda_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA device (torch.cuda.is_available() is False)"
    from rnngrad.backends.metal import cuda

    return cuda.available()


# -- the stand-in's own semantics ----------------------------------------------------------------

SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

kernel void copy_scaled(device float* out [[buffer(0)]], const device float* in [[buffer(1)]],
                        constant float& scale [[buffer(2)]], constant long& shift [[buffer(3)]],
                        uint i [[thread_position_in_grid]]) {
    out[i] = in[i] * scale + float(shift);
}

kernel void lists(device float* out [[buffer(0)]], constant long* ints [[buffer(1)]],
                  constant float* floats [[buffer(2)]], constant int& narrow [[buffer(3)]],
                  uint i [[thread_position_in_grid]]) {
    out[i] = float(ints[i]) + floats[i] + float(narrow);
}

kernel void where(device uint* out [[buffer(0)]], uint i [[thread_position_in_grid]],
                  uint group [[threadgroup_position_in_grid]],
                  uint size [[threads_per_threadgroup]], uint groups [[threadgroups_per_grid]]) {
    out[3 * i] = group;
    out[3 * i + 1] = size;
    out[3 * i + 2] = groups;
}

[[max_total_threads_per_threadgroup(64)]]
kernel void small(device float* out [[buffer(0)]], uint i [[thread_position_in_grid]]) {
    out[i] = 1.0f;
}
"""


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def target(request):
    """The stand-in's torch device: "cpu" (the CPU target), "cuda" (the CUDA target; gpu)."""
    if request.param == "cuda" and _cuda_reason():
        pytest.skip(_cuda_reason())
    return request.param


@pytest.fixture(scope="module")
def lib(target):
    return StandIn(target)(SOURCE)


def test_metal_mps_standin_binds_tensors_in_order_at_their_storage_offsets(lib, target):
    out = torch.full((40,), -1.0, device=target)
    x = torch.arange(64, dtype=torch.float32, device=target).reshape(8, 8)
    # out[8:] and x[1:, 2:] are views: bound at their storage offsets; x's strides are not
    # looked at, so the kernel reads x's storage from element 10 on, row after row
    assert lib.copy_scaled(out[8:], x[1:, 2:], 2.0, 3, threads=32, group_size=32) is None
    out = out.cpu()
    assert torch.equal(out[:8], torch.full((8,), -1.0))
    assert torch.equal(out[8:], torch.arange(10, 42, dtype=torch.float32) * 2 + 3)


def test_metal_mps_standin_binds_lists_and_casts_scalars(lib, target):
    out = torch.zeros(32, device=target)
    ints, floats = list(range(32)), [0.5 * i for i in range(32)]
    lib.lists(out, ints, floats, 7, arg_casts={3: "int32"})  # threads: out's numel
    assert torch.equal(out.cpu(), torch.tensor([i + 0.5 * i + 7 for i in range(32)]))
    with pytest.raises(RuntimeError, match="Unsupported cast instruction"):
        lib.lists(out, ints, floats, 7, arg_casts="int64")
    with pytest.raises(RuntimeError, match="Empty list"):
        lib.lists(out, [], floats, 7, arg_casts={3: "int32"})


def test_metal_mps_standin_threads_and_group_size(lib, target):
    out = torch.zeros(3 * 256, dtype=torch.int32, device=target)  # uint words, read as int32
    lib.where(out, threads=256, group_size=64)
    got = out.cpu().reshape(256, 3)
    assert torch.equal(got[:, 0], torch.arange(256, dtype=torch.int32) // 64)
    assert (got[:, 1] == 64).all() and (got[:, 2] == 4).all()
    out.zero_()
    lib.where(out, threads=[96, 1, 1])  # default group_size: min(threads, the pipeline's limit)
    got = out.cpu().reshape(256, 3)
    assert (got[:96, 1] == 96).all() and (got[96:] == 0).all()
    assert lib.small.max_threads_per_threadgroup == 64
    assert lib.where.max_threads_per_threadgroup == 1024
    assert lib.where.thread_execution_width == 32
    assert "copy_scaled" in dir(lib) and "small" in dir(lib)


def test_metal_mps_standin_refuses_what_it_cannot_run_or_the_api_refuses(lib, target):
    out = torch.zeros(3 * 128, dtype=torch.int32, device=target)
    if target == "cuda":  # partial threadgroups and short SIMD-groups run on the CPU target only
        with pytest.raises(NotImplementedError, match="partial last threadgroup of 32 threads"):
            lib.where(out, threads=96, group_size=64)
        with pytest.raises(NotImplementedError, match="whole SIMD-groups of 32"):
            lib.where(out, threads=48, group_size=48)
    with pytest.raises(ValueError, match="group_size: expected a threadgroup size >= 1, got 0"):
        lib.where(out, threads=96, group_size=0)
    with pytest.raises(ValueError, match="Threadgroup size exceeds 64 limit"):
        lib.small(out, threads=128, group_size=128)
    with pytest.raises(NotImplementedError, match="1-D grids only"):
        lib.where(out, threads=(32, 2))
    with pytest.raises(RuntimeError, match="Failed to create function state object for: nope"):
        lib.nope
    with pytest.raises(RuntimeError, match="argument 0 is a tensor on meta"):
        lib.where(torch.zeros(96, device="meta"), threads=96)
    with pytest.raises(RuntimeError, match=r"threadgroup\(0\)"):
        StandIn(target)(SOURCE.replace("uint i [[thread_position_in_grid]]) {\n    out[i] = 1.0f;",
                                       "threadgroup float* t [[threadgroup(0)]], "
                                       "uint i [[thread_position_in_grid]]) {\n    out[i] = t[0];"))
    assert torch.equal(out.cpu(), torch.zeros(3 * 128, dtype=torch.int32))  # nothing ran


PARTIAL_SOURCE = r"""
#include <metal_stdlib>
using namespace metal;

kernel void sizes(device uint* out [[buffer(0)]],
                  uint gid [[thread_position_in_grid]],
                  uint group [[threadgroup_position_in_grid]],
                  uint lid [[thread_position_in_threadgroup]],
                  uint size [[threads_per_threadgroup]],
                  uint lanes [[threads_per_simdgroup]],
                  uint simdgroups [[simdgroups_per_threadgroup]],
                  uint grid [[threads_per_grid]]) {
    threadgroup uint seen[1024];
    seen[lid] = gid + 1;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    device uint* o = out + 10 * gid;
    o[0] = gid;
    o[1] = group;
    o[2] = lid;
    o[3] = size;
    o[4] = lanes;
    o[5] = simdgroups;
    o[6] = grid;
    o[7] = simd_sum(gid);
    o[8] = seen[(lid + 1) % size];  // the next thread's write, around the threadgroup
    o[9] = as_type<uint>(simd_shuffle_down(float(gid), ushort(1)));
}
"""

#: the stand-in's threads and group_size: a short last SIMD-group in every threadgroup (48), a
#: partial threadgroup of part of a SIMD-group (70 of 64), of one whole and one short (300 of
#: 256), a default group_size of 37 (threads below the limit), and both at once (100 of 48)
PARTIAL_GRIDS = [(100, 48), (70, 64), (300, 256), (37, None), (96, 48)]


def _metal_sizes(threads, group_size):
    """Each thread's row of the ``sizes`` kernel, from Metal's definitions: a grid of
    ``threads`` threads (dispatchThreads) in threadgroups of ``group_size`` threads, the last
    one partial, each cut into SIMD-groups of 32 lanes, the last one short."""
    group_size = group_size or threads
    rows = []
    for gid in range(threads):
        group, lid = divmod(gid, group_size)
        first = group * group_size
        size = min(group_size, threads - first)
        simdgroup, lane = divmod(lid, 32)
        lanes = min(32, size - 32 * simdgroup)
        members = range(first + 32 * simdgroup, first + 32 * simdgroup + lanes)
        nxt = first + (lid + 1) % size
        if lane + 1 < lanes:
            down = np.float32(gid + 1)
        elif lane + 1 == 32:  # past the SIMD-group's width: its own value
            down = np.float32(gid)
        else:  # a lane the short SIMD-group lacks: NaN in the stand-in (undefined on a Mac)
            down = np.float32(np.nan)
        rows.append([gid, group, lid, size, lanes, -(-size // 32), threads, sum(members),
                     nxt + 1, down])
    return rows


@pytest.mark.parametrize("schedule", ["lanes", "reverse", "adversarial"])
@pytest.mark.parametrize("threads,group_size", PARTIAL_GRIDS)
def test_metal_mps_standin_runs_partial_threadgroups_and_short_simdgroups(threads, group_size,
                                                                          schedule):
    standin = StandIn("cpu", schedule=schedule, seed=7)
    lib = standin(PARTIAL_SOURCE)
    extra = 40
    out = torch.full((10 * (threads + extra),), -1, dtype=torch.int32)  # uint words as int32
    lib.sizes(out, threads=threads, group_size=group_size)
    got = out.numpy().view(np.uint32).reshape(-1, 10)
    want = _metal_sizes(threads, group_size)
    for column, name in enumerate(["thread_position_in_grid", "threadgroup_position_in_grid",
                                   "thread_position_in_threadgroup", "threads_per_threadgroup",
                                   "threads_per_simdgroup", "simdgroups_per_threadgroup",
                                   "threads_per_grid", "simd_sum", "threadgroup memory"]):
        np.testing.assert_array_equal(got[:threads, column], [r[column] for r in want],
                                      err_msg=name)
    np.testing.assert_array_equal(got[:threads, 9].view(np.float32), [r[9] for r in want],
                                  err_msg="simd_shuffle_down")  # NaN where NaN
    assert (got[threads:] == 0xFFFFFFFF).all()  # threads past `threads` wrote nothing
    groups = -(-threads // (group_size or threads))
    assert [(d.count, d.threadgroup_size, d.threadgroups) for d in standin.trace] == [
        (threads, group_size or threads, groups)]


def test_metal_mps_standin_partial_threadgroup_barrier_a_thread_skips_is_reported():
    lib = StandIn("cpu")(PARTIAL_SOURCE + r"""
kernel void skips(device uint* out [[buffer(0)]], constant long& last [[buffer(1)]],
                  uint gid [[thread_position_in_grid]]) {
    if (gid == uint(last)) return;  // one thread misses the barrier the others wait at
    threadgroup_barrier(mem_flags::mem_none);
    out[gid] = 1;
}
""")
    out = torch.zeros(128, dtype=torch.int32)
    lib.skips(out, 200, threads=100, group_size=48)  # no thread is 200: every one reaches it
    assert (out[:100] == 1).all() and (out[100:] == 0).all()
    # thread 99, one of the 4 of the partial threadgroup 2, returns: 3 of 4 reached it
    with pytest.raises(RuntimeError, match="reached by 3 of 4 threads of threadgroup 2"):
        lib.skips(out, 99, threads=100, group_size=48)


def test_metal_mps_standin_partial_threadgroups_on_the_barrier_free_path_and_stopped():
    # `where` neither synchronises nor reads threads_per_grid: the harness's plain loop
    lib = StandIn("cpu", stop=(1, 2))(SOURCE)  # the second call runs 2 threadgroups only
    for (threads, group_size), stopped in [((70, 64), False), ((100, 48), True)]:
        out = torch.full((3 * 128,), -1, dtype=torch.int32)
        lib.where(out, threads=threads, group_size=group_size)
        got = out.numpy().reshape(128, 3)
        ids = np.arange(threads)
        groups = 2 if stopped else -(-threads // group_size)  # threadgroups_per_grid: those run
        ran = min(threads, groups * group_size)
        np.testing.assert_array_equal(got[:ran, 0], ids[:ran] // group_size)
        np.testing.assert_array_equal(
            got[:ran, 1], np.minimum(group_size, threads - ids[:ran] // group_size * group_size))
        assert (got[:ran, 2] == groups).all()
        assert (got[ran:] == -1).all()  # past `threads`, and the threadgroups stopped


# -- the device and the registry -----------------------------------------------------------------

def test_metal_mps_is_listed_with_why_it_is_missing_and_available_in_the_standin():
    rows = {name: (ok, reason) for name, ok, _, reason in registry.status()}
    assert BACKEND in registry.all_backends()
    if not (torch.backends.mps.is_available() and hasattr(torch.mps, "compile_shader")):
        ok, reason = rows[BACKEND]
        assert not ok and ("MPS" in reason or "compile_shader" in reason), reason
        with pytest.raises(RuntimeError, match=r"tensors on mps: no rnngrad backend available "
                                               r"here runs on MPS devices \(the 'metal-mps' "):
            rt.functions._device.backend_for(torch.device("mps"), None)
    with contexts.mps_standin("cpu"):
        assert BACKEND in rnngrad.available_backends()
        assert rt.functions._device.backend_for(torch.device("cpu"), None) == BACKEND
        with pytest.raises(ValueError, match="tensors on cpu run on 'metal-mps', got "
                                             "backend='numba'"):
            rt.functions._device.backend_for(torch.device("cpu"), "numba")
    assert rows[BACKEND] == next((ok, r) for n, ok, _, r in registry.status() if n == BACKEND)


def _tensors(inputs, device="cpu"):
    return {k: torch.from_numpy(np.array(v)).to(device) if isinstance(v, np.ndarray) else v
            for k, v in inputs.items()}


def test_metal_mps_device_pads_grids_binds_inputs_in_place_and_returns_tensors():
    case = random_case(3, "lstm", T=4, N=3, I=5, H=7, dtype=np.float32, optional=ALL_OPTIONAL,
                       cell_gradient_form="final")
    want = case.forward(backend="metal-emulated")
    inputs = _tensors(case.inputs)
    before = {k: v.clone() for k, v in inputs.items()}
    with contexts.mps_standin("cpu") as dev:
        wrapped = []
        wrap = dev.wrap
        dev.wrap = lambda a: wrapped.append(a.tensor.data_ptr()) or wrap(a)
        got = rnngrad.lstm(**inputs, descriptor=case.descriptor, backend=BACKEND)
        harness = dev.compile_shader.trace
    assert all(isinstance(g, torch.Tensor) and g.device.type == "cpu" for g in got)
    for g, w in zip(got, want):
        assert g.numpy().tobytes() == w.tobytes()  # the kernels and the host are the same
    assert inputs["source"].data_ptr() in wrapped  # read where it is, not copied
    for k, v in inputs.items():
        assert torch.equal(v, before[k]), k
    assert len(dev.trace) == len(harness) > 0
    for d, h in zip(dev.trace, harness):
        assert d.threads % d.threadgroup_size == 0 and d.count <= d.threads
        assert (h.kernel, h.count, h.threadgroup_size) == (d.kernel, d.threads,
                                                           d.threadgroup_size)


# -- the backend against the reference -----------------------------------------------------------

def _tensor_candidate(op, device):
    """rnngrad's ``op`` on tensors of ``device`` (NumPy in and out, for the checks)."""
    fn = getattr(rnngrad, op)

    def candidate(**given):
        out = fn(**_tensors(given, device), backend=BACKEND)
        assert all(isinstance(v, torch.Tensor) and v.device.type == torch.device(device).type
                   for v in out), [type(v) for v in out]
        return type(out)([(name, v.cpu().numpy()) for name, v in zip(out.names, out)])
    return candidate


def _check_tensors(case, device):
    for gradients in (False, True):
        op = case.cell if case.cell != "single_gate" else "single_gate_rnn"
        op = op + ("_gradients" if gradients else "")
        forward = _tensor_candidate(op.replace("_gradients", ""), device)
        assert_matches_reference(_tensor_candidate(op, device), case, op,
                                 forward=forward if gradients else None, z_state=True)


@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_every_option_and_direction_through_tensors(cell):
    with contexts.mps_standin("cpu"):
        for i, options in enumerate(option_variants(cell)):
            rng = np.random.default_rng(200 + i)
            desc = random_descriptor(rng, cell, **options)
            case = random_case(rng, cell, descriptor=desc, T=3, N=2, H=3, I=2, dtype=np.float32,
                               optional=ALL_OPTIONAL if i % 2 else None)
            _check_tensors(case, "cpu")


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("optional", [ALL_OPTIONAL, NO_OPTIONAL,
                                      dict(ALL_OPTIONAL, mask_per_step=True)],
                         ids=["all", "none", "mask-per-step"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_metal_mps_optional_inputs_through_numpy(cell, optional, bidirectional):
    rng = np.random.default_rng(zlib.crc32(repr((cell, bidirectional, optional)).encode()))
    desc = random_descriptor(rng, cell, bidirectional=bidirectional)
    forms = ["per_step", "final"] if cell == "lstm" and optional.get("cell_gradient") else [None]
    with contexts.mps_standin("cpu"):
        for form in forms:
            case = random_case(rng, cell, descriptor=desc, T=4, N=3, H=5, I=3, dtype=np.float32,
                               optional=optional, cell_gradient_form=form)
            for gradients in (False, True):
                ratio, mismatches = check_case(case, BACKEND, gradients)
                assert not mismatches, "\n".join(map(str, mismatches[:5])) + f"\n{case!r}"


@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_empty_sequences_and_batches_through_tensors(cell):
    with contexts.mps_standin("cpu"):
        for T, N in ((0, 2), (2, 0)):
            case = random_case(T * 10 + N, cell, T=T, N=N, H=3, I=2, dtype=np.float32,
                               optional=ALL_OPTIONAL, cell_gradient_form="final")
            _check_tensors(case, "cpu")


# -- injected failures ---------------------------------------------------------------------------

def _completion_case(cell):
    """D·N·H = 2·3·6 = 36 recurrence threads under v1: two threadgroups of 32."""
    rng = np.random.default_rng(len(cell) + 10)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True)
    return random_case(rng, cell, descriptor=desc, T=3, N=3, H=6, I=4, dtype=np.float32,
                       optional=ALL_OPTIONAL, cell_gradient_form="per_step")


def _op_dispatches(case, **harness):
    """[(kernel, op, index in the op, threadgroups)] of ``case.gradients`` (a training forward,
    then the gradient op), fault-free, as the harness ran them."""
    with contexts.mps_standin("cpu", **harness) as dev:
        case.training_forward(backend=BACKEND)
        forward = len(dev.compile_shader.trace)
    with contexts.mps_standin("cpu", **harness) as dev:
        case.gradients(backend=BACKEND)
        trace = list(dev.compile_shader.trace)
    out = []
    for i, d in enumerate(trace):
        op = f"{case.cell}_forward" if i < forward else f"{case.cell}_gradients"
        out.append((d.kernel, op, i if i < forward else i - forward, d.threadgroups))
    return out


@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_a_dispatch_stopped_part_way_raises_incomplete_dispatch(cell, monkeypatch):
    """Each dispatch of each op in turn runs only half its threadgroups, or none: the op's one
    read of its marks, after its last dispatch, names that dispatch, and nothing is returned."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v1")
    case = _completion_case(cell)
    small = dict(max_threads_per_threadgroup=32)
    dispatches = _op_dispatches(case, **small)
    assert any(groups >= 2 for k, _, _, groups in dispatches if k != "strided_gemm")
    for number, (kernel, op, index, groups) in enumerate(dispatches):
        for ran in {groups // 2, 0}:
            with contexts.mps_standin("cpu", stop=(number, ran), **small):
                with pytest.raises(IncompleteDispatch) as info:
                    case.gradients(backend=BACKEND)
            err, message = info.value, str(info.value)
            assert (err.kernel, err.op, err.dispatch) == (kernel, op, index), message
            assert "No result is returned" in message
            if ran == 0:
                assert "no threadgroup finished" in message
            else:
                assert err.missing == tuple(range(ran, groups)), message


def _as_tensors(case):
    """``case`` with its arrays as CPU tensors: what the CPU stand-in takes as MPS tensors."""
    as_tensor = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    return dataclasses.replace(
        case, inputs={k: as_tensor(v) for k, v in case.inputs.items()},
        source_gradient=as_tensor(case.source_gradient),
        state_gradient=as_tensor(case.state_gradient), cell_gradient=as_tensor(case.cell_gradient))


@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_ops_on_tensors_do_not_wait_and_a_stop_is_raised_late(cell, monkeypatch):
    """Ops on the device's tensors return without reading their marks (the copy to the host is
    queued behind them); a dispatch of either op run part-way or not at all is raised at the
    next call (the gradient op, after a failed forward) or at rnngrad.synchronize(), naming its
    kernel, op and dispatch, and saying it was found late; RNNGRAD_LAUNCH_BLOCKING=1 raises it
    in the op itself, as for host arrays."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v1")
    case = _as_tensors(_completion_case(cell))
    small = dict(max_threads_per_threadgroup=32)
    dispatches = _op_dispatches(_completion_case(cell), **small)
    for number, (kernel, op, index, groups) in enumerate(dispatches):
        for blocking in ("0", "1"):
            monkeypatch.setenv("RNNGRAD_LAUNCH_BLOCKING", blocking)
            with contexts.mps_standin("cpu", stop=(number, groups // 2), **small):
                with pytest.raises(IncompleteDispatch) as info:
                    case.gradients(backend=BACKEND)
                    rnngrad.synchronize()
            err = info.value
            assert (err.kernel, err.op, err.dispatch) == (kernel, op, index), str(err)
            assert err.late == (blocking == "0")
    monkeypatch.setenv("RNNGRAD_LAUNCH_BLOCKING", "0")
    with contexts.mps_standin("cpu", **small):
        got = case.gradients(backend=BACKEND)
        rnngrad.synchronize()
    with contexts.mps_standin("cpu", **small):
        want = _completion_case(cell).gradients(backend=BACKEND)
    assert all(np.asarray(g).tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_a_stop_past_the_ops_changes_nothing(cell, monkeypatch):
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v1")
    case = _completion_case(cell)
    with contexts.mps_standin("cpu"):
        want = case.gradients(backend=BACKEND)
    with contexts.mps_standin("cpu", stop=(10 ** 4, 0)):
        got = case.gradients(backend=BACKEND)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()


# -- rnngrad.torch on the stand-in's tensors -----------------------------------------------------

TORCH = {"RNN_TANH": lambda *a, **kw: torch.nn.RNN(*a, nonlinearity="tanh", **kw),
         "RNN_RELU": lambda *a, **kw: torch.nn.RNN(*a, nonlinearity="relu", **kw),
         "GRU": torch.nn.GRU, "LSTM": torch.nn.LSTM}


def _kind(name):
    """The rnngrad quantity whose float32 tolerance applies to a layer's output or gradient."""
    if name.startswith(("weight_hh", "peephole")):
        return "recurrent_weight" if name.startswith("weight") else "peephole"
    return {"weight_ih": "input_weight", "bias_ih": "bias", "bias_hh": "bias", "input": "source",
            "h_0": "init_state", "c_0": "init_cell", "c_n": "cell"}.get(name.split("_l")[0],
                                                                       "state")


def _outputs_and_gradients(module, x, hx, ups, mask=None):
    """{name: NumPy array} of the outputs and of the gradients of Σ ups ⊙ outputs."""
    lstm = isinstance(hx, tuple)
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    states = [t.detach().clone().requires_grad_() for t in (hx if lstm else (hx,))]
    kw = {} if mask is None else {"mask": mask}
    output, state = module(x, tuple(states) if lstm else states[0], **kw)
    outs = [output] + (list(state) if lstm else [state])
    torch.autograd.backward(outs, ups[:len(outs)])
    got = {"output": output, "h_n": outs[1], "input": x.grad, "h_0": states[0].grad}
    if lstm:
        got.update(c_n=outs[2], c_0=states[1].grad)
    got.update({k: p.grad for k, p in module.named_parameters()})
    return {k: v.detach().cpu().double().numpy() for k, v in got.items()}


def _assert_close(got, want):
    assert set(got) == set(want)
    for name, value in want.items():
        ratio, mismatch = compare_array(_kind(name), got[name], value, np.float32)
        assert mismatch is None, f"{name}: {mismatch}"


def _data(module, T, N, seed, lstm, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    D = 2 if module.bidirectional else 1
    L, H, I = module.num_layers, module.hidden_size, module.input_size
    shape = (N, T, I) if module.batch_first else (T, N, I)
    x = torch.randn(shape, generator=g, dtype=dtype)
    h0 = torch.randn(L * D, N, H, generator=g, dtype=dtype)
    hx = (h0, torch.randn(L * D, N, H, generator=g, dtype=dtype)) if lstm else h0
    out = (N, T, D * H) if module.batch_first else (T, N, D * H)
    ups = [torch.randn(out, generator=g, dtype=dtype)] + [
        torch.randn(L * D, N, H, generator=g, dtype=dtype) for _ in range(2)]
    move = lambda t: t.to(device)  # noqa: E731
    return move(x), tuple(map(move, hx)) if lstm else move(hx), [move(u) for u in ups]


def _layers_match_torch_nn(device):
    for seed, mode in enumerate(TORCH):
        torch.manual_seed(seed)
        module = TORCH[mode](5, 6, num_layers=2, bidirectional=True, batch_first=True)
        data = _data(module, T=4, N=3, seed=seed, lstm=mode == "LSTM", device=device)
        want = _outputs_and_gradients(module.to(device), *data)
        with contexts.mps_standin(device) as dev:
            layer = rt.from_torch(module)
            got = _outputs_and_gradients(layer.to(device), *data)
        _assert_ran_on(dev)
        _assert_close(got, want)


def _assert_ran_on(dev):
    """The layer's ops ran as dispatches of the stand-in (not on another backend)."""
    assert len(dev.compile_shader.trace) > 0, "no dispatch ran on the metal-mps stand-in"


def test_metal_mps_layers_match_torch_nn():
    _layers_match_torch_nn("cpu")


OPTIONS = [
    ("RNN", dict(nonlinearity="sigmoid", reverse=True)),
    ("RNN", dict(nonlinearity="hard_sigmoid", bidirectional=True, num_layers=2, bias=False)),
    ("GRU", dict(reset_after=False, reset_gate_first=False)),
    ("GRU", dict(flip_z=True, bidirectional=True, secondary_bias=False)),
    ("GRU", dict(update_gate_activation="hard_sigmoid", output_gate_activation="relu",
                 num_layers=2, batch_first=True)),
    ("LSTM", dict(peephole=True, bidirectional=True)),
    ("LSTM", dict(forget_gate_last=True, reverse=True, activation="hard_sigmoid",
                  cell_gate_activation="none")),
    ("LSTM", dict(peephole=True, num_layers=2, batch_first=True,
                  forget_gate_activation="relu")),
]
CLASSES = {"RNN": rt.RNN, "GRU": rt.GRU, "LSTM": rt.LSTM}


def _option_id(case):
    return case[0] + "-" + "-".join(f"{k}={v}" for k, v in case[1].items())


@pytest.mark.parametrize("case", OPTIONS, ids=_option_id)
@pytest.mark.parametrize("masked", [False, True])
def test_metal_mps_layer_options_match_the_reference(case, masked):
    """Each MPSGraph option of the layers, masked or not: the float32 layer on metal-mps against
    the same layer in float64 on the reference (outputs and every gradient)."""
    name, options = case
    seed = OPTIONS.index(case)

    want_layer = CLASSES[name](3, 4, dtype=torch.float64, backend="reference", **options)
    with torch.no_grad():  # larger than the default initialisation: every gate matters
        for p in want_layer.parameters():
            p.normal_(0.0, 0.7, generator=torch.Generator().manual_seed(seed))

    def layer(dtype, backend):
        made = CLASSES[name](3, 4, dtype=dtype, backend=backend, **options)
        made.load_state_dict(want_layer.state_dict())  # the same parameters, in float32
        return made

    data = _data(want_layer, T=3, N=2, seed=seed, lstm=name == "LSTM", dtype=torch.float64)
    D = want_layer.num_directions
    mask = None
    if masked:
        T, N = 3, 2
        shape = (N, T, D * 4) if want_layer.batch_first else (T, N, D * 4)
        mask = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3).double()
    want = _outputs_and_gradients(want_layer, *data, mask=mask)
    f32 = lambda t: t.float()  # noqa: E731
    x, hx, ups = data
    data32 = (f32(x), tuple(map(f32, hx)) if name == "LSTM" else f32(hx), [f32(u) for u in ups])
    with contexts.mps_standin("cpu") as dev:
        got = _outputs_and_gradients(layer(torch.float32, None), *data32,
                                     mask=None if mask is None else mask.float())
    _assert_ran_on(dev)
    _assert_close(got, want)


def _training_steps(device, steps=3):
    """Parameters after ``steps`` SGD steps of a 2-layer bidirectional LSTM regressor: torch.nn's
    on ``device``, and rnngrad.torch's on metal-mps from the same start."""
    torch.manual_seed(0)
    module = torch.nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True)
    head = torch.nn.Linear(16, 1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 7, 6, generator=g), torch.randn(4, 7, 1, generator=g)
    with contexts.mps_standin(device):
        layer = rt.from_torch(module).to(device)
    start = {k: v.clone() for k, v in module.state_dict().items()}
    runs = []
    for net in (module.to(device), layer):
        net.load_state_dict(start)
        top = torch.nn.Linear(16, 1).to(device)
        top.load_state_dict(head.state_dict())
        opt = torch.optim.SGD(list(net.parameters()) + list(top.parameters()), lr=0.5)
        losses = []
        with contexts.mps_standin(device) if net is layer else _nothing() as dev:
            for _ in range(steps):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(top(net(x.to(device))[0]), y.to(device))
                loss.backward()
                opt.step()
                losses.append(loss.item())
        if net is layer:
            _assert_ran_on(dev)
        runs.append((losses, {k: v.detach().cpu().double().numpy()
                              for k, v in net.state_dict().items()}))
    return runs


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _assert_same_training(runs):
    (want_losses, want), (got_losses, got) = runs
    assert want_losses[-1] < want_losses[0]  # it learns
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-4)
    for k in want:
        ratio, mismatch = compare_array(_kind(k), got[k], want[k], np.float32)
        assert mismatch is None, f"{k}: {mismatch}"


def test_metal_mps_training_step_matches_torch_nn():
    _assert_same_training(_training_steps("cpu"))


@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_custom_operators_pass_opcheck(cell):
    """torch.ops.rnngrad.* on the stand-in's tensors (backend None: metal-mps): PyTorch's
    operator checks, among them that no output shares memory with an input or another output
    (the host makes each result apart on this device)."""
    from rnngrad.torch import functions, ops

    desc = random_descriptor(np.random.default_rng(len(cell)), cell, bidirectional=True)
    case = random_case(7, cell, descriptor=desc, T=3, N=2, H=3, I=2, dtype=np.float32,
                       optional=dict(ALL_OPTIONAL, mask=False))
    given = {name: None for name in functions.INPUTS[cell]}
    for name, value in case.inputs.items():
        if name in given:
            given[name] = torch.from_numpy(np.array(value)).requires_grad_()
    code = functions.descriptor_code(desc)
    forward, backward = ops.OPS[cell]
    detached = [None if t is None else t.detach() for t in given.values()]
    with contexts.mps_standin("cpu"):
        torch.library.opcheck(forward, (*given.values(), code, None, True))
        out = forward(*given.values(), code, None, True)
        storages = {o.untyped_storage().data_ptr() for o in out}
        assert len(storages) == len(out)
        g = torch.Generator().manual_seed(1)
        ups = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in out[:-1]]
        outs = [o.detach() for o in out]
        args = (*outs[:2], outs[-1], *ups) if cell == "lstm" else (outs[0], outs[-1], *ups)
        needs = [name != "mask" for name in functions.INPUTS[cell]]
        torch.library.opcheck(backward, (*detached, *args, code, None, needs))


# -- rnngrad verify on the stand-in ----------------------------------------------------------------

def test_metal_mps_verify_runs_on_the_standin(monkeypatch, capsys):
    from rnngrad.cli import main

    monkeypatch.setenv(mps.STANDIN_ENV, "cpu")
    registry.reprobe(BACKEND)
    try:
        with backends.MPS_HOST.using(None):
            code = main(["verify", "--backend", BACKEND, "--skip-reference", "--examples", "2"])
            where = backends.MPS_HOST.device.deviceName
    finally:
        monkeypatch.delenv(mps.STANDIN_ENV)
        registry.reprobe(BACKEND)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "StandIn('cpu'" in where
    assert out.count(BACKEND) >= 6, out  # a row per cell and op


# -- the same on the CUDA target (the GPU machine) -----------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.gpu
def test_metal_mps_cuda_standin_matches_the_reference(cell, bidirectional):
    if _cuda_reason():
        pytest.skip(_cuda_reason())
    rng = np.random.default_rng(zlib.crc32(repr((cell, bidirectional)).encode()))
    with contexts.mps_standin("cuda"):
        for optional in (ALL_OPTIONAL, NO_OPTIONAL):
            desc = random_descriptor(rng, cell, bidirectional=bidirectional)
            case = random_case(rng, cell, descriptor=desc, T=5, N=3, H=33, I=4, dtype=np.float32,
                               optional=optional, cell_gradient_form="final")
            _check_tensors(case, "cuda")


@pytest.mark.gpu
def test_metal_mps_cuda_layers_and_training_step():
    if _cuda_reason():
        pytest.skip(_cuda_reason())
    # torch.nn on CUDA in float32, as the tolerances assume: cuDNN's RNNs allow TF32 by default
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        _layers_match_torch_nn("cuda")
        _assert_same_training(_training_steps("cuda"))
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.gpu
@pytest.mark.parametrize("cell", CELLS)
def test_metal_mps_cuda_a_dropped_dispatch_raises_incomplete_dispatch(cell, monkeypatch):
    """The CUDA target cannot stop a dispatch part-way; the stand-in's ``drop=i`` leaves
    dispatch i out (never started), on tensors in GPU memory: raised by the op itself with
    RNNGRAD_LAUNCH_BLOCKING=1, else found late, at rnngrad.synchronize()."""
    if _cuda_reason():
        pytest.skip(_cuda_reason())
    case = _completion_case(cell)
    inputs = _tensors(case.inputs, "cuda")
    op = getattr(rnngrad, case.cell if cell != "single_gate" else "single_gate_rnn")
    with contexts.mps_standin("cuda") as dev:
        op(**inputs, descriptor=case.descriptor, backend=BACKEND)
        rnngrad.synchronize()
        kernels = [d.kernel for d in dev.trace]
    for number, kernel in enumerate(kernels):
        for blocking in ("0", "1"):
            monkeypatch.setenv("RNNGRAD_LAUNCH_BLOCKING", blocking)
            with contexts.mps_standin("cuda", drop=number):
                with pytest.raises(IncompleteDispatch) as info:
                    op(**inputs, descriptor=case.descriptor, backend=BACKEND)
                    rnngrad.synchronize()
            err = info.value
            assert (err.kernel, err.dispatch) == (kernel, number), str(err)
            assert err.late == (blocking == "0"), str(err)
            assert err.missing[0] == 0 and ("no threadgroup finished" in str(err) or err.late)


# -- on a Mac: PyTorch's own compile_shader and "mps" tensors ------------------------------------

@pytest.mark.skipif(not (torch.backends.mps.is_available()
                         and hasattr(torch.mps, "compile_shader")),
                    reason="needs PyTorch 2.7 or later with an MPS device (macOS, Apple silicon)")
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_metal_mps_on_a_mac_matches_the_reference(cell, bidirectional):
    rng = np.random.default_rng(zlib.crc32(repr(("mac", cell, bidirectional)).encode()))
    for optional in (ALL_OPTIONAL, NO_OPTIONAL):
        desc = random_descriptor(rng, cell, bidirectional=bidirectional)
        case = random_case(rng, cell, descriptor=desc, T=5, N=3, H=33, I=4, dtype=np.float32,
                           optional=optional, cell_gradient_form="final")
        _check_tensors(case, "mps")
