"""verification/kernel_resources.py: ptxas's register and local-memory report of the Metal
kernels as the CUDA target compiles them, on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "verification"))

import kernel_resources as kr  # noqa: E402

from rnngrad.backends.metal import library, versions  # noqa: E402
from rnngrad.backends.metal.msl import translate  # noqa: E402

try:
    kr.find_nvrtc(), kr.find_headers()
    MISSING = None
except kr.Unavailable as exc:
    MISSING = str(exc)
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"{MISSING}")

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"
# An array a thread indexes by its data (local memory), and one indexed by constants after
# unrolling (registers).
LOCAL = HEADER + """
kernel void indexed(device float* y [[buffer(0)]], device const uint* k [[buffer(1)]],
                    uint gid [[thread_position_in_grid]]) {
    float a[32];
    for (uint i = 0; i < 32; ++i) a[i] = y[gid * 32 + i];
    a[k[gid] % 32] += 1.0f;  // a store at an index known only at run time
    float s = 0.0f;
    for (uint i = 0; i < 32; ++i) s += a[i] * a[(i + k[gid]) % 32];
    y[gid] = s;
}
kernel void unrolled(device float* y [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
    float a[4];
    #pragma unroll
    for (uint i = 0; i < 4; ++i) a[i] = y[gid * 4 + i];
    y[gid] = a[0] + a[1] + a[2] + a[3];
}
"""


@pytest.mark.slow  # NVRTC compiles the whole library (once for the two table tests)
def test_every_kernel_is_reported_within_its_threadgroup_limits():
    """Every entry point, in the library's order; each one's registers let a threadgroup of its
    max_total_threads_per_threadgroup run on one core (65536 registers: the launch bounds the
    CUDA translation passes ptxas), and its threadgroup memory fits Apple's 32 KiB."""
    table = kr.kernel_resources()
    assert list(table) == list(library.BUFFERS)
    sizes = {"RG_THREADS": versions.V2_THREADS, "RG_THREADS_512": versions.V2_THREADS_512}
    limits = {k.name: int(sizes.get(k.max_threads, k.max_threads))
              for k in translate.kernels(translate.prepare(library.source()))}
    for name, row in table.items():
        assert row["registers"] * limits[name] <= 65536, (name, limits[name], row)
        assert row["stack"] > 0 or row["spill_stores"] == 0, (name, row)  # a spill needs a frame
        assert row["shared"] <= 32768, (name, row)
    # the kernels that stage in threadgroup memory say how much
    assert table["strided_gemm_blocked"]["shared"] > 0
    assert table["strided_gemm"]["shared"] == 0


def test_an_array_indexed_at_run_time_shows_a_stack_frame():
    table = kr.parse(kr.ptxas_report(LOCAL))
    assert table["indexed"]["stack"] >= 4 * 32
    assert table["unrolled"]["stack"] == 0 and table["unrolled"]["spill_loads"] == 0


def test_a_source_that_does_not_compile_names_the_error():
    with pytest.raises(RuntimeError, match="NVRTC could not compile"):
        kr.ptxas_report(HEADER + "kernel void broken(device float* y [[buffer(0)]]) { y[0] = z; }")


try:
    kr.find_nvdisasm()
    NO_NVDISASM = None
except kr.Unavailable as exc:
    NO_NVDISASM = str(exc)
needs_nvdisasm = pytest.mark.skipif(NO_NVDISASM is not None, reason=f"{NO_NVDISASM}")

# One dot product a thread, its loop unrolled 8-fold or not at all.
DOT = """
kernel void dot{unroll}(device const float* a [[buffer(0)]], device const float* b [[buffer(1)]],
                 device float* y [[buffer(2)]], constant uint& n [[buffer(3)]],
                 uint gid [[thread_position_in_grid]]) {{
    float s = 0.0f;
    #pragma unroll {unroll}
    for (uint k = 0; k < n; ++k) s += a[gid * n + k] * b[k];
    y[gid] = s;
}}
"""
DOTS = HEADER + DOT.format(unroll=8) + DOT.format(unroll=1)


@needs_nvdisasm
def test_loads_ahead_counts_the_loads_a_loop_issues_before_its_first_multiply_add():
    ahead = kr.loads_ahead(kr.compile_cuda(DOTS)[1])
    assert ahead["dot8"] == 16  # two loads a multiply-add, eight of them
    assert ahead["dot1"] == 2


@pytest.mark.slow  # the table of test_every_kernel_is_reported
@needs_nvdisasm
def test_v1_backward_products_keep_sixteen_loads_in_flight():
    """v1's GRU and LSTM backward: each thread's product over the gates is a chain of L2 loads.
    Unrolled 4-fold (8 loads ahead) instead of 16-fold, the LSTM's took 26.5 ms at 1000x8
    instead of 12.2 on an H100; the loops ask for 16 (kernels/*_backward.metal)."""
    table = kr.kernel_resources()
    for name in ("single_gate_backward", "gru_backward", "lstm_backward"):
        assert table[name]["loads_ahead"] >= 16, (name, table[name])


# A step loop (a loop with a threadgroup barrier) that reads an array a thread indexes by its
# data at every step (local memory), and the same loop reading a register.
STEPPED = HEADER + """
kernel void stepped{name}(device float* y [[buffer(0)]], device const uint* k [[buffer(1)]],
                       constant uint& n [[buffer(2)]], uint lid [[thread_position_in_threadgroup]]) {{
    threadgroup float t[64];
    float a[32];
    for (uint i = 0; i < 32; ++i) a[i] = y[lid * 32 + i];
    float s = 0.0f;
    for (uint step = 0; step < n; ++step) {{
        t[lid % 64] = s;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        s += {read} * t[(lid + 1) % 64];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }}
    y[lid] = s;
}}
"""


@needs_nvdisasm
def test_step_reloads_counts_the_local_loads_of_each_step_loop():
    source = (STEPPED.format(name="_local", read="a[(k[lid] + step) % 32]")
              + STEPPED.format(name="_register", read="a[0]").replace(HEADER, ""))
    reloads = kr.step_reloads(kr.compile_cuda(source)[1])
    # (ptxas may split a loop in two: unrolled, and the rest)
    assert reloads["stepped_local"] and min(reloads["stepped_local"]) >= 1, reloads
    assert reloads["stepped_register"] and max(reloads["stepped_register"]) == 0, reloads


@pytest.mark.slow  # NVRTC compiles the whole library again, in another process
def test_the_script_prints_the_table():
    done = subprocess.run([sys.executable, "verification/kernel_resources.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| kernel (sm_90) | registers |")
    assert lines[0].endswith("| loads ahead | local loads a step, each step loop |")
    assert sum(line.startswith("| ") for line in lines) == 1 + len(library.BUFFERS)  # + header
    assert lines[-1].startswith(f"{len(library.BUFFERS)} kernels; with local memory: ")
