"""verification/gpu_run.py's own machinery (it runs on the lent GPU machine, where time is short):
the deadline, the few files it leaves in its output folder, and the op its bench times."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "verification"))

import gpu_run  # noqa: E402


def test_a_step_past_the_deadline_is_skipped_and_runs_nothing(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setattr(gpu_run, "DEADLINE", time.time() + 2)
    code, text = gpu_run.step("late", [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path)
    assert code is None and "past --deadline" in text and not marker.exists()
    monkeypatch.setattr(gpu_run, "DEADLINE", time.time() + 60)
    code, text = gpu_run.step("in time", [sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path)
    assert code == 0 and marker.exists()


def test_a_step_that_runs_past_the_deadline_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_run, "DEADLINE", time.time() + 6)
    start = time.time()
    code, text = gpu_run.step("slow", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    assert code == 124 and "TIMEOUT" in text and time.time() - start < 30


def test_the_output_folder_holds_a_record_and_one_archive_of_the_logs(tmp_path):
    done = subprocess.run([sys.executable, "verification/gpu_run.py", "--out", str(tmp_path),
                           "--skip", "tests", "verify", "sanitizer", "fast-math", "bench"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs.tar.gz", "run.txt"]
    record = (tmp_path / "run.txt").read_text()
    assert "=== summary" in record and record.strip() == done.stdout.strip()
    with tarfile.open(tmp_path / "logs.tar.gz") as archive:
        names = {Path(n).name for n in archive.getnames()}
    assert {"environment.log", "compile.log"} <= names


def _fake_row(cell, shape):
    labels = ("auto", *gpu_run.STEP_LABELS)
    return dict(cell=cell, shape=shape, rnngrad_kernel_ms=2.0, rnngrad_wall_ms=3.0,
                rnngrad_wall_unpoisoned_ms=2.5, cudnn_kernel_ms=1.0, cudnn_wall_ms=1.5,
                dispatches=7, per_kernel_ms={"GEMMs": 1.0, "lstm_forward_v2": 1.0},
                per_kernel={"GEMMs": dict(us_per_step=10.0, flop_fraction=0.1, bandwidth_fraction=0.01)},
                v1_kernel_ms=4.0, v1_per_kernel_ms={"GEMMs": 2.0, "lstm_forward": 2.0},
                kernels=["lstm_forward_v2", "strided_gemm"],
                gemm_ms={v: 1.0 for v in gpu_run.GEMM_LABELS}, gflops=100.0,
                steps_forward_ms={c: 1.0 for c in labels}, steps_backward_ms={c: 1.5 for c in labels},
                steps_dispatches={c: 51 for c in gpu_run.STEP_LABELS},
                rnngrad_device_ms=1.25, rnngrad_device_all_ms=1.5, rnngrad_span_ms=2.75,
                v1_device_ms=3.5, device_per_kernel_ms={"GEMMs": 0.5, "lstm_forward": 0.75, "other": 0.25,
                                                        "span": 2.75},
                steps_device_ms={c: (0.5, 0.75) for c in ("v1", *labels)},
                gemm_device_ms={"v1": 0.5, "v3": 0.25, "v5": 0.125, "auto": 0.25})


def test_the_bench_tables_print_from_the_bench_rows(tmp_path, monkeypatch, capsys):
    """The tables after the bench (run only on the GPU machine) print from rows of the fields
    bench() returns: a format error there would cost a lent machine's time."""
    monkeypatch.setattr(gpu_run, "step", lambda name, cmd, out, **kw: (0, ""))
    monkeypatch.setattr(gpu_run, "ceilings", lambda: (3.0e12, 5.0e13))
    monkeypatch.setattr(gpu_run, "bench", lambda out, quick, cells, shapes: [
        _fake_row("LSTM", "50x1x64x64"), _fake_row("GRU", "100x32x256x256")])
    code = gpu_run.main(["--out", str(tmp_path), "--skip", "tests", "verify", "sanitizer",
                         "fast-math", "cli-bench"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert ("| LSTM | 50x1x64x64 | 2.000 | 4.000 | 2.0 | 1.000 | 2.00 | 3.000 | 2.500 | 1.500 | "
            "2.00 | 7 |") in printed
    assert "| GRU | 100x32x256x256 | 1.000 / 1.500 | 1.000 / 1.500 (51) |" in printed
    assert "| LSTM | 50x1x64x64 | 1.250 | 1.25 | 1.500 | 2.750 | 3.500 | 1.000 |" in printed
    assert ("| LSTM | 50x1x64x64 | " + " | ".join(["0.500 / 0.750"] * (len(gpu_run.STEP_LABELS) + 1))
            + " | 0.500 / 0.250 / 0.125 / 0.250 |") in printed  # GEMMs v1, v3, v5, the rule
    assert "bench                                         2 rows, bench.json" in printed


def test_paired_walls_alternate_the_two_and_take_each_median():
    """The two functions' windows alternate (first, second, first, ...), and each result is the
    median of its own windows: one window a hiccup hit does not move it."""
    calls, times = [], {"a": iter([1.0, 9.0, 1.2, 1.1, 0.9]), "b": iter([2.0, 2.2, 30.0, 1.8, 2.1])}

    def timer(fn, reps):
        calls.append((fn, reps))
        return next(times[fn])
    a, b = gpu_run.paired_walls("a", "b", 20, windows=5, timer=timer)
    assert (a, b) == (1.1, 2.1)
    assert calls == [("a", 20), ("b", 20)] * 5


@pytest.mark.parametrize("module", ["RNN", "GRU", "LSTM"])
def test_the_benchs_step_gives_the_input_gradient_torch_autograd_gives(module):
    """gpu_run.metal_step, the op the bench and gpu_ab.py time, run on the reference backend with
    NumPy arrays (no GPU): its gradient of the input against PyTorch's autograd, float64."""
    import numpy as np
    import torch

    from rnngrad.convert import torch as rgt
    from rnngrad.testing import compare_array

    torch.manual_seed(0)
    m = getattr(torch.nn, module)(3, 4).double()
    x = np.random.default_rng(0).standard_normal((5, 2, 3))
    gy = np.random.default_rng(1).standard_normal((5, 2, 4))
    got = gpu_run.metal_step(rgt.from_module(m), x, gy, backend="reference", xp=np)()
    xt = torch.tensor(x, requires_grad=True)
    m(xt)[0].backward(torch.tensor(gy))
    worst, mismatch = compare_array("source", got.as_dict()["source"], xt.grad.numpy(), np.float64)
    assert mismatch is None, str(mismatch)


def test_also_layer_and_compile_bench_the_layer_eager_and_under_reduce_overhead(tmp_path, monkeypatch):
    """``--also layer compile``: bench_layer.py twice, the second with both sides under
    torch.compile(mode="reduce-overhead"), each with a JSON of its own."""
    commands = []
    monkeypatch.setattr(gpu_run, "step", lambda name, cmd, out, **kw: commands.append(cmd) or (0, ""))
    code = gpu_run.main(["--out", str(tmp_path), "--skip", "tests", "verify", "sanitizer",
                         "fast-math", "bench", "--also", "layer", "compile"])
    assert code == 0
    layer = [cmd for cmd in commands if "verification/bench_layer.py" in cmd]
    assert len(layer) == 2 and "--compile" not in layer[0], layer
    assert layer[1][layer[1].index("--compile") + 1] == "reduce-overhead", layer
    assert {Path(cmd[cmd.index("--json") + 1]).name for cmd in layer} == {"layer.json", "compile.json"}


def test_a_step_runs_in_its_copy_of_the_project_with_the_path_it_was_given(tmp_path, monkeypatch):
    """A step of another copy (``root``) runs there with that copy first on the path, and
    packages on the caller's PYTHONPATH (a folder of carried wheels) stay importable after it."""
    tree, site = tmp_path / "base", tmp_path / "site"
    (tree / "rnngrad").mkdir(parents=True)
    (tree / "rnngrad" / "__init__.py").write_text("WHERE = 'base'\n")
    site.mkdir()
    (site / "carried.py").write_text("OK = True\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    code, text = gpu_run.step("probe", [sys.executable, "-c", (
        "import os, rnngrad, carried; print(os.getcwd(), rnngrad.WHERE, carried.OK)")],
        tmp_path, root=tree)
    assert code == 0, text
    assert text.split() == [str(tree), "base", "True"]


def test_also_host_times_each_baseline_copy_first_then_this_one(tmp_path, monkeypatch):
    """``--also host step --baseline TREE``: gpu_host.py in the baseline copy (its own script,
    run there), then here; gpu_step_profile.py with its trace among the logs."""
    base = tmp_path / "base"
    (base / "verification").mkdir(parents=True)
    (base / "verification" / "gpu_host.py").write_text("")
    calls = []
    monkeypatch.setattr(gpu_run, "step", lambda name, cmd, out, root=gpu_run.ROOT, **kw:
                        calls.append((cmd, root)) or (0, "... wait for the device: none"))
    code = gpu_run.main(["--out", str(tmp_path / "out"), "--skip", "tests", "verify", "sanitizer",
                         "fast-math", "bench", "--also", "host", "step", "--baseline", str(base)])
    assert code == 0
    host = [(cmd, root) for cmd, root in calls if "verification/gpu_host.py" in cmd]
    assert [root for _, root in host] == [base.resolve(), gpu_run.ROOT], host
    assert all(cmd[cmd.index("--shapes") + 1] == "50x1x64x64" for cmd, _ in host)
    profile = [cmd for cmd, _ in calls if "verification/gpu_step_profile.py" in cmd]
    assert len(profile) == 1 and Path(profile[0][profile[0].index("--out") + 1]).name == "logs"


@pytest.mark.parametrize("argv, says", [
    (["--also", "host", "--baseline", "no/such/copy"], "expected a copy of the project"),
    (["--baseline", "."], "only --also host"),
])
def test_a_baseline_that_is_no_copy_or_has_no_host_step_is_refused(tmp_path, argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_run.main(["--out", str(tmp_path), *argv])
    assert exit_.value.code == 2 and says in capsys.readouterr().err
