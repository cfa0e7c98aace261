"""Which kernel runs each Metal dispatch, and why: the one place the host chooses.

Every dispatch runs one entry point of ``kernels/``, and every entry point runs one body: the
rules here return its name and a sentence saying why (a :class:`Choice`). The host logs each
choice at DEBUG level on the logger ``rnngrad.backends.metal``; the harness's ``Device.trace``,
:class:`~rnngrad.backends.metal.IncompleteDispatch` and ``rnngrad bench``'s "kernel versions"
name the same entry point. ``kernels/README.md`` is the table of entry points (grid, when the
rule picks each, how it works); ``verification/PERFORMANCE.md`` has the measurements behind
the rules.

Recurrences (``<cell>_<direction>``, direction "forward" or "backward"), three versions:

- v1 ``<cell>_<direction>``: a thread per (row, unit), each a dot product of length H per gate
  from device memory, in one of two grids: ``packed`` (``D·N·H`` threads, threadgroups of whole
  rows) or ``rows`` (``D·N·1024`` threads, a threadgroup a row). Correct for every shape and
  threadgroup size: the simple version, and the correctness baseline of the others.
- v2 ``<cell>_<direction>_v2_<body>[_512]``: one row a threadgroup of :data:`V2_THREADS` (or
  512, the ``_512`` entries, whose threads the CUDA translation gives twice the registers); each
  step's recurrent product is a dot product per unit split over S lanes, the left factor staged
  in threadgroup memory. The body (what is held in registers, who runs the cell) follows from H
  and the threadgroup size: :func:`v2_entry`.
- v3 ``<cell>_<direction>_v3``: one dispatch a step, threadgroups of :data:`V3_THREADS` over
  tiles of rows × units whose product is register-blocked (:func:`tile_blocks`); the backward
  ends with a dispatch of the carry alone (T + 1 dispatches).

The rule (``auto``): **v3 where a step's product D·N·G·H² has at least** ``steps_min_work``
**multiply-adds; else v2 where H is in the cell's and direction's range** (``v2_h``) **and
D·N ≤** ``v2_max_rows``; **else v1, in rows where H ≤** ``rows_max_h`` **and packing leaves
fewer than** ``rows_min_groups`` **threadgroups, else packed** (the thresholds are
:class:`Rules`' fields). A GRU without
reset_after (its o gate reads r of every unit within a step) runs v1. On the CPU harness
(``metal-emulated``), whose fibers make idle threads cost what they save on a GPU, auto is v1
packed.

A v2 entry runs only in the threadgroup size the host chose it for. Where a device gives its
pipeline another size (a Mac may, for a pipeline that needs more registers), the host runs v1
for that entry on that device from then on (``declined`` below): before it runs, where the
device's function says its size; else after every threadgroup of the dispatch has marked
itself declined (``rg_declines`` in common.metal) and the op is run again.

Matrix products C[batch, M, P] = A·B (+ bias): v1 ``strided_gemm`` (a thread an element), v3
``strided_gemm_blocked`` (64×64 tiles), v4 ``strided_gemm_split`` (K over 32 SIMD-groups), v5
``strided_gemm_wide`` (128×128 tiles, K optionally in slices the host adds): :func:`gemm`.

Overrides: ``RNNGRAD_METAL_RECURRENCE`` = ``auto`` | ``v1`` | ``packed`` | ``rows`` | ``v2`` |
``v3`` and ``RNNGRAD_METAL_GEMM`` = ``auto`` | ``v1`` | ``v3`` | ``v4`` | ``v5``, read at every
op. In code (tests, tuning and A/B scripts), :func:`overrides` runs a block under other
:class:`Rules`: forced versions (``recurrence=``, ``gemm=``, which win over the variables) or
other thresholds; nothing else changes what the rules read. Every version computes every shape
within the float32 tolerance; a forced version that cannot run a shape (v2 beyond its threadgroup memory,
v3 for a GRU without reset_after) runs what the rule gives instead, and its reason says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import types

from ...descriptors import DESCRIPTORS

# -- what the kernels fix (their #defines): never a setting -------------------------------------

#: the versions of the matrix product: version -> kernel
GEMM_KERNELS = {"v1": "strided_gemm", "v3": "strided_gemm_blocked", "v4": "strided_gemm_split",
                "v5": "strided_gemm_wide"}
#: the side of the tiles the rule counts (an area of C); v3's tile side (GB_TILE in gemm.metal)
#: and threads (GB_THREADS); v5's tile side (GW_TILE), k a chunk (GW_K) and threads (GW_THREADS)
TILE = 32
BLOCKED_TILE, BLOCKED_THREADS = 64, 256
WIDE_TILE, WIDE_K, WIDE_THREADS = 128, 8, 256
#: version -> (tile side, threads per tile) of the tiled versions
TILED = {"v3": (BLOCKED_TILE, BLOCKED_THREADS), "v5": (WIDE_TILE, WIDE_THREADS)}
#: columns of C per v4 block (GS_COLS in gemm.metal), threads per block (GS_THREADS)
SPLIT_COLUMNS, SPLIT_THREADS = 32, 1024
#: threads of a v2 threadgroup (RG_THREADS in v2_rows.metal) and of a ``_512`` entry's
V2_THREADS, V2_THREADS_512 = 1024, 512
#: floats of threadgroup memory a v2 body stages (RG_STAGE) and keeps for its next step
#: (RG_NEXT); lanes a unit at most (RG_LANES); float4 of a weight row held (RG_HOLD)
V2_STAGE, V2_NEXT, V2_LANES, V2_HOLD = 6144, 2048, 8, 4
#: threads of a v3 threadgroup (the kernels' limit), rows of a tile at most (RS_ROWS), columns
#: (RS_COLS: units × gates in the LSTM's and GRU's forward, units elsewhere)
V3_THREADS, V3_ROWS, V3_COLS = 256, 16, 64

# -- the rules' thresholds: measured, and overridable (see Rules and overrides) -----------------

#: environment variable that overrides the product rule: v1, v3, v4, v5 or auto
GEMM_ENV = "RNNGRAD_METAL_GEMM"
#: environment variable that overrides the recurrences' version: v1, packed, rows, v2, v3, auto
RECURRENCE_ENV = "RNNGRAD_METAL_RECURRENCE"
_SETTINGS = ("v1", "v3", "v4", "v5", "auto")
_GRIDS = ("v1", "packed", "rows", "v2", "v3", "auto")


def _frozen(table: dict) -> types.MappingProxyType:
    return types.MappingProxyType(dict(table))


@dataclasses.dataclass(frozen=True, eq=False)
class Rules:
    """Every number the rules read besides the problem's sizes (verification/PERFORMANCE.md has
    the measurements behind them), and the versions forced in code. :data:`RULES` is the
    default; :func:`overrides` runs a block under other values. Compared by identity: the host
    keeps its plans per Rules object in force."""

    #: the version of every product ("v1", "v3", "v4", "v5", "auto"), or None:
    #: ``$RNNGRAD_METAL_GEMM``
    gemm: str | None = None
    #: the version of every recurrence ("v1": in the grid the rule picks for it, "packed",
    #: "rows", "v2", "v3", "auto"), or None: ``$RNNGRAD_METAL_RECURRENCE``
    recurrence: str | None = None
    #: v5 splits K into slices where C has fewer tiles than this (about two threadgroups a core
    #: of a large GPU), for products without a bias, into at most K / wide_min_slice slices
    wide_split_tiles: int = 264
    wide_min_slice: int = 512
    #: v5 for a tiled product where it gives at least this many threadgroups (tiles × slices of
    #: K; about half the cores of a large GPU), else v3
    wide_min_groups: int = 64
    #: the smallest batch·M·P·K, and the smallest M, P and K, that the rule tiles
    tiled_min_work: int = 2 ** 20
    tiled_min_side: int = 8
    #: the fewest 32×32 tiles of C that the rule tiles (about one per core of a large GPU)
    tiled_min_tiles: int = 128
    #: v4 where v1 would run with fewer than this many threads (too few threadgroups for the
    #: cores) over a K of at least split_min_k
    split_max_elements: int = 32768
    split_min_k: int = 256
    #: the largest H the rule gives v1 a threadgroup per row
    rows_max_h: int = 512
    #: below this many packed threadgroups the rule spreads v1's rows (about the cores of a GPU)
    rows_min_groups: int = 128
    #: the H the rule gives v2, by cell and direction: (smallest, largest); each row's
    #: threadgroup reads all of R at every step
    v2_h: types.MappingProxyType = dataclasses.field(default_factory=lambda: _frozen({
        ("single_gate", "forward"): (64, 512), ("single_gate", "backward"): (64, 256),
        ("gru", "forward"): (64, 256), ("gru", "backward"): (64, 256),
        ("lstm", "forward"): (64, 256), ("lstm", "backward"): (64, 256)}))
    #: the most rows (D·N) the rule gives v2, a threadgroup each
    v2_max_rows: int = 64
    #: the largest H at which a forward runs on its 512-thread entries, by cell
    v2_512_h: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: _frozen({"single_gate": 64, "gru": 128, "lstm": 128}))
    #: the H at which a backward runs on its 512-thread entries: (smallest, largest)
    v2_512_backward_h: tuple = (128, 128)
    #: v3 where a step's product has at least this many multiply-adds (D·N·G·H²): where the
    #: device time it saves outweighs its dispatches' cost to the host; None: never
    steps_min_work: int | None = 2 ** 25
    #: the fewest v3 tiles the host aims for (about one per core of a large GPU): the widest
    #: block of units (a power of two) that still gives this many, else the narrowest
    v3_min_tiles: int = 128


#: the rules as measured
RULES = Rules()
_CURRENT = contextvars.ContextVar("rnngrad_metal_rules", default=RULES)


def rules() -> Rules:
    """The rules in force: :data:`RULES`, or those of the innermost :func:`overrides` block."""
    return _CURRENT.get()


@contextlib.contextmanager
def overrides(**changes):
    """Run the block under the rules in force with ``changes`` (:class:`Rules`' fields, such as
    ``recurrence="v2"``, ``gemm="v1"`` or ``v3_min_tiles=32``); yields the :class:`Rules` in
    force. The one way for code (tests, tuning scripts, A/B runs) to change what the rules
    read; users set ``$RNNGRAD_METAL_RECURRENCE`` and ``$RNNGRAD_METAL_GEMM``. The host makes
    its plans anew under each (they are kept per Rules object)."""
    fields = {f.name for f in dataclasses.fields(Rules)}
    unknown = sorted(set(changes) - fields)
    if unknown:
        raise ValueError(f"overrides: expected fields of Rules ({', '.join(sorted(fields))}), "
                         f"got {', '.join(unknown)}")
    for name, choices in (("gemm", _SETTINGS), ("recurrence", _GRIDS)):
        value = changes.get(name)
        if value is not None and str(value).strip().lower() not in choices:
            raise ValueError(f"overrides: {name} expected one of {', '.join(choices)} or None, "
                             f"got {value!r}")
    for name in ("v2_h", "v2_512_h"):
        if name in changes:
            changes[name] = _frozen(changes[name])
    token = _CURRENT.set(dataclasses.replace(rules(), **changes))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)


def key() -> tuple:
    """What the rules' choices depend on besides the sizes, as one hashable value: the
    :class:`Rules` in force (by identity) and the two environment variables. The host keeps an
    op's plan per value, so that a change takes effect on the next call."""
    return _CURRENT.get(), os.environ.get(GEMM_ENV), os.environ.get(RECURRENCE_ENV)


#: every v2 entry point, by cell and direction: its body, in a few words (kernels/README.md)
V2_ENTRIES = {
    ("single_gate", "forward"): {"held": "R's row held in registers",
                                 "streamed": "R's row read at every step",
                                 "held_512": "R's row held in registers"},
    ("single_gate", "backward"): {"held": "Rᵀ's row held in registers",
                                  "paired": "2S lanes own two units, a round of each row held",
                                  "streamed": "Rᵀ's row read at every step",
                                  "paired_512": "2S lanes own two units, 4 rounds of each held"},
    ("gru", "forward"): {"streamed": "the three rows of R read at every step",
                         "streamed_512": "the three rows of R read at every step",
                         "held_512": "the three rows held whole in registers",
                         "spread_512": "the rows held whole, the cell on 4 lanes a unit"},
    ("gru", "backward"): {"ahead": "idle threads find the next step's activations ahead",
                          "paired": "2S lanes own two units, a round of each row held",
                          "streamed": "the rows of Rᵀ read at every step",
                          "paired_512": "2S lanes own two units, both rows held whole"},
    ("lstm", "forward"): {"spread": "gate k's activation on lane k of a unit",
                          "full": "every thread a unit's, gate k's activation on lane k",
                          "spread_512": "gate k's activation on lane k of a unit",
                          "full_whole_512": "every thread a unit's, the rows held whole",
                          "full_held_512": "every thread a unit's, 4 float4 of each row held"},
    ("lstm", "backward"): {"ahead": "idle threads find the next step's activations ahead",
                           "ahead_peephole": "the ahead body, with a peephole",
                           "streamed": "the rows of Rᵀ read at every step",
                           "streamed_peephole": "the streamed body, with a peephole",
                           "paired_512": "2S lanes own two units, both rows held whole",
                           "paired_peephole_512": "the paired body, with a peephole"},
}


def entry_points() -> tuple:
    """Every kernel entry point the rules can name: the products', then each recurrence's v1,
    v2 entries and v3."""
    names = list(GEMM_KERNELS.values())
    for (cell, direction), bodies in V2_ENTRIES.items():
        v1 = f"{cell}_{direction}"
        names += [v1] + [f"{v1}_v2_{body}" for body in bodies] + [f"{v1}_v3"]
    return tuple(names)


def v2_slices(H: int, threads: int) -> int:
    """Lanes a unit of a v2 body (rg_slices): the largest power of two S <= :data:`V2_LANES`
    that keeps S·H within one pass of the threadgroup, at least 1."""
    S = 1
    while S < V2_LANES and 2 * S * H <= threads:
        S *= 2
    return S


def _body(cell: str, direction: str, H: int, threads: int, peephole: bool, reset_after: bool):
    """The v2 body a threadgroup of ``threads`` runs for H, by the kernels' own conditions (the
    ``<cell>_<direction>_v2_run`` helpers in kernels/): a key of :data:`V2_ENTRIES` without the
    ``_512``, or None where no one-row body fits."""
    S = v2_slices(H, threads)
    holds = lambda W: H % 4 == 0 and H <= 4 * W * S  # noqa: E731 (rg_holds)
    full = S * H == threads and H % 4 == 0  # rg_full
    pairs = full and 2 * S <= V2_LANES  # rg_pairs
    wide = threads == V2_THREADS_512
    if S * H > threads or (cell == "gru" and not reset_after):
        return None
    if (cell, direction) == ("single_gate", "forward"):
        return ("held" if holds(V2_HOLD) else "streamed") if H <= V2_NEXT else None
    if cell == "single_gate":
        if 2 * H > V2_STAGE:
            return None
        return "held" if holds(V2_HOLD) else ("paired" if pairs else "streamed")
    if (cell, direction) == ("gru", "forward"):
        if 3 * H > V2_NEXT:
            return None
        if holds(V2_HOLD // 2):
            return "held"
        return "spread" if wide and holds(8) and S >= 4 and 12 * threads <= V2_STAGE else "streamed"
    if cell == "gru":
        if 4 * H > V2_STAGE:
            return None
        if 3 * H <= threads - S * H and 11 * H <= V2_STAGE:
            return "ahead"
        return "paired" if pairs else "streamed"
    if direction == "forward":
        if H > V2_NEXT or S < 4:
            return None
        if full:
            return ("full_whole" if holds(2) else "full_held") if wide else "full"
        return "spread"
    if 5 * H > V2_STAGE:
        return None
    if 6 * H <= threads and 16 * H <= V2_STAGE:
        body = "ahead"
    else:
        body = "paired" if wide and pairs else "streamed"
    return body + ("_peephole" if peephole else "")


def v2_entry(*, cell: str, direction: str, H: int, peephole: bool = False,
             reset_after: bool = True) -> tuple:
    """(kernel, a clause for the reason) of v2 for H, or (None, why not): the threadgroup size
    ``Rules.v2_512_h`` / ``Rules.v2_512_backward_h`` give, its body by :func:`_body`; where that
    size has no entry for the body (only a forced v2 meets this), the other size's."""
    r = rules()
    if direction == "forward":
        small = H <= r.v2_512_h.get(cell, 0)
    else:
        low, high = r.v2_512_backward_h
        small = low <= H <= high
    sizes = (V2_THREADS_512, V2_THREADS) if small else (V2_THREADS, V2_THREADS_512)
    for threads in sizes:
        body = _body(cell, direction, H, threads, peephole, reset_after)
        name = body if body is None or threads == V2_THREADS else f"{body}_512"
        if name in V2_ENTRIES[(cell, direction)]:
            return (f"{cell}_{direction}_v2_{name}",
                    f"{V2_ENTRIES[(cell, direction)][name]}, threadgroups of {threads}")
    why = "a GRU without reset_after" if cell == "gru" and not reset_after else f"H = {H}"
    return None, f"no v2 body fits {why} in a threadgroup"


def tile_columns(*, cell: str, direction: str) -> int:
    """Columns of a v3 tile a unit: its gates in the forward of the LSTM and the GRU, else 1."""
    return 4 if direction == "forward" and cell in ("lstm", "gru") else 1


def tile_rows(N: int) -> int:
    """Rows of a v3 tile: 4·⌈N / 4⌉, at most :data:`V3_ROWS` (rs_tile's 4·WR in
    v3_tiles.metal)."""
    return 4 * min(V3_ROWS // 4, max(1, -(-N // 4)))


def tile_blocks(*, cell: str, direction: str, D: int, N: int, H: int) -> tuple:
    """(row tiles of a direction, unit blocks U) of v3's grid: tiles of :func:`tile_rows` rows
    × ⌈H / U⌉ units, with the widest power-of-two block of units within :data:`V3_COLS`
    columns that gives at least ``Rules.v3_min_tiles`` tiles (else the narrowest: 4 columns)."""
    cpu = tile_columns(cell=cell, direction=direction)
    row_tiles = -(-max(N, 1) // tile_rows(N))
    min_tiles = rules().v3_min_tiles
    width = V3_COLS // cpu
    narrowest = max(1, 4 // cpu)
    while width > narrowest and D * row_tiles * -(-H // width) < min_tiles:
        width //= 2
    return row_tiles, max(1, -(-H // width))


@dataclasses.dataclass(frozen=True)
class Choice:
    """The code that runs one dispatch: ``version`` ("v1" ... "v5" for a product; "packed",
    "rows", "v2" or "v3" for a recurrence), ``kernel`` (its entry point) and ``reason``."""
    version: str
    kernel: str
    reason: str

    def __str__(self):
        return f"{self.version} {self.kernel}: {self.reason}"


def recurrence(*, cell: str, direction: str, D: int, N: int, H: int, device: str = "",
               reset_after: bool = True, peephole: bool = False,
               declined: frozenset = frozenset()) -> Choice:
    """The entry point of a recurrence dispatch and why. ``device`` is the backend's name (on
    "metal-emulated" auto is v1 packed); ``reset_after`` the GRU's; ``peephole`` whether an
    LSTM's is given (its backward's v2 bodies are compiled with or without it); ``declined``
    the v2 entries this device declined (the host's), which run v1 instead."""
    r = rules()
    setting, source = _setting(r.recurrence, "recurrence", RECURRENCE_ENV, _GRIDS)
    v1 = f"{cell}_{direction}"
    shape = f"{v1}, D={D}, N={N}, H={H}"
    one_step = cell != "gru" or reset_after  # v3's tiles need no unit's neighbours in a step
    if setting == "v3" and one_step:
        return _v3(shape, f"forced by {source}=v3", cell=cell, direction=direction, D=D, N=N,
                   H=H)
    if setting == "v2":
        kernel, clause = v2_entry(cell=cell, direction=direction, H=H, peephole=peephole,
                                  reset_after=reset_after)
        if kernel is not None and kernel not in declined:
            return Choice("v2", kernel, f"{shape}: forced by {source}=v2: {clause}")
        clause = clause if kernel is None else f"{kernel} declined this device's threadgroups"
        shape, setting = f"{shape}: {source}=v2, but {clause}, so v1", "v1"
    elif setting == "v3":
        shape, setting = (f"{shape}: {source}=v3, but a GRU without reset_after needs r of every "
                          f"unit within a step, so the rule"), "auto"
    if setting in ("packed", "rows"):
        return Choice(setting, v1, f"{shape}: forced by {source}={setting}")
    if setting == "v1" and source in shape:
        shape = f"{shape} in its grid"
    elif setting == "v1":
        shape = f"{shape}: v1 forced by {source}=v1, its grid"
    if device == "metal-emulated":
        return Choice("packed", v1, f"{shape}: v1 packed on the CPU harness, which runs every "
                                    f"GPU thread as a fiber: idle threads cost there what they "
                                    f"save on a GPU")
    if setting == "auto":
        work = D * N * DESCRIPTORS[cell].gates * H * H
        if r.steps_min_work is not None and work >= r.steps_min_work and one_step:
            return _v3(shape, f"auto, v3: a step's product is D·N·G·H² = {work} >= "
                              f"{r.steps_min_work} multiply-adds", cell=cell, direction=direction,
                       D=D, N=N, H=H)
        low, high = r.v2_h.get((cell, direction)) or (1, 0)
        if low <= H <= high and D * N <= r.v2_max_rows and one_step:
            kernel, clause = v2_entry(cell=cell, direction=direction, H=H, peephole=peephole,
                                      reset_after=reset_after)
            why = f"auto, v2: {low} <= H <= {high} and D·N = {D * N} <= {r.v2_max_rows}"
            if kernel is not None and kernel not in declined:
                return Choice("v2", kernel, f"{shape}: {why}, {clause}")
            if kernel is not None:
                shape = f"{shape}: {why}, but {kernel} declined this device's threadgroups"
    packed_groups = -(-D * N * H // 1024)
    if H <= r.rows_max_h and packed_groups < r.rows_min_groups and D * N > packed_groups:
        return Choice("rows", v1, f"{shape}: v1, H <= {r.rows_max_h} and packing leaves "
                                  f"{packed_groups} threadgroup(s) for {D * N} rows: one per row")
    return Choice("packed", v1, f"{shape}: v1 packed: {packed_groups} threadgroup(s)")


def _v3(shape: str, why: str, *, cell, direction, D, N, H) -> Choice:
    row_tiles, blocks = tile_blocks(cell=cell, direction=direction, D=D, N=N, H=H)
    return Choice("v3", f"{cell}_{direction}_v3",
                  f"{shape}: {why}, one dispatch a step, {D * row_tiles * blocks} tile(s) of "
                  f"{tile_rows(N)} row(s) × {-(-H // blocks)} unit(s)")


def recurrence_count(choice: Choice, *, cell: str, direction: str, D: int, N: int,
                     H: int) -> int:
    """The threads a recurrence dispatch asks for under ``choice``: v2 a threadgroup a row, v3
    :data:`V3_THREADS` a tile, v1 ``rows`` 1024 a row, v1 ``packed`` one a (row, unit)."""
    if choice.version == "v2":
        return D * N * (V2_THREADS_512 if choice.kernel.endswith("_512") else V2_THREADS)
    if choice.version == "v3":
        row_tiles, blocks = tile_blocks(cell=cell, direction=direction, D=D, N=N, H=H)
        return D * row_tiles * blocks * V3_THREADS
    return D * N * (1024 if choice.version == "rows" else H)


def _setting(value, field: str, env: str, choices) -> tuple:
    """(setting, where it came from): ``value`` (the :class:`Rules` field ``field``) unless it
    is None, else ``$env``, else auto; a ValueError naming where it came from when it is not one
    of ``choices``."""
    if value is not None:
        source = f"overrides({field}=...)"
    else:
        value, source = os.environ.get(env, "").strip() or "auto", env
    setting = str(value).strip().lower()
    if setting not in choices:
        raise ValueError(f"{source}: expected one of {', '.join(choices)}, got {value!r}")
    return setting, source


def gemm_setting() -> tuple:
    """(setting, where it came from): ``Rules.gemm``, else ``$RNNGRAD_METAL_GEMM``, else auto."""
    return _setting(rules().gemm, "gemm", GEMM_ENV, _SETTINGS)


def gemm(*, batch: int, M: int, P: int, K: int, product: str = "", has_bias: bool = False,
         block: int | None = None, b_block: int = 0) -> Choice:
    """The version that runs C[batch, M, P] = A·B over K (``has_bias``: + bias; ``block``,
    ``b_block``: GRU's row blocks, as GemmParams), and why. ``product`` names it in the reason
    (for example "input weight gradient"). The rule: untiled (:func:`_untiled`) where a side is
    below ``Rules.tiled_min_side`` or the work below ``Rules.tiled_min_work``; where C has
    fewer than ``Rules.tiled_min_tiles`` 32×32 tiles, v5 over slices of K if it splits, else
    untiled; else v5 where it gives ``Rules.wide_min_groups`` threadgroups, else v3."""
    setting, source = gemm_setting()
    r = rules()
    shape = f"batch={batch}, M={M}, P={P}, K={K}"
    what = f"{product} ({shape})" if product else shape
    if setting != "auto":
        return Choice(setting, GEMM_KERNELS[setting], f"{what}: forced by {source}={setting}")
    work = batch * M * P * K
    side = min(M, P, K)
    if side < r.tiled_min_side:
        name = "M" if M == side else ("P" if P == side else "K")
        kind = " (a reduction to one row)" if M == 1 else ""
        return _untiled(f"{what}: auto, {name}={side} < {r.tiled_min_side}{kind}: a tile would be "
                        f"mostly padding", batch * M * P, K)
    if work < r.tiled_min_work:
        return _untiled(f"{what}: auto, batch·M·P·K = {work} < {r.tiled_min_work}: too small to "
                        f"tile", batch * M * P, K)
    tiles = batch * -(-M // TILE) * -(-P // TILE)
    rows = dict(batch=batch, M=M, P=P, block=block or max(M, 1), b_block=b_block)
    wide = gemm_tiles(**rows, tile=WIDE_TILE)
    slices = wide_slices(**rows, K=K, has_bias=has_bias)[0]
    split = f" over {slices} slices of K" if slices > 1 else ""
    if tiles < r.tiled_min_tiles:
        why = (f"{what}: auto, {tiles} 32x32 tiles of C < {r.tiled_min_tiles}: too few "
               f"threadgroups for a K of {K}")
        if slices > 1 and not _splits_rows(batch * M * P, K):
            return Choice("v5", GEMM_KERNELS["v5"], f"{why}; v5: {wide} 128x128 tile(s){split}")
        return _untiled(why, batch * M * P, K)
    reason = (f"{what}: auto, batch·M·P·K = {work} >= {r.tiled_min_work}, M, P, K >= "
              f"{r.tiled_min_side} and {tiles} 32x32 tiles: tiled")
    if wide * slices >= r.wide_min_groups:
        return Choice("v5", GEMM_KERNELS["v5"], f"{reason}, v5: {wide} 128x128 tile(s){split}, "
                                                f"{wide * slices} threadgroups >= "
                                                f"{r.wide_min_groups}")
    return Choice("v3", GEMM_KERNELS["v3"], f"{reason}, v3: {wide * slices} 128x128 "
                                            f"threadgroup(s) < {r.wide_min_groups}")


def _splits_rows(elements: int, K: int) -> bool:
    """Whether v4 takes an untiled product of ``elements`` elements over ``K``: fewer than
    ``Rules.split_max_elements`` (where v1's thread an element would leave most cores idle)
    over a K of at least ``Rules.split_min_k``."""
    r = rules()
    return elements < r.split_max_elements and K >= r.split_min_k


def _untiled(reason: str, elements: int, K: int) -> Choice:
    """An untiled product: v4 where :func:`_splits_rows`, else v1."""
    if _splits_rows(elements, K):
        r = rules()
        return Choice("v4", GEMM_KERNELS["v4"],
                      f"{reason}; {elements} element(s) < {r.split_max_elements} over K = {K} "
                      f">= {r.split_min_k}: v4, K split over {SPLIT_THREADS // SPLIT_COLUMNS} "
                      f"slices")
    return Choice("v1", GEMM_KERNELS["v1"], reason)


def gemm_tiles(*, batch: int, M: int, P: int, block: int, b_block: int, tile: int = TILE) -> int:
    """The ``tile``×``tile`` tiles of C[batch, M, P]. With ``b_block`` != 0 the rows of C come in
    blocks of ``block`` that read different parts of B, and no tile straddles two (the tiled
    kernels count them the same way)."""
    span = max(block, 1) if b_block else max(M, 1)
    blocks = -(-M // span)
    return batch * blocks * -(-span // tile) * -(-P // tile)


def wide_slices(*, batch: int, M: int, P: int, K: int, block: int, b_block: int,
                has_bias: bool) -> tuple:
    """(slices, k per slice) of a v5 product: one slice (k per slice 0) unless C has fewer than
    ``Rules.wide_split_tiles`` tiles and no bias; then enough slices for that many threadgroups,
    each at least ``Rules.wide_min_slice`` k (a multiple of :data:`WIDE_K`)."""
    r = rules()
    tiles = gemm_tiles(batch=batch, M=M, P=P, block=block, b_block=b_block, tile=WIDE_TILE)
    if has_bias or tiles >= r.wide_split_tiles:
        return 1, 0
    slices = min(-(-r.wide_split_tiles // max(tiles, 1)), K // r.wide_min_slice)
    if slices < 2:
        return 1, 0
    k_split = -(-K // slices)
    k_split = -(-k_split // WIDE_K) * WIDE_K
    return -(-K // k_split), k_split


def gemm_threads(choice: Choice, *, batch: int, M: int, P: int, block: int, b_block: int,
                 slices: int = 1) -> int:
    """The threads to dispatch for ``choice``: one an element of C for v1, :data:`SPLIT_THREADS`
    per :data:`SPLIT_COLUMNS` elements of a row for v4, the tiled versions' threads per tile
    (and slice of K, for v5)."""
    if choice.version == "v1":
        return batch * M * P
    if choice.version == "v4":
        return batch * M * -(-P // SPLIT_COLUMNS) * SPLIT_THREADS
    tile, threads = TILED[choice.version]
    tiles = gemm_tiles(batch=batch, M=M, P=P, block=block, b_block=b_block, tile=tile)
    return threads * tiles * (slices if choice.version == "v5" else 1)
