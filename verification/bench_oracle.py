"""The reference backend's speed against PyTorch's CPU modules, float64, one process.

Runs forward + gradients of the NumPy reference (rnngrad backend "reference") and forward +
backward of nn.RNN / nn.GRU / nn.LSTM at T=100, N=32, I=H=256 with 2 threads, and prints the
ratio per cell (target: reference LSTM ≤ 2× PyTorch). ``--profile`` prints where the
reference's time goes.

    python verification/bench_oracle.py [--profile]
"""

import cProfile
import os
import pstats
import statistics
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from rnngrad.bench.worker import _rnngrad, _torch, window  # noqa: E402

T, N, I, H = 100, 32, 256, 256


def median_time(run, repeats=3):
    run()  # untimed first call
    return statistics.median(window(run, repeats))


def main():
    torch.set_num_threads(2)
    print(f"T={T} N={N} I={I} H={H} float64, 2 threads")
    for cell in ("single_gate", "gru", "lstm"):
        req = dict(impl="reference", cell=cell, T=T, N=N, I=I, H=H, dtype="float64", threads=2)
        ref = median_time(_rnngrad(req))
        pt = median_time(_torch(dict(req, impl="torch")))
        print(f"{cell:12} reference {ref * 1e3:8.1f} ms   torch {pt * 1e3:8.1f} ms   ratio {ref / pt:5.2f}",
              flush=True)
        if "--profile" in sys.argv:
            profile = cProfile.Profile()
            run = _rnngrad(req)
            profile.runcall(run)
            pstats.Stats(profile).sort_stats("tottime").print_stats(8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
