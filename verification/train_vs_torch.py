"""Train the same small model with ``rnngrad.torch`` layers and with ``torch.nn``'s, side by side.

The task is the adding problem, generated on the fly (no download): each sequence has T steps of
two features, a value uniform in [0, 1) and a marker that is 1 at two random steps; the target
is the sum of the two marked values. The model is one recurrent layer (``--cell``: GRU, LSTM or
tanh RNN; ``--layers`` stacked) and a linear head on the last step's output, trained with Adam
on the mean squared error.

Both models start from the same weights (the rnngrad model is ``from_torch`` of the PyTorch
one, the head a copy) and see the same batches, one step each in turn. The script shows a
progress bar on stderr, prints the time per iteration of each, checks that the two loss curves
agree step by step for the first ``--compare`` iterations within float32 round-off (the float32
``output`` tolerance of ``rnngrad.testing``, the one tolerance table) and that the final losses
match (their means over the last 20 iterations within ``--final-rtol``), and saves a PNG of both
curves to ``--out`` (matplotlib: ``pip install 'rnngrad[plot]'``). Exit status 1 when a check
fails.

    python verification/train_vs_torch.py [--cell gru] [--iterations 400] [--out curves.png]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import rnngrad.torch as rt  # noqa: E402
from rnngrad.testing import compare_array  # noqa: E402

CELLS = {"gru": torch.nn.GRU, "lstm": torch.nn.LSTM,
         "rnn": lambda *a, **kw: torch.nn.RNN(*a, nonlinearity="tanh", **kw)}


def adding_batch(generator, N, T):
    """(x [N,T,2], y [N,1]) of the adding problem."""
    values = torch.rand(N, T, generator=generator)
    marks = torch.zeros(N, T)
    for n in range(N):
        first, second = torch.randperm(T, generator=generator)[:2]
        marks[n, first] = marks[n, second] = 1.0
    return torch.stack([values, marks], dim=-1), (values * marks).sum(dim=1, keepdim=True)


class Model(torch.nn.Module):
    """A recurrent layer (batch-first) and a linear head on its last output."""

    def __init__(self, rnn, hidden):
        super().__init__()
        self.rnn = rnn
        self.head = torch.nn.Linear(hidden * (2 if rnn.bidirectional else 1), 1)

    def forward(self, x):
        output, _ = self.rnn(x)
        return self.head(output[:, -1])


class Progress:
    """A progress bar on stderr, redrawn at most every 0.1 s."""

    def __init__(self, total, width=30):
        self.total, self.width, self.last = total, width, 0.0

    def update(self, done, text):
        now = time.perf_counter()
        if done < self.total and now - self.last < 0.1:
            return
        self.last = now
        filled = self.width * done // self.total
        print(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done}/{self.total} {text}",
              end="" if done < self.total else "\n", file=sys.stderr, flush=True)


def train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rnn = CELLS[args.cell](2, args.hidden, num_layers=args.layers, batch_first=True)
    reference = Model(rnn, args.hidden)
    ours = Model(rt.from_torch(rnn, backend=args.backend), args.hidden)
    ours.head = copy.deepcopy(reference.head)
    models = {"torch.nn": reference, "rnngrad.torch": ours}
    optimizers = {k: torch.optim.Adam(m.parameters(), lr=args.lr) for k, m in models.items()}
    losses = {k: [] for k in models}
    times = {k: [] for k in models}
    generator = torch.Generator().manual_seed(args.seed + 1)
    progress = Progress(args.iterations)
    for it in range(args.iterations):
        x, y = adding_batch(generator, args.batch, args.steps)
        order = list(models) if it % 2 == 0 else list(models)[::-1]  # alternate who goes first
        for name in order:
            model, optimizer = models[name], optimizers[name]
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            times[name].append(time.perf_counter() - start)
            losses[name].append(loss.item())
        progress.update(it + 1, f"loss {losses['torch.nn'][-1]:.4f} / {losses['rnngrad.torch'][-1]:.4f}"
                                f"  {times['torch.nn'][-1] * 1e3:.1f} / "
                                f"{times['rnngrad.torch'][-1] * 1e3:.1f} ms")
    return losses, times


def check(losses, args) -> list:
    """Lines saying how the curves agree; the last one starts with FAIL when they do not."""
    a = np.array(losses["rnngrad.torch"], np.float64)
    b = np.array(losses["torch.nn"], np.float64)
    n = min(args.compare, len(a))
    ratio, mismatch = compare_array("state", a[:n], b[:n], np.float32)
    per_step = np.abs(a[:n] - b[:n]) / np.abs(b[:n])
    lines = [f"first {n} iterations: largest relative difference of the losses "
             f"{per_step.max():.2e} (at iteration {int(per_step.argmax())}); "
             f"{ratio:.3f} of the float32 tolerance"]
    last = slice(max(0, len(a) - 20), len(a))
    fa, fb = a[last].mean(), b[last].mean()
    lines.append(f"final loss (mean of the last {len(a[last])} iterations): torch.nn {fb:.5f}, "
                 f"rnngrad.torch {fa:.5f}, relative difference {abs(fa - fb) / fb:.2e}")
    failed = []
    if mismatch is not None:
        failed.append(f"the curves part within the first {n} iterations: {mismatch}")
    if abs(fa - fb) > args.final_rtol * fb:
        failed.append(f"the final losses differ by more than {args.final_rtol:.0%}")
    lines += [f"FAIL: {f}" for f in failed] or ["OK: the curves agree"]
    return lines


def plot(losses, path, title):
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed (pip install 'rnngrad[plot]'): no PNG written to {path}",
              file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for name, style in (("torch.nn", dict(lw=2.5, alpha=0.5)), ("rnngrad.torch", dict(lw=1, ls="--"))):
        ax.plot(losses[name], label=name, **style)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss (MSE)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    a, b = np.array(losses["rnngrad.torch"]), np.array(losses["torch.nn"])
    bx.semilogy(np.abs(a - b) / np.abs(b) + 1e-12)
    bx.set_xlabel("iteration")
    bx.set_ylabel("|rnngrad − torch| / torch")
    bx.set_title("relative difference of the losses (1e-12: equal in float32)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", default="gru", choices=sorted(CELLS))
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="sequence length T (default 20)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", default=None, help="rnngrad backend (default: the fastest)")
    parser.add_argument("--compare", type=int, default=100,
                        help="iterations whose losses must agree within float32 round-off")
    parser.add_argument("--final-rtol", type=float, default=0.05,
                        help="the final losses' largest relative difference (default 5%%)")
    parser.add_argument("--out", default="train_vs_torch.png", help="PNG of the loss curves")
    args = parser.parse_args(argv)

    print(f"adding problem, T={args.steps}, batch {args.batch}; {args.layers}-layer "
          f"{args.cell.upper()} of {args.hidden} units + linear head; Adam lr={args.lr}; "
          f"float32, {args.threads} threads; rnngrad backend {args.backend or 'default'}")
    losses, times = train(args)
    for name in ("torch.nn", "rnngrad.torch"):
        t = times[name][5:] or times[name]  # the first iterations compile and warm up
        print(f"{name:14} {statistics.median(t) * 1e3:8.2f} ms per iteration (median; "
              f"forward, backward and Adam step)")
    print(f"rnngrad.torch / torch.nn: "
          f"{statistics.median(times['rnngrad.torch'][5:]) / statistics.median(times['torch.nn'][5:]):.2f}")
    lines = check(losses, args)
    print("\n".join(lines))
    title = f"adding problem: {args.cell.upper()} {args.hidden}, T={args.steps}, batch {args.batch}"
    if plot(losses, args.out, title):
        print(f"loss curves: {args.out}")
    return 1 if lines[-1].startswith("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main())
