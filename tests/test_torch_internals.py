"""rnngrad.torch._internals: where a PyTorch lacks one of the private internals rnngrad.torch
uses, its fallback gives bit for bit the results of the internal (a layer's step, a function's
forward and gradients), and only rnngrad.torch._internals touches PyTorch's private API."""

from __future__ import annotations

import ast
import pathlib

import pytest

torch = pytest.importorskip("torch")
import rnngrad  # noqa: E402
import rnngrad.torch as rt  # noqa: E402
from rnngrad.torch import _internals, _layer  # noqa: E402

PACKAGE = pathlib.Path(rt.__file__).parent


def _results():
    """A two-layer bidirectional LSTM's training step and a GRU function's forward and
    gradients, float64 on the reference backend: {name: tensor}."""
    torch.manual_seed(3)
    layer = rt.LSTM(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64,
                    backend="reference")
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    output, (h_n, c_n) = layer(x)
    (output.sum() + h_n.pow(2).sum() + c_n.sum()).backward()
    out = {"output": output.detach(), "h_n": h_n.detach(), "x.grad": x.grad}
    out.update({k: p.grad for k, p in layer.named_parameters()})
    R = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    source = torch.randn(5, 2, 12, dtype=torch.float64, requires_grad=True)
    state = rt.gru(source, R, descriptor=rnngrad.GRUDescriptor(reset_after=True),
                   backend="reference").state
    state.sum().backward()
    out.update({"gru": state.detach(), "gru R.grad": R.grad, "gru source.grad": source.grad})
    return out


@pytest.mark.parametrize("missing", ["_APPLY", "_UNWRAP", "_BELOW_AUTOGRAD", "_PEEK",
                                     "_get_current_dispatch_mode", "_FUNCTION_MODE"])
def test_each_fallback_gives_the_results_of_the_internal(missing, monkeypatch):
    want = _results()
    monkeypatch.setattr(_internals, missing, None)
    monkeypatch.setattr(_layer, "_APPLY", _internals.fast_apply(_layer._OneNode))
    got = _results()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)


def test_a_missing_check_sends_calls_down_the_general_route(monkeypatch):
    calls = []
    forward = _layer._forward
    monkeypatch.setattr(_layer, "_forward", lambda *a: calls.append(1) or forward(*a))
    _results()
    assert calls  # the one-node route, with every internal
    calls.clear()
    monkeypatch.setattr(_internals, "_PEEK", None)
    _results()
    assert not calls


def test_only_the_internals_module_touches_private_pytorch():
    """No other module of rnngrad.torch names torch._C, a private torch module, or a private
    attribute of a torch object."""
    for path in PACKAGE.glob("*.py"):
        if path.name == "_internals.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            text = None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "torch" and node.attr.startswith("_"):
                text = f"torch.{node.attr}"
            elif isinstance(node, ast.ImportFrom) and node.module \
                    and any(part.startswith("_") for part in node.module.split(".")[1:]) \
                    and node.module.startswith("torch"):
                text = f"from {node.module}"
            assert text is None, f"{path.name}:{node.lineno}: {text}"
