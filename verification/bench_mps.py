"""A training step through ``rnngrad.torch`` on PyTorch's ``"mps"`` device (backend
``metal-mps``: rnngrad's Metal kernels through ``torch.mps.compile_shader``) against
``torch.nn``'s on ``"mps"`` and on the CPU, at the four bench shapes. Prints one table.

One training step, the same for every implementation::

    for p in layer.parameters(): p.grad = None     # zero_grad(set_to_none=True)
    output, h_n = layer(x)                          # [T,N,I] float32, x needing its gradient
    output.backward(dy)
    synchronize(device)

On a Mac (PyTorch 2.7 or later)::

    python verification/bench_mps.py

Columns: ``rnngrad mps`` (rnngrad.torch on "mps", metal-mps), ``nn mps`` and ``nn cpu``
(``torch.nn``), in milliseconds a step (the median of ``--passes`` timing windows, the
implementations taking turns, who goes first alternating), and the ratios of the others to
rnngrad's (above 1: rnngrad is faster).

Without a Mac, ``--standin cuda`` (or ``cpu``) runs the same table on the harness stand-in of
``torch.mps.compile_shader`` (``rnngrad.backends.metal.harness.contexts.mps_standin``) with CUDA (CPU)
tensors, against the harness target's own path (``metal-cuda`` for CUDA, ``metal-emulated`` for
the CPU, through rnngrad.torch) and ``torch.nn`` on that device: the stand-in's own cost, not
Apple's. On the GPU machine::

    python verification/bench_mps.py --standin cuda

    [--shapes 50x1x64x64 ...] [--cells lstm gru single_gate] [--passes 5] [--min-seconds 0.2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

SHAPES = ["50x1x64x64", "100x32x256x256", "200x64x512x512", "1000x8x128x128"]
CELLS = {"lstm": "LSTM", "gru": "GRU", "single_gate": "RNN"}


def _sync(device):
    import torch

    if device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "cuda":
        torch.cuda.synchronize(device)


class Impl:
    """One implementation of the step: a layer on a device, run inside ``context()``."""

    def __init__(self, name, layer, device, context=contextlib.nullcontext):
        self.name, self.layer, self.device, self.context = name, layer, device, context

    def step(self, x, dy):
        for p in self.layer.parameters():
            p.grad = None
        output, _ = self.layer(x)
        output.backward(dy)
        _sync(self.device)

    def window(self, data, min_seconds):
        """Seconds a step: steps repeated for at least ``min_seconds``, after one untimed."""
        x, dy = data
        with self.context():
            self.step(x, dy)
            n, start = 0, time.perf_counter()
            while True:
                self.step(x, dy)
                n += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min_seconds:
                    return elapsed / n


def _implementations(cell, I, H, standin):
    """[Impl]: rnngrad.torch on metal-mps first, then the comparisons."""
    import torch

    import rnngrad.torch as rt
    from rnngrad.backends.metal.mps import tensors

    torch.manual_seed(0)
    make = getattr(torch.nn, CELLS[cell])
    module = make(I, H, batch_first=False)
    impls = []
    if standin is None:
        mps = torch.device("mps")
        layer = rt.from_torch(module).to(mps)
        impls.append(Impl("rnngrad mps", layer, mps))
        impls.append(Impl("nn mps", make(I, H).to(mps), mps))
    else:
        device = torch.device(standin)

        @contextlib.contextmanager
        def own_path():
            # the harness target's own backend for these tensors, outside the stand-in
            tensors.DEVICES.discard(standin)
            try:
                yield
            finally:
                tensors.DEVICES.add(standin)

        # the stand-in's context is entered once for the whole run (measure)
        layer = rt.from_torch(module).to(device)
        impls.append(Impl(f"stand-in {standin}", layer, device))
        own = "metal-cuda" if standin == "cuda" else "metal-emulated"
        impls.append(Impl(own, rt.from_torch(module, backend=own).to(device),
                          device, own_path))
        impls.append(Impl(f"nn {standin}", make(I, H).to(device), device))
    cpu = torch.device("cpu")
    impls.append(Impl("nn cpu", make(I, H), cpu))
    for impl in impls[1:]:
        impl.layer.load_state_dict(module.state_dict())
    return impls


def measure(args):
    import torch

    from rnngrad.backends.metal.harness import contexts

    rows = []
    with (contexts.mps_standin(args.standin, poison=False) if args.standin
          else contextlib.nullcontext()):
        for text in args.shapes:
            T, N, I, H = (int(v) for v in text.lower().split("x"))
            for cell in args.cells:
                impls = _implementations(cell, I, H, args.standin)
                times = {impl.name: [] for impl in impls}
                g = torch.Generator().manual_seed(1)
                x0 = torch.randn(T, N, I, generator=g)
                dy0 = torch.randn(T, N, H, generator=g)
                data = {}
                for impl in impls:
                    if impl.device not in data:
                        data[impl.device] = (x0.to(impl.device).requires_grad_(),
                                             dy0.to(impl.device))
                for p in range(args.passes):
                    for impl in (impls if p % 2 == 0 else impls[::-1]):
                        times[impl.name].append(impl.window(data[impl.device],
                                                            args.min_seconds))
                    print(f"\r{CELLS[cell]} {text}: pass {p + 1}/{args.passes}   ", end="",
                          file=sys.stderr, flush=True)
                rows.append((f"{CELLS[cell]} {text}",
                             [(name, statistics.median(v)) for name, v in times.items()]))
    print(file=sys.stderr)
    return rows


def table(rows) -> str:
    names = [name for name, _ in rows[0][1]]
    first = names[0]
    head = ["problem"] + [f"{n} ms" for n in names] + [f"{n} ÷ {first}" for n in names[1:]]
    lines = []
    for label, values in rows:
        ms = dict(values)
        lines.append([label] + [f"{ms[n] * 1e3:.2f}" for n in names]
                     + [f"{ms[n] / ms[first]:.2f}" for n in names[1:]])
    widths = [max(len(r[i]) for r in [head] + lines) for i in range(len(head))]
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    out = [fmt.format(*head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt.format(*r) for r in lines]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--standin", choices=("cuda", "cpu"),
                        help="run metal-mps on the harness stand-in with tensors of this device")
    parser.add_argument("--shapes", nargs="+", default=SHAPES, metavar="TxNxIxH")
    parser.add_argument("--cells", nargs="+", default=["lstm", "gru"], choices=list(CELLS))
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=0.2,
                        help="least time of one timing window, in seconds (at least one step)")
    args = parser.parse_args(argv)
    import platform

    import torch

    import rnngrad
    from rnngrad import registry

    if args.standin is None:
        reason = dict((n, r) for n, _, _, r in registry.status()).get("metal-mps")
        if reason:
            print(f"bench_mps: metal-mps is not available here: {reason}; without a Mac, run "
                  f"with --standin cuda (or cpu)", file=sys.stderr)
            return 2
    if args.standin == "cuda" and not torch.cuda.is_available():
        print("bench_mps: --standin cuda needs a CUDA device", file=sys.stderr)
        return 2
    # no TF32 anywhere: every implementation computes in float32 (cuDNN's RNNs allow TF32 by
    # default)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = measure(args)
    where = (f"stand-in on {args.standin}" if args.standin
             else f"{platform.mac_ver()[0] and 'macOS ' + platform.mac_ver()[0]} "
                  f"{platform.machine()}")
    print(f"bench_mps: rnngrad {rnngrad.__version__}, PyTorch {torch.__version__}, {where}; "
          f"training step (forward + backward, float32, TxNxIxH), median of {args.passes} "
          f"windows, CPU threads {torch.get_num_threads()}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
