"""What each Metal kernel costs in registers and local memory on an NVIDIA GPU, with no GPU.

    pip install ".[kernel-report]" && python verification/kernel_resources.py [--arch sm_90]

The harness's CUDA translation of ``kernels/`` (the same text the ``metal-cuda`` backend runs) is
compiled by NVRTC with ptxas's report, and the report is printed as a table: registers per
thread, the stack frame and the bytes spilled to and reloaded from local memory, and threadgroup
(shared) memory. A kernel with a stack frame keeps an array in local memory (an array indexed at
run time, or registers spilled under the 64-register limit of a 1024-thread threadgroup):
each access is a memory instruction where a register would have been free. Apple's compiler
allocates differently; the table is what the NVIDIA target shows, and a kernel that spills
there usually holds more live values than it needs to.

With ``nvdisasm`` (NVIDIA's wheel in the same extra, or a toolkit's) the table also says how
many global loads the best loop of each kernel issues before its first multiply-add
("loads ahead", from the SASS): the loads a thread keeps in flight where a loop's chain of
multiply-adds waits on memory. ptxas chooses that by itself: when the CUDA translation made the
parameter struct a kernel parameter it stopped unrolling v1's GRU and LSTM backward products
16-fold (32 loads ahead, then 8) and those kernels took twice as long on an H100; their loops
now say ``#pragma unroll 16``, and the tests hold them to 16 loads ahead or more. The last
column counts the local-memory loads in each step loop (a loop with a threadgroup barrier): the
values a recurrence's body reloads at every step, which the stack and spill totals do not place.

NVRTC and the CUDA headers come from NVIDIA's wheels (the ``kernel-report`` extra), from a CUDA
toolkit (``$CUDA_HOME``, ``/usr/local/cuda``), or from CuPy's installation on a GPU machine.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Unavailable(RuntimeError):
    """NVRTC or the CUDA headers were not found (the message says where it looked)."""


def _nvidia_dirs(sub: str) -> list:
    """``sub`` folders of NVIDIA's wheels (``nvidia/cu13/lib``, ``nvidia/cuda_nvrtc/lib``...)."""
    try:
        import nvidia
    except ImportError:
        return []
    out = []
    for base in map(Path, nvidia.__path__):
        out += sorted(p for p in base.glob(f"*/{sub}") if p.is_dir())
    return out


def _toolkit_dirs(sub: str) -> list:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [Path(h) / sub for h in homes if h and (Path(h) / sub).is_dir()]


def find_nvrtc() -> Path:
    """The NVRTC shared library: NVIDIA's wheel, a toolkit, or the loader's search path."""
    for folder in _nvidia_dirs("lib") + _toolkit_dirs("lib64") + _toolkit_dirs("lib"):
        found = sorted(folder.glob("libnvrtc.so*"))
        found = [p for p in found if "builtins" not in p.name and ".alt." not in p.name]
        if found:
            return found[0]
    name = ctypes.util.find_library("nvrtc")
    if name:
        return Path(name)
    raise Unavailable("NVRTC not found: pip install \".[kernel-report]\" (NVIDIA's nvrtc and "
                      "runtime wheels), or set CUDA_HOME to a CUDA toolkit")


def find_headers() -> Path:
    """A folder holding cuda_fp16.h (the harness's CUDA target includes it)."""
    for folder in _nvidia_dirs("include") + _toolkit_dirs("include"):
        if (folder / "cuda_fp16.h").is_file():
            return folder
    raise Unavailable("the CUDA headers (cuda_fp16.h) not found: pip install \".[kernel-report]\" "
                      "(NVIDIA's runtime wheel), or set CUDA_HOME to a CUDA toolkit")


def _library(path: Path):
    # NVRTC opens its builtins library by name: load it first from the same folder, where the
    # loader's search path may not look
    for builtins in sorted(path.parent.glob("libnvrtc-builtins.so*")):
        if ".alt." not in builtins.name:
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(path))
    P, size = ctypes.c_void_p, ctypes.c_size_t
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_int, P, P]
    lib.nvrtcCompileProgram.argtypes = [P, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.nvrtcGetProgramLogSize.argtypes = [P, ctypes.POINTER(size)]
    lib.nvrtcGetProgramLog.argtypes = [P, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(P)]
    return lib


@functools.lru_cache(maxsize=4)
def compile_cuda(msl_source: str, arch: str = "sm_90", fast_math: bool = False) -> tuple:
    """(ptxas's verbose report, the cubin) of an MSL source, translated as the CUDA target does
    and compiled by NVRTC for ``arch``; an Unavailable error without NVRTC, a RuntimeError with
    NVRTC's log if it does not compile. Kept for the process: the same source is compiled
    once."""
    from rnngrad.backends.metal.cuda import _build

    lib = _library(find_nvrtc())
    unit, _ = _build.translate_source(msl_source)
    options = [*_build.options(fast_math), f"-I{find_headers()}", f"-arch={arch}",
               "--ptxas-options=-v"]
    program = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(program), unit.encode(), b"kernels.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(program, len(options), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        text = log.value.decode(errors="replace")
        cubin = b""
        if not status:
            lib.nvrtcGetCUBINSize(program, ctypes.byref(size))
            image = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetCUBIN(program, image)
            cubin = image.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
    if status:
        raise RuntimeError(f"NVRTC could not compile the translation (status {status}):\n{text[-4000:]}")
    return text, cubin


def ptxas_report(msl_source: str, arch: str = "sm_90", fast_math: bool = False) -> str:
    """ptxas's verbose report of an MSL source (:func:`compile_cuda`)."""
    return compile_cuda(msl_source, arch, fast_math)[0]


def find_nvdisasm() -> Path:
    """nvdisasm: NVIDIA's wheel, a toolkit, or the PATH."""
    for folder in _nvidia_dirs("bin") + _toolkit_dirs("bin"):
        if (folder / "nvdisasm").is_file():
            return folder / "nvdisasm"
    found = shutil.which("nvdisasm")
    if found:
        return Path(found)
    raise Unavailable("nvdisasm not found: pip install \".[kernel-report]\" (NVIDIA's nvdisasm "
                      "wheel), or set CUDA_HOME to a CUDA toolkit")


_SASS_FUNCTION = re.compile(r"(?m)^\.text\.__mtl_launch_(\w+):")
_SASS_LINE = re.compile(r"(?m)^(?:(\.L_\w+):|\s+/\*([0-9a-f]{4,})\*/\s+([^;]*);)")


def _sass(cubin: bytes) -> dict:
    """{kernel: ([(address, instruction)], {label: address})} from nvdisasm's SASS of ``cubin``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "kernels.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([str(find_nvdisasm()), "-c", str(path)], capture_output=True,
                              text=True, check=True)
    out = {}
    parts = _SASS_FUNCTION.split(done.stdout)
    for name, text in zip(parts[1::2], parts[2::2]):
        code, labels, pending = [], {}, []
        for label, address, op in _SASS_LINE.findall(text):
            if label:
                pending.append(label)
                continue
            for name_ in pending:
                labels[name_] = int(address, 16)
            pending = []
            code.append((int(address, 16), op.strip()))
        out[name] = (code, labels)
    return out


def _loops(code: list, labels: dict):
    """Each loop of a kernel's SASS as its instructions: the span from a branch's target back up
    to the branch."""
    for address, op in code:
        target = re.search(r"\bBRA `\((\.L_\w+)\)", op)
        start = labels.get(target.group(1)) if target else None
        if start is not None and start < address:
            yield start, address, [o for a, o in code if start <= a <= address]


def loads_ahead(cubin: bytes, sass: dict | None = None) -> dict:
    """{kernel: the most global loads (LDG) any of its loops issues before the loop's first
    multiply-add (FFMA)}, from nvdisasm's SASS of ``cubin`` (or ``sass``, :func:`_sass`'s of
    it). 0 for a kernel with no loop that multiplies and adds."""
    out = {}
    for name, (code, labels) in (sass or _sass(cubin)).items():
        best = 0
        for _, _, loop in _loops(code, labels):
            first = next((i for i, o in enumerate(loop) if re.search(r"\bFFMA\b", o)), None)
            if first is not None:
                best = max(best, sum(bool(re.search(r"\bLDG\b", o)) for o in loop[:first]))
        out[name] = best
    return out


def step_reloads(cubin: bytes, sass: dict | None = None) -> dict:
    """{kernel: the local-memory loads (LDL) in each of its step loops, fewest first}: a step
    loop is a loop with a threadgroup barrier (BAR.SYNC) and no such loop inside it, as the
    recurrences' bodies run a step (one tuple entry per body the kernel compiles). A load there
    is paid at every step, on its critical path where it comes between a barrier and the work
    that waits on it; in a kernel whose weight streams through L1 it is a trip to L2 (the
    LSTM's one-row bodies at 1000x8x128x128 on an H100 reloaded 8 and 27 values a step, the
    static spill totals of the table saying nothing of where). ``sass``: as for loads_ahead."""
    out = {}
    for name, (code, labels) in (sass or _sass(cubin)).items():
        spans = {(start, end): loop for start, end, loop in _loops(code, labels)
                 if any("BAR.SYNC" in o for o in loop)
                 and not any(re.search(r"\bEXIT\b", o) for o in loop)}
        inner = [loop for (start, end), loop in spans.items()
                 if not any(start <= s and e <= end and (s, e) != (start, end) for s, e in spans)]
        out[name] = tuple(sorted(sum(bool(re.search(r"\bLDL\b", o)) for o in loop)
                                 for loop in inner))
    return out


_ENTRY = re.compile(
    r"Function properties for __mtl_launch_(\w+)\s*\n\s*ptxas\s*\.\s*(\d+) bytes stack frame, "
    r"(\d+) bytes spill stores, (\d+) bytes spill loads\s*\n(?:.*\n)*?.*?Used (\d+) registers"
    r"(?:.*?, (\d+) bytes smem)?", re.M)


def parse(report: str) -> dict:
    """{kernel: {registers, stack, spill_stores, spill_loads, shared}} from ptxas's report."""
    out = {}
    for m in _ENTRY.finditer(report):
        name, stack, stores, loads, regs, smem = m.groups()
        out[name] = dict(registers=int(regs), stack=int(stack), spill_stores=int(stores),
                         spill_loads=int(loads), shared=int(smem or 0))
    return out


def kernel_resources(arch: str = "sm_90", fast_math: bool = False) -> dict:
    """The table of every kernel of ``kernels/``, in the library's order; each row's
    ``loads_ahead`` (:func:`loads_ahead`) and ``step_reloads`` (:func:`step_reloads`) are None
    where nvdisasm is not found."""
    from rnngrad.backends.metal import library

    report, cubin = compile_cuda(library.source(), arch, fast_math)
    found = parse(report)
    try:
        sass = _sass(cubin)  # one nvdisasm run for both columns
        ahead, reloads = loads_ahead(cubin, sass), step_reloads(cubin, sass)
    except Unavailable:
        ahead, reloads = {}, {}
    return {name: dict(found[name], loads_ahead=ahead.get(name), step_reloads=reloads.get(name))
            for name in library.BUFFERS if name in found}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90", help="the GPU architecture (default sm_90, an H100)")
    parser.add_argument("--fast-math", action="store_true", help="compile as metalcompute does on a Mac")
    args = parser.parse_args(argv)
    try:
        table = kernel_resources(args.arch, args.fast_math)
    except Unavailable as exc:
        print(f"kernel_resources: {exc}", file=sys.stderr)
        return 2
    print(f"| kernel ({args.arch}) | registers | stack frame B | spill stores B | spill loads B | "
          f"threadgroup memory B | loads ahead | local loads a step, each step loop |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in table.items():
        ahead = "-" if r["loads_ahead"] is None else r["loads_ahead"]
        reloads = ("-" if r["step_reloads"] is None
                   else " ".join(map(str, r["step_reloads"])) or "no step loop")
        print(f"| {name} | {r['registers']} | {r['stack']} | {r['spill_stores']} | "
              f"{r['spill_loads']} | {r['shared']} | {ahead} | {reloads} |")
    local = [n for n, r in table.items() if r["stack"]]
    print(f"\n{len(table)} kernels; with local memory: {', '.join(local) if local else 'none'}")
    if any(r["loads_ahead"] is None for r in table.values()):
        print("loads ahead: nvdisasm not found (pip install \".[kernel-report]\")")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
