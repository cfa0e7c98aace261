"""The verification checks can fail: a deliberately wrong mapping or a wrong stand-in for
MPSGraph is caught, the right one passes, and the table's exit status follows."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the verification/ package

from verification import check_mpsgraph  # noqa: E402
from verification.common import (CONFIRMED, FAIL, NEITHER, PASS, REFUTED, SKIP, Row,  # noqa: E402
                                 format_table, report)

CONFIG = dict(bidirectional=True, bias=True, batch_first=True, upstream="both", with_state=True)


# -- PyTorch: wrong mappings fail ----------------------------------------------------------------

def _torch_check(label, layer=None, seed=0):
    pytest.importorskip("torch")
    from verification import check_torch

    return check_torch.check_configuration(label, rng=np.random.default_rng(seed), layer=layer, **CONFIG)


def _fold_b_hn(module):
    """The classic mistake: GRU's b_hn added to the candidate bias instead of inside r ⊙ (…)."""
    from rnngrad.convert import torch as rgt

    right = rgt.from_module(module)
    H, D = right.H, right.D
    bias = right.bias.reshape(D, 3 * H).copy()
    bias[:, 2 * H:] += right.secondary_bias.reshape(D, H)
    return dataclasses.replace(right, bias=bias.reshape(-1), secondary_bias=None)


def _invert_flip_z(module):
    from rnngrad.convert import torch as rgt

    right = rgt.from_module(module)
    return dataclasses.replace(right, descriptor=dataclasses.replace(right.descriptor, flip_z=True))


def _lstm_forget_gate_last(module):
    from rnngrad.convert import torch as rgt

    right = rgt.from_module(module)
    return dataclasses.replace(right, descriptor=dataclasses.replace(right.descriptor, forget_gate_last=True))


@pytest.mark.parametrize("label", ["RNN tanh", "RNN relu", "GRU", "LSTM"])
def test_the_right_mapping_passes_the_torch_check(label):
    comparisons = _torch_check(label)
    assert comparisons and all(c.passed for c in comparisons), [c.detail for c in comparisons if not c.passed]
    assert max(c.error for c in comparisons) < 1e-12


@pytest.mark.parametrize("label,wrong", [("GRU", _fold_b_hn), ("GRU", _invert_flip_z),
                                         ("LSTM", _lstm_forget_gate_last)])
def test_a_wrong_mapping_fails_the_torch_check(label, wrong):
    comparisons = _torch_check(label, layer=wrong)
    failed = [c.quantity for c in comparisons if not c.passed]
    assert "output" in failed, failed  # the forward already shows it
    assert any(q.startswith(("weight_", "bias_")) for q in failed), failed


# -- ONNX: wrong mappings fail -------------------------------------------------------------------

def _onnx_forward(op, attrs, convert=None, options=None, direction="bidirectional"):
    pytest.importorskip("onnxruntime")
    from verification import check_onnx

    return check_onnx.check_forward(op, attrs, options or {}, direction=direction, layout=0,
                                    rng=np.random.default_rng(3), convert=convert)


def _onnx_wrong(**changes):
    from rnngrad.convert import onnx as rgo

    def convert(node, initializers):
        right = rgo.from_node(node, initializers)
        return dataclasses.replace(right, descriptor=dataclasses.replace(right.descriptor, **changes))
    return convert


@pytest.mark.parametrize("op,attrs,wrong", [
    ("GRU", {"linear_before_reset": 0}, dict(reset_after=True)),
    ("GRU", {"linear_before_reset": 1}, dict(flip_z=True)),
    ("GRU", {}, dict(reset_gate_first=True)),
    ("LSTM", {}, dict(forget_gate_last=True)),
])
def test_a_wrong_mapping_fails_the_onnx_check(op, attrs, wrong):
    assert all(c.passed for c in _onnx_forward(op, attrs))
    assert not all(c.passed for c in _onnx_forward(op, attrs, convert=_onnx_wrong(**wrong)))


def test_reverse_outputs_not_realigned_fail_the_onnx_check():
    """ONNX aligns a reverse op's Y with input time; forgetting the flip is caught."""
    from rnngrad.convert import onnx as rgo

    class NotFlipped(rgo.OnnxRNN):
        def _aligned(self, seq):
            return seq

    def convert(node, initializers):
        right = rgo.from_node(node, initializers)
        return NotFlipped(**{f.name: getattr(right, f.name) for f in dataclasses.fields(right)})
    assert all(c.passed for c in _onnx_forward("RNN", {}, direction="reverse"))
    assert not all(c.passed for c in _onnx_forward("RNN", {}, convert=convert, direction="reverse"))


# -- MPSGraph check: the comparison and the verdicts, with stand-ins ------------------------------

def test_mpsgraph_check_with_the_reference_standing_in_confirms_every_decision():
    rows = check_mpsgraph.run(check_mpsgraph.RnngradCandidate("reference"))
    decisions = [r for r in rows if r.check.startswith("[decision]")]
    assert len(decisions) >= 8
    assert all(r.status == CONFIRMED for r in decisions), [(r.check, r.note) for r in decisions]
    assert all(r.status == PASS for r in rows if r not in decisions)


def _verdicts(candidate):
    return {r.check: r.status for r in check_mpsgraph.decision_rows(candidate)}


def test_an_inverted_flip_z_is_refuted():
    flip = lambda d: dataclasses.replace(d, flip_z=not d.flip_z) if hasattr(d, "flip_z") else d  # noqa: E731
    verdicts = _verdicts(check_mpsgraph.RnngradCandidate("reference", descriptor_change=flip))
    assert verdicts["[decision] GRU flip_z=False"] == REFUTED
    assert verdicts["[decision] GRU flip_z=True"] == REFUTED
    assert verdicts["[decision] hard sigmoid constants"] == CONFIRMED


class _Alternative(check_mpsgraph.RnngradCandidate):
    """A stand-in that behaves like one alternative reading: PyTorch's 1/6 hard sigmoid, outputs
    of a reverse op re-aligned, a final cell gradient added at every step."""

    def __init__(self, which):
        super().__init__("reference")
        self.which = which

    def forward(self, case):
        from rnngrad.results import ForwardResult

        out = super().forward(case)
        if self.which == "hard sigmoid" and case.cell == "single_gate":
            return ForwardResult([("state", np.clip(case.inputs["source"] / 6 + 0.5, 0, 1).astype(np.float32))])
        if self.which == "aligned" and case.descriptor.reverse and not case.descriptor.bidirectional:
            return ForwardResult([(n, v[::-1]) for n, v in out.as_dict().items()])
        return out

    def gradients(self, case):
        if self.which == "every step" and case.cell_gradient is not None and case.cell_gradient.ndim == 2:
            spread = np.broadcast_to(case.cell_gradient, (case.T,) + case.cell_gradient.shape).copy()
            case = dataclasses.replace(case, cell_gradient=spread)
        return super().gradients(case)


@pytest.mark.parametrize("which,decision", [
    ("hard sigmoid", "[decision] hard sigmoid constants"),
    ("aligned", "[decision] reverse output order"),
    ("every step", "[decision] cell gradient [N,H]"),
])
def test_an_alternative_reading_is_refuted(which, decision):
    assert _verdicts(_Alternative(which))[decision] == REFUTED


def test_a_candidate_matching_neither_reading_is_neither():
    noisy = check_mpsgraph.RnngradCandidate("reference")
    real = noisy.forward
    from rnngrad.results import ForwardResult

    noisy.forward = lambda case: ForwardResult([(n, v + 0.1) for n, v in real(case).as_dict().items()])
    assert _verdicts(noisy)["[decision] GRU flip_z=False"] == NEITHER


def test_mpsgraph_check_skips_cleanly_off_macos():
    if check_mpsgraph.probe() is None:
        pytest.skip("MPSGraph is reachable here")
    rows = check_mpsgraph.run()
    assert [r.status for r in rows] == [SKIP]
    assert "macOS" in rows[0].note or "pyobjc" in rows[0].note.lower()
    assert not rows[0].failed


# -- the table -----------------------------------------------------------------------------------

def test_report_exit_status_follows_the_rows(capsys):
    good = Row("a", "b", 1, 1e-15, 1e-9, PASS)
    assert report([good, Row("m", "b", status=SKIP, note="off macOS")]) == 0
    for bad in (FAIL, REFUTED, NEITHER):
        assert report([good, Row("c", "d", 1, 1.0, 1e-9, bad, "why")]) == 1
    table = format_table([good])
    assert "| a " in table and "1.0e-15" in table
    capsys.readouterr()


def test_python_m_verification_runs_and_prints_the_table():
    pytest.importorskip("onnxruntime")
    done = subprocess.run([sys.executable, "-m", "verification", "--only", "onnx", "mpsgraph"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| onnx: LSTM peepholes (Po=0)" in done.stdout
    assert "passed, 0 failed" in done.stdout
