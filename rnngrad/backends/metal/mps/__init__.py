"""The ``metal-mps`` backend's own pieces: rnngrad's kernels on PyTorch's ``"mps"`` tensors.

- :mod:`.device`: metalcompute's API on ``torch.mps.compile_shader`` (the device the Metal host
  drives for this backend);
- :mod:`.tensors`: tensors on the device as the arrays the public functions check and the host
  binds, kept where they are.

Without a Mac, the harness's stand-in of ``compile_shader``
(:mod:`rnngrad.backends.metal.harness.mps`) runs the same device on the CPU or CUDA target.
PyTorch is imported only when a tensor or the device is used.
"""

from .device import STANDIN_ENV, Device, default_device, unavailable  # noqa: F401
