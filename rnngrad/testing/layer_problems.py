"""The problems :func:`rnngrad.testing.check_module` checks a layer on: what a layer family can
do (:class:`Capabilities`), one configuration with its inputs (:class:`Problem`) and their
values, the fixed scenarios and the hypothesis strategy that draws the rest.

A :class:`Problem` is a configuration (``torch.nn``'s constructor keywords), the input form
(batched, unbatched, non-contiguous, variable lengths), the initial states (absent, zero,
random), the loss, the mode, the dtype, the kind of values and a seed for them. Parameters are
named either as ``torch.nn`` names them (``weight_ih_l0``, ``bias_hh_l1_reverse``: the PyTorch
path) or as rnngrad's op arguments with the same suffixes (``input_weight_l0``,
``recurrent_weight_l1_reverse``, ``bias_l0``, ``secondary_bias_l0``: the array path of
:mod:`rnngrad.testing.arrays`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

CELLS = ("rnn", "gru", "lstm")
FORMS = ("batched", "unbatched", "noncontiguous", "packed")
STATES = ("random", "none", "zero")
LOSSES = ("both", "output", "final")
MODES = ("eval", "train", "sequence")
VALUES = ("contractive", "saturating", "nonfinite")
_GATES = {"rnn": 1, "gru": 3, "lstm": 4}


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a layer family can do; :func:`check_module` draws nothing outside it, and a fixed
    scenario that needs what is missing is left out.

    num_layers: the most layers one layer object stacks (1: single-layer layers).
    bidirectional: both directions in one layer.
    dropout: dropout between stacked layers, with a generator that ``torch.manual_seed``
        reseeds (train mode is checked against central differences); False draws eval mode only.
    lengths: variable-length batches (``PackedSequence``; masks or sequence lengths for arrays).
    unbatched: 2-D input without a batch axis.
    noncontiguous: strided input tensors (PyTorch only).
    layouts: ``"time_major"`` ([T,N,I]) and/or ``"batch_first"`` ([N,T,I]).
    nonlinearities: those of an ``"rnn"`` layer (``"tanh"``, ``"relu"``).
    no_bias: layers without biases.
    initial_states: initial states given to the layer.
    shapes: None, or a few (T, N, I, H): the only sizes drawn (N is 1 for unbatched input), so
        that a framework that compiles a program per shape compiles a few.
    """

    num_layers: int = 3
    bidirectional: bool = True
    dropout: bool = True
    lengths: bool = True
    unbatched: bool = True
    noncontiguous: bool = True
    layouts: tuple = ("time_major", "batch_first")
    nonlinearities: tuple = ("tanh", "relu")
    no_bias: bool = True
    initial_states: bool = True
    shapes: Optional[tuple] = None

    def forms(self) -> tuple:
        wanted = {"batched": True, "unbatched": self.unbatched, "noncontiguous": self.noncontiguous,
                  "packed": self.lengths}
        return tuple(f for f in FORMS if wanted[f])

    def fit(self, problem: "Problem") -> Optional["Problem"]:
        """``problem`` within these capabilities (fewer layers, the supported layout), or None
        when what it exists to check is missing (its form, its direction count, its dropout,
        its initial states, its nonlinearity, its lack of bias)."""
        if problem.form not in self.forms() or (problem.bidirectional and not self.bidirectional):
            return None
        if problem.dropout and problem.num_layers > 1 and not self.dropout:
            return None
        if problem.states != "none" and not self.initial_states:
            return None
        if (problem.cell == "rnn" and problem.nonlinearity not in self.nonlinearities) or \
                (not problem.bias and not self.no_bias):
            return None
        layers = min(problem.num_layers, self.num_layers)
        batch_first = problem.batch_first
        if ("batch_first" if batch_first else "time_major") not in self.layouts:
            batch_first = not batch_first
        return dataclasses.replace(self._sized(problem), num_layers=layers, batch_first=batch_first,
                                   dropout=problem.dropout if layers > 1 else 0.0)

    def _sized(self, problem):
        """The problem in the smallest of ``shapes`` that holds it (more sequences get the
        longest length), or as it is when none does."""
        if not self.shapes:
            return problem
        fits = [s for s in self.shapes if all(a >= b for a, b in zip(s, (problem.T, problem.N,
                                                                          problem.I, problem.H)))]
        if not fits or (problem.form == "unbatched" and min(fits)[1] != 1):
            return problem
        T, N, I, H = min(fits, key=lambda s: s[0] * s[1] * s[2] * s[3])
        lengths = problem.lengths and tuple(problem.lengths) + (T,) * (N - problem.N)
        return dataclasses.replace(problem, T=T, N=N, I=I, H=H, lengths=lengths)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One layer configuration, its inputs and how it is checked. ``repr`` is Python that
    rebuilds it; the values come from ``seed`` (:func:`problem_values`)."""

    cell: str
    num_layers: int = 1
    bidirectional: bool = False
    batch_first: bool = False
    bias: bool = True
    nonlinearity: str = "tanh"
    dropout: float = 0.0
    T: int = 2
    N: int = 1
    I: int = 1
    H: int = 1
    form: str = "batched"
    lengths: Optional[tuple] = None
    states: str = "random"
    loss: str = "both"
    mode: str = "eval"
    dtype: str = "float32"
    seed: int = 0
    values: str = "contractive"

    @property
    def D(self) -> int:
        return 2 if self.bidirectional else 1

    def config(self) -> dict:
        """The factory's keywords (``torch.nn.RNN`` / ``GRU`` / ``LSTM``'s constructor)."""
        out = dict(input_size=self.I, hidden_size=self.H, num_layers=self.num_layers,
                   bias=self.bias, batch_first=self.batch_first, dropout=self.dropout,
                   bidirectional=self.bidirectional)
        if self.cell == "rnn":
            out["nonlinearity"] = self.nonlinearity
        return out

    def parameter_names(self, style="torch", secondary_bias=False) -> list:
        """The parameters' names in their order: ``torch.nn``'s, or (``style="rnngrad"``)
        rnngrad's op arguments with the same suffixes (``secondary_bias``: a GRU's b_hn)."""
        if style == "torch":
            stems = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])
        else:
            stems = ["input_weight", "recurrent_weight"] + (["bias"] if self.bias else [])
            stems += ["secondary_bias"] if self.bias and secondary_bias else []
        return [f"{stem}{sfx}" for k in range(self.num_layers)
                for sfx in (f"_l{k}", f"_l{k}_reverse")[:self.D] for stem in stems]

    def summary(self) -> str:
        c = self.config()
        keys = ", ".join(f"{k}={v!r}" for k, v in c.items())
        extra = f", lengths={list(self.lengths)}" if self.lengths else ""
        values = "" if self.values == "contractive" else f", {self.values} values"
        return (f"{self.cell} ({keys}); T={self.T} N={self.N}, {self.form} input{extra}, "
                f"initial states {self.states}, loss on {_LOSS_WORDS[self.loss]}, "
                f"{self.mode} mode, {self.dtype}{values}")


_LOSS_WORDS = {"both": "output and final states", "output": "output only",
               "final": "final states only"}


def layer_of(name) -> int:
    """The layer index in a parameter name (``weight_hh_l2_reverse`` → 2)."""
    return int(name.rsplit("_l", 1)[1].split("_")[0])


def problem_values(problem: Problem, names=None) -> dict:
    """The problem's arrays in float64, rounded to its dtype: ``params`` by name (``names``,
    default ``torch.nn``'s), ``x`` [T,N,I] time-major, ``h0`` / ``c0`` [L·D,N,H] or None,
    ``gy`` [T,N,D·H] or None, ``ghn`` / ``gcn`` [L·D,N,H] or None (None: not in the loss).

    Values ``"saturating"`` scale the input by 6 and the biases by 4 (gates at 0 or 1),
    ``"nonfinite"`` put one NaN, +Inf or −Inf in the input of one batch row."""
    rng = np.random.default_rng(problem.seed)
    D, G, H, L, N, T = problem.D, _GATES[problem.cell], problem.H, problem.num_layers, problem.N, problem.T
    round_ = lambda a: np.asarray(np.asarray(a, problem.dtype), np.float64)  # noqa: E731
    saturating = problem.values == "saturating"
    params = {}
    for name in names if names is not None else problem.parameter_names():
        k = layer_of(name)
        fan = problem.I if k == 0 else D * H
        if name.startswith(("weight_ih", "input_weight")):
            value = rng.standard_normal((G * H, fan)) * (0.5 / np.sqrt(fan))
        elif name.startswith(("weight_hh", "recurrent_weight")):
            value = rng.standard_normal((G * H, H)) * (0.5 / np.sqrt(H))
        elif name.startswith("secondary_bias"):
            value = rng.standard_normal(H) * 0.3
        else:
            value = rng.standard_normal(G * H) * (1.2 if saturating else 0.3)
        params[name] = round_(value)
    x = rng.standard_normal((T, N, problem.I)) * (6.0 if saturating else 1.0)
    if problem.values == "nonfinite":
        x[rng.integers(T), rng.integers(N), rng.integers(problem.I)] = rng.choice([np.nan, np.inf, -np.inf])
    out = {"params": params, "x": round_(x)}
    for name in ("h0", "c0"):
        if problem.states == "none" or (name == "c0" and problem.cell != "lstm"):
            out[name] = None
        else:
            out[name] = round_(rng.standard_normal((L * D, N, H)) * 0.5 if problem.states == "random"
                               else np.zeros((L * D, N, H)))
    out["gy"] = round_(rng.standard_normal((T, N, D * H))) if problem.loss != "final" else None
    for name in ("ghn", "gcn"):
        wanted = problem.loss != "output" and (name == "ghn" or problem.cell == "lstm")
        out[name] = round_(rng.standard_normal((L * D, N, H))) if wanted else None
    if problem.lengths:
        mask = np.arange(T)[:, None] < np.asarray(problem.lengths)[None, :]  # [T,N]
        out["x"] = np.where(mask[..., None], out["x"], 0.0)
        if out["gy"] is not None:
            out["gy"] = out["gy"] * mask[..., None]
    return out


# -- the fixed scenarios ----------------------------------------------------------------------

def scenarios(cell, dtype="float32", capabilities=None) -> list:
    """[(name, Problem)]: one problem per fault class framework layers have shipped, and one
    whose input holds more than 2¹⁶ elements (33·16·128), bidirectional, two layers; fitted to
    ``capabilities`` (those it cannot take are left out)."""
    P = lambda **kw: Problem(cell=cell, dtype=dtype, **kw)  # noqa: E731
    out = [
        ("batch_first_backward", P(batch_first=True, num_layers=2, T=3, N=2, I=3, H=3, seed=2)),
        ("initial_states_per_layer", P(num_layers=3, T=3, N=2, I=2, H=3, seed=3)),
        ("no_bias_given", P(bias=False, num_layers=2, T=3, N=2, I=2, H=2, seed=4)),
        ("bidirectional", P(bidirectional=True, num_layers=2, T=4, N=2, I=3, H=2, seed=5)),
        ("final_states_only", P(num_layers=2, bidirectional=True, loss="final", T=3, N=2, I=2, H=2, seed=6)),
        ("packed_unsorted", P(form="packed", lengths=(2, 4, 1), bidirectional=True, num_layers=2,
                              batch_first=True, T=4, N=3, I=2, H=2, seed=7)),
        ("unbatched", P(form="unbatched", num_layers=2, T=3, N=1, I=2, H=3, seed=8)),
        ("noncontiguous", P(form="noncontiguous", num_layers=2, T=3, N=2, I=3, H=2, seed=9)),
        ("train_eval_train", P(num_layers=2, dropout=0.5, mode="sequence", T=3, N=4, I=3, H=4, seed=10)),
        ("dropout_gradients", P(num_layers=3, dropout=0.5, mode="train", T=3, N=4, I=3, H=4, seed=11)),
        ("over_2_16_elements", P(num_layers=2, bidirectional=True, T=16, N=33, I=128, H=8, seed=1)),
    ] + ([("relu", P(nonlinearity="relu", num_layers=2, T=3, N=2, I=2, H=3, seed=12))]
         if cell == "rnn" else [])
    if capabilities is None:
        return out
    fitted = [(name, capabilities.fit(p)) for name, p in out]
    return [(name, p) for name, p in fitted if p is not None]


def problems(cell, *, dtype="float32", max_layers=3, max_size=4, boundary=True,
             values="contractive", capabilities=None):
    """A hypothesis strategy of :class:`Problem`\\ s of ``cell`` (shrinking to one layer, the
    default options, batched input, random states, both losses, eval mode, small sizes), drawn
    within ``capabilities`` (a :class:`Capabilities`; None: everything)."""
    from hypothesis import strategies as st

    caps = capabilities or Capabilities()
    max_layers = max(1, min(max_layers, caps.num_layers))

    @st.composite
    def draw(draw):
        shape = dict(zip("TNIH", draw(st.sampled_from(tuple(caps.shapes))))) if caps.shapes else {}

        def size(dim, lo, special):
            if dim in shape:
                return shape[dim]
            pick = draw(st.integers(0, 11))
            if boundary and special and pick == 11:
                return draw(st.sampled_from(special))
            return draw(st.integers(lo, max_size))

        L = draw(st.integers(1, max_layers))
        form = draw(st.sampled_from(caps.forms()))
        T = size("T", 1, ())
        N = 1 if form == "unbatched" else size("N", 1, (31, 32, 33))
        lengths = None
        if form == "packed":
            lengths = tuple(draw(st.lists(st.integers(1, T), min_size=N, max_size=N)))
        dropout = draw(st.sampled_from((0.0, 0.5))) if L > 1 and caps.dropout else 0.0
        mode = draw(st.sampled_from(MODES)) if caps.dropout else "eval"
        nonlinearity = draw(st.sampled_from(tuple(caps.nonlinearities))) if cell == "rnn" else "tanh"
        bias = draw(st.sampled_from((True, False))) if caps.no_bias else True
        if nonlinearity == "relu" and mode == "train" and dropout:
            # without a bias, a dropped input row and zero states put a relu exactly on its kink,
            # where central differences do not give the derivative
            bias = True
        layouts = {"time_major": False, "batch_first": True}
        return Problem(
            cell=cell, num_layers=L,
            bidirectional=draw(st.booleans()) if caps.bidirectional else False,
            batch_first=draw(st.sampled_from([layouts[k] for k in caps.layouts])), bias=bias,
            nonlinearity=nonlinearity, dropout=dropout,
            T=T, N=N, I=size("I", 1, (31, 32, 33)), H=size("H", 1, (31, 32, 33)), form=form,
            lengths=lengths,
            states=draw(st.sampled_from(STATES if caps.initial_states else ("none",))),
            loss=draw(st.sampled_from(LOSSES)), mode=mode, dtype=dtype,
            seed=draw(st.integers(0, 2**32 - 1)), values=values)

    return draw()


__all__ = ["Capabilities", "Problem", "problem_values", "scenarios", "problems", "layer_of",
           "CELLS", "FORMS", "STATES", "LOSSES", "MODES", "VALUES"]
