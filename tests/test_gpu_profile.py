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


SOURCE = (HERE / "data" / "ncu-source-lstm_forward_v2.csv").read_text()  # its first 40 lines


def test_sass_hotspots_rank_instructions_by_stall_samples():
    header = '"Address","Source","Warp Stall Sampling (All Samples)","# Samples"'
    report = ('"Kernel Name","__mtl_launch_k",\n' + header + "\n"
              '"0x10","FFMA R1, R2, R3, R1","1","1"\n'
              '"0x20","LDG.E R4, desc[UR4][R6.64]","6","6"\n'
              '"0x30","BAR.SYNC.DEFER_BLOCKING 0x0","3","3"\n')
    lines = gpu_profile.sass_hotspots(report, 2).splitlines()
    assert lines[0] == "k: 10 warp stall samples; the top 2 instructions:"
    assert lines[1].split() == ["60.0%", "0x20", "LDG.E", "R4,", "desc[UR4][R6.64]"]
    assert lines[2].split()[:2] == ["30.0%", "0x30"] and len(lines) == 3
    # a real source page: the kernel named, its instructions ranked
    real = gpu_profile.sass_hotspots(SOURCE, 5).splitlines()
    assert real[0].startswith("lstm_forward_v2: ") and len(real) == 6
    shares = [float(line.split("%")[0]) for line in real[1:]]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0
    assert gpu_profile.sass_hotspots("no source page", 5) == ""


def test_as_bench_reaches_the_profiled_child(tmp_path, monkeypatch):
    """--as-bench (profile the bench's op, not a random case) is passed on to the process ncu
    runs, after --child, with the cell and shape; without it the child gets a random case."""
    calls = []

    class Done:
        stdout, stderr, returncode = "", "", 0

    def run(cmd, **kwargs):
        calls.append(cmd)
        return Done()

    monkeypatch.setattr(gpu_profile.subprocess, "run", run)
    for flag in (["--as-bench"], []):
        assert gpu_profile.main([*flag, "--cell", "gru", "--shape", "2x1x3x4",
                                 "--out", str(tmp_path)]) == 0
    with_flag, without = calls
    child = with_flag[with_flag.index("--child"):]
    assert child[:5] == ["--child", "--cell", "gru", "--shape", "2x1x3x4"]
    assert "--as-bench" in child and "--as-bench" not in without
