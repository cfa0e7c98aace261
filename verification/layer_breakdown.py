"""Where an ``rnngrad.torch`` layer's training step spends the time its bare ops do not, in one
process, in alternating windows (``bench_layer.py`` has the layer beside the ops in processes of
their own; this splits the difference).

For each cell, at one shape (default 50×1×64×64, float32, x needing its gradient), medians of
per-window medians of:

- ``layer``: ``bench_train.py``'s training step through the layer;
- ``ops``: the bare ops it runs (training forward + gradient op on NumPy arrays);
- ``glue``: the layer's step with the ops replaced by the results they gave once (what is left
  is everything but the ops: conversions, argument making, autograd's engine);
- ``floor``: a training step through an autograd.Function that does nothing (the layer's inputs
  and outputs, a gradient for each input made with ``torch.empty``): what any Python-defined
  PyTorch op pays here;
- ``backend in layer`` / ``backend bare``: the backend's forward + gradients (the Problem
  already made) timed inside the layer's steps, and the same calls on the same Problems in a
  loop of their own: the same work, run with the step's other work between calls or without.

With ``--device cuda`` the same on a GPU through ``metal-cuda`` (its ops return once their
kernels are queued, so a backend call's time is host time; every step ends synchronised).
``--profile STEPS`` also prints a cProfile of that many layer steps per cell, by own time: which
functions the host spends a step in.

    python verification/layer_breakdown.py [--shape 50x1x64x64] [--cells lstm gru single_gate]
        [--device cuda] [--profile STEPS]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _floor(T, N, I, H, G, device):
    import torch

    x = torch.randn(T, N, I, requires_grad=True, device=device)
    params = [torch.nn.Parameter(torch.empty(s, device=device))
              for s in ((G * H, I), (G * H, H), (G * H,), (G * H,))]
    dy = torch.randn(T, N, H, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    class Nothing(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *ps):
            return torch.empty(T, N, H, device=device), torch.empty(1, N, H, device=device)

        @staticmethod
        def backward(ctx, gh, ghn):
            return (torch.empty(T, N, I, device=device),) + tuple(
                torch.empty(p.shape, device=device) for p in params)

    def run():
        for p in params:
            p.grad = None
        output, _ = Nothing.apply(x, *params)
        output.backward(dy)
        sync()
    return run


def _spied(cell, req):
    """The layer's step, with the backend's implementations timed; and a function running the
    last Problems they were given in a loop of their own."""
    from bench_train import _step
    from rnngrad import registry

    backend = registry.get(req["backend"])
    times, last = [], {}
    spying = [False]
    for key, fn in list(backend.implementations.items()):
        def spy(problem, _fn=fn, _kind=key[1]):
            if not spying[0]:
                return _fn(problem)
            t = time.perf_counter()
            out = _fn(problem)
            times.append(time.perf_counter() - t)
            last[_kind] = (_fn, problem)
            return out
        backend.implementations[key] = spy
    run = _step(dict(req, impl="layer"))

    def layer():
        spying[0] = True
        try:
            run()
        finally:
            spying[0] = False

    def bare():
        for fn, problem in last.values():
            fn(problem)
    return layer, times, bare


def _glue(cell, req):
    """bench_train.py's "glue" step, its stand-ins for the ops put in place around each step
    only (they replace the functions rnngrad.torch calls, which the other runs use)."""
    from bench_train import _step
    from rnngrad.torch import _compute, _device

    slots = ((vars(_compute), "run_checked"), (vars(_device), "transposed_product"))
    real = [table[key] for table, key in slots]
    run = _step(dict(req, impl="glue"))
    stand_ins = [table[key] for table, key in slots]
    for (table, key), fn in zip(slots, real):
        table[key] = fn

    def glue():
        for (table, key), fn in zip(slots, stand_ins):
            table[key] = fn
        try:
            run()
        finally:
            for (table, key), fn in zip(slots, real):
                table[key] = fn
    return glue


def _request(cell, shape, device) -> dict:
    """bench_train.py's step request for ``cell`` at ``shape`` on ``device`` (no impl yet)."""
    T, N, I, H = shape
    return dict(cell=cell, T=T, N=N, I=I, H=H, dtype="float32", threads=2,
                backend="metal-cuda" if device == "cuda" else "numba", input_grad=True,
                device=device)


def measure(cell, shape, rounds, calls, device="cpu"):
    import torch

    from bench_train import _step

    torch.set_num_threads(2)
    T, N, I, H = shape
    G = {"single_gate": 1, "gru": 3, "lstm": 4}[cell]
    req = _request(cell, shape, device)
    layer, inside, bare = _spied(cell, req)
    runs = {"layer": layer, "ops": _step(dict(req, impl="ops")),
            "glue": _glue(cell, req), "floor": _floor(T, N, I, H, G, device)}
    for run in runs.values():
        run()
    runs["backend bare"] = bare
    got = {k: [] for k in list(runs) + ["backend in layer"]}
    for r in range(rounds):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            inside.clear()
            ts = []
            for _ in range(calls):
                t = time.perf_counter()
                runs[name]()
                ts.append(time.perf_counter() - t)
            got[name].append(statistics.median(ts))
            if name == "layer":  # forward + gradients of each step
                got["backend in layer"].append(statistics.median(
                    a + b for a, b in zip(inside[::2], inside[1::2])))
    return got


def profile(cell, shape, steps, device="cpu", top=35) -> str:
    """A cProfile of ``steps`` training steps through the layer, by own time (the top ``top``)."""
    import cProfile
    import io
    import pstats

    from bench_train import _step

    run = _step(dict(_request(cell, shape, device), impl="layer"))
    for _ in range(3):
        run()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        run()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="50x1x64x64")
    parser.add_argument("--cells", nargs="+", default=["single_gate", "gru", "lstm"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=150)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also print a cProfile of STEPS layer steps per cell, by own time")
    args = parser.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.lower().split("x"))
    load = os.getloadavg()[0]
    print(f"{args.shape}, float32, {args.device}, 2 threads, {args.rounds} alternating rounds "
          f"of {args.calls} steps; load average {load:.1f}; µs, and ÷ ops paired per round")
    names = ["layer", "ops", "glue", "floor", "backend in layer", "backend bare"]
    print(f"{'cell':12}" + "".join(f"{n:>22}" for n in names))
    for cell in args.cells:
        got = measure(cell, shape, args.rounds, args.calls, args.device)
        cols = []
        for n in names:
            ratio = statistics.median(a / b for a, b in zip(got[n], got["ops"]))
            cols.append(f"{statistics.median(got[n]) * 1e6:10.0f} ({ratio:5.2f}×)")
        print(f"{cell:12}" + "".join(f"{c:>22}" for c in cols))
    for cell in args.cells if args.profile else ():
        print(f"\ncProfile of {args.profile} layer steps of {cell} {args.shape} "
              f"({args.device}), by own time:")
        print(profile(cell, shape, args.profile, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
