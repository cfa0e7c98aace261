"""The matrix products of an op's plan: C[batch, M, P] = strided A·B (+ bias), the version
:func:`rnngrad.backends.metal.versions.gemm` picks for the shape, and v5's split of K into slices
that a second product adds (see GemmParams in kernels/common.metal for the strides).
"""

from __future__ import annotations

import logging

from . import library, versions
from .plan import Constant

#: where the host logs each kernel version it chooses, with the reason (DEBUG)
_LOG = logging.getLogger(__package__)


def gemm(host, plan, A, B, C, *, batch, M, P, K, a_batch=0, a_row=0, a_k=0, b_batch=0,
         b_k=0, b_col=0, block=None, b_block=0, bias=None, product=""):
    """Add to ``plan`` the dispatch of C[batch,M,P] = strided A·B (+ bias) (slots; see
    GemmParams in common.metal). The kernel version is
    :func:`rnngrad.backends.metal.versions.gemm`'s choice for the shape (``product`` names
    it in the reason, logged at DEBUG level when the plan is made)."""
    if batch * M * P == 0:
        return
    block = block or max(M, 1)
    choice = versions.gemm(batch=batch, M=M, P=P, K=K, product=product,
                           has_bias=bias is not None, block=block, b_block=b_block)
    slices, k_split = 1, 0
    if choice.version == "v5":
        slices, k_split = versions.wide_slices(batch=batch, M=M, P=P, K=K, block=block,
                                               b_block=b_block, has_bias=bias is not None)
    count = versions.gemm_threads(choice, batch=batch, M=M, P=P, block=block, b_block=b_block,
                                  slices=slices)
    _LOG.debug("%s: %s%s", host.name, choice,
               f"; {slices} slices of {k_split} k, added by a second product" if slices > 1 else "")
    values = dict(count=count, batch=batch, M=M, P=P, K=K, a_batch=a_batch, a_row=a_row,
                  a_k=a_k, b_batch=b_batch, b_k=b_k, b_col=b_col,
                  block=block, b_block=b_block, has_bias=int(bias is not None),
                  k_split=k_split)
    params = plan.keep(host.params(library.GEMM_PARAMS,
                                   tuple(int(values[k]) for k in library.GEMM_PARAMS.names)))
    parts = plan.empty(slices * batch * M * P) if slices > 1 else C
    plan.launch(choice.kernel, count, steps=K, p=params, A=A, B=B,
                bias=bias if bias is not None else plan.keep(host.buffer(Constant(1))),
                C=parts)
    if slices > 1:  # C = the slices' sum, in slice order: 1ᵀ · parts[slices, batch·M·P]
        gemm(host, plan, plan.keep(host.buffer(Constant(1, 1.0))), parts, C, batch=1, M=1,
             P=batch * M * P, K=slices, b_k=batch * M * P, b_col=1,
             product=f"the sum of {product or 'a product'}'s {slices} slices of K")


def copies_weight(M, P, K, has_bias) -> bool:
    """Whether the input projection x' = source·Wᵀ [M,P] over K reads a transposed copy of
    W [P,K] (made on the device every call) rather than W in place (Wᵀ with b_k = 1): only
    for an untiled version (v1, v4: consecutive threads read consecutive columns of B) over
    at least ``Rules.tiled_min_work`` multiply-adds. The tiled versions stage B along
    whichever index is unit stride, and below that work the copy costs more host time than
    its coalesced reads save on the device."""
    if M * P * K < versions.rules().tiled_min_work:
        return False
    return versions.gemm(batch=1, M=M, P=P, K=K, has_bias=has_bias).version in ("v1", "v4")
