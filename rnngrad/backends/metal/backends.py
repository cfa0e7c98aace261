"""The four Metal backends in rnngrad's registry, each a :class:`~rnngrad.backends.metal.host.
MetalHost` on its own device; what makes each available here; ``backend=None``'s size rule; and
``metal-cuda``'s host per GPU.

- ``"metal"``: an Apple GPU through metalcompute (:mod:`.apple`); chosen by ``backend=None``
  when available, for ops of at least ``$RNNGRAD_METAL_MIN_WORK`` multiply-adds
  (:func:`metal_suits`).
- ``"metal-emulated"``: the kernels on the test harness's CPU target
  (:mod:`rnngrad.backends.metal.harness.cpu`, any machine with a C++ compiler); only when named.
- ``"metal-cuda"``: the kernels on an NVIDIA GPU (:mod:`rnngrad.backends.metal.cuda`, CuPy);
  only when named, and by ``rnngrad.torch`` for CUDA tensors. It takes arrays already in GPU
  memory (CuPy arrays, CUDA tensors: anything with ``__cuda_array_interface__``) and returns
  CuPy arrays on the GPU for them, with no copy through the host; NumPy inputs are copied to
  the GPU once per call and the results come back as NumPy arrays. An op runs on the CUDA
  device its arrays are on (NumPy inputs: the current device), one host per device
  (:func:`cuda_host`).
- ``"metal-mps"``: the kernels on PyTorch's ``"mps"`` tensors through
  ``torch.mps.compile_shader`` (:mod:`rnngrad.backends.metal.mps`, PyTorch 2.7 or later on a
  Mac); only when named, and by ``rnngrad.torch`` for MPS tensors. Tensors in, tensors on the
  device out (NumPy inputs are copied there and come back as NumPy arrays).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

import numpy as np

from ... import registry
from ...problem import address, on_gpu
from . import apple
from .host import MetalHost

F32 = np.float32


def _metal_device():
    return apple.Device()


def _probe_metal():
    return apple.unavailable(HOST)


def _emulator_device():
    from .harness import cpu as emulator

    return emulator.Device()


def _probe_emulated():
    try:
        from .harness import cpu as emulator  # noqa: F401
    except ImportError as exc:
        return f"the Metal execution harness does not import ({exc})"
    try:
        emulator._loader.compiler()
    except Exception as exc:  # the harness names what to install
        return f"the Metal execution harness has no C++ compiler ({exc})"
    return None


def _cuda_device():
    from . import cuda

    # no Dispatch.seconds (no timing events) and new buffers left as they are: the tests'
    # devices (harness.contexts.cuda_device) poison them with NaN
    return cuda.Device(timing=False, poison=False)


def _probe_cuda():
    try:
        from . import cuda
    except ImportError as exc:
        return f"the CUDA target does not import ({exc})"
    reason = cuda.available()
    if reason:
        return reason
    try:
        CUDA_HOST.function("strided_gemm")  # compiles the library once: NVRTC must work
    except Exception as exc:
        return f"the Metal kernels do not compile for this GPU ({type(exc).__name__}: {exc})"
    return None


#: the fewest multiply-adds of an op for which ``backend=None`` runs it on the Apple GPU
METAL_MIN_WORK = 2 ** 24
#: environment variable that overrides :data:`METAL_MIN_WORK` (0: every op on the GPU)
MIN_WORK_ENV = "RNNGRAD_METAL_MIN_WORK"


def op_work(problem) -> int:
    """Multiply-adds of one op: the recurrence's T·D·N·G·H·H plus the input projection's
    T·D·N·G·H·I (with input_weight). The gradients do about twice that; the rule uses the same
    count for both so that an op and its gradients run on the same backend."""
    I = problem.I if problem.input_weight is not None else 0
    return problem.T * problem.D * problem.N * problem.G * problem.H * (problem.H + I)


def metal_suits(problem):
    """``backend=None``'s size rule for the Apple GPU: None (run on "metal") when the op has at
    least ``$RNNGRAD_METAL_MIN_WORK`` (default :data:`METAL_MIN_WORK` = 2**24, about 1.7·10**7)
    multiply-adds, else why numba is expected to be faster. Each op makes 2 to 8 dispatches,
    each its own command buffer in metalcompute, a fixed cost a dispatch that public reports
    describe and that numba (which runs an op of 2**24 multiply-adds in about as long on one
    core) does not pay. The threshold is that estimate, not a measurement
    on a Mac: ``rnngrad bench --backends metal numba`` there measures the crossover, and
    ``RNNGRAD_METAL_MIN_WORK`` moves it (0 sends every op to the GPU)."""
    value = os.environ.get(MIN_WORK_ENV, "").strip()
    try:
        least = int(value.replace("_", ""), 0) if value else METAL_MIN_WORK
    except ValueError:
        least = -1
    if least < 0:
        raise ValueError(f"{MIN_WORK_ENV}: expected a non-negative integer (multiply-adds), "
                         f"got {value!r}")
    work = op_work(problem)
    if work >= least:
        return None
    return (f"{work} multiply-adds < {MIN_WORK_ENV} = {least}: too small for the GPU's dispatch "
            f"cost")


HOST = MetalHost(_metal_device, "metal")
EMULATED_HOST = MetalHost(_emulator_device, "metal-emulated")
CUDA_HOST = MetalHost(_cuda_device, "metal-cuda")
#: metal-cuda's hosts on the other CUDA devices, by device index: an op runs on the device its
#: arrays are on (CUDA_HOST runs on the device current at its first use)
_CUDA_HOSTS = {}
_CUDA_HOSTS_LOCK = threading.Lock()


def _array_device(a) -> int:
    """The CUDA device index of GPU array ``a`` (a CuPy array's ``device``, else the driver's
    answer for its address), or the current device for a host array."""
    import cupy

    if on_gpu(a):
        device = getattr(a, "device", None)
        index = getattr(device, "id", None)
        if isinstance(index, int):
            return index
        return cupy.cuda.runtime.pointerGetAttributes(address(a)).device
    return cupy.cuda.runtime.getDevice()


def cuda_host(problem) -> MetalHost:
    """The metal-cuda host on the CUDA device of ``problem``'s arrays."""
    index = _array_device(problem.source)
    if CUDA_HOST.device._cuda.id == index:
        return CUDA_HOST
    host = _CUDA_HOSTS.get(index)
    if host is None:
        with _CUDA_HOSTS_LOCK:
            host = _CUDA_HOSTS.get(index)
            if host is None:
                from . import cuda

                host = _CUDA_HOSTS[index] = MetalHost(
                    lambda: cuda.Device(index, timing=False, poison=False), "metal-cuda")
    return host


def _on(host: MetalHost) -> dict:
    return registry.every_cell(host.forward, host.gradients)


BACKEND = registry.Backend(
    name="metal",
    dtypes=(np.dtype(F32),),
    implementations=_on(HOST),
    probe=_probe_metal,
    summary="hand-written MSL kernels on the Apple GPU through metalcompute (float32)",
    suits=metal_suits,
)

EMULATED_BACKEND = registry.Backend(
    name="metal-emulated",
    dtypes=(np.dtype(F32),),
    implementations=_on(EMULATED_HOST),
    probe=_probe_emulated,
    summary="the Metal kernels on the CPU execution harness (float32; for testing, slow)",
)


CUDA_BACKEND = registry.Backend(
    name="metal-cuda",
    dtypes=(np.dtype(F32),),
    implementations=registry.every_cell(
        lambda problem: cuda_host(problem).forward(problem),
        lambda problem: cuda_host(problem).gradients(problem)),
    probe=_probe_cuda,
    summary="the Metal kernels on an NVIDIA GPU, translated to CUDA (float32)",
    gpu=True,
    device=lambda: f"{CUDA_HOST.device.deviceName} (CUDA device {CUDA_HOST.device._cuda.id})",
)


def _mps_device():
    from . import mps

    return mps.default_device()


def _probe_mps():
    from . import mps

    return mps.unavailable(MPS_HOST)


MPS_HOST = MetalHost(_mps_device, "metal-mps")

MPS_BACKEND = registry.Backend(
    name="metal-mps",
    dtypes=(np.dtype(F32),),
    implementations=_on(MPS_HOST),
    probe=_probe_mps,
    summary="the Metal kernels on PyTorch's \"mps\" tensors through torch.mps.compile_shader "
            "(float32)",
    gpu=True,
    device=lambda: MPS_HOST.device.deviceName,
)


def hosts() -> tuple:
    """Every Metal host of this process that has made its device."""
    every = (HOST, EMULATED_HOST, CUDA_HOST, MPS_HOST, *_CUDA_HOSTS.values())
    return tuple(host for host in every if host._device is not None)


def synchronize() -> None:
    """Wait for every Metal device rnngrad has run ops on, and raise
    :class:`~rnngrad.backends.metal.IncompleteDispatch` for the first op found unfinished (the
    others' devices are waited for all the same)."""
    failure = None
    for host in hosts():
        try:
            host.synchronize()
        except Exception as exc:  # noqa: BLE001 (every device is waited for first)
            failure = failure or exc
    if failure is not None:
        raise failure


@atexit.register
def _at_exit():
    """An op found unfinished only at exit is reported on stderr: never silent."""
    try:
        synchronize()
    except Exception as exc:  # noqa: BLE001
        print(f"rnngrad: at exit: {type(exc).__name__}: {exc}", file=sys.stderr)
