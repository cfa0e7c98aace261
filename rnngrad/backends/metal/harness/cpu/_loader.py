"""The CPU target's build: an MSL source string → a loaded C++ library (compiled, cached).

The shared translator (:mod:`..translate`) parses and rewrites the source; here kernel-scope
``threadgroup`` declarations become references into the per-threadgroup arena, and after the
source a generated launcher per kernel binds ``[[buffer(i)]]`` parameters to the call's buffers
and builtins to the GPU thread's position, and exports ``__emu_dispatch_<name>``. The stand-in
``metal_stdlib.h`` is the shared one; this target's half of it is ``target.h``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: each process compiles what it lacks
    fcntl = None

from rnngrad._cache import UnsafeCacheError, user_cache_dir

from ...msl import translate as translate_
from ...msl.translate import SOURCE_NAME, CompileError, KernelInfo  # noqa: F401  (the loader's names)

_HERE = Path(__file__).resolve().parent
_SHARED = _HERE.parent.parent / "msl"  # the stand-in <metal_stdlib>, shared by every target
_HEADERS = (_SHARED / "metal_stdlib.h", _HERE / "target.h", _HERE / "target_sync.h", _HERE / "emulator_abi.h")
_RUNTIME = "emulator_runtime.cpp"
_FORMAT = "rnngrad-metal-emulator-2"  # bump when the generated code changes meaning
_FLAGS = (
    "-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing",
    "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-w",
)
_ERROR_LINES = 40  # of compiler output shown in an error

# Builtin attribute -> the C++ expression of its value on the CPU target.
_BUILTIN_VALUES = {
    "thread_position_in_grid": "t->gid",
    "thread_position_in_threadgroup": "t->lid",
    "thread_index_in_threadgroup": "t->lid",
    "threadgroup_position_in_grid": "t->tgid",
    "threads_per_threadgroup": "t->tg_n",
    "threadgroups_per_grid": "L->n_tg",
    # an exact dispatch's count (or the threads of the threadgroups that run, when fewer)
    "threads_per_grid": ("(L->exact && L->count < L->n_tg * L->tg_size ? L->count "
                         ": L->n_tg * L->tg_size)"),
    "thread_index_in_simdgroup": "t->lane",
    "simdgroup_index_in_threadgroup": "t->sg",
    "threads_per_simdgroup": "t->sg_n",
    "thread_execution_width": "32u",
    "simdgroups_per_threadgroup": "(t->tg_n + 31u) / 32u",
}


def _argument(param) -> str:
    if param.kind == "buffer":
        return f"::__emu::bind<{param.type}>(L->bufs[{param.index}])"
    is_size = "true" if translate_.BUILTINS[param.kind] else "false"
    return f"::__emu::builtin<{param.type}>({_BUILTIN_VALUES[param.kind]}, {is_size})"


def _launchers(kernels) -> str:
    out = ['#line 1 "<harness launchers>"']
    for info in kernels:
        k, max_threads = info.name, info.max_threads
        joined = ",\n        ".join(_argument(p) for p in info.params)
        out.append(f"""
static inline __attribute__((always_inline)) void __emu_call_{k}(const ::__emu::Launch* L, const ::__emu::Thread* t) {{
    (void)L; (void)t;
    {k}({joined});
}}
static void __emu_thread_{k}(const ::__emu::Launch* L, ::__emu::Thread* t) {{ __emu_call_{k}(L, t); }}
static void __emu_simdgroup_{k}(const ::__emu::Launch* L, ::__emu::Thread* t) {{
    const unsigned first = t->sg * 32u, width = t->sg_n;
    for (unsigned l = 0; l < width; ++l) {{
        const unsigned lane = L->schedule == 1 ? width - 1u - l : l;
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
    src = translate_.rewrite_threadgroup(
        translate_.prepare(source),
        lambda type_, name, dims: f"auto& {name} = ::__emu::tg_array<{type_}{dims}>();")
    kernels = translate_.kernels(src)
    unit = f'#line 1 "{SOURCE_NAME}"\n{src}\n{_launchers(kernels)}'
    return unit, kernels


# ----------------------------------------------------------------------------- compiler and cache
_lock = threading.Lock()
_building: dict[str, threading.Lock] = {}  # library file name -> held while a thread compiles it
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
    with _lock:
        building = _building.setdefault(library.name, threading.Lock())
    # one thread of one process compiles a given library, the others wait for it; different
    # libraries compile side by side
    with building, _file_lock(root / f"{library.stem}.lock"):
        if library.exists():
            return library
        _compile(cxx, unit, root / f"runtime-{base_key}.o", library)
    return library


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive ``flock`` on ``path`` (created 0600) while the block runs; no lock where
    the system has no ``fcntl``."""
    if fcntl is None:
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _compile(cxx: str, unit: str, runtime: Path, library: Path) -> None:
    with tempfile.TemporaryDirectory(dir=library.parent, prefix="build-") as tmp:
        tmp = Path(tmp)
        if not runtime.exists():
            _run([cxx, *_FLAGS, "-c", str(_HERE / _RUNTIME), "-o", "runtime.o"], tmp)
            _publish(tmp / "runtime.o", runtime)
        (tmp / "kernel.cpp").write_text(unit)
        _run([cxx, *_FLAGS, f"-I{_HERE}", f"-I{_SHARED}", "-shared", "kernel.cpp", str(runtime), "-o", "kernel.so",
              "-lm"], tmp)
        _publish(tmp / "kernel.so", library)


@functools.lru_cache(maxsize=16)
def _translated(source: str):
    """:func:`translate`, once per process for each source: every device a process makes loads
    the same library source, and translating it costs more than loading the compiled library."""
    return translate(source)


def load(source: str):
    """(ctypes library, [KernelInfo]) for an MSL source string."""
    unit, kernels = _translated(source)
    return ctypes.CDLL(str(build(unit)), mode=os.RTLD_LOCAL), list(kernels)
