"""The Metal kernels on an NVIDIA GPU (backend "metal-cuda", the harness's CUDA target).

Marked ``gpu``: they skip, with the reason, where CuPy or a CUDA device is missing, and run
alone with ``python -m pytest -m gpu``. Results are compared with the float64 reference through
the one tolerance table.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import rnngrad as rg
from rnngrad.backends.metal import cuda as metalcompute
from rnngrad.testing import check_backend, check_case
from rnngrad.testing.cases import CELLS, random_case, random_descriptor

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(metalcompute.available() is not None,
                                 reason=f"needs an NVIDIA GPU with CuPy: {metalcompute.available()}")]

from draws import ALL_OPTIONAL  # noqa: E402  (after the skip)
from test_harness_cpu import (ELEMENTWISE, GEMM, PARAMS, REDUCE,  # noqa: E402  (after the skip)
                              check_prepared_calls_bind_their_open_slots,
                              check_trace_keeps_the_newest_dispatches)
from test_metal_backend import V2_SHAPES  # noqa: E402

OPS = ("single_gate_rnn", "single_gate_rnn_gradients", "gru", "gru_gradients", "lstm",
       "lstm_gradients")


@pytest.fixture(scope="module")
def dev():
    return metalcompute.Device(check_each_dispatch=True)


def test_elementwise_kernel_matches_numpy(dev):
    import cupy as cp

    n = 1000
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32) * 4
    y = dev.buffer(4 * n)
    dev.finish([dev.kernel(ELEMENTWISE).function("gate")(n, dev.buffer(x), y,
                                                          np.array([(n, 0.5)], PARAMS))])
    v = x.astype(np.float64) * 0.5
    want = (1 / (1 + np.exp(-v))) * np.tanh(v) + np.clip(v, -1, 1)
    np.testing.assert_allclose(cp.asnumpy(y.view(cp.float32)), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("cap", [1024, 64])
def test_block_sum_and_simdgroup_gemm_match_numpy(dev, cap):
    import cupy as cp

    d = metalcompute.Device(max_threads_per_threadgroup=cap, check_each_dispatch=True)
    x = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    fn = d.kernel(REDUCE).function("block_sum")
    tg = fn.threadgroup_size()
    out = d.buffer(4 * (-(-5000 // tg)))
    d.finish([fn(5000, x, out, np.array([5000], np.uint32))])
    sums = cp.asnumpy(out.view(cp.float32))
    want = np.add.reduceat(x.astype(np.float64), np.arange(0, 5000, tg))
    np.testing.assert_allclose(sums, want, rtol=1e-5, atol=1e-4)
    M, N, K = 37, 29, 19
    A = np.random.default_rng(3).standard_normal((M, K)).astype(np.float32)
    B = np.random.default_rng(4).standard_normal((K, N)).astype(np.float32)
    C = d.buffer(4 * M * N)
    blocks = -(-M // 16) * -(-N // 16)
    g = d.kernel(GEMM).function("gemm")
    d.finish([g(blocks * g.threadgroup_size(), A, B, C, np.array([M, N, K], np.uint32))])
    np.testing.assert_allclose(cp.asnumpy(C.view(cp.float32)).reshape(M, N), A.astype(np.float64) @ B,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("sizes", [dict(N=1, H=1), dict(N=31, H=32), dict(N=33, H=33),
                                   dict(N=32, H=31), dict(N=40, H=40)])  # the last: > 1024 threads
def test_every_cell_at_boundary_sizes_matches_the_reference(cell, sizes):
    rng = np.random.default_rng(sum(sizes.values()))
    for trial in range(3):
        desc = random_descriptor(rng, cell)
        case = random_case(rng, cell, T=3, I=5, descriptor=desc, dtype=np.float32, **sizes)
        for gradients in (False, True):
            worst, mismatches = check_case(case, "metal-cuda", gradients)
            assert not mismatches, f"{desc}: {[str(m) for m in mismatches]}"


@pytest.mark.parametrize("version", ["v1", "v3", "v4", "v5"])
@pytest.mark.parametrize("cap", [1024, 64])
@pytest.mark.parametrize("cell", CELLS)
def test_every_gemm_version_matches_the_reference(cell, cap, version):
    """Every product of the ops through one GEMM version (kernels/gemm.metal), at threadgroups
    as large as each kernel asks for and forced to 64 threads: T·N = 130 rows and G·H up to
    280 columns give several 64×64 tiles of v3 with tails; GRU without reset_after reads its
    dR in row blocks."""
    from rnngrad.backends.metal import versions
    from rnngrad.backends.metal.harness.contexts import cuda_device

    rng = np.random.default_rng(len(cell) + cap)
    extra = dict(reset_after=False) if cell == "gru" else {}
    desc = random_descriptor(rng, cell, bidirectional=True, training=True, **extra)
    case = random_case(rng, cell, descriptor=desc, T=10, N=13, I=65, H=70, dtype=np.float32)
    with versions.overrides(gemm=version), cuda_device(max_threads_per_threadgroup=cap,
                                               check_each_dispatch=True) as d:
        for gradients in (False, True):
            worst, mismatches = check_case(case, "metal-cuda", gradients)
            assert not mismatches, f"{version} {desc}: {[str(m) for m in mismatches]}"
    assert {x.kernel for x in d.trace if "gemm" in x.kernel} == {versions.GEMM_KERNELS[version]}


@pytest.mark.parametrize("cap", [1024, 64])
def test_wide_gemm_slices_of_k_match_the_reference(cap, monkeypatch, caplog, metal_rules):
    """v5 as the rule's tiled version with slices small enough to split the weight gradients
    of T·N = 520 rows (each split product: v5 over its slices, then v1 adding them in order),
    every cell against the reference."""
    from rnngrad.backends.metal.harness.contexts import cuda_device

    metal_rules(wide_min_groups=1, tiled_min_tiles=1, tiled_min_work=1, wide_min_slice=64)
    rng = np.random.default_rng(cap)
    for cell in CELLS:
        desc = random_descriptor(rng, cell, bidirectional=True, training=True)
        case = random_case(rng, cell, descriptor=desc, T=40, N=13, I=65, H=70, dtype=np.float32)
        caplog.clear()
        with caplog.at_level("DEBUG", logger="rnngrad.backends.metal"), \
                cuda_device(max_threads_per_threadgroup=cap, check_each_dispatch=True):
            for gradients in (False, True):
                worst, mismatches = check_case(case, "metal-cuda", gradients)
                assert not mismatches, f"{desc}: {[str(m) for m in mismatches]}"
        said = [r.getMessage() for r in caplog.records]
        split = [m for m in said if m.startswith("metal-cuda: v5 ") and "slices of" in m]
        sums = [m for m in said if m.startswith("metal-cuda: v1 ") and "the sum of" in m]
        assert split and len(sums) == len(split), said


def _one_step_trace(cell, cap, seed, H=70):
    """A one-step grid (the version the test set) on the GPU against the reference, forward and
    gradients: bidirectional, T = 6, N = 13, I = 9, H (a GRU with reset_after, which the grids
    need); the device, for its trace."""
    from rnngrad.backends.metal.harness.contexts import cuda_device

    rng = np.random.default_rng(seed)
    extra = dict(reset_after=True) if cell == "gru" else {}
    desc = random_descriptor(rng, cell, bidirectional=True, training=True, **extra)
    case = random_case(rng, cell, descriptor=desc, T=6, N=13, I=9, H=H, dtype=np.float32)
    with cuda_device(max_threads_per_threadgroup=cap, check_each_dispatch=True) as d:
        for gradients in (False, True):
            worst, mismatches = check_case(case, "metal-cuda", gradients)
            assert not mismatches, f"{desc}: {[str(m) for m in mismatches]}"
    return d


@pytest.mark.parametrize("cell, H, peephole", list(V2_SHAPES), ids=lambda v: str(v))
def test_v2_entry_points_match_the_reference(cell, H, peephole, monkeypatch):
    """Each v2 entry point the rule runs at (cell, H), forward and backward, on the GPU at the
    threadgroup size the rule chose it for: 26 rows (bidirectional, N = 13), every optional input
    (the LSTM's peephole as given), against the float64 reference; the trace names them."""
    from rnngrad.backends.metal.harness.contexts import cuda_device

    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    optional = {**ALL_OPTIONAL, "peephole": peephole} if cell == "lstm" else ALL_OPTIONAL
    rng = np.random.default_rng(H + peephole)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True,
                             **(dict(reset_after=True) if cell == "gru" else {}))
    case = random_case(rng, cell, descriptor=desc, T=6, N=13, I=9, H=H, dtype=np.float32,
                       optional=optional, cell_gradient_form="per_step")
    with cuda_device(check_each_dispatch=True) as d:
        for gradients in (False, True):
            worst, mismatches = check_case(case, "metal-cuda", gradients)
            assert not mismatches, f"{desc}: {[str(m) for m in mismatches]}"
    ran = {(x.kernel, x.threadgroup_size) for x in d.trace if "_v2_" in x.kernel}
    assert ran == {(k, 512 if k.endswith("_512") else 1024) for k in V2_SHAPES[(cell, H, peephole)]}


@pytest.mark.parametrize("cell", CELLS)
def test_v2_declined_on_smaller_threadgroups_runs_v1(cell, monkeypatch):
    """Pipelines capped at 64 threads (as a Mac may cap a pipeline that needs more registers):
    the v2 dispatches are declined, the host runs v1, and the results match the reference."""
    from rnngrad.backends.metal.backends import CUDA_HOST
    from rnngrad.backends.metal.harness.contexts import cuda_device

    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    rng = np.random.default_rng(7)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True,
                             **(dict(reset_after=True) if cell == "gru" else {}))
    case = random_case(rng, cell, descriptor=desc, T=6, N=13, I=9, H=64, dtype=np.float32,
                       optional=ALL_OPTIONAL)
    with cuda_device(max_threads_per_threadgroup=64, check_each_dispatch=True) as d:
        for gradients in (False, True):
            worst, mismatches = check_case(case, "metal-cuda", gradients)
            assert not mismatches, f"{desc}: {[str(m) for m in mismatches]}"
        declined = dict(CUDA_HOST.declined)
    assert declined and set(declined.values()) == {64}
    assert {x.kernel for x in d.trace} >= {f"{cell}_forward", f"{cell}_backward"}


@pytest.mark.parametrize("H", [70, 72])
@pytest.mark.parametrize("min_tiles", [1, 128])
@pytest.mark.parametrize("cap", [1024, 64])
@pytest.mark.parametrize("cell", CELLS)
def test_v3_matches_the_reference(cell, cap, min_tiles, H, monkeypatch, metal_rules):
    """v3's tiles on the GPU, one dispatch a step (the backward's last the carry alone): 13 rows
    a direction in one tile of 16, H = 70 in the widest blocks (min_tiles 1: 2 blocks of 35
    units, 5 blocks of 14 units × 4 gates forward for the LSTM and GRU; 36 or 56 workers, so
    at 64 threads one slice, at 256 a split of k) or the narrowest (min_tiles 128: 4 columns a
    tile, 70 or 18 blocks). H = 72 stages through float4 loads (rs_fetch), H = 70 through
    scalar ones (except the LSTM's backward, whose K = 4H is a multiple of 4 either way); 256
    threads hold a chunk's items in registers (rs_product's held path), 64 do not."""
    from rnngrad.backends.metal import versions

    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v3")
    metal_rules(v3_min_tiles=min_tiles)
    d = _one_step_trace(cell, cap, seed=len(cell) + cap + min_tiles + H, H=H)
    for direction, steps in (("forward", 6), ("backward", 7)):
        runs = [x for x in d.trace if x.kernel == f"{cell}_{direction}_v3"]
        row_tiles, blocks = versions.tile_blocks(cell=cell, direction=direction, D=2, N=13, H=H)
        assert len(runs) >= steps and len(runs) % steps == 0
        assert {x.count for x in runs} == {2 * row_tiles * blocks * versions.V3_THREADS}


@pytest.mark.parametrize("op", OPS)
def test_property_check_backend(op):
    """The regression set, then hypothesis over every descriptor option and optional input."""
    check_backend("metal-cuda", op, max_examples=60, dtypes=("float32",))


@pytest.mark.parametrize("cell", CELLS)
def test_gpu_inputs_give_gpu_results_equal_to_host_inputs(cell):
    import cupy as cp

    case = random_case(7, cell, T=4, N=3, I=5, H=6, dtype=np.float32)
    case.descriptor = __import__("dataclasses").replace(case.descriptor, training=True)
    host = case.forward(backend="metal-cuda")
    gpu_inputs = {k: cp.asarray(v) for k, v in case.inputs.items()}
    fn = getattr(rg, {"single_gate": "single_gate_rnn"}.get(cell, cell))
    gpu = fn(**gpu_inputs, descriptor=case.descriptor, backend="metal-cuda")
    for a, b in zip(gpu, host):
        assert isinstance(a, cp.ndarray) and isinstance(b, np.ndarray)
        assert np.array_equal(cp.asnumpy(a), b)
    with pytest.raises(ValueError, match="GPU memory and backend=None picks only host"):
        fn(**gpu_inputs, descriptor=case.descriptor)
    with pytest.raises(TypeError, match="'reference' computes on the host"):
        fn(**gpu_inputs, descriptor=case.descriptor, backend="reference")


def test_torch_cuda_tensors_are_read_in_place():
    torch = pytest.importorskip("torch")
    case = random_case(9, "lstm", T=3, N=2, I=4, H=5, dtype=np.float32)
    inputs = {k: torch.as_tensor(v, device="cuda") for k, v in case.inputs.items()}
    got = rg.lstm(**inputs, descriptor=case.descriptor, backend="metal-cuda")
    want = case.forward(backend="reference")
    import cupy as cp

    np.testing.assert_allclose(cp.asnumpy(got.state), want.state, rtol=2e-4, atol=5e-5)


def test_dispatches_per_op_match_the_cpu_harness_and_do_not_grow_with_T():
    from rnngrad.backends.metal.harness.contexts import cuda_device, emulated_device

    counts = {}
    for T in (3, 9):
        case = random_case(11, "gru", T=T, N=2, I=3, H=4, dtype=np.float32,
                           descriptor=rg.GRUDescriptor(training=True, bidirectional=True))
        for name, ctx in (("cuda", cuda_device), ("cpu", emulated_device)):
            with ctx() as d:
                backend = "metal-cuda" if name == "cuda" else "metal-emulated"
                case.gradients(backend)
                counts[(name, T)] = [x.kernel for x in d.trace]
    assert counts[("cuda", 3)] == counts[("cpu", 3)] == counts[("cuda", 9)]


def test_trace_keeps_the_newest_dispatches():
    check_trace_keeps_the_newest_dispatches(metalcompute, check_each_dispatch=True)


@pytest.mark.parametrize("timing", [True, False])
def test_prepared_calls_bind_their_open_slots(timing):
    import cupy as cp

    check_prepared_calls_bind_their_open_slots(metalcompute, cp.asnumpy, timing=timing)


@pytest.mark.parametrize("shape", [(2, 12, 4), (1, 3, 1), (33, 65), (2, 300, 100)])
def test_wrap_copies_a_view_with_its_last_axes_swapped(dev, shape):
    """wrap's copy of Rᵀ (its own kernel) and of another layout (CuPy's copy): each is the
    array's C-contiguous layout, bitwise."""
    import cupy as cp

    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    g = cp.asarray(a)
    swapped = g.swapaxes(-1, -2)
    assert metalcompute._swaps_last_axes(swapped) and not metalcompute._swaps_last_axes(g[..., ::2])
    for view, want in ((swapped, a.swapaxes(-1, -2)), (g[..., ::2], a[..., ::2])):
        got = dev.wrap(view)  # a float32 array that is C-contiguous already comes back as it is
        dev.synchronize()
        assert got.nbytes == want.nbytes and got.flags.c_contiguous
        np.testing.assert_array_equal(np.frombuffer(cp.asnumpy(got).tobytes(), np.float32),
                                      np.ascontiguousarray(want).reshape(-1))


def test_fetch_copies_after_the_calls_before_it(dev):
    """Device.fetch queues its copy behind the device's calls: what a kernel wrote is there once
    finish returns; a (buffer, offset) pair reads from that byte; each fetch keeps its own
    host memory, also past one pinned block."""
    import cupy as cp

    fn = dev.kernel(ELEMENTWISE).function("gate")
    n = 5000
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    y = dev.buffer(4 * n)
    handle = fn(n, dev.buffer(x), y, np.array([(n, 0.5)], PARAMS))
    whole, tail = dev.fetch(y, 4 * n), dev.fetch((y, 4 * 100), 4 * 10)
    large = dev.buffer(np.arange(metalcompute.STAGING_BYTES // 4 + 2, dtype=np.float32))
    big = dev.fetch(large, len(large))  # more than a pinned block: a block of its own
    dev.finish([handle])
    want = cp.asnumpy(y.view(cp.float32))
    np.testing.assert_array_equal(whole.view(np.float32), want)
    np.testing.assert_array_equal(tail.view(np.float32), want[100:110])
    np.testing.assert_array_equal(big.view(np.float32), cp.asnumpy(large.view(cp.float32)))
    assert dev.fetch(y, 0).size == 0


CONSTANTS = """#include <metal_stdlib>
using namespace metal;
struct Affine { uint n; float scale; float shift; uint steps; };
kernel void affine(constant Affine& p [[buffer(0)]], constant float* table [[buffer(1)]],
                   device float* y [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
    if (gid >= p.n) return;
    for (uint s = 0; s < p.steps; ++s) {
        y[gid] = y[gid] * p.scale + p.shift + table[s];  // p's fields read after each store
    }
}
"""
AFFINE = np.dtype([("n", np.uint32), ("scale", np.float32), ("shift", np.float32),
                   ("steps", np.uint32)])


def test_constant_structs_are_passed_by_value_from_any_argument(dev):
    """A `constant T&` buffer is the launcher's by-value parameter: host data, Device.constant and
    a GPU buffer (copied back) give the same result; a Constant bound to a pointer parameter is
    a GPU copy; bytes shorter than sizeof(T) are refused."""
    import cupy as cp

    fn = dev.kernel(CONSTANTS).function("affine")
    n, steps = 300, 5
    p = np.array([(n - 7, 0.5, 1.25, steps)], AFFINE)
    table = np.arange(1, steps + 1, dtype=np.float32)
    start = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    want = start.astype(np.float64)
    for s in range(steps):
        want[:n - 7] = want[:n - 7] * 0.5 + 1.25 + table[s]
    for how in ("host", "constant", "gpu buffer"):
        arg = {"host": p, "constant": dev.constant(p.view(np.uint8)),
               "gpu buffer": dev.buffer(p.view(np.uint8))}[how]
        y = dev.buffer(start)
        dev.finish([fn(n, arg, dev.constant(table), y)])
        np.testing.assert_allclose(cp.asnumpy(y.view(cp.float32)), want, rtol=1e-6,
                                   err_msg=how)
    with pytest.raises(metalcompute.error, match=r"buffer 0 is its `constant` struct: expected "
                                                  r"at least 16 bytes \(its sizeof\), got 12"):
        fn(n, p.view(np.uint8)[:12], table, dev.buffer(start))


def test_too_much_threadgroup_memory_is_refused(dev):
    fn = dev.kernel("""#include <metal_stdlib>
using namespace metal;
kernel void big(device float* y [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float t[8193];
    t[lid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[lid] = t[(lid + 1) % 32];
}
""").function("big")
    with pytest.raises(metalcompute.error, match="declares 32772 bytes of threadgroup memory; Apple GPUs allow 32768"):
        fn(32, dev.buffer(4 * 32))


#: the harness device and a kernel that writes far past its buffer: an illegal address
FAULT_SETUP = """
from rnngrad.backends.metal import cuda as metalcompute
dev = metalcompute.Device()
lib = dev.kernel('''#include <metal_stdlib>
using namespace metal;
kernel void calm(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    if (gid == 0) y[0] = 1.0f;
}
kernel void wild(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    y[gid * 1000000u] = 1.0f;
}''')
calm, wild = lib.function("calm"), lib.function("wild")
y = dev.buffer(16)
"""
#: after the fault: a later call, which the device must refuse
REFUSED_LATER = """
try:
    dev.buffer(4)
except metalcompute.error as exc:
    print("LATER:", exc)
"""
FAULT = FAULT_SETUP + """
try:
    dev.finish([wild(4096, y)])
except metalcompute.error as exc:
    print("FIRST:", exc)
""" + REFUSED_LATER
FAULT_AMONG_OTHERS = FAULT_SETUP + """
dev.finish([calm(32, y), calm(32, y)])
print("CALM: finished")
try:
    dev.finish([calm(32, y), wild(4096, y), calm(32, y)])
except metalcompute.error as exc:
    print("FIRST:", exc)
""" + REFUSED_LATER


def test_a_kernel_fault_names_the_kernel_and_the_device_refuses_later_calls():
    done = subprocess.run([sys.executable, "-c", FAULT], capture_output=True, text=True, timeout=300)
    assert "FIRST: kernel 'wild'" in done.stdout, done.stdout + done.stderr
    assert "CUDA context is now unusable" in done.stdout
    assert "LATER: this CUDA device is unusable" in done.stdout


def test_a_fault_before_the_last_call_raises_from_finish_on_the_gpu():
    """A fault in the middle call of three is raised by finish, which waits on the last only
    until a wait fails (tests/test_harness_cuda_finish.py on stand-in events); the error names one
    of the op's kernels (CUDA may report the fault to an earlier call's wait:
    check_each_dispatch names exactly), and the device refuses later calls."""
    done = subprocess.run([sys.executable, "-c", FAULT_AMONG_OTHERS], capture_output=True,
                          text=True, timeout=300)
    out = done.stdout + done.stderr
    assert "CALM: finished" in done.stdout, out
    assert re.search(r"FIRST: kernel '(wild|calm)' \(count \d+, threadgroup size \d+\) failed on "
                     r"the GPU", done.stdout), out
    assert "CUDA context is now unusable" in done.stdout, out
    assert "LATER: this CUDA device is unusable" in done.stdout, out


SIMDGROUP = """#include <metal_stdlib>
using namespace metal;
// out = (Aᵀ·B + I)ᵀ per SIMD-group, for every transposed / plain load and store.
kernel void tiles(const device float* A [[buffer(0)]], const device float* B [[buffer(1)]],
                  device float* out [[buffer(2)]], uint sg [[simdgroup_index_in_threadgroup]],
                  uint tg [[threadgroup_position_in_grid]], uint n_sg [[simdgroups_per_threadgroup]]) {
    const uint t = tg * n_sg + sg;
    simdgroup_float8x8 a, b, c(1.0f), d;
    simdgroup_load(a, A + 64 * t, 8, ulong2(0, 0), true);
    simdgroup_load(b, B + 64 * t, 8);
    simdgroup_multiply_accumulate(d, a, b, c);
    simdgroup_multiply(c, d, a);
    simdgroup_store(d, out + 128 * t, 8, ulong2(0, 0), true);
    simdgroup_store(c, out + 128 * t + 64, 8);
}
"""


def test_simdgroup_matrix_distributed_over_the_warp_equals_the_cpu_harness():
    """The CUDA target holds two elements of a tile per lane (Apple's layout); the CPU
    harness holds the whole tile per lane. Same results, loads and stores transposed or not."""
    import cupy as cp

    from rnngrad.backends.metal.harness import cpu

    tiles = 8  # SIMD-groups: 2 threadgroups of 4 at a forced size of 128
    A = np.random.default_rng(5).standard_normal(64 * tiles).astype(np.float32)
    B = np.random.default_rng(6).standard_normal(64 * tiles).astype(np.float32)
    results = []
    for target in (metalcompute, cpu):
        d = target.Device(max_threads_per_threadgroup=128)
        out = d.buffer(4 * 128 * tiles)
        handle = d.kernel(SIMDGROUP).function("tiles")(32 * tiles, A, B, out)
        if hasattr(d, "finish"):
            d.finish([handle])
        results.append(cp.asnumpy(out.view(cp.float32)) if target is metalcompute
                       else np.frombuffer(out, np.float32).copy())
    a = A.reshape(tiles, 8, 8).astype(np.float64).transpose(0, 2, 1)
    b = B.reshape(tiles, 8, 8).astype(np.float64)
    d_ = a @ b + np.eye(8)
    want = np.concatenate([d_.transpose(0, 2, 1).reshape(tiles, 64), (d_ @ a).reshape(tiles, 64)], 1)
    for got in results:
        np.testing.assert_allclose(got.reshape(tiles, 128), want, rtol=1e-5, atol=1e-5)


SHUFFLE_XOR = """#include <metal_stdlib>
using namespace metal;
// out[i][m][lane] = simd_shuffle_xor of each type's value at lane, mask masks[m]
kernel void xor_shuffles(const device float* x [[buffer(0)]], device float* out [[buffer(1)]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint gid [[thread_position_in_grid]]) {
    if (gid >= 64) {
        return;  // two SIMD-groups, whole ones: the threadgroup's others
    }
    const ushort masks[8] = {1, 2, 4, 8, 16, 31, 32, 40};
    uint base = (gid / 32) * 32 * 8 * 4;
    for (uint m = 0; m < 8; ++m) {
        float f = simd_shuffle_xor(x[gid], masks[m]);
        float2 f2 = simd_shuffle_xor(float2(x[gid], -2.0f * x[gid]), masks[m]);
        int k = simd_shuffle_xor(int(lane) * 3 - 7, masks[m]);
        out[base + (0 * 8 + m) * 32 + lane] = f;
        out[base + (1 * 8 + m) * 32 + lane] = f2.x;
        out[base + (2 * 8 + m) * 32 + lane] = f2.y;
        out[base + (3 * 8 + m) * 32 + lane] = float(k);
    }
}
"""


def test_simd_shuffle_xor_takes_the_partner_lanes_value_and_keeps_its_own_past_lane_31(dev):
    """The CUDA target's simd_shuffle_xor (a warp butterfly, a word at a time) for a float, a
    float2 and an int: lane l gets lane l ^ m's value, its own where l ^ m is past 31 (Metal's
    rule), against numpy's indexing."""
    import cupy as cp

    warps = 2
    x = np.random.default_rng(7).standard_normal(32 * warps).astype(np.float32)
    out = dev.buffer(4 * warps * 32 * 8 * 4)
    dev.finish([dev.kernel(SHUFFLE_XOR).function("xor_shuffles")(32 * warps, x, out)])
    got = cp.asnumpy(out.view(cp.float32)).reshape(warps, 4, 8, 32)
    lane = np.arange(32)
    for w in range(warps):
        xs = x[32 * w: 32 * w + 32]
        for m, mask in enumerate((1, 2, 4, 8, 16, 31, 32, 40)):
            src = np.where((lane ^ mask) < 32, lane ^ mask, lane)
            np.testing.assert_array_equal(got[w, 0, m], xs[src])
            np.testing.assert_array_equal(got[w, 1, m], xs[src])
            np.testing.assert_array_equal(got[w, 2, m], -2.0 * xs[src])
            np.testing.assert_array_equal(got[w, 3, m], (src * 3 - 7).astype(np.float32))
