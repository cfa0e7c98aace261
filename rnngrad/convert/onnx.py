"""ONNX ``RNN``, ``GRU`` and ``LSTM`` operators ⇄ rnngrad.

ONNX tensors (``D`` directions, ``G`` gates, layout 0 = time-major, 1 = batch-first):

=============  ====================================  ====================================
X              [T,N,I]  (layout 1: [N,T,I])          rnngrad ``source`` [T,N,I]
W              [D, G·H, I]                           ``input_weight`` [D·G·H, I]
R              [D, G·H, H]                           ``recurrent_weight`` [G·H,H] / [2,G·H,H]
B              [D, 2·G·H] = [Wb, Rb]                 ``bias`` [D·G·H] = Wb + Rb (see GRU)
initial_h/c    [D,N,H]  (layout 1: [N,D,H])          ``init_state`` / ``init_cell`` [N,D·H]
P              [D, 3H] = [Pi, Po, Pf]                ``peephole`` [4H] / [2,4H] = [Pi, Pf, 0, 0]
Y              [T,D,N,H] (layout 1: [N,T,D,H])       rnngrad ``h`` [T,N,D·H]
Y_h, Y_c       [D,N,H]  (layout 1: [N,D,H])          each direction's final state
=============  ====================================  ====================================

Gate orders: RNN one gate; GRU ``z, r, h`` = rnngrad's default ``[z, r, o]``; LSTM
``i, o, f, c`` → rnngrad's ``[i, f, z, o]`` (the blocks are permuted).

GRU: ONNX's ``Ht = (1 − zt) ⊙ ht + zt ⊙ Ht−1`` is ``flip_z=False``. With
``linear_before_reset=0``, ``ht = g(Xt Whᵀ + (rt ⊙ Ht−1) Rhᵀ + Rbh + Wbh)``: Rbh is outside the
reset product and folds into ``bias`` (``reset_after=False``). With ``linear_before_reset=1``,
``ht = g(Xt Whᵀ + rt ⊙ (Ht−1 Rhᵀ + Rbh) + Wbh)``: ``reset_after=True`` and Rbh is
``secondary_bias``.

LSTM peepholes: ONNX's input and forget peepholes read ``c[t−1]``, as MPSGraph's do, but ONNX's
output peephole reads ``c[t]`` while MPSGraph's reads ``c[t−1]``. So P maps only when its output
block Po is zero; any other P is a ``ValueError``. Gradients still give ONNX's ``dL/dPo``
(``Σ da_o ⊙ c[t]``), from a second gradient call on the projected input.

Outputs: ONNX aligns ``Y`` with input time for every direction (``reverse`` too: ``Y[t]`` is the
state after consuming ``X[T−1..t]`` and ``Y_h = Y[0]``); rnngrad returns a unidirectional
``reverse`` op's outputs in processing order, so they are flipped on the way out (and ``dY`` on
the way in).

Activations: ``Relu``, ``Tanh``, ``Sigmoid`` and ``HardSigmoid`` with ONNX's default
alpha = 0.2, beta = 0.5 (rnngrad's hard sigmoid). Each rnngrad descriptor has one set of
activations for both directions, so a bidirectional node must use the same list for both.
Not supported (``ValueError``): ``clip``, ``input_forget=1``, ``sequence_lens``,
``activation_alpha`` / ``activation_beta`` and other activation functions.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ..descriptors import Activation, GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor
from ._common import call_forward, call_gradients, final_state, sided_to_stacked, stacked_to_sided, to_numpy

__all__ = ["OnnxRNN", "OnnxGradients", "from_arrays", "from_node", "OP_TYPES", "DIRECTIONS"]

#: ONNX op type → (rnngrad cell, gates, ONNX block of each rnngrad block)
OP_TYPES = {
    "RNN": ("single_gate", 1, (0,)),
    "GRU": ("gru", 3, (0, 1, 2)),  # z, r, h = [z, r, o]
    "LSTM": ("lstm", 4, (0, 2, 3, 1)),  # rnngrad [i, f, z, o] from ONNX [i, o, f, c]
}
DIRECTIONS = ("forward", "reverse", "bidirectional")
_DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
_ACTIVATIONS = {"relu": Activation.RELU, "tanh": Activation.TANH, "sigmoid": Activation.SIGMOID,
                "hardsigmoid": Activation.HARD_SIGMOID}


def _permute_gates(a, order, H, axis):
    """Reorder the G blocks of H along ``axis``: block k of the result is block ``order[k]``."""
    blocks = np.split(a, len(order), axis=axis)
    return np.concatenate([blocks[k] for k in order], axis=axis)


def _inverse(order):
    inv = [0] * len(order)
    for k, j in enumerate(order):
        inv[j] = k
    return tuple(inv)


@dataclasses.dataclass(frozen=True)
class OnnxGradients:
    """Gradients in ONNX's layouts, by ONNX input name: X, W, R, B, initial_h, initial_c, P
    (None for an input that was not given)."""

    X: np.ndarray
    W: np.ndarray
    R: np.ndarray
    B: Optional[np.ndarray] = None
    initial_h: Optional[np.ndarray] = None
    initial_c: Optional[np.ndarray] = None
    P: Optional[np.ndarray] = None


@dataclasses.dataclass(frozen=True)
class OnnxRNN:
    """One ONNX RNN/GRU/LSTM node as rnngrad arguments.

    Fields are rnngrad's: ``descriptor``; ``input_weight`` [D·G·H,I]; ``recurrent_weight``
    [G·H,H] or [2,G·H,H]; ``bias`` [D·G·H] or None; ``secondary_bias`` [D·H] or None (GRU with
    linear_before_reset=1 and B given); ``peephole`` [4H] or [2,4H] or None (LSTM with P given).
    ``op_type``, ``direction``, ``layout``, ``linear_before_reset`` are the node's.
    """

    op_type: str
    descriptor: object
    input_weight: np.ndarray
    recurrent_weight: np.ndarray
    bias: Optional[np.ndarray] = None
    secondary_bias: Optional[np.ndarray] = None
    peephole: Optional[np.ndarray] = None
    direction: str = "forward"
    layout: int = 0
    linear_before_reset: int = 0

    @property
    def cell(self) -> str:
        return OP_TYPES[self.op_type][0]

    @property
    def G(self) -> int:
        return OP_TYPES[self.op_type][1]

    @property
    def D(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    @property
    def H(self) -> int:
        return self.recurrent_weight.shape[-1]

    @property
    def _order(self):
        return OP_TYPES[self.op_type][2]

    # -- ONNX → rnngrad -----------------------------------------------------------------------
    def _time_major(self, a, name):
        a = to_numpy(a, name, ndim=3)
        return None if a is None else (np.ascontiguousarray(a.transpose(1, 0, 2)) if self.layout else a)

    def _state_in(self, a, name, N):
        a = to_numpy(a, name, ndim=3)
        if a is None:
            return None
        if self.layout:  # [N,D,H]
            a = a.transpose(1, 0, 2)
        return stacked_to_sided(a, name + (" (as [D,N,H])" if self.layout else ""), self.D, N, self.H)

    def _state_out(self, a):
        a = sided_to_stacked(a, self.D, self.H)  # [D,N,H]
        return None if a is None else (np.ascontiguousarray(a.transpose(1, 0, 2)) if self.layout else a)

    def arguments(self, X, initial_h=None, initial_c=None) -> dict:
        """rnngrad's keyword arguments of the forward op for the node run on these inputs."""
        source = self._time_major(X, "X")
        N = source.shape[1]
        args = dict(source=source, recurrent_weight=self.recurrent_weight, input_weight=self.input_weight)
        if self.bias is not None:
            args["bias"] = self.bias
        h0 = self._state_in(initial_h, "initial_h", N)
        if h0 is not None:
            args["init_state"] = h0
        if initial_c is not None:
            if self.cell != "lstm":
                raise ValueError(f"initial_c: only LSTM has one, got one for {self.op_type}")
            args["init_cell"] = self._state_in(initial_c, "initial_c", N)
        if self.secondary_bias is not None:
            args["secondary_bias"] = self.secondary_bias
        if self.peephole is not None:
            args["peephole"] = self.peephole
        return args

    def _aligned(self, seq):
        """rnngrad [T,…] ↔ ONNX time order (a unidirectional reverse op flips)."""
        return seq[::-1] if self.direction == "reverse" else seq

    def upstream(self, T, N, dY=None, dY_h=None, dY_c=None, dtype=None) -> dict:
        """rnngrad's source_gradient / state_gradient / cell_gradient for the gradients of
        Y, Y_h and Y_c (each may be None, meaning zero)."""
        D, H = self.D, self.H
        dtype = dtype or self.recurrent_weight.dtype
        if dY is None:
            gy = np.zeros((T, N, D * H), dtype)
        else:
            dY = to_numpy(dY, "dY", ndim=4)
            want = (N, T, D, H) if self.layout else (T, D, N, H)
            if dY.shape != want:
                raise ValueError(f"dY: expected shape {want}, got {dY.shape}")
            gy = dY.transpose(1, 0, 2, 3) if self.layout else dY.transpose(0, 2, 1, 3)  # [T,N,D,H]
            gy = np.ascontiguousarray(self._aligned(gy.reshape(T, N, D * H)))
        out = {"source_gradient": gy, "state_gradient": self._state_in(dY_h, "dY_h", N)}
        if self.cell == "lstm":
            out["cell_gradient"] = self._state_in(dY_c, "dY_c", N)
        elif dY_c is not None:
            raise ValueError(f"dY_c: only LSTM has Y_c, got one for {self.op_type}")
        return out

    # -- rnngrad → ONNX -----------------------------------------------------------------------
    def outputs(self, result):
        """(Y, Y_h, Y_c) in ONNX's layout from an rnngrad forward result (Y_c None except LSTM)."""
        D, H = self.D, self.H
        h = result.state  # [T,N,DH]
        T, N = h.shape[:2]
        Y = self._aligned(h).reshape(T, N, D, H)
        Y = Y.transpose(1, 0, 2, 3) if self.layout else Y.transpose(0, 2, 1, 3)
        Y_h = final_state(h, D, H)  # [D,N,H]
        Y_c = final_state(result.cell, D, H) if self.cell == "lstm" else None
        if self.layout:
            Y_h = Y_h.transpose(1, 0, 2)
            Y_c = None if Y_c is None else Y_c.transpose(1, 0, 2)
        return np.ascontiguousarray(Y), np.ascontiguousarray(Y_h), \
            (None if Y_c is None else np.ascontiguousarray(Y_c))

    def parameter_gradients(self, grads, output_peephole_gradient=None) -> dict:
        """ONNX's W, R, B (and P) gradients from an rnngrad GradientResult. P's output block
        is ``output_peephole_gradient`` [D,H] (ONNX's Po reads c[t], which rnngrad's
        gradient op does not differentiate); :meth:`gradients` computes it."""
        D, G, H = self.D, self.G, self.H
        GH, inv = G * H, _inverse(self._order)
        dW = grads.input_weight.reshape(D, GH, -1)
        out = {"W": _permute_gates(dW, inv, H, axis=1),
               "R": _permute_gates(grads.recurrent_weight.reshape(D, GH, H), inv, H, axis=1)}
        if grads.bias is not None:
            db = grads.bias.reshape(D, GH)  # rnngrad layout
            dRb = db.copy()
            if self.cell == "gru" and self.linear_before_reset:
                dRb[:, 2 * H:] = grads.secondary_bias.reshape(D, H)
            out["B"] = np.concatenate([_permute_gates(db, inv, H, axis=1),
                                       _permute_gates(dRb, inv, H, axis=1)], axis=1)  # [D,2GH]
        if grads.peephole is not None:
            dp = grads.peephole.reshape(D, 4 * H)  # [i, f, z, o]
            dPo = (np.full((D, H), np.nan, dp.dtype) if output_peephole_gradient is None
                   else output_peephole_gradient.reshape(D, H))
            out["P"] = np.concatenate([dp[:, :H], dPo, dp[:, H:2 * H]], axis=1)  # [D,3H]
        return out

    def input_gradients(self, grads):
        """(dX, d initial_h, d initial_c) in ONNX's layout (None for absent inputs)."""
        dX = grads.source
        dX = np.ascontiguousarray(dX.transpose(1, 0, 2)) if self.layout else dX
        return dX, self._state_out(grads.init_state), self._state_out(grads.init_cell)

    # -- whole calls --------------------------------------------------------------------------
    def forward(self, X, initial_h=None, initial_c=None, *, backend=None):
        """The node's outputs (Y, Y_h, Y_c) computed by rnngrad (Y_c None except LSTM)."""
        return self.outputs(call_forward(self.cell, self.descriptor,
                                         self.arguments(X, initial_h, initial_c), backend))

    def gradients(self, X, initial_h=None, initial_c=None, dY=None, dY_h=None, dY_c=None, *,
                  backend=None) -> OnnxGradients:
        """Gradients of ``L = Σ dY ⊙ Y + Σ dY_h ⊙ Y_h (+ Σ dY_c ⊙ Y_c)`` with respect to the
        node's inputs, by rnngrad, in ONNX's layouts."""
        args = self.arguments(X, initial_h, initial_c)
        T, N = args["source"].shape[:2]
        up = self.upstream(T, N, dY, dY_h, dY_c, dtype=args["source"].dtype)
        run = call_gradients(self.cell, self.descriptor, args, backend=backend, **up)
        dPo = self._output_peephole_gradient(args, up, run, backend) if self.peephole is not None else None
        dX, dh0, dc0 = self.input_gradients(run.gradients)
        params = self.parameter_gradients(run.gradients, dPo)
        return OnnxGradients(X=dX, initial_h=dh0, initial_c=dc0, **params)

    def _output_peephole_gradient(self, args, up, run, backend):
        """ONNX's dL/dPo = Σ_t,n da_o[t] ⊙ c[t], per direction [D,H]. Without input_weight the
        gradient op returns dA = dL/dx' itself ([T,N,D·4H], input time), so one more call on the
        projected input gives da_o."""
        D, H = self.D, self.H
        projected = args["source"] @ self.input_weight.T  # [T,N,D4H]
        if self.bias is not None:
            projected = projected + self.bias
        raw = {k: v for k, v in args.items() if k not in ("input_weight", "bias")}
        raw["source"] = projected
        dA = call_gradients(self.cell, self.descriptor, raw, backend=backend, **up).gradients.source
        c = self._aligned(run.forward.cell) if D == 1 else run.forward.cell  # [T,N,DH], input time
        o = self.descriptor.gate_index["o"]
        return np.stack([np.sum(dA[:, :, d * 4 * H + o * H:d * 4 * H + (o + 1) * H]
                                * c[:, :, d * H:(d + 1) * H], axis=(0, 1)) for d in range(D)])


def _activations(op_type, activations, D):
    names = tuple(activations) if activations else _DEFAULT_ACTIVATIONS[op_type] * D
    per = len(_DEFAULT_ACTIVATIONS[op_type])
    if len(names) == per and D == 2:  # one list given for both directions
        names = names * 2
    if len(names) != per * D:
        raise ValueError(f"activations: expected {per * D} names for a {D}-direction {op_type}, "
                         f"got {list(names)}")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if D == 2 and [n.lower() for n in names[:per]] != [n.lower() for n in names[per:]]:
        raise ValueError(f"activations: rnngrad uses one set of activations for both directions, "
                         f"got {names[:per]} forward and {names[per:]} reverse")
    out = []
    for n in names[:per]:
        if n.lower() not in _ACTIVATIONS:
            raise ValueError(f"activations: expected one of Relu, Tanh, Sigmoid, HardSigmoid "
                             f"(alpha 0.2, beta 0.5), got {n!r}")
        out.append(_ACTIVATIONS[n.lower()])
    return out


def from_arrays(op_type, W, R, B=None, P=None, *, direction="forward", hidden_size=None,
                activations=None, linear_before_reset=0, layout=0, clip=None, input_forget=0,
                activation_alpha=None, activation_beta=None) -> OnnxRNN:
    """An :class:`OnnxRNN` from the node's weights (W, R, optional B and P) and attributes,
    named and defaulted as in the ONNX operator specification."""
    if op_type not in OP_TYPES:
        raise ValueError(f"op_type: expected one of {sorted(OP_TYPES)}, got {op_type!r}")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    if clip is not None:
        raise ValueError(f"clip: expected None (rnngrad has no cell clipping), got {clip!r}")
    if input_forget:
        raise ValueError(f"input_forget: expected 0 (rnngrad has no coupled input-forget gate), got {input_forget!r}")
    if activation_alpha or activation_beta:
        raise ValueError(f"activation_alpha/activation_beta: expected none (only the default "
                         f"parameters map), got {activation_alpha!r} / {activation_beta!r}")
    if layout not in (0, 1):
        raise ValueError(f"layout: expected 0 or 1, got {layout!r}")
    if linear_before_reset not in (0, 1):
        raise ValueError(f"linear_before_reset: expected 0 or 1, got {linear_before_reset!r}")
    cell, G, order = OP_TYPES[op_type]
    D = 2 if direction == "bidirectional" else 1
    W, R, B, P = (to_numpy(a, n) for a, n in ((W, "W"), (R, "R"), (B, "B"), (P, "P")))
    if R.ndim != 3 or R.shape[0] != D or R.shape[1] != G * R.shape[2]:
        raise ValueError(f"R: expected shape [{D}, {G}·H, H] for a {direction} {op_type}, got {R.shape}")
    H = R.shape[2]
    if hidden_size is not None and hidden_size != H:
        raise ValueError(f"hidden_size: expected {H} (from R's shape {R.shape}), got {hidden_size}")
    if W.ndim != 3 or W.shape[:2] != (D, G * H):
        raise ValueError(f"W: expected shape ({D}, {G * H}, I), got {W.shape}")
    if B is not None and B.shape != (D, 2 * G * H):
        raise ValueError(f"B: expected shape {(D, 2 * G * H)}, got {B.shape}")
    acts = _activations(op_type, activations, D)
    common = dict(reverse=direction == "reverse", bidirectional=D == 2)
    if cell == "single_gate":
        desc = SingleGateRNNDescriptor(activation=acts[0], **common)
    elif cell == "gru":
        desc = GRUDescriptor(reset_after=bool(linear_before_reset), flip_z=False,
                             update_gate_activation=acts[0], reset_gate_activation=acts[0],
                             output_gate_activation=acts[1], **common)
    else:
        desc = LSTMDescriptor(input_gate_activation=acts[0], forget_gate_activation=acts[0],
                              output_gate_activation=acts[0], cell_gate_activation=acts[1],
                              activation=acts[2], **common)
    input_weight = _permute_gates(W, order, H, axis=1).reshape(D * G * H, W.shape[2])  # [DGH,I]
    recurrent = _permute_gates(R, order, H, axis=1)  # [D,GH,H]
    bias = secondary = peephole = None
    if B is not None:
        Wb = _permute_gates(B[:, :G * H], order, H, axis=1)  # [D,GH]
        Rb = _permute_gates(B[:, G * H:], order, H, axis=1)  # [D,GH]
        if cell == "gru" and linear_before_reset:
            secondary = Rb[:, 2 * H:].reshape(D * H).copy()  # [DH] inside the reset product
            Rb = Rb.copy()
            Rb[:, 2 * H:] = 0
        bias = (Wb + Rb).reshape(D * G * H)  # [DGH]
    if P is not None:
        if cell != "lstm":
            raise ValueError(f"P: only LSTM has peepholes, got one for {op_type}")
        if P.shape != (D, 3 * H):
            raise ValueError(f"P: expected shape {(D, 3 * H)}, got {P.shape}")
        Pi, Po, Pf = P[:, :H], P[:, H:2 * H], P[:, 2 * H:]
        if np.any(Po != 0):
            raise ValueError(
                "P: the output peephole Po (P[:, H:2H]) must be zero: ONNX's output gate reads "
                "c[t] and MPSGraph's reads c[t-1], so no rnngrad peephole equals a non-zero Po; "
                f"got max |Po| = {float(np.max(np.abs(Po)))}")
        zeros = np.zeros_like(Pi)
        p = np.concatenate([Pi, Pf, zeros, zeros], axis=1)  # [D,4H] in [i, f, z, o]
        peephole = p if D == 2 else p[0]
    return OnnxRNN(op_type=op_type, descriptor=desc, input_weight=np.ascontiguousarray(input_weight),
                   recurrent_weight=recurrent if D == 2 else recurrent[0], bias=bias,
                   secondary_bias=secondary, peephole=peephole, direction=direction,
                   layout=int(layout), linear_before_reset=int(linear_before_reset))


def from_node(node, initializers) -> OnnxRNN:
    """An :class:`OnnxRNN` from an ``onnx.NodeProto`` and its weights: ``initializers`` maps
    input names to arrays (or ``onnx.TensorProto``s). X, initial_h and initial_c stay inputs of
    :meth:`OnnxRNN.forward`; ``sequence_lens`` must be absent."""
    from onnx import helper, numpy_helper

    if node.op_type not in OP_TYPES:
        raise ValueError(f"node.op_type: expected one of {sorted(OP_TYPES)}, got {node.op_type!r}")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    names = list(node.input) + [""] * 8

    def value(position, label):
        name = names[position]
        if not name:
            return None
        if name not in initializers:
            raise ValueError(f"initializers: expected an array for {label} ({name!r}), got none")
        v = initializers[name]
        return numpy_helper.to_array(v) if hasattr(v, "raw_data") else np.asarray(v)

    if names[4]:
        raise ValueError(f"sequence_lens: expected none (every sequence has length T), got input {names[4]!r}")
    return from_arrays(node.op_type, value(1, "W"), value(2, "R"), value(3, "B"),
                       value(7, "P") if node.op_type == "LSTM" else None,
                       direction=attrs.get("direction", "forward"),
                       hidden_size=attrs.get("hidden_size"),
                       activations=attrs.get("activations"),
                       linear_before_reset=attrs.get("linear_before_reset", 0),
                       layout=attrs.get("layout", 0), clip=attrs.get("clip"),
                       input_forget=attrs.get("input_forget", 0),
                       activation_alpha=attrs.get("activation_alpha"),
                       activation_beta=attrs.get("activation_beta"))
