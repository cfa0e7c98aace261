"""Flax's recurrent layers for :func:`rnngrad.testing.check_module` (array protocol, jax VJP)::

    from rnngrad.testing import check_module
    from rnngrad.testing.adapters.flax import flax_adapter
    check_module(flax_adapter("gru"), "gru")                       # flax.nnx.RNN(nnx.GRUCell)
    check_module(flax_adapter("lstm", "OptimizedLSTMCell"), "lstm")
    check_module(flax_adapter("lstm", api="linen"), "lstm")        # flax.linen.RNN

The layer under test is ``nnx.RNN(cell, time_major=..., return_carry=True)`` (``linen.RNN``
with ``api="linen"``), wrapped in ``nnx.Bidirectional`` (``linen.Bidirectional``) for two
directions, the backward one ``reverse=True, keep_order=True``; variable lengths go in as
``seq_lengths``. Flax stacks no layers (one layer a check), has no dropout between layers and
no unbatched form. Its layouts and gate orders, rnngrad's names on the right (gates in
rnngrad's letters, SEMANTICS.md §2.2):

=================  ===========================================================================
SimpleCell         ``dense_i.kernel`` [I,H] = input_weightᵀ; ``dense_i.bias`` = bias;
                   ``dense_h.kernel`` [H,H] = recurrent_weightᵀ; ``activation_fn`` tanh or relu
GRUCell            gates r, z, n (rnngrad ``reset_gate_first=True``: r, z, o), ``reset_after``
                   (n = tanh(x W_n + b_n + r ⊙ (h R_n))), h' = (1 − z) ⊙ n + z ⊙ h;
                   ``dense_i.kernel`` [I,3H] = input_weightᵀ, ``dense_i.bias`` = bias,
                   ``dense_h.kernel`` [H,3H] = recurrent_weightᵀ; no b_hn (``dense_h`` has no
                   bias, although ``linen.GRUCell``'s docstring names one): no secondary_bias
LSTMCell           gates i, f, g, o (rnngrad's i, f, z, o): ``i{i,f,g,o}.kernel`` [I,H] = the
                   gate's rows of input_weight, transposed (``if_`` for f);
                   ``h{i,f,g,o}.kernel`` [H,H] = its rows of recurrent_weight, transposed;
                   ``h{i,f,g,o}.bias`` [H] = its block of bias
OptimizedLSTMCell  ``dense_i.kernel`` [I,4H] = input_weightᵀ; ``dense_h.kernel`` [H,4H] =
                   recurrent_weightᵀ; ``dense_h.bias`` = bias; gates i, f, g, o
=================  ===========================================================================

``linen`` names its denses ``i`` and ``h`` (SimpleCell), and a dense a gate for the other cells:
``i{r,z,n}`` (with biases) and ``h{r,z,n}`` for GRUCell, whose ``hn.bias`` is b_hn, rnngrad's
secondary_bias (``reset_after``); ``i{i,f,g,o}`` and ``h{i,f,g,o}`` (``h*`` with biases) for both
LSTM cells.

Carries: ``h`` for SimpleCell and GRUCell, ``(c, h)`` for the LSTM cells. Needs flax (and jax
with float64 enabled, which importing this module does).
"""

from __future__ import annotations

from ..arrays import TORCH_GRU, cell_descriptor
from ..layer_problems import Capabilities
from . import _jax

__all__ = ["flax_adapter", "CELLS"]

#: rnngrad cell -> Flax cells that compute it
CELLS = {"rnn": ("SimpleCell",), "gru": ("GRUCell",), "lstm": ("LSTMCell", "OptimizedLSTMCell")}
_DEFAULT = {"rnn": "SimpleCell", "gru": "GRUCell", "lstm": "LSTMCell"}
#: two shapes (T, N, I, H), every size distinct in the second, so that jax compiles two
#: programs per configuration (the scenarios are fitted into them)
SHAPES = ((1, 1, 1, 1), (5, 3, 4, 6))


def to_framework(cell_name, params, suffix, H, api="nnx"):
    """Flax's parameters of one direction, {path: array}, from rnngrad's (the one mapping)."""
    W, R = params[f"input_weight{suffix}"], params[f"recurrent_weight{suffix}"]
    b, b2 = params.get(f"bias{suffix}"), params.get(f"secondary_bias{suffix}")
    # a dense layer a gate: nnx's LSTMCell, and linen's GRU and LSTM cells (its
    # OptimizedLSTMCell keeps LSTMCell's parameters); the others pack the gates in one
    per_gate = {"LSTMCell": "ifgo", "OptimizedLSTMCell": "ifgo" if api == "linen" else "",
                "GRUCell": "rzn" if api == "linen" else ""}.get(cell_name, "")
    if per_gate:
        out = {}
        for g, gate in enumerate(per_gate):
            rows = slice(g * H, (g + 1) * H)
            i_name = "if_" if (gate == "f" and api == "nnx") else f"i{gate}"
            out[f"{i_name}.kernel"], out[f"h{gate}.kernel"] = W[rows].T, R[rows].T
            if b is not None:  # LSTM: the recurrent denses carry the bias; GRU: the input ones
                out[f"{'i' + gate if per_gate == 'rzn' else 'h' + gate}.bias"] = b[rows]
        if b2 is not None:
            out["hn.bias"] = b2
        return out
    i, h = ("dense_i", "dense_h") if api == "nnx" else ("i", "h")
    out = {f"{i}.kernel": W.T, f"{h}.kernel": R.T}
    if b is not None:
        out[f"{h}.bias" if cell_name == "OptimizedLSTMCell" else f"{i}.bias"] = b
    return out


class FlaxAdapter(_jax.JaxAdapter):
    """A factory of array layers computed by Flax's ``RNN`` over one of its cells."""

    def __init__(self, cell, cell_name=None, api="nnx"):
        if cell not in CELLS:
            raise ValueError(f"cell: expected one of {tuple(CELLS)}, got {cell!r}")
        cell_name = cell_name or _DEFAULT[cell]
        if cell_name not in CELLS[cell]:
            raise ValueError(f"cell_name: expected one of {CELLS[cell]} for {cell!r}, got {cell_name!r}")
        if api not in ("nnx", "linen"):
            raise ValueError(f"api: expected 'nnx' or 'linen', got {api!r}")
        _jax.enable_x64()
        self.cell, self.cell_name, self.api = cell, cell_name, api
        self.framework = f"flax.{api}.{cell_name}"
        self.capabilities = Capabilities(num_layers=1, dropout=False, unbatched=False,
                                         noncontiguous=False, no_bias=False, shapes=SHAPES)
        self.source = ("from rnngrad.testing.adapters.flax import flax_adapter",
                       f"flax_adapter({cell!r}, {cell_name!r}, api={api!r})")

    def __call__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, nonlinearity="tanh"):
        if num_layers != 1:
            raise NotImplementedError("num_layers: Flax's RNN is one layer")
        if not bias:
            raise NotImplementedError("bias=False: Flax's cells always have biases")
        descriptor = cell_descriptor(self.cell, nonlinearity, **TORCH_GRU)
        D, H, I = 2 if bidirectional else 1, hidden_size, input_size
        suffixes = ("_l0", "_l0_reverse")[:D]
        stems = ["input_weight", "recurrent_weight", "bias"]
        # linen's GRUCell has b_hn (its hn dense has a bias); nnx's has none
        stems += ["secondary_bias"] if self.cell == "gru" and self.api == "linen" else []
        names = [f"{stem}{s}" for s in suffixes for stem in stems]
        make = self._nnx if self.api == "nnx" else self._linen

        def mapping(params):
            own = {}
            for d, s in enumerate(suffixes):
                prefix = ("forward_rnn.cell.", "backward_rnn.cell.")[d] if D == 2 else "cell."
                own.update({prefix + k: v for k, v in
                            to_framework(self.cell_name, params, s, H, self.api).items()})
            return own

        key = (self.framework, I, H, D, batch_first, nonlinearity)
        return _jax.JaxLayer(key, descriptor, names, mapping,
                             lambda dtype: make(I, H, D, batch_first, nonlinearity, dtype),
                             batch_first=batch_first,
                             gate_names={"gru": ("r", "z", "n"), "lstm": ("i", "f", "g", "o")}.get(self.cell))

    # -- the layer, as a jax function of Flax's parameters -------------------------------------

    def _cell_kwargs(self, nonlinearity):
        import jax

        # rnngrad sets every parameter: Flax's own initializers (an orthogonal one compiles a QR
        # a shape) are not run
        zeros = jax.nn.initializers.zeros
        kwargs = dict(kernel_init=zeros, recurrent_kernel_init=zeros)
        if self.cell == "rnn" and nonlinearity == "relu":
            kwargs["activation_fn"] = jax.nn.relu
        return kwargs

    def _initial(self, h0, c0, D):
        """Flax's initial carry from [D,N,H] states: (c, h) for the LSTM cells, a pair of them
        for two directions; None: Flax's own zeros."""
        if h0 is None:
            return None
        carries = [(c0[d], h0[d]) if self.cell == "lstm" else h0[d] for d in range(D)]
        return carries[0] if D == 1 else tuple(carries)

    def _finish(self, carries, y, lengths, batch_first):
        import jax.numpy as jnp

        if self.cell == "lstm":
            hn = jnp.stack([c[1] for c in carries])
            cn = jnp.stack([c[0] for c in carries])
        else:
            hn, cn = jnp.stack(carries), None
        return _jax.zero_padded(y, lengths, batch_first), hn, cn

    def _nnx(self, I, H, D, batch_first, nonlinearity, dtype):
        from flax import nnx

        cell_class = getattr(nnx, self.cell_name)
        kwargs = self._cell_kwargs(nonlinearity)

        def rnn(reverse):
            cell = cell_class(I, H, rngs=nnx.Rngs(0), param_dtype=dtype, dtype=dtype, **kwargs)
            return nnx.RNN(cell, time_major=not batch_first, return_carry=True, reverse=reverse,
                           keep_order=reverse, rngs=False)

        model = nnx.Bidirectional(rnn(False), rnn(True), time_major=not batch_first,
                                  return_carry=True, rngs=False) if D == 2 else rnn(False)
        graphdef, state, rest = nnx.split(model, nnx.Param, ...)
        template = state.to_pure_dict()

        def forward(own, x, h0, c0, lengths):
            params = nnx.State(state)
            nnx.replace_by_pure_dict(params, _with(template, own, x.dtype))
            layer = nnx.merge(graphdef, params, rest)
            carry = self._initial(h0, c0, D)
            # Flax makes its zero carry with an Rngs; one made inside the trace mutates nothing outside
            rngs = nnx.Rngs(0) if carry is None else None
            carries, y = layer(x, initial_carry=carry, seq_lengths=lengths, rngs=rngs)
            return self._finish(carries if D == 2 else (carries,), y, lengths, batch_first)

        return forward

    def _linen(self, I, H, D, batch_first, nonlinearity, dtype):
        from flax import linen

        cell_class = getattr(linen, self.cell_name)
        kwargs = self._cell_kwargs(nonlinearity)

        def rnn(reverse):
            return linen.RNN(cell_class(H, param_dtype=dtype, dtype=dtype, **kwargs),
                             time_major=not batch_first, return_carry=True, reverse=reverse,
                             keep_order=reverse)

        model = linen.Bidirectional(rnn(False), rnn(True), time_major=not batch_first,
                                    return_carry=True) if D == 2 else rnn(False)

        def forward(own, x, h0, c0, lengths):
            carries, y = model.apply({"params": _nested(own)}, x, initial_carry=self._initial(h0, c0, D),
                                     seq_lengths=lengths)
            return self._finish(carries if D == 2 else (carries,), y, lengths, batch_first)

        return forward


def _with(template, own, dtype):
    """Flax's pure state dict with every parameter replaced by the mapped one (in ``dtype``)."""
    out = {}
    for key, value in template.items():
        if isinstance(value, dict):
            out[key] = _with(value, {k[len(key) + 1:]: v for k, v in own.items()
                                     if k.startswith(key + ".")}, dtype)
        elif key in own:
            out[key] = own[key].astype(dtype)
        else:
            raise ValueError(f"{key}: a Flax parameter without an rnngrad counterpart")
    return out


def _nested(own):
    """linen's nested params from the mapping's dotted names (``forward_rnn.cell.ir.kernel``)."""
    out = {}
    for dotted, value in own.items():
        parts = dotted.split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def flax_adapter(cell, cell_name=None, api="nnx") -> FlaxAdapter:
    """The factory for ``check_module``: Flax's ``RNN`` over ``cell_name`` (default SimpleCell,
    GRUCell, LSTMCell for "rnn", "gru", "lstm"; "OptimizedLSTMCell" too), ``api`` "nnx" or
    "linen"."""
    return FlaxAdapter(cell, cell_name, api)
