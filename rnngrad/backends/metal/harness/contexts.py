"""Test contexts: the Metal backends run inside a block on a device made for a test.

- :func:`emulated_device`: ``metal-emulated`` on a CPU-target device with options
  (adversarial schedules, forced threadgroup sizes, ``stop=``, ``timeout=``, a trace);
- :func:`cuda_device`: ``metal-cuda`` on a CUDA-target device with options (``fast_math``,
  ``check_each_dispatch``, ``max_threads_per_threadgroup``, timing);
- :func:`mps_device`: ``metal-mps`` on ``rnngrad.backends.metal.mps.Device`` over any
  ``compile_shader``;
- :func:`mps_standin`: ``metal-mps`` on the stand-in of ``torch.mps.compile_shader``
  (:mod:`.mps`), taking that device's tensors as MPS tensors are taken.

Each swaps the backend's device for the block (``MetalHost.using``) and gives back the one it
had after it.
"""

from __future__ import annotations

import contextlib

from rnngrad import registry
from .. import backends


def emulated_device(**options):
    """Run ``"metal-emulated"`` on ``rnngrad.backends.metal.harness.cpu.Device(**options)`` inside
    the block (for example ``schedule="adversarial", seed=3, max_threads_per_threadgroup=64``);
    yields the device, whose ``trace`` lists the dispatches."""
    from . import cpu as emulator

    return backends.EMULATED_HOST.using(emulator.Device(**options))


def cuda_device(**options):
    """Run ``"metal-cuda"`` on ``rnngrad.backends.metal.cuda.Device(**options)`` inside
    the block (for example ``fast_math=True``, ``check_each_dispatch=True``,
    ``max_threads_per_threadgroup=64``, ``timing=False``); yields the device, whose ``trace``
    lists the dispatches with their GPU times (unless ``timing=False``, which the backend's own
    device uses: one CUDA event a dispatch instead of two)."""
    from .. import cuda

    return backends.CUDA_HOST.using(cuda.Device(**options))


def mps_device(compile_shader=None, device="mps", **options):
    """Run ``"metal-mps"`` on ``rnngrad.backends.metal.mps.Device(compile_shader, device,
    **options)`` inside the block (``compile_shader``: ``torch.mps.compile_shader`` by default,
    or anything with its API); yields the device, whose ``trace`` lists the dispatches."""
    from .. import mps

    return backends.MPS_HOST.using(mps.Device(compile_shader, device, **options))


@contextlib.contextmanager
def mps_standin(device="cpu", *, poison=True, drop=None, **harness_options):
    """Run ``"metal-mps"`` inside the block on the harness stand-in of
    ``torch.mps.compile_shader`` (:class:`rnngrad.backends.metal.harness.mps.StandIn`) for
    tensors on ``device`` ("cpu": the CPU target; "cuda": the CUDA target), and take tensors on
    that device as MPS tensors are taken: the public functions and ``rnngrad.torch`` (layers,
    functions, custom ops) run them on ``"metal-mps"``, which the registry lists as available
    there. ``drop`` and ``harness_options`` go to the stand-in (``drop=i``, ``stop=(i, k)``,
    ``timeout=``, ``max_threads_per_threadgroup=`` …); ``poison``: new buffers filled with NaN.
    Yields the :class:`rnngrad.backends.metal.mps.Device`; its ``compile_shader`` is the
    stand-in, whose ``trace`` lists the harness's dispatches."""
    from ..mps import device as mps_device_module, tensors
    from .mps import StandIn

    standin = StandIn(device, drop=drop, **harness_options)
    with mps_device(standin, standin.torch_device, poison=poison) as dev, \
            tensors.taking(dev.torch_device.type):
        mps_device_module._ACTIVE.append(dev)
        registry.reprobe("metal-mps")
        try:
            yield dev
        finally:
            mps_device_module._ACTIVE.remove(dev)
            registry.reprobe("metal-mps")
