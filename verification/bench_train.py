"""Training-step time of ``rnngrad.torch``'s layers against ``torch.nn``'s, as ``rnngrad bench``
times: each implementation in a long-lived worker process of its own, the workers taking turns
one timing window each, who goes first alternating, and the ratios paired per pass.

A training step is what a training loop does with one recurrent layer, the same for both::

    for p in layer.parameters(): p.grad = None     # zero_grad(set_to_none=True)
    output, h_n = layer(x)                          # [T,N,I] float32, no initial state
    output.backward(dy)                             # every parameter's gradient

with ``x`` needing its gradient (a layer inside a model; rnngrad bench's setting) or not (the
first layer: PyTorch then skips dx; ``--input-grad no``). The optimiser's update is PyTorch's for
both and is left out. Implementations:

- ``layer``: ``rnngrad.torch.RNN`` / ``GRU`` / ``LSTM`` (tanh RNN; PyTorch's GRU), converted from
  the ``torch.nn`` module by ``from_torch``, on ``--backend`` (default numba);
- ``torch``: the ``torch.nn`` module;
- ``ops``: the bare rnngrad ops on NumPy arrays, training forward + gradient op, exactly as
  ``rnngrad bench`` times them (``rnngrad.bench.worker``): the layer's step less the glue;
- ``glue``: the layer's step with rnngrad's ops replaced by the results they gave in its first
  run, returned at once: the glue alone.

The table gives medians, the paired ratios to PyTorch (median and range over the passes) and
the glue, the share of a layer step spent outside rnngrad's ops (tensor ⇄ array conversion,
result wrapping, the bias sum, autograd's engine), two ways: (layer − ops) / layer, paired per
pass (a difference of two timings, as noisy as the machine), and "glue alone" / layer, paired.
``rnngrad info``'s BLAS lines are printed first.

    python verification/bench_train.py [--shapes 100x32x256x256 50x1x64x64] [--passes 7]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from rnngrad.bench.worker import window  # noqa: E402
from rnngrad.cli import bench  # noqa: E402

CELL_NAMES = {"single_gate": "RNN", "gru": "GRU", "lstm": "LSTM"}
#: targets of issue 23: the layer's step over torch.nn's, by (cell, shape)
TARGETS = {("single_gate", (100, 32, 256, 256)): 0.75, ("gru", (100, 32, 256, 256)): 0.75,
           ("single_gate", (50, 1, 64, 64)): 0.3, ("gru", (50, 1, 64, 64)): 0.3,
           ("lstm", (100, 32, 256, 256)): 1.0, ("lstm", (50, 1, 64, 64)): 1.0}
GLUE_TARGET = 0.05


# -- the worker: one implementation's training step ---------------------------------------------

def _step(req):
    import torch

    torch.set_num_threads(req["threads"])
    T, N, I, H, cell = req["T"], req["N"], req["I"], req["H"], req["cell"]
    device = req.get("device", "cpu")
    if req["impl"] == "ops":
        from rnngrad.bench.worker import _rnngrad

        return _rnngrad(dict(req, impl=req["backend"]))  # synchronised on CUDA
    if device == "cuda":  # strict float32: cuDNN and cuBLAS without TF32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    make = {"single_gate": lambda: torch.nn.RNN(I, H, nonlinearity="tanh"),
            "gru": lambda: torch.nn.GRU(I, H), "lstm": lambda: torch.nn.LSTM(I, H)}[cell]
    layer = make().to(device)
    if req["impl"] in ("layer", "glue"):
        import rnngrad.torch

        layer = rnngrad.torch.from_torch(layer, backend=req["backend"])
    x = torch.randn(T, N, I, requires_grad=req["input_grad"], device=device)
    dy = torch.randn(T, N, H, device=device)
    params = list(layer.parameters())
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = torch.compile(layer, mode=req["compile"]) if req.get("compile") else layer

    def run():
        for p in params:
            p.grad = None
        output, _ = model(x)
        output.backward(dy)
        sync()
    if req["impl"] == "glue":
        _replace_ops_by_their_results(cell, run)
    return run


def _replace_ops_by_their_results(cell, run):
    """Make rnngrad's ops, as ``rnngrad.torch`` calls them (``rnngrad.torch._compute``), and
    the weight-gradient product it computes itself when the source needs no gradient (dAᵀ
    source, compute taken off the op), return what they returned in one run of ``run`` at once:
    what is left of a layer step is the glue."""
    from rnngrad.torch import _compute, _device

    results = {}
    op, product = _compute.run_checked, _device.transposed_product

    def spy_op(cell, gradients, *args):
        results[gradients] = op(cell, gradients, *args)
        return results[gradients]

    def spy_product(*args):
        results["product"] = product(*args)
        return results["product"]
    _compute.run_checked, _device.transposed_product = spy_op, spy_product
    run()
    _compute.run_checked = lambda cell, gradients, *args: results[gradients]
    _device.transposed_product = (lambda *args: results["product"]) if "product" in results \
        else product


def worker_main(request_json):
    """The protocol of ``rnngrad.bench.worker``: ``{"first": s}``, then one ``{"times": [...]}``
    per window request read from stdin; a request ``{"step": request}`` replaces the step by
    that request's (another shape or cell, without a new process) and is answered as the first."""
    replies, sys.stdout = sys.stdout, sys.stderr

    def ready(req):
        t0 = time.perf_counter()
        run = _step(req)
        run()
        print(json.dumps({"first": time.perf_counter() - t0}), file=replies, flush=True)
        return run

    run = ready(json.loads(request_json))
    for line in sys.stdin:
        w = json.loads(line)
        if "step" in w:
            run = None  # the last step's memory goes before the next one's is taken
            run = ready(w["step"])
            continue
        times = window(run, w["repeats"], w.get("min_seconds", 0.0), w.get("warmup_seconds", 0.0))
        print(json.dumps({"times": times}), file=replies, flush=True)


class StepWorker(bench.Worker):
    """``rnngrad bench``'s Worker (window requests, replies, closing) running this file's
    worker instead of ``rnngrad.bench.worker``."""

    def __init__(self, request, env):
        self.impl = request["impl"]
        self._stderr = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(request)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env=env, cwd=ROOT)
        try:
            ready = self._reply()
        except BaseException:
            self.close()
            raise
        self.first, self.flops = ready["first"], None

    def switch(self, request):
        """Time ``request``'s step from now on (same implementation, another shape or cell)."""
        self._proc.stdin.write(json.dumps({"step": request}) + "\n")
        self._proc.stdin.flush()
        self.first = self._reply()["first"]


# -- the parent: alternating windows, paired ratios ----------------------------------------------

def blas_lines() -> list:
    """``rnngrad info``'s lines from "BLAS and CPU:" on."""
    done = subprocess.run([sys.executable, "-m", "rnngrad", "info"], capture_output=True,
                          text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    lines = done.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("BLAS")), len(lines))
    return lines[start:]


def add_timing_arguments(parser, passes: int):
    """The worker and timing options both step benchmarks take (this one and bench_layer.py)."""
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=passes)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.3)
    parser.add_argument("--warmup-seconds", type=float, default=0.1)
    parser.add_argument("--json", metavar="FILE", help="write every measurement as JSON")


def measure(args) -> list:
    env = bench._env(args.threads)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    impls = ("layer", "torch", "ops", "glue")
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes]
    rows = []
    for shape in shapes:
        T, N, I, H = shape
        for cell in args.cells:
            for input_grad in args.input_grad:
                name = f"{CELL_NAMES[cell]} {'x'.join(map(str, shape))} dx={input_grad}"
                passes = {impl: [] for impl in impls}
                with contextlib.ExitStack() as stack:
                    workers = {}
                    for impl in impls:
                        req = dict(impl=impl, cell=cell, T=T, N=N, I=I, H=H, dtype="float32",
                                   threads=args.threads, backend=args.backend,
                                   input_grad=input_grad == "yes")
                        workers[impl] = stack.enter_context(StepWorker(req, env))
                    for p in range(args.passes):
                        order = impls if p % 2 == 0 else impls[::-1]
                        for impl in order:
                            time.sleep(bench.GAP)
                            passes[impl].append(workers[impl].window(
                                args.repeats, args.min_seconds, args.warmup_seconds))
                        print(f"\r{name}: pass {p + 1}/{args.passes}      ", end="",
                              file=sys.stderr, flush=True)
                med = {impl: statistics.median(t for w in passes[impl] for t in w) for impl in impls}
                layer_ratio = bench.pass_ratios(passes["layer"], passes["torch"])
                ops_ratio = bench.pass_ratios(passes["ops"], passes["torch"])
                glue = [1.0 - statistics.median(o) / statistics.median(l)
                        for l, o in zip(passes["layer"], passes["ops"])]
                direct = bench.pass_ratios(passes["glue"], passes["layer"])
                rows.append(dict(cell=cell, shape=shape, input_grad=input_grad, median_s=med,
                                 layer_ratio=layer_ratio, ops_ratio=ops_ratio, glue=glue,
                                 glue_direct=direct,
                                 target=TARGETS.get((cell, shape))))
    print(file=sys.stderr)
    return rows


def table(rows) -> list:
    head = (f"{'cell':5} {'T×N×I×H':>15} {'dx':>3} {'layer ms':>9} {'torch ms':>9} {'ops ms':>8} "
            f"{'layer/torch':>11} {'(range)':>11} {'ops/torch':>9} {'glue':>6} {'(range)':>13} "
            f"{'glue alone':>10} {'target':>6}")
    lines = [head, "-" * len(head)]
    for r in rows:
        m, lr, orr, g = r["median_s"], r["layer_ratio"], r["ops_ratio"], r["glue"]
        ok = r["target"] is None or statistics.median(lr) <= r["target"]
        lines.append(
            f"{CELL_NAMES[r['cell']]:5} {'x'.join(map(str, r['shape'])):>15} {r['input_grad']:>3} "
            f"{m['layer'] * 1e3:9.3f} {m['torch'] * 1e3:9.3f} {m['ops'] * 1e3:8.3f} "
            f"{statistics.median(lr):11.2f} {min(lr):5.2f}–{max(lr):<5.2f} "
            f"{statistics.median(orr):9.2f} {statistics.median(g):6.1%} "
            f"{min(g):6.1%}–{max(g):<6.1%} {statistics.median(r['glue_direct']):10.1%} "
            + (f"≤{r['target']:.2f}{'' if ok else ' MISSED'}" if r["target"] else ""))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["100x32x256x256", "50x1x64x64"])
    parser.add_argument("--cells", nargs="+", default=["single_gate", "gru", "lstm"],
                        choices=list(CELL_NAMES))
    parser.add_argument("--input-grad", nargs="+", default=["yes", "no"], choices=["yes", "no"],
                        help="whether x needs its gradient (default: both, one row each)")
    parser.add_argument("--backend", default="numba")
    add_timing_arguments(parser, passes=5)
    args = parser.parse_args(argv)
    blas = blas_lines()
    rows = measure(args)
    print("\n".join(blas))
    print(f"float32, {args.threads} threads, {args.passes} alternating passes; training step = "
          "zero_grad + forward + backward of one layer; glue = (layer − ops) / layer, paired")
    print("\n".join(table(rows)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(blas=blas, rows=rows, threads=args.threads), f, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2])
    else:
        sys.exit(main())
