"""verification/gpu_ab.py's own machinery, without a GPU: its arguments, its table, and a tree
whose process fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "verification"))

import gpu_ab  # noqa: E402


def test_the_table_has_each_ops_total_then_its_kernels_and_the_last_tree_over_the_first():
    results = {"ab/base": {"LSTM 1000x8x128x128": {"GEMMs": 0.5, "lstm_backward": 12.0}},
               ".": {"LSTM 1000x8x128x128": {"GEMMs": 0.25, "lstm_backward_v2": 6.0}}}
    lines = gpu_ab.table([Path("ab/base"), Path(".")], results).splitlines()
    assert lines[0] == "| op | kernel | ab/base ms | . ms | . ÷ ab/base |"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert rows == [["LSTM 1000x8x128x128", "total", "12.500", "6.250", "0.500"],
                    ["LSTM 1000x8x128x128", "GEMMs", "0.500", "0.250", "0.500"],
                    ["LSTM 1000x8x128x128", "lstm_backward", "12.000", "-", "-"],
                    ["LSTM 1000x8x128x128", "lstm_backward_v2", "-", "6.000", "-"]]


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "50x1x64"], "expected TxNxIxH"),
    (["--set", "no value"], "expected NAME=VALUE"),
    (["--rounds", "0"], "--rounds: expected at least 1, got 0"),
])
def test_wrong_arguments_say_what_was_expected(argv, message, capsys):
    with pytest.raises(SystemExit):
        gpu_ab.main([str(ROOT), *argv])
    assert message in capsys.readouterr().err


def test_a_folder_without_the_project_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_ab.main([str(ROOT), str(tmp_path)])
    assert f"tree {tmp_path}: expected a folder holding rnngrad/ and kernels/" in capsys.readouterr().err


def test_a_tree_whose_process_fails_is_named_with_its_output():
    """Here CuPy is missing (CI) or the tree's process fails for another reason: the parent
    names the tree and shows what its process printed, and exits 1."""
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy imports here: the tree's process would measure")
    except ImportError:
        pass
    done = subprocess.run([sys.executable, "verification/gpu_ab.py", ".", "--rounds", "1",
                           "--shapes", "5x1x4x4", "--cells", "RNN"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "gpu_ab: tree . failed (exit 1)" in done.stderr
    assert "gpu_ab: needs CuPy and PyTorch with CUDA" in done.stderr
