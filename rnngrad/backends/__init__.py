"""rnngrad's backends, one package each, all computing what
``rnngrad/backends/reference/SEMANTICS.md`` states:

- :mod:`rnngrad.backends.reference`: the NumPy oracle that defines the semantics (float64 and
  every dtype);
- :mod:`rnngrad.backends.numba`: the CPU fast path (numba kernels and packed BLAS GEMMs);
- :mod:`rnngrad.backends.metal`: the host code that dispatches the MSL kernels of ``kernels/``
  on a metalcompute device: a Mac's GPU, or a harness target (:mod:`rnngrad.backends.metal.harness`).

Each backend module defines a :class:`rnngrad.registry.Backend`; :mod:`rnngrad.registry` lists
them and picks one for ``backend=None``. Nothing here is imported until a backend is asked for.
"""
