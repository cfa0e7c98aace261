"""``rnngrad.torch.RNN``, ``GRU`` and ``LSTM``: ``torch.nn.Module`` layers with PyTorch's
constructor, call conventions and parameters, computed by rnngrad's ops, plus the MPSGraph
options PyTorch lacks.

PyTorch's conventions, as ``torch.nn.RNN`` / ``GRU`` / ``LSTM``:

- ``input_size``, ``hidden_size``, ``num_layers``, ``bias``, ``batch_first``, ``dropout``,
  ``bidirectional``, ``device``, ``dtype`` (``RNN``: ``nonlinearity``);
- ``layer(input, hx)``: input [T,N,I] ([N,T,I] with ``batch_first``, [T,I] unbatched);
  ``hx`` = ``h_0`` (``(h_0, c_0)`` for the LSTM) [num_layers·D,N,H], zeros when None;
  returns ``(output, h_n)`` (``(output, (h_n, c_n))``), output [T,N,D·H];
- parameters ``weight_ih_l{k}[_reverse]`` [G·H,I_k], ``weight_hh_l{k}[_reverse]`` [G·H,H],
  ``bias_ih_l{k}[_reverse]``, ``bias_hh_l{k}[_reverse]`` [G·H], registered in PyTorch's order
  and initialised as PyTorch does (uniform in ±1/√H): with the same seed, a layer starts from
  the same weights as the ``torch.nn`` module, and state dicts are interchangeable;
- dropout on the output of every layer but the last, in training mode.

Each layer, all its directions, is one op (SEMANTICS.md) with ``rnngrad.convert.parameters``'
mapping: ``input_weight`` = the directions' ``weight_ih`` concatenated, ``recurrent_weight`` =
their ``weight_hh`` (stacked when bidirectional), ``bias`` = ``bias_ih + bias_hh``, except the
GRU's candidate block with a secondary bias: ``bias_ih``'s alone, and ``bias_hh``'s candidate
block (PyTorch's ``b_hn``) is the op's ``secondary_bias``. One layer stack (:meth:`_stack`) runs
the layers, for padded, unbatched and packed input alike, each layer by one of the routes of
``rnngrad.torch._layer``: one autograd node a layer for plain eager calls
(``rnngrad.torch._route.one_node``), the op's operator on differentiable arguments for every
other call, each direction over the padded batch for a ``PackedSequence``.

MPSGraph's options (keyword-only), defaults giving PyTorch's cells:

- every layer: ``reverse`` (unidirectional only; MPSGraph's outputs stay in processing order,
  and ``h_n`` is the state after the last processing step, ``output[-1]``), ``backend``
  (an rnngrad backend name, None: the fastest here), and ``mask=`` at call time (broadcastable
  to [N,D·H], or per step [T,N,D·H] ([N,T,D·H] with ``batch_first``); it multiplies h[t−1] where
  it enters the recurrent products of every layer; SEMANTICS.md §2.2);
- ``RNN``: ``nonlinearity`` also ``"sigmoid"``, ``"hard_sigmoid"``, ``"none"``;
- ``GRU``: ``reset_gate_first`` (True: PyTorch's gate order r, z, n; False: MPSGraph's
  z, r, n), ``reset_after`` (True: PyTorch's n = f(W_n x + b_in + r ⊙ (R_n h + b_hn))),
  ``flip_z`` (False: PyTorch's h = (1 − z) ⊙ n + z ⊙ h[t−1]), ``update_gate_activation``,
  ``reset_gate_activation``, ``output_gate_activation``, and ``secondary_bias`` (default: as
  ``reset_after``; True: ``b_hn`` is the secondary bias inside the reset product, as PyTorch;
  False: it adds to the candidate's bias like the other blocks; True needs ``bias`` and
  ``reset_after``, the only variant MPSGraph reads it in);
- ``LSTM``: ``peephole`` (parameters ``peephole_l{k}[_reverse]`` [4H], in the gate layout),
  ``forget_gate_last`` (the packed gates of the weights are i, z, f, o instead of PyTorch's
  i, f, g, o), ``input_gate_activation``, ``forget_gate_activation``,
  ``cell_gate_activation``, ``output_gate_activation``, ``activation``.

Activations are ``rnngrad.Activation`` values, their names or integers (``"hard_sigmoid"`` is
MPSGraph's clamp(0.2·x + 0.5, 0, 1)).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import rnngrad
from rnngrad.convert import parameters
from rnngrad.convert import torch as convert
from rnngrad.torch import _layer, _route, functions, ops

__all__ = ["RNN", "GRU", "LSTM", "from_torch"]

_GATES = {"single_gate": 1, "gru": 3, "lstm": 4}
_LOW = (torch.float16, torch.bfloat16)
_TORCH_MODULES = {"single_gate": "RNN", "gru": "GRU", "lstm": "LSTM"}
_AUTOCAST_DEVICES = ("cpu", "cuda")


class _RNNBase(nn.Module):
    """What the three layers share; ``cell`` is the rnngrad cell."""

    cell = "single_gate"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, *, backend=None,
                 reverse=False, options=None):
        super().__init__()
        for name, value, least in (("input_size", input_size, 0), ("hidden_size", hidden_size, 1),
                                   ("num_layers", num_layers, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: expected an int ≥ {least}, got {value!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0 <= dropout <= 1:
            raise ValueError(f"dropout: expected a number in [0, 1] (the probability of an "
                             f"element to be zeroed), got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"dropout option adds dropout after all but last recurrent layer, so "
                          f"non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=3)
        for name, value in (("bias", bias), ("batch_first", batch_first),
                            ("bidirectional", bidirectional), ("reverse", reverse)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected a bool, got {value!r}")
        if reverse and bidirectional:
            raise ValueError("reverse: MPSGraph ignores reverse when bidirectional; got "
                             "reverse=True with bidirectional=True")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.reverse, self.backend = bidirectional, reverse, backend
        self.proj_size = 0
        # the op's descriptor, with every option checked by rnngrad
        self.descriptor = type(self)._descriptor_class(bidirectional=bidirectional,
                                                       reverse=reverse, **(options or {}))
        D, G, H = self.num_directions, _GATES[self.cell], hidden_size
        factory = {"device": device, "dtype": dtype}
        self._flat_weights_names = []
        #: per layer: its parameters' names, in PyTorch's order of registration
        self._step_names = [parameters.names(k, D, bias=bias, peephole=self._has_peephole())
                            for k in range(num_layers)]
        #: … the (direction, kind) of each, read from its name
        self._step_kinds = [[parameters.direction_kinds(n) for n in names]
                            for names in self._step_names]
        #: … the op argument whose gradient each takes its own from
        self._step_arguments = [[parameters.ARGUMENT[kind] for _, kind in kinds]
                                for kinds in self._step_kinds]
        #: … and which of them the gradient op reads (all but the biases)
        self._step_reads = [[i for i, (_, kind) in enumerate(kinds) if not kind.startswith("bias")]
                            for kinds in self._step_kinds]
        for k in range(num_layers):
            layer_input = input_size if k == 0 else D * H
            for suffix in self._suffixes(k):
                shapes = [(f"weight_ih{suffix}", (G * H, layer_input)),
                          (f"weight_hh{suffix}", (G * H, H))]
                if bias:
                    shapes += [(f"bias_ih{suffix}", (G * H,)), (f"bias_hh{suffix}", (G * H,))]
                if self._has_peephole():
                    shapes.append((f"peephole{suffix}", (4 * H,)))
                for name, shape in shapes:
                    self.register_parameter(name, nn.Parameter(torch.empty(shape, **factory)))
                    self._flat_weights_names.append(name)
        self.reset_parameters()

    _descriptor_class = rnngrad.SingleGateRNNDescriptor

    @property
    def descriptor(self):
        """The op's descriptor (an rnngrad descriptor of this layer's cell)."""
        return self._descriptor

    @descriptor.setter
    def descriptor(self, value):
        # the operators take the descriptor as a string, made here once and not at each call
        # (torch.compile sees a constant)
        value = functions.checked_descriptor(self.cell, value)
        #: the op's descriptor without and with z_state (the op's training forward)
        self._descriptors = (ops.with_outputs(value, False), ops.with_outputs(value, True))
        self._code = ops.descriptor_code(value)
        self._one_direction_code = ops.descriptor_code(
            dataclasses.replace(value, bidirectional=False, reverse=False))
        self._descriptor = value

    def _has_peephole(self) -> bool:
        return False

    def _secondary(self) -> bool:
        return False

    # -- PyTorch's surface --------------------------------------------------------------------
    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def mode(self) -> str:
        return _TORCH_MODULES[self.cell]

    def _suffixes(self, k):
        return (f"_l{k}", f"_l{k}_reverse")[:self.num_directions]

    def reset_parameters(self):
        """PyTorch's initialisation: every parameter uniform in ±1/√hidden_size, in the order
        of registration (PyTorch's), so a seed gives the weights ``torch.nn`` gives."""
        std = 1.0 / math.sqrt(self.hidden_size)
        for weight in self.parameters():
            nn.init.uniform_(weight, -std, std)

    def flatten_parameters(self):
        """Nothing to do (PyTorch's is for cuDNN); here so that code calling it runs."""

    @property
    def all_weights(self):
        """The parameters of each layer and direction, as PyTorch's ``all_weights``."""
        per = len(self._flat_weights_names) // (self.num_layers * self.num_directions)
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i:i + per]] for i in range(0, len(names), per)]

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False),
                              ("dropout", 0.0), ("bidirectional", False), ("reverse", False),
                              ("backend", None)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)!r}"
        for name, value in self._options().items():
            s += f", {name}={value!r}"
        return s

    def _options(self) -> dict:
        """The MPSGraph options that differ from PyTorch's cell, by constructor name."""
        return {}

    # -- the op's arguments -------------------------------------------------------------------
    def parameter(self, name: str):
        """The parameter ``name`` as ``torch.nn``'s layers read it: the Parameter, or what a
        parametrization (``torch.nn.utils.parametrize``: weight_norm, spectral_norm) or pruning
        (``torch.nn.utils.prune``) makes of it under that name."""
        p = self._parameters.get(name)
        return p if p is not None else getattr(self, name)

    def step_parameters(self, k: int) -> list:
        """Layer ``k``'s parameters (:meth:`parameter`), in :attr:`_step_names` order."""
        return [self.parameter(n) for n in self._step_names[k]]

    def op_parameters(self, k: int, direction=None) -> dict:
        """The op's parameter arguments of layer ``k`` (rnngrad's layouts, SEMANTICS.md §2), made
        from the module's parameters by differentiable tensor operations (autograd takes each
        gradient back to its parameter; ``rnngrad.convert.parameters``): input_weight,
        recurrent_weight, bias, secondary_bias (GRU), peephole (LSTM). With ``direction`` (0 or
        1), those of that direction alone, for a unidirectional op."""
        sides = parameters.sides(self.step_parameters(k), self._step_kinds[k],
                                 self.num_directions)
        if direction is not None:
            sides = [sides[direction]]
        return parameters.op_arguments(sides, H=self.hidden_size, secondary=self._secondary(),
                                       xp=torch)

    # -- the call -----------------------------------------------------------------------------
    def _initial(self, hx, N, batched, dtype):
        """(h_0, c_0) as [L·D,N,H] tensors or None."""
        lstm = self.cell == "lstm"
        if hx is None:
            return None, None
        if lstm:
            if not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                raise ValueError(f"hx: expected (h_0, c_0) for an LSTM, got {type(hx).__name__}")
            states = (("h_0", hx[0]), ("c_0", hx[1]))
        else:
            if not isinstance(hx, torch.Tensor):
                raise ValueError(f"hx: expected a tensor h_0 or None, got {type(hx).__name__}")
            states = (("h_0", hx),)
        LD, H = self.num_layers * self.num_directions, self.hidden_size
        out = []
        for name, t in states:
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
            if t.dtype != dtype and not (t.dtype == torch.float32 and dtype in _LOW):
                raise TypeError(f"{name}: expected dtype {dtype} (the input's), got {t.dtype}")
            want = (LD, N, H) if batched else (LD, H)
            if tuple(t.shape) != want:
                raise ValueError(f"{name}: expected shape {want} (num_layers·D, "
                                 f"{'N, ' if batched else ''}hidden_size), got {tuple(t.shape)}")
            out.append(t if batched else t.unsqueeze(1))
        return out[0], out[1] if lstm else None

    def _mask(self, mask, batched, dtype):
        if mask is None:
            return None
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask: expected a tensor or None, got {type(mask).__name__}")
        if not batched and mask.dim() == 2:
            mask = mask.unsqueeze(1)  # [T,DH] → [T,1,DH]
        if mask.dim() == 3 and self.batch_first and batched:
            mask = mask.transpose(0, 1)  # [N,T,DH] → [T,N,DH]
        return mask.to(dtype) if mask.dtype != dtype else mask

    def _dtype(self, input) -> torch.dtype:
        """The dtype of a call: the parameters', which the input must have; under autocast on
        the input's device, autocast's dtype when the input and the parameters are float32 or
        in it (as ``torch.nn``'s layers on CUDA; see ``rnngrad.torch.functions``)."""
        weight = self.parameter("weight_ih_l0")
        kind = "cpu" if input.is_cpu else input.device.type
        if kind in _AUTOCAST_DEVICES and torch.is_autocast_enabled(kind):
            low = torch.get_autocast_dtype(kind)
            if input.dtype in (torch.float32, low) and weight.dtype in (torch.float32, low):
                return low
        if input.dtype != weight.dtype:
            raise TypeError(f"input: expected dtype {weight.dtype} (the parameters'), got "
                            f"{input.dtype}; cast the input or the layer (layer.to(dtype)), or "
                            f"run under torch.autocast")
        return input.dtype

    def forward(self, input, hx=None, *, mask=None):
        if isinstance(input, nn.utils.rnn.PackedSequence):
            return self._forward_packed(input, hx, mask)
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a tensor, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 3-D (batched) or 2-D (unbatched) tensor, got "
                             f"shape {tuple(input.shape)}")
        dtype = self._dtype(input)
        if input.shape[-1] != self.input_size:
            raise ValueError(f"input: expected the last dimension to be input_size="
                             f"{self.input_size}, got shape {tuple(input.shape)}")
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)  # [T,N,I] or [N,T,I]
        if batched and self.batch_first:
            x = x.transpose(0, 1)  # [T,N,I], a view: rnngrad makes it contiguous once
        h0, c0 = self._initial(hx, x.shape[1], batched, dtype)
        m = self._mask(mask, batched, dtype)
        one_node = _route.one_node(self, x, (h0, c0), m, dtype)
        output, h_n, c_n = self._stack(x, h0, c0, _layer.one_node if one_node else _layer.general,
                                       m)
        if batched and self.batch_first:
            output = output.transpose(0, 1)
        if not batched:
            output, h_n = output.squeeze(1), h_n.squeeze(1)
            c_n = None if c_n is None else c_n.squeeze(1)
        return (output, (h_n, c_n)) if self.cell == "lstm" else (output, h_n)

    def _stack(self, x, h0, c0, run_layer, extra):
        """The layers in turn, ``run_layer(self, k, x, h0_k, c0_k, extra)`` each
        (``rnngrad.torch._layer``; ``extra``: the mask, or a packed batch's lengths), with
        dropout between them in training: (output [T,N,D·H], h_n [L·D,N,H], c_n or None)."""
        D, L = self.num_directions, self.num_layers
        finals_h, finals_c = [], []
        for k in range(L):
            hk = h0 if h0 is None or L == 1 else h0[k * D:(k + 1) * D]  # [D,N,H]
            ck = c0 if c0 is None or L == 1 else c0[k * D:(k + 1) * D]
            x, h_n, c_n = run_layer(self, k, x, hk, ck, extra)  # [T,N,DH], [D,N,H]
            if self.dropout and self.training and k < L - 1:
                x = F.dropout(x, self.dropout, training=True)
            finals_h.append(h_n)
            finals_c.append(c_n)
        h_n = finals_h[0] if L == 1 else torch.cat(finals_h)  # [LD,N,H]
        c_n = None if self.cell != "lstm" else finals_c[0] if L == 1 else torch.cat(finals_c)
        return x, h_n, c_n

    def _forward_packed(self, packed, hx, mask):
        """``torch.nn``'s semantics for a ``PackedSequence``: the layer stack over the padded
        batch, each layer by ``rnngrad.torch._layer.packed``. ``h_0``/``c_0`` and ``h_n``/``c_n``
        are in the batch's original order, the output has the input's ``batch_sizes`` and
        indices, as ``torch.nn``."""
        if mask is not None:
            raise ValueError("mask: not supported with a PackedSequence input (the lengths "
                             "already say which steps count); pass a padded tensor to use it")
        if self.reverse:
            raise ValueError("reverse: not supported with a PackedSequence input (MPSGraph's "
                             "reverse starts at the padded end); use bidirectional=True, whose "
                             "reverse direction starts at each sequence's own end")
        data = packed.data
        if not isinstance(data, torch.Tensor) or data.dim() != 2 \
                or data.shape[-1] != self.input_size:
            raise ValueError(f"input: expected a PackedSequence of [·, input_size="
                             f"{self.input_size}] data, got shape {tuple(data.shape)}")
        dtype = self._dtype(data)
        x, lengths = nn.utils.rnn.pad_packed_sequence(packed)  # [T,N,I], original order
        h0, c0 = self._initial(hx, x.shape[1], True, dtype)
        output, h_n, c_n = self._stack(x, h0, c0, _layer.packed, lengths)
        order = packed.sorted_indices
        sorted_x = output if order is None else output.index_select(1, order)
        sorted_lengths = lengths if order is None else lengths[order.cpu()]
        out_data = nn.utils.rnn.pack_padded_sequence(sorted_x, sorted_lengths).data
        output = type(packed)(out_data, packed.batch_sizes, packed.sorted_indices,
                              packed.unsorted_indices)
        return (output, (h_n, c_n)) if self.cell == "lstm" else (output, h_n)

    def __getstate__(self):
        # without the NumPy views of the parameters (rnngrad.torch._layer), made again when used
        return {k: v for k, v in self.__dict__.items() if k not in ("_array_views", "_wanted")}

    # -- conversion ---------------------------------------------------------------------------
    @classmethod
    def from_torch(cls, module, *, backend=None):
        """This layer with the configuration and parameters of ``module`` (a ``torch.nn.RNN``,
        ``GRU`` or ``LSTM`` of this kind, any number of layers), on its device and dtype."""
        return from_torch(module, backend=backend, expect=cls)

    def to_torch(self):
        """The ``torch.nn`` module that computes what this layer computes (same
        configuration, device, dtype and parameter values), or a ``ValueError`` naming the
        options PyTorch has no equivalent of."""
        differs = {k: v for k, v in self._options().items() if k not in self._layout_options()}
        if self.reverse:
            differs["reverse"] = True
        if differs:
            raise ValueError(f"to_torch: torch.nn.{_TORCH_MODULES[self.cell]} has no equivalent of "
                             f"{', '.join(f'{k}={v!r}' for k, v in differs.items())}")
        weight = self.weight_ih_l0
        kwargs = dict(num_layers=self.num_layers, bias=self.bias, batch_first=self.batch_first,
                      dropout=self.dropout, bidirectional=self.bidirectional,
                      device=weight.device, dtype=weight.dtype)
        if self.cell == "single_gate":
            kwargs["nonlinearity"] = self.descriptor.activation.name.lower()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dropout with one layer: warned at construction
            module = getattr(nn, _TORCH_MODULES[self.cell])(self.input_size, self.hidden_size, **kwargs)
        module.load_state_dict(self._torch_state_dict())
        return module

    def _layout_options(self) -> tuple:
        """Options that only change how the parameters are laid out (to_torch permutes)."""
        return ()

    def _torch_state_dict(self) -> dict:
        return {k: v.detach().clone() for k, v in self.state_dict().items()}


def _activation(value, name):
    return rnngrad.Activation.coerce(value, name)


class RNN(_RNNBase):
    """``torch.nn.RNN`` computed by rnngrad's single-gate RNN (module docstring).
    ``nonlinearity``: ``"tanh"`` (default) or ``"relu"`` as PyTorch, or MPSGraph's
    ``"sigmoid"``, ``"hard_sigmoid"``, ``"none"`` (an ``rnngrad.Activation`` too)."""

    cell = "single_gate"
    _descriptor_class = rnngrad.SingleGateRNNDescriptor

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None, *,
                 backend=None, reverse=False):
        self.nonlinearity = _activation(nonlinearity, "nonlinearity").name.lower()
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype, backend=backend, reverse=reverse,
                         options={"activation": self.nonlinearity})

    @property
    def mode(self) -> str:
        return f"RNN_{self.nonlinearity.upper()}"

    def _options(self):
        return {} if self.nonlinearity in ("tanh", "relu") else {"nonlinearity": self.nonlinearity}

    def extra_repr(self):
        s = super().extra_repr()
        return s + (f", nonlinearity={self.nonlinearity!r}" if self.nonlinearity == "relu" else "")


_GRU_DEFAULTS = dict(reset_gate_first=True, reset_after=True, flip_z=False,
                     update_gate_activation="sigmoid", reset_gate_activation="sigmoid",
                     output_gate_activation="tanh")


class GRU(_RNNBase):
    """``torch.nn.GRU`` computed by rnngrad's GRU (module docstring); the defaults of the
    MPSGraph options give PyTorch's GRU (reset_gate_first, reset_after, not flip_z)."""

    cell = "gru"
    _descriptor_class = rnngrad.GRUDescriptor

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, *, backend=None,
                 reverse=False, reset_gate_first=True, reset_after=True, flip_z=False,
                 update_gate_activation="sigmoid", reset_gate_activation="sigmoid",
                 output_gate_activation="tanh", secondary_bias=None):
        options = dict(reset_gate_first=reset_gate_first, reset_after=reset_after, flip_z=flip_z,
                       update_gate_activation=update_gate_activation,
                       reset_gate_activation=reset_gate_activation,
                       output_gate_activation=output_gate_activation)
        if secondary_bias is None:
            secondary_bias = bool(reset_after) and bool(bias)
        if not isinstance(secondary_bias, bool):
            raise ValueError(f"secondary_bias: expected a bool or None, got {secondary_bias!r}")
        if secondary_bias and not reset_after:
            raise ValueError("secondary_bias: MPSGraph reads the secondary bias only with "
                             "reset_after=True; got secondary_bias=True with reset_after=False")
        if secondary_bias and not bias:
            raise ValueError("secondary_bias: it is the candidate block of bias_hh (PyTorch's "
                             "b_hn), so it needs bias=True; got secondary_bias=True with "
                             "bias=False")
        self.secondary_bias = secondary_bias
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype, backend=backend, reverse=reverse,
                         options=options)

    def _secondary(self):
        return self.secondary_bias

    def _options(self):
        d = self.descriptor
        out = {}
        for name, default in _GRU_DEFAULTS.items():
            value = getattr(d, name)
            shown = value.name.lower() if isinstance(value, rnngrad.Activation) else value
            if shown != default:
                out[name] = shown
        if self.bias and self.secondary_bias != d.reset_after:
            out["secondary_bias"] = self.secondary_bias
        return out


_LSTM_DEFAULTS = dict(forget_gate_last=False, input_gate_activation="sigmoid",
                      forget_gate_activation="sigmoid", cell_gate_activation="tanh",
                      output_gate_activation="sigmoid", activation="tanh")


class LSTM(_RNNBase):
    """``torch.nn.LSTM`` computed by rnngrad's LSTM (module docstring); ``proj_size`` must be
    0 (rnngrad has no projections)."""

    cell = "lstm"
    _descriptor_class = rnngrad.LSTMDescriptor

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None, *,
                 backend=None, reverse=False, peephole=False, forget_gate_last=False,
                 input_gate_activation="sigmoid", forget_gate_activation="sigmoid",
                 cell_gate_activation="tanh", output_gate_activation="sigmoid",
                 activation="tanh"):
        if proj_size != 0:
            raise ValueError(f"proj_size: expected 0 (rnngrad's LSTM has no projection), got "
                             f"{proj_size!r}")
        if not isinstance(peephole, bool):
            raise ValueError(f"peephole: expected a bool, got {peephole!r}")
        self.peephole = peephole
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device, dtype, backend=backend, reverse=reverse,
                         options=dict(forget_gate_last=forget_gate_last,
                                      input_gate_activation=input_gate_activation,
                                      forget_gate_activation=forget_gate_activation,
                                      cell_gate_activation=cell_gate_activation,
                                      output_gate_activation=output_gate_activation,
                                      activation=activation))

    def _has_peephole(self):
        return self.peephole

    def _options(self):
        d = self.descriptor
        out = {"peephole": True} if self.peephole else {}
        for name, default in _LSTM_DEFAULTS.items():
            value = getattr(d, name)
            shown = value.name.lower() if isinstance(value, rnngrad.Activation) else value
            if shown != default:
                out[name] = shown
        return out

    def _layout_options(self):
        return ("forget_gate_last",)

    def _torch_state_dict(self):
        state = super()._torch_state_dict()
        if not self.descriptor.forget_gate_last:
            return state
        H = self.hidden_size
        order = [0, 2, 1, 3]  # blocks i, z, f, o → PyTorch's i, f, g, o
        return {k: torch.cat([v[b * H:(b + 1) * H] for b in order]) for k, v in state.items()}


_LAYERS = {"RNN_TANH": RNN, "RNN_RELU": RNN, "GRU": GRU, "LSTM": LSTM}


def from_torch(module, *, backend=None, expect=None):
    """The ``rnngrad.torch`` layer that computes what ``module`` (a ``torch.nn.RNN``, ``GRU``
    or ``LSTM``) computes: same configuration, device, dtype and parameter values. Each layer's
    parameters are read by ``rnngrad.convert.torch.from_state_dict``, which refuses what
    rnngrad cannot compute (projections) with its own errors."""
    mode = getattr(module, "mode", None)
    if mode not in _LAYERS:
        raise ValueError(f"module: expected torch.nn.RNN, GRU or LSTM (mode in "
                         f"{sorted(convert.MODES)}), got {type(module).__name__} with mode {mode!r}")
    cls = _LAYERS[mode]
    if expect is not None and cls is not expect:
        raise ValueError(f"module: expected a torch.nn.{_TORCH_MODULES[expect.cell]}, got "
                         f"{type(module).__name__} (mode {mode!r})")
    if getattr(module, "proj_size", 0):
        raise ValueError(f"module.proj_size: expected 0 (LSTM projections have no rnngrad "
                         f"equivalent), got {module.proj_size}")
    params = dict(module.named_parameters())
    for k in range(module.num_layers):  # each layer as the converter reads it: its checks
        tag = f"_l{k}"
        layer = {name.replace(tag, "_l0"): p for name, p in params.items()
                 if name.endswith((tag, tag + "_reverse"))}
        spec = convert.from_state_dict(mode, layer, batch_first=module.batch_first)
        if spec.D != (2 if module.bidirectional else 1) or spec.H != module.hidden_size:
            raise ValueError(f"module: layer {k}'s parameters do not match its configuration "
                             f"(bidirectional={module.bidirectional}, "
                             f"hidden_size={module.hidden_size})")
    kwargs = dict(num_layers=module.num_layers, bias=module.bias, batch_first=module.batch_first,
                  dropout=module.dropout, bidirectional=module.bidirectional,
                  device=module.weight_ih_l0.device, dtype=module.weight_ih_l0.dtype,
                  backend=backend)
    if cls is RNN:
        kwargs["nonlinearity"] = module.nonlinearity
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dropout with one layer: the module warned already
        layer = cls(module.input_size, module.hidden_size, **kwargs)
    layer.load_state_dict(module.state_dict())
    return layer
