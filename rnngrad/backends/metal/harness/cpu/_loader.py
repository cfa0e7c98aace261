"""Turn an MSL source string into a loaded C++ library: parse, rewrite, compile, cache.

The source is compiled unchanged except for three line-preserving rewrites:
``#include <metal_stdlib>`` (and the other ``<metal_*>`` headers) include the stand-in header;
``threadgroup T name[N]...;`` declarations in kernel bodies become references into the
per-threadgroup arena; ``const constant`` collapses to ``constant`` (which is ``const`` here).
After the source, a generated launcher per kernel binds ``[[buffer(i)]]`` parameters to the
call's buffers and builtins to the GPU thread's position, and exports ``__emu_dispatch_<name>``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from rnngrad._cache import UnsafeCacheError, user_cache_dir

_HERE = Path(__file__).resolve().parent
_SHARED = _HERE.parent  # the stand-in <metal_stdlib>, shared by every target
_HEADERS = (_SHARED / "metal_stdlib.h", _HERE / "emulator_abi.h")
_RUNTIME = "emulator_runtime.cpp"
_FORMAT = "rnngrad-metal-emulator-1"  # bump when the generated code changes meaning
_FLAGS = (
    "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing",
    "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-w",
)
SOURCE_NAME = "program.metal"
_ERROR_LINES = 40  # of compiler output shown in an error

# Builtin attribute -> (C++ expression of the value, is a size rather than a position).
_BUILTINS = {
    "thread_position_in_grid": ("t->gid", False),
    "thread_position_in_threadgroup": ("t->lid", False),
    "thread_index_in_threadgroup": ("t->lid", False),
    "threadgroup_position_in_grid": ("t->tgid", False),
    "threads_per_threadgroup": ("L->tg_size", True),
    "threadgroups_per_grid": ("L->n_tg", True),
    "threads_per_grid": ("L->n_tg * L->tg_size", True),
    "thread_index_in_simdgroup": ("t->lane", False),
    "simdgroup_index_in_threadgroup": ("t->sg", False),
    "threads_per_simdgroup": ("32u", True),
    "thread_execution_width": ("32u", True),
    "simdgroups_per_threadgroup": ("L->tg_size / 32u", True),
}
# Calls that need every GPU thread of a threadgroup (or SIMD-group) to be able to pause.
_SYNC = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\b")
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "catch"}


class CompileError(Exception):
    """The source does not compile, or uses something the harness cannot run."""


@dataclass(frozen=True)
class KernelInfo:
    name: str
    n_buffers: int            # highest [[buffer(i)]] + 1: buffers the call must pass
    needs_fibers: bool        # synchronises: run one fiber per GPU thread


def _mask(src: str) -> str:
    """The source with comments and string/char literals blanked (same length, same lines)."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _match(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise CompileError(f"{SOURCE_NAME}:{_line(text, i)}: unbalanced '{open_}'")


def _line(text: str, i: int) -> int:
    return text.count("\n", 0, i) + 1


def _split_params(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in "([<":
            depth += 1
        elif c in ")]>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _functions(masked: str) -> dict[str, list[tuple[int, int]]]:
    """Function name -> body spans, for every function definition in the source."""
    found: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(r"\b(\w+)\s*\(", masked):
        name = m.group(1)
        if name in _KEYWORDS:
            continue
        try:
            close = _match(masked, m.end() - 1, "(", ")")
            rest = re.match(r"(?:\s|const\b|noexcept\b|\[\[[^\]]*\]\])*\{", masked[close:])
            if rest:
                body = close + rest.end() - 1
                found.setdefault(name, []).append((body, _match(masked, body, "{", "}")))
        except CompileError:
            continue  # unbalanced text (e.g. inside a macro): the compiler will judge it
    return found


def _synchronises(masked: str, body: tuple[int, int], functions) -> bool:
    """Whether a body, or any function it names (transitively), uses a barrier or collective."""
    seen, stack = set(), [body]
    while stack:
        span = stack.pop()
        if span in seen:
            continue
        seen.add(span)
        text = masked[span[0]:span[1]]
        if _SYNC.search(text):
            return True
        for ident in set(re.findall(r"\b\w+\b", text)):
            stack.extend(functions.get(ident, ()))
    return False


def _rewrite_threadgroup(src: str, masked: str) -> str:
    """Kernel-scope ``threadgroup T name[N]...;`` -> a reference into the threadgroup arena."""
    decl = re.compile(
        r"(?<![\w])threadgroup\s+([A-Za-z_][\w:]*(?:\s*<[^;{}>]*>)?)\s+([A-Za-z_]\w*)\s*"
        r"((?:\[[^\];]*\]\s*)*);")
    pieces, last = [], 0
    for m in decl.finditer(masked):
        before = masked[:m.start()].rstrip()
        if before and before[-1] not in ";{}":
            continue
        type_, name, dims = m.group(1), m.group(2), re.sub(r"\s+", "", m.group(3))
        text = f"auto& {name} = ::__emu::tg_array<{type_}{dims}>();"
        text += "\n" * src[m.start():m.end()].count("\n")
        pieces += [src[last:m.start()], text]
        last = m.end()
    pieces.append(src[last:])
    out = "".join(pieces)
    rest = re.search(r"(?<![\w])threadgroup\s+[A-Za-z_][\w:]*(?:\s*<[^;{}>]*>)?\s+[A-Za-z_]\w*\s*[\[;,=]",
                     _mask(out))
    if rest:
        raise CompileError(
            f"{SOURCE_NAME}:{_line(out, rest.start())}: unsupported threadgroup declaration "
            f"'{out[rest.start():rest.end()].strip()}...': declare one threadgroup variable per "
            f"statement, at kernel scope, without an initializer")
    return out


def _kernels(src: str, masked: str):
    functions = _functions(masked)
    kernels = []
    pattern = re.compile(r"(?:\bkernel|\[\[\s*kernel\s*\]\])\s+void\s+([A-Za-z_]\w*)\s*\(")
    for m in pattern.finditer(masked):
        name = m.group(1)
        open_ = m.end() - 1
        close = _match(masked, open_, "(", ")")
        brace = masked.find("{", close)
        if brace < 0:
            raise CompileError(f"{SOURCE_NAME}:{_line(src, m.start())}: kernel '{name}' has no body")
        head_start = max(masked.rfind(";", 0, m.start()), masked.rfind("}", 0, m.start())) + 1
        head = masked[head_start:m.start()] + " " + masked[close:brace]
        limit = re.search(r"max_total_threads_per_threadgroup\s*\(", head)
        if limit:
            expr_end = _match(head, limit.end() - 1, "(", ")")
            max_threads = head[limit.end():expr_end - 1].strip()
        else:
            max_threads = "1024"
        args, n_buffers = [], 0
        for param in _split_params(src[open_ + 1:close - 1]):
            line = _line(src, open_)
            attr = re.search(r"\[\[\s*(\w+)\s*(?:\(\s*([^)]*)\))?\s*\]\]", param)
            decl = re.sub(r"\[\[.*?\]\]", " ", param, flags=re.S).strip()
            pname = re.search(r"([A-Za-z_]\w*)\s*$", decl)
            if not attr or not pname:
                raise CompileError(
                    f"{SOURCE_NAME}:{line}: parameter '{' '.join(param.split())}' of kernel "
                    f"'{name}' has no attribute: every kernel parameter needs [[buffer(i)]] or "
                    f"a builtin such as [[thread_position_in_grid]]")
            type_ = decl[:pname.start()].strip()
            kind, value = attr.group(1), attr.group(2)
            if kind == "buffer":
                index = int(value, 0)
                n_buffers = max(n_buffers, index + 1)
                args.append(f"::__emu::bind<{type_}>(L->bufs[{index}])")
            elif kind in _BUILTINS:
                expr, is_size = _BUILTINS[kind]
                args.append(f"::__emu::builtin<{type_}>({expr}, {'true' if is_size else 'false'})")
            elif kind == "threadgroup":
                raise CompileError(
                    f"{SOURCE_NAME}:{line}: kernel '{name}' takes a [[threadgroup({value})]] "
                    f"argument; metalcompute cannot set threadgroup memory lengths, so declare "
                    f"threadgroup arrays in the kernel body")
            else:
                raise CompileError(
                    f"{SOURCE_NAME}:{line}: kernel '{name}': attribute [[{kind}]] is not "
                    f"supported by the harness (expected buffer(i) or one of "
                    f"{', '.join(sorted(_BUILTINS))})")
        body = (brace, _match(masked, brace, "{", "}"))
        needs_fibers = _synchronises(masked, body, functions)
        if any(_SYNC.search(line) for line in masked.splitlines() if line.lstrip().startswith("#define")):
            needs_fibers = True  # a macro may hide a barrier from the call-graph scan
        kernels.append((KernelInfo(name, n_buffers, needs_fibers), args, max_threads))
    return kernels


def _launchers(kernels) -> str:
    out = ['#line 1 "<harness launchers>"']
    for info, args, max_threads in kernels:
        k = info.name
        joined = ",\n        ".join(args)
        out.append(f"""
static inline __attribute__((always_inline)) void __emu_call_{k}(const ::__emu::Launch* L, const ::__emu::Thread* t) {{
    (void)L; (void)t;
    {k}({joined});
}}
static void __emu_thread_{k}(const ::__emu::Launch* L, ::__emu::Thread* t) {{ __emu_call_{k}(L, t); }}
static void __emu_simdgroup_{k}(const ::__emu::Launch* L, ::__emu::Thread* t) {{
    const unsigned first = t->sg * 32u;
    for (unsigned l = 0; l < 32u; ++l) {{
        const unsigned lane = L->schedule == 1 ? 31u - l : l;
        t->lane = lane; t->lid = first + lane; t->gid = t->tgid * L->tg_size + first + lane; t->tg_off = 0;
        __emu_call_{k}(L, t);
    }}
}}
extern "C" __attribute__((visibility("default"))) unsigned __emu_max_threads_{k}() {{
    return (unsigned)({max_threads});
}}
extern "C" __attribute__((visibility("default"))) int __emu_dispatch_{k}(const ::__emu::Launch* L, ::__emu::Outcome* o) {{
    return __emu_dispatch(L, o, __emu_thread_{k}, __emu_simdgroup_{k}, {int(info.needs_fibers)});
}}""")
    return "\n".join(out) + "\n"


def translate(source: str):
    """(C++ translation unit, [KernelInfo]) for an MSL source string."""
    src = re.sub(r"#\s*include\s*<(?:metal_\w+|simd/simd\.h)>", '#include "metal_stdlib.h"', source)
    src = re.sub(r"\bconst\s+constant\b|\bconstant\s+const\b", "constant", src)
    src = _rewrite_threadgroup(src, _mask(src))
    masked = _mask(src)
    kernels = _kernels(src, masked)
    unit = f'#line 1 "{SOURCE_NAME}"\n{src}\n{_launchers(kernels)}'
    return unit, [k[0] for k in kernels]


# ----------------------------------------------------------------------------- compiler and cache
_lock = threading.Lock()
_compiler_cache: dict[str, tuple[str, str]] = {}


def compiler() -> tuple[str, str]:
    """(path, version line) of the C++ compiler: $CXX, else g++, else clang++."""
    if "c" in _compiler_cache:
        return _compiler_cache["c"]
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "clang++", "c++"]
    for name in candidates:
        path = shutil.which(name)
        if path:
            version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            _compiler_cache["c"] = (path, version.splitlines()[0] if version else name)
            return _compiler_cache["c"]
    raise CompileError(
        "the Metal harness needs a C++17 compiler and found none (looked for "
        f"{', '.join(candidates)} on PATH). Install one, e.g. `apt-get install g++` on "
        "Debian/Ubuntu, `dnf install gcc-c++` on Fedora, or set CXX to its path.")


def cache_dir() -> Path:
    """Per-user cache, created 0700; refuses a directory another user could write to."""
    try:
        return user_cache_dir("metal-emulator")
    except UnsafeCacheError as exc:
        raise CompileError(str(exc)) from None


def _run(cmd: list[str], cwd: Path) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        lines = done.stderr.replace(str(cwd) + os.sep, "").replace(str(_HERE) + os.sep, "").replace(str(_SHARED) + os.sep, "").splitlines()
        if len(lines) > _ERROR_LINES:
            lines = lines[:_ERROR_LINES] + [f"... ({len(lines) - _ERROR_LINES} more lines)"]
        raise CompileError(f"{Path(cmd[0]).name} failed:\n" + "\n".join(lines))


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:32]


def _publish(tmp: Path, final: Path) -> None:
    os.chmod(tmp, 0o600 if final.suffix == ".o" else 0o700)
    os.replace(tmp, final)


def build(unit: str) -> Path:
    """Compile a translation unit (cached) and return the shared library's path."""
    cxx, version = compiler()
    headers = [h.read_bytes() for h in _HEADERS]
    runtime_src = (_HERE / _RUNTIME).read_bytes()
    base_key = _digest(_FORMAT, cxx, version, " ".join(_FLAGS), *headers, runtime_src)
    root = cache_dir()
    library = root / f"kernel-{_digest(base_key, unit)}.so"
    if library.exists():
        return library
    with _lock, tempfile.TemporaryDirectory(dir=root, prefix="build-") as tmp:
        tmp = Path(tmp)
        runtime = root / f"runtime-{base_key}.o"
        if not runtime.exists():
            _run([cxx, *_FLAGS, "-c", str(_HERE / _RUNTIME), "-o", "runtime.o"], tmp)
            _publish(tmp / "runtime.o", runtime)
        (tmp / "kernel.cpp").write_text(unit)
        _run([cxx, *_FLAGS, f"-I{_HERE}", f"-I{_SHARED}", "-shared", "kernel.cpp", str(runtime), "-o", "kernel.so",
              "-lm"], tmp)
        _publish(tmp / "kernel.so", library)
    return library


def load(source: str):
    """(ctypes library, [KernelInfo]) for an MSL source string."""
    unit, kernels = translate(source)
    return ctypes.CDLL(str(build(unit)), mode=os.RTLD_LOCAL), kernels
