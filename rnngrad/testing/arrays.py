"""Layers of any framework, checked by :func:`rnngrad.testing.check_module` through arrays.

A factory given to ``check_module`` may build, instead of a ``torch.nn.Module``, an
:class:`ArrayLayer`: an object that takes and returns arrays (NumPy, or anything with
``__dlpack__`` or ``__array__``) and computes its own gradients (a VJP), with parameters named
as rnngrad's op arguments. No PyTorch is needed. The protocol, for a layer built from
``torch.nn``'s constructor keywords (``input_size``, ``hidden_size``, ``num_layers``, ``bias``,
``batch_first``, ``dropout``, ``bidirectional``, and ``nonlinearity`` for ``"rnn"``):

``descriptor``
    The rnngrad descriptor of one direction of one layer (``rg.GRUDescriptor(reset_after=False)``
    for a GRU that resets before the product, ...): the reference runs that cell. Its
    ``bidirectional`` is ignored (the configuration says).
``parameter_names``
    The names the layer has, rnngrad's op arguments with ``torch.nn``'s suffixes:
    ``input_weight_l{k}`` [G·H, I or D·H], ``recurrent_weight_l{k}`` [G·H, H], ``bias_l{k}``
    [G·H] and, for a GRU that has it, ``secondary_bias_l{k}`` [H] (b_hn, inside the reset
    product); ``_reverse`` for the backward direction. Gates are blocks of H rows in the
    descriptor's gate layout (SEMANTICS.md §2.2).
``run(params, x, *, h0=None, c0=None, lengths=None, cotangents=None) -> dict``
    ``params``: {name: array} in the problem's dtype. ``x``: [T,N,I], or [N,T,I] when
    ``batch_first``, or [T,I] unbatched; ``h0`` / ``c0``: [L·D,N,H] ([L·D,H] unbatched) or None;
    ``lengths``: [N] integers (each sequence's own length; the output is zero past it and h_n is
    taken at it) or None. Returns ``{"output", "h_n", "c_n"}`` (c_n None unless LSTM) in the
    same layouts; with ``cotangents`` ({"output", "h_n", "c_n"}: arrays, or None for a quantity
    outside the loss) also the VJP: ``"input"``, ``"h_0"``, ``"c_0"`` (None without an initial
    state) and ``"params"`` {name: gradient}.
``framework_parameters(params) -> dict`` (optional)
    The framework's own parameters {its name: array} made from rnngrad's: the one mapping. A
    mismatch in a parameter's gradient then also names the framework's parameter and index.
``gate_names`` (optional)
    The framework's names of the gates, in rnngrad's packed order (Keras's LSTM: i, f, c, o).

The factory may carry ``capabilities`` (:class:`rnngrad.testing.layer_problems.Capabilities`),
``after_problem()`` (called after every problem: clear compilation caches there) and
``source`` (Python that rebuilds the factory, for reproductions). Array layers are checked in
eval mode; a factory or layer raising ValueError or NotImplementedError for a configuration, or
:class:`Unsupported`, has the problem counted as unsupported, not failed.
"""

from __future__ import annotations

import dataclasses

import numpy as np


__all__ = ["cell_descriptor", "TORCH_GRU", "is_array_layer", "rnngrad_layer", "run_layer", "locator", "GATES"]

#: rnngrad's gate letters, in the packed order, by (cell, layout option)
GATES = {("rnn", False): ("",), ("gru", False): ("z", "r", "o"), ("gru", True): ("r", "z", "o"),
         ("lstm", False): ("i", "f", "z", "o"), ("lstm", True): ("i", "z", "f", "o")}
_MODES = {"gru": "GRU", "lstm": "LSTM"}


#: the GRU of PyTorch, cuDNN, Flax, Equinox and MLX: gates r, z, n and b_hn inside the reset product
TORCH_GRU = {"reset_gate_first": True, "reset_after": True}


def cell_descriptor(cell, nonlinearity="tanh", **gru_options):
    """The rnngrad descriptor of an ``"rnn"`` (tanh or relu), ``"gru"`` (with ``gru_options``,
    e.g. :data:`TORCH_GRU`) or ``"lstm"`` layer's cell, for an adapter's ``descriptor``."""
    from ..descriptors import GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor

    if cell == "rnn":
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"nonlinearity: expected 'tanh' or 'relu', got {nonlinearity!r}")
        return SingleGateRNNDescriptor(activation=nonlinearity)
    return GRUDescriptor(**gru_options) if cell == "gru" else LSTMDescriptor()


def is_array_layer(layer) -> bool:
    """Whether ``layer`` follows the array protocol (and is no torch module)."""
    return (callable(getattr(layer, "run", None)) and hasattr(layer, "descriptor")
            and not hasattr(layer, "named_parameters"))


def rnngrad_layer(descriptor):
    """A builder for :func:`rnngrad.testing.module.reference`: layer ``k`` of rnngrad-named
    parameters as one rnngrad layer with ``descriptor``, and its gradients named back."""
    from ..convert.torch import TorchRNN

    def build(problem, params, k):
        D, H = problem.D, problem.H
        sfx = (f"_l{k}", f"_l{k}_reverse")[:D]
        get = lambda stem: [params.get(f"{stem}{s}") for s in sfx]  # noqa: E731
        W, R = np.concatenate(get("input_weight")), np.stack(get("recurrent_weight"))
        bias = np.concatenate(get("bias")) if problem.bias else None  # [DGH]
        seconds = get("secondary_bias")
        secondary = np.concatenate(seconds) if seconds[0] is not None else None  # [DH]
        mode = "RNN_RELU" if problem.nonlinearity == "relu" else "RNN_TANH"
        desc = dataclasses.replace(descriptor, bidirectional=D == 2)
        layer = TorchRNN(mode=_MODES.get(problem.cell, mode), descriptor=desc, input_weight=W,
                         recurrent_weight=R if D == 2 else R[0], bias=bias,
                         secondary_bias=secondary, has_bias=problem.bias)

        def names(g):
            p, out = g.parameters, {}
            for s in ("_l0", "_l0_reverse")[:D]:
                out[f"input_weight{s}"] = p[f"weight_ih{s}"]
                out[f"recurrent_weight{s}"] = p[f"weight_hh{s}"]
                if problem.bias:
                    out[f"bias{s}"] = p[f"bias_ih{s}"]
                if secondary is not None:
                    out[f"secondary_bias{s}"] = p[f"bias_hh{s}"][-H:]
            return {n.replace("_l0", f"_l{k}"): v for n, v in out.items()}

        return layer, names

    return build


def _numpy(a):
    if a is None:
        return None
    if not isinstance(a, np.ndarray) and hasattr(a, "__dlpack__") and not hasattr(a, "__array__"):
        a = np.from_dlpack(a)
    return np.asarray(a)


def run_layer(layer, problem, values, layouts) -> dict:
    """The layer's run on the problem: {quantity: array in the problem's dtype, time-major},
    ``"dtypes"`` {quantity: the dtype the layer returned}. ``layouts``: (to the layer's layout,
    from it, states' layout) of :mod:`rnngrad.testing.module`."""
    in_layout, from_layout, states_layout = layouts
    dtype = np.dtype(problem.dtype)
    cast = lambda a: None if a is None else np.ascontiguousarray(a, dtype)  # noqa: E731
    v = values
    params = {name: cast(value) for name, value in v["params"].items()}
    states = lambda a: None if a is None else cast(states_layout(a, problem))  # noqa: E731
    cotangents = {"output": None if v["gy"] is None else cast(in_layout(v["gy"], problem)),
                  "h_n": states(v["ghn"]), "c_n": states(v["gcn"])}
    lengths = None if not problem.lengths else np.asarray(problem.lengths, np.int32)
    out = layer.run(params, cast(in_layout(v["x"], problem)), h0=states(v["h0"]),
                    c0=states(v["c0"]), lengths=lengths, cotangents=cotangents)
    got = {"dtypes": {}}

    def take(name, a, convert):
        a = _numpy(a)
        if a is None:
            got[name] = None
            return
        got["dtypes"][name] = a.dtype
        a = np.asarray(a, np.float64)
        got[name] = convert(a) if a.ndim == (2 if problem.form == "unbatched" else 3) else a

    stacked = lambda a: a[:, None] if problem.form == "unbatched" else a  # noqa: E731
    for name in ("output", "input"):
        take(name, out.get(name), lambda a: from_layout(a, problem))
    for name in ("h_n", "c_n", "h_0", "c_0"):
        take(name, out.get(name), stacked)
    got["params"] = {}
    for name, g in (out.get("params") or {}).items():
        g = _numpy(g)
        got["dtypes"][name] = g.dtype
        got["params"][name] = np.asarray(g, np.float64)
    return got


def gate_of(layer, cell, name, index, H) -> str:
    """The gate of a packed parameter's element: the layer's own name for it (``gate_names``,
    in rnngrad's packed order), else rnngrad's letter; empty for the single gate."""
    if cell == "rnn" or name.startswith("secondary_bias") or not index:
        return ""
    descriptor = layer.descriptor
    first = getattr(descriptor, "reset_gate_first", False) or getattr(descriptor, "forget_gate_last", False)
    names = getattr(layer, "gate_names", None) or GATES[(cell, bool(first))]
    return names[index[0] // H]


def locator(layer, problem, values, framework="framework"):
    """``locate(name, index)``: where an element of an rnngrad-named parameter sits in the
    framework's own parameters (found by mapping a one-hot probe), with its gate; None when the
    layer has no ``framework_parameters``."""
    mapping = getattr(layer, "framework_parameters", None)
    if mapping is None:
        return None

    def locate(name, index):
        probe = {n: np.zeros(v.shape, problem.dtype) for n, v in values["params"].items()}
        probe[name][tuple(index)] = 1
        found = []
        for own, array in mapping(probe).items():
            for at in np.argwhere(_numpy(array) != 0):
                found.append(f"{own}[{', '.join(str(int(i)) for i in at)}]")
        gate = gate_of(layer, problem.cell, name, tuple(index), problem.H)
        where = " and ".join(found) if found else "no parameter of its own"
        return f"{framework} {where}" + (f", gate {gate}" if gate else "")

    return locate
