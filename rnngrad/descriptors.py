"""MPSGraph's RNN descriptors and activation enum, with MPSGraph's defaults.

Descriptors are immutable. Every field is checked when the descriptor is made: the boolean
options must be bools, and each activation field accepts an :class:`Activation`, its name as a
string (``"sigmoid"``, ``"hard_sigmoid"``, also MPSGraph's ``"hardSigmoid"``) or its integer
(0..4); anything else is a ``ValueError`` naming the field and the accepted values.
"""

from __future__ import annotations

import dataclasses
import enum
import numbers

import numpy as np

__all__ = ["Activation", "SingleGateRNNDescriptor", "GRUDescriptor", "LSTMDescriptor"]


class Activation(enum.IntEnum):
    """MPSGraphRNNActivation, with MPSGraph's integer values."""

    NONE = 0
    RELU = 1
    TANH = 2
    SIGMOID = 3
    HARD_SIGMOID = 4

    @classmethod
    def coerce(cls, value, field: str) -> "Activation":
        """The Activation that ``value`` names, or a ValueError naming ``field``."""
        accepted = (
            f"an rnngrad.Activation, one of the names {[a.name.lower() for a in cls]} "
            f"or the integers 0..{len(cls) - 1}"
        )
        if isinstance(value, cls):
            return value
        if isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{field}: expected {accepted}, got the bool {value!r}")
        if isinstance(value, numbers.Integral):
            if 0 <= int(value) < len(cls):
                return cls(int(value))
        elif isinstance(value, str):
            key = value.strip().replace("-", "_")
            if key == "hardSigmoid":
                key = "hard_sigmoid"
            key = key.upper()
            if key in cls.__members__:
                return cls[key]
        raise ValueError(f"{field}: expected {accepted}, got {value!r}")


def _check_bools(descriptor, names):
    for name in names:
        value = getattr(descriptor, name)
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(
                f"{type(descriptor).__name__}.{name}: expected a bool, "
                f"got {value!r} ({type(value).__name__})"
            )
        object.__setattr__(descriptor, name, bool(value))


def _check_activations(descriptor, names):
    for name in names:
        value = Activation.coerce(getattr(descriptor, name), f"{type(descriptor).__name__}.{name}")
        object.__setattr__(descriptor, name, value)


_COMMON = ("reverse", "bidirectional", "training")


@dataclasses.dataclass(frozen=True)
class SingleGateRNNDescriptor:
    """MPSGraphSingleGateRNNDescriptor: ``h[t] = activation(x'[t] + (h[t-1] m) Rᵀ)``."""

    reverse: bool = False
    bidirectional: bool = False
    training: bool = False
    activation: Activation = Activation.RELU

    cell = "single_gate"
    gates = 1

    def __post_init__(self):
        _check_bools(self, _COMMON)
        _check_activations(self, ("activation",))


@dataclasses.dataclass(frozen=True)
class LSTMDescriptor:
    """MPSGraphLSTMDescriptor. Gate layout ``[i, f, z, o]``, or ``[i, z, f, o]`` with
    ``forget_gate_last`` (the forget gate is third, as MPSGraph does)."""

    reverse: bool = False
    bidirectional: bool = False
    training: bool = False
    produce_cell: bool = False
    forget_gate_last: bool = False
    input_gate_activation: Activation = Activation.SIGMOID
    forget_gate_activation: Activation = Activation.SIGMOID
    cell_gate_activation: Activation = Activation.TANH
    output_gate_activation: Activation = Activation.SIGMOID
    activation: Activation = Activation.TANH

    cell = "lstm"
    gates = 4

    def __post_init__(self):
        _check_bools(self, _COMMON + ("produce_cell", "forget_gate_last"))
        _check_activations(
            self,
            (
                "input_gate_activation",
                "forget_gate_activation",
                "cell_gate_activation",
                "output_gate_activation",
                "activation",
            ),
        )

    @property
    def gate_index(self) -> dict:
        """Block index of each gate in the packed layout."""
        if self.forget_gate_last:
            return {"i": 0, "z": 1, "f": 2, "o": 3}
        return {"i": 0, "f": 1, "z": 2, "o": 3}


@dataclasses.dataclass(frozen=True)
class GRUDescriptor:
    """MPSGraphGRUDescriptor. Gate layout ``[z, r, o]``, or ``[r, z, o]`` with
    ``reset_gate_first``; ``reset_after`` and ``flip_z`` as in SEMANTICS.md §2.2."""

    reverse: bool = False
    bidirectional: bool = False
    training: bool = False
    reset_gate_first: bool = False
    reset_after: bool = False
    flip_z: bool = False
    update_gate_activation: Activation = Activation.SIGMOID
    reset_gate_activation: Activation = Activation.SIGMOID
    output_gate_activation: Activation = Activation.TANH

    cell = "gru"
    gates = 3

    def __post_init__(self):
        _check_bools(self, _COMMON + ("reset_gate_first", "reset_after", "flip_z"))
        _check_activations(
            self, ("update_gate_activation", "reset_gate_activation", "output_gate_activation")
        )

    @property
    def gate_index(self) -> dict:
        """Block index of each gate in the packed layout (``q`` only in z_state)."""
        if self.reset_gate_first:
            return {"r": 0, "z": 1, "o": 2}
        return {"z": 0, "r": 1, "o": 2}


DESCRIPTORS = {
    "single_gate": SingleGateRNNDescriptor,
    "gru": GRUDescriptor,
    "lstm": LSTMDescriptor,
}


def z_width(descriptor) -> int:
    """Blocks of H in z_state per direction: G, or 4 for GRU with reset_after."""
    if isinstance(descriptor, GRUDescriptor) and descriptor.reset_after:
        return 4
    return descriptor.gates
