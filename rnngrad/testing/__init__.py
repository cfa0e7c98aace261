"""A toolkit for testing RNN implementations against MPSGraph's semantics.

Everything here checks a *candidate* (an rnngrad backend name, or any callable with the signature
of an rnngrad function) against the float64 reference:

- :mod:`rnngrad.testing.compare`: the one tolerance table (``TOLERANCES``, :func:`tolerance`)
  and the comparison of two results (:func:`compare_array`, :func:`compare_results`);
- :mod:`rnngrad.testing.cases`: a complete problem (:class:`Case`: cell, descriptor, inputs and
  upstream gradients) and :func:`random_case`;
- :mod:`rnngrad.testing.check`: :func:`assert_matches_reference` for one problem,
  :func:`check_backend` to fuzz a candidate (regression set, then hypothesis), with a runnable
  reproduction of the first, shrunk mismatch;
- :mod:`rnngrad.testing.strategies`: hypothesis strategies of problems, descriptors and ops, and
  the named regression set (needs ``hypothesis`` for the strategies);
- :mod:`rnngrad.testing.vectors`: golden vectors (``rnngrad export-vectors``), read and checked
  without hypothesis (:func:`load_vectors`, :func:`check_vectors`);
- :mod:`rnngrad.testing.gradcheck`: central finite differences of a case's loss, in float64;
- :mod:`rnngrad.testing.module`: :func:`check_module` fuzzes a whole framework layer
  (``torch.nn.RNN`` / ``GRU`` / ``LSTM`` or a look-alike) against the reference composed layer by
  layer (torch imported only when it runs);
- :mod:`rnngrad.testing.layer_problems`: what :func:`check_module` checks a layer on
  (:class:`Capabilities`, problems, scenarios); :mod:`rnngrad.testing.arrays`: the protocol of
  layers that take and return arrays (any framework, its own VJP);
  :mod:`rnngrad.testing.adapters`: Flax, Equinox, Keras 3 and MLX layers behind that protocol;
  :mod:`rnngrad.testing.layer_ops`: such a layer as :func:`check_backend`'s ops;
- :mod:`rnngrad.testing.mlx_adapter`: ``mlx.nn.RNN`` / ``GRU`` / ``LSTM`` behind torch.nn's
  conventions, for :func:`check_module`;
- :mod:`rnngrad.testing.mutants`: copies of the reference with one planted fault each, and a
  torch.nn-style layer with one planted fault in its glue, to show that a check can fail.

Dependencies run one way: compare ← cases ← check ← vectors; strategies ← check (only inside
:func:`check_backend`, which needs hypothesis) and ← vectors.
"""

from .cases import Case, random_case, random_descriptor
from .check import (ILL_CONDITIONED, ReferenceMismatch, Unsupported, assert_matches_reference, case_source, check_backend,
                    check_case, input_sensitivity, reference_result, reproduction,
                    run_candidate)
from .compare import KINDS, TOLERANCES, Mismatch, compare_array, compare_results, tolerance
from .layer_problems import Capabilities
from .module import ModuleMismatch, ModuleReport, check_module
from .vectors import check_vectors, load_vectors

__all__ = ["TOLERANCES", "KINDS", "tolerance", "Mismatch", "compare_array", "compare_results",
           "Case", "random_case", "random_descriptor",
           "check_case", "input_sensitivity", "run_candidate", "reference_result", "reproduction",
           "case_source",
           "ReferenceMismatch", "assert_matches_reference", "check_backend", "load_vectors",
           "check_vectors", "check_module", "ModuleMismatch", "ModuleReport", "Unsupported",
           "ILL_CONDITIONED", "Capabilities"]
