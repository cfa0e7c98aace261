"""rnngrad's reference against the real MPSGraph, on a Mac with Apple silicon.

    pip install pyobjc-framework-MetalPerformanceShadersGraph   # once; torch is optional
    python -m verification.check_mpsgraph

It builds each op with PyObjC's MetalPerformanceShadersGraph bindings, runs it on the GPU in
float32 and compares with the float64 reference on the same float32-rounded inputs:

- random problems of every cell, forward (h, c) and gradients (a training forward feeding the
  gradient op in one graph, so MPSGraph's own z_state is used; z_state itself is opaque and not
  compared);
- every decision marked [decision] in ``rnngrad/backends/reference/SEMANTICS.md``, each
  reported as **confirmed** (MPSGraph equals the reference), **REFUTED** (MPSGraph equals the
  named alternative reading instead) or **neither**: GRU flip_z default, hard sigmoid constants
  and derivative, the per-step and every-step mask forms, the final-cell, [1,N,H] and per-step
  cell-gradient forms, the processing-order outputs of a unidirectional reverse op;
- when PyTorch with the MPS device is installed, ``nn.LSTM`` on ``"mps"`` (which PyTorch runs
  with MPSGraph's LSTM and LSTMGradients) against the reference, with check_torch's code.

Off macOS (or without the bindings) the check is skipped with the reason; it has not been run
on real hardware by this project yet. Everything except the thin ``_MPSGraph`` class (graph
construction, feeding and reading tensors) is exercised on every platform: ``--stand-in
reference`` runs the whole check with the reference in MPSGraph's place, and the tests do the
same with deliberately wrong stand-ins, which must be reported as refuted.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import platform
import sys
from typing import Callable, Optional

import numpy as np

from rnngrad.testing.cases import Case, random_case
from rnngrad.descriptors import Activation, GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor
from rnngrad.results import ForwardResult, GradientResult
from verification.common import (CONFIRMED, NEITHER, REFUTED, Comparison, Row, Tally, compare,
                                 compare_result, progress, reference, report, skipped)

AGAINST = "MPSGraph (GPU), float32"

# MPSGraph's gradient orders (SEMANTICS.md §3.2)
_GRADIENT_ORDER = {
    "single_gate": ("source", "recurrent_weight", "input_weight", "bias", "init_state"),
    "gru": ("source", "recurrent_weight", "input_weight", "bias", "init_state", "secondary_bias"),
    "lstm": ("source", "recurrent_weight", "input_weight", "bias", "peephole", "init_state", "init_cell"),
}


def probe() -> Optional[str]:
    """None when MPSGraph is reachable from Python here, else why not."""
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return (f"needs macOS on Apple silicon (this is {sys.platform} {platform.machine()}); "
                f"run `python -m verification.check_mpsgraph` on a Mac")
    try:
        import Metal  # noqa: F401
        import MetalPerformanceShadersGraph  # noqa: F401
    except ImportError as exc:
        return f"needs pip install pyobjc-framework-MetalPerformanceShadersGraph ({exc})"
    import Metal

    if Metal.MTLCreateSystemDefaultDevice() is None:
        return "no Metal device"
    return None


# -- candidates: MPSGraph, or a stand-in with the same two methods ------------------------------

class Candidate:
    """What the check compares with the reference: ``forward(case)`` → ForwardResult with
    h (and c for an LSTM, produce_cell); ``gradients(case)`` → GradientResult from the
    candidate's own training forward feeding its own gradient op."""

    name = "candidate"

    def forward(self, case: Case) -> ForwardResult:
        raise NotImplementedError

    def gradients(self, case: Case) -> GradientResult:
        raise NotImplementedError


class RnngradCandidate(Candidate):
    """An rnngrad backend standing in for MPSGraph (runs the check's logic anywhere).
    ``descriptor_change`` alters the descriptor the stand-in really runs (to make a wrong one)."""

    def __init__(self, backend="reference", descriptor_change: Optional[Callable] = None):
        self.backend = backend
        self.name = f"rnngrad {backend!r} standing in for MPSGraph"
        self.change = descriptor_change or (lambda d: d)

    def _case(self, case):
        return dataclasses.replace(case, descriptor=self.change(case.descriptor))

    def forward(self, case):
        return self._case(case).forward(backend=self.backend)

    def gradients(self, case):
        return self._case(case).gradients(backend=self.backend)


class MPSGraphCandidate(Candidate):
    name = "MPSGraph"

    def __init__(self):
        self.mps = _MPSGraph()

    def forward(self, case):
        entries, _ = self.mps.run(case, gradients=False)
        return ForwardResult(entries)

    def gradients(self, case):
        _, entries = self.mps.run(case, gradients=True)
        return GradientResult(entries)


class _MPSGraph:
    """The thin PyObjC layer: one graph per call, float32. This is the only code of the check
    that has not run on this project's CI."""

    FLOAT32 = 0x10000000 | 32  # MPSDataTypeFloat32

    def __init__(self):
        import Foundation
        import Metal
        import MetalPerformanceShadersGraph as G

        self.G, self.NSData = G, Foundation.NSData
        self.device = G.MPSGraphDevice.deviceWithMTLDevice_(Metal.MTLCreateSystemDefaultDevice())

    def _descriptor(self, desc, training):
        G = self.G
        if isinstance(desc, SingleGateRNNDescriptor):
            d = G.MPSGraphSingleGateRNNDescriptor.descriptor()
            d.setActivation_(int(desc.activation))
        elif isinstance(desc, GRUDescriptor):
            d = G.MPSGraphGRUDescriptor.descriptor()
            d.setResetGateFirst_(desc.reset_gate_first)
            d.setResetAfter_(desc.reset_after)
            d.setFlipZ_(desc.flip_z)
            d.setUpdateGateActivation_(int(desc.update_gate_activation))
            d.setResetGateActivation_(int(desc.reset_gate_activation))
            d.setOutputGateActivation_(int(desc.output_gate_activation))
        else:
            d = G.MPSGraphLSTMDescriptor.descriptor()
            d.setProduceCell_(True)
            d.setForgetGateLast_(desc.forget_gate_last)
            d.setInputGateActivation_(int(desc.input_gate_activation))
            d.setForgetGateActivation_(int(desc.forget_gate_activation))
            d.setCellGateActivation_(int(desc.cell_gate_activation))
            d.setOutputGateActivation_(int(desc.output_gate_activation))
            d.setActivation_(int(desc.activation))
        d.setReverse_(desc.reverse)
        d.setBidirectional_(desc.bidirectional)
        d.setTraining_(training)
        return d

    def _feed(self, graph, feeds, name, array):
        array = np.ascontiguousarray(array, np.float32)
        tensor = graph.placeholderWithShape_dataType_name_(list(array.shape), self.FLOAT32, name)
        data = self.NSData.dataWithBytes_length_(array.tobytes(), array.nbytes)
        feeds[tensor] = self.G.MPSGraphTensorData.alloc().initWithDevice_data_shape_dataType_(
            self.device, data, list(array.shape), self.FLOAT32)
        return tensor

    @staticmethod
    def _read(tensor_data):
        nd = tensor_data.mpsndarray()
        desc = nd.descriptor()
        lengths = [desc.lengthOfDimension_(i) for i in range(desc.numberOfDimensions())]
        count = int(np.prod(lengths)) if lengths else 1
        buffer = (ctypes.c_char * (4 * count))()
        nd.readBytes_strideBytes_(buffer, None)
        # MPSNDArray's dimension 0 is the fastest-moving one: reversed, it is the tensor's shape
        return np.frombuffer(bytes(buffer), np.float32).reshape(lengths[::-1]).copy()

    def run(self, case: Case, gradients: bool):
        """([(name, array)] forward entries, [(name, array)] gradient entries or None)."""
        G = self.G
        cell, desc = case.cell, case.descriptor
        graph = G.MPSGraph.alloc().init()
        feeds = {}
        t = {k: self._feed(graph, feeds, k, v) for k, v in case.inputs.items()}
        opt = lambda k: t.get(k)  # noqa: E731
        d = self._descriptor(desc, training=gradients)
        if cell == "single_gate":
            outs = graph.singleGateRNNWithSourceTensor_recurrentWeight_inputWeight_bias_initState_mask_descriptor_name_(
                t["source"], t["recurrent_weight"], opt("input_weight"), opt("bias"), opt("init_state"),
                opt("mask"), d, None)
        elif cell == "gru":
            outs = graph.GRUWithSourceTensor_recurrentWeight_inputWeight_bias_initState_mask_secondaryBias_descriptor_name_(
                t["source"], t["recurrent_weight"], opt("input_weight"), opt("bias"), opt("init_state"),
                opt("mask"), opt("secondary_bias"), d, None)
        else:
            outs = graph.LSTMWithSourceTensor_recurrentWeight_inputWeight_bias_initState_initCell_mask_peephole_descriptor_name_(
                t["source"], t["recurrent_weight"], opt("input_weight"), opt("bias"), opt("init_state"),
                opt("init_cell"), opt("mask"), opt("peephole"), d, None)
        outs = list(outs)
        names = ["state"] + (["cell"] if cell == "lstm" else [])
        targets = outs[:len(names)]
        grad_names = []
        if gradients:
            sg = self._feed(graph, feeds, "source_gradient", case.source_gradient)
            st = None if case.state_gradient is None else self._feed(graph, feeds, "state_gradient", case.state_gradient)
            z = outs[-1]
            if cell == "single_gate":
                grads = graph.singleGateRNNGradientsWithSourceTensor_recurrentWeight_sourceGradient_zState_stateGradient_inputWeight_bias_initState_mask_descriptor_name_(
                    t["source"], t["recurrent_weight"], sg, z, st, opt("input_weight"), opt("bias"),
                    opt("init_state"), opt("mask"), d, None)
            elif cell == "gru":
                grads = graph.GRUGradientsWithSourceTensor_recurrentWeight_sourceGradient_zState_outputFwd_stateGradient_inputWeight_bias_initState_mask_secondaryBias_descriptor_name_(
                    t["source"], t["recurrent_weight"], sg, z, outs[0], st, opt("input_weight"), opt("bias"),
                    opt("init_state"), opt("mask"), opt("secondary_bias"), d, None)
            else:
                cg = None if case.cell_gradient is None else self._feed(graph, feeds, "cell_gradient", case.cell_gradient)
                grads = graph.LSTMGradientsWithSourceTensor_recurrentWeight_sourceGradient_zState_cellOutputFwd_stateGradient_cellGradient_inputWeight_bias_initState_initCell_mask_peephole_descriptor_name_(
                    t["source"], t["recurrent_weight"], sg, z, outs[1], st, cg, opt("input_weight"),
                    opt("bias"), opt("init_state"), opt("init_cell"), opt("mask"), opt("peephole"), d, None)
            grad_names = [n for n in _GRADIENT_ORDER[cell] if n in ("source", "recurrent_weight") or n in case.inputs]
            targets = targets + list(grads)[:len(grad_names)]
        results = graph.runWithFeeds_targetTensors_targetOperations_(feeds, targets, None)
        values = [self._read(results[tensor]) for tensor in targets]
        forward = list(zip(names, values[:len(names)]))
        backward = list(zip(grad_names, values[len(names):])) if gradients else None
        return forward, backward


# -- random problems ------------------------------------------------------------------------------

#: MPSGraph behaviours rnngrad deliberately does not follow (SEMANTICS.md §3.4);
#: the random draw avoids them so the rows measure agreement, not the known deviations.
def _avoid_known_deviations(case: Case) -> Case:
    desc = case.descriptor
    if desc.bidirectional and case.cell == "lstm" and "peephole" in case.inputs:
        case.inputs.pop("peephole")
    if desc.bidirectional and case.cell == "single_gate":
        case.state_gradient = None
    return case


def random_cases(cell, count, seed):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        case = random_case(rng, cell, dtype=np.float32, max_size=6)
        desc = dataclasses.replace(case.descriptor, training=False,
                                   **({"produce_cell": True} if cell == "lstm" else {}))
        yield _avoid_known_deviations(dataclasses.replace(case, descriptor=desc))


def _forward_view(result):
    """The entries MPSGraph's forward is compared on: h, and c for an LSTM (not z_state)."""
    return ForwardResult([(n, getattr(result, n)) for n in ("state", "cell") if getattr(result, n) is not None])


def compare_forward(candidate, case):
    return compare_result(_forward_view(candidate.forward(case)), _forward_view(reference(case, False)), np.float32)


def compare_gradients(candidate, case):
    return compare_result(candidate.gradients(case), reference(case, True), np.float32)


def _guarded(fn, candidate, case):
    """fn's comparisons, or one failed comparison saying what the candidate raised (an op that
    refuses an input form is a finding, not a crash of the whole check)."""
    try:
        return fn(candidate, case)
    except Exception as exc:  # noqa: BLE001 (PyObjC raises objc.error and friends)
        return [Comparison("call", np.inf, 0.0, False, f"raised {type(exc).__name__}: {exc}")]


def random_rows(candidate, count=12, seed=31):
    rows = []
    for index, cell in enumerate(("single_gate", "gru", "lstm")):
        for kind, fn in (("forward", compare_forward), ("gradients", compare_gradients)):
            tally = Tally(f"mpsgraph: {cell} {kind}", candidate.name)
            for n, case in enumerate(random_cases(cell, count, seed + index)):
                tally.case(f"random {cell} case {n}: {case!r}", _guarded(fn, candidate, case))
            rows.append(tally.done())
    return rows


# -- the [decision]s -----------------------------------------------------------------------------

@dataclasses.dataclass
class Decision:
    """A [decision] of SEMANTICS.md: the case that tells the readings apart, whether it is
    judged on the forward or the gradients, and ``alternative(case)`` → {quantity: float64
    array} that the other reading would give."""

    name: str
    statement: str
    case: Case
    gradients: bool
    alternative: Callable
    alternative_statement: str


def _with(case, **descriptor_changes):
    return dataclasses.replace(case, descriptor=dataclasses.replace(case.descriptor, **descriptor_changes))


def _ref(case, gradients=False):
    return reference(case, gradients).as_dict()


_OPTIONAL = ("input_weight", "bias", "init_state", "init_cell", "mask", "mask_per_step", "peephole",
             "secondary_bias", "state_gradient", "cell_gradient")


def _case(cell, seed, descriptor, T=4, N=3, I=3, H=4, form=None, **present):
    """A float32 case with exactly the optional inputs named in ``present``."""
    return random_case(seed, cell, T=T, N=N, I=I, H=H, descriptor=descriptor, dtype=np.float32,
                       optional={k: bool(present.get(k, False)) for k in _OPTIONAL},
                       cell_gradient_form=form)


def _hard_sigmoid_case(seed):
    """R = 0 and no input weight, so h = f(source) exactly; source spread over [-4, 4]."""
    rng = np.random.default_rng(seed)
    T, N, H = 3, 4, 8
    source = np.linspace(-4.0, 4.0, T * N * H).reshape(T, N, H)
    rng.shuffle(source.reshape(-1))
    return Case("single_gate", SingleGateRNNDescriptor(activation=Activation.HARD_SIGMOID),
                {"source": source.astype(np.float32), "recurrent_weight": np.zeros((H, H), np.float32)},
                source_gradient=rng.standard_normal((T, N, H)).astype(np.float32))


def _sixth(x):
    return np.clip(np.asarray(x, np.float64) / 6 + 0.5, 0.0, 1.0)


def decisions(seed=5) -> list:
    gru = GRUDescriptor(reset_gate_first=True, reset_after=True)
    out = []
    for flip in (False, True):
        case = _case("gru", seed, dataclasses.replace(gru, flip_z=flip), input_weight=True, bias=True,
                     init_state=True)
        out.append(Decision(
            f"GRU flip_z={flip}",
            "h = z⊙h[t−1] + (1−z)⊙o" if not flip else "h = (1−z)⊙h[t−1] + z⊙o",
            case, False, lambda c: _ref(_with(c, flip_z=not c.descriptor.flip_z)),
            "the descriptor documentation's swapped reading"))
    hs = _hard_sigmoid_case(seed)
    out.append(Decision("hard sigmoid constants", "clamp(0.2·x + 0.5, 0, 1)", hs, False,
                        lambda c: {"state": _sixth(c.inputs["source"])}, "clamp(x/6 + 0.5, 0, 1)"))
    out.append(Decision("hard sigmoid derivative", "0.2 where |x| ≤ 2.5, else 0", hs, True,
                        lambda c: {"source": c.source_gradient * np.where(np.abs(c.inputs["source"]) < 3, 1 / 6, 0.0)},
                        "1/6 where |x| < 3"))
    per_step = _case("gru", seed + 1, GRUDescriptor(reverse=True), input_weight=True, init_state=True,
                     mask=True, mask_per_step=True)
    out.append(Decision("per-step mask [T,N,H]", "indexed by processing step", per_step, False,
                        lambda c: _ref(dataclasses.replace(c, inputs=dict(c.inputs, mask=c.inputs["mask"][::-1]))),
                        "indexed by input time"))
    every = _case("single_gate", seed + 2, SingleGateRNNDescriptor(activation=Activation.TANH),
                  input_weight=True, init_state=True, mask=True)
    out.append(Decision("every-step mask [N,H]", "multiplies h[t−1] in the recurrent product", every, False,
                        lambda c: _ref(dataclasses.replace(c, inputs={k: v for k, v in c.inputs.items() if k != "mask"})),
                        "ignored"))
    lstm = LSTMDescriptor(reverse=True)
    final_cg = _case("lstm", seed + 3, lstm, input_weight=True, init_state=True, init_cell=True,
                     cell_gradient=True, form="final")
    broadcast = lambda c: _ref(dataclasses.replace(  # noqa: E731
        c, cell_gradient=np.broadcast_to(c.cell_gradient.reshape(1, *c.cell_gradient.shape[-2:]),
                                         (c.T,) + c.cell_gradient.shape[-2:]).copy()), True)
    out.append(Decision("cell gradient [N,H]", "the final cell's gradient only", final_cg, True, broadcast,
                        "added at every step"))
    one = dataclasses.replace(final_cg, cell_gradient=final_cg.cell_gradient[None])
    out.append(Decision("cell gradient [1,N,H], T > 1", "the final cell's gradient only", one, True, broadcast,
                        "added at every step"))
    per_cg = _case("lstm", seed + 4, lstm, input_weight=True, init_state=True, init_cell=True,
                   cell_gradient=True, form="per_step")
    out.append(Decision("cell gradient [T,N,H], reverse", "per step, in output (processing) order", per_cg, True,
                        lambda c: _ref(dataclasses.replace(c, cell_gradient=c.cell_gradient[::-1].copy()), True),
                        "per step, in input time order"))
    rev = _case("lstm", seed + 5, LSTMDescriptor(reverse=True, produce_cell=True), input_weight=True,
                init_state=True)
    out.append(Decision("reverse output order", "processing order (h[k] after source[T−1−k])", rev, False,
                        lambda c: {k: v[::-1] for k, v in _ref(c).items()}, "re-aligned with input time"))
    return out


def judge(candidate, decision: Decision) -> Row:
    """confirmed: the candidate equals the reference; REFUTED: it equals the alternative
    reading instead; neither: it equals neither."""
    case = decision.case
    if decision.gradients:
        got = candidate.gradients(case).as_dict()
        want = _ref(case, True)
    else:
        got = _forward_view(candidate.forward(case)).as_dict()
        want = {k: v for k, v in _ref(case).items() if k in got}
    mine = [compare(k, got.get(k), want[k], np.float32) for k in want]
    theirs = [compare(k, got.get(k), v, np.float32) for k, v in decision.alternative(case).items()]
    worst = max(c.error for c in mine)
    tol = max(c.rtol for c in mine)
    if all(c.passed for c in mine):
        status, note = CONFIRMED, f"{decision.statement}"
    elif all(c.passed for c in theirs):
        status, note = REFUTED, f"MPSGraph does {decision.alternative_statement}, not {decision.statement}"
    else:
        failing = next(c for c in mine if not c.passed)
        status, note = NEITHER, (f"MPSGraph matches neither {decision.statement} nor "
                                 f"{decision.alternative_statement}: {failing.detail}")
    return Row(f"[decision] {decision.name}", candidate.name, 1, worst, tol, status, note)


def decision_rows(candidate) -> list:
    rows = []
    for d in decisions():
        try:
            rows.append(judge(candidate, d))
        except Exception as exc:  # noqa: BLE001
            rows.append(Row(f"[decision] {d.name}", candidate.name, 1, np.inf, 0.0, NEITHER,
                            f"raised {type(exc).__name__}: {exc}"))
    return rows


def torch_mps_rows() -> list:
    """nn.LSTM on the "mps" device (PyTorch's LSTM runs MPSGraph's LSTM ops) against the
    reference, float32, with check_torch's configurations."""
    try:
        import torch
    except ImportError:
        return [skipped("torch mps: LSTM", "PyTorch nn.LSTM on mps", "PyTorch is not installed")]
    if not torch.backends.mps.is_available():
        return [skipped("torch mps: LSTM", "PyTorch nn.LSTM on mps", "torch.backends.mps is not available")]
    from verification import check_torch

    rng = np.random.default_rng(11)
    tally = Tally("torch mps: LSTM", "PyTorch nn.LSTM on mps, float32")
    for config in check_torch.configurations():
        tally.case(check_torch.describe("LSTM", config),
                   check_torch.check_configuration("LSTM", rng=rng, device="mps", dtype=np.float32, **config))
    return [tally.done()]


def run(candidate: Optional[Candidate] = None) -> list:
    if candidate is None:
        reason = probe()
        if reason:
            return [skipped("mpsgraph: every cell, [decision]s", AGAINST, reason)]
        candidate = MPSGraphCandidate()
        extra = torch_mps_rows
    else:
        extra = list
    rows = random_rows(candidate)
    progress(f"  mpsgraph: random problems against {candidate.name}: "
             f"{'FAIL' if any(r.failed for r in rows) else 'pass'}")
    rows += decision_rows(candidate)
    rows += extra()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verification.check_mpsgraph", description=__doc__.split("\n")[0])
    parser.add_argument("--stand-in", metavar="BACKEND",
                        help="run the whole check with this rnngrad backend in MPSGraph's place "
                             "(tests the check itself on any platform)")
    args = parser.parse_args(argv)
    candidate = RnngradCandidate(args.stand_in) if args.stand_in else None
    return report(run(candidate))


if __name__ == "__main__":
    sys.exit(main())
