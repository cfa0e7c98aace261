"""The conformance table: every installed framework's recurrent layers (or ops) × cell × dtype
against rnngrad's float64 reference, with :func:`rnngrad.testing.check_module` (layers) or
:func:`rnngrad.testing.check_backend` (ONNX Runtime's forward ops), at their default settings.

    python -m verification.conformance                       # every framework installed here
    python -m verification.conformance --frameworks flax-nnx equinox --examples 50 --seed 1
    python -m verification.conformance --markdown table.md --failures failures/

Each framework runs in a process of its own (Keras picks its backend at import; a JIT
framework's compiled programs go with the process). A row says passed (problems checked, and
those the framework cannot take), unsupported (not installed, or needs a Mac), or failed, with
the first discrepancy; ``--failures DIR`` keeps each failure's whole message (its reproduction
included). Rows: PyTorch CPU (``torch.nn``), PyTorch ``"mps"`` (a Mac), MLX, Keras 3 on jax,
torch and tensorflow, Flax ``nnx`` and ``linen``, Equinox, ONNX Runtime (nodes built through
``rnngrad.convert.onnx``'s layouts, forward only, float32).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

DTYPES = ("float32", "float64")
#: framework → (what it needs importable, [(row label, cell, factory expression)])
FRAMEWORKS = {
    "pytorch": ("torch", [("torch.nn.RNN", "rnn", "torch.nn.RNN"), ("torch.nn.GRU", "gru", "torch.nn.GRU"),
                          ("torch.nn.LSTM", "lstm", "torch.nn.LSTM")]),
    "pytorch-mps": ("torch", [("torch.nn.RNN/GRU/LSTM on mps", "lstm", None)]),
    "mlx": ("mlx.core", [(f"mlx.nn.{n}", c, f"mlx_adapter({c!r})")
                         for n, c in (("RNN", "rnn"), ("GRU", "gru"), ("LSTM", "lstm"))]),
    "keras-jax": ("keras", None), "keras-torch": ("keras", None), "keras-tensorflow": ("tensorflow", None),
    "flax-nnx": ("flax", [(f"flax.nnx.{n}", c, f"flax_adapter({c!r}, {n!r})") for n, c in (
        ("SimpleCell", "rnn"), ("GRUCell", "gru"), ("LSTMCell", "lstm"), ("OptimizedLSTMCell", "lstm"))]),
    "flax-linen": ("flax", [(f"flax.linen.{n}", c, f"flax_adapter({c!r}, {n!r}, api='linen')") for n, c in (
        ("SimpleCell", "rnn"), ("GRUCell", "gru"), ("LSTMCell", "lstm"), ("OptimizedLSTMCell", "lstm"))]),
    "equinox": ("equinox", [("equinox.nn.GRUCell", "gru", "equinox_adapter('gru')"),
                            ("equinox.nn.LSTMCell", "lstm", "equinox_adapter('lstm')")]),
    "onnxruntime": ("onnxruntime", [(f"ONNX {n}", c, None) for n, c in (
        ("RNN", "single_gate"), ("GRU", "gru"), ("LSTM", "lstm"))]),
}
_KERAS = [("keras SimpleRNN", "rnn", "keras_adapter('rnn')"),
          ("keras GRU reset_after=True", "gru", "keras_adapter('gru', reset_after=True)"),
          ("keras GRU reset_after=False", "gru", "keras_adapter('gru', reset_after=False)"),
          ("keras LSTM", "lstm", "keras_adapter('lstm')"),
          ("keras LSTM unroll=True", "lstm", "keras_adapter('lstm', unroll=True)")]


def _rows(framework):
    rows = FRAMEWORKS[framework][1]
    return _KERAS if rows is None else rows


def _factory(framework, expression):
    """The factory an expression names, with its framework's adapter in scope."""
    scope = {}
    if framework == "pytorch":
        import torch
        scope["torch"] = torch
    elif framework == "mlx":
        from rnngrad.testing.adapters.mlx import mlx_adapter
        scope["mlx_adapter"] = mlx_adapter
    elif framework.startswith("keras"):
        from rnngrad.testing.adapters.keras import keras_adapter
        scope["keras_adapter"] = keras_adapter
    elif framework.startswith("flax"):
        from rnngrad.testing.adapters.flax import flax_adapter
        scope["flax_adapter"] = flax_adapter
    else:
        from rnngrad.testing.adapters.equinox import equinox_adapter
        scope["equinox_adapter"] = equinox_adapter
    return eval(expression, scope)


def _first_discrepancy(exc):
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # Keras's messages carry terminal colours
    lines = [line.strip() for line in text.split("Reproduce with:")[0].splitlines() if line.strip()]
    return " ".join(lines[:2])[:400]


def run_framework(framework, *, examples, seed, dtypes, failures):
    """Yield one result dict a row and dtype: this process checks one framework."""
    from rnngrad.testing import ModuleMismatch, ReferenceMismatch, check_module

    for label, cell, expression in _rows(framework):
        for dtype in dtypes:
            row = dict(framework=framework, layer=label, cell=cell, dtype=dtype)
            start = time.perf_counter()
            try:
                if framework == "pytorch-mps":
                    row.update(status="unsupported", note="needs a Mac (PyTorch's mps device)")
                    yield row
                    break
                if framework == "onnxruntime":
                    if dtype != "float32":
                        row.update(status="unsupported", note="onnxruntime's recurrent kernels are float32")
                        yield row
                        continue
                    from verification.conformance_onnx import check_onnxruntime
                    checked = check_onnxruntime(cell, examples=examples, seed=seed)
                    row.update(status="passed", problems=checked, unsupported=0)
                else:
                    knobs = {} if examples is None else {"max_examples": examples}
                    report = check_module(_factory(framework, expression), cell, dtype=dtype,
                                          seed=seed, **knobs)
                    row.update(status="passed", problems=report.checked,
                               unsupported=sum(report.unsupported.values()))
            except (ModuleMismatch, ReferenceMismatch) as exc:
                row.update(status="failed", problems=exc.examples, note=_first_discrepancy(exc))
                if failures:
                    os.makedirs(failures, exist_ok=True)
                    name = f"{framework}-{label}-{dtype}".replace(" ", "_").replace("/", "_")
                    with open(os.path.join(failures, name + ".txt"), "w") as f:
                        f.write(str(exc))
            row["seconds"] = round(time.perf_counter() - start, 1)
            yield row


def _available(framework):
    module = FRAMEWORKS[framework][0]
    env = dict(os.environ)
    if framework.startswith("keras"):
        env["KERAS_BACKEND"] = framework.split("-")[1]
        if framework != "keras-tensorflow":
            module = framework.split("-")[1]
    code = f"import {module}" + ("\nimport keras" if framework.startswith("keras") else "")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    return done.returncode == 0


def table(rows) -> str:
    out = ["| framework | layer or op | dtype | result | problems | s | first discrepancy |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        problems = r.get("problems")
        problems = "" if problems is None else (f"{problems}" + (f" (+{r['unsupported']} unsupported)"
                                                                  if r.get("unsupported") else ""))
        out.append(f"| {r['framework']} | {r['layer']} | {r['dtype']} | {r['status']} | {problems} "
                   f"| {r.get('seconds', '')} | {r.get('note', '')} |")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m verification.conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", nargs="*", default=list(FRAMEWORKS), choices=list(FRAMEWORKS))
    parser.add_argument("--examples", type=int, default=None,
                        help="max_examples (default: check_module's and check_backend's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES))
    parser.add_argument("--markdown", help="write the table to this file too")
    parser.add_argument("--failures", help="a folder for each failure's whole message")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        for row in run_framework(args.worker, examples=args.examples, seed=args.seed,
                                 dtypes=args.dtypes, failures=args.failures):
            print("ROW " + json.dumps(row), flush=True)
        return 0
    rows = []
    for framework in args.frameworks:
        if not _available(framework):
            rows.append(dict(framework=framework, layer="—", dtype="—", status="unsupported",
                             note=f"{FRAMEWORKS[framework][0]} is not installed"))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
            continue
        env = dict(os.environ)
        if framework.startswith("keras"):
            env["KERAS_BACKEND"] = framework.split("-")[1]
        cmd = [sys.executable, "-m", "verification.conformance", "--worker", framework,
               "--seed", str(args.seed), "--dtypes", *args.dtypes]
        cmd += ["--examples", str(args.examples)] if args.examples is not None else []
        cmd += ["--failures", args.failures] if args.failures else []
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        got = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
        if done.returncode != 0 and len(got) < len(_rows(framework)) * len(args.dtypes):
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            got.append(dict(framework=framework, layer="(the run)", dtype="—", status="failed",
                            note=f"the process ended with {done.returncode}: {tail}"))
        rows += got
        for row in got:
            print(table([row]).splitlines()[-1], file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
