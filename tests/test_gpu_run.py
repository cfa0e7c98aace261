"""verification/gpu_run.py's own machinery (it runs on the lent GPU machine, where time is short):
the deadline, and the few files it leaves in its output folder."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from pathlib import Path

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
