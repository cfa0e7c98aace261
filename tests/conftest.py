"""Hypothesis settings profiles: ``dev`` (default, quick), ``ci`` and ``thorough``; the
``numba_cache_home`` fixture; the numba kernels compiled in parallel on first use.

Choose a profile with ``pytest --hypothesis-profile=thorough`` or ``HYPOTHESIS_PROFILE=thorough``.
"""

import os

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
