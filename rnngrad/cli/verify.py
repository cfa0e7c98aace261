"""``rnngrad verify``: certify the reference, then check every other backend against it.

1. The reference against central finite differences in float64: random problems over every
   cell, descriptor option and optional input (directional checks), and every element of every
   gradient for tiny problems.
2. Every other available backend (or those named with ``--backend``) against the reference, for
   every cell, forward and gradients, in each dtype the backend computes in, through
   :func:`rnngrad.testing.check_case`, the same comparison ``rnngrad.testing`` offers to users.

Prints progress, a summary table, the first mismatch of each failing row with a reproduction,
and exits 1 on any failure.
"""

from __future__ import annotations

import sys
import time

import numpy as np

HELP = "certify the reference against finite differences and every backend against the reference"

_BOUNDARY = (1, 31, 32, 33)


def add_arguments(parser):
    parser.add_argument("--backend", action="append", metavar="NAME",
                        help="check this backend (repeatable); default: every available backend "
                             "(metal-emulated only when named)")
    parser.add_argument("--examples", type=int, default=24, metavar="N",
                        help="random problems per cell and check (default 24)")
    parser.add_argument("--seed", type=int, default=20261122, help="seed of the draws")
    parser.add_argument("--skip-reference", action="store_true",
                        help="skip the finite-difference certification of the reference")


class _Progress:
    """One status line, rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, total):
        self.total, self.done, self.start, self.last = total, 0, time.time(), 0.0
        self.tty = sys.stderr.isatty()

    def step(self, label):
        self.done += 1
        now = time.time()
        if self.tty or now - self.last > 5 or self.done == self.total:
            self.last = now
            line = f"[{self.done:>4}/{self.total}] {now - self.start:6.1f}s  {label}"
            sys.stderr.write(("\r" + line.ljust(78)) if self.tty else line + "\n")
            sys.stderr.flush()

    def close(self):
        if self.tty:
            sys.stderr.write("\n")


def _draw(rng, cell, index, dtype):
    from ..testing.cases import random_case

    if index % 6 == 5:  # boundary sizes around the SIMD width
        return random_case(rng, cell, T=int(rng.integers(1, 4)), N=int(rng.choice(_BOUNDARY)),
                           H=int(rng.choice(_BOUNDARY)), I=int(rng.integers(1, 9)), dtype=dtype)
    return random_case(rng, cell, dtype=dtype)


def _reference_rows(args, progress):
    from ..testing.cases import CELLS, random_case
    from ..testing.gradcheck import TOLERANCE, directional_check, elementwise_check

    rows = []
    for cell in CELLS:
        rng = np.random.default_rng([args.seed, CELLS.index(cell)])
        worst, failure = 0.0, None
        for i in range(args.examples):
            case = random_case(rng, cell)
            result = directional_check(case, rng=rng)
            progress.step(f"reference {cell}: finite differences, directional")
            if not result.error <= TOLERANCE and failure is None:
                failure = (result, case)
            worst = max(worst, result.error if result.error == result.error else np.inf)
        rows.append(("reference", cell, "gradients vs finite differences (directional)", "float64",
                     args.examples, worst, TOLERANCE, failure))
        worst, failure, tiny = 0.0, None, max(2, args.examples // 8)
        for i in range(tiny):
            case = random_case(rng, cell, max_size=3)
            for result in elementwise_check(case):
                if not result.error <= TOLERANCE and failure is None:
                    failure = (result, case)
                worst = max(worst, result.error)
            progress.step(f"reference {cell}: finite differences, every element")
        rows.append(("reference", cell, "gradients vs finite differences (every element)", "float64",
                     tiny, worst, TOLERANCE, failure))
    return rows


def _backend_rows(name, args, progress):
    from .. import registry
    from ..testing.cases import CELLS
    from ..testing.check import check_case

    backend = registry.get(name)
    rows = []
    for dtype in (d for d in (np.float32, np.float64) if np.dtype(d) in backend.dtypes):
        for cell in CELLS:
            for gradients in (False, True):
                if (cell, "gradients" if gradients else "forward") not in backend.implementations:
                    continue
                kind = "gradients" if gradients else "forward"
                rng = np.random.default_rng([args.seed, CELLS.index(cell), int(gradients), 7])
                worst, failure = 0.0, None
                for i in range(args.examples):
                    case = _draw(rng, cell, i, dtype)
                    ratio, mismatches = check_case(case, name, gradients)
                    progress.step(f"{name} {cell} {kind} {np.dtype(dtype).name}")
                    if mismatches and failure is None:
                        failure = (mismatches[0], case)
                    worst = max(worst, ratio)
                rows.append((name, cell, f"{kind} vs reference", np.dtype(dtype).name,
                             args.examples, worst, 1.0, failure))
    return rows


def _table(rows):
    head = ("backend", "cell", "check", "dtype", "cases", "worst", "limit", "result")
    body = [(b, c, what, dt, str(n), f"{w:.2e}", f"{lim:.0e}" if lim != 1.0 else "1 (ratio)",
             "pass" if f is None else "FAIL") for b, c, what, dt, n, w, lim, f in rows]
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths))  # noqa: E731
    print(line(head))
    print("  ".join("-" * w for w in widths))
    for r in body:
        print(line(r))


def run(args) -> int:
    from .. import registry

    if args.examples < 1:
        print(f"rnngrad verify: --examples: expected a positive integer, got {args.examples}", file=sys.stderr)
        return 2
    if args.backend:
        names = list(dict.fromkeys(args.backend))
        try:
            for name in names:
                registry.get(name)
        except ValueError as exc:
            print(f"rnngrad verify: {exc}", file=sys.stderr)
            return 2
    else:
        names = [n for n, ok, automatic, _ in registry.status() if ok and automatic and n != "reference"]
    names = [n for n in names if n != "reference"]

    per_cell = args.examples + max(2, args.examples // 8)
    total = 0 if args.skip_reference else 3 * per_cell
    for name in names:
        backend = registry.get(name)
        dtypes = [d for d in (np.float32, np.float64) if np.dtype(d) in backend.dtypes]
        total += len(dtypes) * len(backend.implementations) * args.examples
    print(f"rnngrad verify: reference{' (skipped)' if args.skip_reference else ''}"
          f"{', ' + ', '.join(names) if names else ''}; {args.examples} problems per row, seed {args.seed}")
    if "numba" in names:  # first use: compile its kernels in parallel processes
        from ..backends.numba.warmup import compile_kernels
        compile_kernels([d.name for d in registry.get("numba").dtypes])
    progress = _Progress(total)
    rows = []
    start = time.time()
    if not args.skip_reference:
        rows += _reference_rows(args, progress)
    for name in names:
        rows += _backend_rows(name, args, progress)
    progress.close()
    for name, reason in registry.broken_backends():
        rows.append((name, "-", "loads", "-", 0, np.inf, 1.0, (reason, None)))
    print()
    _table(rows)
    failures = [r for r in rows if r[-1] is not None]
    for backend, cell, what, dtype, _, _, _, (detail, case) in failures:
        print(f"\nFAIL {backend} {cell} {what} {dtype}: {detail}")
        if case is not None:
            print("reproduce with (import numpy as np, rnngrad as rg; from rnngrad.testing.cases import Case):")
            print(repr(case))
    print(f"\n{len(rows) - len(failures)} passed, {len(failures)} failed  ({time.time() - start:.1f}s)")
    return 1 if failures else 0
