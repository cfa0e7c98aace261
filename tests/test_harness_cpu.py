"""The CPU Metal harness (rnngrad.backends.metal.harness.cpu): metalcompute's API, exact dispatch, defects.

Correct kernels are compared with NumPy; each deliberately broken kernel must be caught.
"""

from __future__ import annotations

import os
import stat
import sys
from array import array
from pathlib import Path

import numpy as np
import pytest

from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal.harness.cpu import _loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the verification/ package
from verification.gpu_sanitize import DEFECTS  # noqa: E402

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"
RNG = np.random.default_rng(20240611)

ELEMENTWISE = HEADER + """
struct Params { uint n; float scale; };
kernel void gate(const device float* x [[buffer(0)]],
                 device float* y [[buffer(1)]],
                 constant Params& p [[buffer(2)]],
                 uint gid [[thread_position_in_grid]]) {
    if (gid >= p.n) return;
    float v = x[gid] * p.scale;
    float s = select(1.0f / (1.0f + exp(-v)), exp(v) / (1.0f + exp(v)), v < 0.0f);
    y[gid] = fma(s, metal::precise::tanh(v), clamp(v, -1.0f, 1.0f));
}
"""

PARAMS = np.dtype([("n", np.uint32), ("scale", np.float32)])

REDUCE = HEADER + """
// out[tg] = sum of x over threadgroup tg: simd_sum per SIMD-group, then a tree in threadgroup
// memory over the SIMD-group partials.
kernel void block_sum(const device float* x [[buffer(0)]],
                      device float* out [[buffer(1)]],
                      constant uint& n [[buffer(2)]],
                      uint gid [[thread_position_in_grid]],
                      uint lid [[thread_position_in_threadgroup]],
                      uint tg [[threadgroup_position_in_grid]],
                      uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]],
                      uint n_sg [[simdgroups_per_threadgroup]]) {
    threadgroup float partial[32];
    float s = simd_sum(gid < n ? x[gid] : 0.0f);
    if (lane == 0) partial[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint stride = 16; stride > 0; stride >>= 1) {
        if (lid < stride && lid + stride < n_sg) partial[lid] += partial[lid + stride];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (lid == 0) out[tg] = partial[0];
}
"""

GEMM = HEADER + """
// C[M,N] = A[M,K] . B[K,N], row-major. One threadgroup per 16x16 block of C; A and B tiles are
// staged in threadgroup memory (zero-padded at the edges); each SIMD-group multiplies 8x8 tiles
// with simdgroup_matrix and works for any threadgroup size.
struct Dims { uint M, N, K; };
kernel void gemm(const device float* A [[buffer(0)]],
                 const device float* B [[buffer(1)]],
                 device float* C [[buffer(2)]],
                 constant Dims& d [[buffer(3)]],
                 uint tg [[threadgroup_position_in_grid]],
                 uint lid [[thread_position_in_threadgroup]],
                 uint tpg [[threads_per_threadgroup]],
                 uint sg [[simdgroup_index_in_threadgroup]],
                 uint n_sg [[simdgroups_per_threadgroup]]) [[max_total_threads_per_threadgroup(128)]] {
    threadgroup float As[16][8];
    threadgroup float Bs[8][16];
    threadgroup float Cs[16][16];
    const uint blocks_n = (d.N + 15) / 16;
    const uint row0 = (tg / blocks_n) * 16, col0 = (tg % blocks_n) * 16;
    simdgroup_float8x8 acc[4];
    for (uint t = 0; t < 4; ++t) acc[t] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    for (uint k0 = 0; k0 < d.K; k0 += 8) {
        for (uint i = lid; i < 128; i += tpg) {
            uint r = i / 8, c = i % 8;
            As[r][c] = (row0 + r < d.M && k0 + c < d.K) ? A[(row0 + r) * d.K + k0 + c] : 0.0f;
            uint rb = i / 16, cb = i % 16;
            Bs[rb][cb] = (k0 + rb < d.K && col0 + cb < d.N) ? B[(k0 + rb) * d.N + col0 + cb] : 0.0f;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint t = sg; t < 4; t += n_sg) {
            simdgroup_float8x8 a, b;
            simdgroup_load(a, &As[0][0], 8, ulong2(0, (t / 2) * 8));
            simdgroup_load(b, &Bs[0][0], 16, ulong2((t % 2) * 8, 0));
            simdgroup_multiply_accumulate(acc[t], a, b, acc[t]);
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint t = sg; t < 4; t += n_sg)
        simdgroup_store(acc[t], &Cs[0][0], 16, ulong2((t % 2) * 8, (t / 2) * 8));
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = lid; i < 256; i += tpg) {
        uint r = i / 16, c = i % 16;
        if (row0 + r < d.M && col0 + c < d.N) C[(row0 + r) * d.N + col0 + c] = Cs[r][c];
    }
}
"""


def floats(buf, n=None) -> np.ndarray:
    return np.frombuffer(buf, np.float32, count=-1 if n is None else n)


@pytest.fixture(scope="module")
def dev():
    return metalcompute.Device()


# ----------------------------------------------------------------------------- API and dispatch
def test_readme_example_runs_unchanged():
    """metalcompute's README example, verbatim apart from choosing the two sizes it leaves open.

    Its kernel has no bounds check, so on the padded grid (1024 threads for 2 values) it reads
    past its 8-byte input. Metal allocates whole pages and lets that pass; the harness does the
    same with guard_pages=False, and reports it by default (next test).
    """
    class mc:  # the module as the README imports it, with Metal's buffer layout
        get_devices = staticmethod(metalcompute.get_devices)
        error = metalcompute.error

        @staticmethod
        def Device(*args):
            return metalcompute.Device(*args, guard_pages=False)

    kernel_call_count, out_size = 2, 2 * 4
    devices = mc.get_devices()
    dev = mc.Device()
    program = """
#include <metal_stdlib>
using namespace metal;

kernel void test(const device float *in [[ buffer(0) ]],
                device float  *out [[ buffer(1) ]],
                uint id [[ thread_position_in_grid ]]) {
    out[id] = sin(in[id]);
}
"""
    function_name = "test"
    kernel_fn = dev.kernel(program).function(function_name)
    buf_0 = array('f', [1.0, 3.14159])
    buf_n = dev.buffer(out_size)
    run_handle = kernel_fn(kernel_call_count, buf_0, buf_n)
    del run_handle
    assert len(devices) == 1
    np.testing.assert_allclose(memoryview(buf_n).cast('f').tolist(), np.sin(np.array(buf_0)),
                               rtol=1e-6)


def test_readme_example_overrun_is_reported_by_default(dev):
    fn = dev.kernel(HEADER + """
kernel void test(const device float *in [[ buffer(0) ]], device float *out [[ buffer(1) ]],
                 uint id [[ thread_position_in_grid ]]) { out[id] = sin(in[id]); }
""").function("test")
    with pytest.raises(metalcompute.error, match=r"kernel 'test'.*byte 8 of buffer 0, which has 8 bytes"):
        fn(2, array('f', [1.0, 3.14159]), dev.buffer(8))


def _unmapped_above(addr: int, step: int = 1 << 24) -> int:
    """The first multiple of ``step`` bytes past ``addr`` (and past its guard page) that no
    mapping of this process covers, from /proc/self/maps."""
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        spans.append((lo, hi))
    gap = step
    while any(lo <= addr + gap + 4 < hi or lo <= addr + gap < hi for lo, hi in spans):
        gap += step
    return gap


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
def test_overrun_past_the_guard_page_names_the_nearest_buffer(dev):
    """A read so far past a buffer's end that it skips the guard page still names the buffer it
    came from (the nearest one below the address), with how far past its end it landed."""
    fn = dev.kernel(HEADER + """
kernel void test(const device float *in [[ buffer(0) ]], device float *out [[ buffer(1) ]],
                 constant ulong &gap [[ buffer(2) ]], uint id [[ thread_position_in_grid ]]) {
    out[id] = in[gap / 4 + id];
}
""").function("test")
    bufs = [dev.buffer(np.arange(4, dtype=np.float32)), dev.buffer(4), dev.buffer(8)]
    gap = _unmapped_above(bufs[0]._mc_addr)
    np.frombuffer(bufs[2], np.uint64)[0] = gap + 16
    with pytest.raises(metalcompute.error) as info:
        fn(1, *bufs)
    msg = str(info.value)
    assert "invalid memory access" in msg, msg
    # another buffer may lie between the input and the address: the nearest below it is named
    addr = bufs[0]._mc_addr + gap + 16
    index = min((i for i, b in enumerate(bufs) if b._mc_addr + b.nbytes <= addr),
                key=lambda i: addr - bufs[i]._mc_addr - bufs[i].nbytes)
    past = addr - bufs[index]._mc_addr - bufs[index].nbytes
    assert f"{past} bytes past the end of buffer {index} ({bufs[index].nbytes} bytes)" in msg, msg


def test_elementwise_with_tail_matches_numpy(dev):
    n = 3000  # not a multiple of the threadgroup size: the last threadgroup is padded
    x = RNG.standard_normal(n, dtype=np.float32) * 4
    y = dev.buffer(4 * (n + 64))
    floats(y)[:] = -7.0  # sentinel beyond n: padded threads must not write
    params = np.array([(n, 1.5)], PARAMS)
    fn = dev.kernel(ELEMENTWISE).function("gate")
    fn(n, dev.buffer(x), y, params)
    v = x.astype(np.float64) * 1.5
    expected = 1 / (1 + np.exp(-v)) * np.tanh(v) + np.clip(v, -1, 1)
    np.testing.assert_allclose(floats(y, n), expected, rtol=2e-6, atol=2e-6)
    assert np.all(floats(y)[n:] == -7.0)
    assert dev.trace[-1][:4] == ("gate", n, 1024, 3) and dev.trace[-1].path == "loop"


def test_block_sum_matches_numpy_under_every_schedule():
    n = 5000
    x = RNG.standard_normal(n, dtype=np.float32)
    for device in (metalcompute.Device(), metalcompute.Device(schedule="reverse"),
                   metalcompute.Device(schedule="adversarial", seed=3),
                   metalcompute.Device(max_threads_per_threadgroup=64)):
        fn = device.kernel(REDUCE).function("block_sum")
        tg = fn.threadgroup_size()
        out = device.buffer(4 * -(-n // tg))
        fn(n, device.buffer(x), out, np.array([n], np.uint32))
        padded = np.zeros(-(-n // tg) * tg, np.float64)
        padded[:n] = x
        np.testing.assert_allclose(floats(out), padded.reshape(-1, tg).sum(1), rtol=1e-5, atol=1e-4)
        assert device.trace[-1].path == "fibers" and device.trace[-1].threadgroup_memory == 128


@pytest.mark.parametrize("max_threads", [1024, 64, 32])
def test_tiled_simdgroup_matrix_gemm_matches_numpy(max_threads):
    dev = metalcompute.Device(max_threads_per_threadgroup=max_threads, schedule="adversarial", seed=1)
    M, N, K = 37, 29, 21
    A = RNG.standard_normal((M, K), dtype=np.float32)
    B = RNG.standard_normal((K, N), dtype=np.float32)
    C = dev.buffer(4 * M * N)
    fn = dev.kernel(GEMM).function("gemm")
    assert fn.max_total_threads_per_threadgroup == 128
    blocks = -(-M // 16) * -(-N // 16)
    tg = fn.threadgroup_size()
    fn(blocks * tg, dev.buffer(A), dev.buffer(B), C, np.array([M, N, K], np.uint32))
    assert tg == min(128, max_threads)
    np.testing.assert_allclose(floats(C).reshape(M, N), A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


def test_barriers_inside_helper_functions_select_the_fiber_path(dev):
    src = HEADER + """
inline float neighbour(threadgroup float* t, uint lid, uint tpg) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return t[(lid + 1) % tpg];
}
inline float twice(float v) { return 2.0f * v; }
kernel void shift(device float* y [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                  uint tpg [[threads_per_threadgroup]], uint gid [[thread_position_in_grid]]) {
    threadgroup float t[1024];
    t[lid] = float(gid);
    y[gid] = neighbour(t, lid, tpg);
}
kernel void scale(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    y[gid] = twice(y[gid]);
}
"""
    kernel = dev.kernel(src)
    y = dev.buffer(4 * 2048)
    kernel.function("shift")(2048, y)
    kernel.function("scale")(2048, y)
    gid = np.arange(2048).reshape(2, 1024)
    assert np.array_equal(floats(y), 2 * np.roll(gid, -1, axis=1).ravel().astype(np.float32))
    assert [d.path for d in dev.trace[-2:]] == ["fibers", "loop"]


def test_buffers_are_zero_copy_views_and_other_arguments_are_copied(dev):
    fn = dev.kernel(HEADER + """
kernel void bump(device float* a [[buffer(0)]], device float* b [[buffer(1)]],
                 uint gid [[thread_position_in_grid]]) {
    if (gid < 4) { a[gid] += 1.0f; b[gid] += 1.0f; }
}
""").function("bump")
    host = np.zeros(4, np.float32)
    shared = dev.buffer(host)
    view = np.frombuffer(shared, np.float32)
    fn(4, host, shared)
    fn(4, host, shared)
    assert np.all(view == 2.0) and np.all(host == 0.0)
    assert len(shared) == 16 and repr(shared) == "metalcompute.Buffer(length=16)"


def test_threadgroup_size_follows_metalcompute_rule(dev):
    src = HEADER + """
kernel void sizes(device uint* out [[buffer(0)]], uint gid [[thread_position_in_grid]],
                  uint tpg [[threads_per_threadgroup]], uint ntg [[threadgroups_per_grid]])
                  [[max_total_threads_per_threadgroup(200)]] {
    out[gid] = tpg * 1000 + ntg;
}
"""
    fn = dev.kernel(src).function("sizes")
    out = dev.buffer(4 * 192 * 3)  # the padded grid: every thread of 3 threadgroups runs
    fn(400, out)
    assert np.all(np.frombuffer(out, np.uint32) == 192 * 1000 + 3)
    assert dev.trace[-1][:4] == ("sizes", 400, 192, 3)
    dev.trace.clear()
    assert dev.trace == []


def check_trace_keeps_the_newest_dispatches(module, **options):
    """A device of harness target ``module`` keeps the newest ``trace_limit`` dispatches, takes
    slices of its trace, and refuses a bad limit naming the argument (shared with the CUDA tests)."""
    dev = module.Device(trace_limit=3, **options)
    fn = dev.kernel(ELEMENTWISE).function("gate")
    y = dev.buffer(4 * 16)
    x = dev.buffer(np.ones(16, np.float32))
    for n in range(1, 8):
        fn(n, x, y, np.array([(n, 1.0)], PARAMS))
    assert [d.count for d in dev.trace] == [5, 6, 7]
    assert [d.count for d in dev.trace[-2:]] == [6, 7] and dev.trace[0].count == 5
    dev.trace.clear()
    assert dev.trace == [] and len(dev.trace) == 0
    everything = module.Device(trace_limit=None, **options)
    fn = everything.kernel(ELEMENTWISE).function("gate")
    for n in range(1, 6):
        fn(n, x, y, np.array([(n, 1.0)], PARAMS))
    assert [d.count for d in everything.trace] == [1, 2, 3, 4, 5]
    assert module.Device(**options).trace.maxlen == 4096
    for bad in (0, -1, 2.5, "8"):
        with pytest.raises(module.error, match=r"trace_limit: expected an int >= 1 or None .*got"):
            module.Device(trace_limit=bad, **options)


def test_trace_keeps_the_newest_dispatches():
    check_trace_keeps_the_newest_dispatches(metalcompute)


def check_prepared_calls_bind_their_open_slots(module, to_host, **options):
    """``Function.prepare`` (beyond metalcompute's API) on a device of harness target
    ``module``: a prepared call computes what a plain call does, binds a ``(buffer, byte
    offset)`` slot at that byte, keeps its fixed buffers across calls and refuses a wrong
    number of open buffers (shared with the CUDA tests). ``to_host``: a buffer's bytes as
    NumPy."""
    dev = module.Device(**options)
    fn = dev.kernel(ELEMENTWISE).function("gate")
    n = 300
    x = RNG.standard_normal(n).astype(np.float32) * 3
    xb = dev.buffer(x)
    want = dev.buffer(4 * n)
    fn(n, xb, want, np.array([(n, 0.75)], PARAMS))
    prepared = fn.prepare(n, None, None, np.array([(n, 0.75)], PARAMS))
    assert prepared.open == (0, 1) and prepared.tg == fn.threadgroup_size()
    y = dev.buffer(4 * n)
    handles = [prepared(xb, y)]
    # a (buffer, offset) slot: the result lands from byte 256 on, the bytes before it stay
    big = dev.buffer(np.full(n + 64, 7.0, np.float32))
    handles.append(prepared(xb, (big, 256)))
    # the struct was bound once: a second call with other buffers uses it still
    x2 = dev.buffer(-x)
    y2 = dev.buffer(4 * n)
    handles.append(prepared(x2, y2))
    if hasattr(dev, "finish"):
        dev.finish(handles)
    expect = to_host(want).view(np.float32)
    np.testing.assert_array_equal(to_host(y).view(np.float32), expect)
    got = to_host(big).view(np.float32)
    np.testing.assert_array_equal(got[64:], expect)
    assert (got[:64] == 7.0).all()
    plain = dev.buffer(4 * n)
    handles = [fn(n, x2, plain, np.array([(n, 0.75)], PARAMS))]
    if hasattr(dev, "finish"):
        dev.finish(handles)
    np.testing.assert_array_equal(to_host(y2).view(np.float32), to_host(plain).view(np.float32))
    assert not np.array_equal(to_host(y2), to_host(y))
    with pytest.raises(module.error, match=r"kernel 'gate': its prepared call has 2 open "
                                           r"buffer\(s\), got 1"):
        prepared(xb)


def test_prepared_calls_bind_their_open_slots():
    check_prepared_calls_bind_their_open_slots(metalcompute, lambda b: np.array(b, np.uint8))


def test_call_errors_name_what_was_expected(dev):
    fn = dev.kernel(ELEMENTWISE).function("gate")
    with pytest.raises(metalcompute.error, match=r"reads \[\[buffer\(2\)\]\] but the call passed 2"):
        fn(4, dev.buffer(16), dev.buffer(16))
    with pytest.raises(metalcompute.error, match="Function not found.*'nope'.*gate"):
        dev.kernel(ELEMENTWISE).function("nope")
    with pytest.raises(metalcompute.error, match="schedule"):
        metalcompute.Device(schedule="random")
    with pytest.raises(metalcompute.error, match="multiple of 32"):
        metalcompute.Device(max_threads_per_threadgroup=48)


def test_vector_types_and_half_have_msl_layout(dev):
    fn = dev.kernel(HEADER + """
kernel void vecs(const device float4* x [[buffer(0)]], device half* h [[buffer(1)]],
                 device float3* f3 [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
    if (gid >= 8) return;
    float4 v = x[gid];
    float2 lo = v.xy;
    v.zw = lo * 2.0f;
    h[gid] = half(v.x + v.y + v.z + v.w);
    f3[gid] = float3(v.xy, dot(v, v));
}
""").function("vecs")
    x = RNG.standard_normal((8, 4), dtype=np.float32)
    h, f3 = dev.buffer(2 * 8), dev.buffer(16 * 8)
    fn(8, x, h, f3)
    v = x.copy()
    v[:, 2:] = 2 * v[:, :2]
    assert np.array_equal(np.frombuffer(h, np.float16), v.sum(1, dtype=np.float32).astype(np.float16))
    f = floats(f3).reshape(8, 4)
    np.testing.assert_allclose(f[:, :3], np.c_[v[:, :2], (v * v).sum(1)], rtol=1e-6)


# ----------------------------------------------------------------------------- defects
# The write-after-read race that compute-sanitizer's racecheck is shown on the GPU machine
# (verification/gpu_sanitize.py): each step publishes a value, waits, then reads the next
# SIMD-group's value, and the barrier that should follow the read is missing.
RACE = DEFECTS["race"][0]


def race_reference(tpg: int) -> np.ndarray:
    v = np.arange(tpg, dtype=np.float32)
    for _ in range(4):
        v = v[np.minimum(np.arange(tpg) + 32, tpg - 1)] + 1
    return v


def test_write_after_read_race_is_exposed_by_the_adversarial_schedule():
    plain = metalcompute.Device(max_threads_per_threadgroup=256)
    out = plain.buffer(4 * 256)
    plain.kernel(RACE).function("race")(256, out)
    assert np.array_equal(floats(out), race_reference(256))  # ascending order hides the race
    caught = []
    for seed in range(4):
        dev = metalcompute.Device(max_threads_per_threadgroup=256, schedule="adversarial", seed=seed)
        out = dev.buffer(4 * 256)
        dev.kernel(RACE).function("race")(256, out)
        caught.append(not np.array_equal(floats(out), race_reference(256)))
    assert any(caught), "the adversarial schedule never exposed the missing barrier"


def test_read_before_write_sees_nan_poison(dev):
    fn = dev.kernel(HEADER + """
// No barrier between the write and the neighbour's read.
kernel void unsynced(device float* out [[buffer(0)]], uint lid [[thread_position_in_threadgroup]],
                     uint gid [[thread_position_in_grid]]) {
    threadgroup float t[1024];
    t[lid] = 1.0f;
    out[gid] = t[lid ^ 1];
}
""").function("unsynced")
    out = dev.buffer(4 * 1024)
    fn(1024, out)
    assert np.isnan(floats(out)).any()


def test_kernel_assuming_its_threadgroup_size_is_exposed():
    src = HEADER + """
// Assumes 1024 threads per threadgroup instead of reading [[threads_per_threadgroup]].
kernel void sum1024(const device float* x [[buffer(0)]], device float* out [[buffer(1)]],
                    uint lid [[thread_position_in_threadgroup]], uint gid [[thread_position_in_grid]],
                    uint tg [[threadgroup_position_in_grid]]) {
    threadgroup float t[1024];
    t[lid] = x[gid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = 512; s > 0; s >>= 1) {
        if (lid < s) t[lid] += t[lid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (lid == 0) out[tg] = t[0];
}
"""
    x = np.ones(1024, np.float32)
    results = []
    for cap in (1024, 64):
        dev = metalcompute.Device(max_threads_per_threadgroup=cap)
        out = dev.buffer(4 * (1024 // cap))
        dev.kernel(src).function("sum1024")(1024, x, out)
        results.append(floats(out)[0])
    assert results[0] == 1024.0
    assert not results[1] == 64.0  # NaN from threadgroup memory no thread wrote


def test_out_of_bounds_write_faults_and_names_buffer_and_kernel(dev):
    fn = dev.kernel(HEADER + """
kernel void unchecked(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                      uint gid [[thread_position_in_grid]]) {
    y[gid] = 2.0f * x[gid % 100];
}
""").function("unchecked")
    y = dev.buffer(4 * 100)
    with pytest.raises(metalcompute.error,
                       match=r"kernel 'unchecked'.*SIGSEGV.*byte 400 of buffer 1, which has 400 bytes"):
        fn(100, dev.buffer(4 * 100), y)
    fn_ok = dev.kernel(ELEMENTWISE).function("gate")  # the process and the harness still work
    fn_ok(1, dev.buffer(4), dev.buffer(4), np.array([(1, 1.0)], PARAMS))


def test_wild_pointer_crash_is_reported_not_fatal(dev):
    fn = dev.kernel(HEADER + """
kernel void wild(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    threadgroup_barrier(mem_flags::mem_none);
    device float* p = (device float*)(ulong)(16u + uint(y[0]) * 0u);
    if (gid == 37) *p = 1.0f;
}
""").function("wild")
    with pytest.raises(metalcompute.error, match=r"kernel 'wild'.*SIGSEGV.*GPU thread 37"):
        fn(64, dev.buffer(4))


def test_barrier_not_reached_by_every_thread(dev):
    fn = dev.kernel(HEADER + """
kernel void early_exit(device float* y [[buffer(0)]], constant uint& n [[buffer(1)]],
                       uint gid [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float t[1024];
    if (gid >= n) return;
    t[lid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[gid] = t[lid];
}
""").function("early_exit")
    with pytest.raises(metalcompute.error,
                       match=r"threadgroup_barrier \(line 9\) was reached by 1000 of 1024 threads"):
        fn(1000, dev.buffer(4 * 1000), np.array([1000], np.uint32))


def test_divergent_simd_collective(dev):
    fn = dev.kernel(HEADER + """
kernel void half_lanes(device float* y [[buffer(0)]], uint lane [[thread_index_in_simdgroup]],
                       uint gid [[thread_position_in_grid]]) {
    float s = 0.0f;
    if (lane < 16) s = simd_sum(1.0f);
    if (gid < 32) y[gid] = s;
}
""").function("half_lanes")
    with pytest.raises(metalcompute.error, match=r"divergent SIMD collective.*simd_sum \(line 7\).*lane 16 had returned.*16 of 32"):
        fn(32, dev.buffer(4 * 32))


def test_too_much_threadgroup_memory(dev):
    fn = dev.kernel(HEADER + """
kernel void big(device float* y [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float a[4096];
    threadgroup float b[4100];
    a[lid] = 0.0f; b[lid] = 0.0f;
}
""").function("big")
    with pytest.raises(metalcompute.error, match=r"kernel 'big'.*at least 32784 bytes.*at most 32768"):
        fn(32, dev.buffer(4))


# ----------------------------------------------------------------------------- build errors and cache
def test_compile_error_shows_metal_line_numbers(dev):
    src = HEADER + "kernel void bad(device float* y [[buffer(0)]]) {\n    y[0] = undefined_name;\n}\n"
    with pytest.raises(metalcompute.error, match=r"program\.metal:4:\d+: error: .*undefined_name"):
        dev.kernel(src)


def test_missing_compiler_says_what_to_install(dev, monkeypatch):
    monkeypatch.setattr(_loader, "_compiler_cache", {})
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(metalcompute.error, match=r"found none.*apt-get install g\+\+"):
        dev.kernel(HEADER + "kernel void k(device float* y [[buffer(0)]]) { y[0] = 1.0f; }\n")


def test_cache_directory_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = _loader.cache_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    os.chmod(path, 0o777)
    with pytest.raises(_loader.CompileError, match="refusing to load compiled kernels"):
        _loader.cache_dir()
