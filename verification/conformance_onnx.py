"""The conformance table's ONNX Runtime row: ONNX ``RNN``, ``GRU`` and ``LSTM`` nodes run by
onnxruntime (forward, float32) as candidates of :func:`rnngrad.testing.check_backend`.

Each drawn problem's rnngrad arguments become an ONNX node and its inputs in the layouts
``rnngrad.convert.onnx`` states (the node is converted back with ``from_node`` and must give the
same arguments), onnxruntime runs it, and ``Y`` comes back as rnngrad's ``h``. What ONNX cannot
express is skipped (``Unsupported``): a mask, a peephole, gates in another order, ``flip_z``,
different activations for gates that ONNX gives one function, the ``none`` activation; T = 0
and N = 0 are left out (onnxruntime has no empty sequences).
"""

from __future__ import annotations

import numpy as np

import rnngrad as rg
from rnngrad.testing import Unsupported, check_backend
from verification.check_onnx import build_model, build_node

_OP = {"single_gate": "RNN", "gru": "GRU", "lstm": "LSTM"}
_NAMES = {"RELU": "Relu", "TANH": "Tanh", "SIGMOID": "Sigmoid", "HARD_SIGMOID": "HardSigmoid"}
_SESSIONS = {}


def _name(activation):
    if activation.name not in _NAMES:
        raise Unsupported(f"activation {activation.name}: ONNX has no such function")
    return _NAMES[activation.name]


def onnx_node(cell, inputs, desc):
    """(node, feeds): an ONNX node and its float32 inputs for rnngrad's forward ``inputs``."""
    from rnngrad.convert.onnx import OP_TYPES, _inverse, _permute_gates
    from rnngrad.convert._common import sided_to_stacked

    op_type = _OP[cell]
    if getattr(desc, "reset_gate_first", False) or getattr(desc, "flip_z", False) or \
            getattr(desc, "forget_gate_last", False):
        raise Unsupported("gate order or flip_z: ONNX has one")
    if cell == "single_gate":
        acts = [_name(desc.activation)]
    elif cell == "gru":
        if desc.update_gate_activation != desc.reset_gate_activation:
            raise Unsupported("GRU: ONNX has one function for both gates")
        acts = [_name(desc.update_gate_activation), _name(desc.output_gate_activation)]
    else:
        gates = {desc.input_gate_activation, desc.forget_gate_activation, desc.output_gate_activation}
        if len(gates) != 1:
            raise Unsupported("LSTM: ONNX has one function for the three gates")
        acts = [_name(desc.input_gate_activation), _name(desc.cell_gate_activation),
                _name(desc.activation)]
    G, order = OP_TYPES[op_type][1], _inverse(OP_TYPES[op_type][2])
    D = 2 if desc.bidirectional else 1
    R = np.asarray(inputs["recurrent_weight"]).reshape(D, -1, inputs["recurrent_weight"].shape[-1])
    H = R.shape[-1]
    W = np.asarray(inputs["input_weight"]).reshape(D, G * H, -1)
    feeds = {"X": inputs["source"], "W": _permute_gates(W, order, H, axis=1),
             "R": _permute_gates(R, order, H, axis=1)}
    if "bias" in inputs or (cell == "gru" and desc.reset_after and "secondary_bias" in inputs):
        bias = np.asarray(inputs.get("bias", np.zeros(D * G * H)))
        Wb = _permute_gates(bias.reshape(D, G * H), order, H, axis=1)
        Rb = np.zeros_like(Wb)
        if cell == "gru" and desc.reset_after and "secondary_bias" in inputs:
            Rb[:, 2 * H:] = np.asarray(inputs["secondary_bias"]).reshape(D, H)
        feeds["B"] = np.concatenate([Wb, Rb], axis=1)
    for name, onnx in (("init_state", "initial_h"), ("init_cell", "initial_c")):
        if name in inputs:
            feeds[onnx] = sided_to_stacked(np.asarray(inputs[name]), D, H)
    if cell == "lstm" and ("initial_h" in feeds) != ("initial_c" in feeds):  # the node takes both
        given = feeds.get("initial_h", feeds.get("initial_c"))
        feeds.setdefault("initial_h", np.zeros_like(given))
        feeds.setdefault("initial_c", np.zeros_like(given))
    direction = "bidirectional" if D == 2 else ("reverse" if desc.reverse else "forward")
    attrs = {"activations": acts * D}
    if cell == "gru":
        attrs["linear_before_reset"] = int(desc.reset_after)
    node = build_node(op_type, direction=direction, hidden_size=H, has_bias="B" in feeds,
                      has_state="initial_h" in feeds, **attrs)
    return node, {k: np.ascontiguousarray(v, np.float32) for k, v in feeds.items()}


def _same_through_converter(node, feeds, inputs):
    """rnngrad.convert.onnx maps the node back to the problem's own arguments."""
    from rnngrad.convert.onnx import from_node

    layer = from_node(node, {k: v for k, v in feeds.items() if k in ("W", "R", "B")})
    pairs = [(layer.input_weight, inputs["input_weight"]), (layer.recurrent_weight, inputs["recurrent_weight"])]
    if "bias" in inputs:
        pairs.append((layer.bias, inputs["bias"]))
    for got, want in pairs:
        if not np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32)):
            raise AssertionError("rnngrad.convert.onnx does not map the node back to its arguments")


def forward_op(cell):
    """A candidate with the signature of rnngrad's forward op of ``cell``, run by onnxruntime."""
    import onnxruntime as ort

    def candidate(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
                  init_cell=None, mask=None, peephole=None, secondary_bias=None, descriptor=None):
        if mask is not None or peephole is not None or input_weight is None:
            raise Unsupported("mask, peephole, or no input weight: not in ONNX's nodes")
        inputs = {k: v for k, v in dict(source=source, recurrent_weight=recurrent_weight,
                                        input_weight=input_weight, bias=bias, init_state=init_state,
                                        init_cell=init_cell, secondary_bias=secondary_bias).items()
                  if v is not None}
        node, feeds = onnx_node(cell, inputs, descriptor)
        _same_through_converter(node, feeds, inputs)
        model = build_model(node, feeds, np.float32).SerializeToString()
        session = _SESSIONS.get(model) or ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        Y = session.run(["Y"], feeds)[0]  # [T,D,N,H]
        T, D, N, H = Y.shape
        h = Y.transpose(0, 2, 1, 3).reshape(T, N, D * H)
        if D == 1 and descriptor.reverse:  # ONNX aligns with input time; rnngrad's order is processing
            h = h[::-1]
        return [np.ascontiguousarray(h, source.dtype)]

    candidate.source = ("from verification.conformance_onnx import forward_op", f"forward_op({cell!r})")
    return candidate


def check_onnxruntime(cell, *, examples=None, seed=None) -> int:
    """check_backend of onnxruntime's forward op of ``cell`` (float32): problems checked."""
    op = {"single_gate": "single_gate_rnn", "gru": "gru", "lstm": "lstm"}[cell]
    knobs = {} if examples is None else {"max_examples": examples}
    fixed = {"training": False}
    sigmoid = rg.Activation.SIGMOID  # ONNX gives the gates one function: the draws keep them equal
    if cell == "gru":
        fixed.update(update_gate_activation=sigmoid, reset_gate_activation=sigmoid,
                     reset_gate_first=False, flip_z=False)
    if cell == "lstm":
        fixed.update(produce_cell=False, forget_gate_last=False, input_gate_activation=sigmoid,
                     forget_gate_activation=sigmoid, output_gate_activation=sigmoid)
    return check_backend(forward_op(cell), op, seed=seed, empty=False, descriptor=fixed,
                         optional={"mask": False, "peephole": False, "input_weight": True}, **knobs)
