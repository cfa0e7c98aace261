"""rnngrad.mlx: the custom functions' vjps equal finite differences in float64 for every cell and
a spread of options; layers converted from mlx.nn give MLX's outputs and parameter gradients
within the tolerance table; MLX's initialisation; each MPSGraph option is rnngrad's op."""

import numpy as np
import pytest

import rnngrad
from rnngrad.testing import compare_array

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")
import rnngrad.mlx as rm  # noqa: E402
from rnngrad.mlx import functions  # noqa: E402

G = {"single_gate": 1, "gru": 3, "lstm": 4}
FUNCTIONS = {"single_gate": rm.single_gate_rnn, "gru": rm.gru, "lstm": rm.lstm}
DESCRIPTORS = {"single_gate": rnngrad.SingleGateRNNDescriptor, "gru": rnngrad.GRUDescriptor,
               "lstm": rnngrad.LSTMDescriptor}
CASES = [("single_gate", dict(activation="tanh")), ("single_gate", dict(activation="sigmoid",
                                                                         bidirectional=True)),
         ("gru", dict()), ("gru", dict(reset_after=True, reset_gate_first=True, bidirectional=True)),
         ("gru", dict(flip_z=True, reverse=True, update_gate_activation="hard_sigmoid")),
         ("lstm", dict()), ("lstm", dict(bidirectional=True, forget_gate_last=True)),
         ("lstm", dict(reverse=True, activation="sigmoid", cell_gate_activation="none"))]


def f64(a):
    return mx.array(np.asarray(a, np.float64), dtype=mx.float64)


def _arguments(cell, desc, rng, T=3, N=2, I=3, H=2):
    D = 2 if desc.bidirectional else 1
    GH = G[cell] * H
    args = dict(source=rng.standard_normal((T, N, I)),
                recurrent_weight=0.6 * rng.standard_normal(((2,) if D == 2 else ()) + (GH, H)),
                input_weight=0.6 * rng.standard_normal((D * GH, I)),
                bias=0.6 * rng.standard_normal(D * GH), init_state=rng.standard_normal((N, D * H)))
    if cell == "lstm":
        args["init_cell"] = rng.standard_normal((N, D * H))
        args["peephole"] = 0.6 * rng.standard_normal((D, 4 * H) if D == 2 else (4 * H,))
    if cell == "gru":
        args["secondary_bias"] = 0.6 * rng.standard_normal(D * H)
    return args


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0] + "-" + "-".join(f"{k}={v}" for k, v in c[1].items()))
def test_vjp_equals_finite_differences(case):
    """d/dε L(args + ε·v) at 0 by central differences equals Σ ⟨∇L, v⟩ from the vjp, for L a
    fixed weighting of every output (h, final h, and c, final c)."""
    cell, options = case
    desc = DESCRIPTORS[cell](**options)
    rng = np.random.default_rng(CASES.index(case))
    args = _arguments(cell, desc, rng)
    names = list(args)

    def loss(*arrays):
        out = FUNCTIONS[cell](**dict(zip(names, arrays)), descriptor=desc, backend="reference")
        return sum((o * f64(np.cos(np.arange(o.size)).reshape(o.shape))).sum() for o in out)
    grads = mx.grad(loss, argnums=tuple(range(len(names))))(*map(f64, args.values()))
    assert all(g.dtype == mx.float64 for g in grads)
    directions = [rng.standard_normal(np.shape(a)) for a in args.values()]
    eps = 1e-6
    plus = loss(*[f64(a + eps * d) for a, d in zip(args.values(), directions)]).item()
    minus = loss(*[f64(a - eps * d) for a, d in zip(args.values(), directions)]).item()
    numeric = (plus - minus) / (2 * eps)
    analytic = sum(float((np.array(g) * d).sum()) for g, d in zip(grads, directions))
    # central differences in float64 with ε = 1e-6: about 1e-9 relative; the table's float32
    # state tolerance bounds that from above
    assert compare_array("source", np.array([analytic]), np.array([numeric]), np.float32)[1] is None


def _loss(kind, x, states):
    def loss(model):
        out = model(x, *states)
        out = out[0] + 0.5 * out[1] if kind == "LSTM" else out
        return (out * mx.cos(mx.arange(out.size).reshape(out.shape))).sum()
    return loss


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("batched,initial", [(True, True), (True, False), (False, True)])
def test_converted_modules_give_mlxs_outputs_and_gradients(kind, batched, initial):
    mx.random.seed(1)
    module = getattr(nn, kind)(3, 5)
    layer = rm.from_mlx(module)
    x = mx.random.normal((2, 4, 3) if batched else (4, 3))
    states = []
    if initial:
        states = [mx.random.normal((2, 5) if batched else (5,))
                  for _ in range(2 if kind == "LSTM" else 1)]
    loss = _loss(kind, x, states)
    la, ga = nn.value_and_grad(module, loss)(module)
    lb, gb = nn.value_and_grad(layer, loss)(layer)
    want, got = dict(nn.utils.tree_flatten(ga)), dict(nn.utils.tree_flatten(gb))
    assert set(want) == set(got)
    quantity = {"Wx": "input_weight", "Wxh": "input_weight", "Wh": "recurrent_weight",
                "Whh": "recurrent_weight", "b": "bias", "bias": "bias", "bhn": "secondary_bias"}
    for name, value in want.items():
        ratio, mismatch = compare_array(quantity[name], np.array(got[name]), np.array(value),
                                        np.float32)
        assert mismatch is None, f"{name}: {mismatch}"
    assert compare_array("state", np.array([lb.item()]), np.array([la.item()]), np.float32)[1] is None
    out_a, out_b = module(x, *states), layer(x, *states)
    for a, b in zip(out_a if kind == "LSTM" else [out_a], out_b if kind == "LSTM" else [out_b]):
        assert a.shape == b.shape
        assert compare_array("state", np.array(b), np.array(a), np.float32)[1] is None


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_same_seed_same_initial_parameters(kind):
    mx.random.seed(5)
    module = getattr(nn, kind)(3, 4)
    mx.random.seed(5)
    layer = getattr(rm, kind)(3, 4)
    a, b = nn.utils.tree_flatten(module.parameters()), nn.utils.tree_flatten(layer.parameters())
    assert [k for k, _ in a] == [k for k, _ in b]
    for (name, x), (_, y) in zip(a, b):
        np.testing.assert_array_equal(np.array(x), np.array(y), err_msg=name)


@pytest.mark.parametrize("kind,options", [
    ("RNN", dict(nonlinearity="hard_sigmoid", reverse=True)),
    ("GRU", dict(flip_z=True, reset_gate_first=False, reset_after=False)),
    ("LSTM", dict(peephole=True, forget_gate_last=True, activation="relu"))])
def test_options_are_the_contract_op(kind, options):
    mx.random.seed(2)
    layer = getattr(rm, kind)(3, 4, backend="reference", **options)
    x, h0 = mx.random.normal((2, 5, 3)), mx.random.normal((2, 4))
    mask = (mx.random.uniform(shape=(2, 4)) > 0.3).astype(mx.float32)
    states = [h0, mx.random.normal((2, 4))] if kind == "LSTM" else [h0]
    out = layer(x, *states, mask=mask)
    p = {k: np.array(v) for k, v in nn.utils.tree_flatten(layer.parameters())}
    names = {"RNN": ("Wxh", "Whh", "bias"), "GRU": ("Wx", "Wh", "b"), "LSTM": ("Wx", "Wh", "bias")}[kind]
    args = dict(source=np.array(x).swapaxes(0, 1), input_weight=p[names[0]],
                recurrent_weight=p[names[1]], bias=p[names[2]], init_state=np.array(h0),
                mask=np.array(mask))
    if kind == "LSTM":
        import dataclasses
        args.update(init_cell=np.array(states[1]), peephole=p["peephole"])
        want = rnngrad.lstm(**args, descriptor=dataclasses.replace(layer.descriptor, produce_cell=True),
                            backend="reference")
        got = out[0]
    else:
        want = {"RNN": rnngrad.single_gate_rnn, "GRU": rnngrad.gru}[kind](
            **args, descriptor=layer.descriptor, backend="reference")
        got = out
    assert compare_array("state", np.array(got).swapaxes(0, 1), want.state, np.float32)[1] is None


def test_wrong_input_is_refused_by_name():
    layer = rm.GRU(3, 4)
    with pytest.raises(ValueError, match="x: expected the last dimension to be input_size=3"):
        layer(mx.zeros((2, 5, 4)))
    with pytest.raises(ValueError, match=r"hidden: expected shape \(2, 4\)"):
        layer(mx.zeros((2, 5, 3)), mx.zeros((3, 4)))
    with pytest.raises(TypeError, match="recurrent_weight: expected an mx.array"):
        rm.gru(mx.zeros((5, 2, 6)), np.zeros((6, 2)))
    with pytest.raises(ValueError, match="secondary_bias: MPSGraph reads the secondary bias only"):
        rm.GRU(3, 4, reset_after=False, secondary_bias=True)
    with pytest.raises(ValueError, match="nonlinearity: expected"):
        rm.RNN(3, 4, nonlinearity=lambda v: v)
    with pytest.raises(ValueError, match="module: expected mlx.nn.RNN, GRU or LSTM"):
        rm.from_mlx(nn.Linear(3, 4))
