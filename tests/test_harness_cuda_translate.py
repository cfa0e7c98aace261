"""The CUDA target's translation of MSL (no GPU needed): what NVRTC is given for kernels/."""

import re

from rnngrad.backends.metal import library
from rnngrad.backends.metal.msl import translate
from rnngrad.backends.metal.cuda import _build


def _code(text):
    return translate.mask(text)


def test_every_kernel_gets_a_launcher_with_its_buffers_in_order():
    unit, kernels = _build.translate_source(library.source())
    assert [k.name for k in kernels] == list(library.BUFFERS)
    for k in kernels:
        m = re.search(r'extern "C" __global__ void __launch_bounds__\(' + re.escape(k.max_threads) + r', 1\) '
                      + _build.LAUNCHER_PREFIX + k.name + r"\(([^)]*)\)", unit)
        assert m, k.name
        # every kernel's buffer 0 is its parameter struct, `constant <Struct>& p`: by value
        struct = "GemmParams" if k.name.startswith("strided_gemm") else "RecurrenceParams"
        assert m.group(1) == ", ".join([f"__grid_constant__ const {struct} __b0"] + [
            f"void* __b{i}" for i in range(1, len(library.BUFFERS[k.name]))])
        assert f"unsigned {_build.SIZEOF_PREFIX}{k.name}_0 = (unsigned)sizeof({struct});" in unit


def test_only_constant_references_are_taken_by_value():
    src = """#include <metal_stdlib>
using namespace metal;
struct P { uint n; float a; };
kernel void k(constant P& p [[buffer(0)]], constant float* table [[buffer(1)]],
              device const float& x [[buffer(2)]], const constant uint& n [[buffer(3)]],
              device float* y [[buffer(4)]], uint gid [[thread_position_in_grid]]) {
    if (gid < p.n && gid < n) y[gid] = p.a * table[gid] + x;
}
"""
    unit, (k,) = _build.translate_source(src)
    launcher = unit[unit.index(_build.LAUNCHER_PREFIX + "k("):]
    head = launcher[:launcher.index(")")]
    assert head.endswith("(__grid_constant__ const P __b0, void* __b1, void* __b2, "
                         "__grid_constant__ const uint __b3, void* __b4")
    assert [_build.by_value(q) for q in k.params] == ["P", None, None, "uint", None, None]


def test_msl_qualifiers_and_attributes_leave_the_program_text_only():
    unit, _ = _build.translate_source(library.source())
    program = _code(unit.split('#line 1 "program.metal"', 1)[1].split("<cuda launchers>")[0])
    assert not re.search(r"\bdevice\b|\bconstant\b|\[\[|\bkernel\s+void\b", program)
    assert len(unit.splitlines()) > len(library.source().splitlines())  # lines kept, launchers after


def test_threadgroup_arrays_become_shared_and_the_cpu_target_gets_its_arena():
    src = """#include <metal_stdlib>
using namespace metal;
kernel void k(device float* y [[buffer(0)]], uint lid [[thread_position_in_threadgroup]]) {
    threadgroup float t[64][2];
    t[lid][0] = 1.0f;   // threadgroup float u[3]; stays a comment
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[lid] = t[lid][0];
}
"""
    unit, (info,) = _build.translate_source(src)
    assert "__shared__ float t[64][2];" in unit and "threadgroup float u[3]; stays a comment" in unit
    assert info.needs_fibers and info.n_buffers == 1
    from rnngrad.backends.metal.harness.cpu import _loader

    cpu_unit, _ = _loader.translate(src)
    assert "auto& t = ::__emu::tg_array<float[64][2]>();" in cpu_unit


def test_fast_math_options_mirror_metalcompute():
    assert "-DEMU_FAST_MATH" in _build.options(True) and "--ftz=true" in _build.options(True)
    assert "-DEMU_FAST_MATH" not in _build.options(False)


def test_the_cuda_target_defines_every_name_it_exports():
    from rnngrad.backends.metal import cuda
    from rnngrad.backends.metal.harness import cpu

    assert [name for name in cuda.__all__ if not hasattr(cuda, name)] == []
    assert [name for name in cpu.__all__ if not hasattr(cpu, name)] == []
