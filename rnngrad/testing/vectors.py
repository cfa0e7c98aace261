"""Golden test vectors: files that consumers without Python can check an RNN implementation with.

``rnngrad export-vectors DIR`` (or :func:`export_vectors`) writes ``DIR/manifest.json`` and one
``.npz`` per case. A case is one problem of one cell: its forward inputs and upstream gradients,
stored in float32, and the expected results, computed by the reference in float64 from exactly
those float32 inputs (stored as float64). One file serves both the forward op and the gradient op
of its cell. Arrays are named like MPSGraph's arguments:

==========================================  ================================================
``source``, ``recurrentWeight``,            forward inputs (absent ones are left out), in
``inputWeight``, ``bias``, ``initState``,   rnngrad's (MPSGraph's) shapes: source [T,N,I],
``initCell``, ``mask``, ``peephole``,       recurrentWeight [G·H,H] or [2,G·H,H], bias [D·G·H],
``secondaryBias``                           mask [N,D·H] or [T,N,D·H] (per processing step)
``sourceGradient``, ``stateGradient``,      upstream gradients of the gradient op;
``cellGradient``                            cellGradient [N,D·H] (final cell) or [T,N,D·H]
``zState``, ``outputFwd``,                  the reference's training forward, rounded to float32,
``cellOutputFwd``                           for implementations that share rnngrad's z_state layout
``expected.state``, ``expected.cell``,      the forward op's results with the case's descriptor
``expected.zState``                         (cell with training or produce_cell; zState with
                                            training)
``expected.gradient.<name>``                the gradient op's results: source, recurrentWeight,
                                            inputWeight, bias ([1,1,D·G·H]), peephole, initState,
                                            initCell, secondaryBias (those whose input is given)
==========================================  ================================================

The manifest (``format`` "rnngrad-golden-vectors", ``version`` 1) lists for each case: its
name, file and sha256, cell and ops, the full descriptor (activations by MPSGraph enum name and
value), sizes, dtype, seed, the regression class it covers, and every array with its shape. It
also holds the tolerance table and how to apply it. Files are written deterministically (same
suite and seed, same bytes) and read with ``allow_pickle=False``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import zipfile
from typing import Optional

import numpy as np

from .. import __version__
from ..api import _GRADIENT_ORDER
from ..descriptors import DESCRIPTORS, Activation
from ..results import ForwardResult, GradientResult
from .cases import CELLS, Case, op_name, random_case
from .check import ReferenceMismatch, _named, _public, _training_outputs, reproduction
from .compare import KINDS, TOLERANCES, compare_results
from .strategies import REGRESSIONS, _poison, _saturate, regression_case

FORMAT = "rnngrad-golden-vectors"
VERSION = 1
SUITES = ("core", "full")

#: rnngrad argument name -> MPSGraph argument name
CAMEL = {
    "source": "source", "recurrent_weight": "recurrentWeight", "input_weight": "inputWeight",
    "bias": "bias", "init_state": "initState", "init_cell": "initCell", "mask": "mask",
    "peephole": "peephole", "secondary_bias": "secondaryBias", "source_gradient": "sourceGradient",
    "z_state": "zState", "output_fwd": "outputFwd", "cell_output_fwd": "cellOutputFwd",
    "state_gradient": "stateGradient", "cell_gradient": "cellGradient",
    # result entries
    "state": "state", "cell": "cell",
}
SNAKE = {v: k for k, v in CAMEL.items()}
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


# -- the suites ---------------------------------------------------------------------------------

def _option_cases(cell, count, rng_seed, sizes):
    """``count`` (≥ 5) problems whose descriptors between them take every value of every option:
    activation field j gets value (k + j) mod 5 in problem k; boolean b is on in problem k when
    bit (b mod 3) of k+1 is set, inverted for b ≥ 3; training alternates."""
    cls = DESCRIPTORS[cell]
    fields = [f for f in dataclasses.fields(cls)]
    acts = list(Activation)
    out = []
    for k in range(count):
        options, b, j = {}, 0, 0
        for f in fields:
            if isinstance(f.default, Activation):
                options[f.name] = acts[(k + j) % len(acts)]
                j += 1
            elif f.name == "training":
                options[f.name] = bool(k % 2)
            else:  # on in some problems and off in others, for every boolean
                options[f.name] = bool(((k + 1) >> (b % 3)) & 1) != (b >= 3)
                b += 1
        desc = cls(**options)
        rng = np.random.default_rng([rng_seed, CELLS.index(cell), 100 + k])
        optional = {"mask": bool(k % 2), "mask_per_step": k % 4 == 1, "cell_gradient": True}
        case = random_case(rng, cell, descriptor=desc, optional=optional,
                           cell_gradient_form="per_step" if k % 2 else "final", **sizes)
        out.append((f"options_{k}", case, "descriptor options"))
    return out


def suite_cases(suite="core", *, seed=0, dtype=np.float32) -> list:
    """[(name, Case, class)] of a suite; every case in ``dtype``.

    core: the regression set for every cell it applies to, and five problems per cell whose
    descriptors take every value of every option. full: core, plus ten option problems per cell,
    the boundary sizes (N, H ∈ {31, 32, 33}), saturating values and NaN/Inf in one batch row.
    """
    if suite not in SUITES:
        raise ValueError(f"suite: expected one of {SUITES}, got {suite!r}")
    cases = []
    for cell in CELLS:
        for r in REGRESSIONS:
            if cell in r.cells:
                cases.append((f"{cell}.{r.name}", regression_case(r, cell, dtype=np.float64, seed=seed), r.name))
        count = 5 if suite == "core" else 15
        for name, case, cls in _option_cases(cell, count, seed, dict(T=3, N=2, I=3, H=2)):
            cases.append((f"{cell}.{name}", case, cls))
        if suite == "full":
            rng = np.random.default_rng([seed, CELLS.index(cell), 7])
            for H, N in ((31, 2), (32, 3), (33, 1), (2, 33)):
                cases.append((f"{cell}.boundary_H{H}_N{N}", random_case(rng, cell, T=2, N=N, I=3, H=H), "boundary sizes"))
            for k in range(3):
                cases.append((f"{cell}.saturating_{k}", _saturate(random_case(rng, cell, T=3, N=2, I=2, H=3, scale=1.0)),
                              "saturating values"))
            for k, value in enumerate((np.nan, np.inf, -np.inf)):
                base = random_case(rng, cell, T=3, N=3, I=2, H=2)
                cases.append((f"{cell}.nonfinite_{k}", _poison(base, rng, value, row=k), "NaN/Inf in one batch row"))
    return [(name, case.astype(dtype), cls) for name, case, cls in cases]


# -- writing ------------------------------------------------------------------------------------

def _descriptor_json(desc) -> dict:
    out = {}
    for f in dataclasses.fields(desc):
        value = getattr(desc, f.name)
        out[f.name] = {"name": value.name.lower(), "value": int(value)} if isinstance(value, Activation) else value
    return out


def _descriptor_from_json(cell, fields) -> object:
    values = {k: (v["value"] if isinstance(v, dict) else v) for k, v in fields.items()}
    return DESCRIPTORS[cell](**values)


def _write_npz(path, arrays: dict) -> bytes:
    """An .npz (a zip of .npy files) with fixed timestamps, so the bytes depend on the data only."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, member.getvalue())
    data = buffer.getvalue()
    with open(path, "wb") as handle:
        handle.write(data)
    return data


def _case_arrays(case: Case) -> dict:
    """The stored arrays of a case: inputs in the case's dtype, expected results in float64."""
    exact = case.astype(np.float64)  # the float32 values, exactly
    arrays = {CAMEL[k]: v for k, v in case.inputs.items()}
    arrays["sourceGradient"] = case.source_gradient
    if case.state_gradient is not None:
        arrays["stateGradient"] = case.state_gradient
    if case.cell_gradient is not None:
        arrays["cellGradient"] = case.cell_gradient
    h, c, z = exact.training_forward(backend="reference")
    arrays["zState"] = np.asarray(z, case.dtype)
    if case.cell == "gru":
        arrays["outputFwd"] = np.asarray(h, case.dtype)
    if case.cell == "lstm":
        arrays["cellOutputFwd"] = np.asarray(c, case.dtype)
    forward = exact.forward(backend="reference")
    for name, value in forward.as_dict().items():
        arrays[f"expected.{CAMEL[name]}"] = np.asarray(value, np.float64)
    gradients = exact.gradients(backend="reference")
    for name, value in gradients.as_dict().items():
        arrays[f"expected.gradient.{CAMEL[name]}"] = np.asarray(value, np.float64)
    return arrays


def _tolerance_json() -> dict:
    table = {}
    for (dtype, kind), (atol, rtol) in TOLERANCES.items():
        table.setdefault(dtype, {})[kind] = {"atol": atol, "rtol": rtol}
    return {
        "table": table,
        "kinds": {CAMEL.get(k, k): v for k, v in KINDS.items()},
        "rule": {
            "output": "|got - want| <= atol + rtol * |want|, element-wise (state, cell, zState)",
            "state": "|got - want| <= atol + rtol * |want|, element-wise (gradients of source, "
                     "initState, initCell)",
            "parameter": "|got - want| <= atol + rtol * max|want| over the array (gradients of "
                         "recurrentWeight, inputWeight, bias, peephole, secondaryBias)",
            "nonfinite": "NaN where want is NaN and only there; infinities equal",
        },
        "use": "the row of the dtype of the stored inputs",
    }


def export_vectors(directory, suite="core", *, seed=0, dtype=np.float32, progress=None) -> dict:
    """Write a suite's vectors and manifest into ``directory`` (created if needed); return the
    manifest. ``progress(i, total, name)`` is called after each case."""
    dtype = np.dtype(dtype)
    os.makedirs(directory, exist_ok=True)
    cases = suite_cases(suite, seed=seed, dtype=dtype)
    entries = []
    for i, (name, case, cls) in enumerate(cases, 1):
        arrays = _case_arrays(case)
        filename = f"{name}.npz"
        data = _write_npz(os.path.join(directory, filename), arrays)
        D = case.D
        entries.append({
            "name": name,
            "file": filename,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "cell": case.cell,
            "op": op_name(case.cell, True),
            "ops": [op_name(case.cell, False), op_name(case.cell, True)],
            "class": cls,
            "descriptor": _descriptor_json(case.descriptor),
            "shapes": {"T": case.T, "N": int(case.inputs["source"].shape[1]), "H": case.H, "D": D,
                       "I": int(case.inputs["source"].shape[2]) if "input_weight" in case.inputs else None},
            "dtype": dtype.name,
            "seed": seed,
            "arrays": {k: {"shape": list(v.shape), "dtype": np.asarray(v).dtype.name} for k, v in sorted(arrays.items())},
        })
        if progress is not None:
            progress(i, len(cases), name)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "generator": f"rnngrad {__version__}",
        "suite": suite,
        "seed": seed,
        "dtype": dtype.name,
        "naming": {
            "inputs": "MPSGraph argument names: " + ", ".join(CAMEL[k] for k in CAMEL if k not in ("state", "cell")),
            "expected.<name>": "forward results (state, cell, zState) with the case's descriptor, float64",
            "expected.gradient.<name>": "gradient results, float64; bias is [1,1,D*G*H]",
            "zState/outputFwd/cellOutputFwd": "rnngrad's training forward rounded to the input dtype; "
                                              "feed your own forward's outputs if your z_state layout differs",
            "activations": {a.name.lower(): int(a) for a in Activation},
        },
        "tolerances": _tolerance_json(),
        "cases": entries,
    }
    with open(os.path.join(directory, "manifest.json"), "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=False)
        handle.write("\n")
    return manifest


# -- reading and checking -----------------------------------------------------------------------

@dataclasses.dataclass
class GoldenVector:
    """One case read back: ``case`` (a :class:`rnngrad.testing.cases.Case`), the stored training forward
    (``z_state``, ``output_fwd``, ``cell_output_fwd``) and the expected results by rnngrad name
    (``expected_forward``, ``expected_gradients``, float64, in MPSGraph's order)."""

    name: str
    file: str
    cell: str
    ops: tuple
    bug_class: str
    case: Case
    z_state: np.ndarray
    output_fwd: Optional[np.ndarray]
    cell_output_fwd: Optional[np.ndarray]
    expected_forward: dict
    expected_gradients: dict


def load_vectors(directory, *, verify_hashes=True) -> list:
    """[GoldenVector] from ``directory``/manifest.json; checks the format, the version and the
    sha256 of every file. Never unpickles."""
    path = os.path.join(directory, "manifest.json")
    with open(path) as handle:
        manifest = json.load(handle)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: expected format {FORMAT!r}, got {manifest.get('format')!r}")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path}: expected version {VERSION}, got {manifest.get('version')!r}")
    vectors = []
    for entry in manifest["cases"]:
        file = os.path.join(directory, entry["file"])
        with open(file, "rb") as handle:
            data = handle.read()
        if verify_hashes:
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"]:
                raise ValueError(f"{file}: expected sha256 {entry['sha256']} (manifest), got {digest}")
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        cell = entry["cell"]
        descriptor = _descriptor_from_json(cell, entry["descriptor"])
        names = {"source", "recurrentWeight", "inputWeight", "bias", "initState", "initCell", "mask",
                 "peephole", "secondaryBias"}
        inputs = {SNAKE[k]: v for k, v in arrays.items() if k in names}
        inputs = {k: inputs[k] for k in ("source", "recurrent_weight", "input_weight", "bias", "init_state",
                                          "init_cell", "mask", "peephole", "secondary_bias") if k in inputs}
        case = Case(cell, descriptor, inputs, source_gradient=arrays["sourceGradient"],
                    state_gradient=arrays.get("stateGradient"), cell_gradient=arrays.get("cellGradient"))
        forward_names = [n for n in ("state", "cell", "zState") if f"expected.{n}" in arrays]
        gradient_names = [n for n in _GRADIENT_ORDER[cell] if f"expected.gradient.{CAMEL[n]}" in arrays]
        vectors.append(GoldenVector(
            name=entry["name"], file=file, cell=cell, ops=tuple(entry["ops"]), bug_class=entry.get("class", ""),
            case=case, z_state=arrays["zState"], output_fwd=arrays.get("outputFwd"),
            cell_output_fwd=arrays.get("cellOutputFwd"),
            expected_forward={SNAKE[n]: arrays[f"expected.{n}"] for n in forward_names},
            expected_gradients={n: arrays[f"expected.gradient.{CAMEL[n]}"] for n in gradient_names},
        ))
    return vectors


def _resolve(candidate, op):
    """The callable for ``op`` from a backend name, a {op: callable} mapping, or None."""
    if isinstance(candidate, str):
        return _public(op, candidate)
    if isinstance(candidate, dict):
        return candidate.get(op)
    return None


def check_vectors(candidate, vectors, *, op=None, forward=None) -> int:
    """Check a candidate against golden vectors; return the number of (vector, op) checks, or
    raise :class:`rnngrad.testing.ReferenceMismatch` at the first mismatch.

    candidate: a backend name (every op), a mapping {op name: callable}, or one callable with
        ``op`` naming it.
    vectors: a directory written by :func:`export_vectors`, or the list :func:`load_vectors` gives.
    forward: for gradient ops, what makes z_state (and output_fwd / cell_output_fwd): a backend
        name or a callable with the forward op's signature. Default: the candidate's own backend
        when it is a name, else the stored zState / outputFwd / cellOutputFwd.
    """
    if isinstance(vectors, (str, os.PathLike)):
        vectors = load_vectors(vectors)
    if callable(candidate) and not isinstance(candidate, str):
        if op is None:
            raise ValueError("op: a single callable candidate needs op=, the rnngrad name of what it computes")
        candidate = {op: candidate}
    checked = 0
    for vector in vectors:
        for vop in vector.ops:
            fn = _resolve(candidate, vop)
            if fn is None or (op is not None and vop != op):
                continue
            case, gradients = vector.case, vop.endswith("_gradients")
            try:
                if not gradients:
                    got = fn(**case.inputs, descriptor=case.descriptor)
                    want = ForwardResult(list(vector.expected_forward.items()))
                else:
                    source = forward if forward is not None else (candidate if isinstance(candidate, str) else None)
                    if source is None:
                        h, c, z = vector.output_fwd, vector.cell_output_fwd, vector.z_state
                    else:
                        fwd = _public(vop[:-len("_gradients")], source) if isinstance(source, str) else source
                        h, c, z = _training_outputs(case, fwd)
                    got = fn(**case.gradient_kwargs(h, c, z))
                    want = GradientResult(list(vector.expected_gradients.items()))
            except Exception as exc:
                raise ReferenceMismatch(f"{vop} on golden vector {vector.name!r} ({vector.file}) raised "
                                        f"{type(exc).__name__}: {exc}", op=vop, case=case,
                                        label=vector.name) from exc
            named = _named(got, want, vop)
            if named is None:
                mismatches = ["entries: got a different number of results than " + str(want.names)]
            else:
                _, mismatches = compare_results(named, want, case.dtype)
            checked += 1
            if mismatches:
                lines = [f"{vop} differs from golden vector {vector.name!r} ({vector.file}, class "
                         f"{vector.bug_class!r}):"] + [f"  {m}" for m in mismatches]
                lines.append(f"Reproduce with:\n{reproduction(case, vop, candidate if isinstance(candidate, str) else fn)}")
                raise ReferenceMismatch("\n".join(lines), op=vop, case=case, label=vector.name,
                                        mismatches=[m for m in mismatches if not isinstance(m, str)])
    return checked


__all__ = ["FORMAT", "VERSION", "SUITES", "CAMEL", "GoldenVector", "suite_cases", "export_vectors",
           "load_vectors", "check_vectors"]
