"""rnngrad's op on one device's arrays: the one forward and the one backward that the custom
operators (:mod:`rnngrad.torch.ops`) and the layers' one-node route (:mod:`rnngrad.torch._layer`)
both run.

- :func:`forward`: the op (its inputs checked once per signature) and each direction's final
  state (and cell), arrays of their own;
- :func:`backward`: the gradient op's arguments made from the gradients of the outputs, the op
  run once, and the gradients wanted. Inputs whose values the gradient op does not
  read (bias, secondary bias: z_state holds the pre-activations) are handed to it only for
  their gradients. When the source needs no gradient (a model's first layer) the op runs
  without the input weight, which skips d_source = dA·W (a sixth of a step's FLOPs at I = H),
  and the weight's gradient is dAᵀ·source by PyTorch.

The arrays are the backend's (:class:`rnngrad.torch._device.Arrays`: NumPy, CuPy, or tensors
for ``metal-mps``); the descriptor is rnngrad's, the backend a name or None.
"""

from __future__ import annotations

from rnngrad import states
from rnngrad.api import run_checked
from rnngrad.torch import _device

#: inputs whose values the gradient op does not read: handed to it only for their gradients
ONLY_FOR_GRADIENT = ("bias", "secondary_bias")


def forward(cell: str, given: dict, descriptor, backend, xp):
    """``(result, h_n, c_n)``: the backend's ForwardArrays of the op on ``given`` ({argument:
    array}), and each direction's final state and cell ``[N,D·H]`` (``c_n`` None but for the
    LSTM). ``descriptor`` says which outputs to keep (``training``, ``produce_cell``)."""
    result = run_checked(cell, False, descriptor, backend, given)
    D = 2 if descriptor.bidirectional else 1
    h_n = states.final(result.h, D, given.get("init_state"), xp)
    c_n = None
    if cell == "lstm" and result.c is not None:
        c_n = states.final(result.c, D, given.get("init_cell"), xp)
    return result, h_n, c_n


def _copy(a):
    return a.clone() if hasattr(a, "clone") else a.copy()


def cell_gradient(gc, gcn, D: int, T: int):
    """The op's cell_gradient from the gradients of the per-step cell ``gc`` [T,N,D·H] and of
    the final cell ``gcn`` [N,D·H] (either may be None): per step, with the final cell's added
    at each direction's last processing step; or the final-cell form alone."""
    if gc is None or T == 0:
        return gcn
    if gcn is None:
        return gc
    return states.add_to_final(_copy(gc), gcn, D)  # [T,N,DH]


def backward(cell: str, descriptor, backend, given: dict, result, grads: tuple, wanted,
             arrays: "_device.Arrays", source=None) -> dict:
    """{argument: gradient} for each op argument in ``wanted`` that ``given`` has: the
    backend's arrays, in its shapes (bias [1,1,D·G·H]) and compute dtype.

    given: the forward's arguments ({name: array}); bias and secondary_bias need only be there
        when their gradients are wanted.
    result: the forward's ForwardArrays (h, c, z_state).
    grads: ``(gh, ghn, gc, gcn)``, the gradients of h [T,N,D·H], of the final state [N,D·H],
        of the per-step cell [T,N,D·H] and of the final cell [N,D·H], as arrays (None: zero).
    source: the source as a tensor, for the input weight's gradient when the source's is not
        wanted (the op then skips d_source = dA·W, and PyTorch computes dAᵀ·source).
    When T = 0 each gradient is a copy (the op may return a state gradient given to it).
    """
    gh, ghn, gc, gcn = grads
    xp, h, T = arrays.xp, result.h, result.h.shape[0]
    op = dict(given)
    for name in ONLY_FOR_GRADIENT:
        if name in op and name not in wanted:
            del op[name]
    op["z_state"] = result.z_state
    op["source_gradient"] = states.zeros(h.shape, h, xp) if gh is None else gh  # [T,N,DH]
    if ghn is not None:
        op["state_gradient"] = ghn  # [N,DH]
    if cell == "gru":
        op["output_fwd"] = h
    elif cell == "lstm":
        op["cell_output_fwd"] = result.c
        cg = cell_gradient(gc, gcn, 2 if descriptor.bidirectional else 1, T)
        if cg is not None:
            op["cell_gradient"] = cg
    weight = given.get("input_weight")  # [DGH,I]
    skip_source = weight is not None and "source" not in wanted
    if skip_source:
        # without the input weight the op does not read the source, only its shape
        del op["input_weight"]
        op["source"] = states.zeros((T, h.shape[1], weight.shape[0]), h, xp)  # [T,N,DGH]
    out = run_checked(cell, True, descriptor, backend, op)
    grads_out = {}
    for name in wanted:
        if name in given and not (skip_source and name in ("source", "input_weight")):
            value = getattr(out, name)
            if value is not None:
                grads_out[name] = value if T > 0 else _copy(value)
    if skip_source and "input_weight" in wanted:
        dA = arrays.tensor(out.source)  # [T,N,DGH], the gradient of the projected input
        grads_out["input_weight"] = arrays.view(_device.transposed_product(
            dA.reshape(-1, weight.shape[0]), source.detach().reshape(-1, weight.shape[1])
            .to(dA.dtype)))  # [DGH,I]
    return grads_out
