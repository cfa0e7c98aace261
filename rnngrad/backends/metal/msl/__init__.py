"""Metal Shading Language outside Apple's compiler: the kernels' source translated to C++ (the
test harness's CPU target) or CUDA C++ (the ``metal-cuda`` backend's target), against a stand-in
``<metal_stdlib>`` (``metal_stdlib.h``), and metalcompute's dispatch rule, which every target
follows.

- :mod:`.translate`: the kernel signatures parsed, ``threadgroup`` arrays and address-space
  keywords rewritten, one launcher per entry point;
- :mod:`.dispatch`: the threadgroup size and the checks of a call, a device's dispatch trace.
"""
