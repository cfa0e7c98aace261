"""Result objects: MPSGraph-ordered sequences whose entries are also named attributes.

``len()``, indexing, iteration and unpacking behave like the array MPSGraph returns (only the
entries that MPSGraph returns are in the sequence); the attributes name every entry the op can
return, ``None`` where absent.
"""

from __future__ import annotations


class _Result(tuple):
    _names: tuple = ()

    def __new__(cls, entries):
        """``entries``: [(name, array)] in MPSGraph's order, only those present."""
        self = super().__new__(cls, [a for _, a in entries])
        self._present = tuple(n for n, _ in entries)
        return self

    def __getattr__(self, name):
        if name in type(self)._names:
            present = self._present
            return self[present.index(name)] if name in present else None
        raise AttributeError(f"{type(self).__name__} has no entry {name!r}; entries: {type(self)._names}")

    @property
    def names(self) -> tuple:
        """The names of the entries in the sequence, in order."""
        return self._present

    def as_dict(self) -> dict:
        return dict(zip(self._present, self))

    def __repr__(self):
        inner = ", ".join(f"{n}: {a.dtype}{list(a.shape)}" for n, a in zip(self._present, self))
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        return (type(self), (list(zip(self._present, self)),))


class ForwardResult(_Result):
    """[h], [h, z_state], [h, c] or [h, c, z_state], as MPSGraph orders them."""

    _names = ("state", "cell", "z_state")


class GradientResult(_Result):
    """source, recurrent_weight, input_weight, bias, peephole, init_state, init_cell,
    secondary_bias: as MPSGraph orders them for the op, only those whose input was given."""

    _names = ("source", "recurrent_weight", "input_weight", "bias", "peephole",
              "init_state", "init_cell", "secondary_bias")
