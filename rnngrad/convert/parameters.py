"""torch.nn's recurrent parameters ⇄ an rnngrad op's parameter arguments, in any array library.

A ``torch.nn.RNN`` / ``GRU`` / ``LSTM`` layer (and ``rnngrad.torch``'s layers, which add a
peephole) holds per direction ``d`` (suffix ``_reverse`` for d = 1) the parameters
``weight_ih`` [G·H,I], ``weight_hh`` [G·H,H], optionally ``bias_ih`` and ``bias_hh`` [G·H], and
(rnngrad's LSTM) ``peephole`` [4H]. One layer is one rnngrad op (SEMANTICS.md §2) with:

- ``input_weight`` [D·G·H,I] = the directions' ``weight_ih`` concatenated;
- ``recurrent_weight`` = ``weight_hh`` [G·H,H], or the directions' stacked [2,G·H,H];
- ``bias`` [D·G·H] = ``bias_ih + bias_hh``, except with a *secondary bias* (PyTorch's GRU:
  ``reset_after``, ``b_hn`` inside the reset product): there the candidate block is ``bias_ih``'s
  alone and ``bias_hh``'s candidate block is ``secondary_bias`` [D·H];
- ``peephole`` = ``peephole`` [4H], or the directions' stacked [2,4H].

Gradients go back the same way: ``bias_ih`` and ``bias_hh`` both receive the bias gradient, except
the secondary bias's block of ``bias_hh``, which receives the secondary bias's gradient; each
direction its rows of the weights' gradients.

Parameters are found by name (:func:`direction_kinds`), never by position. ``xp`` is the array
module of the arrays (``numpy``, ``cupy``, ``torch``, ``mlx.core``): only slicing, ``+``,
``concatenate`` and ``stack`` are used, so ``torch`` tensors stay differentiable.
"""

from __future__ import annotations

import re

import numpy as np

#: the kinds of parameter of one direction, in PyTorch's order of registration
KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "peephole")
#: the op argument whose gradient each kind of parameter takes its own from
ARGUMENT = {"weight_ih": "input_weight", "weight_hh": "recurrent_weight", "bias_ih": "bias",
            "bias_hh": "bias", "peephole": "peephole"}
_NAME = re.compile(r"^(weight_ih|weight_hh|bias_ih|bias_hh|peephole)_l(\d+)(_reverse)?$")


def names(layer: int, D: int, *, bias: bool, peephole: bool = False) -> list:
    """The parameter names of layer ``layer``, in PyTorch's order of registration: each
    direction's weight_ih, weight_hh, [bias_ih, bias_hh], [peephole] in turn."""
    kinds = [k for k in KINDS
             if (bias or not k.startswith("bias")) and (peephole or k != "peephole")]
    return [f"{kind}_l{layer}{'_reverse' if d else ''}" for d in range(D) for kind in kinds]


def direction_kinds(name: str) -> tuple:
    """(direction, kind) of a parameter name such as ``"bias_hh_l1_reverse"`` → (1, "bias_hh");
    a ``ValueError`` for a name that is not one of torch.nn's recurrent parameters."""
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"parameter: expected a name like weight_ih_l0 or bias_hh_l1_reverse "
                         f"(kinds {', '.join(KINDS)}), got {name!r}")
    return (1 if match.group(3) else 0), match.group(1)


def sides(values, kinds, D: int) -> list:
    """``[{kind: array}]`` per direction from one layer's parameter ``values`` and the
    ``(direction, kind)`` of each (:func:`direction_kinds` of its name)."""
    out = [{} for _ in range(D)]
    for (d, kind), value in zip(kinds, values):
        out[d][kind] = value
    return out


def op_arguments(sides: list, *, H: int, secondary: bool, xp=np) -> dict:
    """The op's parameter arguments (input_weight, recurrent_weight, and bias, secondary_bias,
    peephole where given) from each direction's ``{kind: array}``; ``secondary``: the GRU's
    ``bias_hh`` candidate block is the secondary bias (module docstring). With one direction
    the parameters themselves, no copy."""
    first = sides[0]
    if len(sides) == 1:  # the parameters themselves: [GH,I], [GH,H]
        out = {"input_weight": first["weight_ih"], "recurrent_weight": first["weight_hh"]}
        if "bias_ih" in first:
            b_ih, b_hh = first["bias_ih"], first["bias_hh"]
            if secondary:  # r, z summed; candidate: b_in here, b_hn the secondary bias
                out["bias"] = xp.concatenate([b_ih[:2 * H] + b_hh[:2 * H], b_ih[2 * H:]])  # [3H]
                out["secondary_bias"] = b_hh[2 * H:]  # [H]
            else:
                out["bias"] = b_ih + b_hh  # [GH]
        if "peephole" in first:
            out["peephole"] = first["peephole"]  # [4H]
        return out
    sides = [op_arguments([side], H=H, secondary=secondary, xp=xp) for side in sides]
    out = {"input_weight": xp.concatenate([s["input_weight"] for s in sides]),  # [2GH,I]
           "recurrent_weight": xp.stack([s["recurrent_weight"] for s in sides])}  # [2,GH,H]
    for name in ("bias", "secondary_bias"):
        if name in sides[0]:
            out[name] = xp.concatenate([s[name] for s in sides])  # [2GH], [2H]
    if "peephole" in sides[0]:
        out["peephole"] = xp.stack([s["peephole"] for s in sides])  # [2,4H]
    return out


def parameter_gradients(grads: dict, *, D: int, H: int, secondary: bool, xp=np) -> list:
    """Each direction's ``{kind: gradient}`` from the op's gradients ``grads`` (by argument
    name, None or missing where not computed: input_weight [D·G·H,I], recurrent_weight
    [D,G·H,H] or [G·H,H], bias [D·G·H] (any shape of that size), secondary_bias [D·H], peephole
    [D,4H] or [4H]). Entries may be views of ``grads``' arrays, and ``bias_ih`` and ``bias_hh``
    may be one array: copy where two must not share memory. With a secondary bias, ``bias_hh``
    is there only when both gradients are."""
    weight, recurrent = grads.get("input_weight"), grads.get("recurrent_weight")
    bias, b2, peephole = grads.get("bias"), grads.get("secondary_bias"), grads.get("peephole")
    if recurrent is not None and recurrent.ndim == 2:
        recurrent = recurrent[None]  # [1,GH,H]
    if bias is not None:
        bias = bias.reshape(-1)  # [DGH]
    if b2 is not None:
        b2 = b2.reshape(-1)  # [DH]
    if peephole is not None:
        peephole = peephole.reshape(D, -1)  # [D,4H]
    GH = (recurrent.shape[-2] if recurrent is not None else
          weight.shape[0] // D if weight is not None else
          bias.shape[0] // D if bias is not None else 0)
    out = []
    for d in range(D):
        side = {}
        if weight is not None:
            side["weight_ih"] = weight if D == 1 else weight[d * GH:(d + 1) * GH]  # [GH,I]
        if recurrent is not None:
            side["weight_hh"] = recurrent[d]  # [GH,H]
        if bias is not None:
            db = bias if D == 1 else bias[d * GH:(d + 1) * GH]  # [GH]
            side["bias_ih"] = db
            if not secondary:
                side["bias_hh"] = db
            elif b2 is not None:  # r, z from the bias; the candidate's own
                side["bias_hh"] = xp.concatenate([db[:2 * H], b2[d * H:(d + 1) * H]])
        if peephole is not None:
            side["peephole"] = peephole[d]  # [4H]
        out.append(side)
    return out
