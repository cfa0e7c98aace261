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
