"""What the PyTorch and ONNX converters share: array intake, the per-direction layouts of states,
and the rnngrad calls (a training forward feeding the gradient op).

Shapes: ``T`` steps, ``N`` batch, ``H`` hidden units, ``D`` directions. rnngrad keeps the
directions of a state side by side on the last axis (``[N,D·H]``); PyTorch and ONNX stack them on
a leading axis (``[D,N,H]``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import api, states
from ..api import FORWARD_OPS


def to_numpy(value, name, ndim=None):
    """A NumPy array from an ndarray, a (CPU or device) torch tensor, or any array-like."""
    if value is None:
        return None
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {array.shape}")
    return array


def stacked_to_sided(a, name, D, N, H):
    """[D,N,H] (PyTorch h_0 / ONNX initial_h) → [N,D·H] (rnngrad init_state)."""
    if a is None:
        return None
    if a.shape != (D, N, H):
        raise ValueError(f"{name}: expected shape {(D, N, H)}, got {a.shape}")
    return np.ascontiguousarray(states.sided(a, D))  # [N,DH]


def sided_to_stacked(a, D, H):
    """[N,D·H] (rnngrad) → [D,N,H] (PyTorch / ONNX)."""
    if a is None:
        return None
    return np.ascontiguousarray(states.stacked(a, D))  # [D,N,H]


def final_state(seq, D, H):
    """Each direction's state after its last processing step, [D,N,H], from rnngrad's
    [T,N,D·H] output (processing order for a unidirectional op, aligned for a bidirectional one)."""
    return sided_to_stacked(states.final(seq, D), D, H)


@dataclasses.dataclass
class Run:
    """One rnngrad forward (training) and, when asked, its gradient op: the rnngrad-side
    quantities before they are put in the framework's layout."""

    forward: object  # ForwardResult with state, cell (LSTM), z_state
    gradients: object = None  # GradientResult or None


def call_forward(cell, descriptor, arguments, backend, training=False):
    desc = dataclasses.replace(descriptor, training=training,
                               **({"produce_cell": True} if cell == "lstm" else {}))
    return getattr(api, FORWARD_OPS[cell])(**arguments, descriptor=desc, backend=backend)


def call_gradients(cell, descriptor, arguments, source_gradient, state_gradient=None,
                   cell_gradient=None, backend=None) -> Run:
    """A training forward of ``arguments`` and the gradient op fed by it."""
    out = call_forward(cell, descriptor, arguments, backend, training=True)
    kw = dict(arguments, source_gradient=source_gradient, z_state=out.z_state,
              state_gradient=state_gradient)
    if cell == "gru":
        kw["output_fwd"] = out.state
    if cell == "lstm":
        kw["cell_output_fwd"] = out.cell
        kw["cell_gradient"] = cell_gradient
    grads = getattr(api, FORWARD_OPS[cell] + "_gradients")(**kw, descriptor=descriptor, backend=backend)
    return Run(out, grads)
