"""The Metal kernel library: where the ``.metal`` sources are, how they are put together, and the
NumPy mirrors of their parameter structs and buffer tables.

metalcompute compiles one source string and does not resolve local ``#include``, so the library
source is the shared headers of ``kernels/`` (:data:`HEADERS`) followed by every kernel file. The
sources ship inside the installed package at ``rnngrad/_kernels/``; in a source checkout or an
editable install they are the repository's ``kernels/`` folder.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path

import numpy as np

from . import versions
from .msl import translate

#: the shared headers, first in the library source, in this order: the parameter structs,
#: activations, index helpers and completion marks; the helpers of the v2 one-row bodies; the
#: v3 tile product
HEADERS = ("common.metal", "v2_rows.metal", "v3_tiles.metal")
#: the header that holds the parameter structs
HEADER = HEADERS[0]
#: kernel files, in the order they are appended after the headers
KERNEL_FILES = (
    "gemm.metal",
    "single_gate_forward.metal",
    "single_gate_backward.metal",
    "gru_forward.metal",
    "gru_backward.metal",
    "lstm_forward.metal",
    "lstm_backward.metal",
)


def _struct(names):
    return np.dtype([(name, "<u4") for name in names])


#: mirror of ``struct RecurrenceParams`` in common.metal (every field a 4-byte uint, in order)
RECURRENCE_PARAMS = _struct((
    "count", "T", "N", "H", "D", "G", "Z", "reverse", "training", "mask_per_step",
    "has_peephole", "cell_gradient_per_step", "reset_after", "flip_z",
    "act0", "act1", "act2", "act3", "act4", "gate0", "gate1", "gate2", "gate3",
    "s_begin", "s_end", "unit_blocks",
))

#: mirror of ``struct GemmParams`` in common.metal
GEMM_PARAMS = _struct((
    "count", "batch", "M", "P", "K", "a_batch", "a_row", "a_k", "b_batch", "b_k", "b_col",
    "block", "b_block", "has_bias", "k_split",
))

#: the buffers of every kernel family, in ``[[buffer(i)]]`` order; the launcher binds them by
#: these names (every kernel's last buffer, ``status``, is the completion marks the launcher
#: itself binds). A recurrence's v2 and v3 entry points take its v1's buffers with the recurrent
#: weight the other way round (R forward, Rᵀ backward: each reads it along the index its lanes
#: reduce over): :func:`buffers`.
_FAMILIES = {
    "strided_gemm": ("p", "A", "B", "bias", "C", "status"),
    "single_gate_forward": ("p", "x", "bias", "Rt", "h0", "mask", "h", "zs", "status"),
    "single_gate_backward": ("p", "R", "h0", "mask", "dy", "zs", "dx", "rhs", "dhn", "status"),
    "gru_forward": ("p", "x", "bias", "Rt", "h0", "mask", "b2", "h", "zs", "status"),
    "gru_backward": ("p", "R", "h0", "mask", "dy", "zs", "hfwd", "dx", "lhs", "rhs",
                     "dhn", "work", "prow", "status"),
    "lstm_forward": ("p", "x", "bias", "Rt", "h0", "c0", "mask", "peephole", "h", "c", "zs",
                     "status"),
    "lstm_backward": ("p", "R", "h0", "c0", "mask", "peephole", "dy", "zs", "cfwd", "cg",
                      "dx", "rhs", "dhn", "dcn", "prow", "status"),
}
_SWAP = {"Rt": "R", "R": "Rt"}


def buffers(kernel: str) -> tuple:
    """The buffer names of entry point ``kernel`` in ``[[buffer(i)]]`` order."""
    if kernel.startswith("strided_gemm"):
        return _FAMILIES["strided_gemm"]
    family = kernel.split("_v2")[0].split("_v3")[0]
    table = _FAMILIES.get(family)
    if table is None:
        raise ValueError(f"kernel: expected an rnngrad entry point, got {kernel!r}")
    return table if family == kernel else tuple(_SWAP.get(b, b) for b in table)


#: every entry point of the library, in source order: its buffer names
BUFFERS = {kernel: buffers(kernel) for kernel in versions.entry_points()}

#: flag of a completion mark's first word (``rg_done`` in common.metal): a zeroed entry is not done
DONE = 0x80000000
#: first word of a declined mark (``RG_DECLINED`` in common.metal): a v2 entry point's
#: threadgroup that did not run its body (see rnngrad.backends.metal.versions)
DECLINED = 0x40000000
#: the smallest threadgroup metalcompute makes (one SIMD-group): status buffers hold
#: ``ceil(count / MIN_THREADGROUP)`` marks, enough for any threadgroup size
MIN_THREADGROUP = 32


def kernel_dir() -> Path:
    """The folder holding the ``.metal`` sources: the installed package data, else the checkout."""
    try:
        packaged = importlib.resources.files("rnngrad") / "_kernels"
        if packaged.is_dir():
            return Path(str(packaged))
    except (ModuleNotFoundError, TypeError):
        pass
    import rnngrad

    return Path(rnngrad.__file__).resolve().parent.parent / "kernels"


def read(name: str) -> str:
    """The text of one ``.metal`` file."""
    path = kernel_dir() / name
    if not path.is_file():
        raise FileNotFoundError(
            f"Metal kernel source: expected {name} in {kernel_dir()}, got no such file "
            "(reinstall rnngrad, or run from a source checkout)")
    return path.read_text()


@functools.lru_cache(maxsize=None)
def source() -> str:
    """The whole library source: the headers, then every kernel file."""
    return "\n".join(read(name) for name in HEADERS + KERNEL_FILES)


_PARAM = re.compile(
    r"(?P<decl>[\w:&*<>\s]+?)\s+(?P<name>\w+)\s*\[\[\s*(?P<attr>[^\]]+?)\s*\]\]")


def signatures(text: str) -> dict:
    """{kernel name: [(parameter name, attribute)]} parsed from MSL source (for tests and tools),
    its ``instantiate_*`` macros expanded (:func:`translate.expand`)."""
    out = {}
    pattern = r"kernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{"
    for match in re.finditer(pattern, translate.expand(text), re.S):
        params = []
        for piece in match.group(2).split(","):
            m = _PARAM.search(" ".join(piece.split()))
            if m:
                params.append((m.group("name"), m.group("attr")))
        out[match.group(1)] = params
    return out


def struct_fields(text: str, struct: str) -> list:
    """[(C type, field name)] of ``struct <struct> { ... }`` in MSL source."""
    m = re.search(r"struct\s+" + struct + r"\s*\{(.*?)\};", text, re.S)
    if not m:
        raise ValueError(f"struct_fields: expected struct {struct} in the source, got none")
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return [tuple(decl.split()) for decl in (d.strip() for d in body.split(";")) if decl]
