"""The CUDA target's ``Device.finish`` on stand-in events (no GPU needed): one wait for a
device's calls, the last (its stream runs them in order); on a fault, the calls waited on again
in order, so that the error names the first that reports it, as one wait per call did. Its
twin on the GPU is in tests/test_harness_cuda.py."""

from __future__ import annotations

import pytest

from rnngrad.backends.metal import cuda


class _Event:
    def __init__(self, log, name, fails):
        self.log, self.name, self.fails = log, name, fails

    def synchronize(self):
        self.log.append(self.name)
        if self.fails():
            raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


class _Dispatch:
    count, threadgroup_size = 64, 32


def _device():
    """A cuda.Device without a GPU: only what finish reads."""
    device = object.__new__(cuda.Device)
    device.broken = None
    return device


def _handles(device, names, faulted=None):
    """Handles of ``device`` whose waits fail from kernel ``faulted`` on (CUDA reports a fault
    to the waits of later calls too)."""
    log, handles = [], []
    failing = names[names.index(faulted):] if faulted else []
    for name in names:
        function = type("F", (), {})()
        function.name, function.kernel = name, type("K", (), {})()
        function.kernel.device = device
        fails = (lambda name=name: name in failing)
        handles.append(cuda.RunHandle(function, _Event(log, name, fails), _Dispatch()))
    return handles, log


def test_finish_waits_on_the_last_call_only():
    device = _device()
    handles, log = _handles(device, ["a", "b", "c"])
    device.finish(handles)
    assert log == ["c"] and handles == [] and device.broken is None


@pytest.mark.parametrize("faulted", ["a", "b", "c"])
def test_a_fault_names_the_first_call_that_reports_it(faulted):
    device = _device()
    handles, log = _handles(device, ["a", "b", "c"], faulted=faulted)
    with pytest.raises(cuda.error) as info:
        device.finish(handles)
    assert str(info.value).startswith(f"kernel '{faulted}' (count 64, threadgroup size 32) failed "
                                       f"on the GPU: cudaErrorIllegalAddress")
    assert "The CUDA context is now unusable" in str(info.value)
    assert handles == [] and device.broken.startswith(f"kernel '{faulted}'")
    assert log == ["c"] + ["a", "b", "c"][:"abc".index(faulted) + 1]
    later, _ = _handles(device, ["d"])
    with pytest.raises(cuda.error, match="this CUDA device is unusable since kernel"):
        device.finish(later)


def test_a_call_of_another_device_is_waited_on_itself():
    device, other = _device(), _device()
    mine, log = _handles(device, ["a", "b"])
    theirs, other_log = _handles(other, ["x"])
    device.finish([mine[0], theirs[0], mine[1]])
    assert other_log == ["x"] and log == ["b"]


def test_finish_of_no_calls_waits_on_nothing():
    device = _device()
    device.broken = "kernel 'z' failed"
    device.finish([])  # as before: nothing to wait on, nothing raised
