"""Equinox's ``GRUCell`` and ``LSTMCell`` for :func:`rnngrad.testing.check_module` (array
protocol, jax VJP)::

    from rnngrad.testing import check_module
    from rnngrad.testing.adapters.equinox import equinox_adapter
    check_module(equinox_adapter("gru"), "gru")

Equinox has cells, not layers: a cell maps one unbatched step (``input`` [I], ``hidden`` [H], or
``(h, c)`` for the LSTM) to the next hidden state. The adapter runs the cell over time with
``jax.lax.scan`` and over the batch with ``jax.vmap`` (time-major input; unbatched input is the
cell's own form); one direction, one layer, no lengths. Layouts, rnngrad's names on the right:

========  ==============================================================================
GRUCell   ``weight_ih`` [3H,I] = input_weight; ``weight_hh`` [3H,H] = recurrent_weight;
          gates r, z, n (rnngrad ``reset_gate_first=True``: r, z, o); ``bias`` [3H] = bias;
          ``bias_n`` [H] = secondary_bias, inside the reset product (``reset_after=True``):
          n = tanh(W_n x + b_n + r ⊙ (R_n h + b_hn)); h' = n + z ⊙ (h − n)
LSTMCell  ``weight_ih`` [4H,I] = input_weight; ``weight_hh`` [4H,H] = recurrent_weight;
          ``bias`` [4H] = bias; gates i, f, g, o (rnngrad's i, f, z, o); hidden ``(h, c)``
========  ==============================================================================

Needs equinox (and jax with float64 enabled, which importing this module does).
"""

from __future__ import annotations

from ..arrays import TORCH_GRU, cell_descriptor
from ..layer_problems import Capabilities
from . import _jax

__all__ = ["equinox_adapter", "SHAPES"]

#: two shapes (T, N, I, H), every size distinct in the second, so that jax compiles two
#: programs per configuration (the scenarios are fitted into them)
SHAPES = ((1, 1, 1, 1), (5, 3, 4, 6))
_CLASSES = {"gru": "GRUCell", "lstm": "LSTMCell"}


def to_framework(cell, params):
    """Equinox's cell parameters {field: array} from rnngrad's (the one mapping)."""
    own = {"weight_ih": params["input_weight_l0"], "weight_hh": params["recurrent_weight_l0"]}
    if "bias_l0" in params:
        own["bias"] = params["bias_l0"]
        if cell == "gru":
            own["bias_n"] = params["secondary_bias_l0"]
    return own


class EquinoxAdapter(_jax.JaxAdapter):
    """A factory of array layers that run an Equinox cell over time and batch."""

    def __init__(self, cell):
        if cell not in _CLASSES:
            raise ValueError(f"cell: expected one of {tuple(_CLASSES)} (Equinox has no plain RNN "
                             f"cell), got {cell!r}")
        _jax.enable_x64()
        self.cell = cell
        self.framework = f"equinox.nn.{_CLASSES[cell]}"
        self.capabilities = Capabilities(num_layers=1, bidirectional=False, dropout=False,
                                         lengths=False, noncontiguous=False,
                                         layouts=("time_major",), shapes=SHAPES)
        self.source = ("from rnngrad.testing.adapters.equinox import equinox_adapter",
                       f"equinox_adapter({cell!r})")

    def __call__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, nonlinearity="tanh"):
        if num_layers != 1 or bidirectional or batch_first:
            raise NotImplementedError("Equinox's cells: one layer, one direction, time-major")
        descriptor = cell_descriptor(self.cell, **TORCH_GRU)
        names = ["input_weight_l0", "recurrent_weight_l0"]
        names += (["bias_l0"] + (["secondary_bias_l0"] if self.cell == "gru" else [])) if bias else []
        key = (self.framework, input_size, hidden_size, bias)
        return _jax.JaxLayer(key, descriptor, names, lambda p: to_framework(self.cell, p),
                             lambda dtype: self._forward(input_size, hidden_size, bias, dtype),
                             batch_first=False,
                             gate_names=("r", "z", "n") if self.cell == "gru" else ("i", "f", "g", "o"))

    def _forward(self, I, H, bias, dtype):
        import equinox as eqx
        import jax
        import jax.numpy as jnp

        template = getattr(eqx.nn, _CLASSES[self.cell])(I, H, use_bias=bias, dtype=dtype,
                                                        key=jax.random.PRNGKey(0))
        lstm = self.cell == "lstm"

        def forward(own, x, h0, c0, lengths):
            fields = sorted(own)
            cell = eqx.tree_at(lambda c: [getattr(c, f) for f in fields], template,
                               [own[f] for f in fields])
            unbatched = x.ndim == 2
            step = cell if unbatched else jax.vmap(cell)
            shape = x.shape[1:-1] + (H,)
            h = jnp.zeros(shape, x.dtype) if h0 is None else h0[0]
            c = jnp.zeros(shape, x.dtype) if c0 is None else c0[0]

            def body(carry, xt):
                carry = step(xt, carry if lstm else carry)
                return carry, carry[0] if lstm else carry

            last, ys = jax.lax.scan(body, (h, c) if lstm else h, x)
            if lstm:
                return ys, last[0][None], last[1][None]
            return ys, last[None], None

        return forward


def equinox_adapter(cell) -> EquinoxAdapter:
    """The factory for ``check_module``: Equinox's ``GRUCell`` ("gru") or ``LSTMCell`` ("lstm")
    over time and batch."""
    return EquinoxAdapter(cell)
