"""The backend table: which backend computes which (cell, op), and which are available here.

A backend is a module that defines ``BACKEND``, a :class:`Backend`. It is listed once in
``_SPECS`` below, in order of preference for ``backend=None``; nothing else changes when a backend
or a kernel version is added. A backend function takes a validated
:class:`rnngrad.problem.Problem` and returns :class:`~rnngrad.problem.ForwardArrays` or
:class:`~rnngrad.problem.GradientArrays`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Optional

import numpy as np

CELLS = ("single_gate", "gru", "lstm")
KINDS = ("forward", "gradients")


@dataclasses.dataclass
class Backend:
    """name; dtypes it computes in; implementations keyed by (cell, kind); probe() returns
    None when usable here, else the reason it is not; ``gpu``: it takes arrays in CUDA GPU memory
    (and host arrays too), and returns results where its inputs were."""

    name: str
    dtypes: tuple
    implementations: dict
    probe: Callable[[], Optional[str]] = lambda: None
    summary: str = ""
    gpu: bool = False
    #: where it runs, for ``rnngrad info`` (e.g. the GPU's name); called only when available
    device: Callable[[], str] = lambda: ""
    #: for ``backend=None``: None when it suits a problem, else why the next backend is
    #: expected to be faster there (a size rule); a named backend runs whatever it is given
    suits: Callable[[object], Optional[str]] = lambda problem: None


def every_cell(forward, gradients) -> dict:
    """A :attr:`Backend.implementations` table: ``forward`` and ``gradients`` for every cell."""
    return {(cell, kind): run for cell in CELLS
            for kind, run in (("forward", forward), ("gradients", gradients))}


@dataclasses.dataclass(frozen=True)
class _Spec:
    name: str
    module: str
    attribute: str
    automatic: bool  # chosen by backend=None when available
    missing: str  # what to do when the module does not import


# In order of preference for backend=None.
_SPECS = (
    _Spec("metal", "rnngrad.backends.metal.backends", "BACKEND", True,
          "needs macOS on Apple silicon with metalcompute (pip install 'rnngrad[fast]')"),
    _Spec("numba", "rnngrad.backends.numba", "BACKEND", True,
          "needs numba (pip install 'rnngrad[fast]')"),
    _Spec("reference", "rnngrad.backends.reference", "BACKEND", True, ""),
    _Spec("metal-emulated", "rnngrad.backends.metal.backends", "EMULATED_BACKEND", False,
          "needs a C++ compiler (apt-get install g++)"),
    _Spec("metal-cuda", "rnngrad.backends.metal.backends", "CUDA_BACKEND", False,
          "needs an NVIDIA GPU and CuPy (pip install 'rnngrad[cuda]')"),
    _Spec("metal-mps", "rnngrad.backends.metal.backends", "MPS_BACKEND", False,
          "needs PyTorch 2.7 or later on macOS with Apple silicon"),
)

_loaded: dict = {}

#: how the reason of a backend that is installed but fails to load begins (a bug, not a
#: missing dependency): ``rnngrad verify`` fails on it instead of skipping the backend
BROKEN = "broken"


def _load(spec: _Spec):
    """(Backend or None, reason it is unavailable or None)."""
    if spec.name not in _loaded:
        try:
            module = importlib.import_module(spec.module)
            backend = getattr(module, spec.attribute)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] == "rnngrad":
                _loaded[spec.name] = (None, f"{BROKEN}: {spec.module} failed to import ({exc})")
            else:
                _loaded[spec.name] = (None, f"{spec.missing} [{type(exc).__name__}: {exc}]")
        except Exception as exc:  # a bug in the backend itself, not a missing dependency
            _loaded[spec.name] = (None, f"{BROKEN}: {spec.module} failed to import "
                                        f"({type(exc).__name__}: {exc})")
        else:
            reason = backend.probe()
            _loaded[spec.name] = (None if reason else backend, reason)
    return _loaded[spec.name]


def reprobe(name: str) -> None:
    """Forget what the probe of backend ``name`` said, so that the next look asks again (for a
    backend whose device was swapped, such as ``metal-mps`` on its stand-in)."""
    _loaded.pop(name, None)


def all_backends() -> tuple:
    """Every backend rnngrad knows, available here or not."""
    return tuple(s.name for s in _SPECS)


def status() -> list:
    """[(name, available, automatic, reason)] for every known backend."""
    rows = []
    for spec in _SPECS:
        backend, reason = _load(spec)
        rows.append((spec.name, backend is not None, spec.automatic, reason))
    return rows


def broken_backends() -> list:
    """[(name, reason)] for backends whose code is present but fails to load."""
    return [(name, reason) for name, ok, _, reason in status() if not ok and reason.startswith(BROKEN)]


def available_backends() -> tuple:
    """The backends usable on this machine, fastest first."""
    return tuple(name for name, ok, _, _ in status() if ok)


def get(name: str) -> Backend:
    """The named backend, or a ValueError listing the available ones."""
    for spec in _SPECS:
        if spec.name == name:
            backend, reason = _load(spec)
            if backend is None:
                raise ValueError(
                    f"backend: {name!r} is not available here ({reason}); "
                    f"available: {available_backends()}"
                )
            return backend
    raise ValueError(f"backend: unknown backend {name!r}; available: {available_backends()}")


def _gpu_backends() -> str:
    rows = [(spec.name, _load(spec)) for spec in _SPECS]
    return "; ".join(f"{n!r} ({'available' if b is not None else reason})"
                     for n, (b, reason) in rows if b is not None and b.gpu or b is None and "GPU" in reason)


def resolve(name, cell: str, kind: str, dtype, on_gpu: bool = False, problem=None) -> tuple:
    """(backend name, implementation) for a call; ``name=None`` picks the first available
    automatic backend that implements (cell, kind) in ``dtype`` and suits ``problem`` (its
    ``suits`` rule; every backend suits when no problem is given). ``on_gpu``: the inputs are in
    GPU memory, which only a backend with ``gpu`` takes (and never by ``name=None``)."""
    dtype = np.dtype(dtype)
    if on_gpu and name is None:
        raise ValueError(f"backend: the inputs are in GPU memory and backend=None picks only host "
                         f"backends; name a GPU backend: {_gpu_backends() or 'none known'}")
    if name is None:
        for spec in _SPECS:
            backend, _ = _load(spec)
            if spec.automatic and backend is not None and dtype in backend.dtypes \
                    and (cell, kind) in backend.implementations \
                    and (problem is None or backend.suits(problem) is None):
                return backend.name, backend.implementations[(cell, kind)]
        raise ValueError(f"backend: no available backend implements {cell} {kind} in {dtype}")
    if not isinstance(name, str):
        raise ValueError(f"backend: expected a backend name (str) or None, got {name!r}")
    backend = get(name)
    if dtype not in backend.dtypes:
        raise TypeError(
            f"backend {name!r} computes in {', '.join(str(np.dtype(d)) for d in backend.dtypes)}, "
            f"got inputs of dtype {dtype}; cast them or use backend='reference'"
        )
    if (cell, kind) not in backend.implementations:
        raise ValueError(f"backend: {name!r} does not implement {cell} {kind}")
    if on_gpu and not backend.gpu:
        raise TypeError(f"backend {name!r} computes on the host, got inputs in GPU memory; use a GPU "
                        f"backend ({_gpu_backends() or 'none known'}) or copy the inputs to the host "
                        f"(for example cupy.asnumpy)")
    return backend.name, backend.implementations[(cell, kind)]
