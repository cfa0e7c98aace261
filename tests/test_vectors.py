"""Golden vectors: written, reloaded, checked; deterministic; tamper-evident; complete."""

import dataclasses
import hashlib
import json
import os

import numpy as np
import pytest

import rnngrad as rg
from rnngrad.cli import main
from rnngrad.descriptors import DESCRIPTORS, Activation
from rnngrad.testing.gradcheck import TOLERANCE, directional_check
from rnngrad.testing.mutants import FAULTS
from rnngrad.testing.strategies import REGRESSIONS
from rnngrad.testing import ReferenceMismatch, check_vectors, load_vectors
from rnngrad.testing.vectors import CAMEL

ALLOWED = set(CAMEL.values()) | {"zState", "outputFwd", "cellOutputFwd"}


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    directory = tmp_path_factory.mktemp("core")
    assert main(["export-vectors", str(directory)]) == 0
    return directory


def test_manifest_describes_every_file(core):
    manifest = json.loads((core / "manifest.json").read_text())
    assert manifest["format"] == "rnngrad-golden-vectors" and manifest["version"] == 1
    assert manifest["tolerances"]["table"]["float32"]["parameter"]["rtol"] > 0
    for entry in manifest["cases"]:
        data = (core / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        with np.load(core / entry["file"], allow_pickle=False) as npz:
            for name in npz.files:
                base = name.split(".")[-1]
                assert base in ALLOWED, name
                assert list(npz[name].shape) == entry["arrays"][name]["shape"]
                expected = name.startswith("expected.")
                assert npz[name].dtype == (np.float64 if expected else np.float32), name
        assert entry["op"] == entry["ops"][1] and entry["op"].endswith("_gradients")
    total = sum(e["bytes"] for e in manifest["cases"])
    assert total < 400 * 1024  # small enough to vendor


def test_reload_and_check_the_reference_and_the_public_functions(core):
    vectors = load_vectors(core)
    assert check_vectors("reference", vectors) == 2 * len(vectors)
    public = {op: getattr(rg, op) for op in ("single_gate_rnn", "single_gate_rnn_gradients", "gru",
                                             "gru_gradients", "lstm", "lstm_gradients")}
    assert check_vectors(public, core) == 2 * len(vectors)
    assert check_vectors(rg.gru, vectors, op="gru") == sum(v.cell == "gru" for v in vectors)


def test_expected_gradients_agree_with_finite_differences(core):
    for vector in load_vectors(core)[::4]:
        case = vector.case.astype(np.float64)
        if case.T == 0 or case.inputs["source"].shape[1] == 0 or not np.all(np.isfinite(case.inputs["source"])):
            continue
        assert directional_check(case, rng=3).error < TOLERANCE, vector.name
        got = case.gradients(backend="reference").as_dict()
        for name, want in vector.expected_gradients.items():
            np.testing.assert_array_equal(got[name], want)


def test_faults_are_caught_by_the_vectors(core):
    vectors = load_vectors(core)
    for name in ("batch_first_backward", "flip_z_inverted", "mask_forward_only", "lstm_gate_order",
                 "empty_sequence_zero_gradients", "relu_drops_nan"):
        fault = FAULTS[name]
        with pytest.raises(ReferenceMismatch, match="golden vector"):
            check_vectors({op: fault.function(op) for op in fault.ops}, vectors)


def test_core_suite_covers_every_regression_and_every_option_value(core):
    manifest = json.loads((core / "manifest.json").read_text())
    classes = {e["class"] for e in manifest["cases"]}
    assert {r.name for r in REGRESSIONS} <= classes
    for cell, cls in DESCRIPTORS.items():
        seen = {}
        for entry in (e for e in manifest["cases"] if e["cell"] == cell):
            for field, value in entry["descriptor"].items():
                seen.setdefault(field, set()).add(value["value"] if isinstance(value, dict) else value)
        for f in dataclasses.fields(cls):
            values = {int(a) for a in Activation} if isinstance(f.default, Activation) else {False, True}
            assert seen[f.name] == values, (cell, f.name)
    cell_gradient_shapes = {len(e["arrays"]["cellGradient"]["shape"]) for e in manifest["cases"]
                            if "cellGradient" in e["arrays"]}
    assert cell_gradient_shapes == {2, 3}


def test_export_is_deterministic_and_tampering_is_detected(core, tmp_path):
    again = tmp_path / "again"
    assert main(["export-vectors", str(again)]) == 0
    assert (again / "manifest.json").read_bytes() == (core / "manifest.json").read_bytes()
    assert main(["export-vectors", str(again)]) == 2  # refuses a non-empty directory
    first = json.loads((again / "manifest.json").read_text())["cases"][0]["file"]
    with open(again / first, "r+b") as handle:
        handle.seek(-30, os.SEEK_END)
        handle.write(b"\0")
    with pytest.raises(ValueError, match="expected sha256"):
        load_vectors(again)
