"""Hypothesis draws of complete problems for the tests (every option and optional input)."""

import dataclasses
import os

import numpy as np
from hypothesis import strategies as st

from hypothesis import assume

from rnngrad import Activation
from rnngrad.testing import input_sensitivity
from rnngrad.testing.cases import random_case, random_descriptor
from rnngrad.descriptors import GRUDescriptor, LSTMDescriptor, SingleGateRNNDescriptor

OPTIONAL = ("input_weight", "bias", "init_state", "init_cell", "mask", "mask_per_step", "peephole",
            "secondary_bias", "state_gradient", "cell_gradient")
#: random_case's ``optional`` with every optional input given (a final or per-step cell
#: gradient as the case asks)
ALL_OPTIONAL = dict(input_weight=True, bias=True, init_state=True, init_cell=True, mask=True,
                    peephole=True, secondary_bias=True, state_gradient=True, cell_gradient=True)
GATE = st.sampled_from([Activation.SIGMOID, Activation.HARD_SIGMOID])
ANY = st.sampled_from(list(Activation))


#: the most input_sensitivity a drawn case may have (well-conditioned cases sit near 1e-3)
SENSITIVITY_LIMIT = 0.1


def conditioned(case):
    """``case``, or a rejected draw (hypothesis.assume) where the float64 reference itself moves
    by more than SENSITIVITY_LIMIT of the tolerance when the inputs, or its tanh and sigmoid
    values, move by half a unit in the last place of the case's dtype
    (rnngrad.testing.input_sensitivity): a case that no implementation in that dtype can be
    expected to match within the tolerance. Random descriptors (rnngrad.testing.random_descriptor)
    make a few: a tanh update gate lets a GRU's 1 − z reach 2 (seed 569 of a float32 GRU: the
    reference moves by 1.1 of the tolerance forward, 21 through the gradients); a saturated tanh
    gate meets gradients near 10¹² (seed 1201150993 of a float64 GRU: 1 − tanh² takes the
    tanh's last bit to 10⁵ times the tolerance)."""
    assume(max(input_sensitivity(case, False), input_sensitivity(case, True)) < SENSITIVITY_LIMIT)
    return case


@st.composite
def descriptors(draw, cell):
    common = dict(reverse=draw(st.booleans()), bidirectional=draw(st.booleans()),
                  training=draw(st.booleans()))
    if cell == "single_gate":
        return SingleGateRNNDescriptor(**common, activation=draw(ANY))
    if cell == "gru":
        return GRUDescriptor(**common, reset_gate_first=draw(st.booleans()),
                             reset_after=draw(st.booleans()), flip_z=draw(st.booleans()),
                             update_gate_activation=draw(GATE), reset_gate_activation=draw(ANY),
                             output_gate_activation=draw(ANY))
    return LSTMDescriptor(**common, produce_cell=draw(st.booleans()),
                          forget_gate_last=draw(st.booleans()), input_gate_activation=draw(GATE),
                          forget_gate_activation=draw(GATE), cell_gate_activation=draw(ANY),
                          output_gate_activation=draw(GATE), activation=draw(ANY))


@st.composite
def cases(draw, cells=("single_gate", "gru", "lstm"), max_size=6, dtype=np.float64, options=None,
          **fixed):
    """A Case; ``options`` fixes descriptor fields, ``optional`` forces optional inputs, and
    T, N, I, H fix sizes."""
    cell = draw(st.sampled_from(cells))
    descriptor = draw(descriptors(cell))
    if options:
        descriptor = dataclasses.replace(descriptor, **options)
    optional = {name: draw(st.booleans()) for name in OPTIONAL}
    optional.update(fixed.pop("optional", {}))
    sizes = {k: draw(st.integers(1, max_size)) for k in "TNIH"}
    sizes.update({k: fixed.pop(k) for k in "TNIH" if k in fixed})
    return random_case(draw(st.integers(0, 2**32 - 1)), cell, descriptor=descriptor,
                       optional=optional, dtype=dtype,
                       cell_gradient_form=draw(st.sampled_from(["per_step", "final"])), **sizes, **fixed)


def recurrence_kernel(case, direction):
    """The recurrence entry point the Metal host runs for ``case`` and ``direction``
    ("forward", "backward") under the current ``$RNNGRAD_METAL_RECURRENCE``, at the threadgroup
    size it asks for."""
    from rnngrad.backends.metal import versions

    return versions.recurrence(
        cell=case.cell, direction=direction, D=case.D, N=case.inputs["source"].shape[1],
        H=case.H, device="metal-emulated", peephole="peephole" in case.inputs,
        reset_after=bool(getattr(case.descriptor, "reset_after", True))).kernel


def threadgroups_of(size: int) -> dict:
    """Harness settings for threadgroups of at most ``size`` threads where the recurrences run
    v1; none under v2, whose entry points run only in the threadgroup size the rule chose them
    for (another size is declined, and v1 runs)."""
    if os.environ.get("RNNGRAD_METAL_RECURRENCE") == "v2":
        return {}
    return dict(max_threads_per_threadgroup=size)


def option_variants(cell):
    """One descriptor's options per boolean option set on, and per value of every activation
    field, then bidirectional + reverse + training together."""
    base = type(random_descriptor(np.random.default_rng(0), cell))()
    out = []
    for f in dataclasses.fields(base):
        if isinstance(getattr(base, f.name), Activation):
            out += [{f.name: a} for a in Activation]
        else:
            out.append({f.name: True})
    out.append({"bidirectional": True, "reverse": True, "training": True})
    return out


def deferring_device(**options):
    """The CPU target completing ops as the CUDA target does: ``finish`` (nothing to wait for:
    calls here are synchronous) and zeroed arenas (the harness's new memory is zeroed), beside
    its own ``check_marks``; with ``RNNGRAD_LAUNCH_BLOCKING=0`` the host then does not wait for
    an op, and a failure is raised at a later call or ``rnngrad.synchronize()``."""
    from rnngrad.backends.metal.harness import cpu

    class DeferringDevice(cpu.Device):
        def zeros(self, nbytes):
            return self.buffer(int(nbytes))

        def finish(self, handles):
            del handles[:]

    return DeferringDevice(**options)
