"""An array layer's factory (:mod:`rnngrad.testing.arrays`) as candidates of
:func:`rnngrad.testing.check_backend`: the forward op and the gradient op of its cell, with
rnngrad's signatures, computed by the framework's layer::

    from rnngrad.testing import check_backend
    from rnngrad.testing.layer_ops import layer_ops
    from rnngrad.testing.adapters.flax import flax_adapter
    forward, gradients = layer_ops(flax_adapter("gru"), "gru")
    knobs = layer_knobs(flax_adapter("gru"), "gru")   # the problems the layer can express
    check_backend(gradients, "gru_gradients", forward=forward, **knobs)

A problem the layer cannot express raises :class:`rnngrad.testing.Unsupported` and is skipped:
descriptor options other than the layer's own (its ``descriptor``), ``reverse`` without
``bidirectional``, a mask, a peephole, no input weight, a secondary bias the layer lacks, two
directions where the factory's capabilities have one, and per-step cells (the layer returns
c only at the end: an LSTM's forward is checked with ``training=False, produce_cell=False``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .check import Unsupported

__all__ = ["layer_ops", "layer_knobs"]

_CELLS = {"rnn": "single_gate", "gru": "gru", "lstm": "lstm"}


def _layer(factory, cell, inputs, descriptor):
    """(layer, params by rnngrad's names, D, H, batch_first) for one op call, or Unsupported."""
    caps = getattr(factory, "capabilities", None)
    if inputs.get("mask") is not None or inputs.get("peephole") is not None:
        raise Unsupported("a mask or a peephole: not in the layer")
    if inputs.get("input_weight") is None:
        raise Unsupported("no input weight: the layer always projects its input")
    if descriptor.reverse and not descriptor.bidirectional:
        raise Unsupported("reverse: the layer runs one direction forward")
    D = 2 if descriptor.bidirectional else 1
    if D == 2 and caps is not None and not caps.bidirectional:
        raise Unsupported("bidirectional: not in the layer")
    R = np.asarray(inputs["recurrent_weight"])
    H, I = R.shape[-1], inputs["input_weight"].shape[1]
    batch_first = caps is not None and "time_major" not in caps.layouts
    nonlinearity = "relu" if getattr(descriptor, "activation", None) == 1 and cell == "rnn" else "tanh"
    try:
        layer = factory(input_size=I, hidden_size=H, num_layers=1, bias=inputs.get("bias") is not None,
                        batch_first=batch_first, dropout=0.0, bidirectional=D == 2,
                        **({"nonlinearity": nonlinearity} if cell == "rnn" else {}))
    except (ValueError, NotImplementedError) as exc:
        raise Unsupported(f"the factory declined: {exc}") from exc
    own = dataclasses.replace(layer.descriptor, bidirectional=descriptor.bidirectional,
                              training=descriptor.training, reverse=descriptor.reverse,
                              **({"produce_cell": descriptor.produce_cell} if cell == "lstm" else {}))
    if own != descriptor:
        raise Unsupported(f"descriptor: the layer computes {own}")
    G = R.shape[-2] // H
    W, b = np.asarray(inputs["input_weight"]), inputs.get("bias")
    R = R.reshape(D, G * H, H)
    params = {}
    for d, sfx in enumerate(("_l0", "_l0_reverse")[:D]):
        params[f"input_weight{sfx}"] = W[d * G * H:(d + 1) * G * H]
        params[f"recurrent_weight{sfx}"] = R[d]
        if b is not None:
            params[f"bias{sfx}"] = np.asarray(b)[d * G * H:(d + 1) * G * H]
        if f"secondary_bias{sfx}" in layer.parameter_names:
            b2 = inputs.get("secondary_bias")
            params[f"secondary_bias{sfx}"] = (np.zeros(H, W.dtype) if b2 is None
                                              else np.asarray(b2)[d * H:(d + 1) * H])
        elif inputs.get("secondary_bias") is not None and getattr(descriptor, "reset_after", False):
            raise Unsupported("secondary_bias: the layer has none")
    return layer, params, D, H, batch_first


def _states(a, D, H):
    """[N,D·H] → [D,N,H]."""
    return None if a is None else np.ascontiguousarray(
        np.asarray(a).reshape(a.shape[0], D, H).transpose(1, 0, 2))


def _sided(a):
    """[D,N,H] → [N,D·H]."""
    a = np.asarray(a)
    return np.ascontiguousarray(a.transpose(1, 0, 2).reshape(a.shape[1], -1))


def layer_knobs(factory, cell, *, forward=False) -> dict:
    """check_backend's knobs for the problems the factory's layer can express: ``descriptor``
    (the options its cell computes, ``reverse`` off; ``forward=True`` adds an LSTM's
    ``training=False, produce_cell=False``: the layer has no per-step cells), ``optional`` (an
    input weight, no mask, no peephole), ``empty=False`` and final cells only."""
    layer = factory(input_size=1, hidden_size=1, num_layers=1, bias=True,
                    batch_first=not (getattr(factory, "capabilities", None) is None
                                     or "time_major" in factory.capabilities.layouts),
                    dropout=0.0, bidirectional=False)
    skip = {"bidirectional", "reverse", "training", "produce_cell"}
    options = {f.name: getattr(layer.descriptor, f.name) for f in dataclasses.fields(layer.descriptor)
               if f.name not in skip}
    options["reverse"] = False
    if forward and cell == "lstm":
        options.update(training=False, produce_cell=False)
    optional = {"input_weight": True, "mask": False}
    optional.update({"peephole": False} if cell == "lstm" else {})
    return dict(descriptor=options, optional=optional, empty=False,
                **({"cell_gradient_form": "final"} if cell == "lstm" else {}))


def layer_ops(factory, cell):
    """(forward, gradients): callables with the signatures of rnngrad's ops of ``cell`` ("rnn",
    "gru", "lstm"), computed by the factory's array layer."""
    if cell not in _CELLS:
        raise ValueError(f"cell: expected one of {tuple(_CELLS)}, got {cell!r}")

    def run(source, recurrent_weight, descriptor, cotangents=None, **inputs):
        inputs = dict(inputs, recurrent_weight=recurrent_weight)
        # a training forward feeds the gradient op, which needs nothing from it (z_state=False)
        if cell == "lstm" and descriptor.produce_cell and not descriptor.training:
            raise Unsupported("per-step cells: the layer returns c only at the end")
        layer, params, D, H, batch_first = _layer(factory, cell, inputs, descriptor)
        x = np.ascontiguousarray(source.transpose(1, 0, 2) if batch_first else source)
        h0, c0 = inputs.get("init_state"), inputs.get("init_cell")
        if cell == "lstm" and (h0 is None) != (c0 is None):  # a layer takes both or neither
            h0 = np.zeros_like(c0) if h0 is None else h0
            c0 = np.zeros_like(h0) if c0 is None else c0
        out = layer.run(params, x, h0=_states(h0, D, H), c0=_states(c0, D, H), cotangents=cotangents)
        y = np.asarray(out["output"])
        return out, (y.transpose(1, 0, 2) if batch_first else y), params, batch_first

    def forward(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
                init_cell=None, mask=None, peephole=None, secondary_bias=None, descriptor=None):
        _, h, _, _ = run(source, recurrent_weight, descriptor, input_weight=input_weight, bias=bias,
                         init_state=init_state, init_cell=init_cell, mask=mask, peephole=peephole,
                         secondary_bias=secondary_bias)
        return [np.ascontiguousarray(h)]

    def gradients(source, recurrent_weight, source_gradient, z_state=None, state_gradient=None,
                  input_weight=None, bias=None, init_state=None, init_cell=None, mask=None,
                  peephole=None, secondary_bias=None, cell_gradient=None, output_fwd=None,
                  cell_output_fwd=None, descriptor=None):
        T, N = source.shape[:2]
        D = 2 if descriptor.bidirectional else 1
        H = np.asarray(recurrent_weight).shape[-1]
        if cell_gradient is not None and np.ndim(cell_gradient) == 3 and cell_gradient.shape[0] == T and T != 1:
            raise Unsupported("per-step cell gradients: the layer returns c only at the end")
        fwd = dataclasses.replace(descriptor, training=False,
                                  **({"produce_cell": False} if cell == "lstm" else {}))
        sided = lambda a: None if a is None else _states(np.asarray(a).reshape(N, D * H), D, H)  # noqa: E731
        gy = np.asarray(source_gradient)
        cot = {"output": gy, "h_n": sided(state_gradient),
               "c_n": sided(cell_gradient) if cell == "lstm" else None}
        caps = getattr(factory, "capabilities", None)
        batch_first = caps is not None and "time_major" not in caps.layouts
        if batch_first:
            cot["output"] = np.ascontiguousarray(gy.transpose(1, 0, 2))
        out, _, _, _ = run(source, recurrent_weight, fwd, cotangents=cot, input_weight=input_weight,
                                bias=bias, init_state=init_state, init_cell=init_cell, mask=mask,
                                peephole=peephole, secondary_bias=secondary_bias)
        g = {k: np.asarray(v) for k, v in out["params"].items()}
        sfx = ("_l0", "_l0_reverse")[:D]
        dx = np.asarray(out["input"])
        grads = [dx.transpose(1, 0, 2) if batch_first else dx,
                 np.stack([g[f"recurrent_weight{s}"] for s in sfx]) if D == 2 else g["recurrent_weight_l0"],
                 np.concatenate([g[f"input_weight{s}"] for s in sfx])]
        if bias is not None:
            grads.append(np.concatenate([g[f"bias{s}"] for s in sfx]).reshape(1, 1, -1))
        if cell == "lstm" and peephole is not None:
            grads.append(np.zeros_like(peephole))
        if init_state is not None:
            grads.append(_sided(out["h_0"]))
        if cell == "lstm" and init_cell is not None:
            grads.append(_sided(out["c_0"]))
        if cell == "gru" and secondary_bias is not None:
            grads.append(np.concatenate([g[f"secondary_bias{s}"] for s in sfx])
                         if "secondary_bias_l0" in g else np.zeros_like(secondary_bias))
        return [np.ascontiguousarray(a, source.dtype) for a in grads]

    source = getattr(factory, "source", None)
    for fn, index in ((forward, 0), (gradients, 1)):
        fn.__qualname__ = fn.__name__ = f"{cell}_{fn.__name__}"
        if isinstance(source, tuple):
            fn.source = (f"{source[0]}\nfrom {__name__} import layer_ops",
                         f"layer_ops({source[1]}, {cell!r})[{index}]")
    return forward, gradients
