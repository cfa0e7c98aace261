"""verification/gpu_profile.py's reading of an Nsight Compute report (no GPU needed): a real
report of one kernel launch, as ncu printed it on the H100 (tests/data)."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "verification"))

import gpu_profile  # noqa: E402

REPORT = (HERE / "data" / "ncu-strided_gemm_blocked.txt").read_text()


def test_summary_reads_each_launch_and_its_metrics():
    lines = gpu_profile.summary(REPORT + "\n" + REPORT).splitlines()
    heads = [l for l in lines if not l.startswith(" ")]
    assert len(heads) == 2  # one line a launch
    assert heads[0] == ("strided_gemm_blocked: duration ms 4.29; compute % peak 60.35; "
                        "memory % peak 60.54; occupancy % 37.11; registers 80; block 256; "
                        "grid 12,800; cycles between issues 9.78")


def test_findings_are_ranked_and_skip_missing_metric_notes():
    found = gpu_profile.findings(REPORT)
    assert found[0].startswith("est. speedup 62.5%: The 6.00 theoretical warps per scheduler")
    assert found[1].startswith("est. speedup 37.38%: On average, each warp of this workload "
                               "spends 3.7 cycles")
    assert not any("could not be found" in f for f in found)
    assert gpu_profile.summary("no kernel here") == ""
