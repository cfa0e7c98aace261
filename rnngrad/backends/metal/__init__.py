"""The Metal fast path: host code that dispatches the MSL kernels in ``kernels/``.

``rnngrad.backends.metal.harness.cpu`` runs the same kernels on any machine through a CPU execution harness
that presents metalcompute's Python API.
"""

from .errors import IncompleteDispatch  # noqa: F401
