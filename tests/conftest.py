"""Hypothesis settings profiles: ``dev`` (default, quick), ``ci`` and ``thorough``; the
``numba_cache_home`` fixture; the numba kernels compiled in parallel on first use; the Metal
library compiled for the CPU harness beside the first tests.

Choose a profile with ``pytest --hypothesis-profile=thorough`` or ``HYPOTHESIS_PROFILE=thorough``.
"""

import contextlib
import os
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=25, **_common)
settings.register_profile("ci", max_examples=40, derandomize=True, print_blob=True, **_common)
settings.register_profile("thorough", max_examples=400, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_sessionstart(session):
    """On first use, compile the numba backend's kernels in parallel processes before the tests
    call them one by one (``rnngrad.backends.numba.warmup``): about half the time on two cores."""
    try:
        from rnngrad.backends.numba.warmup import compile_kernels
    except ImportError:  # numba not installed: its tests skip
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    compile_kernels(report=reporter.write_line if reporter else None)


#: words in a test file's text that say it runs the Metal kernels on the CPU harness
_HARNESS_WORDS = ("metal-emulated", "emulated_device", "harness import cpu")
_harness_build = []  # the thread compiling the Metal library, once started


def _runs_the_harness(path, seen={}):
    if path not in seen:
        try:
            text = Path(path).read_text()
        except OSError:
            text = ""
        seen[path] = any(word in text for word in _HARNESS_WORDS)
    return seen[path]


def pytest_collection_finish(session):
    """Where the selected tests run the Metal kernels on the CPU harness and its compiled
    library is not in the cache yet, compile it in a background thread while the first tests
    run (the compiler is another process: it takes the other core). A test that needs the
    library before it is ready waits for that compilation rather than starting its own; one that
    fails is left to the test, which compiles again and reports the error."""
    if not any(_runs_the_harness(item.path) for item in session.items):
        return
    try:
        from rnngrad.backends.metal import library
        from rnngrad.backends.metal.backends import EMULATED_BACKEND
        from rnngrad.backends.metal.harness.cpu import _loader
    except ImportError:
        return
    if EMULATED_BACKEND.probe() is not None:
        return

    def build():
        try:
            _loader.build(_loader._translated(library.source())[0])
        except Exception:  # noqa: BLE001 (the test that loads it reports the error)
            pass

    thread = threading.Thread(target=build, name="metal library", daemon=True)
    thread.start()
    _harness_build.append(thread)


def pytest_sessionfinish(session):
    for thread in _harness_build:  # not left half-written in the cache
        thread.join()


@pytest.fixture
def numba_cache_home(tmp_path, monkeypatch):
    """The numba backend's kernel cache folder worked out anew under ``XDG_CACHE_HOME =
    tmp_path`` (a test may point it elsewhere), with ``NUMBA_CACHE_DIR`` unset; yields the
    backend module. Afterwards the folder is worked out anew from the real environment."""
    nb = pytest.importorskip("rnngrad.backends.numba")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(nb.numba.config, "CACHE_DIR", "")
    nb.kernel_cache_dir.cache_clear()
    yield nb
    nb.kernel_cache_dir.cache_clear()  # before monkeypatch restores the environment


@pytest.fixture(params=["v1", "v2", "v3"])
def recurrence_version(request, monkeypatch):
    """The Metal recurrences' kernel version for the test (``$RNNGRAD_METAL_RECURRENCE``): each
    test that asks for it runs with v1, v2 and v3 (v3 one dispatch a step; a GRU without
    reset_after, which v3 cannot run, gets the rule's version)."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", request.param)
    return request.param


@pytest.fixture
def metal_rules(request):
    """``metal_rules(**changes)`` runs the rest of the test under the Metal version rules with
    ``changes`` (``rnngrad.backends.metal.versions.overrides``: forced versions, thresholds)."""
    from rnngrad.backends.metal import versions

    stack = contextlib.ExitStack()
    request.addfinalizer(stack.close)
    return lambda **changes: stack.enter_context(versions.overrides(**changes))


@pytest.fixture
def op_calls(monkeypatch):
    """The ops rnngrad.torch runs from here on, as a list of ``(cell, gradients, descriptor,
    given, result)``: every call of ``rnngrad.torch._compute``'s op (its arguments as the
    backend's arrays, and the backend's result)."""
    pytest.importorskip("torch")
    from rnngrad.torch import _compute

    calls = []
    original = _compute.run_checked

    def spy(cell, gradients, descriptor, backend, given):
        out = original(cell, gradients, descriptor, backend, given)
        calls.append((cell, gradients, descriptor, given, out))
        return out
    monkeypatch.setattr(_compute, "run_checked", spy)
    return calls
