"""rnngrad's reference against PyTorch's autograd in float64 (CPU), through the converters.

For every single-layer configuration of ``nn.RNN`` (tanh, relu), ``nn.GRU`` and ``nn.LSTM``
(uni- and bidirectional, with and without biases, time-major and batch-first, with and without
initial states) and three kinds of upstream gradient (on the outputs only; on the final states
``h_n`` / ``c_n`` only; both), PyTorch computes the outputs and autograd the gradients of
``L = Σ g_y ⊙ output + Σ g_h ⊙ h_n (+ Σ g_c ⊙ c_n)``; rnngrad computes the same through
``rnngrad.convert.torch``. Weights are random normal (every gate different), so a gate-order or
bias-split mistake shows.

    python -m verification.check_torch
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from verification.common import Tally, compare, progress, report, skipped

AGAINST = "PyTorch autograd, float64"

#: row label → (torch class name, keyword arguments)
MODULES = {
    "RNN tanh": ("RNN", {"nonlinearity": "tanh"}),
    "RNN relu": ("RNN", {"nonlinearity": "relu"}),
    "GRU": ("GRU", {}),
    "LSTM": ("LSTM", {}),
}
UPSTREAM = ("outputs", "final states", "both")

#: PyTorch quantity → the rnngrad quantity whose tolerance applies
_QUANTITY = {"output": "state", "h_n": "state", "c_n": "cell", "input": "source",
             "h_0": "init_state", "c_0": "init_cell", "weight_ih": "input_weight",
             "weight_hh": "recurrent_weight", "bias_ih": "bias", "bias_hh": "bias"}


def make_module(label, I, H, *, bidirectional, bias, batch_first, rng, dtype=None):
    """A PyTorch module whose parameters are drawn from ``rng`` (normal, scaled by 1/√H)."""
    import torch

    cls_name, kwargs = MODULES[label]
    module = getattr(torch.nn, cls_name)(I, H, bidirectional=bidirectional, bias=bias,
                                         batch_first=batch_first, **kwargs)
    module = module.to(dtype or torch.float64)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = 0.5 if name.startswith("bias") else 0.8 / np.sqrt(H)
            p.copy_(torch.from_numpy(rng.standard_normal(tuple(p.shape)) * scale))
    return module


def draw_inputs(module, T, N, rng, *, with_state=True, upstream="both"):
    """(input, hx, grad_output, grad_h_n, grad_c_n) as float64 NumPy arrays (None where absent)."""
    D = 2 if module.bidirectional else 1
    H, I = module.hidden_size, module.input_size
    x = rng.standard_normal((N, T, I) if module.batch_first else (T, N, I))
    lstm = module.mode == "LSTM"
    hx = None
    if with_state:
        h0 = rng.standard_normal((D, N, H)) * 0.5
        hx = (h0, rng.standard_normal((D, N, H)) * 0.5) if lstm else h0
    out_shape = (N, T, D * H) if module.batch_first else (T, N, D * H)
    gy = rng.standard_normal(out_shape) if upstream in ("outputs", "both") else None
    final = upstream in ("final states", "both")
    gh = rng.standard_normal((D, N, H)) if final else None
    gc = rng.standard_normal((D, N, H)) if final and lstm else None
    return x, hx, gy, gh, gc


def torch_side(module, x, hx, gy, gh, gc, device="cpu"):
    """PyTorch's outputs and autograd gradients, as NumPy arrays by PyTorch name."""
    import torch

    dtype = next(module.parameters()).dtype
    module = module.to(device)  # parameters of a module on "mps" get their .grad there too
    module.zero_grad()
    t = lambda a: None if a is None else torch.tensor(a, dtype=dtype, device=device, requires_grad=True)  # noqa: E731
    xt = t(x)
    lstm = module.mode == "LSTM"
    hxt = None if hx is None else ((t(hx[0]), t(hx[1])) if lstm else t(hx))
    output, state = module(xt, hxt)
    h_n, c_n = state if lstm else (state, None)
    loss = (output * (t(gy) if gy is not None else 0.0)).sum()
    if gh is not None:
        loss = loss + (h_n * t(gh)).sum()
    if gc is not None:
        loss = loss + (c_n * t(gc)).sum()
    loss.backward()
    n = lambda a: None if a is None else a.detach().cpu().numpy()  # noqa: E731
    out = {"output": n(output), "h_n": n(h_n), "c_n": n(c_n), "input": n(xt.grad)}
    if hx is not None:
        out["h_0"] = n((hxt[0] if lstm else hxt).grad)
        out["c_0"] = n(hxt[1].grad) if lstm else None
    for name, p in module.named_parameters():
        out[name] = n(p.grad)
    module.to("cpu")
    return out


def rnngrad_side(layer, x, hx, gy, gh, gc, backend="reference"):
    """The same quantities by rnngrad through a :class:`rnngrad.convert.torch.TorchRNN`."""
    output, state = layer.forward(x, hx, backend=backend)
    h_n, c_n = state if layer.cell == "lstm" else (state, None)
    g = layer.gradients(x, hx, gy, gh, gc, backend=backend)
    out = {"output": output, "h_n": h_n, "c_n": c_n, "input": g.input}
    if hx is not None:
        out["h_0"], out["c_0"] = g.h_0, g.c_0
    out.update(g.parameters)
    return out


def compare_sides(got, want, dtype):
    """Comparisons of every quantity PyTorch produced, by PyTorch name."""
    out = []
    for name, w in want.items():
        if w is None and got.get(name) is None:
            continue
        quantity = _QUANTITY[name.split("_l0")[0]]
        out.append(compare(quantity, got.get(name), w, dtype, label=name))
    return out


def check_configuration(label, *, bidirectional, bias, batch_first, upstream, with_state, rng,
                        T=5, N=3, I=4, H=5, layer=None, backend="reference", device="cpu",
                        dtype=np.float64):
    """Comparisons for one configuration. ``layer`` (a function of the module) replaces the
    converter's mapping, to show that a wrong mapping fails. ``device="mps"`` with
    ``dtype=np.float32`` runs PyTorch on Apple's GPU (its LSTM calls MPSGraph's LSTM ops);
    rnngrad's reference then runs in float64 on the float32-rounded values."""
    import torch
    from rnngrad.convert import torch as rgt

    module = make_module(label, I, H, bidirectional=bidirectional, bias=bias,
                         batch_first=batch_first, rng=rng, dtype=getattr(torch, np.dtype(dtype).name))
    inputs = draw_inputs(module, T, N, rng, with_state=with_state, upstream=upstream)
    rounded = tuple(_rounded(a, dtype) for a in inputs)
    want = torch_side(module, *rounded, device=device)
    if layer is not None:
        layer = layer(module)
    else:  # the parameters in float64 (exact for float32 ones), so the reference runs in float64
        params = {k: np.asarray(v.detach().cpu().numpy(), np.float64) for k, v in module.named_parameters()}
        layer = rgt.from_state_dict(module.mode, params, batch_first=module.batch_first)
    got = rnngrad_side(layer, *(_rounded(a, np.float64) for a in rounded), backend=backend)
    return compare_sides(got, want, dtype)


def _rounded(a, dtype):
    if a is None:
        return None
    if isinstance(a, tuple):
        return tuple(np.asarray(x, dtype) for x in a)
    return np.asarray(a, dtype)


def configurations():
    for bidirectional, bias, batch_first, upstream in itertools.product(
            (False, True), (True, False), (False, True), UPSTREAM):
        yield dict(bidirectional=bidirectional, bias=bias, batch_first=batch_first,
                   upstream=upstream, with_state=True)
    for bidirectional, batch_first in itertools.product((False, True), (False, True)):
        yield dict(bidirectional=bidirectional, bias=True, batch_first=batch_first,
                   upstream="both", with_state=False)


def describe(label, config):
    flags = [("bidirectional" if config["bidirectional"] else "unidirectional"),
             ("bias" if config["bias"] else "no bias"),
             ("batch_first" if config["batch_first"] else "time-major"),
             f"upstream on {config['upstream']}",
             ("h0/c0 given" if config["with_state"] else "no h0")]
    return f"{label} ({', '.join(flags)})"


def run(seed=2024, labels=None) -> list:
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return [skipped(f"torch: {label}", AGAINST, f"needs PyTorch (pip install torch): {exc}")
                for label in (labels or MODULES)]
    rng = np.random.default_rng(seed)
    rows = []
    for label in labels or MODULES:
        tally = Tally(f"torch: {label}", AGAINST)
        for config in configurations():
            tally.case(describe(label, config), check_configuration(label, rng=rng, **config))
        rows.append(tally.done())
        progress(f"  torch: {label}: {tally.row.cases} configurations, {tally.row.status}")
    return rows


def main(argv=None) -> int:
    return report(run())


if __name__ == "__main__":
    sys.exit(main())
