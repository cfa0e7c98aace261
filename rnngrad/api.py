"""The public functions: check the inputs, pick a backend, run it, order the results.

Signatures and names follow MPSGraph's (SEMANTICS.md §6). Every function accepts array-likes
and returns NumPy arrays of the inputs' dtype.
"""

from __future__ import annotations

import sys

from . import registry
from .results import ForwardResult, GradientResult
from .validation import checked_problem

#: each cell's forward op; its gradient op is the same name + "_gradients"
FORWARD_OPS = {"single_gate": "single_gate_rnn", "gru": "gru", "lstm": "lstm"}
#: each cell's array arguments, in the order of its forward function
FORWARD_INPUTS = {
    "single_gate": ("source", "recurrent_weight", "input_weight", "bias", "init_state", "mask"),
    "gru": ("source", "recurrent_weight", "input_weight", "bias", "init_state", "mask",
            "secondary_bias"),
    "lstm": ("source", "recurrent_weight", "input_weight", "bias", "init_state", "init_cell",
             "mask", "peephole"),
}
#: op name -> (cell, gradients)
OPS = {
    "single_gate_rnn": ("single_gate", False),
    "single_gate_rnn_gradients": ("single_gate", True),
    "gru": ("gru", False),
    "gru_gradients": ("gru", True),
    "lstm": ("lstm", False),
    "lstm_gradients": ("lstm", True),
}


def op_info(op: str) -> tuple:
    """(cell, gradients) of an op name such as ``"lstm_gradients"``."""
    if op not in OPS:
        raise ValueError(f"op: expected one of {tuple(OPS)}, got {op!r}")
    return OPS[op]


def op_name(cell: str, gradients: bool) -> str:
    """The rnngrad function name of a cell's forward or gradient op."""
    return FORWARD_OPS[cell] + ("_gradients" if gradients else "")


# MPSGraph's gradient orders (SEMANTICS.md §3.2); MPSGraph's forward order is h, c, z_state.
_GRADIENT_ORDER = {
    "single_gate": ("source", "recurrent_weight", "input_weight", "bias", "init_state"),
    "gru": ("source", "recurrent_weight", "input_weight", "bias", "init_state", "secondary_bias"),
    "lstm": ("source", "recurrent_weight", "input_weight", "bias", "peephole", "init_state", "init_cell"),
}


def forward_result(problem, out) -> ForwardResult:
    """A backend's ForwardArrays as MPSGraph returns them: [h], then c, then z_state."""
    desc = problem.descriptor
    entries = [("state", out.h)]
    if problem.cell == "lstm" and (desc.training or desc.produce_cell):
        entries.append(("cell", out.c))
    if desc.training:
        entries.append(("z_state", out.z_state))
    return ForwardResult(entries)


def gradient_entries(problem, original, out) -> list:
    """A backend's GradientArrays as MPSGraph orders them, [(name, array)], each present only
    when its input was given, in the shape the caller gave it."""
    entries = []
    for name in _GRADIENT_ORDER[problem.cell]:
        if name in ("source", "recurrent_weight") or getattr(problem, name) is not None:
            value = getattr(out, name)
            if name in original:  # back to the caller's shape, e.g. [G·H,H] for recurrent_weight
                value = value.reshape(original[name])
            entries.append((name, value))
    return entries


def run_forward(cell, descriptor, backend, **given) -> ForwardResult:
    problem, _ = checked_problem(cell, descriptor, given, False)
    _, implementation = registry.resolve(backend, cell, "forward", problem.dtype, problem.on_gpu,
                                         problem)
    return forward_result(problem, implementation(problem))


def run_gradients(cell, descriptor, backend, **given) -> GradientResult:
    problem, original = checked_problem(cell, descriptor, given, True)
    _, implementation = registry.resolve(backend, cell, "gradients", problem.dtype, problem.on_gpu,
                                         problem)
    return GradientResult(gradient_entries(problem, original, implementation(problem)))


def run_checked(cell, gradients: bool, descriptor, backend, given: dict):
    """The backend's own result of one op on ``given`` ({argument: array}, no None): its
    ForwardArrays or GradientArrays, in the normalised shapes of ``rnngrad.problem`` and not
    reordered, for callers that read them by name (``rnngrad.torch``). The inputs are checked
    as the public functions check them, once per signature for C-contiguous NumPy arrays
    (``rnngrad.validation.checked_problem``)."""
    problem, _ = checked_problem(cell, descriptor, given, gradients)
    _, implementation = registry.resolve(backend, cell, "gradients" if gradients else "forward",
                                         problem.dtype, problem.on_gpu, problem)
    return implementation(problem)


def synchronize() -> None:
    """Wait for every GPU rnngrad has run ops on, and raise
    ``rnngrad.backends.metal.IncompleteDispatch`` for any op that did not finish there.

    On a GPU an op returns once its work is queued, and its completion is checked on the GPU
    after it; a failure is raised at the next rnngrad call on that device, here, or at exit
    (``RNNGRAD_LAUNCH_BLOCKING=1`` checks each op before it returns). Nothing to do where no
    GPU backend has run."""
    metal = sys.modules.get("rnngrad.backends.metal.backends")
    if metal is not None:
        metal.synchronize()


def single_gate_rnn(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
                    mask=None, *, descriptor=None, backend=None) -> ForwardResult:
    """MPSGraph ``singleGateRNN``: ``h[t] = f(x'[t] + (h[t−1] ⊙ m) Rᵀ)``.

    Shapes: source [T,N,I] ([T,N,D·H] without input_weight); recurrent_weight [H,H]
    ([2,H,H] bidirectional); input_weight [D·H,I]; bias [D·H]; init_state [N,D·H]; mask
    broadcastable to [N,D·H], or [T,N,D·H] per processing step.
    Returns ``[h]``, or ``[h, z_state]`` with ``descriptor.training``; also ``.state``,
    ``.z_state``.
    """
    return run_forward("single_gate", descriptor, backend, source=source,
                       recurrent_weight=recurrent_weight, input_weight=input_weight, bias=bias,
                       init_state=init_state, mask=mask)


def single_gate_rnn_gradients(source, recurrent_weight, source_gradient, z_state, *,
                              state_gradient=None, input_weight=None, bias=None, init_state=None,
                              mask=None, descriptor=None, backend=None) -> GradientResult:
    """MPSGraph ``singleGateRNNGradients``.

    source_gradient [T,N,D·H] (dL/dh, in the forward h's time order); z_state from the forward
    with ``training=True``; state_gradient [N,D·H] (dL/d final state). Returns, in order, the
    gradients of source, recurrent_weight, input_weight, bias, init_state (each only when its
    input was given; bias's is [1,1,D·H]).
    """
    return run_gradients("single_gate", descriptor, backend, source=source,
                         recurrent_weight=recurrent_weight, source_gradient=source_gradient,
                         z_state=z_state, state_gradient=state_gradient,
                         input_weight=input_weight, bias=bias, init_state=init_state, mask=mask)


def gru(source, recurrent_weight, input_weight=None, bias=None, init_state=None, mask=None,
        secondary_bias=None, *, descriptor=None, backend=None) -> ForwardResult:
    """MPSGraph ``GRU``.

    Shapes: source [T,N,I] ([T,N,D·3H] without input_weight); recurrent_weight [3H,H]
    ([2,3H,H] bidirectional); input_weight [D·3H,I]; bias [D·3H]; init_state [N,D·H]; mask as
    for single_gate_rnn; secondary_bias [D·H] (used with reset_after). Returns ``[h]`` or
    ``[h, z_state]``; z_state is [T,N,D·3H], or [T,N,D·4H] with reset_after.
    """
    return run_forward("gru", descriptor, backend, source=source,
                       recurrent_weight=recurrent_weight, input_weight=input_weight, bias=bias,
                       init_state=init_state, mask=mask, secondary_bias=secondary_bias)


def gru_gradients(source, recurrent_weight, source_gradient, z_state, output_fwd, *,
                  state_gradient=None, input_weight=None, bias=None, init_state=None, mask=None,
                  secondary_bias=None, descriptor=None, backend=None) -> GradientResult:
    """MPSGraph ``GRUGradients``. output_fwd is the forward h [T,N,D·H].

    Returns, in order, the gradients of source, recurrent_weight, input_weight, bias,
    init_state, secondary_bias (each only when its input was given).
    """
    return run_gradients("gru", descriptor, backend, source=source,
                         recurrent_weight=recurrent_weight, source_gradient=source_gradient,
                         z_state=z_state, output_fwd=output_fwd, state_gradient=state_gradient,
                         input_weight=input_weight, bias=bias, init_state=init_state, mask=mask,
                         secondary_bias=secondary_bias)


def lstm(source, recurrent_weight, input_weight=None, bias=None, init_state=None,
         init_cell=None, mask=None, peephole=None, *, descriptor=None, backend=None) -> ForwardResult:
    """MPSGraph ``LSTM``.

    Shapes: source [T,N,I] ([T,N,D·4H] without input_weight); recurrent_weight [4H,H]
    ([2,4H,H] bidirectional); input_weight [D·4H,I]; bias [D·4H]; init_state, init_cell
    [N,D·H]; mask as for single_gate_rnn; peephole [4H] ([2,4H] bidirectional).
    Returns ``[h]``, ``[h, c]`` (produce_cell) or ``[h, c, z_state]`` (training).
    """
    return run_forward("lstm", descriptor, backend, source=source,
                       recurrent_weight=recurrent_weight, input_weight=input_weight, bias=bias,
                       init_state=init_state, init_cell=init_cell, mask=mask, peephole=peephole)


def lstm_gradients(source, recurrent_weight, source_gradient, z_state, cell_output_fwd, *,
                   state_gradient=None, cell_gradient=None, input_weight=None, bias=None,
                   init_state=None, init_cell=None, mask=None, peephole=None, descriptor=None,
                   backend=None) -> GradientResult:
    """MPSGraph ``LSTMGradients``. cell_output_fwd is the forward c [T,N,D·H].

    cell_gradient: [T,N,D·H] per-step dL/dc, or [N,D·H] / [1,N,D·H] for the final cell only.
    Returns, in order, the gradients of source, recurrent_weight, input_weight, bias, peephole,
    init_state, init_cell (each only when its input was given).
    """
    return run_gradients("lstm", descriptor, backend, source=source,
                         recurrent_weight=recurrent_weight, source_gradient=source_gradient,
                         z_state=z_state, cell_output_fwd=cell_output_fwd,
                         state_gradient=state_gradient, cell_gradient=cell_gradient,
                         input_weight=input_weight, bias=bias, init_state=init_state,
                         init_cell=init_cell, mask=mask, peephole=peephole)
