"""Test tools for the Metal kernels: running them without a Mac, and the contexts tests use.

- :mod:`.cpu`: the CPU target, every GPU thread a fiber, with adversarial schedules, guard pages
  and forced threadgroup sizes (any machine with a C++17 compiler; the ``metal-emulated``
  backend);
- :mod:`.mps`: a stand-in of ``torch.mps.compile_shader`` on the CPU target or the CUDA target
  (:mod:`rnngrad.backends.metal.cuda`), for ``metal-mps`` without a Mac;
- :mod:`.contexts`: a Metal backend on a device made for a test, inside a block.

Nothing in rnngrad's product code imports from here except the ``metal-emulated`` backend and
``metal-mps``'s stand-in mode (``$RNNGRAD_MPS_STANDIN``), both for testing.
"""
