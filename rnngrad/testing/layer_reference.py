"""The float64 reference of a whole layer for :func:`rnngrad.testing.check_module`: the rnngrad op
of each layer's cell, composed layer by layer (layer ``k`` fed by layer ``k − 1``'s output and
the ``k``-th slices of the initial states), a variable-length batch as each sequence alone over
its own length."""

from __future__ import annotations

import numpy as np

from .layer_problems import Problem, layer_of

__all__ = ["reference", "torch_layer"]

_MODES = {"gru": "GRU", "lstm": "LSTM"}


def _mode(problem):
    if problem.cell == "rnn":
        return "RNN_RELU" if problem.nonlinearity == "relu" else "RNN_TANH"
    return _MODES[problem.cell]


def torch_layer(problem, params, k):
    """Layer ``k`` of ``torch.nn``-named ``params`` as one rnngrad layer
    (:class:`rnngrad.convert.torch.TorchRNN`), and a function naming its gradients as the
    parameters are named."""
    from ..convert.torch import from_state_dict

    own = {n.replace(f"_l{k}", "_l0"): v for n, v in params.items() if layer_of(n) == k}
    layer = from_state_dict(_mode(problem), own)
    return layer, lambda g: {n.replace("_l0", f"_l{k}"): v for n, v in g.parameters.items()}


def _reference_batch(problem, params, x, h0, c0, gy, ghn, gcn, build):
    """Outputs and gradients of the stacked layers on one time-major batch, in float64."""
    L, D = problem.num_layers, problem.D
    lstm = problem.cell == "lstm"
    sl = lambda a, k: None if a is None else a[k * D:(k + 1) * D]  # noqa: E731
    layers, inputs, hs, cs = [], [], [], []
    layer_in = x
    for k in range(L):
        layer, names = build(problem, params, k)
        hx = None if h0 is None else ((sl(h0, k), sl(c0, k)) if lstm else sl(h0, k))
        out, hn = layer.forward(layer_in, hx, backend="reference")
        if lstm:
            hn, cn = hn
            cs.append(cn)
        layers.append((layer, hx, names))
        inputs.append(layer_in)
        hs.append(hn)
        layer_in = out
    result = {"output": layer_in, "h_n": np.concatenate(hs), "c_n": np.concatenate(cs) if lstm else None}
    grads, dh0, dc0 = {}, [], []
    upstream = gy
    for k in range(L - 1, -1, -1):
        layer, hx, names = layers[k]
        g = layer.gradients(inputs[k], hx, grad_output=upstream, grad_h_n=sl(ghn, k),
                            grad_c_n=sl(gcn, k) if lstm else None, backend="reference")
        grads.update(names(g))
        dh0.insert(0, g.h_0)
        dc0.insert(0, g.c_0)
        upstream = g.input
    result["input"] = upstream
    result["h_0"] = None if h0 is None else np.concatenate(dh0)
    result["c_0"] = None if c0 is None else np.concatenate(dc0)
    result["params"] = grads
    return result


def reference(problem: Problem, values: dict, build=torch_layer) -> dict:
    """The float64 reference: ``output`` [T,N,D·H] (zero past each packed sequence's length),
    ``h_n``, ``c_n`` [L·D,N,H], gradients ``input`` [T,N,I], ``h_0``, ``c_0`` and ``params``.
    ``build(problem, params, k)``: layer k as rnngrad's layer and its gradients' namer
    (:func:`torch_layer` for ``torch.nn``'s names)."""
    v = values
    if not problem.lengths:
        return _reference_batch(problem, v["params"], v["x"], v["h0"], v["c0"], v["gy"], v["ghn"],
                                v["gcn"], build)
    T, N = problem.T, problem.N
    parts = []
    for n, length in enumerate(problem.lengths):
        pick = lambda a, t=None: None if a is None else (a[:t, n:n + 1] if t else a[:, n:n + 1])  # noqa: E731
        parts.append(_reference_batch(problem, v["params"], pick(v["x"], length), pick(v["h0"]),
                                      pick(v["c0"]), pick(v["gy"], length), pick(v["ghn"]),
                                      pick(v["gcn"]), build))
    def padded(key, width):
        out = np.zeros((T, N, width))
        for n, (length, part) in enumerate(zip(problem.lengths, parts)):
            out[:length, n] = part[key][:, 0]
        return out

    def joined(key):
        return None if parts[0][key] is None else np.concatenate([p[key] for p in parts], axis=1)

    return {"output": padded("output", problem.D * problem.H), "input": padded("input", problem.I),
            "h_n": joined("h_n"), "c_n": joined("c_n"), "h_0": joined("h_0"), "c_0": joined("c_0"),
            "params": {name: sum(p["params"][name] for p in parts) for name in parts[0]["params"]}}
