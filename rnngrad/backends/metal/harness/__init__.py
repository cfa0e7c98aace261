"""Running unchanged MSL kernels without a Mac, behind metalcompute's Python API.

- :mod:`rnngrad.backends.metal.harness.cpu`: every GPU thread a fiber on the CPU, with
  adversarial schedules, guard pages and forced threadgroup sizes (any machine with a C++17
  compiler).

The stand-in for ``<metal_stdlib>`` (``metal_stdlib.h``) is shared by every target.
"""
