"""Keras 3's ``SimpleRNN``, ``GRU`` (both ``reset_after``), ``LSTM`` and ``Bidirectional`` for
:func:`rnngrad.testing.check_module`, on Keras's jax or torch backend (array protocol)::

    # KERAS_BACKEND=jax (or torch) in the environment, before keras is imported
    from rnngrad.testing import check_module
    from rnngrad.testing.adapters.keras import keras_adapter
    check_module(keras_adapter("gru", reset_after=False), "gru")

The layer under test is ``keras.layers.<Cell>(H, return_sequences=True, return_state=True,
dtype=...)`` (``Bidirectional`` of it for two directions, ``merge_mode="concat"``), called
through ``stateless_call`` with the parameters rnngrad drew, an ``initial_state`` and, for
variable lengths, a ``mask``; its gradients come from ``jax.vjp`` (jax backend) or
``torch.autograd`` (torch backend) of that call. Keras layers are batch-first, one layer each,
with no unbatched form and no dropout between layers. Layouts, rnngrad's names on the right:

==============  =============================================================================
SimpleRNN       ``kernel`` [I,H] = input_weightᵀ; ``recurrent_kernel`` [H,H] =
                recurrent_weightᵀ; ``bias`` [H] = bias; ``activation`` tanh or relu
GRU             ``kernel`` [I,3H] = input_weightᵀ, ``recurrent_kernel`` [H,3H] =
                recurrent_weightᵀ, gates z, r, h (rnngrad's z, r, o, its default order);
                h' = z ⊙ h + (1 − z) ⊙ ĥ (``flip_z=False``). ``reset_after=True``: ``bias``
                [2,3H] = (input bias, recurrent bias): half of rnngrad's bias in each row for z
                and r; row 0's h block = bias's o block, row 1's = secondary_bias (inside the
                reset product). ``reset_after=False``: ``bias`` [3H] = bias, and
                ĥ = tanh(x W_h + b_h + (r ⊙ h) R_h)
LSTM            ``kernel`` [I,4H], ``recurrent_kernel`` [H,4H] (transposed), ``bias`` [4H];
                gates i, f, c, o (rnngrad's i, f, z, o)
Bidirectional   ``forward_*`` and ``backward_*`` layers: the ``_l0`` and ``_l0_reverse``
                parameters; initial states [h_fw, (c_fw,) h_bw, (c_bw)]
==============  =============================================================================

``keras_adapter(cell, unroll=True)`` checks Keras's unrolled loop instead of its scan. A Keras
layer's parameter in a message is named ``forward.kernel`` / ``backward.kernel`` for
two directions, ``kernel`` for one. Needs keras 3 and its backend (jax, or torch).
"""

from __future__ import annotations

from ..arrays import cell_descriptor
from ..layer_problems import Capabilities
from . import _jax
from ._torch import TorchAutogradLayer

__all__ = ["keras_adapter", "SHAPES"]

_CLASSES = {"rnn": "SimpleRNN", "gru": "GRU", "lstm": "LSTM"}
#: two shapes (T, N, I, H), every size distinct in the second, so that a compiling backend
#: compiles two programs per configuration (the scenarios are fitted into them)
SHAPES = ((1, 1, 1, 1), (5, 3, 4, 6))


def to_framework(cell, params, suffix, H, reset_after, ops):
    """Keras's parameters of one direction {name: array} from rnngrad's (the one mapping),
    with ``ops`` (``keras.ops``) so that it runs and differentiates on any backend."""
    W, R = params[f"input_weight{suffix}"], params[f"recurrent_weight{suffix}"]
    own = {"kernel": ops.transpose(W), "recurrent_kernel": ops.transpose(R)}
    b = params.get(f"bias{suffix}")
    if b is None:
        return own
    if cell == "gru" and reset_after:
        half = b[:2 * H] * 0.5
        own["bias"] = ops.stack([ops.concatenate([half, b[2 * H:]]),
                                 ops.concatenate([half, params[f"secondary_bias{suffix}"]])])
    else:
        own["bias"] = b
    return own


def _own_name(path):
    """``bidirectional/forward_gru/gru_cell/kernel`` → ``forward.kernel``; ``kernel`` alone for
    one direction."""
    parts = path.split("/")
    side = next((p.split("_")[0] for p in parts if p.startswith(("forward_", "backward_"))), None)
    return f"{side}.{parts[-1]}" if side else parts[-1]


class KerasAdapter:
    """A factory of array layers computed by Keras 3 on its current backend."""

    def __init__(self, cell, reset_after=True, unroll=False):
        import keras

        if cell not in _CLASSES:
            raise ValueError(f"cell: expected one of {tuple(_CLASSES)}, got {cell!r}")
        self.backend = keras.backend.backend()
        if self.backend not in ("jax", "torch"):
            raise ValueError(f"KERAS_BACKEND: expected jax or torch (the gradients come from "
                             f"their autodiff), got {self.backend!r}")
        if self.backend == "jax":
            _jax.enable_x64()
        self.cell, self.reset_after, self.unroll = cell, bool(reset_after), bool(unroll)
        options = ([f"reset_after={self.reset_after}"] if cell == "gru" else []) + (
            ["unroll=True"] if self.unroll else [])
        option = f"({', '.join(options)})" if options else ""
        self.framework = f"keras.layers.{_CLASSES[cell]}{option} on {self.backend}"
        self.capabilities = Capabilities(num_layers=1, dropout=False, unbatched=False,
                                         noncontiguous=False, layouts=("batch_first",),
                                         shapes=SHAPES if self.backend == "jax" else None)
        self.source = ("from rnngrad.testing.adapters.keras import keras_adapter",
                       f"keras_adapter({cell!r}, reset_after={self.reset_after!r}, "
                       f"unroll={self.unroll!r})")

    def after_problem(self):
        if self.backend == "jax":
            _jax.after_problem()

    def __call__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=True,
                 dropout=0.0, bidirectional=False, nonlinearity="tanh"):
        if num_layers != 1 or not batch_first:
            raise NotImplementedError("Keras's layers: one layer, batch-first")
        descriptor = cell_descriptor(self.cell, nonlinearity, reset_after=self.reset_after)
        D, H = 2 if bidirectional else 1, hidden_size
        suffixes = ("_l0", "_l0_reverse")[:D]
        stems = ["input_weight", "recurrent_weight"] + (["bias"] if bias else [])
        stems += ["secondary_bias"] if bias and self.cell == "gru" and self.reset_after else []
        names = [f"{stem}{s}" for s in suffixes for stem in stems]
        config = (input_size, H, D, bias, nonlinearity, self.unroll)

        def mapping(params, ops=None):
            import keras

            ops = ops or keras.ops
            own = {}
            for d, s in enumerate(suffixes):
                side = ("forward.", "backward.")[d] if D == 2 else ""
                for k, v in to_framework(self.cell, params, s, H, self.reset_after, ops).items():
                    own[side + k] = v
            return own

        build = lambda dtype: self._forward(config, dtype)  # noqa: E731
        gates = {"gru": ("z", "r", "h"), "lstm": ("i", "f", "c", "o")}.get(self.cell)
        if self.backend == "jax":
            return _jax.JaxLayer((self.framework,) + config, descriptor, names, mapping, build,
                                 batch_first=True, gate_names=gates)
        return TorchAutogradLayer(descriptor, names, mapping, build, gates)

    def _layer(self, config, dtype):
        import keras

        I, H, D, bias, nonlinearity, unroll = config
        # rnngrad sets every parameter: Keras's own initializers (an orthogonal one compiles a QR
        # a shape) are not run
        kwargs = dict(return_sequences=True, return_state=True, use_bias=bias, dtype=dtype.name,
                      kernel_initializer="zeros", recurrent_initializer="zeros", unroll=unroll)
        if self.cell == "rnn":
            kwargs["activation"] = nonlinearity
        if self.cell == "gru":
            kwargs["reset_after"] = self.reset_after
        layer = getattr(keras.layers, _CLASSES[self.cell])(H, **kwargs)
        if D == 2:
            layer = keras.layers.Bidirectional(layer, merge_mode="concat", dtype=dtype.name)
        layer.build((None, None, I))
        return layer

    def _forward(self, config, dtype):
        """forward(own, x, h0, c0, lengths) → (output, h_n, c_n) of a Keras layer in ``dtype``."""
        import keras

        ops = keras.ops
        layer = self._layer(config, dtype)
        D, lstm = config[2], self.cell == "lstm"
        paths = [_own_name(v.path) for v in layer.trainable_variables]
        fixed = [v.value for v in layer.non_trainable_variables]

        def forward(own, x, h0, c0, lengths):
            initial = None
            if h0 is not None:
                initial = []
                for d in range(D):
                    initial += [h0[d], c0[d]] if lstm else [h0[d]]
            mask = None
            if lengths is not None:
                mask = ops.arange(x.shape[1])[None, :] < ops.convert_to_tensor(lengths)[:, None]
            outs, _ = layer.stateless_call([own[p] for p in paths], fixed, x,
                                           initial_state=initial, mask=mask)
            y, states = outs[0], outs[1:]
            per = 2 if lstm else 1
            hn = ops.stack([states[d * per] for d in range(D)])
            cn = ops.stack([states[d * per + 1] for d in range(D)]) if lstm else None
            if lengths is not None:  # Keras carries the last state through masked steps
                y = ops.where(mask[..., None], y, ops.zeros((), y.dtype))
            return y, hn, cn

        return forward


def keras_adapter(cell, reset_after=True, unroll=False) -> KerasAdapter:
    """The factory for ``check_module``: Keras 3's layer of ``cell`` ("rnn": SimpleRNN, "gru",
    "lstm") on the backend Keras was imported with; ``reset_after`` for the GRU; ``unroll``:
    Keras's unrolled loop instead of its scan."""
    return KerasAdapter(cell, reset_after, unroll)
