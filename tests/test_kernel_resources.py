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

from rnngrad.backends.metal import library  # noqa: E402

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


def test_every_kernel_is_reported():
    table = kr.kernel_resources()
    assert list(table) == list(library.BUFFERS)
    for name, row in table.items():
        assert 1 <= row["registers"] <= 255, (name, row)
        assert row["spill_loads"] >= 0 and row["spill_stores"] >= 0, (name, row)
        assert row["stack"] > 0 or row["spill_stores"] == 0, (name, row)  # a spill needs a frame
    # the kernels that stage in threadgroup memory say how much, within Apple's 32 KiB
    assert 0 < table["strided_gemm_blocked"]["shared"] <= 32768
    assert table["strided_gemm"]["shared"] == 0


def test_an_array_indexed_at_run_time_shows_a_stack_frame():
    table = kr.parse(kr.ptxas_report(LOCAL))
    assert table["indexed"]["stack"] >= 4 * 32
    assert table["unrolled"]["stack"] == 0 and table["unrolled"]["spill_loads"] == 0


def test_a_source_that_does_not_compile_names_the_error():
    with pytest.raises(RuntimeError, match="NVRTC could not compile"):
        kr.ptxas_report(HEADER + "kernel void broken(device float* y [[buffer(0)]]) { y[0] = z; }")


def test_the_script_prints_the_table():
    done = subprocess.run([sys.executable, "verification/kernel_resources.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| kernel (sm_90) | registers |")
    assert sum(line.startswith("| ") for line in lines) == 1 + len(library.BUFFERS)  # + header
    assert lines[-1].startswith(f"{len(library.BUFFERS)} kernels; with local memory: ")
