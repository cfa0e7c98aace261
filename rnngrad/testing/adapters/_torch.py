"""An array layer (:mod:`rnngrad.testing.arrays`) whose forward is torch code: Keras on its
torch backend, or any layer written with torch operations; its gradients come from
``torch.autograd``. ``mapping(params)`` makes the framework's parameters from rnngrad's with
torch operations (inside the differentiated function); ``build(dtype)`` returns
``forward(own, x, h0, c0, lengths)`` → (output, h_n, c_n) of torch tensors."""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["TorchAutogradLayer"]


@dataclasses.dataclass
class TorchAutogradLayer:
    """An array layer whose forward is torch code (Keras on torch): gradients by autograd."""

    descriptor: object
    parameter_names: tuple
    mapping: object
    build: object
    gate_names: tuple = None

    def __post_init__(self):
        self._forwards = {}

    def framework_parameters(self, params):
        import torch

        own = self.mapping({k: torch.as_tensor(v) for k, v in params.items()})
        return {k: v.detach().cpu().numpy() for k, v in own.items()}

    def run(self, params, x, *, h0=None, c0=None, lengths=None, cotangents=None):
        import torch

        dtype = np.dtype(x.dtype)
        if dtype.name not in self._forwards:
            self._forwards[dtype.name] = self.build(dtype)
        forward = self._forwards[dtype.name]
        leaf = lambda a: None if a is None else torch.tensor(a, requires_grad=True)  # noqa: E731
        p = {k: leaf(v) for k, v in params.items()}
        xs, hs, cs = leaf(x), leaf(h0), leaf(c0)
        with torch.enable_grad():
            y, hn, cn = forward(self.mapping(p), xs, hs, cs,
                                None if lengths is None else torch.as_tensor(lengths))
            out = {"output": y, "h_n": hn, "c_n": cn}
            numpy = lambda t: None if t is None else t.detach().cpu().numpy()  # noqa: E731
            if cotangents is None:
                return {k: numpy(v) for k, v in out.items()}
            terms = [(out[k] * torch.as_tensor(c)).sum() for k, c in cotangents.items()
                     if c is not None and out[k] is not None]
            leaves = [xs] + [t for t in (hs, cs) if t is not None] + list(p.values())
            grads = torch.autograd.grad(sum(terms[1:], terms[0]), leaves, allow_unused=True)
        grads = [numpy(g) if g is not None else np.zeros(t.shape, dtype) for g, t in zip(grads, leaves)]
        result = {k: numpy(v) for k, v in out.items()}
        result["input"], rest = grads[0], grads[1:]
        result["h_0"] = rest.pop(0) if hs is not None else None
        result["c_0"] = rest.pop(0) if cs is not None else None
        result["params"] = dict(zip(p, rest))
        return result
