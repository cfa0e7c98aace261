"""The arrays rnngrad.torch makes itself for an op (zero upstream gradients, the stand-in source
of a first layer's gradient op, the final state of an empty sequence) are made on the device of
the tensors the op runs on, not on the CPU: for ``metal-mps`` the backend's arrays are the
tensors themselves, and an op given tensors on two devices refuses them. The "meta" device
stands in for an MPS or CUDA device here."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import rnngrad  # noqa: E402
from rnngrad import states  # noqa: E402
from rnngrad.problem import ForwardArrays  # noqa: E402
from rnngrad.torch import _compute, _device  # noqa: E402


class _Stop(Exception):
    pass


def test_the_gradient_ops_own_arguments_are_on_the_tensors_device(monkeypatch):
    seen = {}

    def spy(cell, gradients, descriptor, backend, op):
        seen.update(op)
        raise _Stop

    monkeypatch.setattr(_compute, "run_checked", spy)
    meta = torch.device("meta")
    T, N, I, H = 3, 2, 4, 5
    given = {"source": torch.empty(T, N, I, device=meta),
             "recurrent_weight": torch.empty(4 * H, H, device=meta),
             "input_weight": torch.empty(4 * H, I, device=meta)}
    result = ForwardArrays(h=torch.empty(T, N, H, device=meta), c=torch.empty(T, N, H, device=meta),
                           z_state=torch.empty(T, N, 6 * H, device=meta))
    with pytest.raises(_Stop):  # no upstream gradient of h; the source needs none
        _compute.backward("lstm", rnngrad.LSTMDescriptor(training=True), "metal-mps", given, result,
                          (None, None, None, None), {"input_weight"}, _device._TENSORS,
                          source=given["source"])
    assert {"source", "source_gradient"} <= set(seen)
    assert {k: v.device.type for k, v in seen.items() if hasattr(v, "device")} == dict.fromkeys(
        seen, "meta")


def test_the_final_state_of_an_empty_sequence_is_on_its_device():
    seq = torch.empty(0, 3, 8, device="meta")
    for D in (1, 2):
        got = states.final(seq, D, xp=torch)
        assert got.device.type == "meta" and got.shape == (3, 8)
