"""PyTorch's private internals that rnngrad.torch uses for speed, each in one place, with the
public-API fallback it takes where PyTorch does not have it.

Checked to exist and to behave as used on PyTorch 2.11 (the GPU machine) and 2.13 (CPU).
Nothing else in rnngrad.torch touches ``torch._C`` or a private module: where a name here is
missing (another PyTorch), the fallback keeps every result the same and costs only speed, or,
for the checks that tell a plain eager call, sends the call down the general path
(``torch.ops.rnngrad.*``), which serves every call.

======================================  ================================  =========================
internal                                used for                          fallback
======================================  ================================  =========================
``torch._C._FunctionBase`` ``apply``    an autograd.Function applied      ``Function.apply``
                                        without its Python layer
``torch._C._functorch.unwrap_if_dead``  what that Python layer does       (unused with the
                                        that still matters                fallback above)
``torch._C._AutoDispatchBelowAutograd``  the operators called inside an   a null context (the
                                        autograd.Function's forward,      operator's autograd
                                        below their autograd key          then sees no grad mode)
``torch._C._functorch.``                whether a torch.func transform    "maybe": not plain
``peek_interpreter_stack``              is active
``torch.utils._python_dispatch.``       whether a dispatch mode is        "maybe": not plain
``_get_current_dispatch_mode``          active
``torch._C._is_torch_function_``        whether a function mode is        "maybe": not plain
``mode_enabled``                        active
``torch._C._cuda_getCurrentRawStream``  the current CUDA stream's         ``torch.cuda.
                                        handle, cheaply                   current_stream().
                                                                          cuda_stream``
``torch._C._from_dlpack``               a DLPack capsule as a tensor      ``torch.utils.dlpack.
                                        without the stream handshake      from_dlpack``
======================================  ================================  =========================
"""

from __future__ import annotations

import contextlib

import torch


def _get(owner, name: str):
    return getattr(owner, name, None) if owner is not None else None


_C = torch._C
_functorch = _get(_C, "_functorch")
try:
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # another PyTorch: every call may be under a mode
    _get_current_dispatch_mode = None

_APPLY = _get(_get(_C, "_FunctionBase"), "__dict__")
_APPLY = _APPLY.get("apply") if _APPLY is not None else None
_UNWRAP = _get(_functorch, "unwrap_if_dead")
_BELOW_AUTOGRAD = _get(_C, "_AutoDispatchBelowAutograd")
_PEEK = _get(_functorch, "peek_interpreter_stack")
_FUNCTION_MODE = _get(_C, "_is_torch_function_mode_enabled")
_RAW_STREAM = _get(_C, "_cuda_getCurrentRawStream")
_FROM_DLPACK = _get(_C, "_from_dlpack")

#: which internals this PyTorch has (the fallbacks serve the others)
AVAILABLE = {name: value is not None for name, value in (
    ("apply", _APPLY), ("unwrap_if_dead", _UNWRAP), ("below_autograd", _BELOW_AUTOGRAD),
    ("peek_interpreter_stack", _PEEK), ("dispatch_mode", _get_current_dispatch_mode),
    ("function_mode", _FUNCTION_MODE), ("raw_stream", _RAW_STREAM),
    ("from_dlpack", _FROM_DLPACK))}


def fast_apply(function: type):
    """``function.apply`` (an autograd.Function subclass) less its Python layer, which walks
    every argument for functorch's dead wrappers: callers unwrap the tensors that could be one
    themselves (:func:`unwrap`), and call only where :func:`transforming` is False."""
    if _APPLY is None or _UNWRAP is None:
        return function.apply
    return _APPLY.__get__(None, function)


def unwrap(t):
    """A tensor a dead functorch transform left wrapped, unwrapped (itself otherwise)."""
    return _UNWRAP(t) if _UNWRAP is not None else t


def below_autograd():
    """A block whose operator calls skip their autograd key (inside an autograd.Function's
    forward, which holds the formula itself)."""
    return _BELOW_AUTOGRAD() if _BELOW_AUTOGRAD is not None else contextlib.nullcontext()


def transforming() -> bool:
    """Whether something may be tracing or transforming the current call: torch.compile,
    torch.export, a torch.func transform, a dispatch or function mode. True where PyTorch
    cannot say (a missing internal)."""
    if torch.compiler.is_compiling():
        return True
    if _PEEK is None or _get_current_dispatch_mode is None or _FUNCTION_MODE is None:
        return True
    return _PEEK() is not None or _get_current_dispatch_mode() is not None or _FUNCTION_MODE()


def raw_stream(index: int) -> int:
    """The handle of CUDA device ``index``'s current stream (0: the legacy default stream)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


def from_dlpack_unsynchronised(array) -> torch.Tensor:
    """A tensor over ``array``'s memory through DLPack, without the stream handshake (the
    caller made it on PyTorch's current stream; stream -1 asks the producer for no
    synchronisation, which a CUDA graph's capture could not take)."""
    if _FROM_DLPACK is not None:
        return _FROM_DLPACK(array.__dlpack__(stream=-1))
    return torch.utils.dlpack.from_dlpack(array)
