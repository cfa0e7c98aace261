"""Compiling the kernels before first use, one process per cell and dtype, side by side.

numba compiles each kernel on its first call, on the calling thread: from an empty cache the
three cells take minutes per dtype, one core busy. :func:`compile_kernels` runs that
compilation in worker processes instead, one task per cell and dtype, as many at once as there
are cores, each task calling the ops on problems that take every path of the driver (one call,
units split, rows split, products beside the recurrence). Every worker saves what it compiled
to the kernel cache, so the calling process then loads it all from there. Kernels a later call
still lacks (a path not covered here) compile on first use, as before.

Workers write the shared cache folder under :class:`~rnngrad.backends.numba.LockedCacheFile`'s
lock; a marker file per task in that folder records it as done. With ``NUMBA_CACHE_DIR`` set,
or without a usable folder, the kernels are in numba's own cache files, without the lock, and
nothing is done here. The workers are started with ``spawn``: a script that calls
:func:`compile_kernels` needs the usual ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import sys
import time

import numpy as np

#: the cells, the longest to compile first, and the dtypes
CELLS = ("lstm", "gru", "single_gate")
DTYPES = ("float32", "float64")

#: (T, N, I, H) of the problems each task runs, forward and gradients, with every optional
#: input, bidirectional: one call (small); hidden units split (N = 8, 2·N·G·H·H ≥ 4 MFLOP a
#: step); batch rows split (N = 16); one thread with the products beside it (the projection
#: and weight products above ``overlap.MIN_FLOPS``)
SHAPES = ((3, 2, 3, 4), (4, 8, 16, 512), (8, 16, 16, 128), (1000, 8, 512, 128))


def folder() -> str | None:
    """rnngrad's kernel folder, where the warm-up applies (``kernel_folder``)."""
    from . import kernel_folder

    return kernel_folder()


def _marker(cell, dtype) -> str:
    return os.path.join(folder(), f"compiled-{cell}-{np.dtype(dtype).name}")


def missing(dtypes=DTYPES, cells=CELLS) -> list:
    """The (cell, dtype name) tasks of :func:`compile_kernels` not yet done in rnngrad's kernel
    folder (none where there is no such :func:`folder`)."""
    if folder() is None:
        return []
    return [(cell, np.dtype(d).name) for d in dtypes for cell in cells
            if not os.path.exists(_marker(cell, d))]


def run_task(cell: str, dtype: str) -> float:
    """Compile (or load) every kernel one cell uses in one dtype, by running its ops on
    :data:`SHAPES`. Returns the seconds taken."""
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    for T, N, I, H in SHAPES:
        forward, gradients = _ops(cell, _problem(rng, cell, T, N, I, H, np.dtype(dtype)))
        gradients(*forward())
    return time.perf_counter() - start


def _problem(rng, cell, T, N, I, H, dtype) -> dict:
    """{argument: array} of a bidirectional problem with every optional input: the kernels'
    types do not depend on the descriptor's other options, which the kernels read at run
    time."""
    G = {"single_gate": 1, "gru": 3, "lstm": 4}[cell]
    D = 2

    def draw(*shape, scale=0.5):
        return (scale * rng.standard_normal(shape)).astype(dtype)
    given = dict(source=draw(T, N, I), recurrent_weight=draw(D, G * H, H),
                 input_weight=draw(D * G * H, I), bias=draw(D * G * H), init_state=draw(N, D * H),
                 mask=(rng.random((T, N, D * H)) < 0.9).astype(dtype))
    if cell == "lstm":
        given.update(init_cell=draw(N, D * H), peephole=draw(D, 4 * H))
    if cell == "gru":
        given.update(secondary_bias=draw(D * H))
    return given


def _ops(cell, given):
    """(forward(), gradients(*forward's outputs)) of ``cell`` on ``given`` on the numba
    backend, training, with a state gradient (and a per-step cell gradient)."""
    from ... import api, descriptors

    descriptor = {"single_gate": descriptors.SingleGateRNNDescriptor,
                  "gru": descriptors.GRUDescriptor,
                  "lstm": descriptors.LSTMDescriptor}[cell](bidirectional=True, training=True)
    h_shape = (given["source"].shape[0],) + given["init_state"].shape
    upstream = dict(source_gradient=np.ones(h_shape, given["source"].dtype),
                    state_gradient=np.ones_like(given["init_state"]))
    forward = functools.partial(api.run_forward, cell, descriptor, "numba", **given)

    def gradients(h, *rest):
        extra = {}
        if cell == "lstm":
            c, z = rest
            extra = dict(z_state=z, cell_output_fwd=c, cell_gradient=np.ones(h_shape, h.dtype))
        elif cell == "gru":
            extra = dict(z_state=rest[0], output_fwd=h)
        else:
            extra = dict(z_state=rest[0])
        return api.run_gradients(cell, descriptor, "numba", **given, **upstream, **extra)
    return forward, gradients


def _cores() -> int:
    """The cores this process may run on (its affinity mask, where the system has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def compile_kernels(dtypes=DTYPES, cells=CELLS, processes=None,
                    report=None) -> float:
    """Compile the kernels of each of ``cells`` in each of ``dtypes`` not yet compiled
    (:func:`missing`), one task per cell and dtype, in ``processes`` worker processes (default:
    one per core, at most one per task; nothing is done with fewer than two, where compiling on
    first use takes as long). ``report(line)`` is called as each task ends (default: print to
    stderr). Returns the seconds taken (0 when nothing was done)."""
    tasks = missing(dtypes, cells)
    processes = min(processes or _cores(), len(tasks))
    if processes < 2:
        return 0.0
    report = report or (lambda line: print(line, file=sys.stderr, flush=True))
    names = ", ".join(dict.fromkeys(dtype for _, dtype in tasks))
    report(f"compiling the numba kernels for first use ({names}): {len(tasks)} tasks in "
           f"{processes} processes; they are kept in the kernel cache for later processes")
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")  # no fork of a process with numba's threads
    try:
        pool = concurrent.futures.ProcessPoolExecutor(processes, mp_context=context)
    except OSError as exc:  # no processes here (e.g. no shared-memory semaphores)
        report(f"  no worker processes ({exc}); the kernels compile on first use instead")
        return 0.0
    with pool:
        futures = {pool.submit(run_task, cell, dtype): (cell, dtype) for cell, dtype in tasks}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            cell, dtype = futures[future]
            try:
                seconds = future.result()
            except Exception as exc:  # noqa: BLE001 (a worker's error, or a worker lost)
                report(f"  [{done}/{len(tasks)}] {cell} {dtype}: failed ({type(exc).__name__}: "
                       f"{exc}); its kernels compile on first use instead")
                continue
            with open(_marker(cell, dtype), "w") as f:
                f.write(f"{seconds:.1f} s\n")
            report(f"  [{done}/{len(tasks)}] {cell} {dtype}: {seconds:.0f} s "
                   f"({time.perf_counter() - start:.0f} s in all)")
    return time.perf_counter() - start
