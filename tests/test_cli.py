"""The command line: ``rnngrad info`` and ``rnngrad verify`` (which must be able to fail)."""

import subprocess
import sys

import numpy as np
import pytest

from rnngrad import registry
from rnngrad.cli import main
from rnngrad.problem import ForwardArrays
from rnngrad.backends.reference import BACKEND as REFERENCE


def test_info_lists_every_backend_and_why(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for name in registry.all_backends():
        assert name in out
    assert "reference       available" in out or "reference  available" in out.replace("  ", " ")


def test_info_says_where_numba_kernels_are_cached(capsys, tmp_path, numba_cache_home):
    nb = numba_cache_home
    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "numba kernel cache" in x)
    assert f"{tmp_path}/rnngrad/numba/" in line and nb.sources_stamp()[:16] in line


def test_info_says_which_kernels_are_compiled_ahead(capsys, numba_cache_home):
    from rnngrad.backends.numba import warmup

    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "compiled ahead" in x)
    assert "0 of 6" in line and "lstm float32" in line and "single_gate float64" in line
    for cell in warmup.CELLS:  # as compile_kernels leaves them once the float32 tasks are done
        open(warmup._marker(cell, "float32"), "w").close()
    assert main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "compiled ahead" in x)
    assert "3 of 6" in line and "lstm float32" not in line and "lstm float64" in line


def test_python_dash_m_runs_the_same_command():
    done = subprocess.run([sys.executable, "-m", "rnngrad", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("rnngrad ")


def test_verify_passes_on_the_reference(capsys):
    assert main(["verify", "--examples", "3"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "FAIL" not in out and "0 failed" in out


def test_verify_rejects_an_unknown_backend(capsys):
    assert main(["verify", "--backend", "nonesuch"]) == 2
    assert "unknown backend 'nonesuch'" in capsys.readouterr().err


@pytest.fixture
def broken_backend(monkeypatch):
    """A backend whose LSTM forward is off by 1e-3: verify must catch it."""
    def forward(problem):
        out = REFERENCE.implementations[(problem.cell, "forward")](problem)
        return ForwardArrays(out.h + np.asarray(1e-3, out.h.dtype), out.c, out.z_state)

    implementations = dict(REFERENCE.implementations)
    implementations[("lstm", "forward")] = forward
    broken = registry.Backend("broken", REFERENCE.dtypes, implementations)
    spec = registry._Spec("broken", "rnngrad.backends.reference", "BACKEND", False, "")
    monkeypatch.setattr(registry, "_SPECS", registry._SPECS + (spec,))
    monkeypatch.setitem(registry._loaded, "broken", (broken, None))
    return "broken"


def test_verify_fails_on_a_wrong_backend_and_prints_a_reproduction(broken_backend, capsys):
    status = main(["verify", "--backend", broken_backend, "--examples", "2", "--skip-reference"])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAIL broken lstm forward vs reference" in out
    assert "Case(" in out and "state[" in out


def test_a_backend_that_fails_to_load_fails_verify(monkeypatch, capsys):
    """Installed but broken (an import error inside rnngrad) is a failure, not a skipped backend."""
    spec = registry._Spec("halfbuilt", "rnngrad.no_such_backend_module", "BACKEND", True, "needs nothing")
    monkeypatch.setattr(registry, "_SPECS", registry._SPECS + (spec,))
    monkeypatch.delitem(registry._loaded, "halfbuilt", raising=False)
    assert [name for name, _ in registry.broken_backends()] == ["halfbuilt"]
    assert main(["verify", "--examples", "1", "--skip-reference", "--backend", "reference"]) == 1
    out = capsys.readouterr().out
    assert "FAIL halfbuilt" in out and "failed to import" in out


def test_info_says_where_an_available_backend_runs(capsys, monkeypatch):
    """A backend that names its device (metal-cuda: the GPU) has it printed under its row."""
    backend = registry.get("reference")
    monkeypatch.setattr(backend, "device", lambda: "the test's own device")
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    row = out.index("  reference")
    assert "on: the test's own device" in out[row:out.index("\n", out.index("\n", row) + 1)]
