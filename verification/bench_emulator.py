"""Throughput of the CPU Metal harness (rnngrad.backends.metal.harness.cpu), in GPU threads per second.

Each kernel is checked against NumPy before it is timed. Targets: barrier-free kernels at tens
of millions of GPU threads per second (plain-loop path); kernels with 8 barriers per thread at
least 0.1 million GPU threads per second (one fiber per GPU thread).

    python verification/bench_emulator.py
"""

from __future__ import annotations

import time

import numpy as np

from rnngrad.backends.metal.harness import cpu as metalcompute

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"

ELEMENTWISE = HEADER + """
kernel void axpb(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                 constant uint& n [[buffer(2)]], uint gid [[thread_position_in_grid]]) {
    if (gid < n) y[gid] = 2.0f * x[gid] + 1.0f;
}
"""

# 8 barrier-separated steps, each reading a neighbour's value from threadgroup memory: the
# shape of a recurrence that keeps its state in threadgroup memory across time steps.
STEPS = HEADER + """
kernel void steps(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                  uint gid [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]],
                  uint tpg [[threads_per_threadgroup]]) {
    threadgroup float h[1024];
    float v = x[gid];
    for (uint t = 0; t < 4; ++t) {
        h[lid] = v;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        v = 0.5f * v + 0.25f * h[(lid + 1) % tpg];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    y[gid] = v;
}
"""

SIMD = HEADER + """
kernel void simd_steps(const device float* x [[buffer(0)]], device float* y [[buffer(1)]],
                       uint gid [[thread_position_in_grid]]) {
    float v = x[gid];
    for (uint t = 0; t < 8; ++t) v = 0.5f * v + simd_sum(v) * (1.0f / 64.0f);
    y[gid] = v;
}
"""


def steps_reference(x: np.ndarray, tpg: int) -> np.ndarray:
    v = x.reshape(-1, tpg).astype(np.float32)  # [groups, tpg]
    for _ in range(4):
        v = 0.5 * v + 0.25 * np.roll(v, -1, axis=1)
    return v.ravel()


def simd_reference(x: np.ndarray) -> np.ndarray:
    v = x.reshape(-1, 32).astype(np.float64)  # [simdgroups, 32]
    for _ in range(8):
        v = 0.5 * v + v.sum(1, keepdims=True) / 64
    return v.ravel()


def timed(fn, count, *buffers, repeats=3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(count, *buffers)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    dev = metalcompute.Device()
    rng = np.random.default_rng(0)
    rows = []

    n = 1 << 24
    x = dev.buffer(rng.standard_normal(n, dtype=np.float32))
    y = dev.buffer(4 * n)
    fn = dev.kernel(ELEMENTWISE).function("axpb")
    count = np.array([n], np.uint32)
    fn(n, x, y, count)
    np.testing.assert_allclose(np.frombuffer(y, np.float32), 2 * np.frombuffer(x, np.float32) + 1)
    rows.append(("elementwise (plain loop)", n, 0, timed(fn, n, x, y, count), dev.trace[-1].path))

    n = 1 << 16
    xs = rng.standard_normal(n, dtype=np.float32)
    x, y = dev.buffer(xs), dev.buffer(4 * n)
    fn = dev.kernel(STEPS).function("steps")
    fn(n, x, y)
    np.testing.assert_allclose(np.frombuffer(y, np.float32), steps_reference(xs, 1024), rtol=1e-5, atol=1e-6)
    rows.append(("threadgroup steps", n, 8, timed(fn, n, x, y), dev.trace[-1].path))

    fn = dev.kernel(SIMD).function("simd_steps")
    fn(n, x, y)
    np.testing.assert_allclose(np.frombuffer(y, np.float32), simd_reference(xs), rtol=1e-4, atol=1e-5)
    rows.append(("simd_sum steps", n, 8, timed(fn, n, x, y), dev.trace[-1].path))

    print(f"{'kernel':<26} {'path':<7} {'GPU threads':>12} {'syncs/thread':>13} {'seconds':>9} "
          f"{'M threads/s':>12}")
    for name, threads, syncs, seconds, path in rows:
        print(f"{name:<26} {path:<7} {threads:>12} {syncs:>13} {seconds:>9.4f} "
              f"{threads / seconds / 1e6:>12.2f}")


if __name__ == "__main__":
    main()
