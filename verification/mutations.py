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
    python verification/mutations.py --layers-only   # only the layer faults (needs torch)

The second table does the same for whole layers: every planted fault of
``rnngrad.testing.mutants.LAYER_FAULTS`` (a torch.nn-style layer composed from one op call per
layer, with one fault in its glue) goes through ``rnngrad.testing.check_module`` with its default
settings, for each cell; the unmodified layer and ``torch.nn``'s own layers must pass. Columns:
the fault, the cell, the configuration that caught it (the fixed scenario's name, or the drawn
problem, shrunk), how many problems had been checked when the first failing one appeared, the
seconds, and the same for the random draws alone (``scenarios_first=False``).
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


def hunt_layer(fault, cell, *, seed=None, scenarios_first=True, max_examples=None):
    """(configuration that caught it or None, problems checked, seconds, message)."""
    from rnngrad.testing.module import ModuleMismatch, check_module

    knobs = {} if max_examples is None else {"max_examples": max_examples}
    start = time.perf_counter()
    try:
        check_module(fault.factory(cell), cell, seed=seed, scenarios_first=scenarios_first, **knobs)
    except ModuleMismatch as exc:
        first = str(exc).splitlines()[0]
        where = first.split("[scenario ", 1)[1].split("]", 1)[0].strip("'") if "[scenario " in first else None
        p = exc.problem
        drawn = (f"L={p.num_layers} D={p.D} T={p.T} N={p.N} {p.form} states={p.states} "
                 f"loss={p.loss} {p.mode}" + (" batch_first" if p.batch_first else "")
                 + ("" if p.bias else " no bias") + (f" dropout={p.dropout}" if p.dropout else ""))
        return where or drawn, exc.examples, time.perf_counter() - start, str(exc)
    return None, None, time.perf_counter() - start, ""


def layer_table(*, seed=None, max_examples=None, show=False) -> bool:
    """Print the layer mutation table; True when every layer fault was caught."""
    import torch

    from rnngrad.testing.module import check_module
    from rnngrad.testing.mutants import LAYER_FAULT_LIST, layer_factory

    knobs = {} if max_examples is None else {"max_examples": max_examples}
    print("unmodified layers:", file=sys.stderr)
    for cell, layer in (("rnn", torch.nn.RNN), ("gru", torch.nn.GRU), ("lstm", torch.nn.LSTM)):
        for name, factory in (("composed", layer_factory(cell)), ("torch.nn", layer)):
            print(f"  {name:9s} {check_module(factory, cell, seed=seed, **knobs)}", file=sys.stderr)
    header = (f"| {'layer fault':33s} | cell | caught by {'':30s} | examples | seconds "
              f"| fuzz only: caught by {'':46s} | examples | seconds |")
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    caught_all, messages = True, []
    for fault in LAYER_FAULT_LIST:
        for cell in ("rnn", "gru", "lstm"):
            print(f"{fault.name} ({cell})", file=sys.stderr)
            where, examples, seconds, message = hunt_layer(fault, cell, seed=seed, max_examples=max_examples)
            fwhere, fexamples, fseconds, _ = hunt_layer(fault, cell, seed=seed, scenarios_first=False,
                                                        max_examples=max_examples)
            caught_all &= where is not None
            messages.append((f"{fault.name} ({cell})", message))
            print(f"| {fault.name:33s} | {cell:4s} | {where or 'NOT CAUGHT':40s} | {examples or '—':>8} "
                  f"| {seconds:7.2f} | {fwhere or '—':67s} | {fexamples or '—':>8} | {fseconds:7.2f} |",
                  flush=True)
    print(f"\n{sum(1 for _, m in messages if m)}/{len(messages)} layer faults caught with default settings.")
    if show:
        for name, message in messages:
            print(f"\n### {name}\n{message}")
    return caught_all


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault", action="append", choices=sorted(FAULTS), help="only these faults")
    parser.add_argument("--seed", type=int, default=None, help="seed of the draws (default: random)")
    parser.add_argument("--examples", type=int, default=100, help="max_examples (default 100, as check_backend)")
    parser.add_argument("--show", action="store_true", help="print the first failure message of each fault")
    parser.add_argument("--layers-only", action="store_true", help="only the layer faults (check_module)")
    parser.add_argument("--no-layers", action="store_true", help="only the op faults (check_backend)")
    args = parser.parse_args(argv)
    if args.layers_only:
        return 0 if layer_table(seed=args.seed, show=args.show) else 1
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
    if not args.no_layers and not args.fault:
        print()
        caught_all &= layer_table(seed=args.seed, show=args.show)
    return 0 if caught_all else 1


if __name__ == "__main__":
    sys.exit(main())
