"""Which GEMM library runs which of the numba kernels' products: the fastest on this CPU, by
measurement.

The kernels' products are of two kinds, and each gets its own library:

- ``step``: the recurrent product of every time step, a few rows ([N,H]·[H,G·H] forward,
  [N,G·H]·[G·H,H] in the gradients) by the same weight at every step. Candidates: every
  library (``libraries.py``), and ``mkl-packed``: MKL multiplying by the weight packed once
  (used where ``blas.worth_packing``, MKL's plain product elsewhere).
- ``large``: the products over all steps (the input projection, the weight and source
  gradients), thousands of rows, one of them transposed.

At the backend's first use each candidate runs every shape of its kind (:data:`STEP_SHAPES`,
:data:`LARGE_SHAPES`) on one thread, the candidates taking turns over :data:`ROUNDS` rounds;
a candidate's time at a shape is its fastest round (another process taking the core slows
rounds, never speeds them), its score the geometric mean of its rates over the shapes, and the
highest score wins each kind, per dtype. The rates are kept in the kernel cache under a key
of the CPU (model and features) and the candidates found (their versions and files), so a
later process reads them instead, and a new CPU or a newly installed library measures again.
``RNNGRAD_BLAS=mkl|openblas|onednn`` runs every product it has on that library instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
import warnings

import numpy as np

from .libraries import B_MATRIX, NO_TRANS, PACKED_B, ROW_MAJOR, TRANS

#: (M, K, N) of the per-step products measured: forward and gradient forms at H = 128, 256, 512
#: (4 gates) with 8, 16 and 32 rows (a batch, or a thread's part of one)
STEP_SHAPES = ((8, 128, 512), (8, 512, 128), (16, 256, 1024), (16, 1024, 256),
               (32, 512, 2048), (32, 2048, 512))
#: (M, K, N, A transposed) of the large products measured: a projection (or source gradient)
#: and a weight gradient (dXᵀ over all steps' rows)
LARGE_SHAPES = ((2048, 256, 1024, False), (1024, 2048, 256, True))
#: rounds in which every candidate runs every shape once
ROUNDS = 5
#: seconds one timing of a shape lasts at least (its calls repeated)
SECONDS = 0.001
#: version of this rule, part of the key: a changed rule measures again
VERSION = 1

PACKED = "mkl-packed"
DTYPES = {"s": np.float32, "d": np.float64}


def key(libraries) -> str:
    """The key of a measurement: this CPU (model and features), the candidates (their
    versions and files) and the rule's version."""
    from ... import machine

    text = json.dumps([VERSION, machine.cpu_name(), sorted(machine.cpu_flags()),
                       {name: lib.detail for name, lib in sorted(libraries.items())}])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _timer(call, flops):
    """(repeats, fn) where fn() runs ``call`` ``repeats`` times and returns the seconds taken
    per call; repeats chosen so that a timing lasts about :data:`SECONDS` at 50 GFLOP/s."""
    repeats = max(1, int(SECONDS * 5e10 / flops))

    def fn():
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        return (time.perf_counter() - start) / repeats
    return fn


def _calls(libraries, p, shape, packed_buffers):
    """{candidate: a function running the product ``shape`` once}, and the FLOPs of one."""
    M, K, N, trans_a = shape if len(shape) == 4 else (*shape, False)
    dtype = DTYPES[p]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((K, M) if trans_a else (M, K)).astype(dtype)
    b = rng.standard_normal((K, N)).astype(dtype)
    c = np.empty((M, N), dtype)
    ta, lda = (TRANS, M) if trans_a else (NO_TRANS, K)
    calls = {}
    for name, lib in libraries.items():
        fn = lib.function(p)
        if fn is not None:
            calls[name] = (lambda fn=fn: fn(ROW_MAJOR, ta, NO_TRANS, M, N, K, 1.0, a.ctypes.data,
                                             lda, b.ctypes.data, N, 0.0, c.ctypes.data, N))
    mkl = libraries["mkl"].mkl if "mkl" in libraries else None
    if mkl is not None and len(shape) == 3:
        size = getattr(mkl.lib, f"cblas_{p}gemm_pack_get_size")(B_MATRIX, M, N, K)
        packed = np.empty(-(-size // 8) + 8, np.float64)  # 8-byte aligned at least
        packed_buffers.append((a, b, c, packed))
        getattr(mkl.lib, f"cblas_{p}gemm_pack")(ROW_MAJOR, B_MATRIX, NO_TRANS, M, N, K, 1.0,
                                                b.ctypes.data, N, packed.ctypes.data)
        compute = getattr(mkl.lib, f"cblas_{p}gemm_compute")  # declared by libraries.Mkl
        calls[PACKED] = lambda: compute(ROW_MAJOR, ta, PACKED_B, M, N, K, a.ctypes.data, lda,
                                        packed.ctypes.data, N, 0.0, c.ctypes.data, N)
    packed_buffers.append((a, b, c))  # alive while the calls are
    return calls, 2.0 * M * K * N


def measure(libraries, p, rounds=ROUNDS) -> dict:
    """{"step": {candidate: GFLOP/s}, "large": {...}}: each candidate's geometric mean rate
    over the shapes of each kind, in dtype p ("s" float32, "d" float64), one thread."""
    from ... import machine

    keep = []
    kinds = {"step": [_calls(libraries, p, s, keep) for s in STEP_SHAPES],
             "large": [_calls(libraries, p, s, keep) for s in LARGE_SHAPES]}
    for calls, _ in kinds["large"]:
        calls.pop(PACKED, None)  # packing pays over many steps, not one product
    with machine.blas_threads("scipy", 1):
        best = {kind: [{} for _ in shapes] for kind, shapes in kinds.items()}
        timers = {kind: [{n: _timer(f, flops) for n, f in calls.items()} for calls, flops in shapes]
                  for kind, shapes in kinds.items()}
        for kind in timers:  # once each, untimed: first calls set up
            for per_shape in timers[kind]:
                for fn in per_shape.values():
                    fn()
        for r in range(rounds):
            for kind, shapes in timers.items():
                for i, per_shape in enumerate(shapes):
                    names = list(per_shape)
                    names = names[r % len(names):] + names[:r % len(names)]  # turns
                    for name in names:
                        t = per_shape[name]()
                        best[kind][i][name] = min(best[kind][i].get(name, math.inf), t)
    rates = {}
    for kind, shapes in kinds.items():
        names = set.intersection(*(set(calls) for calls, _ in shapes))
        rates[kind] = {n: math.exp(sum(math.log(flops / best[kind][i][n] / 1e9)
                                       for i, (_, flops) in enumerate(shapes)) / len(shapes))
                       for n in sorted(names)}
    return rates


class Choice:
    """The libraries of each kind of product per dtype: ``step[p]`` (a library's name or
    :data:`PACKED`), ``large[p]``; ``rates`` {p: {kind: {candidate: GFLOP/s}}} (empty with an
    override for every dtype); ``how``: where the choice came from; ``forced``: the library
    ``RNNGRAD_BLAS`` named, or ""."""

    def __init__(self, step, large, rates, how, forced=""):
        self.step, self.large, self.rates, self.how = step, large, rates, how
        self.forced = forced

    def library(self, kind, p) -> str:
        """The library whose functions run the products of ``kind`` in dtype p."""
        name = (self.step if kind == "step" else self.large)[p]
        return "mkl" if name == PACKED else name

    def describe(self) -> list:
        """Lines for ``rnngrad info``: each kind's library and rates per dtype, and how."""
        lines = []
        for p, dtype in (("s", "float32"), ("d", "float64")):
            for kind, what in (("step", "per-step products"), ("large", "large products")):
                chosen = (self.step if kind == "step" else self.large)[p]
                rates = self.rates.get(p, {}).get(kind, {})
                listed = ", ".join(f"{n} {r:.0f}" for n, r in
                                   sorted(rates.items(), key=lambda item: -item[1]))
                lines.append(f"{dtype} {what}: {chosen}"
                             + (f" (GFLOP/s, one thread: {listed})" if listed else ""))
        lines.append(self.how)
        return lines


def _pick(rates):
    return max(rates, key=rates.get)


def choose(libraries, folder=None, remeasure=False) -> Choice:
    """The :class:`Choice` for the ``libraries`` found (at least one): ``RNNGRAD_BLAS``'s
    library where it names one found, else the measured fastest, the rates read from
    ``folder`` (the kernel cache; by default numba's ``NUMBA_CACHE_DIR`` where it is set) when
    kept there for this :func:`key`, else measured (and kept there)."""
    import numba

    folder = folder or numba.config.CACHE_DIR or None
    forced = os.environ.get("RNNGRAD_BLAS", "").strip().lower()
    if forced and forced not in libraries:
        warnings.warn(f"RNNGRAD_BLAS: expected one of the GEMM libraries found here "
                      f"({', '.join(libraries)}), got {forced!r}; the measured fastest is used",
                      stacklevel=3)
        forced = ""
    path = None if folder is None else os.path.join(folder, f"gemm-rule-{key(libraries)}.json")
    rates, how = None, ""
    if path is not None and not remeasure:
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                rates = json.load(f)["rates"]
            how = f"measured on this CPU before, kept in {path}"
    needed = [p for p in DTYPES
              if not forced or libraries[forced].gemm.get(p) is None]  # what the rule decides
    if rates is None and needed:
        rates = {p: measure(libraries, p) for p in DTYPES}
        how = "measured now"
        if path is not None:
            with contextlib.suppress(OSError):
                tmp = f"{path}.{os.getpid()}"
                with open(tmp, "w") as f:
                    json.dump({"rates": rates, "candidates": {n: lib.detail for n, lib in
                                                              libraries.items()}}, f, indent=1)
                os.replace(tmp, path)
                how = f"measured now, kept in {path}"
    rates = rates or {}
    step, large = {}, {}
    for p in DTYPES:
        if p not in needed:
            step[p] = PACKED if forced == "mkl" else forced
            large[p] = forced
        else:
            step[p], large[p] = _pick(rates[p]["step"]), _pick(rates[p]["large"])
    if forced:
        how = f"RNNGRAD_BLAS={forced}" + (f"; float64 by the rule ({how})" if needed else "")
    else:
        how = "the fastest at the recurrences' shapes, " + how
    return Choice(step, large, rates if needed else {}, how, forced)
