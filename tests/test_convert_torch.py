"""rnngrad.convert.torch: PyTorch parameters → rnngrad → PyTorch gradients equal PyTorch's own
autograd, for every supported single-layer configuration; unsupported modules are refused."""

import itertools
import subprocess
import sys

import numpy as np
import pytest

from rnngrad.testing import compare_array

torch = pytest.importorskip("torch")
from rnngrad.convert import torch as rgt  # noqa: E402

MODULES = {"RNN_TANH": lambda **kw: torch.nn.RNN(nonlinearity="tanh", **kw),
           "RNN_RELU": lambda **kw: torch.nn.RNN(nonlinearity="relu", **kw),
           "GRU": lambda **kw: torch.nn.GRU(**kw), "LSTM": lambda **kw: torch.nn.LSTM(**kw)}
#: PyTorch name → rnngrad quantity whose tolerance applies
KIND = {"output": "state", "h_n": "state", "c_n": "cell", "input": "source", "h_0": "init_state",
        "c_0": "init_cell", "weight_ih": "input_weight", "weight_hh": "recurrent_weight",
        "bias_ih": "bias", "bias_hh": "bias"}


def _module(mode, bidirectional, bias, batch_first, seed, I=3, H=4):
    torch.manual_seed(seed)
    module = MODULES[mode](input_size=I, hidden_size=H, bidirectional=bidirectional, bias=bias,
                           batch_first=batch_first).double()
    with torch.no_grad():  # distinct values in every gate, larger than the default init
        for p in module.parameters():
            p.normal_(0.0, 0.5)
    return module


def _autograd(module, x, hx, gy, gh, gc):
    xt = torch.tensor(x, requires_grad=True)
    lstm = module.mode == "LSTM"
    hxt = tuple(torch.tensor(a, requires_grad=True) for a in hx) if lstm else torch.tensor(hx, requires_grad=True)
    module.zero_grad()
    output, state = module(xt, hxt)
    h_n, c_n = state if lstm else (state, None)
    loss = (output * torch.tensor(gy)).sum() + (h_n * torch.tensor(gh)).sum()
    if lstm:
        loss = loss + (c_n * torch.tensor(gc)).sum()
    loss.backward()
    out = {"output": output.detach().numpy(), "h_n": h_n.detach().numpy(), "input": xt.grad.numpy(),
           "h_0": (hxt[0] if lstm else hxt).grad.numpy()}
    if lstm:
        out.update(c_n=c_n.detach().numpy(), c_0=hxt[1].grad.numpy())
    out.update({k: p.grad.numpy() for k, p in module.named_parameters()})
    return out


@pytest.mark.parametrize("mode,bidirectional,bias,batch_first",
                         list(itertools.product(MODULES, (False, True), (True, False), (False, True))))
def test_round_trip_equals_autograd(mode, bidirectional, bias, batch_first):
    module = _module(mode, bidirectional, bias, batch_first, seed=len(mode) + 2 * bidirectional + 4 * bias)
    rng = np.random.default_rng(1)
    T, N, D, H = 4, 2, 2 if bidirectional else 1, module.hidden_size
    x = rng.standard_normal((N, T, 3) if batch_first else (T, N, 3))
    h0, c0 = rng.standard_normal((D, N, H)), rng.standard_normal((D, N, H))
    hx = (h0, c0) if mode == "LSTM" else h0
    gy = rng.standard_normal((N, T, D * H) if batch_first else (T, N, D * H))
    gh, gc = rng.standard_normal((D, N, H)), rng.standard_normal((D, N, H))
    want = _autograd(module, x, hx, gy, gh, gc)

    layer = rgt.from_module(module)
    output, state = layer.forward(x, hx, backend="reference")
    grads = layer.gradients(x, hx, gy, gh, gc if mode == "LSTM" else None, backend="reference")
    got = {"output": output, "input": grads.input, "h_0": grads.h_0, **grads.parameters}
    if mode == "LSTM":
        got.update(h_n=state[0], c_n=state[1], c_0=grads.c_0)
    else:
        got["h_n"] = state
    assert set(got) == set(want)
    assert set(grads.parameters) == set(layer.parameter_names()) == {k for k, _ in module.named_parameters()}
    for name, value in want.items():
        ratio, mismatch = compare_array(KIND[name.split("_l0")[0]], got[name], value, np.float64)
        assert mismatch is None, f"{name}: {mismatch}"


def test_descriptor_and_bias_split():
    module = _module("GRU", True, True, False, seed=3)
    layer = rgt.from_module(module)
    d = layer.descriptor
    assert (d.reset_gate_first, d.reset_after, d.flip_z, d.bidirectional) == (True, True, False, True)
    H = module.hidden_size
    b_ih = module.bias_ih_l0_reverse.detach().numpy()
    b_hh = module.bias_hh_l0_reverse.detach().numpy()
    np.testing.assert_array_equal(layer.bias[3 * H:5 * H], b_ih[:2 * H] + b_hh[:2 * H])
    np.testing.assert_array_equal(layer.bias[5 * H:], b_ih[2 * H:])
    np.testing.assert_array_equal(layer.secondary_bias[H:], b_hh[2 * H:])


def test_state_dict_of_arrays_and_no_initial_state():
    module = _module("LSTM", False, True, True, seed=5)
    params = {k: v.detach().numpy() for k, v in module.state_dict().items()}
    layer = rgt.from_state_dict("LSTM", params, batch_first=True)
    x = np.random.default_rng(2).standard_normal((2, 3, 3))
    output, (h_n, c_n) = layer.forward(x, backend="reference")
    with torch.no_grad():
        want, (wh, wc) = module(torch.tensor(x))
    np.testing.assert_allclose(output, want.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(c_n, wc.numpy(), rtol=1e-12, atol=1e-13)
    grads = layer.gradients(x, grad_output=np.ones_like(output), backend="reference")
    assert grads.h_0 is None and grads.c_0 is None


@pytest.mark.parametrize("make,match", [
    (lambda: torch.nn.GRU(3, 4, num_layers=2), "num_layers"),
    (lambda: torch.nn.LSTM(3, 4, proj_size=2), "proj_size"),
    (lambda: torch.nn.Linear(3, 4), "module"),
])
def test_unsupported_modules_are_refused(make, match):
    with pytest.raises(ValueError, match=match):
        rgt.from_module(make())


def test_wrong_inputs_name_the_argument():
    layer = rgt.from_module(torch.nn.GRU(3, 4).double())
    with pytest.raises(ValueError, match=r"h_0: expected shape \(1, 2, 4\), got \(2, 2, 4\)"):
        layer.forward(np.zeros((5, 2, 3)), np.zeros((2, 2, 4)))
    with pytest.raises(ValueError, match="input: expected a batched 3-D array"):
        layer.forward(np.zeros((5, 3)))
    with pytest.raises(ValueError, match="grad_c_n"):
        layer.gradients(np.zeros((5, 2, 3)), grad_c_n=np.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match="mode"):
        rgt.from_state_dict("RNN", {})


def test_importing_rnngrad_and_the_converters_does_not_import_torch_or_onnx():
    code = ("import sys, rnngrad, rnngrad.convert, rnngrad.convert.torch, rnngrad.convert.onnx; "
            "bad = [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr + done.stdout
