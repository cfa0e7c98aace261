"""MLX's own ``mlx.nn.RNN``, ``GRU`` and ``LSTM`` behind ``torch.nn``'s conventions, so that
:func:`rnngrad.testing.check_module` checks them against rnngrad's float64 reference::

    from rnngrad.testing import check_module
    from rnngrad.testing.mlx_adapter import mlx_factory
    check_module(mlx_factory("gru"), "gru")

Each layer of the adapter is one MLX layer: MLX computes the forward, and its gradients come
from ``mx.vjp`` of that forward; torch only carries the parameters and the glue below.

MLX's layouts and gate orders (``torch.nn``'s names on the right):

==========  ================================================================================
mlx.nn.RNN  ``Wxh`` [H,I] = weight_ih; ``Whh`` [H,H] = weight_hh; ``bias`` [H] =
            bias_ih + bias_hh; ``nonlinearity`` tanh, or ``mlx.nn.relu`` for "relu"
mlx.nn.GRU  ``Wx`` [3H,I] = weight_ih; ``Wh`` [3H,H] = weight_hh; gates r, z, n in both
            (torch's order); ``b`` [3H] = bias_ih + bias_hh on r and z, bias_ih alone on n;
            ``bhn`` [H] = bias_hh's n block, inside the reset product
            (n = tanh(W_n x + b_n + r ⊙ (R_n h + b_hn))); h' = (1 − z) ⊙ n + z ⊙ h
mlx.nn.LSTM ``Wx`` [4H,I] = weight_ih; ``Wh`` [4H,H] = weight_hh; gates i, f, g, o (torch's
            order); ``bias`` [4H] = bias_ih + bias_hh
==========  ================================================================================

MLX's layers take a batch-first input [N,L,I] (or unbatched [L,I]), an optional initial
``hidden`` [N,H] (and ``cell`` for the LSTM), and return every step's hidden state [N,L,H]
(the LSTM: hidden and cell); they are single-layer and unidirectional. The adapter adds what
``torch.nn``'s surface has beyond that: ``batch_first=False`` (a transpose), ``num_layers > 1``
(layer k reads layer k − 1's output and ``h_0[k]``), and ``h_n`` / ``c_n`` (each layer's last
step). It declines, with NotImplementedError (reported by check_module, not failed):
``bidirectional`` and ``dropout > 0`` (MLX has neither) and ``PackedSequence`` input.

Needs torch and mlx (``pip install mlx``; on Linux ``mlx[cpu]``).
"""

from __future__ import annotations

import math

import numpy as np

from ..convert import parameters
from .layer_problems import Capabilities

__all__ = ["mlx_factory", "MLX_LAYOUTS"]

#: cell -> (MLX class, {MLX parameter: how it is made from torch.nn's})
MLX_LAYOUTS = {
    "rnn": ("mlx.nn.RNN", {"Wxh": "weight_ih", "Whh": "weight_hh", "bias": "bias_ih + bias_hh"}),
    "gru": ("mlx.nn.GRU", {"Wx": "weight_ih", "Wh": "weight_hh",
                           "b": "bias_ih + bias_hh on r, z; bias_ih on n", "bhn": "bias_hh[2H:]"}),
    "lstm": ("mlx.nn.LSTM", {"Wx": "weight_ih", "Wh": "weight_hh", "bias": "bias_ih + bias_hh"}),
}


def mlx_factory(cell):
    """A factory ``factory(**config)`` of torch modules with ``torch.nn.RNN`` / ``GRU`` /
    ``LSTM``'s constructor keywords, call convention and parameter names, computed by MLX's
    own layer of ``cell`` ("rnn", "gru", "lstm")."""
    if cell not in MLX_LAYOUTS:
        raise ValueError(f"cell: expected one of {tuple(MLX_LAYOUTS)}, got {cell!r}")
    layer = _adapter_class()

    def factory(**config):
        return layer(cell, **config)

    factory.__name__ = factory.__qualname__ = f"mlx_{cell}"
    factory.__module__ = __name__
    factory.source = (f"from {__name__} import mlx_factory", f"mlx_factory({cell!r})")
    # what mlx.nn's layers lack is not drawn (the adapter would decline it)
    factory.capabilities = Capabilities(bidirectional=False, dropout=False, lengths=False)
    return factory


_ADAPTER = []


def _adapter_class():
    if _ADAPTER:
        return _ADAPTER[0]
    import mlx.core as mx
    import mlx.nn as mnn
    import torch
    from torch import nn

    to_mx_dtype = {torch.float16: mx.float16, torch.float32: mx.float32, torch.float64: mx.float64}

    def to_mx(t):
        return None if t is None else mx.array(t.detach().cpu().numpy(), dtype=to_mx_dtype[t.dtype])

    def to_torch(a, like):
        return torch.as_tensor(np.array(a), dtype=like.dtype, device=like.device)

    def mlx_layer(cell, I, H, bias, nonlinearity):
        if cell == "rnn":
            return mnn.RNN(I, H, bias=bias, nonlinearity=mnn.relu if nonlinearity == "relu" else None)
        return (mnn.GRU if cell == "gru" else mnn.LSTM)(I, H, bias=bias)

    class MLXLayer(torch.autograd.Function):
        """One MLX layer: x [N,L,I], h0 / c0 [N,H] or None, then the MLX parameters in the
        layer's order; returns the hidden states [N,L,H] (and the cells for the LSTM)."""

        @staticmethod
        def forward(ctx, spec, x, h0, c0, *params):
            ctx.spec = spec
            ctx.save_for_backward(x, *params)
            ctx.hx = (h0, c0)
            outs = spec.run([to_mx(x), to_mx(h0), to_mx(c0)] + [to_mx(p) for p in params])
            return tuple(to_torch(o, x) for o in outs)

        @staticmethod
        def backward(ctx, *grads):
            spec = ctx.spec
            x, *params = ctx.saved_tensors
            h0, c0 = ctx.hx
            primals = [to_mx(x), to_mx(h0), to_mx(c0)] + [to_mx(p) for p in params]
            present = [i for i, a in enumerate(primals) if a is not None]

            def fun(*given):
                args = list(primals)
                for i, a in zip(present, given):
                    args[i] = a
                return list(spec.run(args))

            cotangents = [to_mx(g) if g is not None else mx.zeros(o.shape, dtype=to_mx_dtype[x.dtype])
                          for g, o in zip(grads, spec.shapes(x))]
            _, vjps = mx.vjp(fun, [primals[i] for i in present], cotangents)
            out = [None] * len(primals)
            for i, g in zip(present, vjps):
                out[i] = to_torch(g, x)
            return (None, *out)

    class Spec:
        """What one MLX layer call needs: the MLX layer, its parameter names and the sizes."""

        def __init__(self, cell, I, H, bias, nonlinearity):
            self.cell, self.H = cell, H
            self.layer = mlx_layer(cell, I, H, bias, nonlinearity)
            self.names = {"rnn": ["Wxh", "Whh", "bias"], "gru": ["Wx", "Wh", "b", "bhn"],
                          "lstm": ["Wx", "Wh", "bias"]}[cell][: None if bias else 2]

        def run(self, args):
            x, h0, c0, *params = args
            self.layer.update(dict(zip(self.names, params)))
            if self.cell == "lstm":
                return self.layer(x, h0, c0)
            return (self.layer(x, h0),)

        def shapes(self, x):
            shape = tuple(x.shape[:-1]) + (self.H,)
            return [mx.zeros(shape)] * (2 if self.cell == "lstm" else 1)

    class Adapter(nn.Module):
        def __init__(self, cell, input_size, hidden_size, num_layers=1, bias=True,
                     batch_first=False, dropout=0.0, bidirectional=False, nonlinearity="tanh"):
            super().__init__()
            if bidirectional:
                raise NotImplementedError("bidirectional: mlx.nn's recurrent layers are unidirectional")
            if dropout:
                raise NotImplementedError("dropout: mlx.nn's recurrent layers have no dropout between layers")
            if cell == "rnn" and nonlinearity not in ("tanh", "relu"):
                raise ValueError(f"nonlinearity: expected 'tanh' or 'relu', got {nonlinearity!r}")
            self.cell, self.hidden_size, self.num_layers = cell, hidden_size, num_layers
            self.bias, self.batch_first = bias, batch_first
            G, H = {"rnn": 1, "gru": 3, "lstm": 4}[cell], hidden_size
            std = 1.0 / math.sqrt(H)
            self.specs = []
            for k in range(num_layers):
                I = input_size if k == 0 else H
                shapes = [(f"weight_ih_l{k}", (G * H, I)), (f"weight_hh_l{k}", (G * H, H))]
                if bias:
                    shapes += [(f"bias_ih_l{k}", (G * H,)), (f"bias_hh_l{k}", (G * H,))]
                for name, shape in shapes:
                    self.register_parameter(name, nn.Parameter(torch.empty(shape).uniform_(-std, std)))
                self.specs.append(Spec(cell, I, H, bias, nonlinearity))

        def _mlx_params(self, k):
            """The MLX parameters of layer k, made from torch.nn's by differentiable ops: the
            op's arguments by rnngrad.convert.parameters (mlx.nn's GRU keeps PyTorch's b_hn
            inside the reset product, the op's secondary bias)."""
            names = parameters.names(k, 1, bias=self.bias)
            args = parameters.op_arguments(
                parameters.sides([getattr(self, n) for n in names],
                                 map(parameters.direction_kinds, names), 1),
                H=self.hidden_size, secondary=self.cell == "gru" and self.bias, xp=torch)
            return [args[name] for name in ("input_weight", "recurrent_weight", "bias",
                                             "secondary_bias") if name in args]

        def forward(self, input, hx=None):
            if isinstance(input, nn.utils.rnn.PackedSequence):
                raise NotImplementedError("PackedSequence: mlx.nn's recurrent layers take padded arrays")
            h0, c0 = (hx if hx is not None else (None, None)) if self.cell == "lstm" else (hx, None)
            unbatched = input.dim() == 2
            x = input.unsqueeze(0) if unbatched else (input if self.batch_first else input.transpose(0, 1))
            if unbatched:
                h0 = None if h0 is None else h0.unsqueeze(1)
                c0 = None if c0 is None else c0.unsqueeze(1)
            hs, cs = [], []
            for k, spec in enumerate(self.specs):
                outs = MLXLayer.apply(spec, x.contiguous(), None if h0 is None else h0[k],
                                      None if c0 is None else c0[k], *self._mlx_params(k))
                x = outs[0]  # [N,L,H]
                hs.append(x[:, -1])
                if self.cell == "lstm":
                    cs.append(outs[1][:, -1])
            hn = torch.stack(hs)  # [layers,N,H]
            cn = torch.stack(cs) if self.cell == "lstm" else None
            if unbatched:
                out, hn = x[0], hn[:, 0]
                cn = None if cn is None else cn[:, 0]
            else:
                out = x if self.batch_first else x.transpose(0, 1)
            return (out, (hn, cn)) if self.cell == "lstm" else (out, hn)

    _ADAPTER.append(Adapter)
    return Adapter
