"""rnngrad.torch's operators (``torch.ops.rnngrad.*``) as PyTorch's machinery sees them:
``torch.library.opcheck`` on every forward and backward operator, ``torch.compile`` (default and
``fullgraph=True``) in a fresh process equal to eager (and in process with nothing to
differentiate), ``torch.export`` of a model with a layer, ``torch.func.grad`` equal to autograd,
``torch.func.vmap`` (per-sample gradients and ``jacrev`` against ``torch.nn``, an ensemble against
each model alone), and a forward on the meta device with shapes only."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import rnngrad

torch = pytest.importorskip("torch")
import rnngrad.torch as rt  # noqa: E402
from rnngrad.torch import functions, ops  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = {"single_gate": 1, "gru": 3, "lstm": 4}
DESCRIPTORS = {"single_gate": rnngrad.SingleGateRNNDescriptor(activation="tanh"),
               "gru": rnngrad.GRUDescriptor(reset_after=True, bidirectional=True),
               "lstm": rnngrad.LSTMDescriptor(bidirectional=True)}
LAYERS = {"RNN": rt.RNN, "GRU": rt.GRU, "LSTM": rt.LSTM}


def _inputs(cell, T=3, N=2, I=2, H=3, seed=0):
    """Every argument of ``cell``'s forward operator, float64, needing gradients (not the mask)."""
    desc = DESCRIPTORS[cell]
    D = 2 if desc.bidirectional else 1
    g = torch.Generator().manual_seed(seed)
    def rand(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    GH = G[cell] * H
    given = dict(source=rand(T, N, I), recurrent_weight=rand(GH, H) if D == 1 else rand(2, GH, H),
                 input_weight=rand(D * GH, I), bias=rand(D * GH), init_state=rand(N, D * H))
    if cell == "lstm":
        given.update(init_cell=rand(N, D * H), peephole=rand(2, 4 * H))
    given["mask"] = (torch.rand(N, D * H, generator=g) > 0.3).double()
    if cell == "gru":
        given["secondary_bias"] = rand(D * H)
    return {name: given.get(name) for name in functions.INPUTS[cell]}


@pytest.mark.parametrize("cell", list(G))
def test_opcheck_forward_and_backward_operators(cell):
    given = _inputs(cell)
    code = functions.descriptor_code(DESCRIPTORS[cell])
    forward, backward = ops.OPS[cell]
    detached = [None if t is None else t.detach() for t in given.values()]
    for training in (True, False):  # training=False keeps no z_state: its backward makes it
        torch.library.opcheck(forward, (*given.values(), code, "reference", training))
        torch.library.opcheck(forward, (*detached, code, "reference", training))
    out = forward(*given.values(), code, "reference", True)
    names = functions.INPUTS[cell]
    needs = [name != "mask" for name in names]
    g = torch.Generator().manual_seed(1)
    ups = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in out[:-1]]
    outs = [o.detach() for o in out]
    if cell == "lstm":
        args = (*outs[:2], outs[-1], *ups)
    else:
        args = (outs[0], outs[-1], *ups)
    torch.library.opcheck(backward, (*detached, *args, code, "reference", needs))
    # the source needing no gradient: the input weight's comes from dAᵀ source
    torch.library.opcheck(backward, (*detached, *args, code, "reference", [False] + needs[1:]))


def test_the_descriptor_code_gives_back_the_descriptor():
    for cell, desc in DESCRIPTORS.items():
        assert ops.decode(cell, functions.descriptor_code(desc)) == desc
    with pytest.raises(ValueError, match="descriptor: unknown option 'colour'"):
        ops.decode("gru", "colour=1")


@pytest.mark.parametrize("cell", list(G))
def test_an_inference_forward_is_differentiable_as_a_training_one(cell):
    """A forward with training=False keeps no z_state; its gradients (the backward makes the
    z_state again) are those of the training forward, bit for bit."""
    code = functions.descriptor_code(DESCRIPTORS[cell])
    forward, _ = ops.OPS[cell]
    grads = []
    for training in (True, False):
        given = _inputs(cell)
        out = forward(*given.values(), code, "reference", training)
        assert (out[-1].numel() > 0) == training
        g = torch.Generator().manual_seed(2)
        torch.autograd.backward(out[:-1], [torch.randn(o.shape, generator=g, dtype=o.dtype)
                                           for o in out[:-1]])
        grads.append({k: t.grad for k, t in given.items() if t is not None and k != "mask"})
    for name, want in grads[0].items():
        torch.testing.assert_close(grads[1][name], want, rtol=0, atol=0, msg=name)


def _model(cls, dtype=torch.float64, backend="reference", **kw):
    torch.manual_seed(0)
    return cls(3, 4, num_layers=2, bidirectional=True, dtype=dtype, backend=backend, **kw)


@pytest.mark.parametrize("name", list(LAYERS))
def test_torch_func_grad_equals_autograd(name):
    layer = _model(LAYERS[name])
    params = {k: v.detach() for k, v in layer.named_parameters()}
    x = torch.randn(5, 2, 3, dtype=torch.float64)

    def loss(p, x):
        out, _ = torch.func.functional_call(layer, p, (x,))
        return (out ** 2).sum()
    got_p, got_x = torch.func.grad(loss, argnums=(0, 1))(params, x)
    xr = x.clone().requires_grad_()
    (layer(xr)[0] ** 2).sum().backward()
    torch.testing.assert_close(got_x, xr.grad, rtol=1e-12, atol=1e-12)
    for k, p in layer.named_parameters():
        torch.testing.assert_close(got_p[k], p.grad, rtol=1e-12, atol=1e-12)


TORCH_NN = {"RNN": torch.nn.RNN, "GRU": torch.nn.GRU, "LSTM": torch.nn.LSTM}


def _twin(name):
    """(rnngrad.torch layer on the reference backend, torch.nn's layer with its parameters)."""
    layer = _model(LAYERS[name])
    twin = TORCH_NN[name](3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    twin.load_state_dict(layer.state_dict())
    return layer, twin


@pytest.mark.parametrize("name", list(LAYERS))
def test_per_sample_gradients_by_vmap_of_grad_equal_torch_nn_sample_by_sample(name):
    layer, twin = _twin(name)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    x = torch.randn(3, 5, 1, 3, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(4))  # 3 samples, each [T=5,N=1,I]

    def loss(p, sample):
        out, h = torch.func.functional_call(layer, p, (sample,))
        h = h[0] if isinstance(h, tuple) else h
        return (out ** 2).sum() + h.sum()
    got = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for i, sample in enumerate(x):
        twin.zero_grad()
        out, h = twin(sample)
        h = h[0] if isinstance(h, tuple) else h
        ((out ** 2).sum() + h.sum()).backward()
        for k, p in twin.named_parameters():
            torch.testing.assert_close(got[k][i], p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(LAYERS))
def test_jacrev_equals_torch_nn_jacobian(name):
    layer, twin = _twin(name)
    x = torch.randn(2, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    got = torch.func.jacrev(lambda a: layer(a)[0])(x)  # [T,N,2H, T,N,I]
    want = torch.autograd.functional.jacobian(lambda a: twin(a)[0], x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_vmap_over_an_ensemble_of_weights_equals_each_model_alone():
    # the weights mapped too (each slice its own problem), loss and gradients
    models = [_model(rt.GRU) for _ in range(3)]
    for i, m in enumerate(models):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(0.1 * i)
    stacked = {k: torch.stack([dict(m.named_parameters())[k].detach() for m in models])
               for k, _ in models[0].named_parameters()}
    x = torch.randn(5, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(6))

    def loss(p):
        return (torch.func.functional_call(models[0], p, (x,))[0] ** 2).sum()
    grads, losses = torch.func.vmap(torch.func.grad_and_value(loss))(stacked)
    for i, m in enumerate(models):
        want = (m(x)[0] ** 2).sum()
        want.backward()
        torch.testing.assert_close(losses[i], want.detach(), rtol=0, atol=0)
        for k, p in m.named_parameters():
            torch.testing.assert_close(grads[k][i], p.grad, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(LAYERS))
def test_a_meta_model_runs_forward_with_shapes_only(name):
    layer = _model(LAYERS[name], batch_first=True).to("meta")
    x = torch.empty(2, 5, 3, dtype=torch.float64, device="meta", requires_grad=True)
    out, state = layer(x)
    assert out.device.type == "meta" and out.shape == (2, 5, 8)
    for s in (state if name == "LSTM" else (state,)):
        assert s.device.type == "meta" and s.shape == (4, 2, 4)
    out.sum().backward()
    assert layer.weight_hh_l1_reverse.grad.shape == layer.weight_hh_l1_reverse.shape


class _Head(torch.nn.Module):
    def __init__(self, backend="reference"):
        super().__init__()
        self.rnn = _model(rt.LSTM, batch_first=True, backend=backend)
        self.head = torch.nn.Linear(8, 1, dtype=torch.float64)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return self.head(out[:, -1]) + c.sum()


def test_torch_export_of_a_model_with_a_layer():
    model = _Head()
    x = torch.randn(2, 5, 3, dtype=torch.float64)
    exported = torch.export.export(model, (x,))
    assert any("rnngrad.lstm" in str(n.target) for n in exported.graph.nodes)
    x2 = torch.randn(2, 5, 3, dtype=torch.float64)
    torch.testing.assert_close(exported.module()(x2), model(x2), rtol=0, atol=0)


COMPILE = textwrap.dedent("""
    import json, sys
    import torch
    import rnngrad.torch as rt
    full = sys.argv[1] == "1"
    device = sys.argv[2]
    dtype = torch.float64 if device == "cpu" else torch.float32
    worst = {}
    for name in ("RNN", "GRU", "LSTM"):
        torch.manual_seed(0)
        layer = getattr(rt, name)(3, 4, num_layers=2, bidirectional=True, batch_first=True,
                                  dtype=dtype, device=device)
        x = torch.randn(2, 5, 3, dtype=dtype, device=device, requires_grad=True)

        def f(x):
            out, h = layer(x)
            h = h[0] if isinstance(h, tuple) else h
            return (out ** 2).sum() + h.sum()
        def g(x):
            out, h = layer(x)
            return out, h[0] if isinstance(h, tuple) else h

        results = []
        for fn, gn in ((torch.compile(f, fullgraph=full), torch.compile(g, fullgraph=full)),
                       (f, g)):  # compiled first: a fresh process
            x.grad = None
            layer.zero_grad()
            y = fn(x)
            y.backward()
            with torch.no_grad():
                out, h = gn(x)
            results.append([y.detach(), out, h, x.grad] + [p.grad for p in layer.parameters()])
        loss, *rest = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(*results)]
        worst[name] = {"loss": loss, "rest": max(rest)}
    print(json.dumps(worst))
""")


@pytest.mark.parametrize("case", ["no_grad", "frozen"])
def test_a_layer_compiled_with_nothing_to_differentiate_equals_eager(case):
    # under no_grad, or with no input needing a gradient, the call records no node: Dynamo
    # traces the operator itself
    layer = _model(rt.GRU)
    if case == "frozen":
        layer.requires_grad_(False)
    x = torch.randn(4, 2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(lambda x: layer(x), fullgraph=True)
    with torch.set_grad_enabled(case != "no_grad"):
        got, want = compiled(x), layer(x)
    assert not got[0].requires_grad
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def _compiled_against_eager(fullgraph: bool, device: str) -> dict:
    """{layer: {"loss": the compiled loss's difference from the eager one, "rest": the worst of
    the layer's outputs and every gradient}, each relative to the eager result's largest
    magnitude}, from a fresh process."""
    done = subprocess.run([sys.executable, "-c", COMPILE, "1" if fullgraph else "0", device],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("fullgraph", [False, True], ids=["default", "fullgraph"])
def test_torch_compile_in_a_fresh_process_equals_eager(fullgraph):
    # the same ops on the same inputs: outputs and gradients bitwise equal; the loss's sums are
    # the compiler's, which may add in another order (a few float64 ulps)
    worst = _compiled_against_eager(fullgraph, "cpu")
    assert set(worst) == {"RNN", "GRU", "LSTM"}, worst
    assert all(w["rest"] == 0.0 and w["loss"] <= 1e-15 for w in worst.values()), worst


def _cuda_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA device"
    if "metal-cuda" not in rnngrad.available_backends():
        return "needs the metal-cuda backend (pip install 'rnngrad[cuda]')"
    return None


CUDA = _cuda_reason()


@pytest.mark.gpu
@pytest.mark.skipif(CUDA is not None, reason=str(CUDA))
@pytest.mark.parametrize("cell", list(G))
def test_opcheck_on_cuda_tensors_through_metal_cuda(cell):
    given = {k: None if v is None else v.detach().float().cuda().requires_grad_(k != "mask")
             for k, v in _inputs(cell).items()}
    code = functions.descriptor_code(DESCRIPTORS[cell])
    forward, backward = ops.OPS[cell]
    detached = [None if t is None else t.detach() for t in given.values()]
    torch.library.opcheck(forward, (*given.values(), code, "metal-cuda", True))
    torch.library.opcheck(forward, (*detached, code, "metal-cuda", False))
    out = forward(*given.values(), code, "metal-cuda", True)
    assert all(o.device.type == "cuda" for o in out)
    needs = [name != "mask" for name in functions.INPUTS[cell]]
    ups = [torch.randn_like(o) for o in out[:-1]]
    outs = [o.detach() for o in out]
    args = (*outs[:2], outs[-1], *ups) if cell == "lstm" else (outs[0], outs[-1], *ups)
    torch.library.opcheck(backward, (*detached, *args, code, "metal-cuda", needs))


@pytest.mark.gpu
@pytest.mark.skipif(CUDA is not None, reason=str(CUDA))
@pytest.mark.parametrize("fullgraph", [False, True], ids=["default", "fullgraph"])
def test_torch_compile_on_cuda_in_a_fresh_process_equals_eager(fullgraph):
    # the same kernels run in both; only the loss's reductions around them may be fused
    # differently by the compiler
    worst = _compiled_against_eager(fullgraph, "cuda")
    assert set(worst) == {"RNN", "GRU", "LSTM"}, worst
    assert all(max(w.values()) < 1e-5 for w in worst.values()), worst


@pytest.mark.gpu
@pytest.mark.skipif(CUDA is not None, reason=str(CUDA))
def test_torch_export_of_a_model_with_a_layer_on_cuda():
    model = _Head(backend=None).float().cuda()
    x = torch.randn(2, 5, 3, device="cuda")
    exported = torch.export.export(model, (x,))
    x2 = torch.randn(2, 5, 3, device="cuda")
    torch.testing.assert_close(exported.module()(x2), model(x2), rtol=0, atol=0)
