"""rnngrad.torch's layers on ``PackedSequence`` input give ``torch.nn``'s results: outputs, final
states at each sequence's own end and every gradient, for the three cells, uni- and
bidirectional, two layers, unsorted and sorted lengths, float64 and float32."""

import numpy as np
import pytest

import rnngrad
from rnngrad.testing import compare_array

torch = pytest.importorskip("torch")
import rnngrad.torch as rt  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

FAST = [b for b in ("numba",) if b in rnngrad.available_backends()]
KIND = {"output": "state", "h_n": "state", "c_n": "cell", "input": "source", "h_0": "init_state",
        "c_0": "init_cell", "weight_ih": "input_weight", "weight_hh": "recurrent_weight",
        "bias_ih": "bias", "bias_hh": "bias"}


def _run(module, x, lengths, h0, c0, enforce_sorted, weights):
    """Outputs and gradients of a loss that weighs every output differently: {name: array}."""
    lstm = module.mode == "LSTM"
    x = x.detach().clone().requires_grad_()
    states = [h0.detach().clone().requires_grad_()] + \
        ([c0.detach().clone().requires_grad_()] if lstm else [])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    output, state = module(packed, tuple(states) if lstm else states[0])
    assert torch.equal(output.batch_sizes, packed.batch_sizes)
    finals = list(state) if lstm else [state]
    module.zero_grad()
    loss = (output.data * weights[0][:output.data.numel()].view(output.data.shape)).sum()
    loss = loss + sum((f * w[:f.numel()].view(f.shape)).sum() for f, w in zip(finals, weights[1:]))
    loss.backward()
    got = {"output": output.data, "h_n": finals[0], "input": x.grad, "h_0": states[0].grad}
    if lstm:
        got.update(c_n=finals[1], c_0=states[1].grad)
    got.update({k: p.grad for k, p in module.named_parameters()})
    return {k: v.detach().numpy() for k, v in got.items()}


def _case(mode, bidirectional, dtype, enforce_sorted=False, seed=0):
    torch.manual_seed(seed)
    module = getattr(torch.nn, mode)(3, 4, num_layers=2, bidirectional=bidirectional, dtype=dtype)
    D = 2 if bidirectional else 1
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.tensor([6, 5, 3, 1] if enforce_sorted else [3, 6, 1, 5])
    x = torch.randn(6, 4, 3, generator=g, dtype=dtype)
    h0, c0 = (torch.randn(2 * D, 4, 4, generator=g, dtype=dtype) for _ in range(2))
    weights = [torch.randn(200, generator=g, dtype=dtype) for _ in range(3)]
    return module, (x, lengths, h0, c0, enforce_sorted, weights)


def _assert_close(got, want, dtype):
    assert set(got) == set(want)
    worst = {}
    for name, value in want.items():
        kind = KIND[name.split("_l")[0] if name.startswith(("weight", "bias")) else name]
        worst[name], mismatch = compare_array(kind, got[name], value, dtype)
        assert mismatch is None, f"{name}: {mismatch}"
    return worst


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("mode", ["RNN", "GRU", "LSTM"])
def test_packed_float64_unsorted_two_layers_as_torch_nn(mode, bidirectional):
    module, args = _case(mode, bidirectional, torch.float64)
    want = _run(module, *args)
    for backend in ["reference"] + FAST:
        _assert_close(_run(rt.from_torch(module, backend=backend), *args), want, np.float64)


@pytest.mark.parametrize("mode", ["GRU", "LSTM"])
def test_packed_float32_sorted_as_torch_nn(mode):
    module, args = _case(mode, True, torch.float32, enforce_sorted=True, seed=3)
    _assert_close(_run(rt.from_torch(module), *args), _run(module, *args), np.float32)


def test_packed_input_refuses_a_mask_and_reverse():
    packed = pack_padded_sequence(torch.zeros(4, 2, 3), torch.tensor([4, 2]))
    with pytest.raises(ValueError, match="mask: not supported with a PackedSequence"):
        rt.GRU(3, 4)(packed, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="reverse: not supported with a PackedSequence"):
        rt.GRU(3, 4, reverse=True)(packed)
    with pytest.raises(ValueError, match=r"input: expected a PackedSequence of \[·, "
                                         r"input_size=5\] data, got shape \(6, 3\)"):
        rt.GRU(5, 4)(packed)
