"""verification.conformance: one table of framework × cell × dtype. PyTorch's CPU layers pass,
the mps row says it needs a Mac, a framework that is not installed is a row saying so, and
ONNX Runtime's forward ops pass through rnngrad.convert.onnx's layouts."""

import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_the_table_has_a_row_per_cell_and_dtype_and_says_what_it_could_not_run():
    done = subprocess.run([sys.executable, "-m", "verification.conformance", "--frameworks",
                           "pytorch", "pytorch-mps", "keras-tensorflow", "--examples", "3",
                           "--dtypes", "float32"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| pytorch |")]
    assert len(rows) == 3 and all("| passed |" in row for row in rows)
    assert "needs a Mac" in done.stdout
    assert "keras-tensorflow" in done.stdout


def test_onnxruntime_forward_ops_pass():
    pytest.importorskip("onnxruntime")
    from verification.conformance_onnx import check_onnxruntime

    counts = [check_onnxruntime(cell, examples=10, seed=1) for cell in ("single_gate", "gru", "lstm")]
    assert all(counts) and sum(counts) > 15
