"""Where the numba backend keeps its compiled kernels: in rnngrad's per-user cache folder, one
folder per installation and state of the sources, never inside the package (a cache left in
site-packages outlives ``pip uninstall`` and shadows a later editable install)."""

import inspect
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("numba")

import rnngrad.backends.numba as nb  # noqa: E402
from numba.core import caching  # noqa: E402

PACKAGE = Path(nb.__file__).resolve().parent

# compiles one small cached kernel in a fresh process and prints the folder it was cached in
COMPILE_ONE = """
import numpy as np
import rnngrad.backends.numba as nb
from rnngrad.backends.numba import activations as a
a.activate(a.TANH, np.zeros(3), np.empty(3))
print(nb.kernel_cache_dir())
"""


def _run_fresh(tmp_path, source, **env):
    """``python -c source`` in a new process with ``XDG_CACHE_HOME = tmp_path/xdg`` and without
    ``NUMBA_CACHE_DIR`` (unless given in ``env``); checks it succeeded and returns it."""
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    environ.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), **env)
    done = subprocess.run([sys.executable, "-c", source], env=environ, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


def _compile_in_fresh_process(tmp_path, **env):
    return Path(_run_fresh(tmp_path, COMPILE_ONE, **env).stdout.strip().splitlines()[-1])


def _cache_files(folder):
    return sorted(p.name for p in Path(folder).rglob("*") if p.suffix in (".nbi", ".nbc"))


def test_kernels_are_cached_in_the_user_cache_not_in_the_package(tmp_path):
    before = _cache_files(PACKAGE)
    folder = _compile_in_fresh_process(tmp_path)
    assert folder.is_relative_to(tmp_path / "xdg" / "rnngrad" / "numba"), folder
    assert [n for n in _cache_files(folder) if n.startswith("activations.activate-")], \
        f"no cached activate kernel in {folder}: {_cache_files(folder)}"
    assert _cache_files(PACKAGE) == before == [], f"cache files inside the package: {before}"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_numba_cache_dir_is_used_when_set(tmp_path):
    _compile_in_fresh_process(tmp_path, NUMBA_CACHE_DIR=str(tmp_path / "mine"))
    assert [n for n in _cache_files(tmp_path / "mine") if n.startswith("activations.activate-")]
    assert _cache_files(tmp_path / "xdg") == []


def test_new_sources_get_a_new_folder_and_the_older_ones_go(tmp_path, monkeypatch,
                                                            numba_cache_home):
    stamps = iter(["a" * 64, "b" * 64])
    monkeypatch.setattr(nb, "sources_stamp", lambda: next(stamps))
    first = Path(nb.kernel_cache_dir())
    (first / "lstm.forward-1.py311.nbi").write_bytes(b"old")
    nb.kernel_cache_dir.cache_clear()  # as a new process with the new sources would
    second = Path(nb.kernel_cache_dir())
    assert first.name == "a" * 16 and second.name == "b" * 16
    assert first.parent == second.parent
    assert second.is_dir() and not first.exists()
    assert first.parent.parent == tmp_path / "rnngrad" / "numba"


def test_sources_stamp_follows_every_compiled_source_file(tmp_path):
    for source in PACKAGE.glob("*.py"):
        (tmp_path / source.name).write_bytes(source.read_bytes())
    (tmp_path / "notes.txt").write_text("not a source")
    assert nb.sources_stamp(str(tmp_path)) == nb.sources_stamp()
    stamps = {nb.sources_stamp()}
    for name in ("gemm.py", "activations.py"):  # an inlined helper's file counts like a kernel's
        (tmp_path / name).write_text((tmp_path / name).read_text() + "\n# edited\n")
        stamps.add(nb.sources_stamp(str(tmp_path)))
    (tmp_path / "gemm.py").rename(tmp_path / "gemm2.py")
    stamps.add(nb.sources_stamp(str(tmp_path)))
    assert len(stamps) == 4
    for name in ("driver.py", "overlap.py", "__init__.py"):  # no compiled code in them
        (tmp_path / name).write_text((tmp_path / name).read_text() + "\n# edited\n")
        assert nb.sources_stamp(str(tmp_path)) in stamps
    (tmp_path / "new_kernels.py").write_text("import numba\n\n@numba.njit\ndef f(x):\n    return x\n")
    assert nb.sources_stamp(str(tmp_path)) not in stamps


def _locate_activate():
    from rnngrad.backends.numba import activations
    py_func = activations.activate.py_func
    return nb.KernelCacheLocator.from_function(py_func, inspect.getfile(py_func))


def test_the_locator_takes_this_package_s_kernels(tmp_path, numba_cache_home):
    locator = _locate_activate()
    assert Path(locator.get_cache_path()).is_relative_to(tmp_path / "rnngrad" / "numba")


def test_an_unusable_cache_folder_leaves_the_kernels_to_numba(tmp_path, monkeypatch,
                                                              numba_cache_home):
    """A read-only home, or a file where the folder should be: the locator declines (numba's
    own locators decide) instead of raising, and ``rnngrad info`` says so."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert _locate_activate() is None
    assert nb.cache_location().startswith("numba's own locations")


def test_a_cache_folder_others_can_write_is_refused_with_a_warning(tmp_path, numba_cache_home):
    (tmp_path / "rnngrad").mkdir()
    os.chmod(tmp_path / "rnngrad", 0o777)
    with pytest.warns(UserWarning, match="refusing to load compiled kernels"):
        assert _locate_activate() is None


def _slow_index(cache_file_class):
    """The class with its index read slowed down, so that two saves started together both read
    the index before either writes it (the window of the race, widened)."""
    class Slow(cache_file_class):
        def _load_index(self):
            overloads = super()._load_index()
            time.sleep(0.2)
            return overloads
    return Slow


def _save_two_signatures_at_once(folder, cache_file_class):
    """Two threads save different keys of one kernel into ``folder`` at the same moment; returns
    what a fresh reader then loads for each key."""
    folder.mkdir()
    args = dict(cache_path=str(folder), filename_base="kernel-1.py311", source_stamp="stamp")
    saves = [threading.Thread(target=cache_file_class(**args).save, args=(key, f"code of {key}"))
             for key in ("float32", "float64")]
    for thread in saves:
        thread.start()
    for thread in saves:
        thread.join()
    reader = caching.IndexDataCacheFile(**args)
    return {key: reader.load(key) for key in ("float32", "float64")}


@pytest.mark.skipif(nb.fcntl is None, reason="flock is POSIX only")
def test_saves_of_two_signatures_at_once_keep_each_its_own_code(tmp_path):
    # numba's own cache file loses one of them, or points it at the other's code ...
    unlocked = _save_two_signatures_at_once(tmp_path / "numba",
                                            _slow_index(caching.IndexDataCacheFile))
    assert unlocked != {"float32": "code of float32", "float64": "code of float64"}, unlocked
    # ... the backend's keeps both
    locked = _save_two_signatures_at_once(tmp_path / "rnngrad", _slow_index(nb.LockedCacheFile))
    assert locked == {"float32": "code of float32", "float64": "code of float64"}


LIST_CACHE_FILES = """
import sys
from numba.core import caching
import rnngrad.backends.numba as nb
kinds = {}
for name, module in list(sys.modules.items()):
    if name.startswith("rnngrad.backends.numba"):
        for attr, obj in vars(module).items():
            cache = getattr(obj, "_cache", None)
            if isinstance(cache, caching.FunctionCache):
                kind = type(cache._cache_file).__name__
                kinds[obj.py_func.__module__ + "." + obj.py_func.__name__] = kind
print(kinds)
"""


@pytest.mark.skipif(nb.fcntl is None, reason="flock is POSIX only")
def test_every_cached_kernel_saves_and_loads_under_the_lock(tmp_path):
    done = _run_fresh(tmp_path, LIST_CACHE_FILES)
    kinds = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 (our own printed dict)
    assert {"rnngrad.backends.numba.lstm.forward", "rnngrad.backends.numba.gru.gradient_op",
            "rnngrad.backends.numba.activations.activate"} <= set(kinds), sorted(kinds)
    assert set(kinds.values()) == {"LockedCacheFile"}, kinds


WARM_UP = """
from rnngrad.backends.numba.warmup import compile_kernels, missing
print(missing(cells=("single_gate",)))
compile_kernels(cells=("single_gate",), processes=2)
print(missing(cells=("single_gate",)))
"""

# a new process's first calls, and whether each op was compiled or loaded from the cache
FIRST_CALLS = """
from rnngrad.backends.numba import single_gate, warmup
for dtype in ("float32", "float64"):
    warmup.run_task("single_gate", dtype)
print({op.py_func.__name__: (sum(op.stats.cache_hits.values()), sum(op.stats.cache_misses.values()))
       for op in (single_gate.forward_op, single_gate.gradient_op, single_gate.forward,
                  single_gate.backward)})
"""


@pytest.mark.slow  # compiles the single-gate kernels of both dtypes from an empty cache
def test_kernels_compiled_by_the_workers_load_in_a_new_process(tmp_path):
    done = _run_fresh(tmp_path, WARM_UP)
    before, after = done.stdout.strip().splitlines()[-2:]
    assert before == "[('single_gate', 'float32'), ('single_gate', 'float64')]" and after == "[]"
    assert "[2/2] single_gate" in done.stderr, done.stderr
    done = _run_fresh(tmp_path, FIRST_CALLS)
    # (loaded, compiled) per op: both dtypes loaded, none compiled
    assert eval(done.stdout.strip().splitlines()[-1]) == {  # noqa: S307 (our own printed dict)
        "forward_op": (2, 0), "gradient_op": (2, 0), "forward": (2, 0), "backward": (2, 0)}


# a parallel kernel and a serial one calling it, both cached beside this module
PARALLEL_CALLEE = """
import numba


@numba.njit(parallel=True, cache=True)
def inner(a):
    for i in numba.prange(a.shape[0]):
        a[i] += 1.0


@numba.njit(cache=True)
def outer(a):
    inner(a)
"""


def test_a_cached_kernel_whose_parallel_callee_came_from_the_cache_runs(tmp_path):
    # numba records that a cached kernel needs its thread pool only when the parallel callee
    # was compiled in the same process: `outer`, compiled while `inner` came from the cache,
    # then loaded in a fresh process, calls an unset scheduler, unless the pool was started
    # (importing the numba backend starts it)
    (tmp_path / "toy.py").write_text(PARALLEL_CALLEE)
    call = ("import sys; sys.path.insert(0, {folder!r}); import numpy as np; "
            "import rnngrad.backends.numba; import toy; a = np.zeros(4); toy.{fn}(a); print(a)")
    environ = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    for fn in ("inner", "outer", "outer"):  # compile inner; compile outer on it; load outer
        done = subprocess.run([sys.executable, "-c", call.format(folder=str(tmp_path), fn=fn)],
                              env=environ, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (fn, done.returncode, done.stderr[-2000:])
        assert done.stdout.split() == ["[1.", "1.", "1.", "1.]"], done.stdout
    assert list((tmp_path / "__pycache__").glob("toy.outer-*.nbc")), "outer was not cached"


def test_the_gemm_adapters_compile_once_not_in_every_process(tmp_path):
    # the adapters (oneDNN's, and np.dot's and the small loop's under RNNGRAD_BLAS=openblas)
    # are compiled at import; a second process must load them, adding no cache entry
    def entries():
        return sorted(p.name for p in (tmp_path / "xdg").rglob("libraries.*.nbc"))

    for blas in ("", "openblas"):
        _run_fresh(tmp_path, "import rnngrad.backends.numba", RNNGRAD_BLAS=blas)
        first = entries()
        _run_fresh(tmp_path, "import rnngrad.backends.numba", RNNGRAD_BLAS=blas)
        assert entries() == first, f"RNNGRAD_BLAS={blas!r}: compiled again in a new process"
    assert [n for n in first if "_np_dot_functions" in n], first


def test_nothing_is_compiled_ahead_with_numba_cache_dir_or_one_process(tmp_path, monkeypatch,
                                                                       numba_cache_home):
    from rnngrad.backends.numba import warmup

    assert warmup.missing(("float32",)) == [(c, "float32") for c in warmup.CELLS]
    assert warmup.compile_kernels(("float32",), processes=1) == 0.0
    monkeypatch.setattr(numba_cache_home.numba.config, "CACHE_DIR", str(tmp_path / "mine"))
    assert warmup.missing(("float32",)) == []
    assert warmup.compile_kernels(("float32",)) == 0.0
    # no usable folder of rnngrad's (a file where it should be): numba's own locations, unlocked
    monkeypatch.setattr(numba_cache_home.numba.config, "CACHE_DIR", "")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    numba_cache_home.kernel_cache_dir.cache_clear()
    assert warmup.missing(("float32",)) == []


def test_no_worker_processes_leaves_the_kernels_to_first_use(monkeypatch, numba_cache_home):
    from rnngrad.backends.numba import warmup

    def refuse(*args, **kwargs):
        raise OSError(38, "Function not implemented")
    monkeypatch.setattr(warmup.concurrent.futures, "ProcessPoolExecutor", refuse)
    lines = []
    assert warmup.compile_kernels(("float32",), processes=2, report=lines.append) == 0.0
    assert "no worker processes" in lines[-1] and "first use" in lines[-1]
    assert warmup.missing(("float32",)) == [(c, "float32") for c in warmup.CELLS]
