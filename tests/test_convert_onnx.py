"""rnngrad.convert.onnx: forward equals onnxruntime, gradients equal central differences of
ONNX's own reference implementation, and what cannot map is refused with a clear error."""

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the verification/ package

from rnngrad.convert import onnx as rgo  # noqa: E402
from verification import check_onnx  # noqa: E402

CONFIGS = {label: (op, attrs, options) for label, op, attrs, options in check_onnx.CONFIGURATIONS}


@pytest.mark.parametrize("direction", check_onnx.DIRECTIONS)
@pytest.mark.parametrize("label", list(CONFIGS))
def test_forward_equals_onnxruntime(label, direction):
    op, attrs, options = CONFIGS[label]
    comparisons = check_onnx.check_forward(op, attrs, options, direction=direction, layout=0,
                                           rng=np.random.default_rng(zlib.crc32(f"{label} {direction}".encode())))
    assert comparisons and all(c.passed for c in comparisons), [c.detail for c in comparisons if not c.passed]


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", check_onnx.DIRECTIONS)
@pytest.mark.parametrize("label", ["GRU linear_before_reset=0", "GRU linear_before_reset=1",
                                   "LSTM peepholes (Po=0)", "RNN Tanh"])
def test_gradients_equal_finite_differences_of_onnx_reference(label, direction, layout):
    """Includes P's output block: ONNX's dL/dPo (Po reads c[t]) from the second gradient call."""
    op, attrs, options = CONFIGS[label]
    comparisons = check_onnx.check_gradients(op, attrs, options, direction=direction, layout=layout,
                                             rng=np.random.default_rng(layout + 7))
    assert all(c.passed for c in comparisons), [c.detail for c in comparisons if not c.passed]


def _weights(op="LSTM", D=1, H=2, I=3, G=4, rng=None):
    rng = rng or np.random.default_rng(0)
    return (rng.standard_normal((D, G * H, I)), rng.standard_normal((D, G * H, H)),
            rng.standard_normal((D, 2 * G * H)))


def test_lstm_gate_order_and_peephole_layout():
    H = 2
    W, R, B = _weights(H=H)
    P = np.concatenate([np.full((1, H), 1.0), np.zeros((1, H)), np.full((1, H), 3.0)], axis=1)
    layer = rgo.from_arrays("LSTM", W, R, B, P)
    blocks = np.split(W[0], 4)  # ONNX i, o, f, c
    expected = np.concatenate([blocks[0], blocks[2], blocks[3], blocks[1]])  # rnngrad i, f, z, o
    np.testing.assert_array_equal(layer.input_weight, expected)
    np.testing.assert_array_equal(layer.peephole, [1, 1, 3, 3, 0, 0, 0, 0])


def test_gru_recurrent_bias_placement():
    H = 2
    W, R, B = _weights("GRU", H=H, G=3)
    plain = rgo.from_arrays("GRU", W, R, B, linear_before_reset=0)
    linear = rgo.from_arrays("GRU", W, R, B, linear_before_reset=1)
    Wb, Rb = B[0, :3 * H], B[0, 3 * H:]
    np.testing.assert_array_equal(plain.bias, Wb + Rb)
    assert plain.secondary_bias is None and not plain.descriptor.reset_after
    np.testing.assert_array_equal(linear.bias[2 * H:], Wb[2 * H:])
    np.testing.assert_array_equal(linear.secondary_bias, Rb[2 * H:])
    assert linear.descriptor.reset_after and not linear.descriptor.flip_z


def test_layout_one_is_layout_zero_transposed():
    rng = np.random.default_rng(4)
    W, R, B = _weights(D=2, rng=rng)
    x = rng.standard_normal((5, 3, 3))
    h0 = rng.standard_normal((2, 3, 2))
    Y0, Yh0, Yc0 = rgo.from_arrays("LSTM", W, R, B, direction="bidirectional").forward(x, h0, h0, backend="reference")
    Y1, Yh1, Yc1 = rgo.from_arrays("LSTM", W, R, B, direction="bidirectional", layout=1).forward(
        x.transpose(1, 0, 2), h0.transpose(1, 0, 2), h0.transpose(1, 0, 2), backend="reference")
    np.testing.assert_array_equal(Y1, Y0.transpose(2, 0, 1, 3))
    np.testing.assert_array_equal(Yh1, Yh0.transpose(1, 0, 2))
    np.testing.assert_array_equal(Yc1, Yc0.transpose(1, 0, 2))


def test_nonzero_output_peephole_is_refused():
    W, R, B = _weights()
    P = np.zeros((1, 6))
    P[0, 2] = 0.5  # Po
    with pytest.raises(ValueError, match="output peephole Po .* must be zero.*c\\[t\\]"):
        rgo.from_arrays("LSTM", W, R, B, P)


@pytest.mark.parametrize("kwargs,match", [
    (dict(clip=1.0), "clip"),
    (dict(input_forget=1), "input_forget"),
    (dict(activations=["Sigmoid", "Tanh", "Softsign"]), "activations"),
    (dict(activations=["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Tanh"], direction="bidirectional"),
     "both directions"),
    (dict(activation_alpha=[0.1]), "activation_alpha"),
    (dict(direction="sideways"), "direction"),
    (dict(hidden_size=3), "hidden_size"),
])
def test_unsupported_attributes_are_refused(kwargs, match):
    D = 2 if kwargs.get("direction") == "bidirectional" else 1
    W, R, B = _weights(D=D)
    with pytest.raises(ValueError, match=match):
        rgo.from_arrays("LSTM", W, R, B, **kwargs)


def test_from_node_refuses_sequence_lens():
    from onnx import helper

    node = helper.make_node("GRU", ["X", "W", "R", "", "lens"], ["Y"], hidden_size=2)
    W, R, B = _weights("GRU", G=3)
    with pytest.raises(ValueError, match="sequence_lens"):
        rgo.from_node(node, {"W": W, "R": R})
