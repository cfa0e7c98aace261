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

The rule (``auto``): **v3 where a step's product D·N·G·H² has at least** :data:`STEPS_MIN_WORK`
**multiply-adds; else v2 where H is in the cell's and direction's range** (:data:`V2_H`) **and
D·N ≤** :data:`V2_MAX_ROWS`; **else v1, in rows where H ≤** :data:`ROWS_MAX_H` **and packing
leaves fewer than** :data:`ROWS_MIN_GROUPS` **threadgroups, else packed.** A GRU without
reset_after (its o gate reads r of every unit within a step) runs v1. On the CPU harness
(``metal-emulated``), whose fibers make idle threads cost what they save on a GPU, auto is v1
packed.

A v2 entry runs only in the threadgroup size the host chose it for. Where a device gives its
pipeline another size (a Mac may, for a pipeline that needs more registers), every threadgroup
of the dispatch marks itself declined (``rg_declines`` in common.metal) and the host runs the
op again with v1 for that entry, on that device from then on (``declined`` below).

Matrix products C[batch, M, P] = A·B (+ bias): v1 ``strided_gemm`` (a thread an element), v3
``strided_gemm_blocked`` (64×64 tiles), v4 ``strided_gemm_split`` (K over 32 SIMD-groups), v5
``strided_gemm_wide`` (128×128 tiles, K optionally in slices the host adds): :func:`gemm`.

Overrides: ``RNNGRAD_METAL_RECURRENCE`` = ``auto`` | ``v1`` | ``packed`` | ``rows`` | ``v2`` |
``v3`` and ``RNNGRAD_METAL_GEMM`` = ``auto`` | ``v1`` | ``v3`` | ``v4`` | ``v5``, read at every
op, or the module settings :data:`RECURRENCE` and :data:`GEMM`, which win over the variables
(:func:`forced` sets :data:`GEMM` inside a block). Every version computes every shape within the
float32 tolerance; a forced version that cannot run a shape (v2 beyond its threadgroup memory,
v3 for a GRU without reset_after) runs what the rule gives instead, and its reason says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os

from ...descriptors import DESCRIPTORS

#: environment variable that overrides the product rule: v1, v3, v4, v5 or auto
GEMM_ENV = "RNNGRAD_METAL_GEMM"
#: module setting that overrides the product rule and the variable ("v1" ... "auto"), or None
GEMM = None
#: the versions of the matrix product: version -> kernel
GEMM_KERNELS = {"v1": "strided_gemm", "v3": "strided_gemm_blocked", "v4": "strided_gemm_split",
                "v5": "strided_gemm_wide"}
#: the side of the tiles the rule counts (an area of C); v3's tile side (GB_TILE in gemm.metal)
#: and threads (GB_THREADS); v5's tile side (GW_TILE), k a chunk (GW_K) and threads (GW_THREADS)
TILE = 32
BLOCKED_TILE, BLOCKED_THREADS = 64, 256
WIDE_TILE, WIDE_K, WIDE_THREADS = 128, 8, 256
#: v5 splits K into slices where C has fewer tiles than this (about two threadgroups a core of
#: a large GPU), for products without a bias, into at most K / WIDE_MIN_SLICE slices
WIDE_SPLIT_TILES, WIDE_MIN_SLICE = 264, 512
#: the rule takes v5 for a tiled product where it gives at least this many threadgroups (tiles
#: × slices of K; about half the cores of a large GPU), else v3
WIDE_MIN_GROUPS = 64
#: version -> (tile side, threads per tile) of the tiled versions
TILED = {"v3": (BLOCKED_TILE, BLOCKED_THREADS), "v5": (WIDE_TILE, WIDE_THREADS)}
#: the smallest batch·M·P·K that the rule tiles
TILED_MIN_WORK = 2 ** 20
#: the smallest M, P and K that the rule tiles
TILED_MIN_SIDE = 8
#: the fewest 32×32 tiles of C that the rule tiles (about one per core of a large GPU)
TILED_MIN_TILES = 128
#: columns of C per v4 block (GS_COLS in gemm.metal), threads per block (GS_THREADS)
SPLIT_COLUMNS, SPLIT_THREADS = 32, 1024
#: v4 where v1 would run with fewer than this many threads (too few threadgroups for the
#: cores) over a K of at least SPLIT_MIN_K
SPLIT_MAX_ELEMENTS, SPLIT_MIN_K = 32768, 256
_SETTINGS = ("v1", "v3", "v4", "v5", "auto")

#: environment variable that overrides the recurrences' version: v1, packed, rows, v2, v3, auto
RECURRENCE_ENV = "RNNGRAD_METAL_RECURRENCE"
#: module setting that overrides the rule and the variable: "v1" (v1 in the grid the rule
#: picks for it), "packed", "rows", "v2", "v3", "auto", or None
RECURRENCE = None
#: the largest H the rule gives v1 a threadgroup per row
ROWS_MAX_H = 512
#: below this many packed threadgroups the rule spreads v1's rows (about the cores of a GPU)
ROWS_MIN_GROUPS = 128
#: threads of a v2 threadgroup (RG_THREADS in common.metal) and of a ``_512`` entry's
V2_THREADS, V2_THREADS_512 = 1024, 512
#: floats of threadgroup memory a v2 body stages (RG_STAGE) and keeps for its next step
#: (RG_NEXT); lanes a unit at most (RG_LANES); float4 of a weight row held (RG_HOLD)
V2_STAGE, V2_NEXT, V2_LANES, V2_HOLD = 6144, 2048, 8, 4
#: the H the rule gives v2, by cell and direction: (smallest, largest); each row's threadgroup
#: reads all of R at every step
V2_H = {("single_gate", "forward"): (64, 512), ("single_gate", "backward"): (64, 256),
        ("gru", "forward"): (64, 256), ("gru", "backward"): (64, 256),
        ("lstm", "forward"): (64, 256), ("lstm", "backward"): (64, 256)}
V2_MAX_ROWS = 64  # the most rows (D·N) the rule gives v2, a threadgroup each
#: the largest H at which a forward runs on its 512-thread entries, by cell; the H at which a
#: backward does: (smallest, largest)
V2_512_H = {"single_gate": 64, "gru": 128, "lstm": 128}
V2_512_BACKWARD_H = {"single_gate": (128, 128), "gru": (128, 128), "lstm": (128, 128)}
#: the rule runs v3 where a step's product has at least this many multiply-adds (D·N·G·H²):
#: where the device time it saves outweighs its dispatches' cost to the host; None: never
STEPS_MIN_WORK = 2 ** 25
#: threads of a v3 threadgroup (the kernels' limit), rows of a tile at most (RS_ROWS), columns
#: (RS_COLS: units × gates in the LSTM's and GRU's forward, units elsewhere)
V3_THREADS, V3_ROWS, V3_COLS = 256, 16, 64
#: the fewest v3 tiles the host aims for (about one per core of a large GPU): the widest block
#: of units (a power of two) that still gives this many, else the narrowest
V3_MIN_TILES = 128
_GRIDS = ("v1", "packed", "rows", "v2", "v3", "auto")

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
    :data:`V2_512_H` / :data:`V2_512_BACKWARD_H` give, its body by :func:`_body`; where that
    size has no entry for the body (only a forced v2 meets this), the other size's."""
    if direction == "forward":
        small = H <= V2_512_H.get(cell, 0)
    else:
        low, high = V2_512_BACKWARD_H.get(cell) or (1, 0)
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
    """Rows of a v3 tile: 4·⌈N / 4⌉, at most :data:`V3_ROWS` (rs_tile's 4·WR in common.metal)."""
    return 4 * min(V3_ROWS // 4, max(1, -(-N // 4)))


def tile_blocks(*, cell: str, direction: str, D: int, N: int, H: int) -> tuple:
    """(row tiles of a direction, unit blocks U) of v3's grid: tiles of :func:`tile_rows` rows
    × ⌈H / U⌉ units, with the widest power-of-two block of units within :data:`V3_COLS`
    columns that gives at least :data:`V3_MIN_TILES` tiles (else the narrowest: 4 columns)."""
    cpu = tile_columns(cell=cell, direction=direction)
    row_tiles = -(-max(N, 1) // tile_rows(N))
    width = V3_COLS // cpu
    narrowest = max(1, 4 // cpu)
    while width > narrowest and D * row_tiles * -(-H // width) < V3_MIN_TILES:
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
    setting, source = _setting(RECURRENCE, "RECURRENCE", RECURRENCE_ENV, _GRIDS)
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
        if STEPS_MIN_WORK is not None and work >= STEPS_MIN_WORK and one_step:
            return _v3(shape, f"auto, v3: a step's product is D·N·G·H² = {work} >= "
                              f"{STEPS_MIN_WORK} multiply-adds", cell=cell, direction=direction,
                       D=D, N=N, H=H)
        low, high = V2_H.get((cell, direction)) or (1, 0)
        if low <= H <= high and D * N <= V2_MAX_ROWS and one_step:
            kernel, clause = v2_entry(cell=cell, direction=direction, H=H, peephole=peephole,
                                      reset_after=reset_after)
            why = f"auto, v2: {low} <= H <= {high} and D·N = {D * N} <= {V2_MAX_ROWS}"
            if kernel is not None and kernel not in declined:
                return Choice("v2", kernel, f"{shape}: {why}, {clause}")
            if kernel is not None:
                shape = f"{shape}: {why}, but {kernel} declined this device's threadgroups"
    packed_groups = -(-D * N * H // 1024)
    if H <= ROWS_MAX_H and packed_groups < ROWS_MIN_GROUPS and D * N > packed_groups:
        return Choice("rows", v1, f"{shape}: v1, H <= {ROWS_MAX_H} and packing leaves "
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


def _setting(value, attribute: str, env: str, choices) -> tuple:
    """(setting, where it came from): the module setting ``value`` (this module's
    ``attribute``) unless it is None, else ``$env``, else auto; a ValueError naming where it
    came from when it is not one of ``choices``."""
    if value is not None:
        source = f"rnngrad.backends.metal.versions.{attribute}"
    else:
        value, source = os.environ.get(env, "").strip() or "auto", env
    setting = str(value).strip().lower()
    if setting not in choices:
        raise ValueError(f"{source}: expected one of {', '.join(choices)}, got {value!r}")
    return setting, source


def gemm_setting() -> tuple:
    """(setting, where it came from): :data:`GEMM`, else ``$RNNGRAD_METAL_GEMM``, else auto."""
    return _setting(GEMM, "GEMM", GEMM_ENV, _SETTINGS)


def gemm(*, batch: int, M: int, P: int, K: int, product: str = "", has_bias: bool = False,
         block: int | None = None, b_block: int = 0) -> Choice:
    """The version that runs C[batch, M, P] = A·B over K (``has_bias``: + bias; ``block``,
    ``b_block``: GRU's row blocks, as GemmParams), and why. ``product`` names it in the reason
    (for example "input weight gradient"). The rule: untiled (:func:`_untiled`) where a side is
    below :data:`TILED_MIN_SIDE` or the work below :data:`TILED_MIN_WORK`; where C has fewer
    than :data:`TILED_MIN_TILES` 32×32 tiles, v5 over slices of K if it splits, else untiled;
    else v5 where it gives :data:`WIDE_MIN_GROUPS` threadgroups, else v3."""
    setting, source = gemm_setting()
    shape = f"batch={batch}, M={M}, P={P}, K={K}"
    what = f"{product} ({shape})" if product else shape
    if setting != "auto":
        return Choice(setting, GEMM_KERNELS[setting], f"{what}: forced by {source}={setting}")
    work = batch * M * P * K
    side = min(M, P, K)
    if side < TILED_MIN_SIDE:
        name = "M" if M == side else ("P" if P == side else "K")
        kind = " (a reduction to one row)" if M == 1 else ""
        return _untiled(f"{what}: auto, {name}={side} < {TILED_MIN_SIDE}{kind}: a tile would be "
                        f"mostly padding", batch * M * P, K)
    if work < TILED_MIN_WORK:
        return _untiled(f"{what}: auto, batch·M·P·K = {work} < {TILED_MIN_WORK}: too small to "
                        f"tile", batch * M * P, K)
    tiles = batch * -(-M // TILE) * -(-P // TILE)
    rows = dict(batch=batch, M=M, P=P, block=block or max(M, 1), b_block=b_block)
    wide = gemm_tiles(**rows, tile=WIDE_TILE)
    slices = wide_slices(**rows, K=K, has_bias=has_bias)[0]
    split = f" over {slices} slices of K" if slices > 1 else ""
    if tiles < TILED_MIN_TILES:
        why = (f"{what}: auto, {tiles} 32x32 tiles of C < {TILED_MIN_TILES}: too few "
               f"threadgroups for a K of {K}")
        if slices > 1 and not _splits_rows(batch * M * P, K):
            return Choice("v5", GEMM_KERNELS["v5"], f"{why}; v5: {wide} 128x128 tile(s){split}")
        return _untiled(why, batch * M * P, K)
    reason = (f"{what}: auto, batch·M·P·K = {work} >= {TILED_MIN_WORK}, M, P, K >= "
              f"{TILED_MIN_SIDE} and {tiles} 32x32 tiles: tiled")
    if wide * slices >= WIDE_MIN_GROUPS:
        return Choice("v5", GEMM_KERNELS["v5"], f"{reason}, v5: {wide} 128x128 tile(s){split}, "
                                                f"{wide * slices} threadgroups >= {WIDE_MIN_GROUPS}")
    return Choice("v3", GEMM_KERNELS["v3"], f"{reason}, v3: {wide * slices} 128x128 "
                                            f"threadgroup(s) < {WIDE_MIN_GROUPS}")


def _splits_rows(elements: int, K: int) -> bool:
    """Whether v4 takes an untiled product of ``elements`` elements over ``K``: fewer than
    :data:`SPLIT_MAX_ELEMENTS` (where v1's thread an element would leave most cores idle) over
    a K of at least :data:`SPLIT_MIN_K`."""
    return elements < SPLIT_MAX_ELEMENTS and K >= SPLIT_MIN_K


def _untiled(reason: str, elements: int, K: int) -> Choice:
    """An untiled product: v4 where :func:`_splits_rows`, else v1."""
    if _splits_rows(elements, K):
        return Choice("v4", GEMM_KERNELS["v4"],
                      f"{reason}; {elements} element(s) < {SPLIT_MAX_ELEMENTS} over K = {K} >= "
                      f"{SPLIT_MIN_K}: v4, K split over {SPLIT_THREADS // SPLIT_COLUMNS} slices")
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
    :data:`WIDE_SPLIT_TILES` tiles and no bias; then enough slices for that many threadgroups,
    each at least :data:`WIDE_MIN_SLICE` k (a multiple of :data:`WIDE_K`)."""
    tiles = gemm_tiles(batch=batch, M=M, P=P, block=block, b_block=b_block, tile=WIDE_TILE)
    if has_bias or tiles >= WIDE_SPLIT_TILES:
        return 1, 0
    slices = min(-(-WIDE_SPLIT_TILES // max(tiles, 1)), K // WIDE_MIN_SLICE)
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


@contextlib.contextmanager
def forced(version: str | None):
    """Set :data:`GEMM` to ``version`` inside the block."""
    global GEMM
    if version is not None and str(version).strip().lower() not in _SETTINGS:
        raise ValueError(f"forced: expected one of {', '.join(_SETTINGS)} or None, "
                         f"got {version!r}")
    previous, GEMM = GEMM, version
    try:
        yield
    finally:
        GEMM = previous


#: every setting of this module the rules read (its upper-case names that are not functions)
_KNOBS = tuple(name for name, value in list(globals().items())
               if name.isupper() and not callable(value) and not name.startswith("_")
               and name != "V2_ENTRIES")
_KNOB_VALUES = operator.itemgetter(*_KNOBS)


def settings() -> tuple:
    """Everything the rules read besides the sizes, as one hashable value (a dict as its
    items): the two environment variables and this module's upper-case settings. The host keeps
    an op's plan per value, so that changing any of them takes effect on the next call; where
    one is unhashable (a list), the host keys the plan by its repr."""
    values = _KNOB_VALUES(globals())
    if dict in map(type, values):
        values = tuple([tuple(value.items()) if type(value) is dict else value
                        for value in values])
    return os.environ.get(GEMM_ENV), os.environ.get(RECURRENCE_ENV), values
