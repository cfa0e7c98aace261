"""One implementation's timing process: ``python -m rnngrad.bench.worker JSON``.

The worker sets up the problem of the request and runs it once, then answers on stdout, one
JSON line each: first ``{"first": seconds}`` (setup, loading or compiling kernels and the
first run; ``"flops"`` too for "gemm"), then, for each line ``{"repeats": r, "min_seconds":
s, "warmup_seconds": w}`` read from stdin, ``{"times": [seconds, ...]}``: one timing window,
untimed runs for ``w`` seconds (at least one), then at least ``repeats`` timed runs, continued
until ``min_seconds`` have passed, at most ``MAX_RUNS`` (sub-millisecond problems get enough
runs for a stable median). The first line of a Metal backend also carries ``"versions"``: the
kernel version the host chose for each dispatch of the first call, and why (its DEBUG log). It exits at the end of stdin. Between windows
it waits on stdin, idle, so that ``rnngrad bench`` keeps every implementation's process
alive and lets them take turns within a fraction of a second of each other.

Request fields: impl ("numba", "reference", "metal-cuda", "torch" or "gemm"), cell, T, N, I, H,
dtype, threads, device ("cpu", default, or "cuda"). An rnngrad implementation times the
training forward plus the gradient op through the public functions; "torch" times nn.RNN /
nn.GRU / nn.LSTM forward + backward with PyTorch's semantics mapped onto rnngrad's ops (LSTM gates
[i,f,g,o] = [i,f,z,o]; GRU reset_gate_first, reset_after with secondary_bias = b_hn; RNN tanh);
"gemm" measures the GEMM rate on a [T·N, H] × [H, 4H] product (NumPy's, or cuBLAS's through CuPy
on "cuda"). On "cuda" the inputs are already in GPU memory, PyTorch runs cuDNN with TF32 off,
and every timed run ends with the device synchronised: the time of one call as a user sees it.
"""

from __future__ import annotations

import json
import logging
import sys
import time

MAX_RUNS = 2000


def _rnngrad(req):
    import numpy as np
    import rnngrad as rg

    T, N, I, H, cell = req["T"], req["N"], req["I"], req["H"], req["cell"]
    dt = np.dtype(req["dtype"])
    G = {"single_gate": 1, "gru": 3, "lstm": 4}[cell]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, N, I)).astype(dt)
    W = (rng.standard_normal((G * H, I)) / np.sqrt(I)).astype(dt)
    R = (rng.standard_normal((G * H, H)) / np.sqrt(H)).astype(dt)
    b = np.zeros(G * H, dt)
    dh = np.ones((T, N, H), dt)
    backend = req["impl"]
    if req.get("device") == "cuda":
        import cupy as cp

        x, W, R, b, dh = (cp.asarray(a) for a in (x, W, R, b, dh))
        run = _rnngrad_run(rg, cell, x, W, R, b, dh, backend, cp.zeros(H, dt))
        sync = cp.cuda.Device().synchronize

        def synced():
            run()
            sync()
        return synced
    return _rnngrad_run(rg, cell, x, W, R, b, dh, backend, np.zeros(H, dt))


def _rnngrad_run(rg, cell, x, W, R, b, dh, backend, b2):
    if cell == "lstm":
        d = rg.LSTMDescriptor(training=True)

        def run():
            h, c, z = rg.lstm(x, R, W, b, descriptor=d, backend=backend)
            rg.lstm_gradients(x, R, dh, z, c, input_weight=W, bias=b, descriptor=d, backend=backend)
    elif cell == "gru":
        d = rg.GRUDescriptor(training=True, reset_gate_first=True, reset_after=True)

        def run():
            h, z = rg.gru(x, R, W, b, secondary_bias=b2, descriptor=d, backend=backend)
            rg.gru_gradients(x, R, dh, z, h, input_weight=W, bias=b, secondary_bias=b2,
                             descriptor=d, backend=backend)
    else:
        d = rg.SingleGateRNNDescriptor(training=True, activation="tanh")

        def run():
            h, z = rg.single_gate_rnn(x, R, W, b, descriptor=d, backend=backend)
            rg.single_gate_rnn_gradients(x, R, dh, z, input_weight=W, bias=b, descriptor=d,
                                         backend=backend)
    return run


def _torch(req):
    import torch

    torch.set_num_threads(req["threads"])
    T, N, I, H, cell = req["T"], req["N"], req["I"], req["H"], req["cell"]
    dt = getattr(torch, req["dtype"])
    device = req.get("device", "cpu")
    if device == "cuda":  # strict float32: cuDNN and cuBLAS without TF32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    module = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU,
              "single_gate": lambda i, h, **kw: torch.nn.RNN(i, h, nonlinearity="tanh", **kw)}[cell]
    m = module(I, H, dtype=dt, device=device)
    x = torch.randn(T, N, I, dtype=dt, requires_grad=True, device=device)
    dh = torch.ones(T, N, H, dtype=dt, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run():
        y, _ = m(x)
        y.backward(dh)
        sync()
    return run


def _gemm(req):
    import numpy as np

    dt = np.dtype(req["dtype"])
    M, K, C = max(req["T"] * req["N"], 2048), max(req["H"], 512), max(4 * req["H"], 2048)
    req["flops"] = 2.0 * M * K * C
    if req.get("device") == "cuda":
        import cupy as cp

        rng = cp.random.default_rng(0)
        a, b = rng.standard_normal((M, K), dtype=dt), rng.standard_normal((K, C), dtype=dt)
        sync = cp.cuda.Device().synchronize

        def product():
            a @ b
            sync()
        return product
    a, b = np.ones((M, K), dt), np.ones((K, C), dt)
    return lambda: a @ b


def window(run, repeats, min_seconds=0.0, warmup_seconds=0.0):
    """Times of ``run()``: at least ``repeats`` runs, more until ``min_seconds`` have passed
    (at most ``MAX_RUNS``), after untimed runs for ``warmup_seconds`` (at least one when it is
    positive)."""
    if warmup_seconds > 0:
        end = time.perf_counter() + warmup_seconds
        run()
        while time.perf_counter() < end:
            run()
    times = []
    budget = time.perf_counter() + min_seconds
    while len(times) < repeats or (time.perf_counter() < budget and len(times) < MAX_RUNS):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return times


class _Versions(logging.Handler):
    """The Metal host's version choices (DEBUG records of ``rnngrad.backends.metal``: "backend:
    version kernel: reason"), each once, in order."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen = []

    def emit(self, record):
        message = record.getMessage()
        if message not in self.seen:
            self.seen.append(message)


def main(argv):
    replies, sys.stdout = sys.stdout, sys.stderr  # stdout carries the replies only
    req = json.loads(argv[0])
    make = {"torch": _torch, "gemm": _gemm}.get(req["impl"], _rnngrad)
    versions = _Versions()
    logger = logging.getLogger("rnngrad.backends.metal")
    logger.addHandler(versions)
    logger.setLevel(logging.DEBUG)
    t0 = time.perf_counter()
    run = make(req)
    run()
    ready = {"first": time.perf_counter() - t0}
    logger.removeHandler(versions)  # the first call's choices: every later call makes the same
    if versions.seen:
        ready["versions"] = versions.seen
    if "flops" in req:
        ready["flops"] = req["flops"]
    print(json.dumps(ready), file=replies, flush=True)
    for line in sys.stdin:
        w = json.loads(line)
        times = window(run, w["repeats"], w.get("min_seconds", 0.0), w.get("warmup_seconds", 0.0))
        print(json.dumps({"times": times}), file=replies, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
