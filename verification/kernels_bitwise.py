"""Every Metal entry point's results on the CPU harness, hashed: a change that only restructures
``kernels/`` must leave each of them bitwise the same.

    python verification/kernels_bitwise.py --out after.json       # in this checkout
    /path/to/other/venv/bin/python verification/kernels_bitwise.py --out before.json
    python verification/kernels_bitwise.py --compare before.json after.json

It runs whichever rnngrad the interpreter imports (each checkout in an environment of its own,
``pip install -e <checkout>``; the host's test context and the version rules' settings are
found where either layout keeps them), on ``metal-emulated``: fixed seeded problems of every cell with
every option that changes a kernel's code path (each descriptor option and activation,
bidirectional, reverse, every optional input, a per-step mask, the LSTM's peephole and per-step
cell gradient, the GRU's reset_after), under each forced version (``RNNGRAD_METAL_RECURRENCE``
packed, rows, v2 at every H that picks a v2 entry, v3 at three tilings; ``RNNGRAD_METAL_GEMM``
v1, v3, v4, v5), some split into one dispatch a step (``RNNGRAD_METAL_DISPATCH_BUDGET``). Each
run saves the hash of its inputs, of its outputs' bytes (forward, training forward, gradients)
and the entry points its device trace shows; each entry point gets the hash of the outputs of
every run it took part in. ``--compare`` checks that both files cover every entry point of
``rnngrad.backends.metal.versions.entry_points()`` and agree on every hash; exit status 1
otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import sys
import zlib

import numpy as np

CELLS = ("single_gate", "gru", "lstm")
ALL = dict(input_weight=True, bias=True, init_state=True, init_cell=True, mask=True,
           mask_per_step=False, peephole=True, secondary_bias=True, state_gradient=True,
           cell_gradient=True)
NONE = {name: False for name in ALL}
PER_STEP_MASK = dict(ALL, mask_per_step=True)
#: no input weight: the recurrences add the bias to x' themselves (with one, the projection does)
NO_PROJECTION = dict(ALL, input_weight=False)
#: (N, H, versions.V3_MIN_TILES, threads a threadgroup at most) of v3's runs: the widest unit
#: blocks (workers in two rounds over 32 threads), two row tiles a direction with k in slices,
#: the narrowest blocks
V3_TILINGS = ((13, 70, 1, 32), (17, 20, 1, 1024), (5, 9, 128, 64))
#: the H that, together, make the rule pick every v2 entry point
V2_H = (64, 65, 68, 94, 128, 129, 256)


@dataclasses.dataclass(frozen=True)
class Run:
    """One problem, forward and gradients, under fixed settings."""
    name: str
    cell: str
    options: dict           # descriptor options
    sizes: dict             # T, N, I, H
    optional: dict          # optional inputs (rnngrad.testing.cases.random_case)
    env: dict               # RNNGRAD_METAL_* variables
    device: dict = dataclasses.field(default_factory=dict)  # harness Device options
    knobs: dict = dataclasses.field(default_factory=dict)   # version rules' settings
    cell_gradient_form: str = "per_step"


def _variants(cell: str) -> list:
    """Descriptor options: each boolean option on alone, each activation field at each value,
    then bidirectional, reverse and training together."""
    from rnngrad.descriptors import DESCRIPTORS, Activation

    base = DESCRIPTORS[cell]()
    out = []
    for field in dataclasses.fields(base):
        if isinstance(getattr(base, field.name), Activation):
            out += [{field.name: a} for a in Activation]
        else:
            out.append({field.name: True})
    return out + [dict(bidirectional=True, reverse=True, training=True)]


def runs() -> list:
    """Every run, in a fixed order."""
    out = []
    optionals = (ALL, NONE, PER_STEP_MASK, NO_PROJECTION)
    for grid in ("packed", "rows"):
        for cell in CELLS:
            for i, options in enumerate(_variants(cell)):
                options = dict(options)
                options.setdefault("bidirectional", i % 2 == 1)
                budget = {"RNNGRAD_METAL_DISPATCH_BUDGET": "1"} if i % 5 == 4 else {}
                out.append(Run(f"{grid}/{cell}/{i}", cell, options,
                               dict(T=3, N=3, I=3, H=5), optionals[i % 4],
                               dict(RNNGRAD_METAL_RECURRENCE=grid, **budget),
                               cell_gradient_form="per_step" if i % 2 else "final"))
    for cell in CELLS:
        fixed = dict(reset_after=True) if cell == "gru" else {}
        for H in V2_H:
            for peephole in ((False, True) if cell == "lstm" else (False,)):
                optional = dict(ALL, peephole=peephole)
                out.append(Run(f"v2/{cell}/H{H}/peephole{int(peephole)}/bidirectional", cell,
                               dict(fixed, bidirectional=True, training=True),
                               dict(T=3, N=1, I=3, H=H), optional,
                               dict(RNNGRAD_METAL_RECURRENCE="v2")))
                out.append(Run(f"v2/{cell}/H{H}/peephole{int(peephole)}/reverse-split", cell,
                               dict(fixed, reverse=True),
                               dict(T=3, N=2, I=3, H=H),
                               dict(optional, mask_per_step=True, input_weight=False),
                               dict(RNNGRAD_METAL_RECURRENCE="v2",
                                    RNNGRAD_METAL_DISPATCH_BUDGET="1"),
                               cell_gradient_form="final"))
    for N, H, min_tiles, threads in V3_TILINGS:
        for cell in CELLS:
            resets = (True, False) if cell == "gru" else (None,)
            for k, (reset_after, optional) in enumerate(
                    itertools.product(resets, (ALL, NO_PROJECTION))):
                fixed = {} if reset_after is None else dict(reset_after=reset_after)
                out.append(Run(f"v3/{cell}/N{N}H{H}/{k}", cell,
                               dict(fixed, bidirectional=True, training=True),
                               dict(T=3, N=N, I=3, H=H), optional,
                               dict(RNNGRAD_METAL_RECURRENCE="v3"),
                               device=dict(max_threads_per_threadgroup=threads),
                               knobs=dict(v3_min_tiles=min_tiles)))
    for gemm in ("v1", "v3", "v4", "v5", "auto"):
        for cell in CELLS:
            # K = T·N = 1024 in the weight gradients: v5 splits it
            out.append(Run(f"gemm-{gemm}/{cell}", cell, dict(bidirectional=True),
                           dict(T=64, N=16, I=9, H=5), dict(ALL, bias=cell != "gru"),
                           dict(RNNGRAD_METAL_RECURRENCE="packed", RNNGRAD_METAL_GEMM=gemm)))
    return out


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none\0")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def _knobs(knobs: dict):
    """The version rules' settings inside the block: versions.overrides where the rules have
    it, else the module's upper-case settings."""
    from rnngrad.backends.metal import versions

    if hasattr(versions, "overrides"):
        with versions.overrides(**knobs):
            yield
        return
    saved = {name: getattr(versions, name.upper()) for name in knobs}
    for name, value in knobs.items():
        setattr(versions, name.upper(), value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(versions, name.upper(), value)


@contextlib.contextmanager
def _settings(run: Run):
    names = ("RNNGRAD_METAL_RECURRENCE", "RNNGRAD_METAL_GEMM", "RNNGRAD_METAL_DISPATCH_BUDGET")
    saved = {name: os.environ.get(name) for name in names}
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(run.env)
    try:
        with _knobs(run.knobs):
            yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def _emulated_device(**options):
    try:
        from rnngrad.backends.metal.harness.contexts import emulated_device
    except ImportError:  # before the host's test contexts had a module of their own
        from rnngrad.backends.metal.host import emulated_device
    return emulated_device(**options)


def execute(run: Run) -> dict:
    """{inputs, outputs: hashes; kernels: the entry points the trace shows}."""
    from rnngrad import api
    from rnngrad.descriptors import DESCRIPTORS
    from rnngrad.testing.cases import FORWARD_OPS, random_case

    seed = zlib.crc32(run.name.encode())
    case = random_case(seed, run.cell, descriptor=DESCRIPTORS[run.cell](**run.options),
                       dtype=np.float32, optional=run.optional,
                       cell_gradient_form=run.cell_gradient_form, **run.sizes)
    inputs = [case.inputs[k] for k in sorted(case.inputs)] + [
        case.source_gradient, case.state_gradient, case.cell_gradient]
    backend = "metal-emulated"
    with _settings(run), _emulated_device(**run.device) as dev:
        forward = list(case.forward(backend))
        h, c, z = case.training_forward(backend)
        grad_op = getattr(api, FORWARD_OPS[run.cell] + "_gradients")
        grads = list(grad_op(**case.gradient_kwargs(h, c, z), backend=backend))
        kernels = sorted({d.kernel for d in dev.trace})
    return dict(inputs=_digest(inputs), outputs=_digest(forward + [h, c, z] + grads),
                kernels=kernels)


def collect(selected=None) -> dict:
    table = {}
    for i, run in enumerate(runs()):
        if selected and not any(s in run.name for s in selected):
            continue
        table[run.name] = execute(run)
        print(f"[{i + 1}] {run.name}: {table[run.name]['outputs'][:16]}", file=sys.stderr)
    by_kernel = {}
    for name, row in table.items():
        for kernel in row["kernels"]:
            by_kernel.setdefault(kernel, []).append(row["outputs"])
    entry = {k: hashlib.sha256("".join(v).encode()).hexdigest() for k, v in sorted(by_kernel.items())}
    return dict(runs=table, entry_points=entry)


def compare(before: dict, after: dict) -> int:
    from rnngrad.backends.metal import versions

    problems = []
    for name in sorted(set(before["runs"]) | set(after["runs"])):
        a, b = before["runs"].get(name), after["runs"].get(name)
        if a is None or b is None:
            problems.append(f"run {name}: only in {'after' if a is None else 'before'}")
        elif a["inputs"] != b["inputs"]:
            problems.append(f"run {name}: the inputs differ (not the same problem)")
        elif a["outputs"] != b["outputs"]:
            problems.append(f"run {name}: outputs differ ({', '.join(b['kernels'])})")
        elif a["kernels"] != b["kernels"]:
            problems.append(f"run {name}: entry points {a['kernels']} before, {b['kernels']} after")
    points = versions.entry_points()
    covered = [k for k in points if k in before["entry_points"] and k in after["entry_points"]]
    equal = [k for k in covered if before["entry_points"][k] == after["entry_points"][k]]
    for k in points:
        if k not in covered:
            problems.append(f"entry point {k}: ran in no run")
        elif k not in equal:
            problems.append(f"entry point {k}: results differ")
    same = sum(1 for n in before["runs"] if n in after["runs"]
               and before["runs"][n]["outputs"] == after["runs"][n]["outputs"])
    print(f"runs: {same}/{len(before['runs'])} bitwise equal; entry points covered "
          f"{len(covered)}/{len(points)}, bitwise equal {len(equal)}/{len(covered)}")
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the hashes here (JSON)")
    parser.add_argument("--only", nargs="+", help="only the runs whose name contains one of these")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two files the script wrote")
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as a, open(args.compare[1]) as b:
            return compare(json.load(a), json.load(b))
    if not args.out:
        parser.error("expected --out FILE or --compare BEFORE AFTER")
    table = collect(args.only)
    with open(args.out, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    print(f"{len(table['runs'])} runs, {len(table['entry_points'])} entry points -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
