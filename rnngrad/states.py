"""The recurrent states of an op's output, in any array library (NumPy, CuPy, PyTorch, MLX):
each direction's final state, and the layouts of states with and without a direction axis.

rnngrad keeps the directions of a state side by side on the last axis, ``[N,D·H]``; PyTorch,
ONNX and MLX's layers stack them on a leading axis, ``[D,N,H]``. An op's output ``h``
``[T,N,D·H]`` is in processing order for a unidirectional op and aligned with input time for a
bidirectional one (SEMANTICS.md §2.1), so the forward direction's final state is ``h[T−1]`` and
the backward direction's ``h[0]``.

``xp`` is the array module of the arrays: ``numpy``, ``cupy``, ``torch`` or ``mlx.core``; only
``concatenate(arrays, axis=…)``, ``zeros(shape, dtype=…)`` and ``swapaxes`` are used.
"""

from __future__ import annotations

import numpy as np


def zeros(shape, like, xp=np):
    """Zeros of ``like``'s dtype on its device: a tensor's ``new_zeros`` (``torch.zeros`` would
    make them on the CPU); NumPy, CuPy (the current GPU) and MLX make them with ``xp.zeros``."""
    new_zeros = getattr(like, "new_zeros", None)
    return new_zeros(shape) if new_zeros is not None else xp.zeros(shape, dtype=like.dtype)


def final(seq, D: int, initial=None, xp=np):
    """Each direction's state after its last processing step ``[N,D·H]`` of ``seq``
    ``[T,N,D·H]``, an array of its own (never a view of ``seq``); when T = 0, ``initial``
    (``[N,D·H]`` or ``[1,N,D·H]``, copied) or zeros."""
    T, N, DH = seq.shape
    if T == 0:
        if initial is None:
            return zeros((N, DH), seq, xp)
        return xp.concatenate([initial.reshape(N, DH)], axis=-1)  # [N,DH], a copy
    if D == 1:
        last = seq[-1]  # [N,H]
        try:
            return last.copy()  # NumPy, CuPy
        except AttributeError:
            return xp.concatenate([last], axis=-1)  # torch, MLX: a copy
    H = DH // 2
    return xp.concatenate([seq[-1, :, :H], seq[0, :, H:]], axis=-1)  # [N,2H]


def add_to_final(seq, value, D: int):
    """``seq[·]`` at each direction's last processing step ``+= value`` ``[N,D·H]``, in place
    (the indices :func:`final` reads); ``seq`` ``[T,N,D·H]`` is a NumPy array or a tensor."""
    if D == 1:
        seq[-1] += value
    else:
        H = seq.shape[-1] // 2
        seq[-1, :, :H] += value[:, :H]
        seq[0, :, H:] += value[:, H:]
    return seq


def sided(a, D: int, xp=np):
    """``[D,N,H]`` (directions stacked) → ``[N,D·H]`` (side by side): a view for D = 1, a
    copy otherwise."""
    if D == 1:
        return a[0]
    _, N, H = a.shape
    return xp.swapaxes(a, 0, 1).reshape(N, D * H)


def stacked(a, D: int, xp=np):
    """``[N,D·H]`` (side by side) → ``[D,N,H]`` (directions stacked), a view."""
    N = a.shape[0]
    if D == 1:
        return a[None]
    return xp.swapaxes(a.reshape(N, D, -1), 0, 1)
