"""rnngrad against ONNX: onnxruntime's RNN, GRU and LSTM forward in float32, and rnngrad's
gradients (through ``rnngrad.convert.onnx``) against central differences of ONNX's own
reference implementation (``onnx.reference``) in float64.

Every node is built in memory with ``onnx.helper`` (opset 14) and converted with
``rnngrad.convert.onnx.from_node``: RNN (Tanh, Relu), GRU (``linear_before_reset`` 0 and 1,
also with HardSigmoid gates), LSTM (without and with peepholes, output peephole zero); the
forward, reverse and bidirectional directions; time-major and batch-first layouts. rnngrad's
reference runs in float64 on the same float32-rounded inputs, so the error shown is
onnxruntime's float32 arithmetic.

    python -m verification.check_onnx
"""

from __future__ import annotations

import sys

import numpy as np

from verification.common import (FINITE_DIFFERENCE_TOLERANCE, Comparison, Tally, compare,
                                  progress, report, skipped)

OPSET = 14
IR_VERSION = 8  # what onnxruntime accepts for opset 14
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def build_node(op_type, *, direction="forward", hidden_size, has_bias=True, has_state=True,
               has_peephole=False, **attrs):
    """The ONNX node with inputs X, W, R, B, (no sequence_lens), initial_h, initial_c, P."""
    from onnx import helper

    inputs = ["X", "W", "R", "B" if has_bias else "", "", "initial_h" if has_state else ""]
    outputs = ["Y", "Y_h"]
    if op_type == "LSTM":
        inputs += ["initial_c" if has_state else "", "P" if has_peephole else ""]
        outputs.append("Y_c")
    while inputs and inputs[-1] == "":
        inputs.pop()
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return helper.make_node(op_type, inputs, outputs, direction=direction, hidden_size=hidden_size,
                            **attrs)


def build_model(node, feeds, dtype):
    """A one-node model whose graph inputs are ``feeds``' names (arrays of ``dtype``)."""
    from onnx import TensorProto, helper

    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}[np.dtype(dtype)]
    graph_inputs = [helper.make_tensor_value_info(n, elem, list(a.shape)) for n, a in feeds.items()]
    graph_outputs = [helper.make_tensor_value_info(n, elem, None) for n in node.output]
    graph = helper.make_graph([node], f"{node.op_type}_check", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def draw_feeds(op_type, D, T, N, I, H, rng, *, layout=0, has_bias=True, has_state=True,
               has_peephole=False):
    """Random inputs by ONNX name (float64; distinct values in every gate)."""
    G = GATES[op_type]
    feeds = {"X": rng.standard_normal((N, T, I) if layout else (T, N, I)),
             "W": rng.standard_normal((D, G * H, I)) * (0.8 / np.sqrt(I)),
             "R": rng.standard_normal((D, G * H, H)) * (0.8 / np.sqrt(H))}
    if has_bias:
        feeds["B"] = rng.standard_normal((D, 2 * G * H)) * 0.5
    if has_state:
        shape = (N, D, H) if layout else (D, N, H)
        feeds["initial_h"] = rng.standard_normal(shape) * 0.5
        if op_type == "LSTM":
            feeds["initial_c"] = rng.standard_normal(shape) * 0.5
    if has_peephole:
        P = rng.standard_normal((D, 3 * H)) * 0.3
        P[:, H:2 * H] = 0.0  # Po reads c[t] in ONNX, c[t-1] in MPSGraph: only zero maps
        feeds["P"] = P
    return feeds


#: (label, op_type, attributes, options): each is run forward, reverse and bidirectional
CONFIGURATIONS = (
    ("RNN Tanh", "RNN", dict(activations=["Tanh"]), {}),
    ("RNN Relu", "RNN", dict(activations=["Relu"]), {}),
    ("GRU linear_before_reset=0", "GRU", dict(linear_before_reset=0), {}),
    ("GRU linear_before_reset=1", "GRU", dict(linear_before_reset=1), {}),
    ("GRU HardSigmoid gates", "GRU", dict(activations=["HardSigmoid", "Tanh"]), {}),
    ("LSTM", "LSTM", {}, {}),
    ("LSTM peepholes (Po=0)", "LSTM", {}, dict(has_peephole=True)),
)
#: onnx.reference implements only the default activations
GRADIENT_CONFIGURATIONS = tuple(c for c in CONFIGURATIONS if "HardSigmoid" not in c[0] and "Relu" not in c[0])
DIRECTIONS = ("forward", "reverse", "bidirectional")
#: onnxruntime's CPU kernels reject layout=1 ("Batchwise recurrent operations (layout == 1) are
#: not supported"); the batch-first layout is checked against onnx.reference instead.
ORT_LAYOUTS = (0,)


def _full_attrs(attrs, direction, layout):
    acts = attrs.get("activations")
    if acts and direction == "bidirectional":
        attrs = dict(attrs, activations=acts * 2)
    return dict(attrs, layout=layout or None)


def check_forward(op_type, attrs, options, *, direction, layout, rng, T=5, N=3, I=4, H=5,
                  convert=None):
    """Comparisons of onnxruntime's float32 (Y, Y_h, Y_c) with rnngrad's. ``convert`` replaces
    the converter (node, initializers) → OnnxRNN, to show that a wrong mapping fails."""
    import onnxruntime as ort
    from rnngrad.convert import onnx as rgo

    D = 2 if direction == "bidirectional" else 1
    feeds = draw_feeds(op_type, D, T, N, I, H, rng, layout=layout, **options)
    feeds32 = {k: v.astype(np.float32) for k, v in feeds.items()}
    node = build_node(op_type, direction=direction, hidden_size=H, has_peephole="P" in feeds,
                      has_bias="B" in feeds, has_state="initial_h" in feeds,
                      **_full_attrs(attrs, direction, layout))
    session = ort.InferenceSession(build_model(node, feeds32, np.float32).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    want = dict(zip(node.output, session.run(None, feeds32)))
    rounded = {k: v.astype(np.float64) for k, v in feeds32.items()}
    layer = (convert or rgo.from_node)(node, rounded)
    Y, Y_h, Y_c = layer.forward(rounded["X"], rounded.get("initial_h"), rounded.get("initial_c"),
                                backend="reference")
    got = {"Y": Y, "Y_h": Y_h, "Y_c": Y_c}
    kinds = {"Y": "state", "Y_h": "state", "Y_c": "cell"}
    return [compare(kinds[k], got[k], want[k], np.float32, label=k) for k in want]


def onnx_reference_loss(node, feeds, upstream):
    """L = Σ dY ⊙ Y + Σ dY_h ⊙ Y_h (+ Σ dY_c ⊙ Y_c) by onnx.reference in float64."""
    from onnx.reference import ReferenceEvaluator

    model = build_model(node, feeds, np.float64)
    outs = ReferenceEvaluator(model).run(None, feeds)
    return float(sum(np.sum(upstream[name] * out) for name, out in zip(node.output, outs)))


def check_gradients(op_type, attrs, options, *, direction, layout, rng, T=4, N=2, I=3, H=3,
                    step=1e-5, convert=None):
    """rnngrad's gradients in ONNX's layout (through the converter) against a central
    difference of onnx.reference's loss along a random direction through every input,
    the output peephole Po included."""
    from rnngrad.convert import onnx as rgo

    D = 2 if direction == "bidirectional" else 1
    feeds = draw_feeds(op_type, D, T, N, I, H, rng, layout=layout, **options)
    node = build_node(op_type, direction=direction, hidden_size=H, has_peephole="P" in feeds,
                      has_bias="B" in feeds, has_state="initial_h" in feeds,
                      **_full_attrs(attrs, direction, layout))
    outs = _reference_outputs(node, feeds)
    upstream = {name: rng.standard_normal(out.shape) for name, out in zip(node.output, outs)}
    layer = (convert or rgo.from_node)(node, feeds)
    Y, Y_h, Y_c = layer.forward(feeds["X"], feeds.get("initial_h"), feeds.get("initial_c"),
                                backend="reference")
    got = {"Y": Y, "Y_h": Y_h, "Y_c": Y_c}
    kinds = {"Y": "state", "Y_h": "state", "Y_c": "cell"}
    comparisons = [compare(kinds[k], got[k], want, np.float64, label=k)
                   for k, want in zip(node.output, outs)]
    g = layer.gradients(feeds["X"], feeds.get("initial_h"), feeds.get("initial_c"),
                        upstream["Y"], upstream["Y_h"], upstream.get("Y_c"), backend="reference")
    grads = {"X": g.X, "W": g.W, "R": g.R, "B": g.B, "initial_h": g.initial_h,
             "initial_c": g.initial_c, "P": g.P}
    v = {k: rng.standard_normal(a.shape) for k, a in feeds.items()}
    analytic = sum(float(np.sum(grads[k] * v[k])) for k in feeds)
    lp = onnx_reference_loss(node, {k: a + step * v[k] for k, a in feeds.items()}, upstream)
    lm = onnx_reference_loss(node, {k: a - step * v[k] for k, a in feeds.items()}, upstream)
    numeric = (lp - lm) / (2 * step)
    error = abs(analytic - numeric) / max(abs(analytic), abs(numeric), abs(lp) + abs(lm), 1e-3)
    return comparisons + [Comparison(
        "directional derivative", error, FINITE_DIFFERENCE_TOLERANCE, error <= FINITE_DIFFERENCE_TOLERANCE,
        f"directional derivative: analytic {analytic:.12g}, finite difference {numeric:.12g}")]


def _reference_outputs(node, feeds):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(build_model(node, feeds, np.float64)).run(None, feeds)


def cases(configurations, layouts):
    """(label, op_type, attrs, options, direction, layout, description) for every run."""
    for label, op_type, attrs, options in configurations:
        for direction in DIRECTIONS:
            for layout in layouts:
                for has_bias, has_state in ((True, True), (False, False)) if layout == 0 else ((True, True),):
                    opts = dict(options, has_bias=has_bias, has_state=has_state)
                    what = [direction, f"layout={layout}"] + ([] if has_bias else ["no B, no initial state"])
                    yield label, op_type, attrs, opts, direction, layout, f"{label} ({', '.join(what)})"


def run(seed=7) -> list:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        reason = f"needs onnx and onnxruntime (pip install onnx onnxruntime): {exc}"
        return [skipped("onnx: forward", "onnxruntime forward, float32", reason),
                skipped("onnx: layouts 0/1, gradients", "onnx.reference float64", reason)]
    rng = np.random.default_rng(seed)
    tallies = {}
    for label, op_type, attrs, options, direction, layout, what in cases(CONFIGURATIONS, ORT_LAYOUTS):
        tally = tallies.setdefault(label, Tally(f"onnx: {label}", "onnxruntime forward, float32"))
        tally.case(what, check_forward(op_type, attrs, options, direction=direction, layout=layout, rng=rng))
    rows = [t.done() for t in tallies.values()]
    progress(f"  onnx: forward, {sum(r.cases for r in rows)} nodes, "
             f"{'FAIL' if any(r.failed for r in rows) else 'pass'}")
    grad = Tally("onnx: layouts 0/1, gradients", "onnx.reference float64: outputs, central differences")
    for label, op_type, attrs, options, direction, layout, what in cases(GRADIENT_CONFIGURATIONS, (0, 1)):
        grad.case(what, check_gradients(op_type, attrs, options, direction=direction, layout=layout, rng=rng))
    rows.append(grad.done())
    progress(f"  onnx: gradients, {grad.row.cases} nodes, {grad.row.status}")
    return rows


def main(argv=None) -> int:
    return report(run())


if __name__ == "__main__":
    sys.exit(main())
