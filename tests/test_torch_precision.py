"""rnngrad.torch in float16 and bfloat16: computed in float32 (on the float32 fast path, never
the reference backend) and returned in the input's dtype, so a low-precision layer gives
float32 ``torch.nn``'s results on the same (rounded) values, rounded once; under
``torch.autocast`` a model that runs with ``torch.nn``'s layers runs with rnngrad's; dtypes no
backend serves are refused by name."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import rnngrad.torch as rt  # noqa: E402
from rnngrad.torch import _device  # noqa: E402

LOW = [torch.float16, torch.bfloat16]
MODES = ["RNN", "GRU", "LSTM"]
#: the worst error allowed, in the low dtype's eps times the largest value of a quantity: the
#: result's rounding, and the bias sum b_ih + b_hh, which the layer makes in the parameters' dtype
ROUNDINGS = 4


def _outputs_and_gradients(module, x, dtype):
    x = x.detach().clone().requires_grad_()
    out, state = module(x)
    finals = list(state) if isinstance(state, tuple) else [state]
    g = torch.Generator().manual_seed(5)
    loss = (out * torch.randn(out.shape, generator=g).to(out.dtype)).sum() + \
        sum((f * torch.randn(f.shape, generator=g).to(f.dtype)).sum() for f in finals)
    module.zero_grad()
    loss.backward()
    got = {"output": out, "input": x.grad, **{f"final{i}": f for i, f in enumerate(finals)}}
    got.update({k: p.grad for k, p in module.named_parameters()})
    assert all(v.dtype == dtype for v in got.values()), {k: v.dtype for k, v in got.items()}
    return {k: v.detach().float() for k, v in got.items()}


def _within_roundings(got, want, dtype):
    eps = torch.finfo(dtype).eps
    for name, w in want.items():
        scale = w.abs().max().item()
        err = (got[name] - w).abs().max().item()
        assert err <= ROUNDINGS * eps * scale, (name, err / (eps * scale))


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_low_precision_layers_are_float32_torch_nn_rounded(mode, dtype):
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode)(4, 8, bidirectional=True)  # one layer: one rounding
    with torch.no_grad():  # the float32 module on the low dtype's values
        for p in reference.parameters():
            p.copy_(p.to(dtype).float())
    layer = rt.from_torch(reference).to(dtype)
    x = torch.randn(6, 3, 4).to(dtype)
    want = _outputs_and_gradients(reference, x.float(), torch.float32)
    _within_roundings(_outputs_and_gradients(layer, x, dtype), want, dtype)


def test_low_precision_runs_on_the_float32_path(op_calls):
    layer = rt.LSTM(4, 8, dtype=torch.bfloat16)
    layer(torch.randn(5, 2, 4, dtype=torch.bfloat16))
    seen = [{k: v.dtype for k, v in given.items() if isinstance(v, np.ndarray)}
            for _, _, _, given, _ in op_calls]
    assert seen and all(d == np.float32 for d in seen[0].values()), seen


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_autocast_cpu_runs_what_torch_nn_runs(mode, dtype):
    torch.manual_seed(0)
    head = torch.nn.Linear(4, 4)
    reference = getattr(torch.nn, mode)(4, 8)
    layer = rt.from_torch(reference)
    x = torch.randn(6, 3, 4)
    results = {}
    for name, module in (("torch", reference), ("rnngrad", layer)):
        with torch.autocast("cpu", dtype=dtype):
            try:
                out = module(head(x))[0]
            except RuntimeError as exc:  # oneDNN's LSTM has no float16 primitive
                assert name == "torch" and mode == "LSTM" and dtype == torch.float16, exc
                continue
        assert out.dtype == dtype, (name, out.dtype)
        out.float().sum().backward()
        assert all(p.grad.dtype == torch.float32 for p in module.parameters())
        results[name] = out.detach().float()
    want = reference(head(x))[0].detach()  # float32
    # inputs and weights rounded to the low dtype, then one rounding of the result
    bound = 8 * torch.finfo(dtype).eps * want.abs().max()
    assert (results["rnngrad"] - want).abs().max() <= bound


def test_dtypes_no_backend_serves_are_refused_by_name():
    x, R = torch.zeros(3, 2, 6), torch.zeros(6, 2)
    with pytest.raises(TypeError, match=r"source: expected a floating tensor, got torch.int32, "
                                        r"which no rnngrad backend computes in: float32 and "
                                        r"float64 are computed as they are, float16 and bfloat16 "
                                        r"in float32"):
        rt.gru(x.int(), R)
    with pytest.raises(TypeError, match=r"recurrent_weight: expected dtype torch.float16 \(the "
                                        r"source's"):
        rt.gru(x.half(), R)
    with pytest.raises(TypeError, match=r"source: float64 tensors on cuda: 'metal-cuda' computes "
                                        r"in float32"):
        _device.check_served({"source": x.double(), "mask": None}, torch.device("cuda"))
    with pytest.raises(TypeError, match=r"input: expected dtype torch.float32 \(the "
                                        r"parameters'\), got torch.bfloat16; .* or run under "
                                        r"torch.autocast"):
        rt.LSTM(6, 2)(x.bfloat16())
