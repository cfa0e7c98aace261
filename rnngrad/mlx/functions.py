"""rnngrad's ops as MLX functions with custom gradients: ``mx.custom_function`` runs the forward
op, its ``vjp`` the gradient op, on any rnngrad backend.

Arguments, layouts and results are those of ``rnngrad.torch.functions`` (rnngrad's: time-major,
MPSGraph's packed gate layouts; SEMANTICS.md §2): each function returns a named tuple ``(state,
final_state)``, or for the LSTM ``(state, cell, final_state, final_cell)``, of ``mx.array``\\ s.
The gradient of ``final_state`` enters the gradient op as ``state_gradient``, that of
``final_cell`` as the final-cell ``cell_gradient``, that of ``cell`` as the per-step one.

Arrays cross into rnngrad without copies (NumPy views of MLX's memory, which the CPU reads
on every MLX device); results come back as MLX arrays, which copy NumPy's memory. MLX cannot
say which inputs need a gradient, so the vjp returns them all (the mask's is zero: it is never
differentiated). The functions evaluate their inputs when called, so they run under
``mx.grad`` / ``mx.value_and_grad`` / ``mx.vjp`` but not inside ``mx.compile`` or ``mx.vmap``
(MLX refuses to evaluate an array there).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import mlx.core as mx
import numpy as np

import rnngrad
from rnngrad import states
from rnngrad.api import FORWARD_INPUTS, FORWARD_OPS
from rnngrad.descriptors import DESCRIPTORS

__all__ = ["single_gate_rnn", "gru", "lstm", "RNNOutput", "LSTMOutput", "INPUTS"]

#: each cell's array arguments, in the order of rnngrad's forward functions
INPUTS = FORWARD_INPUTS
_FORWARD = {cell: getattr(rnngrad, op) for cell, op in FORWARD_OPS.items()}
_GRADIENTS = {cell: getattr(rnngrad, op + "_gradients") for cell, op in FORWARD_OPS.items()}
_DESCRIPTORS = DESCRIPTORS
_FLOATS = (mx.float16, mx.float32, mx.float64)
_MX = {np.dtype(np.float16): mx.float16, np.dtype(np.float32): mx.float32,
       np.dtype(np.float64): mx.float64}


def _to_mx(a: np.ndarray) -> mx.array:
    """An MLX array of ``a``'s values in ``a``'s dtype (mx.array alone makes float64 float32)."""
    return mx.array(a, dtype=_MX[a.dtype])


class RNNOutput(NamedTuple):
    """``state`` h [T,N,D·H]; ``final_state`` [N,D·H]."""

    state: mx.array
    final_state: mx.array


class LSTMOutput(NamedTuple):
    """``state`` h and ``cell`` c [T,N,D·H]; ``final_state`` and ``final_cell`` [N,D·H]."""

    state: mx.array
    cell: mx.array
    final_state: mx.array
    final_cell: mx.array


def _cell_gradient(gc: np.ndarray, gcn: np.ndarray, D: int) -> np.ndarray:
    """The per-step cell gradient [T,N,D·H] with the final cell's added at each direction's
    last processing step (the final-cell form alone when T = 0)."""
    if gc.shape[0] == 0:
        return gcn
    return states.add_to_final(gc.copy(), gcn, D)  # [T,N,DH]


@functools.lru_cache(maxsize=256)
def _op(cell: str, descriptor, backend, names: tuple):
    """The custom function of one cell, descriptor, backend and set of given inputs."""
    lstm = cell == "lstm"
    D = 2 if descriptor.bidirectional else 1
    training = dataclasses.replace(descriptor, training=True,
                                   **({"produce_cell": True} if lstm else {}))

    @mx.custom_function
    def op(*arrays):
        given = {n: np.asarray(a) for n, a in zip(names, arrays)}
        result = _FORWARD[cell](**given, descriptor=training, backend=backend)
        h = result.state  # [T,N,DH]
        outs = [h, states.final(h, D, given.get("init_state"))]
        if lstm:
            c = result.cell  # [T,N,DH]
            outs = [h, c, outs[1], states.final(c, D, given.get("init_cell"))]
        # z_state rides along as a last output: the vjp reads it (callers drop it)
        return tuple(_to_mx(o) for o in outs + [result.z_state])

    @op.vjp
    def op_vjp(primals, cotangents, outputs):
        given = {n: np.asarray(a) for n, a in zip(names, primals)}
        cot = [np.asarray(g) for g in cotangents]
        kw = dict(given, source_gradient=cot[0], z_state=np.asarray(outputs[-1]),
                  state_gradient=cot[2 if lstm else 1])
        if cell == "gru":
            kw["output_fwd"] = np.asarray(outputs[0])
        if lstm:
            kw["cell_output_fwd"] = np.asarray(outputs[1])
            kw["cell_gradient"] = _cell_gradient(cot[1], cot[3], D)
        out = _GRADIENTS[cell](**kw, descriptor=descriptor, backend=backend).as_dict()
        grads = []
        for name, a in zip(names, primals):
            g = out.get(name)
            grads.append(mx.zeros_like(a) if g is None else _to_mx(g.reshape(a.shape)))
        return tuple(grads)

    return op


def apply(cell: str, given: dict, descriptor, backend):
    """The op of ``cell`` on ``given`` ({argument: mx.array or None})."""
    cls = _DESCRIPTORS[cell]
    if descriptor is None:
        descriptor = _default(cell)
    elif not isinstance(descriptor, cls):
        raise TypeError(f"descriptor: expected an rnngrad.{cls.__name__} (or None for the "
                        f"defaults), got {type(descriptor).__name__}")
    present = {}
    for name, a in given.items():
        if a is None:
            continue
        if not isinstance(a, mx.array):
            raise TypeError(f"{name}: expected an mx.array or None, got {type(a).__name__}")
        if a.dtype not in _FLOATS and name != "mask":
            raise TypeError(f"{name}: expected a floating array (float16, float32 or float64), "
                            f"got {a.dtype}")
        present[name] = a
    if "mask" in present and present["mask"].dtype != present["source"].dtype:
        present["mask"] = present["mask"].astype(present["source"].dtype)  # bool → 0/1
    outs = _op(cell, descriptor, backend, tuple(present))(*present.values())[:-1]
    return LSTMOutput(*outs) if cell == "lstm" else RNNOutput(*outs)


@functools.lru_cache(maxsize=None)
def _default(cell):
    return _DESCRIPTORS[cell]()


def single_gate_rnn(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
                    mask=None, *, descriptor=None, backend=None) -> RNNOutput:
    """``rnngrad.single_gate_rnn`` on MLX arrays, differentiable: ``(state, final_state)``."""
    return apply("single_gate", dict(source=source, recurrent_weight=recurrent_weight,
                                     input_weight=input_weight, bias=bias, init_state=init_state,
                                     mask=mask), descriptor, backend)


def gru(source, recurrent_weight, input_weight=None, bias=None, init_state=None, mask=None,
        secondary_bias=None, *, descriptor=None, backend=None) -> RNNOutput:
    """``rnngrad.gru`` on MLX arrays, differentiable: ``(state, final_state)``."""
    return apply("gru", dict(source=source, recurrent_weight=recurrent_weight,
                             input_weight=input_weight, bias=bias, init_state=init_state,
                             mask=mask, secondary_bias=secondary_bias), descriptor, backend)


def lstm(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
         init_cell=None, mask=None, peephole=None, *, descriptor=None, backend=None) -> LSTMOutput:
    """``rnngrad.lstm`` on MLX arrays, differentiable: ``(state, cell, final_state,
    final_cell)``."""
    return apply("lstm", dict(source=source, recurrent_weight=recurrent_weight,
                              input_weight=input_weight, bias=bias, init_state=init_state,
                              init_cell=init_cell, mask=mask, peephole=peephole),
                 descriptor, backend)
