"""``rnngrad bench`` end to end on a tiny problem (the reference backend: nothing to compile),
and its timing workers."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from rnngrad.cli.bench import Worker, flops, gemm_summary


def _worker(**request):
    req = dict(impl="reference", cell="gru", T=3, N=2, I=4, H=5, dtype="float64", threads=1)
    req.update(request)
    return Worker(req, dict(os.environ))


def test_worker_times_at_least_repeats_runs():
    with _worker() as w:
        times = w.window(4)
    assert len(times) == 4 and all(t > 0 for t in times)


def test_worker_keeps_timing_for_min_seconds():
    with _worker() as w:
        times = w.window(2, min_seconds=0.3)
    assert len(times) > 2
    assert sum(times) >= 0.3 * 0.9 or len(times) >= 2000


def test_window_warms_up_untimed_first():
    from rnngrad.bench.worker import window
    calls = []
    times = window(lambda: calls.append(1), 2, warmup_seconds=0.02)
    assert len(times) == 2 and len(calls) > 2  # warm-up runs, then two timed
    calls.clear()
    assert len(window(lambda: calls.append(1), 2)) == 2 and len(calls) == 2  # no warm-up


def test_worker_stays_alive_for_window_after_window():
    """One process answers every window (its pid is the same throughout), and exits when
    closed."""
    with _worker() as w:
        assert w.first > 0
        pid = w._proc.pid
        sizes = [len(w.window(k)) for k in (1, 3, 2)]
        assert w._proc.pid == pid and w._proc.poll() is None
    assert sizes == [1, 3, 2]
    assert w._proc.returncode == 0


def test_a_failing_worker_reports_its_error():
    with pytest.raises(RuntimeError, match=r"(?s)worker no_such_backend failed .*unknown backend 'no_such_backend'"):
        _worker(impl="no_such_backend")


def test_a_metal_worker_names_the_kernel_versions_it_ran(monkeypatch):
    """On metal-emulated the first reply lists the host's choices: the recurrence kernels of the
    version the environment forces, and each GEMM's, each with its reason, once."""
    for setting, kernels in (("v2", ("lstm_forward_v2_spread_512", "lstm_backward_v2_ahead")),
                             ("v1", ("lstm_forward", "lstm_backward"))):
        env = dict(os.environ, RNNGRAD_METAL_RECURRENCE=setting)
        req = dict(impl="metal-emulated", cell="lstm", T=3, N=2, I=4, H=5, dtype="float32",
                   threads=1)
        with Worker(req, env) as w:
            chosen = w.versions
        recurrences = [line for line in chosen if " lstm_" in line]
        assert [line.split(" ")[2].rstrip(":") for line in recurrences] == list(kernels), chosen
        assert all(f"forced by RNNGRAD_METAL_RECURRENCE={setting}" in line for line in recurrences)
        assert any("strided_gemm" in line and "auto" in line for line in chosen)
        assert len(chosen) == len(set(chosen))
    with _worker() as w:  # the reference has no kernels to choose
        assert w.versions == []


def test_flops_count_the_six_products_of_a_training_step():
    # projection, recurrent product (forward and gradients), dW, dsource, dR: 2·T·N·G·H·(I+H)·3
    T, N, I, H = 5, 3, 7, 11
    per_step = {"single_gate": 1, "gru": 3, "lstm": 4}
    for cell, G in per_step.items():
        forward = 2 * T * N * G * H * I + 2 * T * N * G * H * H
        assert flops(cell, T, N, I, H) == 3 * forward


def test_gemm_summary_says_when_the_machine_drifted():
    steady = gemm_summary([250.0, 240.0, 230.0], "float32", 2)
    assert steady == ["GEMM rate (float32, 2 threads, NumPy): best 250.0 GFLOP/s, lowest 230.0 "
                      "over 3 windows"]
    drifted = gemm_summary([250.0, 120.0, 240.0], "float32", 2)
    assert len(drifted) == 2 and "drifted" in drifted[1] and "48% of the best" in drifted[1]
    assert gemm_summary([100.0], "float64", 1) == [
        "GEMM rate (float64, 1 threads, NumPy): best 100.0 GFLOP/s"]
    assert gemm_summary([9000.0], "float32", 2, "cuda") == [
        "GEMM rate (float32, cuBLAS through CuPy): best 9000.0 GFLOP/s"]


def test_bench_cli_writes_a_consistent_table(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rnngrad", "bench", "--shapes", "3x2x4x5", "--cells", "gru",
         "--backends", "reference", "--no-torch", "--passes", "2", "--repeats", "2",
         "--min-seconds", "0", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert len(data["gemm_gflops"]) == 2 and min(data["gemm_gflops"]) > 0
    (row,) = data["rows"]
    assert row["cell"] == "gru" and row["shape"] == [3, 2, 4, 5] and row["impl"] == "reference"
    assert len(row["times"]) == 4  # 2 passes × 2 runs
    assert row["median_s"] == statistics.median(row["times"])
    assert abs(row["gflops"] - flops("gru", 3, 2, 4, 5) / row["median_s"] / 1e9) <= 1e-9 * row["gflops"]
    assert row["ratio_to_torch"] is None and row["ratio_floor"] is None
    assert "GRU" in proc.stdout and "reference" in proc.stdout


def test_cells_are_taken_by_the_names_the_table_prints():
    import argparse

    from rnngrad.cli import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args(["--cells", "RNN", "gru", "LSTM"]).cells == ["single_gate", "gru", "lstm"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--cells", "elman"])


def test_bench_against_torch_reports_ratios_and_the_floor(tmp_path):
    """With PyTorch: ratio = median / PyTorch's median, the floor is the ratio at the best
    GEMM rate, flops / rate / PyTorch's median, each pass has its own ratio of medians, and
    the paired ratio is their median."""
    pytest.importorskip("torch")
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rnngrad", "bench", "--shapes", "4x2x3x5", "--cells", "lstm",
         "--backends", "reference", "--passes", "2", "--repeats", "2", "--min-seconds", "0",
         "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = {r["impl"]: r for r in data["rows"]}
    assert set(rows) == {"reference", "torch"}
    mine, theirs = rows["reference"], rows["torch"]
    assert abs(mine["ratio_to_torch"] - mine["median_s"] / theirs["median_s"]) <= 1e-12
    assert theirs["ratio_to_torch"] == 1.0
    best = max(data["gemm_gflops"]) * 1e9
    assert abs(mine["ratio_floor"] - flops("lstm", 4, 2, 3, 5) / best / theirs["median_s"]) <= 1e-12
    assert len(mine["pass_times"]) == 2 and sum(mine["pass_times"], []) == mine["times"]
    for k in range(2):
        want = statistics.median(mine["pass_times"][k]) / statistics.median(theirs["pass_times"][k])
        assert abs(mine["pass_ratios"][k] - want) <= 1e-12
    assert theirs["pass_ratios"] == [1.0, 1.0]
    assert mine["paired_ratio"] == statistics.median(mine["pass_ratios"])
    assert theirs["paired_ratio"] == 1.0
    assert "–" in proc.stdout and "paired" in proc.stdout  # the per-pass columns


def test_plot_takes_a_median_outside_the_per_pass_range(tmp_path):
    """The median over all runs can lie outside the per-pass ratios' range (passes of
    different lengths): the plot still draws, whiskers spanning the range."""
    pytest.importorskip("matplotlib")
    import matplotlib.image

    from rnngrad.cli.bench import plot
    rows = [dict(cell="gru", shape=(1000, 8, 128, 128), impl="numba", ratio_to_torch=0.28,
                 pass_ratios=[0.20, 0.27, 0.21]),
            dict(cell="gru", shape=(1000, 8, 128, 128), impl="torch", ratio_to_torch=1.0,
                 pass_ratios=[1.0, 1.0, 1.0]),
            dict(cell="lstm", shape=(50, 1, 64, 64), impl="numba", ratio_to_torch=0.43,
                 pass_ratios=[0.66, 0.29, 0.45])]
    path = tmp_path / "ratios.png"
    plot(rows, path)
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (480, 960)  # 8 × 4 inches at 120 dpi


def test_plot_marks_the_floor_in_red(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image
    import numpy as np

    from rnngrad.cli.bench import plot
    row = dict(cell="single_gate", shape=(100, 32, 256, 256), impl="numba",
               ratio_to_torch=0.6, pass_ratios=[0.55, 0.65])

    def red_pixels(rows):
        path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.png"
        plot(rows, path)
        rgb = matplotlib.image.imread(path)[..., :3]
        return int(np.sum((rgb[..., 0] > 0.7) & (rgb[..., 1] < 0.3) & (rgb[..., 2] < 0.3)))

    assert red_pixels([row]) == 0
    assert red_pixels([dict(row, ratio_floor=0.3)]) > 50
