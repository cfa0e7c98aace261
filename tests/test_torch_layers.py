"""rnngrad.torch.RNN / GRU / LSTM: converted from torch.nn they give PyTorch's outputs and
gradients (uni- and bidirectional, batch-first, with and without initial states, stacked);
with every MPSGraph option they compute rnngrad's op on the converters' parameter mapping
and pass gradcheck; PyTorch's conventions (initialisation, state dicts, dropout, unbatched
input) hold; wrong input is refused by name."""

import itertools

import numpy as np
import pytest

import rnngrad
from rnngrad.testing import compare_array

torch = pytest.importorskip("torch")
import rnngrad.torch as rt  # noqa: E402
import torch.nn.utils.prune  # noqa: E402
from rnngrad.convert import torch as convert  # noqa: E402
from rnngrad.torch import _layer as routes, _route  # noqa: E402

TORCH = {"RNN_TANH": lambda *a, **kw: torch.nn.RNN(*a, nonlinearity="tanh", **kw),
         "RNN_RELU": lambda *a, **kw: torch.nn.RNN(*a, nonlinearity="relu", **kw),
         "GRU": torch.nn.GRU, "LSTM": torch.nn.LSTM}
LAYERS = {"RNN_TANH": lambda *a, **kw: rt.RNN(*a, nonlinearity="tanh", **kw),
          "RNN_RELU": lambda *a, **kw: rt.RNN(*a, nonlinearity="relu", **kw),
          "GRU": rt.GRU, "LSTM": rt.LSTM}
#: PyTorch name → rnngrad quantity whose tolerance applies
KIND = {"output": "state", "h_n": "state", "c_n": "cell", "input": "source", "h_0": "init_state",
        "c_0": "init_cell", "weight_ih": "input_weight", "weight_hh": "recurrent_weight",
        "bias_ih": "bias", "bias_hh": "bias", "peephole": "peephole"}
FAST = [b for b in ("numba",) if b in rnngrad.available_backends()]


def _kind(name):
    name = name.removeprefix("parametrizations.")  # weight_norm's weight_hh_l0.original0
    return KIND[name.split("_l")[0] if name.startswith(("weight", "bias", "peephole")) else name]


def _run(module, x, hx, ups):
    """Outputs and gradients of ``Σ ups ⊙ (output, h_n[, c_n])``: {name: array}."""
    lstm = module.mode == "LSTM"
    for p in module.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    states = [] if hx is None else [t.detach().clone().requires_grad_() for t in
                                    (hx if lstm else (hx,))]
    output, state = module(x, (tuple(states) if lstm else states[0]) if states else None)
    outs = [output] + (list(state) if lstm else [state])
    torch.autograd.backward(outs, ups[:len(outs)])
    got = {"output": output, "h_n": outs[1], "input": x.grad}
    if lstm:
        got["c_n"] = outs[2]
    for name, t in zip(("h_0", "c_0"), states):
        got[name] = t.grad
    got.update({k: p.grad for k, p in module.named_parameters()})
    return {k: v.detach().numpy() for k, v in got.items()}


def _assert_close(got, want, dtype):
    assert set(got) == set(want)
    for name, value in want.items():
        ratio, mismatch = compare_array(_kind(name), got[name], value, dtype)
        assert mismatch is None, f"{name}: {mismatch}"


def _data(mode, module, T, N, batch_first, initial, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    D = 2 if module.bidirectional else 1
    L, H = module.num_layers, module.hidden_size
    x = torch.randn((N, T, module.input_size) if batch_first else (T, N, module.input_size),
                    generator=g, dtype=dtype)
    hx = None
    if initial:
        h0 = torch.randn(L * D, N, H, generator=g, dtype=dtype)
        hx = (h0, torch.randn(L * D, N, H, generator=g, dtype=dtype)) if mode == "LSTM" else h0
    shape_out = (N, T, D * H) if batch_first else (T, N, D * H)
    ups = [torch.randn(shape_out, generator=g, dtype=dtype),
           torch.randn(L * D, N, H, generator=g, dtype=dtype),
           torch.randn(L * D, N, H, generator=g, dtype=dtype)]
    return x, hx, ups


MATRIX = list(itertools.product(TORCH, (False, True), (False, True), (False, True), (1, 2)))


@pytest.mark.parametrize("mode,bidirectional,batch_first,initial,layers", MATRIX)
def test_converted_modules_give_pytorchs_outputs_and_gradients(mode, bidirectional, batch_first,
                                                               initial, layers):
    seed = MATRIX.index((mode, bidirectional, batch_first, initial, layers))
    torch.manual_seed(seed)
    module = TORCH[mode](3, 4, num_layers=layers, bidirectional=bidirectional,
                         batch_first=batch_first, dtype=torch.float64)
    x, hx, ups = _data(mode, module, T=5, N=2, batch_first=batch_first, initial=initial, seed=seed)
    want = _run(module, x, hx, ups)
    for backend in ["reference"] + FAST:
        layer = rt.from_torch(module, backend=backend)
        _assert_close(_run(layer, x, hx, ups), want, np.float64)


@pytest.mark.parametrize("mode", list(TORCH))
@pytest.mark.parametrize("backend", FAST)
def test_float32_on_a_fast_backend_matches_pytorch(mode, backend):
    torch.manual_seed(1)
    module = TORCH[mode](16, 32, num_layers=2, bidirectional=True, batch_first=True)
    x, hx, ups = _data(mode, module, T=20, N=8, batch_first=True, initial=True, seed=1,
                       dtype=torch.float32)
    _assert_close(_run(rt.from_torch(module, backend=backend), x, hx, ups),
                  _run(module, x, hx, ups), np.float32)


@pytest.mark.parametrize("mode", list(TORCH))
@pytest.mark.parametrize("backend", ["reference"] + FAST)
def test_parametrized_and_pruned_parameters_as_pytorch(mode, backend):
    # weight_norm and pruning put in a parameter's place what they compute from their own
    # parameters; the gradients reach those
    torch.manual_seed(3)
    module = TORCH[mode](3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    layer = rt.from_torch(module, backend=backend)
    for m in (module, layer):
        torch.nn.utils.parametrizations.weight_norm(m, name="weight_hh_l0")
        torch.nn.utils.prune.l1_unstructured(m, name="weight_ih_l1_reverse", amount=0.5)
    x, hx, ups = _data(mode, module, T=5, N=2, batch_first=False, initial=True, seed=3)
    want = _run(module, x, hx, ups)
    assert "parametrizations.weight_hh_l0.original0" in want and "weight_ih_l1_reverse_orig" in want
    _assert_close(_run(layer, x, hx, ups), want, np.float64)


def test_a_parametrization_is_evaluated_once_a_call():
    # torch.nn's layers evaluate it twice (spectral_norm's power iteration then advances twice)
    calls = []

    class Counted(torch.nn.Module):
        def forward(self, w):
            calls.append(1)
            return w

    layer = rt.LSTM(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    torch.nn.utils.parametrize.register_parametrization(layer, "weight_hh_l1", Counted())
    calls.clear()  # registering evaluates it once
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    layer(x)[0].sum().backward()
    with torch.no_grad():
        layer(x)
    assert len(calls) == 2


@pytest.mark.parametrize("mode", list(TORCH))
def test_same_seed_same_initial_parameters_and_state_dict(mode):
    kw = dict(num_layers=2, bidirectional=True, bias=True)
    torch.manual_seed(7)
    module = TORCH[mode](3, 5, **kw)
    torch.manual_seed(7)
    layer = LAYERS[mode](3, 5, **kw)
    assert list(layer.state_dict()) == list(module.state_dict())
    for (name, a), (_, b) in zip(module.state_dict().items(), layer.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert [p.shape for p in layer.all_weights[3]] == [p.shape for p in module.all_weights[3]]


def test_dropout_between_layers_as_pytorch():
    torch.manual_seed(0)
    module = torch.nn.LSTM(3, 4, num_layers=3, dropout=0.5, dtype=torch.float64)
    layer = rt.from_torch(module, backend="reference")
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    torch.manual_seed(11)
    want = module(x)[0]
    torch.manual_seed(11)
    got = layer(x)[0]
    torch.testing.assert_close(got, want)  # the same masks: PyTorch draws them as F.dropout does
    module.eval(), layer.eval()
    torch.testing.assert_close(layer(x)[0], module(x)[0])
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        rt.GRU(3, 4, dropout=0.2)


def test_unbatched_input_as_pytorch():
    torch.manual_seed(0)
    module = torch.nn.GRU(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    layer = rt.from_torch(module, backend="reference")
    x, h0 = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    (a, ha), (b, hb) = module(x, h0), layer(x, h0)
    assert b.shape == a.shape and hb.shape == ha.shape
    torch.testing.assert_close(b, a)
    torch.testing.assert_close(hb, ha)


# -- MPSGraph's options ----------------------------------------------------------------------

OPTIONS = [
    ("RNN", dict(nonlinearity="sigmoid")), ("RNN", dict(nonlinearity="hard_sigmoid")),
    ("RNN", dict(nonlinearity="none", reverse=True)),
    ("GRU", dict(reset_gate_first=False)), ("GRU", dict(reset_after=False)),
    ("GRU", dict(flip_z=True, bidirectional=True)),
    ("GRU", dict(secondary_bias=False)),
    ("GRU", dict(update_gate_activation="hard_sigmoid", reset_gate_activation="sigmoid",
                 output_gate_activation="relu", reset_after=False, reset_gate_first=False)),
    ("LSTM", dict(peephole=True)), ("LSTM", dict(forget_gate_last=True, bidirectional=True)),
    ("LSTM", dict(peephole=True, bidirectional=True, reverse=False, activation="hard_sigmoid",
                  input_gate_activation="hard_sigmoid", cell_gate_activation="none")),
    ("LSTM", dict(output_gate_activation="tanh", forget_gate_activation="relu", reverse=True)),
]
CLASSES = {"RNN": rt.RNN, "GRU": rt.GRU, "LSTM": rt.LSTM}


def _option_id(case):
    return case[0] + "-" + "-".join(f"{k}={v}" for k, v in case[1].items())


def _layer(name, options, seed, **kw):
    torch.manual_seed(seed)
    layer = CLASSES[name](2, 3, dtype=torch.float64, backend="reference", **kw, **options)
    with torch.no_grad():  # larger than the default initialisation, so every gate matters
        for p in layer.parameters():
            p.normal_(0.0, 0.7)
    return layer


@pytest.mark.parametrize("case", OPTIONS, ids=_option_id)
def test_each_option_is_the_contract_op_on_the_converters_mapping(case):
    """The layer's op arguments are those of rnngrad.convert.torch for its parameters (GRU
    ``secondary_bias=False``: b_hn added to the candidate's bias instead), with its
    descriptor; the output is the op's, by rnngrad's reference."""
    name, options = case
    layer = _layer(name, options, seed=OPTIONS.index(case))
    g = torch.Generator().manual_seed(2)
    D, H = layer.num_directions, layer.hidden_size
    x = torch.randn(4, 2, 2, generator=g, dtype=torch.float64)
    h0 = torch.randn(D, 2, H, generator=g, dtype=torch.float64)
    hx = (h0, torch.randn(D, 2, H, generator=g, dtype=torch.float64)) if name == "LSTM" else h0
    mask = (torch.rand(2, D * H, generator=g) > 0.4).double()
    output, state = layer(x, hx, mask=mask)

    mode = {"RNN": "RNN_TANH", "GRU": "GRU", "LSTM": "LSTM"}[name]
    params = {k: v for k, v in layer.state_dict().items() if not k.startswith("peephole")}
    spec = convert.from_state_dict(mode, params)
    args = spec.arguments(x.numpy(), tuple(t.numpy() for t in hx) if name == "LSTM" else hx.numpy())
    if name == "GRU" and not layer.secondary_bias:
        b_hn = args.pop("secondary_bias").reshape(D, H)
        args["bias"] = args["bias"] + np.concatenate(
            [np.concatenate([np.zeros(2 * H), b]) for b in b_hn])
    if name == "LSTM" and layer.peephole:
        p = [layer.state_dict()[f"peephole_l0{s}"].numpy() for s in ("", "_reverse")[:D]]
        args["peephole"] = p[0] if D == 1 else np.stack(p)
    args["mask"] = mask.numpy()
    desc = layer.descriptor
    if name == "LSTM":
        import dataclasses
        want = rnngrad.lstm(**args, descriptor=dataclasses.replace(desc, produce_cell=True),
                            backend="reference")
    else:
        want = {"RNN": rnngrad.single_gate_rnn, "GRU": rnngrad.gru}[name](
            **args, descriptor=desc, backend="reference")
    assert compare_array("state", output.detach().numpy(), want.state, np.float64)[1] is None
    h_n = state[0] if name == "LSTM" else state
    last = want.state[-1] if D == 1 else None
    if D == 1:
        assert compare_array("state", h_n[0].detach().numpy(), last, np.float64)[1] is None


@pytest.mark.parametrize("case", OPTIONS + [
    ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True)),
    ("LSTM", dict(num_layers=2, peephole=True, batch_first=True)),
    ("RNN", dict(num_layers=2, bidirectional=True, nonlinearity="tanh", bias=False))],
    ids=_option_id)
@pytest.mark.parametrize("masked", [False, True])
def test_gradcheck_each_layer_and_option(case, masked):
    name, options = case
    layer = _layer(name, options, seed=3)
    names = [k for k, _ in layer.named_parameters()]
    g = torch.Generator().manual_seed(4)
    D, L, H = layer.num_directions, layer.num_layers, layer.hidden_size
    T, N = 3, 2
    x = torch.randn((N, T, 2) if layer.batch_first else (T, N, 2), generator=g,
                    dtype=torch.float64, requires_grad=True)
    states = [torch.randn(L * D, N, H, generator=g, dtype=torch.float64, requires_grad=True)
              for _ in range(2 if name == "LSTM" else 1)]
    mask = None
    if masked:
        shape = (N, T, D * H) if layer.batch_first else (T, N, D * H)
        mask = (torch.rand(shape, generator=g) > 0.3).double()

    def f(x, *rest):
        params, hx = dict(zip(names, rest[:len(names)])), rest[len(names):]
        out, state = torch.func.functional_call(
            layer, params, (x, tuple(hx) if name == "LSTM" else hx[0]), {"mask": mask})
        return (out,) + (tuple(state) if name == "LSTM" else (state,))
    inputs = (x,) + tuple(p.detach().clone().requires_grad_() for p in layer.parameters()) \
        + tuple(states)
    assert torch.autograd.gradcheck(f, inputs)


def test_a_mask_of_ones_and_a_per_step_batch_first_mask():
    layer = _layer("GRU", dict(bidirectional=True, batch_first=True), seed=5)
    x = torch.randn(2, 4, 2, dtype=torch.float64)
    ones = torch.ones(2, 6, dtype=torch.bool)
    torch.testing.assert_close(layer(x, mask=ones)[0], layer(x)[0], rtol=0, atol=0)
    m = (torch.rand(2, 4, 6) > 0.5).double()  # [N,T,DH], as the input
    time_major = _layer("GRU", dict(bidirectional=True), seed=5)
    torch.testing.assert_close(layer(x, mask=m)[0],
                               time_major(x.transpose(0, 1), mask=m.transpose(0, 1))[0].transpose(0, 1))


@pytest.mark.parametrize("case", [("RNN", dict(nonlinearity="relu", num_layers=2)),
                                  ("GRU", dict(bidirectional=True)),
                                  ("LSTM", dict(forget_gate_last=True, num_layers=2,
                                                bidirectional=True))], ids=_option_id)
def test_to_torch_computes_what_the_layer_computes(case):
    name, options = case
    layer = _layer(name, options, seed=6, batch_first=True)
    module = layer.to_torch()
    assert type(module) is getattr(torch.nn, name) and module.batch_first
    x = torch.randn(2, 5, 2, dtype=torch.float64)
    for a, b in zip(torch.nn.utils.parameters_to_vector(module.parameters()).shape,
                    torch.nn.utils.parameters_to_vector(layer.parameters()).shape):
        assert a == b
    got, want = layer(x), module(x)
    torch.testing.assert_close(got[0], want[0])
    back = rt.from_torch(module, backend="reference")
    torch.testing.assert_close(back(x)[0], want[0])


@pytest.mark.parametrize("case,match", [
    (("RNN", dict(nonlinearity="sigmoid")), "nonlinearity='sigmoid'"),
    (("GRU", dict(flip_z=True)), "flip_z=True"),
    (("GRU", dict(reset_after=False)), "reset_after=False"),
    (("LSTM", dict(peephole=True)), "peephole=True"),
    (("LSTM", dict(activation="relu")), "activation='relu'"),
    (("GRU", dict(reverse=True)), "reverse=True"),
])
def test_to_torch_refuses_what_pytorch_lacks(case, match):
    layer = _layer(*case, seed=0)
    with pytest.raises(ValueError, match=f"to_torch: torch.nn.{case[0]} has no equivalent of .*{match}"):
        layer.to_torch()


def test_from_torch_refuses_what_rnngrad_lacks():
    with pytest.raises(ValueError, match="proj_size"):
        rt.from_torch(torch.nn.LSTM(3, 4, proj_size=2))
    with pytest.raises(ValueError, match="expected torch.nn.RNN, GRU or LSTM"):
        rt.from_torch(torch.nn.Linear(3, 4))
    with pytest.raises(ValueError, match="expected a torch.nn.GRU, got LSTM"):
        rt.GRU.from_torch(torch.nn.LSTM(3, 4))


def test_wrong_input_is_refused_by_name():
    layer = rt.LSTM(3, 4, num_layers=2)
    x = torch.zeros(5, 2, 3)
    with pytest.raises(ValueError, match=r"input: expected the last dimension to be input_size=3"):
        layer(torch.zeros(5, 2, 4))
    with pytest.raises(TypeError, match=r"input: expected dtype torch.float32 \(the parameters'\)"):
        layer(x.double())
    with pytest.raises(ValueError, match=r"h_0: expected shape \(2, 2, 4\)"):
        layer(x, (torch.zeros(1, 2, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(ValueError, match=r"hx: expected \(h_0, c_0\) for an LSTM"):
        layer(x, torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="input: expected a 3-D"):
        layer(torch.zeros(5))
    with pytest.raises(ValueError, match="proj_size"):
        rt.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="reverse: MPSGraph ignores reverse when bidirectional"):
        rt.GRU(3, 4, bidirectional=True, reverse=True)
    with pytest.raises(ValueError, match="secondary_bias: MPSGraph reads the secondary bias only"):
        rt.GRU(3, 4, reset_after=False, secondary_bias=True)
    with pytest.raises(ValueError, match="secondary_bias: .* needs bias=True"):
        rt.GRU(3, 4, bias=False, secondary_bias=True)
    with pytest.raises(ValueError, match="nonlinearity: expected"):
        rt.RNN(3, 4, nonlinearity="gelu")
    with pytest.raises(ValueError, match="hidden_size: expected an int ≥ 1, got 0"):
        rt.GRU(3, 0)
    with pytest.raises(ValueError, match=r"dropout: expected a number in \[0, 1\]"):
        rt.GRU(3, 4, dropout=1.5)


# -- the one-node route: one autograd node a layer (rnngrad.torch._layer) ---------------------

EAGER_CASES = OPTIONS + [
    ("GRU", dict(num_layers=2, bidirectional=True, batch_first=True)),
    ("LSTM", dict(num_layers=2, bidirectional=True)),
    ("RNN", dict(bias=False, bidirectional=True)), ("LSTM", dict(bias=False, peephole=True))]


def _step(layer, x, hx, ups, mask=None):
    """Outputs and gradients of Σ ups ⊙ (output, h_n[, c_n]): {name: tensor}."""
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(x.requires_grad)
    states = [t.detach().clone().requires_grad_() for t in hx]
    output, state = layer(x, tuple(states) if len(states) == 2 else states[0], mask=mask)
    outs = [output] + (list(state) if len(states) == 2 else [state])
    torch.autograd.backward(outs, ups[:len(outs)])
    got = {"output": output.detach(), "h_n": outs[1].detach(), "input": x.grad,
           **{f"state{i}": t.grad for i, t in enumerate(states)}}
    got.update({k: p.grad for k, p in layer.named_parameters()})
    return got


def _cuda_ready():
    return torch.cuda.is_available() and rt.CUDA_BACKEND in rnngrad.available_backends()


ON_CUDA = pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not _cuda_ready(),
                                        reason="needs a CUDA device and the metal-cuda backend")])


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize("case", EAGER_CASES, ids=_option_id)
@pytest.mark.parametrize("input_grad, mask", [(False, None), (True, None), (True, "shared"),
                                              (False, "per step")])
def test_the_one_node_route_gives_what_the_general_route_gives(case, input_grad, mask, device,
                                                                  monkeypatch):
    """One node a layer, the bias sum and the directions' concatenations made inside it,
    computes bit for bit the outputs and gradients of the op's autograd.Function on
    op_parameters (whose results are checked against torch.nn above); without the input's
    gradient the op runs without the input weight on both. On the CPU in float64 (the
    reference backend), on CUDA in float32 (metal-cuda: CuPy views, the same kernels)."""
    name, options = case
    layer = _layer(name, options, seed=8)
    dtype = torch.float64 if device == "cpu" else torch.float32
    if device == "cuda":
        layer = layer.to(device, dtype)
        layer.backend = None
    g = torch.Generator().manual_seed(9)
    D, L, H = layer.num_directions, layer.num_layers, layer.hidden_size
    T, N = 4, 3
    x = torch.randn((N, T, 2) if layer.batch_first else (T, N, 2), generator=g,
                    dtype=torch.float64).to(device, dtype).requires_grad_(input_grad)
    hx = [torch.randn(L * D, N, H, generator=g, dtype=torch.float64).to(device, dtype)
          for _ in range(2 if name == "LSTM" else 1)]
    ups = [torch.randn(((N, T) if layer.batch_first else (T, N)) + (D * H,), generator=g,
                       dtype=torch.float64)] + \
        [torch.randn(L * D, N, H, generator=g, dtype=torch.float64) for _ in range(2)]
    ups = [u.to(device, dtype) for u in ups]
    if mask is not None:  # [N,DH], or per step [T,N,DH] ([N,T,DH] batch-first)
        shape = (N, D * H) if mask == "shared" else ((N, T) if layer.batch_first else (T, N)) \
            + (D * H,)
        mask = (torch.rand(shape, generator=g) > 0.3).to(device, dtype)
    calls = []
    forward = routes._forward
    monkeypatch.setattr(routes, "_forward", lambda *a: calls.append(1) or forward(*a))
    got = _step(layer, x, hx, ups, mask)
    assert len(calls) == L  # the one-node route ran, one call a layer
    monkeypatch.setattr(_route, "one_node", lambda *a: False)
    want = _step(layer, x, hx, ups, mask)
    assert len(calls) == L and set(got) == set(want)
    for key, value in want.items():
        if value is None:
            assert got[key] is None, key
        else:
            torch.testing.assert_close(got[key], value, rtol=0, atol=0, msg=key)


def test_the_one_node_route_refuses_a_gradient_of_a_gradient():
    layer = _layer("LSTM", dict(bidirectional=True), seed=10)
    x = torch.randn(3, 2, 2, dtype=torch.float64)
    (first,) = torch.autograd.grad(layer(x)[0].sum(), layer.weight_hh_l0, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        first.sum().backward()
    for p in layer.parameters():  # only the biases learn: no saved tensor needs a gradient
        p.requires_grad_(p is layer.bias_ih_l0)
    (first,) = torch.autograd.grad(layer(x)[0].sum(), layer.bias_ih_l0, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        first.sum().backward()


def test_a_weight_changed_in_place_before_the_backward_is_refused_as_by_pytorch():
    layer = _layer("GRU", {}, seed=11)
    output, _ = layer(torch.randn(3, 2, 2, dtype=torch.float64))
    with torch.no_grad():
        layer.weight_hh_l0.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        output.sum().backward()


def test_parameters_updated_or_replaced_between_calls_are_read_anew():
    """In-place updates (an optimiser's) and new tensors (``p.data = …``, ``.double()``) reach
    the op, as torch.nn's module sees them."""
    torch.manual_seed(12)
    module = torch.nn.LSTM(2, 3, bidirectional=True)
    layer = rt.from_torch(module, backend="reference")
    x = torch.randn(4, 2, 2)

    def check():
        for a, b in zip(torch.utils._pytree.tree_leaves(layer(x)),
                        torch.utils._pytree.tree_leaves(module(x))):
            compare = compare_array("state", a.detach().numpy(), b.detach().numpy(),
                                    np.float32 if a.dtype == torch.float32 else np.float64)
            assert compare[1] is None, compare[1]
    check()
    for opt in (torch.optim.SGD(module.parameters(), lr=0.5),
                torch.optim.SGD(layer.parameters(), lr=0.5)):
        for p in opt.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        opt.step()
    check()
    with torch.no_grad():
        for m in (module, layer):
            m.weight_hh_l0.data = (m.weight_hh_l0.data * 1.5).t().contiguous().t()  # strides too  # same values, strides
            m.bias_ih_l0_reverse.data = torch.full_like(m.bias_ih_l0_reverse, 0.25)
    check()
    module, layer, x = module.double(), layer.double(), x.double()
    check()


def test_a_saved_or_copied_layer_carries_no_views_of_its_parameters():
    import copy
    import io
    layer = rt.GRU(2, 3)
    layer(torch.randn(4, 1, 2))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(layer), torch.load(buffer, weights_only=False)):
        assert "_array_views" not in vars(other)
        torch.testing.assert_close(other(torch.ones(4, 1, 2))[0], layer(torch.ones(4, 1, 2))[0])
