"""Copies of the project side by side on the GPU machine: each op's device ms by kernel, one call.

Forward + gradients through ``metal-cuda``, one column a copy:

    mkdir -p ab/base && git archive <rev> | tar -x -C ab/base     # a copy of another revision
    python verification/gpu_ab.py ab/base . [--shapes 1000x8x128x128 ...] [--cells GRU LSTM]
                                  [--rounds 2] [--set RNNGRAD_METAL_RECURRENCE=v1 ...]

A tree is a folder that holds the project (its ``rnngrad/`` and ``kernels/``); ``.`` is the
working tree. ``ab/`` is ignored by git, so a copy there never lands in a commit; the GPU
machine's ``run`` carries it when asked (``carry=["ab"]``). Each tree runs in a process of its
own, its ``rnngrad`` imported and its kernels compiled, while the measurement is this copy's:
one op as the bench builds it (``gpu_run.metal_step``: ``torch.nn`` weights through
``rnngrad.convert.torch``, inputs on the GPU), two warm-up calls, then device ms by kernel from
torch.profiler (``gpu_run.device_ms``, the method of the bench's cuDNN column). The trees take
turns within each of ``--rounds`` rounds, so that a drift of the machine falls on all of them,
and the table keeps each figure's least. ``--set NAME=VALUE`` sets an environment variable in
every tree's process (``RNNGRAD_METAL_RECURRENCE=v1`` times v1 in each).

Prints one row per op and kernel (the op's total first): ms in each tree, and the last tree's
over the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CELLS = ("RNN", "GRU", "LSTM")
SHAPES = ("100x32x256x256", "50x1x64x64", "200x64x512x512", "1000x8x128x128")
#: the line a tree's process prints its results on
MARK = "gpu_ab result: "


def shape(text: str) -> tuple:
    try:
        T, N, I, H = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TxNxIxH, four integers such as 50x1x64x64, "
                                         f"got {text!r}") from None
    return T, N, I, H


def setting(text: str) -> tuple:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def child(tree: Path, shapes, cells) -> dict:
    """{"CELL TxNxIxH": {kernel: device ms}} of one forward + gradients each, in this process
    (its rnngrad is the tree's)."""
    sys.path[:0] = [str(tree)]
    try:
        import cupy as cp
        import torch
    except ImportError as exc:
        raise SystemExit(f"gpu_ab: needs CuPy and PyTorch with CUDA ({exc})") from None
    import numpy as np

    try:
        from rnngrad.backends.metal.harness.contexts import cuda_device
    except ImportError:  # a tree from before the host was split by job
        from rnngrad.backends.metal.host import cuda_device
    from rnngrad.convert import torch as rgt

    sys.path.insert(1, str(HERE))
    from gpu_run import CELL_MODES, device_ms, metal_step, torch_layer

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for T, N, I, H in shapes:
        for mode in cells:
            torch.manual_seed(0)
            layer = rgt.from_module(torch_layer(CELL_MODES[mode])(I, H))
            x = np.random.default_rng(0).standard_normal((T, N, I)).astype(np.float32)
            gy = cp.asarray(np.random.default_rng(1).standard_normal((T, N, H)), cp.float32)
            step = metal_step(layer, x, gy)
            with cuda_device():
                for _ in range(2):
                    step()
                runs = [device_ms(step) for _ in range(3)]
            kernels = {k for r in runs for k in r if k not in ("other", "span")}
            out[f"{mode} {T}x{N}x{I}x{H}"] = {k: min(r.get(k, 0.0) for r in runs) for k in kernels}
    return out


def table(trees, results) -> str:
    """The markdown table of ``results`` ({tree: {op: {kernel: ms}}}, each op's figures already
    the least over rounds): per op its total, then each kernel, in ``trees``' order."""
    names = [str(t) for t in trees]
    head = "| op | kernel | " + " | ".join(f"{n} ms" for n in names) + f" | {names[-1]} ÷ {names[0]} |"
    lines = [head, "|---|---|" + "---|" * (len(names) + 1)]
    ops = list(dict.fromkeys(op for n in names for op in results.get(n, {})))
    for op in ops:
        per = [results.get(n, {}).get(op) for n in names]
        kernels = sorted({k for p in per if p for k in p})
        rows = [("total", [sum(p.values()) if p else None for p in per])]
        rows += [(k, [p.get(k) if p else None for p in per]) for k in kernels]
        for kernel, values in rows:
            cells = " | ".join("-" if v is None else f"{v:.3f}" for v in values)
            first, last = values[0], values[-1]
            ratio = f"{last / first:.3f}" if first and last is not None else "-"
            lines.append(f"| {op} | {kernel} | {cells} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path, help="folders holding the project")
    parser.add_argument("--shapes", nargs="+", type=shape, default=[shape(s) for s in SHAPES],
                        metavar="TxNxIxH")
    parser.add_argument("--cells", nargs="+", choices=CELLS, default=list(CELLS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", nargs="*", type=setting, default=[], metavar="NAME=VALUE",
                        help="environment variables of every tree's process")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a tree's process may take")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(MARK + json.dumps(child(args.trees[0].resolve(), args.shapes, args.cells)))
        return 0
    for tree in args.trees:
        if not (tree / "rnngrad").is_dir() or not (tree / "kernels").is_dir():
            parser.error(f"tree {tree}: expected a folder holding rnngrad/ and kernels/")
    if args.rounds < 1:
        parser.error(f"--rounds: expected at least 1, got {args.rounds}")
    results = {str(t): {} for t in args.trees}
    for r in range(args.rounds):
        for tree in args.trees:
            env = dict(os.environ, PYTHONPATH=str(tree.resolve()), **dict(args.set))
            cmd = [sys.executable, str(Path(__file__).resolve()), str(tree.resolve()), "--child",
                   "--shapes", *("x".join(map(str, s)) for s in args.shapes),
                   "--cells", *args.cells]
            print(f"round {r + 1}/{args.rounds}: {tree}", file=sys.stderr, flush=True)
            try:
                done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                                      timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"gpu_ab: tree {tree}: no result in {args.timeout:.0f} s", file=sys.stderr)
                return 1
            found = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
            if done.returncode or not found:
                print(f"gpu_ab: tree {tree} failed (exit {done.returncode}):\n"
                      f"{(done.stdout + done.stderr)[-3000:]}", file=sys.stderr)
                return 1
            for op, kernels in json.loads(found[-1][len(MARK):]).items():
                kept = results[str(tree)].setdefault(op, {})
                for k, ms in kernels.items():
                    kept[k] = min(ms, kept.get(k, ms))
    print(table(args.trees, results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
