"""Where the end-to-end time of a ``metal-cuda`` forward + gradients goes, on the GPU machine.

    python verification/gpu_host.py [--shapes 50x1x64x64 1000x8x128x128] [--cells ...]
                                    [--reps 200]

The bench's end-to-end column (gpu_run.py) times a training step as a user does: the forward
and the gradients of a ``torch.nn`` layer's weights with the arguments on the GPU, from a
synchronised GPU to a synchronised GPU. This splits that time by where the host spends it,
timing each phase with ``time.perf_counter`` around the functions that do it:

=============  ====================================================================
checks         the public functions' input checks (``api.checked_problem``)
plan           the op's plan lookup (``MetalHost.plan``)
launch         the dispatches' launches (``completion.Runs.launch``: status slice, CUDA launch)
GPU wait       the host blocked until the GPU ran the op's kernels (``finish``)
marks read     the read-back of the completion marks (``MetalHost.words``)
other          the rest of the host's work: binding inputs, new buffers, results
=============  ====================================================================

beside cuDNN's wall for the same step (``torch.nn`` module, forward and backward), taken in
alternating windows (gpu_run.paired_walls). Prints one table, last.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the phases timed, in the table's order: (label, module path, attribute)
PHASES = (("checks", "rnngrad.api", "checked_problem"),
          ("plan", "rnngrad.backends.metal.host", "MetalHost.plan"),
          ("launch", "rnngrad.backends.metal.completion", "Runs.launch"),
          ("GPU wait", "rnngrad.backends.metal.cuda", "Device.finish"),
          ("marks read", "rnngrad.backends.metal.host", "MetalHost.words"))
LABELS = ("checks", "plan", "launch", "GPU wait", "marks read")


@contextlib.contextmanager
def timed_phases(totals: dict):
    """A block in which each function of :data:`PHASES` adds its seconds to ``totals[label]``
    (nested calls of one label count once: the outermost)."""
    import importlib

    depth = dict.fromkeys(LABELS, 0)
    undo = []

    def wrap(label, fn):
        def timed(*args, **kwargs):
            if depth[label]:
                return fn(*args, **kwargs)
            depth[label] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - start
                depth[label] -= 1
        return timed

    for label, module, attr in PHASES:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__[name]
        setattr(owner, name, wrap(label, original))
        undo.append((owner, name, original))
    try:
        yield totals
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


def measure(cell: str, shape: str, reps: int, profile: bool = False) -> dict:
    """ms per forward + gradients of ``cell`` at ``shape``: end to end, each phase's share, and
    cuDNN's wall beside it."""
    import cupy as cp
    import numpy as np
    import torch

    from rnngrad.backends.metal.harness.contexts import cuda_device
    from rnngrad.convert import torch as rgt
    from verification.gpu_run import metal_step, paired_walls, torch_layer, wall

    T, N, I, H = (int(v) for v in shape.split("x"))
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    module = torch_layer(cell)(I, H)
    layer = rgt.from_module(module)
    module = module.cuda()
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.standard_normal((T, N, I), np.float32), device="cuda")
    gy = torch.as_tensor(rng.standard_normal((T, N, H), np.float32), device="cuda")

    def torch_step():
        module.zero_grad(set_to_none=True)
        module(x.detach().requires_grad_())[0].backward(gy)

    step = metal_step(layer, x.cpu().numpy(), cp.asarray(gy.cpu().numpy()))
    with cuda_device(timing=False):
        for _ in range(3):
            step()
            torch_step()
        e2e, cudnn = paired_walls(step, torch_step, max(reps // 7, 1))
        totals = {}
        with timed_phases(totals):
            phased = wall(step, reps)
    out = dict(cell=cell, shape=shape, e2e=e2e, cudnn=cudnn, phased=phased)
    for label in LABELS:
        out[label] = totals.get(label, 0.0) * 1e3 / reps
    out["other"] = phased - sum(out[label] for label in LABELS)
    if profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        with cuda_device(timing=False):
            step()
            prof.enable()
            for _ in range(reps):
                step()
            cp.cuda.Device().synchronize()
            prof.disable()
        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(40)
        print(f"cProfile of {reps} steps of {cell} {shape}, by cumulative and by own time:")
        print(text.getvalue(), flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["50x1x64x64", "1000x8x128x128"],
                        metavar="TxNxIxH")
    parser.add_argument("--cells", nargs="+", default=["single_gate", "gru", "lstm"],
                        choices=("single_gate", "gru", "lstm"))
    parser.add_argument("--reps", type=int, default=140, help="calls per timing (default 140)")
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile of each case's host work, by cumulative time")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(ROOT)]
    rows = []
    for shape in args.shapes:
        for cell in args.cells:
            rows.append(measure(cell, shape, args.reps, args.profile))
            print(f"{cell} {shape}: e2e {rows[-1]['e2e']:.3f} ms, cuDNN wall "
                  f"{rows[-1]['cudnn']:.3f} ms", flush=True)
    print("\nms per forward + gradients (metal-cuda; the phases from a run with timers, "
          "whose total is 'timed e2e')\n")
    head = ("cell", "T×N×I×H", "e2e", "cuDNN wall", "e2e ÷ wall", "timed e2e", *LABELS, "other")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = (r["cell"], r["shape"], f"{r['e2e']:.3f}", f"{r['cudnn']:.3f}",
                 f"{r['e2e'] / r['cudnn']:.2f}", f"{r['phased']:.3f}",
                 *(f"{r[k]:.3f}" for k in (*LABELS, "other")))
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
