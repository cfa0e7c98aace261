"""The mutation study: does ``rnngrad.testing.check_backend`` catch real bugs?

Every planted fault of :mod:`rnngrad.testing.mutants` (a copy of the reference with one realistic bug)
goes through ``check_backend`` with its default settings, on the forward op of the fault's cell
and then on its gradient op (fed by the faulty forward, as a real backend's would be). A fault is
caught when either check raises. The unmodified reference must pass every op.

Columns: the fault, its bug class, whether it was caught, by which op, how many problems had been
checked when the first failing one appeared (the regression set comes first), the seconds spent
(finding and shrinking), and the same for the random draws alone (``regressions=False``), which
shows the fuzzer finds the bug without being told where to look. ``—`` there: not found in
``--examples`` draws (the NaN classes need ``values="nonfinite"``; the regression set has them).

    python verification/mutations.py                 # all faults, default settings
    python verification/mutations.py --seed 1 --fault flip_z_inverted
"""

from __future__ import annotations

import argparse
import sys
import time

from rnngrad.testing.mutants import FAULT_LIST, FAULTS
from rnngrad.testing.strategies import OPS
from rnngrad.testing import ReferenceMismatch, check_backend


def hunt(fault, *, seed=None, regressions=True, max_examples=100, **knobs):
    """(caught op or None, problems checked until the first failure, seconds, message)."""
    start = time.perf_counter()
    forward_op, gradient_op = fault.ops
    forward = fault.function(forward_op)
    for op, kwargs in ((forward_op, {}), (gradient_op, {"forward": forward})):
        try:
            check_backend(fault.function(op), op, seed=seed, regressions=regressions,
                          max_examples=max_examples, **kwargs, **knobs)
        except ReferenceMismatch as exc:
            return op, exc.examples, time.perf_counter() - start, str(exc)
    return None, None, time.perf_counter() - start, ""


def reference_passes(*, seed=None, max_examples=100):
    """[(op, problems checked, seconds)] for the unmodified reference, or raises."""
    rows = []
    for op in OPS:
        start = time.perf_counter()
        count = check_backend("reference", op, seed=seed, max_examples=max_examples)
        rows.append((op, count, time.perf_counter() - start))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", action="append", choices=sorted(FAULTS), help="only these faults")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws (default: random)")
    parser.add_argument("--examples", type=int, default=100, help="max_examples (default 100, as check_backend)")
    parser.add_argument("--show", action="store_true", help="print the first failure message of each fault")
    args = parser.parse_args(argv)
    faults = [FAULTS[n] for n in args.fault] if args.fault else list(FAULT_LIST)

    print("unmodified reference:", file=sys.stderr)
    for op, count, seconds in reference_passes(seed=args.seed, max_examples=args.examples):
        print(f"  {op:27s} passed {count} problems in {seconds:.2f}s", file=sys.stderr)

    header = (f"| {'fault':34s} | {'class':40s} | caught | {'by':26s} | examples | seconds "
              f"| fuzz only: examples | seconds |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    caught_all, slowest, messages = True, 0.0, []
    for i, fault in enumerate(faults, 1):
        print(f"[{i}/{len(faults)}] {fault.name}", file=sys.stderr)
        op, examples, seconds, message = hunt(fault, seed=args.seed, max_examples=args.examples)
        fop, fexamples, fseconds, _ = hunt(fault, seed=args.seed, regressions=False,
                                           max_examples=args.examples)
        caught_all &= op is not None
        slowest = max(slowest, seconds)
        messages.append((fault.name, message))
        print(f"| {fault.name:34s} | {fault.bug_class:40s} | {'yes' if op else 'NO':6s} | {op or '—':26s} "
              f"| {examples if examples else '—':>8} | {seconds:7.2f} "
              f"| {fexamples if fexamples else '—':>19} | {fseconds:7.2f} |")
    print(f"\n{sum(1 for _, m in messages if m)}/{len(faults)} faults caught with default settings; "
          f"slowest {slowest:.2f}s.")
    if args.show:
        for name, message in messages:
            print(f"\n### {name}\n{message}")
    return 0 if caught_all else 1


if __name__ == "__main__":
    sys.exit(main())
