"""Planted faults: copies of the reference with one realistic bug each, to prove that a checker
catches the bugs RNN backends have shipped.

Nothing here is a backend: no fault is registered, and ``backend=`` never reaches one. Each
:class:`Fault` is the reference's source with one textual change (the same change wherever the bug
shows up, e.g. in forward and backward), executed as a private copy of the modules, or one change
in how results are assembled; :meth:`Fault.function` gives a callable with the signature of a
public rnngrad function::

    from rnngrad.testing.mutants import FAULTS
    from rnngrad.testing import check_backend
    fault = FAULTS["flip_z_inverted"]
    check_backend(fault.function("gru"), "gru")          # raises ReferenceMismatch

``verification/mutations.py`` runs :func:`rnngrad.testing.check_backend` on every fault.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types

import numpy as np

from .. import api, validation
from ..problem import ForwardArrays, GradientArrays
from ..results import GradientResult
from .cases import op_info, op_name


@dataclasses.dataclass(frozen=True)
class Fault:
    """One planted bug.

    name: short identifier; bug_class: the class of bug it belongs to; description: one line;
    cell: the cell whose ops show it (faults in the shared wrapper are checked on one cell);
    edits: {reference module: ((old text, new text), ...)}, each old text found exactly once;
    assembly: None, "extra_bias" (a bias gradient returned without a bias) or "omit_bias" (no bias
    gradient returned although a bias was given).
    """

    name: str
    bug_class: str
    description: str
    cell: str
    edits: dict = dataclasses.field(default_factory=dict)
    assembly: str = None

    @property
    def ops(self) -> tuple:
        """The forward and gradient op of the fault's cell."""
        return op_name(self.cell, False), op_name(self.cell, True)

    def backend(self):
        """(forward(problem), gradients(problem)) computed by the faulty copy."""
        return _build(self)

    def function(self, op):
        """A callable with the signature of ``rnngrad.<op>`` that computes with the fault."""
        forward, gradients = _build(self)
        return _public(op, gradients if op_info(op)[1] else forward, self.assembly, self.name)


def _copy(module, edits, fault, activations=None):
    """A private copy of ``rnngrad.backends.reference.<module>`` with ``edits`` applied to its source."""
    source = inspect.getsource(importlib.import_module(f"rnngrad.backends.reference.{module}"))
    for old, new in edits:
        found = source.count(old)
        if found != 1:
            raise RuntimeError(f"fault {fault}: expected the text to replace once in "
                               f"rnngrad/backends/reference/{module}.py, found it {found} times: {old!r}")
        source = source.replace(old, new)
    copy = types.ModuleType(f"rnngrad.testing.mutants.{fault}.{module}")
    copy.__package__ = "rnngrad.backends.reference"  # its relative imports resolve to the reference
    # dataclasses look their class's module up by name; the reference module stands in for it.
    copy.__name__ = f"rnngrad.backends.reference.{module}"
    exec(compile(source, f"<{fault}: rnngrad/backends/reference/{module}.py>", "exec"), copy.__dict__)
    if activations is not None:
        copy.activate, copy.derivative = activations.activate, activations.derivative
    return copy


def _build(fault):
    edits = fault.edits
    activations = _copy("activations", edits.get("activations", ()), fault.name)
    directions = _copy("directions", edits.get("directions", ()), fault.name)
    cells = {cell: _copy(cell, edits.get(cell, ()), fault.name, activations)
             for cell in ("single_gate", "gru", "lstm")}
    cast = lambda a, dtype: None if a is None else np.asarray(a, dtype=dtype)  # noqa: E731

    def forward(problem):
        h, c, z = directions.forward(problem, cells[problem.cell].core_forward)
        desc = problem.descriptor
        keep_c = problem.cell == "lstm" and (desc.training or desc.produce_cell)
        return ForwardArrays(h=cast(h, problem.dtype), c=cast(c, problem.dtype) if keep_c else None,
                             z_state=cast(z, problem.dtype) if desc.training else None)

    def gradients(problem):
        grads = directions.gradients(problem, cells[problem.cell].core_backward)
        return GradientArrays(**{k: cast(v, problem.dtype) for k, v in grads.items()})

    return forward, gradients


def _public(op, implementation, assembly, fault):
    """The public function ``op`` over ``implementation``, as rnngrad.api assembles results."""
    cell, gradients = op_info(op)
    signature = inspect.signature(getattr(api, op))

    def call(*args, **kwargs):
        given = dict(signature.bind(*args, **kwargs).arguments)
        descriptor = given.pop("descriptor", None)
        given.pop("backend", None)
        if not gradients:
            problem, _ = validation.forward_problem(cell, descriptor, **given)
            return api.forward_result(problem, implementation(problem))
        problem, original = validation.gradient_problem(cell, descriptor, **given)
        entries = api.gradient_entries(problem, original, implementation(problem))
        if assembly == "extra_bias" and problem.bias is None:
            at = 2 + (problem.input_weight is not None)  # the bias slot after source, R, W
            entries.insert(at, ("bias", np.zeros((1, 1, problem.D * problem.G * problem.H), problem.dtype)))
        if assembly == "omit_bias":
            entries = [(name, value) for name, value in entries if name != "bias"]
        return GradientResult(entries)

    call.__name__ = call.__qualname__ = f"{op}_with_{fault}"
    call.__module__ = "rnngrad.testing.mutants"
    return call


def _f(name, bug_class, cell, description, assembly=None, **edits):
    return Fault(name, bug_class, description, cell, {k: tuple(v) for k, v in edits.items()}, assembly)


_DH_FINAL = "            direction.dh_final = _halves(state_g, H, d)\n"

FAULT_LIST = (
    _f("batch_first_backward", "batch-first transposition in backward", "lstm",
       "source gradient computed batch-first and reshaped, not transposed, back to [T,N,·]",
       directions=[
           ('out["source"] = dA @ f64(problem.input_weight)  # [T,N,I]',
            'out["source"] = (dA @ f64(problem.input_weight)).transpose(1, 0, 2).reshape(dA.shape[0], dA.shape[1], -1)'),
           ('out["source"] = dA  # [T,N,DGH]',
            'out["source"] = dA.transpose(1, 0, 2).reshape(dA.shape)')]),
    _f("bidirectional_outputs_unaligned", "bidirectional alignment", "gru",
       "backward direction's h, c and z_state left in processing order instead of input time",
       directions=[
           ("h = np.concatenate([hf, hb[::-1]], axis=-1)", "h = np.concatenate([hf, hb], axis=-1)"),
           ("c = None if cf is None else np.concatenate([cf, cb[::-1]], axis=-1)",
            "c = None if cf is None else np.concatenate([cf, cb], axis=-1)"),
           ("z = np.concatenate([zf, zb[::-1]], axis=-1)", "z = np.concatenate([zf, zb], axis=-1)")]),
    _f("bidirectional_gradients_unaligned", "bidirectional alignment", "lstm",
       "backward direction reads source_gradient, z_state and the forward outputs without time-reversing them",
       directions=[("flip_aligned = d == 1", "flip_aligned = False")]),
    _f("backward_final_state_at_end", "backward direction's final state at t=0", "single_gate",
       "backward half of state_gradient added at aligned step T−1 instead of t = 0",
       directions=[(_DH_FINAL, _DH_FINAL +
                    "            if d == 1 and direction.dh_final is not None and problem.T > 0:\n"
                    "                direction.dh_in = direction.dh_in.copy()\n"
                    "                direction.dh_in[0] += direction.dh_final\n"
                    "                direction.dh_final = None\n")]),
    _f("zero_output_gradient_shortcut", "only-final-state upstream gradients", "lstm",
       "backward skipped (zero gradients) when source_gradient is all zero, ignoring the state gradients",
       directions=[("    dirs = _directions(problem, None)\n",
                    "    if not np.any(problem.source_gradient):  # nothing flows back\n"
                    "        problem = dataclasses.replace(problem, state_gradient=None, cell_gradient=None)\n"
                    "    dirs = _directions(problem, None)\n")]),
    _f("final_cell_gradient_ignored", "only-final-state upstream gradients", "lstm",
       "a final-cell cell_gradient ([N,D·H]) is accepted and ignored",
       directions=[("direction.dc_final = _halves(cg, H, d)", "direction.dc_final = None")]),
    _f("dropped_state_gradient", "dropped state_gradient", "gru",
       "state_gradient never enters the backward recursion",
       directions=[("return self.dh_final.copy() if self.dh_final is not None else np.zeros((N, H))",
                    "return np.zeros((N, H))")]),
    _f("bias_gradient_without_bias", "missing bias", "single_gate",
       "a zero bias gradient is returned when no bias was given, shifting the later results",
       assembly="extra_bias"),
    _f("bias_gradient_omitted", "missing bias", "lstm",
       "no bias gradient is returned although a bias was given", assembly="omit_bias"),
    _f("bias_gradient_squeezed", "bias gradient shape", "gru",
       "bias gradient returned as [D·G·H] instead of MPSGraph's [1,1,D·G·H]",
       directions=[("dA.sum(axis=(0, 1), keepdims=True)", "dA.sum(axis=(0, 1))")]),
    _f("gru_bias_folded", "GRU bias split", "gru",
       "secondary_bias added outside the reset product, as if folded into the input bias",
       gru=[('s["q"][...] = hm @ R["o"] + b2', 's["q"][...] = hm @ R["o"]'),
            ('s["o"][...] = x["o"] + s["q"] * r', 's["o"][...] = x["o"] + b2 + s["q"] * r'),
            ("db2 += dq.sum(axis=0)", 'db2 += da["o"].sum(axis=0)')]),
    _f("gru_reset_after_always", "reset-before vs reset-after", "gru",
       "reset gate applied after the matrix product even when reset_after is False",
       gru=[('s["o"][...] = x["o"] + (hm * r) @ R["o"]', 's["o"][...] = x["o"] + (hm @ R["o"]) * r')]),
    _f("mask_forward_only", "mask in forward but not backward", "lstm",
       "the mask is applied in the forward pass and ignored in the backward pass",
       lstm=[("        m = d.mask(t)\n        ct = d.c_fwd[t]", "        m = 1.0\n        ct = d.c_fwd[t]")]),
    _f("mask_not_on_recurrent_gradient", "mask in forward but not backward", "single_gate",
       "the recurrent-weight gradient uses the unmasked previous state",
       single_gate=[("dR += da.T @ (hp * m)", "dR += da.T @ hp")]),
    _f("mask_time_reversed", "mask in forward but not backward", "lstm",
       "a per-step mask is time-reversed for the backward direction",
       directions=[("m=_halves(m, H, d),",
                    "m=_in_processing_order(_halves(m, H, d), "
                    "d == 1 and problem.mask is not None and problem.mask.ndim == 3),")]),
    _f("empty_sequence_zero_gradients", "degenerate T=0", "single_gate",
       "T = 0 returns zero init_state gradients instead of passing state_gradient through",
       directions=[("    results = [core_backward(d, problem.descriptor) for d in dirs]\n",
                    "    if problem.T == 0:  # nothing to do\n"
                    "        for d in dirs:\n"
                    "            d.dh_final = d.dc_final = None\n"
                    "    results = [core_backward(d, problem.descriptor) for d in dirs]\n")]),
    _f("empty_batch_error", "degenerate N=0", "gru",
       "an empty batch raises instead of returning empty outputs",
       directions=[("    dirs = _directions(problem, project(problem))\n",
                    "    if problem.N == 0:\n"
                    "        raise RuntimeError('cannot launch a kernel over an empty batch')\n"
                    "    dirs = _directions(problem, project(problem))\n")]),
    _f("relu_drops_nan", "NaN in one batch row", "single_gate",
       "relu written as where(x > 0, x, 0), which turns NaN into 0",
       activations=[("return np.maximum(x, 0.0)", "return np.where(x > 0, x, 0.0)")]),
    _f("nan_derivative_zero", "NaN in one batch row", "single_gate",
       "activation derivatives of a NaN pre-activation are 0 instead of NaN",
       activations=[("return np.where(np.isnan(x), np.nan, d)", "return d")]),
    _f("lstm_gate_order", "wrong gate order", "lstm",
       "forget_gate_last ignored: gates always read in [i, f, z, o] order",
       lstm=[("for k, j in desc.gate_index.items()}", 'for k, j in {"i": 0, "f": 1, "z": 2, "o": 3}.items()}')]),
    _f("gru_gate_order", "wrong gate order", "gru",
       "reset_gate_first ignored: gates always read in [z, r, o] order",
       gru=[('out = {k: a[..., j * H:(j + 1) * H] for k, j in desc.gate_index.items()}',
             'out = {k: a[..., j * H:(j + 1) * H] for k, j in {"z": 0, "r": 1, "o": 2}.items()}'),
            ("return {k: R[j * H:(j + 1) * H] for k, j in desc.gate_index.items()}",
             'return {k: R[j * H:(j + 1) * H] for k, j in {"z": 0, "r": 1, "o": 2}.items()}')]),
    _f("flip_z_inverted", "flip_z inverted", "gru",
       "flip_z read the other way round, in forward and backward",
       gru=[("if desc.flip_z else", "if not desc.flip_z else"),
            ("        if desc.flip_z:\n", "        if not desc.flip_z:\n")]),
    _f("reverse_outputs_realigned", "reverse outputs re-aligned", "gru",
       "reverse outputs flipped back to input time",
       directions=[("        return outs[0]  # processing order, not flipped back (SEMANTICS.md §2.1, step 3)",
                    "        return tuple(None if a is None else (a[::-1] if problem.descriptor.reverse else a)"
                    " for a in outs[0])")]),
    _f("reverse_gradients_realigned", "reverse outputs re-aligned", "single_gate",
       "reverse: source_gradient and z_state read as if aligned with input time",
       directions=[("flip_aligned = d == 1", "flip_aligned = backward")]),
    _f("bidirectional_shared_weights", "bidirectional alignment", "single_gate",
       "the backward direction runs with the forward direction's recurrent weights",
       directions=[("R=f64(problem.recurrent_weight[d]),", "R=f64(problem.recurrent_weight[0]),")]),
    _f("peephole_on_current_cell", "peephole on c[t]", "lstm",
       "peephole gradient accumulated against c[t] instead of c[t−1]",
       lstm=[("dp_k[k] += (da[k] * cp).sum(axis=0)", "dp_k[k] += (da[k] * ct).sum(axis=0)")]),
    _f("peephole_missing_in_cell_gradient", "peephole on c[t]", "lstm",
       "the cell gradient misses the peephole paths into c[t−1]",
       lstm=[('dc_next = dc_next + sum(da[k] * p[k] for k in "ifzo")', "pass")]),
    _f("hard_sigmoid_slope_sixth", "hard-sigmoid slope 1/6", "lstm",
       "hard_sigmoid as PyTorch's hardsigmoid: clamp(x/6 + 1/2, 0, 1)",
       activations=[("HARD_SIGMOID_SLOPE = 0.2", "HARD_SIGMOID_SLOPE = 1 / 6")]),
)

#: name -> Fault
FAULTS = {fault.name: fault for fault in FAULT_LIST}

__all__ = ["Fault", "FAULTS", "FAULT_LIST"]


# -- layer faults -------------------------------------------------------------------------------
#
# A torch.nn-style layer built as PyTorch's MPS layers are: the recurrent op of each layer is
# one call (here rnngrad's reference, standing for MPSGraph's op, through an autograd Function),
# and the layer adds the rest: the batch_first transposes, the per-layer slices of h_0 / c_0,
# the two biases, dropout between layers, the packing of variable-length batches and a cache of
# "graphs" keyed by configuration. Each LayerFault plants one fault of the classes PyTorch's MPS
# layers have shipped in that glue; :func:`layer_factory` gives a factory for
# :func:`rnngrad.testing.module.check_module`.

@dataclasses.dataclass(frozen=True)
class LayerFault:
    """One planted bug in a layer's glue: ``name``, ``bug_class``, ``description``."""

    name: str
    bug_class: str
    description: str

    def factory(self, cell):
        """A factory of layers of ``cell`` ("rnn", "gru", "lstm") with this fault."""
        return layer_factory(cell, self.name)


LAYER_FAULT_LIST = (
    LayerFault("batch_first_backward_untransposed", "batch_first transposes missing in backward",
               "the input gradient of a batch_first layer is reshaped to [N,T,I], not transposed"),
    LayerFault("initial_state_slices", "multi-layer h_0 / c_0 slices wrong",
               "layer k reads h_0[k:k+D] (and c_0) instead of h_0[k·D:(k+1)·D]"),
    LayerFault("no_bias_gradient", "no bias gradient",
               "the op's backward returns no gradient for bias_ih / bias_hh"),
    LayerFault("bidirectional_biases_mixed", "bidirectional parameters mixed",
               "the reverse direction reads the forward direction's biases"),
    LayerFault("final_states_only_no_gradient", "backward wrong when the loss uses only (h_n, c_n)",
               "the op's backward returns nothing when the output's gradient is absent"),
    LayerFault("packed_lengths_sorted", "PackedSequence wrong at batch > 1",
               "a packed batch's lengths taken in sorted order while its rows are in the original order"),
    LayerFault("eval_reuses_train_dropout", "eval reusing the train dropout",
               "the graph cache's key lacks the training flag, so eval after train drops out"),
    LayerFault("dropout_mask_ignored_in_backward", "backward ignoring the inter-layer dropout mask",
               "the dropout between layers passes its gradient through unmasked and unscaled"),
    LayerFault("gradient_above_32k_elements", "wrong gradients above 32K elements",
               "the input gradient beyond its first 32768 elements is left at zero"),
)

#: name -> LayerFault
LAYER_FAULTS = {fault.name: fault for fault in LAYER_FAULT_LIST}

_CELL_MODES = {"gru": "GRU", "lstm": "LSTM"}


def layer_factory(cell, fault=None):
    """A factory ``factory(**config)`` (torch.nn.RNN / GRU / LSTM's constructor keywords) of
    torch.nn-style layers of ``cell`` composed from rnngrad's reference op, with the planted
    ``fault`` (a name of :data:`LAYER_FAULTS`) or none. Needs torch."""
    if fault is not None and fault not in LAYER_FAULTS:
        raise ValueError(f"fault: expected one of {sorted(LAYER_FAULTS)}, got {fault!r}")
    layer = _layer_class()

    def factory(**config):
        return layer(cell, fault, **config)

    factory.__name__ = factory.__qualname__ = f"{cell}_layer_with_{fault or 'no_fault'}"
    factory.__module__ = __name__
    return factory


_LAYER = []


def _layer_class():
    """The layer class, made on first use (torch is imported only then)."""
    if _LAYER:
        return _LAYER[0]
    import math

    import torch
    from torch import nn

    from ..convert.torch import from_state_dict

    def numpy(t):
        return None if t is None else t.detach().cpu().numpy()

    class Op(torch.autograd.Function):
        """One layer's recurrent op (both directions): forward and gradients by rnngrad's
        reference. Inputs: x [T,N,I], h0 / c0 [D,N,H] or None, then the layer's parameters."""

        @staticmethod
        def forward(ctx, layer, x, h0, c0, *params):
            ctx.layer, ctx.hx = layer, (h0, c0)
            ctx.set_materialize_grads(False)
            ctx.save_for_backward(x, *params)
            rnn = layer.converted(params)
            hx = None if h0 is None else ((numpy(h0), numpy(c0)) if layer.cell == "lstm" else numpy(h0))
            out, hn = rnn.forward(numpy(x), hx, backend="reference")
            hn, cn = hn if layer.cell == "lstm" else (hn, None)
            like = lambda a: None if a is None else torch.as_tensor(a, dtype=x.dtype, device=x.device)  # noqa: E731
            return like(out), like(hn), like(cn)

        @staticmethod
        def backward(ctx, g_out, g_hn, g_cn):
            layer = ctx.layer
            x, *params = ctx.saved_tensors
            fault = layer.fault
            if g_out is None and fault == "final_states_only_no_gradient":
                return (None,) * (4 + len(params))
            h0, c0 = ctx.hx
            rnn = layer.converted(params)
            hx = None if h0 is None else ((numpy(h0), numpy(c0)) if layer.cell == "lstm" else numpy(h0))
            T, N = x.shape[:2]
            grads = rnn.gradients(numpy(x), hx, grad_output=numpy(g_out), grad_h_n=numpy(g_hn),
                                  grad_c_n=numpy(g_cn) if layer.cell == "lstm" else None,
                                  backend="reference")
            like = lambda a: None if a is None else torch.as_tensor(np.ascontiguousarray(a), dtype=x.dtype, device=x.device)  # noqa: E731
            dx = like(grads.input)
            if fault == "gradient_above_32k_elements" and dx.numel() > 2**15:
                dx.view(-1)[2**15:] = 0
            by_name = dict(grads.parameters)
            out = []
            for name in layer.op_names:
                if fault == "no_bias_gradient" and name.startswith("bias"):
                    out.append(None)
                else:
                    out.append(like(by_name[name]))
            return (None, dx, like(grads.h_0) if h0 is not None else None,
                    like(grads.c_0) if c0 is not None else None, *out)

    class ToTimeMajor(torch.autograd.Function):
        """[N,T,I] → [T,N,I]."""

        @staticmethod
        def forward(ctx, x, fault):
            ctx.fault, ctx.shape = fault, x.shape
            return x.transpose(0, 1).contiguous()

        @staticmethod
        def backward(ctx, g):
            if ctx.fault == "batch_first_backward_untransposed":
                return g.contiguous().reshape(ctx.shape), None
            return g.transpose(0, 1), None

    class Dropout(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p, fault):
            mask = (torch.rand_like(x) >= p).to(x.dtype) / (1 - p)
            ctx.save_for_backward(mask)
            ctx.fault = fault
            return x * mask

        @staticmethod
        def backward(ctx, g):
            (mask,) = ctx.saved_tensors
            return (g if ctx.fault == "dropout_mask_ignored_in_backward" else g * mask), None, None

    class OneLayer:
        """What one layer's op needs: its cell, fault and parameter names (as layer 0)."""

        def __init__(self, cell, fault, names, mode):
            self.cell, self.fault, self.mode = cell, fault, mode
            self.names = names  # the layer's own names
            self.op_names = [n.replace(n[n.index("_l"):], "_l0" + ("_reverse" if n.endswith("_reverse") else ""))
                             for n in names]

        def converted(self, params):
            own = {n: numpy(p) for n, p in zip(self.op_names, params)}
            return from_state_dict(self.mode, own)

    class Layer(nn.Module):
        """A torch.nn.RNN / GRU / LSTM look-alike composed from one op call per layer."""

        def __init__(self, cell, fault, input_size, hidden_size, num_layers=1, bias=True,
                     batch_first=False, dropout=0.0, bidirectional=False, nonlinearity="tanh"):
            super().__init__()
            if cell == "rnn" and nonlinearity not in ("tanh", "relu"):
                raise ValueError(f"nonlinearity: expected 'tanh' or 'relu', got {nonlinearity!r}")
            self.cell, self.fault = cell, fault
            self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
            self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
            self.bidirectional = bidirectional
            mode = ("RNN_RELU" if nonlinearity == "relu" else "RNN_TANH") if cell == "rnn" else _CELL_MODES[cell]
            G, D, H = {"rnn": 1, "gru": 3, "lstm": 4}[cell], 2 if bidirectional else 1, hidden_size
            self.layers = []
            std = 1.0 / math.sqrt(H)
            for k in range(num_layers):
                names = []
                for sfx in (f"_l{k}", f"_l{k}_reverse")[:D]:
                    shapes = [(f"weight_ih{sfx}", (G * H, input_size if k == 0 else D * H)),
                              (f"weight_hh{sfx}", (G * H, H))]
                    if bias:
                        shapes += [(f"bias_ih{sfx}", (G * H,)), (f"bias_hh{sfx}", (G * H,))]
                    for name, shape in shapes:
                        self.register_parameter(name, nn.Parameter(torch.empty(shape).uniform_(-std, std)))
                        names.append(name)
                self.layers.append(OneLayer(cell, fault, names, mode))
            self._graphs = {}

        def _params(self, layer):
            out = []
            for name in layer.names:
                if self.fault == "bidirectional_biases_mixed" and name.startswith("bias") \
                        and name.endswith("_reverse"):
                    name = name[:-len("_reverse")]
                out.append(getattr(self, name))
            return out

        def _graph(self, shape):
            key = shape if self.fault == "eval_reuses_train_dropout" else (shape, self.training)
            return self._graphs.setdefault(key, {"dropout": self.training and self.dropout > 0})

        def _stack(self, x, h0, c0):
            """The layers over a time-major batch x [T,N,I]: (output, h_n, c_n)."""
            D = 2 if self.bidirectional else 1
            graph = self._graph(tuple(x.shape))
            hs, cs = [], []
            for k, layer in enumerate(self.layers):
                lo, hi = (k, k + D) if self.fault == "initial_state_slices" else (k * D, (k + 1) * D)
                hk = None if h0 is None else h0[lo:hi]
                ck = None if c0 is None else c0[lo:hi]
                x, hn, cn = Op.apply(layer, x, hk, ck, *self._params(layer))
                hs.append(hn)
                cs.append(cn)
                if k < self.num_layers - 1 and graph["dropout"]:
                    x = Dropout.apply(x, self.dropout, self.fault)
            return x, torch.cat(hs), (torch.cat(cs) if self.cell == "lstm" else None)

        def forward(self, input, hx=None):
            h0, c0 = (hx if hx is not None else (None, None)) if self.cell == "lstm" else (hx, None)
            if isinstance(input, nn.utils.rnn.PackedSequence):
                padded, lengths = nn.utils.rnn.pad_packed_sequence(input)  # [T,N,I], original order
                lengths = lengths.tolist()
                if self.fault == "packed_lengths_sorted":
                    lengths = sorted(lengths, reverse=True)
                rows = []
                for n, length in enumerate(lengths):
                    pick = lambda s: None if s is None else s[:, n:n + 1]  # noqa: E731
                    rows.append(self._stack(padded[:length, n:n + 1], pick(h0), pick(c0)))
                T = padded.shape[0]
                pad = lambda o: torch.cat([o, o.new_zeros((T - o.shape[0],) + o.shape[1:])])  # noqa: E731
                out = torch.cat([pad(r[0]) for r in rows], dim=1)
                hn = torch.cat([r[1] for r in rows], dim=1)
                cn = torch.cat([r[2] for r in rows], dim=1) if self.cell == "lstm" else None
                out = nn.utils.rnn.pack_padded_sequence(out, lengths, enforce_sorted=False)
            else:
                unbatched = input.dim() == 2
                if unbatched:
                    x = input.unsqueeze(1)
                    h0 = None if h0 is None else h0.unsqueeze(1)
                    c0 = None if c0 is None else c0.unsqueeze(1)
                else:
                    x = ToTimeMajor.apply(input, self.fault) if self.batch_first else input
                out, hn, cn = self._stack(x, h0, c0)
                if unbatched:
                    out, hn = out.squeeze(1), hn.squeeze(1)
                    cn = None if cn is None else cn.squeeze(1)
                elif self.batch_first:
                    out = out.transpose(0, 1)
            return (out, (hn, cn)) if self.cell == "lstm" else (out, hn)

    _LAYER.append(Layer)
    return Layer


__all__ += ["LayerFault", "LAYER_FAULTS", "LAYER_FAULT_LIST", "layer_factory"]
