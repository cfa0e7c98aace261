"""What an ``rnngrad.torch`` layer costs over the bare ops it runs, and its training step against
``torch.nn``'s: each implementation in a worker process of its own (``bench_train.py``'s
workers), the workers taking turns one timing window each, who goes first alternating, and the
ratios paired per pass.

One training step, the same for the layer and ``torch.nn``::

    for p in layer.parameters(): p.grad = None     # zero_grad(set_to_none=True)
    output, h_n = layer(x)                          # [T,N,I] float32, x needing its gradient
    output.backward(dy)

Implementations:

- ``layer``: ``rnngrad.torch.RNN`` / ``GRU`` / ``LSTM`` (tanh RNN; PyTorch's GRU), converted
  from the ``torch.nn`` module, on ``--backend`` (default: numba on the CPU, metal-cuda on CUDA);
- ``ops``: the bare rnngrad ops the layer runs, the training forward and the gradient op, on
  NumPy (CPU) or CuPy (CUDA) arrays, as ``rnngrad bench`` times them;
- ``torch``: the ``torch.nn`` module (on CUDA: cuDNN, TF32 off).

On CUDA every step ends with a device synchronisation, in all three.

Targets: layer ÷ ops at most 1.3 at 50×1×64×64 and 1.1 at 100×32×256×256 on the CPU; layer − ops
at most 0.25 ms on CUDA; layer ÷ torch.nn at most 1.0 at every shape on the CPU, and at
50×1×64×64 on CUDA. ``rnngrad info``'s BLAS lines and the machine's load average (before and
after) are printed with the tables: on a busy machine, read ratios only.

    python verification/bench_layer.py [--device cpu|cuda] [--shapes 50x1x64x64 ...]
        [--cells single_gate gru lstm] [--passes 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_train import CELL_NAMES, StepWorker, add_timing_arguments, blas_lines  # noqa: E402
from rnngrad.cli import bench  # noqa: E402

SHAPES = ["50x1x64x64", "100x32x256x256", "200x64x512x512", "1000x8x128x128"]
IMPLS = ("layer", "ops", "torch")
#: layer ÷ ops on the CPU, by shape
OVER_OPS = {(50, 1, 64, 64): 1.3, (100, 32, 256, 256): 1.1}
#: layer − ops on CUDA, seconds
OVER_OPS_CUDA = 0.25e-3


def measure(args) -> list:
    env = bench._env(args.threads)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    backend = args.backend or ("metal-cuda" if args.device == "cuda" else "numba")
    rows = []
    # one worker per implementation for the whole run, switched from step to step: a process
    # start (PyTorch, CuPy, the kernels' compilation) costs more than a step's timing windows
    with contextlib.ExitStack() as stack:
        workers = {}
        for text in args.shapes:
            shape = tuple(int(v) for v in text.lower().split("x"))
            T, N, I, H = shape
            for cell in args.cells:
                name = f"{CELL_NAMES[cell]} {text}"
                passes = {impl: [] for impl in IMPLS}
                for impl in IMPLS:
                    req = dict(impl=impl, cell=cell, T=T, N=N, I=I, H=H, dtype="float32",
                               threads=args.threads, backend=backend, input_grad=True,
                               device=args.device, compile=args.compile)
                    if impl in workers:
                        workers[impl].switch(req)
                    else:
                        workers[impl] = stack.enter_context(StepWorker(req, env))
                for p in range(args.passes):
                    for impl in (IMPLS if p % 2 == 0 else IMPLS[::-1]):
                        time.sleep(bench.GAP)
                        passes[impl].append(workers[impl].window(
                            args.repeats, args.min_seconds, args.warmup_seconds))
                    print(f"\r{name}: pass {p + 1}/{args.passes}      ", end="", file=sys.stderr,
                          flush=True)
                med = {impl: statistics.median(t for w in passes[impl] for t in w)
                       for impl in IMPLS}
                over = [statistics.median(l) - statistics.median(o)
                        for l, o in zip(passes["layer"], passes["ops"])]
                rows.append(dict(
                    cell=cell, shape=shape, median_s=med,
                    layer_over_ops=bench.pass_ratios(passes["layer"], passes["ops"]),
                    layer_minus_ops_s=over,
                    layer_over_torch=bench.pass_ratios(passes["layer"], passes["torch"]),
                    ops_over_torch=bench.pass_ratios(passes["ops"], passes["torch"])))
                # each row as it is measured: what a run stopped early still shows
                print("\r" + table(rows[-1:], args.device)[-1], file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def _verdict(ok) -> str:
    return "" if ok is None else ("ok" if ok else "MISSED")


def table(rows, device) -> list:
    head = (f"{'cell':5} {'T×N×I×H':>15} {'layer ms':>9} {'ops ms':>8} {'torch ms':>9} "
            f"{'layer/ops':>9} {'(range)':>11} {'layer−ops ms':>12} {'target':>10} "
            f"{'layer/torch':>11} {'(range)':>11} {'ops/torch':>9} {'target':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        m, lo, lt = r["median_s"], r["layer_over_ops"], r["layer_over_torch"]
        over = statistics.median(r["layer_minus_ops_s"])
        if device == "cuda":
            ok_ops, want_ops = over <= OVER_OPS_CUDA, f"≤{OVER_OPS_CUDA * 1e3:.2f} ms"
            limit = 1.0 if r["shape"] == (50, 1, 64, 64) else None
        else:
            limit_ops = OVER_OPS.get(r["shape"])
            ok_ops = None if limit_ops is None else statistics.median(lo) <= limit_ops
            want_ops = "" if limit_ops is None else f"≤{limit_ops:.1f}×"
            limit = 1.0
        ok_torch = None if limit is None else statistics.median(lt) <= limit
        lines.append(
            f"{CELL_NAMES[r['cell']]:5} {'x'.join(map(str, r['shape'])):>15} "
            f"{m['layer'] * 1e3:9.3f} {m['ops'] * 1e3:8.3f} {m['torch'] * 1e3:9.3f} "
            f"{statistics.median(lo):9.2f} {min(lo):5.2f}–{max(lo):<5.2f} {over * 1e3:12.3f} "
            f"{want_ops + ' ' + _verdict(ok_ops):>10} "
            f"{statistics.median(lt):11.2f} {min(lt):5.2f}–{max(lt):<5.2f} "
            f"{statistics.median(r['ops_over_torch']):9.2f} "
            f"{('' if limit is None else f'≤{limit:.1f}× ') + _verdict(ok_torch):>10}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--cells", nargs="+", default=list(CELL_NAMES), choices=list(CELL_NAMES))
    parser.add_argument("--backend", default=None,
                        help="rnngrad backend (default: numba on cpu, metal-cuda on cuda)")
    parser.add_argument("--compile", default=None, metavar="MODE",
                        help="torch.compile(mode=MODE) the layer and torch.nn's module (such as "
                             "reduce-overhead: CUDA graphs); the bare ops stay as they are")
    add_timing_arguments(parser, passes=7)
    args = parser.parse_args(argv)
    blas = blas_lines()
    load_before = os.getloadavg()
    rows = measure(args)
    load_after = os.getloadavg()
    print("\n".join(blas))
    print(f"{args.device}, float32, {args.threads} threads, {args.passes} alternating passes, "
          f"x needing its gradient, {f'torch.compile(mode={args.compile!r})' if args.compile else 'eager'}"
          f"; load average before {load_before[0]:.1f}, after "
          f"{load_after[0]:.1f} ({os.cpu_count()} CPUs)")
    print("\n".join(table(rows, args.device)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(blas=blas, rows=rows, threads=args.threads, device=args.device,
                           load=[load_before, load_after]), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
