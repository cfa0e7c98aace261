"""Complete problems for the six ops, drawn with NumPy's generator, and the loss they define.

A :class:`Case` holds one cell's descriptor, its forward inputs and the upstream gradients
(source_gradient, state_gradient, cell_gradient). From it: the forward call, the gradient call
(with z_state / output_fwd / cell_output_fwd from a training forward), and the scalar loss whose
gradients the gradient op returns:

    L = Σ source_gradient ⊙ h + Σ state_gradient ⊙ h_final + Σ cell_gradient ⊙ c
        (c per step, or c_final for a final-cell gradient)

where ``h_final`` is each direction's state after its last processing step: ``h[T−1]``
unidirectional; ``[h[T−1, :, :H], h[0, :, H:]]`` bidirectional. ``repr(case)`` is Python that
rebuilds the case.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from .. import api
from .. import states
from ..api import FORWARD_OPS, OPS, op_info, op_name  # noqa: F401  (toolkit names)
from ..descriptors import Activation, DESCRIPTORS, GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor

CELLS = ("single_gate", "gru", "lstm")
#: differentiable forward inputs, in a fixed order
PARAMETERS = ("source", "recurrent_weight", "input_weight", "bias", "init_state", "init_cell",
              "peephole", "secondary_bias")


@dataclasses.dataclass
class Case:
    cell: str
    descriptor: object
    inputs: dict  # forward inputs by argument name (absent ones left out)
    source_gradient: np.ndarray
    state_gradient: Optional[np.ndarray] = None
    cell_gradient: Optional[np.ndarray] = None

    # -- shapes -------------------------------------------------------------------------------
    @property
    def T(self):
        return self.inputs["source"].shape[0]

    @property
    def H(self):
        return self.inputs["recurrent_weight"].shape[-1]

    @property
    def D(self):
        return 2 if self.descriptor.bidirectional else 1

    @property
    def dtype(self):
        return self.inputs["source"].dtype

    def astype(self, dtype) -> "Case":
        return self.mapped(lambda a: np.asarray(a, dtype=dtype))

    def mapped(self, fn) -> "Case":
        """The case with ``fn`` applied to every input and upstream gradient present."""
        call = lambda a: None if a is None else fn(a)  # noqa: E731
        return dataclasses.replace(
            self, inputs={k: call(v) for k, v in self.inputs.items()},
            source_gradient=call(self.source_gradient), state_gradient=call(self.state_gradient),
            cell_gradient=call(self.cell_gradient))

    # -- calls --------------------------------------------------------------------------------
    def forward(self, backend=None, descriptor=None, fn=None):
        fn = fn or getattr(api, FORWARD_OPS[self.cell])
        return fn(**self.inputs, descriptor=descriptor or self.descriptor, backend=backend)

    def training_forward(self, backend=None):
        """Forward with training=True: (h, c or None, z_state)."""
        desc = dataclasses.replace(self.descriptor, training=True)
        out = self.forward(backend, desc)
        return out.state, out.cell, out.z_state

    def gradient_kwargs(self, h, c, z):
        """Keyword arguments of the gradient op, given the training forward's outputs."""
        kw = dict(self.inputs, source_gradient=self.source_gradient, z_state=z,
                  state_gradient=self.state_gradient, descriptor=self.descriptor)
        if self.cell == "gru":
            kw["output_fwd"] = h
        if self.cell == "lstm":
            kw["cell_output_fwd"] = c
            kw["cell_gradient"] = self.cell_gradient
        return kw

    def gradients(self, backend=None, forward_backend=None, fn=None):
        """The gradient op, fed by a training forward (of ``forward_backend``, default the same)."""
        h, c, z = self.training_forward(forward_backend if forward_backend is not None else backend)
        fn = fn or getattr(api, FORWARD_OPS[self.cell] + "_gradients")
        return fn(**self.gradient_kwargs(h, c, z), backend=backend)

    def loss(self, inputs=None) -> float:
        """L at ``inputs`` (default the case's own), through the reference in float64."""
        inputs = {k: np.asarray(v, np.float64) for k, v in (inputs or self.inputs).items()}
        desc = dataclasses.replace(self.descriptor, training=False,
                                   **({"produce_cell": True} if self.cell == "lstm" else {}))
        out = getattr(api, FORWARD_OPS[self.cell])(**inputs, descriptor=desc, backend="reference")
        total = float(np.sum(np.asarray(self.source_gradient, np.float64) * out.state))
        if self.state_gradient is not None:
            total += float(np.sum(np.asarray(self.state_gradient, np.float64).reshape(-1, self.D * self.H)
                                  * states.final(out.state, self.D)))
        if self.cell_gradient is not None:
            cg = np.asarray(self.cell_gradient, np.float64)
            per_step = cg.ndim == 3 and cg.shape[0] == self.T and self.T != 1
            target = out.cell if per_step else states.final(out.cell, self.D)
            total += float(np.sum(cg.reshape(target.shape) * target))
        return total

    def __repr__(self):
        return _repr_case(self)


def random_descriptor(rng, cell, **fixed):
    """A descriptor with every option drawn at random, except those given in ``fixed``."""
    acts = list(Activation)
    coin = lambda: bool(rng.integers(2))  # noqa: E731
    common = dict(reverse=coin(), bidirectional=coin(), training=coin())
    if cell == "single_gate":
        options = dict(common, activation=acts[rng.integers(len(acts))])
    elif cell == "gru":
        gate_acts = [Activation.SIGMOID, Activation.HARD_SIGMOID, Activation.TANH, Activation.NONE]
        options = dict(common, reset_gate_first=coin(), reset_after=coin(), flip_z=coin(),
                       update_gate_activation=gate_acts[rng.integers(3)],  # NONE is not contractive
                       reset_gate_activation=gate_acts[rng.integers(len(gate_acts))],
                       output_gate_activation=acts[rng.integers(len(acts))])
    else:
        gate_acts = [Activation.SIGMOID, Activation.HARD_SIGMOID, Activation.TANH]
        pick = lambda choices: choices[rng.integers(len(choices))]  # noqa: E731
        options = dict(common, produce_cell=coin(), forget_gate_last=coin(),
                       input_gate_activation=pick(gate_acts), forget_gate_activation=pick(gate_acts),
                       cell_gate_activation=pick(acts), output_gate_activation=pick(gate_acts),
                       activation=pick(acts))
    options.update(fixed)
    return DESCRIPTORS[cell](**options)


def random_case(rng, cell=None, *, T=None, N=None, I=None, H=None, descriptor=None,
                optional=None, dtype=np.float64, scale=0.5, cell_gradient_form=None,
                max_size=8) -> Case:
    """A complete random problem.

    Every size, descriptor option and optional input not given is drawn. ``optional`` maps an
    optional input name (input_weight, bias, init_state, init_cell, mask, mask_per_step,
    peephole, secondary_bias, state_gradient, cell_gradient) to True/False to force it.
    Recurrent weights are scaled by ``scale/√H`` so the recurrence is contractive.
    ``cell_gradient_form`` is "per_step" or "final".
    """
    rng = np.random.default_rng(rng)
    cell = cell or CELLS[rng.integers(3)]
    descriptor = descriptor or random_descriptor(rng, cell)
    T = int(rng.integers(1, max_size + 1)) if T is None else T
    N = int(rng.integers(1, max_size + 1)) if N is None else N
    I = int(rng.integers(1, max_size + 1)) if I is None else I
    H = int(rng.integers(1, max_size + 1)) if H is None else H
    G, D = descriptor.gates, 2 if descriptor.bidirectional else 1
    want = dict(optional or {})

    def has(name):
        if name not in want:
            want[name] = bool(rng.integers(2))
        return want[name]

    normal = lambda *shape: rng.standard_normal(shape)  # noqa: E731
    inputs = {}
    if has("input_weight"):
        inputs["source"] = normal(T, N, I)
        inputs["input_weight"] = normal(D * G * H, I) * (scale / np.sqrt(I))
    else:
        inputs["source"] = normal(T, N, D * G * H)
    R = normal(D, G * H, H) * (scale / np.sqrt(H))
    inputs["recurrent_weight"] = R if D == 2 else R[0]
    if has("bias"):
        inputs["bias"] = normal(D * G * H) * 0.5
    if has("init_state"):
        inputs["init_state"] = normal(N, D * H) * 0.5
    if cell == "lstm" and has("init_cell"):
        inputs["init_cell"] = normal(N, D * H) * 0.5
    if has("mask"):
        if has("mask_per_step"):
            inputs["mask"] = rng.uniform(0.0, 1.5, (T, N, D * H)) * (rng.random((T, N, D * H)) > 0.2)
        else:
            inputs["mask"] = rng.uniform(0.0, 1.5, (N, D * H)) * (rng.random((N, D * H)) > 0.2)
    if cell == "lstm" and has("peephole"):
        p = normal(D, 4 * H) * 0.3
        inputs["peephole"] = p if D == 2 else p[0]
    if cell == "gru" and has("secondary_bias"):
        inputs["secondary_bias"] = normal(D * H) * 0.5
    case = Case(cell, descriptor, inputs, source_gradient=normal(T, N, D * H))
    if has("state_gradient"):
        case.state_gradient = normal(N, D * H)
    if cell == "lstm" and has("cell_gradient"):
        form = cell_gradient_form or ("per_step" if rng.integers(2) else "final")
        case.cell_gradient = normal(T, N, D * H) if form == "per_step" else normal(N, D * H)
    return case.astype(dtype)


# -- reproduction -------------------------------------------------------------------------------

def _repr_array(a):
    if a is None:
        return "None"
    a = np.asarray(a)
    if a.size == 0:
        return f"np.empty({a.shape}, dtype=np.{a.dtype})"
    body = np.array2string(a, separator=", ", threshold=np.inf, floatmode="unique", max_line_width=100)
    return f"np.array({body}, dtype=np.{a.dtype})".replace("nan", "np.nan").replace("inf", "np.inf")


def _repr_descriptor(desc):
    fields = []
    defaults = type(desc)()
    for f in dataclasses.fields(desc):
        value = getattr(desc, f.name)
        if value != getattr(defaults, f.name):
            fields.append(f"{f.name}=" + (f"rg.Activation.{value.name}" if isinstance(value, Activation) else repr(value)))
    return f"rg.{type(desc).__name__}({', '.join(fields)})"


def _repr_case(case):
    lines = ["Case(", f"    cell={case.cell!r},", f"    descriptor={_repr_descriptor(case.descriptor)},",
             "    inputs={"]
    for k, v in case.inputs.items():
        lines.append(f"        {k!r}: {_repr_array(v)},")
    lines.append("    },")
    for name in ("source_gradient", "state_gradient", "cell_gradient"):
        lines.append(f"    {name}={_repr_array(getattr(case, name))},")
    lines.append(")")
    return "\n".join(lines)


__all__ = ["Case", "random_case", "random_descriptor", "CELLS", "PARAMETERS",
           "SingleGateRNNDescriptor", "GRUDescriptor", "LSTMDescriptor"]
