"""Adapters that put other frameworks' recurrent layers behind :func:`rnngrad.testing.check_module`
(and their ops behind :func:`rnngrad.testing.check_backend`), one module per framework, each
imported only when used: :mod:`.flax`, :mod:`.equinox`, :mod:`.keras`, :mod:`.mlx`. Each states
its layouts and gate orders against rnngrad's names; each maps parameters in one function."""
