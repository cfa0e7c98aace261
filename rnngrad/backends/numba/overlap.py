"""The large products beside a one-thread recurrence, on the other core.

When a direction's recurrence runs on one thread (``driver.schedule`` gives one part: a small
batch or few hidden units), the other cores would idle through it. The products whose rows
are time steps then run beside it on a helper thread, a chunk of steps at a time, while the
calling thread runs the recurrence chunk after chunk (one kernel call each, ``common.py``):

- :func:`forward`: the input projection x' = source Wᵀ, one chunk ahead of the recurrence;
- :func:`gradients`: the weight gradients (dR = Σ dXᵀ HM, dW = dXᵀ source), one chunk
  behind it, accumulated into the result chunk by chunk; what is left when the recurrence
  ends is shared by both threads.

What keeps the two threads from fighting over the cores: every compiled function releases the
GIL (``activations.JIT``); the helper runs only single-threaded products (``gemm.product``,
``gemm.accumulate``: MKL's sequential GEMM, or SciPy's OpenBLAS limited to one thread around
the op), and both functions return only when the helper is done, so no parallel region starts
while it works; the helper is one thread running one task at a time, and the calling thread
accumulates into results of its own, so no result ever has two writers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading

import numba
import numpy as np

from .gemm import accumulate

#: overlap when the products moved to the helper take at least this many floating-point
#: operations: each chunk's hand-over and kernel call has a fixed cost, which smaller problems
#: do not win back (verification/PERFORMANCE.md, "numba's thresholds")
MIN_FLOPS = 600_000_000
#: the loop is cut into about this many chunks: the first chunk's projection and the last
#: chunk's weight products cannot overlap the recurrence …
CHUNKS = 16
#: … of at least this many rows (steps × batch) each, so that each chunk's product is a GEMM
#: BLAS runs near its full rate
MIN_CHUNK_ROWS = 256

#: tests: hand each chunk of the gradients over at once, waiting for the helper to finish it
#: before the recurrence goes on (the earliest moment the helper may read a chunk's rows)
EAGER = False

_pool, _pool_pid = None, None
_pool_lock = threading.Lock()


def _helper() -> concurrent.futures.ThreadPoolExecutor:
    """The helper thread's executor, made at first use and again in a forked child (where the
    parent's thread does not exist)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rnngrad-overlap")
            _pool_pid = os.getpid()
    return _pool


def bounds(T: int, N: int, parts: int, flops: float) -> list[int] | None:
    """Chunk boundaries ``0 = b₀ < b₁ < … < b_k = T`` in steps, or None for no overlap: the
    recurrence already runs in parallel (``parts`` > 1), numba has one thread, the products
    are small (``flops``), or the loop would be a single chunk."""
    if parts != 1 or flops < MIN_FLOPS or numba.get_num_threads() < 2:
        return None
    size = max(-(-T // CHUNKS), -(-MIN_CHUNK_ROWS // max(N, 1)))
    if size >= T:
        return None
    return list(range(0, T, size)) + [T]


def times(s0: int, s1: int, T: int, x_rev: bool) -> tuple[int, int]:
    """The input-time rows ``t0 … t1−1`` of the steps ``s0 … s1−1`` (``common.py``)."""
    return (T - s1, T - s0) if x_rev else (s0, s1)


def forward(recur, project, b: list[int]) -> None:
    """``recur(s0, s1)`` for every chunk, upward, on this thread, each once ``project(s0, s1)``
    of its steps has run on the helper (the projection of chunk k+1 runs during the
    recurrence of chunk k)."""
    helper = _helper()
    project(b[0], b[1])
    pending = None
    try:
        for k in range(len(b) - 1):
            if k + 2 < len(b):
                pending = helper.submit(project, b[k + 1], b[k + 2])
            recur(b[k], b[k + 1])
            if pending is not None:
                done, pending = pending, None
                done.result()
    finally:
        if pending is not None:
            concurrent.futures.wait([pending])  # never leave the helper writing


def gradients(recur, products, b: list[int], T: int, N: int, x_rev: bool) -> None:
    """``recur(s0, s1)`` for every chunk, downward, on this thread, and the weight gradients
    ``out += Aᵀ B`` of each (out [M,K], A [T·N,M], B [T·N,K]) of ``products`` (rows: N per
    step, in input time) over the steps whose rows are complete, on the helper. Once the
    recurrence has run down to step s0, those are the steps from s0 + 1 up (step s writes
    the recurrent input of step s + 1), and all of them once s0 = 0. When the recurrence is
    done, this thread takes the chunks the helper has not started, from the other end, into
    results of its own added at the end. Returns when every step is in ``out``."""
    ready, cond = collections.deque(), threading.Condition()
    state = {"done": False, "busy": False}

    def add(s0, s1, outs):
        t0, t1 = times(s0, s1, T, x_rev)
        for out, (_, a, m) in zip(outs, products):
            accumulate(a[t0 * N:t1 * N], m[t0 * N:t1 * N], out)

    def drain():
        outs = [out for out, _, _ in products]
        while True:
            with cond:
                state["busy"] = False
                cond.notify_all()
                while not ready and not state["done"]:
                    cond.wait()
                if not ready:
                    return
                chunk, state["busy"] = ready.popleft(), True
            add(*chunk, outs)

    def finish(clear):
        with cond:
            if clear:
                ready.clear()
            state["done"] = True
            cond.notify_all()
    helper = _helper().submit(drain)
    unconsumed = b[-1]
    try:
        for k in range(len(b) - 2, -1, -1):
            recur(b[k], b[k + 1])
            first = b[k] + 1 if b[k] > 0 else 0
            if first < unconsumed:
                with cond:
                    ready.append((first, unconsumed))
                    cond.notify_all()
                    while EAGER and (ready or state["busy"]) and not helper.done():
                        cond.wait(0.01)
                unconsumed = first
    except BaseException:
        finish(clear=True)
        concurrent.futures.wait([helper])  # never leave the helper writing
        raise
    finish(clear=False)
    own = None
    while True:
        with cond:
            chunk = ready.pop() if ready else None
        if chunk is None:
            break
        own = own or [np.zeros_like(out) for out, _, _ in products]
        add(*chunk, own)
    helper.result()
    for (out, _, _), mine in zip(products, own or []):
        out += mine
