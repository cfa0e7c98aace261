"""The CUDA target's build: an MSL source string → a CUDA C++ translation unit → an NVRTC module.

The shared translator (:mod:`..translate`) parses the source and rewrites ``#include
<metal_stdlib>``; here, in the program text only (comments and strings untouched, lines kept):

- kernel-scope ``threadgroup T name[N];`` becomes ``__shared__ T name[N];``;
- the MSL address-space qualifiers ``device`` and ``constant`` (``const``) are removed: CUDA's
  ``__device__`` and ``__constant__`` are macros built on those words, so they cannot be macros;
- attributes ``[[buffer(i)]]``, ``[[thread_position_in_grid]]``, ``[[kernel]]``,
  ``[[max_total_threads_per_threadgroup(N)]]`` are blanked, ``kernel void`` becomes ``void``.

The program is compiled inside ``namespace __mtl``, which first declares every metal:: function
and vector type by a using-declaration: CUDA declares ``max``, ``exp``, ``float4`` ... at global
scope, and MSL's ``using namespace metal;`` would otherwise make each unqualified call ambiguous.
After the program, one ``extern "C" __global__`` launcher per kernel takes the buffers in
``[[buffer(i)]]`` order, computes the builtins from CUDA's block and thread indices (1-D grid,
a SIMD-group is a warp) and calls the kernel, which NVRTC compiles as a device function
(``-default-device``).

A buffer the kernel takes as ``constant T&`` (a parameter struct) is the launcher's parameter
of type T by value, ``__grid_constant__``: CUDA's kernel parameter space, read-only while the
kernel runs and read through the constant cache, as Metal's ``constant`` address space is; the
Function passes the struct's bytes at the launch (:func:`by_value`). Bound as a pointer into
global memory instead, every field is a load that ptxas must repeat after each store through a
``device`` pointer (the two might alias), on the critical path of every step of a recurrence.
``__mtl_sizeof_<kernel>_<i>`` holds sizeof(T), so the Function can check the bytes it is given.

The launcher's ``__launch_bounds__(N, 1)`` carries the kernel's
``max_total_threads_per_threadgroup`` and asks for one resident threadgroup a core, no more:
without that second figure ptxas may cap a kernel's registers to keep several threadgroups on
a core, and spill (verification/PERFORMANCE.md), where Metal leaves occupancy to Apple's
compiler.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..msl import translate

_HERE = Path(__file__).resolve().parent
_SHARED = _HERE.parent / "msl"

#: builtin attribute → its CUDA expression
_BUILTIN_VALUES = {
    "thread_position_in_grid": "blockIdx.x * blockDim.x + threadIdx.x",
    "thread_position_in_threadgroup": "threadIdx.x",
    "thread_index_in_threadgroup": "threadIdx.x",
    "threadgroup_position_in_grid": "blockIdx.x",
    "threads_per_threadgroup": "blockDim.x",
    "threadgroups_per_grid": "gridDim.x",
    "threads_per_grid": "gridDim.x * blockDim.x",
    "thread_index_in_simdgroup": "(threadIdx.x & 31u)",
    "simdgroup_index_in_threadgroup": "(threadIdx.x >> 5)",
    "threads_per_simdgroup": "32u",
    "thread_execution_width": "32u",
    "simdgroups_per_threadgroup": "(blockDim.x >> 5)",
}

_VECTOR_ELEMENTS = ("float", "half", "int", "uint", "short", "ushort", "char", "uchar", "long",
                    "ulong", "bool")
#: metal:: names a kernel may call unqualified that CUDA also declares at global scope
_FUNCTIONS = (
    "exp", "exp2", "log", "log2", "log10", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "floor", "ceil", "round", "rint", "trunc",
    "fabs", "rsqrt", "exp10", "pow", "atan2", "fmod", "fmin", "fmax", "copysign", "fdim", "fma",
    "sincos", "min", "max", "abs", "isnan", "isinf", "isfinite", "signbit",
)

LAUNCHER_PREFIX = "__mtl_launch_"
LIMIT_PREFIX = "__mtl_max_threads_"
SIZEOF_PREFIX = "__mtl_sizeof_"


def _blank(src: str, masked: str, pattern: str, replacement) -> str:
    """Replace matches of ``pattern`` found in the masked text (so never inside comments or
    strings); ``replacement`` is a string or a function of the match."""
    out, last = [], 0
    for m in re.finditer(pattern, masked):
        text = replacement(m) if callable(replacement) else replacement
        out += [src[last:m.start()], text]
        last = m.end()
    out.append(src[last:])
    return "".join(out)


def _spaces(m):
    return re.sub(r"[^\n]", " ", m.group(0))


def _shadows() -> str:
    names = [f"{prefix}{t}{n}" for t in _VECTOR_ELEMENTS for prefix in ("", "packed_")
             for n in (2, 3, 4)]
    return " ".join(f"using metal::{n};" for n in names + list(_FUNCTIONS))


def by_value(param) -> str | None:
    """The struct type T of a ``constant T&`` buffer parameter, which the launcher takes by value
    (module docstring); None for any other parameter."""
    if param.kind != "buffer":
        return None
    m = re.fullmatch(r"constant\s+([A-Za-z_][\w:]*)\s*&", " ".join(param.type.split()))
    return m.group(1) if m else None


def _argument(param) -> str:
    if param.kind == "buffer":
        return f"::__emu::bind<{param.type}>(__b{param.index})"
    size = "true" if translate.BUILTINS[param.kind] else "false"
    return f"::__emu::builtin<{param.type}>({_BUILTIN_VALUES[param.kind]}, {size})"


def _strip_qualifiers(text: str) -> str:
    """MSL address spaces out of a parameter type: the launcher's C++ type for it."""
    text = re.sub(r"\bdevice\b", " ", text)
    return " ".join(re.sub(r"\bconstant\b", "const", text).split())


def _launchers(kernels) -> str:
    out = ['#line 1 "<cuda launchers>"']
    for info in kernels:
        structs = {p.index: t for p in info.params if (t := by_value(p))}
        params = [dataclasses.replace(p, type=_strip_qualifiers(p.type)) for p in info.params]
        buffers = ", ".join(f"__grid_constant__ const {structs[i]} __b{i}" if i in structs
                            else f"void* __b{i}" for i in range(info.n_buffers)) or "void"
        args = ",\n        ".join(f"__b{p.index}" if p.index in structs else _argument(p)
                                  for p in params)
        sizes = "".join(f"""
extern "C" __device__ const unsigned {SIZEOF_PREFIX}{info.name}_{i} = (unsigned)sizeof({t});"""
                        for i, t in sorted(structs.items()))
        out.append(f"""
extern "C" __device__ const unsigned {LIMIT_PREFIX}{info.name} = (unsigned)({info.max_threads});{sizes}
extern "C" __global__ void __launch_bounds__({info.max_threads}, 1) {LAUNCHER_PREFIX}{info.name}({buffers}) {{
    {info.name}({args});
}}""")
    return "\n".join(out) + "\n"


def translate_source(source: str):
    """(CUDA translation unit, [KernelInfo]) for an MSL source string."""
    src = translate.prepare(source)
    src = translate.rewrite_threadgroup(src, lambda type_, name, dims: f"__shared__ {type_} {name}{dims};")
    kernels = translate.kernels(src)
    masked = translate.mask(src)
    src = _blank(src, masked, r"\[\[\s*\w+\s*(?:\([^)]*\))?\s*\]\]", _spaces)
    masked = translate.mask(src)
    src = _blank(src, masked, r"\bkernel(?=\s+void\b)", "      ")
    masked = translate.mask(src)
    src = _blank(src, masked, r"\bdevice\b(?!\s*\()", "      ")
    masked = translate.mask(src)
    src = _blank(src, masked, r"\bconstant\b", "const   ")
    unit = ('#include "metal_stdlib.h"\n'
            f"namespace __mtl {{ {_shadows()}\n"
            "#define inline __forceinline__\n"  # Metal's compiler inlines every function
            f'#line 1 "{translate.SOURCE_NAME}"\n{src}\n#undef inline\n'
            f'{_launchers(kernels)}}}  // namespace __mtl\n')
    return unit, kernels


def options(fast_math: bool) -> tuple:
    """NVRTC options: C++17, functions device by default, the stand-in's include folders;
    fast math as metalcompute compiles (metal:: math is fast::, denormals flushed, approximate
    division and square root)."""
    opts = ["-std=c++17", "-default-device", "-lineinfo", f"-I{_HERE}", f"-I{_SHARED}",
            "-DEMU_VECTORS_IN_NAMESPACE"]
    if fast_math:
        opts += ["-DEMU_FAST_MATH", "--ftz=true", "--prec-div=false", "--prec-sqrt=false"]
    return tuple(opts)
