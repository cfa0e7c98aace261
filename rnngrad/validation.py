"""Input checking for the public functions (SEMANTICS.md §5).

Every wrong input raises before any work is done: ``ValueError`` for shapes and descriptor
values, ``TypeError`` for dtypes, a missing required array or a descriptor of the wrong class.
Each message names the argument and gives what was expected and what was got.

Dtype rule: every input that carries a dtype (NumPy arrays and scalars, or anything else with a
``dtype`` attribute) must have the same floating dtype, float16, float32 or float64. Inputs without
a dtype (Python lists, floats) take that common dtype; when no input has one, float64.
"""

from __future__ import annotations

import sys

import numpy as np

from .descriptors import DESCRIPTORS, z_width
from .backends.metal.mps import tensors
from .problem import Problem, on_gpu

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_FLOAT_SET, _FLOAT64 = frozenset(FLOAT_DTYPES), np.dtype(np.float64)
_CELL_NAMES = {"single_gate": "single-gate RNN", "gru": "GRU", "lstm": "LSTM"}


def _shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + (",)" if len(shape) == 1 else ")")


def _common_dtype(given: dict) -> np.dtype:
    first = None
    for value in given.values():  # the common case first: NumPy arrays of one floating dtype
        if type(value) is not np.ndarray or (first is not None and value.dtype != first):
            break
        first = value.dtype
    else:
        if first in _FLOAT_SET:
            return first
    typed = {}
    for name, value in given.items():
        dtype = getattr(value, "dtype", None)
        if dtype is not None:
            dtype = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
            if dtype not in _FLOAT_SET:
                raise TypeError(
                    f"{name}: expected a floating dtype (float16, float32 or float64), got {dtype}"
                    + ("; cast it, for example with .astype(np.float32)" if dtype.kind in "biu" else "")
                )
            typed[name] = dtype
    dtypes = set(typed.values())
    if len(dtypes) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in typed.items())
        raise TypeError(f"all array inputs must share one floating dtype, got {listing}")
    return dtypes.pop() if dtypes else _FLOAT64


def array_module(array):
    """NumPy, or CuPy for an array already on the GPU, or rnngrad.backends.metal.mps.tensors' namespace for a
    tensor the backends take where it is (an MPS tensor)."""
    if not on_gpu(array):  # a NumPy array is told by its type there
        return np
    if tensors.is_device_tensor(array):
        return tensors.NAMESPACE
    import cupy

    return cupy


def _as_array(name, value, dtype) -> np.ndarray:
    """A C-contiguous array of ``value`` (``value`` itself when it is one); a CuPy array, on the
    GPU still, for an input in GPU memory."""
    if type(value) is np.ndarray and value.flags.c_contiguous:
        return value
    if on_gpu(value):
        if tensors.is_device_tensor(value):
            return tensors.wrap(value)  # on its device still: a TensorArray
        try:
            import cupy
        except ImportError as exc:
            raise TypeError(f"{name}: got an array in GPU memory ({type(value).__name__}) and CuPy "
                            f"does not import ({exc}); pip install 'rnngrad[cuda]'") from None
        if type(value) is cupy.ndarray and value.flags.c_contiguous:
            return value  # as it is: no call into CuPy
        return cupy.ascontiguousarray(cupy.asarray(value))
    try:
        array = np.asarray(value, dtype=dtype) if not hasattr(value, "dtype") else np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{name}: expected an array-like of numbers, got {type(value).__name__} ({exc})")
    return np.ascontiguousarray(array)


class _Checker:
    """Shape checks with messages that carry the argument, expected and got."""

    def __init__(self, cell, descriptor, arrays):
        self.cell = cell
        self.what = _CELL_NAMES[cell]
        self.descriptor = descriptor
        self.arrays = arrays

    def context(self, H=None):
        parts = [self.what]
        if self.descriptor.bidirectional:
            parts.append("bidirectional")
        if H is not None:
            parts.append(f"with H={H}")
        return " ".join(parts)

    def expect(self, name, *shapes, H=None, note=""):
        """Check ``name`` has one of ``shapes`` (tuples); return the array. ``note`` is added
        to the message: a string, or a function that makes it (built only on failure)."""
        array = self.arrays[name]
        if array.shape in shapes:
            return array
        wanted = " or ".join(_shape(s) for s in shapes)
        raise ValueError(
            f"{name}: expected shape {wanted} for {self.context(H)}"
            f"{note() if callable(note) else note}, got {_shape(array.shape)}"
        )


def _build(cell, descriptor, given: dict, gradients: bool):
    """Check and normalise; return (Problem, the caller's shapes of reshaped inputs)."""
    cls = DESCRIPTORS[cell]
    if descriptor is None:
        descriptor = cls()
    elif not isinstance(descriptor, cls):
        raise TypeError(
            f"descriptor: expected an rnngrad.{cls.__name__} (or None for the defaults), "
            f"got {type(descriptor).__name__}"
        )
    for name in ("source", "recurrent_weight") + (
        ("source_gradient", "z_state") + {"gru": ("output_fwd",), "lstm": ("cell_output_fwd",)}.get(cell, ())
        if gradients
        else ()
    ):
        if given.get(name) is None:
            raise TypeError(f"{name}: expected an array, got None (it is required)")
    present = {k: v for k, v in given.items() if v is not None}
    gpu = [k for k, v in present.items() if on_gpu(v)]
    if gpu:  # one hasattr per input on the host path; the device check only when one is on the GPU
        host = [k for k, v in present.items() if k not in gpu and hasattr(v, "shape")]
        if host:
            listing = ", ".join(f"{k} on the {'GPU' if k in gpu else 'host'}" for k in present
                                if k in gpu or k in host)
            raise TypeError(f"all array inputs must be on one device, got {listing}")
        present = {k: _as_array(k, v, None) if k in gpu else v for k, v in present.items()}
    dtype = _common_dtype(present)
    arrays = {k: _as_array(k, v, dtype) for k, v in present.items()}
    check = _Checker(cell, descriptor, arrays)

    G = descriptor.gates
    D = 2 if descriptor.bidirectional else 1
    Z = z_width(descriptor)

    R = arrays["recurrent_weight"]
    if D == 1:
        if R.ndim != 2 or R.shape[1] < 1 or R.shape[0] != G * R.shape[1]:
            H = R.shape[-1] if R.ndim >= 1 else 0
            raise ValueError(
                f"recurrent_weight: expected shape (G*H, H) = ({G}*H, H) for {check.context()}"
                f"{f', i.e. {_shape((G * H, H))}' if H else ''}, got {_shape(R.shape)}"
            )
        H = R.shape[1]
        R_normalised = R.reshape(1, G * H, H)
    else:
        if R.ndim != 3 or R.shape[0] != 2 or R.shape[2] < 1 or R.shape[1] != G * R.shape[2]:
            H = R.shape[-1] if R.ndim >= 1 else 0
            raise ValueError(
                f"recurrent_weight: expected shape (2, G*H, H) = (2, {G}*H, H) for {check.context()}"
                f"{f', i.e. {_shape((2, G * H, H))}' if H else ''}, got {_shape(R.shape)}"
            )
        H = R.shape[2]
        R_normalised = R
    DH, DGH = D * H, D * G * H

    source = arrays["source"]
    if source.ndim != 3:
        raise ValueError(f"source: expected a 3-D array [T,N,features] (time-major), got shape {_shape(source.shape)}")
    T, N = source.shape[:2]
    W = arrays.get("input_weight")
    if W is not None:
        if W.ndim != 2 or W.shape[0] != DGH:
            raise ValueError(
                f"input_weight: expected shape ({DGH}, I) for {check.context(H)}, got {_shape(W.shape)}"
            )
        I = W.shape[1]
        check.expect("source", (T, N, I), H=H, note=lambda: f" and input_weight of shape {_shape(W.shape)}")
    else:
        I = None
        check.expect("source", (T, N, DGH), H=H, note=" without input_weight (source is the projected input)")
    if "bias" in arrays:
        check.expect("bias", (DGH,), H=H)

    original = {"recurrent_weight": R.shape}
    for name in ("init_state", "init_cell"):
        if name in arrays:
            check.expect(name, (N, DH), (1, N, DH), H=H)
            original[name] = arrays[name].shape
            arrays[name] = arrays[name].reshape(N, DH)
    if "mask" in arrays:
        arrays["mask"] = _mask(arrays["mask"], T, N, H, D, check)

    if "peephole" in arrays:
        p = check.expect("peephole", (4 * H,) if D == 1 else (2, 4 * H), H=H)
        original["peephole"] = p.shape
        arrays["peephole"] = p.reshape(D, 4 * H)
    if "secondary_bias" in arrays:
        check.expect("secondary_bias", (DH,), H=H)

    if gradients:
        check.expect("source_gradient", (T, N, DH), H=H, note=" (the shape of the forward h)")
        zs = arrays["z_state"]
        if zs.shape != (T, N, D * Z * H):
            note = ""
            if cell == "gru" and zs.shape[:2] == (T, N) and zs.ndim == 3:
                other = 3 if Z == 4 else 4
                if zs.shape[2] == D * other * H:
                    note = (
                        f"; this z_state was made with reset_after={not descriptor.reset_after}, "
                        f"the descriptor has reset_after={descriptor.reset_after}"
                    )
            raise ValueError(
                f"z_state: expected shape {_shape((T, N, D * Z * H))} for {check.context(H)}"
                f"{' with reset_after' if cell == 'gru' and descriptor.reset_after else ''}"
                f", got {_shape(zs.shape)}{note}"
            )
        for name in ("output_fwd", "cell_output_fwd"):
            if name in arrays:
                check.expect(name, (T, N, DH), H=H, note=" (the shape of the forward output)")
        if "state_gradient" in arrays:
            check.expect("state_gradient", (N, DH), (1, N, DH), H=H)
            arrays["state_gradient"] = arrays["state_gradient"].reshape(N, DH)
        if "cell_gradient" in arrays:
            cg = check.expect(
                "cell_gradient", (T, N, DH), (N, DH), (1, N, DH), H=H,
                note=" (per-step [T,N,D*H] or final-cell [N,D*H] / [1,N,D*H])",
            )
            if cg.ndim == 3 and (cg.shape[0] != T or T == 1):
                arrays["cell_gradient"] = cg.reshape(N, DH)

    arrays["recurrent_weight"] = R_normalised
    problem = Problem(
        cell=cell, gradients=gradients, descriptor=descriptor, dtype=dtype,
        T=T, N=N, I=I, H=H, G=G, D=D, Z=Z,
        **{k: v if v.flags.c_contiguous else array_module(v).ascontiguousarray(v)
           for k, v in arrays.items()},
    )
    return problem, original


def _mask(m, T, N, H, D, check) -> np.ndarray:
    """[N,D·H] (same at every step) or [T,N,D·H] (per processing step)."""
    if m.ndim > 3:
        raise ValueError(f"mask: expected a shape broadcastable to [N,{D}*H] or [T,N,{D}*H], got {_shape(m.shape)}")
    if D == 2 and (m.ndim == 0 or m.shape[-1] != 2 * H):
        raise ValueError(
            f"mask: expected the last axis to be 2*H = {2 * H} for {check.context(H)} "
            f"(it is split into the two directions), got {_shape(m.shape)}"
        )
    target = (T, N, D * H) if m.ndim == 3 else (N, D * H)
    try:
        return array_module(m).broadcast_to(m, target)
    except ValueError:
        raise ValueError(
            f"mask: expected a shape broadcastable to {_shape(target)} for {check.context(H)}, "
            f"got {_shape(m.shape)}"
        ) from None


#: the signatures :func:`checked_problem` has seen pass the checks, with what they give
_SIGNATURES: dict = {}
#: at most this many signatures are kept (the cache starts over beyond)
SIGNATURES_KEPT = 256


def checked_problem(cell, descriptor, given: dict, gradients: bool):
    """:func:`_build` for callers that run one signature many times (a layer in a training loop):
    when every array of ``given`` is a NumPy or C-contiguous CuPy array, the checks run once
    per signature (cell, kind, descriptor, each array's type, name, shape and dtype) and a
    signature seen before gives the same Problem without them (NumPy arrays made C-contiguous,
    reshaped and the mask broadcast as the checks make them). Anything else is checked as every
    call is."""
    if descriptor is None:
        return _build(cell, descriptor, given, gradients)
    # the descriptor by its id: the cache holds it, so no other object takes that id meanwhile
    key = [cell, gradients, id(descriptor)]
    cupy = sys.modules.get("cupy")
    kinds = (np.ndarray, cupy.ndarray) if cupy is not None else (np.ndarray,)
    arrays = {}
    for name, value in given.items():
        kind = type(value)
        if kind not in kinds:
            if value is None:
                return checked_problem(cell, descriptor, {k: v for k, v in given.items()
                                                          if v is not None}, gradients)
            return _build(cell, descriptor, given, gradients)
        if not value.flags.c_contiguous:
            if kind is not np.ndarray:
                return _build(cell, descriptor, given, gradients)
            # what the checks make of it (_as_array): a gradient PyTorch expanded from a sum
            # has stride 0 at every call
            value = np.ascontiguousarray(value)
        arrays[name] = value
        key += (name, kind, value.shape, value.dtype)
    given = arrays
    key = tuple(key)
    plan = _SIGNATURES.get(key)
    if plan is None:
        problem, original = _build(cell, descriptor, given, gradients)
        if len(_SIGNATURES) >= SIGNATURES_KEPT:
            _SIGNATURES.clear()
        fields = {k: getattr(problem, k)
                  for k in ("cell", "gradients", "descriptor", "dtype", "T", "N", "I", "H", "G",
                            "D", "Z")}
        # by the given names: Problem.arrays() holds NumPy arrays only, not a GPU array's
        reshaped = {k: getattr(problem, k).shape for k in given
                    if k != "mask" and getattr(problem, k).shape != given[k].shape}
        mask = problem.mask.shape if problem.mask is not None else None  # broadcast to it
        _SIGNATURES[key] = (fields, reshaped, mask, original)
        return problem, original
    fields, reshaped, mask, original = plan
    if reshaped or mask is not None:
        given = dict(given)
        for k, shape in reshaped.items():
            given[k] = given[k].reshape(shape)
        if mask is not None:
            given["mask"] = array_module(given["mask"]).broadcast_to(given["mask"], mask)
    return Problem(**fields, **given), original


def forward_problem(cell, descriptor, **given):
    """Validate a forward call; return (Problem, original shapes)."""
    return _build(cell, descriptor, given, gradients=False)


def gradient_problem(cell, descriptor, **given):
    """Validate a gradient call; return (Problem, original shapes)."""
    return _build(cell, descriptor, given, gradients=True)
