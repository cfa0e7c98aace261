"""The device interface of the Metal host (rnngrad.backends.metal.device): every device the
host drives implements its required part, the optional methods the host looks up are the ones
the interface states, and metalcompute's adapter runs an op with the required part alone."""

from __future__ import annotations

import ast
import pathlib
import sys
import types

import numpy as np
import pytest

from rnngrad import registry
from rnngrad.backends.metal import apple, backends, device, library
from rnngrad.backends.metal.harness import contexts
from rnngrad.testing import assert_matches_reference
from rnngrad.testing.cases import random_case

METAL = pathlib.Path(device.__file__).parent

pytestmark = pytest.mark.skipif(backends.EMULATED_BACKEND.probe() is not None,
                                reason=f"the CPU harness is unavailable: "
                                       f"{backends.EMULATED_BACKEND.probe()}")


def _looked_up() -> set:
    """The attribute names the host's modules look up with getattr(<a device, function or
    handle>, name, default): what they treat as optional."""
    names = set()
    for name in ("host.py", "completion.py", "schedule.py", "gemm.py"):
        text = (METAL / name).read_text()
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"
                    and len(node.args) == 3 and isinstance(node.args[1], ast.Constant)):
                owner = ast.get_source_segment(text, node.args[0])
                if any(word in owner for word in ("device", "function", "handle")):
                    names.add(node.args[1].value)
    return names


def test_the_optional_methods_the_host_uses_are_the_ones_the_interface_states():
    stated = {name for name in dir(device.GPUDevice) if not name.startswith("_")}
    stated |= set(device.GPUDevice.__annotations__)
    stated |= {"threadgroup_size", "prepare", "error"}  # a Function's and a Handle's (documented)
    looked_up = _looked_up()
    assert {"finish", "zeros", "wrap", "prepare"} <= looked_up  # the scan sees the host's look-ups
    assert looked_up - stated == set(), "an optional method the interface does not state"


def test_the_cpu_harness_and_the_mps_device_implement_the_interface():
    from rnngrad.backends.metal.harness import cpu

    harness = cpu.Device()
    assert isinstance(harness, device.Device)
    library_ = harness.kernel(library.source())
    assert isinstance(library_, device.Library)
    assert isinstance(library_.function("strided_gemm"), device.Function)
    pytest.importorskip("torch")
    with contexts.mps_standin("cpu") as mps:
        assert isinstance(mps, device.Device)
        assert set(device.optional_methods(mps)) >= {"finish", "zeros", "wrap"}


class _FakeMetalcompute(types.ModuleType):
    """metalcompute's API (kernel, buffer, calls) on the CPU harness, with nothing beyond it:
    what the "metal" backend gets on a Mac."""

    class Device:
        def __init__(self, *index):
            from rnngrad.backends.metal.harness import cpu

            self._inner = cpu.Device()

        def kernel(self, source):
            return self._inner.kernel(source)

        def buffer(self, data):
            return self._inner.buffer(data)


@pytest.fixture
def fake_metalcompute(monkeypatch):
    monkeypatch.setitem(sys.modules, "metalcompute", _FakeMetalcompute("metalcompute"))
    registry.reprobe("metal")
    yield
    monkeypatch.undo()
    registry.reprobe("metal")


def test_metalcompute_s_adapter_runs_an_op_with_the_required_part_alone(fake_metalcompute):
    adapter = apple.Device()
    assert isinstance(adapter, device.Device) and device.optional_methods(adapter) == ()
    assert apple.unavailable(backends.HOST) is None
    case = random_case(np.random.default_rng(3), "gru", T=3, N=2, H=5, I=4, dtype=np.float32)
    with backends.HOST.using(adapter):
        assert_matches_reference("metal", case, "gru")
        assert_matches_reference("metal", case, "gru_gradients")


def _no_cuda():
    from rnngrad.backends.metal import cuda

    return cuda.available()


@pytest.mark.gpu
@pytest.mark.skipif(_no_cuda() is not None, reason=f"needs an NVIDIA GPU with CuPy: {_no_cuda()}")
def test_the_cuda_target_implements_the_whole_interface():
    from rnngrad.backends.metal import cuda

    dev = cuda.Device(timing=False)
    assert isinstance(dev, device.Device)
    assert set(device.optional_methods(dev)) == {
        "finish", "zeros", "full", "fetch", "wrap", "constant", "check_marks", "fault",
        "clear_fault", "synchronize", "capturing", "persistent"}
    assert isinstance(dev.kernel(library.source()).function("strided_gemm"), device.Function)
