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


# -- the instantiate_* macros: expanded by the tools as the C preprocessor would ------------------

def _tokens(text):
    return re.sub(r"\s+", "", translate.mask(text))


def test_instantiate_macros_expand_as_the_c_preprocessor_expands_them():
    """kernels/ through translate.expand and through the C++ compiler's preprocessor give the
    same program (other macros left unexpanded on both sides), with the source's lines kept."""
    import shutil
    import subprocess

    import pytest

    from rnngrad.backends.metal.harness.cpu import _loader

    try:
        cxx = _loader.compiler()[0]
    except translate.CompileError as exc:
        pytest.skip(str(exc))
    others = re.compile(r"(?m)^[ \t]*#[ \t]*(?:include|define[ \t]+(?!instantiate_)\w+[ \t(]).*$")
    source = others.sub("", library.source())
    assert "instantiate_" in source and shutil.which(cxx)
    done = subprocess.run([cxx, "-E", "-P", "-x", "c++", "-"], input=source, capture_output=True,
                          text=True, check=True)
    expanded = translate.expand(source)
    assert _tokens(expanded) == _tokens(done.stdout)
    assert len(expanded.splitlines()) == len(source.splitlines())
    assert "instantiate_" not in translate.mask(expanded)


NESTED = """#include <metal_stdlib>
using namespace metal;
#define instantiate_sig(name, W) \\
    kernel void name(device float* W [[buffer(0)]], uint lid [[thread_position_in_threadgroup]])
#define instantiate_run(name, threads, ...) \\
    [[max_total_threads_per_threadgroup(threads)]] instantiate_sig(name, y) { \\
        threadgroup float t[threads]; /* a comment */ \\
        run<__VA_ARGS__>(y, t, lid); \\
    }
template <uint A, uint B> inline void run(device float* y, threadgroup float* t, uint lid) {
    t[lid] = A + B;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    y[lid] = t[lid];
}
instantiate_run(first, 64, 1, 2)
instantiate_run(second,  // the call may span lines
                128, 3, 4)
instantiate_sig(plain, z) { z[lid] = 0.0f; }
"""


def test_an_expansion_keeps_the_lines_and_every_tool_sees_its_entry_points():
    expanded = translate.expand(NESTED)
    lines = expanded.splitlines()
    assert len(lines) == len(NESTED.splitlines())
    assert lines[14].startswith("[[max_total_threads_per_threadgroup(64)]] kernel void first(")
    assert "run<1, 2>(y, t, lid);" in lines[14] and "threadgroup float t[64];" in lines[14]
    assert "run<3, 4>" in lines[15] and lines[16] == ""
    infos = {k.name: k for k in translate.kernels(translate.prepare(NESTED))}
    assert {n: k.max_threads for n, k in infos.items()} == {"first": "64", "second": "128",
                                                           "plain": "1024"}
    assert [(p.name, p.kind) for p in infos["plain"].params] == [
        ("z", "buffer"), ("lid", "thread_position_in_threadgroup")]
    assert infos["second"].needs_fibers and not infos["plain"].needs_fibers
    assert set(library.signatures(NESTED)) == {"first", "second", "plain"}
    unit, kernels = _build.translate_source(NESTED)
    assert "__shared__ float t[128];" in unit and len(kernels) == 3


def test_what_the_expander_cannot_expand_is_an_error_naming_the_line():
    import pytest

    with pytest.raises(translate.CompileError, match=r"program.metal:2: a // comment in the "
                                                     r"#define of instantiate_k"):
        translate.expand("#define instantiate_k(name) \\\n  int name; // note \\\n  int b;\n")
    with pytest.raises(translate.CompileError, match=r"program.metal:1: instantiate_k: # and ##"):
        translate.expand("#define instantiate_k(name) int name##_v2;\n")
    with pytest.raises(translate.CompileError,
                       match=r"program.metal:3: instantiate_k takes 2 argument\(s\), got 1"):
        translate.expand("#define instantiate_k(name, T) T name;\n\ninstantiate_k(x)\n")
