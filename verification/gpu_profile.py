"""Nsight Compute's view of rnngrad's kernels on the GPU machine: one forward + gradients of a
cell through ``metal-cuda``, each kernel the version rule picks (or ``--recurrence`` /
``--gemm`` force) profiled once, with the sections that say what bounds it.

    python verification/gpu_profile.py [--cell lstm] [--shape 200x64x512x512]
                                       [--kernels REGEX] [--as-bench] [--out DIR]

Runs ``ncu`` on itself (``--child``) and prints, per kernel launch, its duration, the compute
and memory throughput as a share of the GPU's peak, the achieved occupancy and registers, and
the warp stall reasons that dominate; the full report goes to ``DIR/profile.txt``. With
``--sass TOP`` it collects ncu's source counters instead and prints each kernel's TOP SASS
instructions by warp stall samples (``NCU_SKIP=1 NCU_COUNT=1`` profiles one launch, the second).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats")
#: the metrics pulled from each kernel's report into the summary: (label, regex on the report)
METRICS = (("duration", r"Duration\s+(\S+)\s+(\S+)"),
           ("compute % peak", r"Compute \(SM\) Throughput\s+%\s+(\S+)"),
           ("memory % peak", r"Memory Throughput\s+%\s+(\S+)"),
           ("occupancy %", r"Achieved Occupancy\s+%\s+(\S+)"),
           ("registers", r"Registers Per Thread\s+register/thread\s+(\S+)"),
           ("block", r"Block Size\s+(\S+)"),
           ("grid", r"Grid Size\s+(\S+)"),
           ("cycles between issues", r"Warp Cycles Per Issued Instruction\s+cycle\s+(\S+)"))


def child(cell: str, shape: str, as_bench: bool = False) -> None:
    """One warm-up and one profiled forward + gradients (ncu profiles the second's kernels): of a
    random case (random descriptor and optional inputs), or with ``as_bench`` the op the bench
    times (gpu_run.metal_step: a ``torch.nn`` layer's weights, no mask, no peephole)."""
    sys.path[:0] = [str(ROOT)]
    import cupy as cp
    import numpy as np

    from rnngrad.backends.metal.harness.contexts import cuda_device
    from rnngrad.testing.cases import random_case, random_descriptor

    T, N, I, H = (int(v) for v in shape.split("x"))
    rng = np.random.default_rng(0)
    if as_bench:
        import torch

        from rnngrad.convert import torch as rgt
        from verification.gpu_run import metal_step, torch_layer

        torch.manual_seed(0)
        module = torch_layer(cell)(I, H)
        step = metal_step(rgt.from_module(module), rng.standard_normal((T, N, I), np.float32),
                          cp.asarray(rng.standard_normal((T, N, H), np.float32)))
    else:
        extra = dict(reset_after=True) if cell == "gru" else {}
        desc = random_descriptor(rng, cell, training=True, **extra)
        case = random_case(rng, cell, descriptor=desc, T=T, N=N, I=I, H=H, dtype=np.float32)

        def step():
            case.gradients("metal-cuda", forward_backend="metal-cuda")
    with cuda_device(poison=False):
        for _ in range(2):
            step()
            cp.cuda.Device().synchronize()


def findings(block: str) -> list:
    """ncu's advice in one kernel's report, one line each: "est. speedup X%: first sentence",
    largest estimated speedup first (notes about metrics it could not collect left out)."""
    out = []
    for m in re.finditer(r"(?m)^    (?:OPT|WRN)   (.*)\n((?:^ {10}\S.*\n?)*)", block):
        head, text = m.group(1).strip(), " ".join(m.group(2).split())
        if "could not be found" in head + text:
            continue
        speedup = re.search(r"Speedup: ([\d.]+)%", head)
        sentence = re.split(r"(?<=\.) ", text or head, maxsplit=1)[0]
        out.append((float(speedup.group(1)) if speedup else 0.0,
                    f"est. speedup {speedup.group(1)}%: {sentence}" if speedup else sentence))
    return [text for _, text in sorted(out, key=lambda x: -x[0])]


def summary(report: str) -> str:
    """One line per kernel launch with the METRICS, then ncu's three largest findings."""
    out = []
    for block in re.split(r"\n(?=  \S+ \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", report):
        name = re.match(r"\s*(\S+) \(\d+, \d+, \d+\)x", block)
        if not name or "__mtl_launch_" not in name.group(1):
            continue
        values = []
        for label, pattern in METRICS:
            m = re.search(pattern, block)
            if m:
                values.append(f"{label} {' '.join(m.groups())}")
        out.append(f"{name.group(1).replace('__mtl_launch_', '')}: " + "; ".join(values))
        for finding in findings(block)[:3]:
            out.append(f"    {finding}")
    return "\n".join(out)


def sass_hotspots(report: str, top: int) -> str:
    """The ``top`` SASS instructions with the most warp stall samples in ncu's source page
    (``--page source --print-source sass --csv``), per kernel: share of the kernel's samples,
    address and instruction, each kernel's total first."""
    import csv
    import io

    out = []
    for block in re.split(r'(?m)^(?=.*"Address","Source")', report)[1:]:
        kernel = re.findall(r"(__mtl_launch_\w+)", report[:report.find(block)])
        rows = list(csv.reader(io.StringIO(block)))
        header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
        column = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
        if column is None or not body:
            continue
        def samples(row):
            try:
                return float(row[column] or 0)
            except ValueError:
                return 0.0
        total = sum(samples(r) for r in body) or 1.0
        name = kernel[-1].replace("__mtl_launch_", "") if kernel else "kernel"
        out.append(f"{name}: {total:.0f} warp stall samples; the top {top} instructions:")
        for row in sorted(body, key=samples, reverse=True)[:top]:
            out.append(f"  {100 * samples(row) / total:5.1f}%  {row[0]}  {row[1].strip()}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="lstm", choices=("single_gate", "gru", "lstm"))
    parser.add_argument("--shape", default="200x64x512x512", metavar="TxNxIxH")
    parser.add_argument("--kernels", default=".", metavar="REGEX",
                        help="profile only the kernels whose name this matches")
    parser.add_argument("--recurrence", default=None, help="RNNGRAD_METAL_RECURRENCE")
    parser.add_argument("--gemm", default=None, help="RNNGRAD_METAL_GEMM")
    parser.add_argument("--set", nargs="*", default=(), metavar="NAME=VALUE",
                        help="integer fields of rnngrad.backends.metal.versions.Rules (v3_min_tiles=32)")
    parser.add_argument("--sass", type=int, default=0, metavar="TOP",
                        help="instead of the sections: the TOP SASS instructions by warp stall "
                             "samples (ncu's SourceCounters), per kernel")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), metavar="SECTION",
                        help="ncu sections to collect (such as MemoryWorkloadAnalysis_Tables, "
                             "SchedulerStats); default: %(default)s")
    parser.add_argument("--as-bench", action="store_true",
                        help="profile the op the bench times (a torch.nn layer's weights, no mask "
                             "or peephole) rather than a random case")
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path[:0] = [str(ROOT)]
        from rnngrad.backends.metal import versions

        changes = {name: int(value) for name, value in (item.split("=", 1) for item in args.set)}
        try:
            with versions.overrides(**changes):
                child(args.cell, args.shape, args.as_bench)
        except ValueError as exc:
            parser.error(f"--set: {exc}")
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for key, value in (("RNNGRAD_METAL_RECURRENCE", args.recurrence),
                       ("RNNGRAD_METAL_GEMM", args.gemm)):
        if value:
            env[key] = value
    sections = ("SourceCounters",) if args.sass else args.sections
    pages = ("--page", "source", "--print-source", "sass", "--csv") if args.sass else ()
    cmd = ["ncu", "--kernel-name", f"regex:__mtl_launch_.*({args.kernels})",
           *(x for s in sections for x in ("--section", s)), *pages,
           "--launch-skip", os.environ.get("NCU_SKIP", "0"), "--launch-count",
           os.environ.get("NCU_COUNT", "40"),
           sys.executable, __file__, "--child", "--cell", args.cell, "--shape", args.shape,
           *(("--as-bench",) if args.as_bench else ()), *(("--set", *args.set) if args.set else ())]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    report = done.stdout + done.stderr
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"profile-{args.cell}-{args.shape}.txt").write_text(report)
    print((sass_hotspots(report, args.sass) if args.sass else summary(report)) or report[-3000:])
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
