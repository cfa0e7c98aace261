"""rnngrad.backends.metal.versions: the rules that name the entry point of every Metal dispatch,
and their overrides. Pure Python (the kernel sources are read as text, never compiled), so these
run on every machine: that every compiled entry point is reachable by the rule, that each name
says the body its kernel runs, and the rule's choices at the shapes that decide them."""

from __future__ import annotations

import functools
import itertools
import re

import pytest

from rnngrad.backends.metal import library, versions
from rnngrad.backends.metal.msl import translate

CELLS = ("single_gate", "gru", "lstm")
DIRECTIONS = ("forward", "backward")


@pytest.fixture(autouse=True)
def _auto_rule(monkeypatch):
    monkeypatch.delenv(versions.RECURRENCE_ENV, raising=False)
    monkeypatch.delenv(versions.GEMM_ENV, raising=False)


def compiled_entry_points() -> list:
    """Every ``kernel void`` of the library source (its ``instantiate_*`` macros expanded, as the
    C preprocessor would), in source order."""
    return re.findall(r"kernel\s+void\s+(\w+)\s*\(", translate.expand(library.source()))


def reached_by_the_rule() -> dict:
    """{kernel: an example} of every recurrence kernel the auto rule picks on a GPU over every H
    in 1..1099, D·N around every threshold of the rule, each cell's options (GRU reset_after,
    LSTM peephole), and every product kernel over a grid of shapes."""
    seen = {}
    rows = (1, 2, 3, 4, 31, 32, 33, 63, 64, 65, 66, 127, 128, 129, 256, 512, 1024, 2048)
    for cell, direction in itertools.product(CELLS, DIRECTIONS):
        options = ([dict(reset_after=True), dict(reset_after=False)] if cell == "gru" else
                   [dict(peephole=False), dict(peephole=True)] if cell == "lstm" else [{}])
        for H, DN, option in itertools.product(range(1, 1100), rows, options):
            D, N = (2, DN // 2) if DN % 2 == 0 and DN > 1 else (1, DN)
            choice = versions.recurrence(cell=cell, direction=direction, D=D, N=N, H=H,
                                         device="metal", **option)
            seen.setdefault(choice.kernel, (cell, direction, D, N, H, option))
    sides = (1, 7, 8, 64, 128, 256, 512, 2048, 8000, 12800, 100000)
    for batch, M, P, K in itertools.product((1, 2), sides, sides, sides):
        for has_bias in (False, True):
            choice = versions.gemm(batch=batch, M=M, P=P, K=K, has_bias=has_bias)
            seen.setdefault(choice.kernel, (batch, M, P, K, has_bias))
    return seen


def test_every_compiled_entry_point_is_reachable_by_the_rule():
    """No body ships that the rule never runs: the entry points of kernels/ are exactly the
    ones the rule names over the grid (and the rule names none that is not compiled)."""
    compiled = compiled_entry_points()
    assert len(compiled) == len(set(compiled)), "an entry point is defined twice"
    reached = reached_by_the_rule()
    assert set(compiled) - set(reached) == set(), "compiled but reached by no shape"
    assert set(reached) - set(compiled) == set(), "named by the rule but not compiled"
    assert list(library.BUFFERS) == compiled


def test_every_entry_point_has_a_buffer_table_matching_its_signature():
    signatures = library.signatures(library.source())
    for kernel in compiled_entry_points():
        names = [n for n, attr in signatures[kernel] if attr.startswith("buffer(")]
        assert tuple(names) == library.buffers(kernel), kernel
    with pytest.raises(ValueError, match="expected an rnngrad entry point, got 'lstm_sideways'"):
        library.buffers("lstm_sideways")


def test_each_v2_entry_runs_in_the_threadgroup_size_its_name_says():
    """A ``_512`` entry is compiled for threadgroups of at most 512 and asked for 512; the
    others for 1024; each calls the run helper with the same size it declines any other by."""
    text = translate.expand(library.source())  # an instantiate_* macro's expansion is one line
    for kernel in compiled_entry_points():
        if "_v2_" not in kernel:
            continue
        match = re.search(r"\[\[max_total_threads_per_threadgroup\((\w+)\)\]\]\s*kernel void "
                          + kernel + r"\(([^{]*)\{([^\n]*)\n", text)
        limit, body = match.group(1), match.group(3)
        expected = "RG_THREADS_512" if kernel.endswith("_512") else "RG_THREADS"
        assert limit == expected, kernel
        assert re.search(r"_run(<[^>]*>)?\(" + expected + ",", body), kernel
        choice = versions.Choice("v2", kernel, "")
        threads = versions.recurrence_count(choice, cell="lstm", direction="forward", D=1, N=3,
                                            H=64)
        assert threads == 3 * (512 if kernel.endswith("_512") else 1024)


# -- the recurrences ----------------------------------------------------------------------------

def test_recurrence_rule_and_its_grids():
    rule = functools.partial(versions.recurrence, cell="lstm")
    count = functools.partial(versions.recurrence_count, cell="lstm")
    small = rule(direction="forward", D=1, N=8, H=256)
    assert small.version == "v2"
    assert count(small, direction="forward", D=1, N=8, H=256) == 8 * 1024
    held = rule(direction="forward", D=1, N=8, H=128)
    assert count(held, direction="forward", D=1, N=8, H=128) == 8 * 512
    # v3 where a step's product D·N·G·H² reaches steps_min_work, and not below it
    big = rule(direction="backward", D=2, N=64, H=256)
    assert (big.version, big.kernel) == ("v3", "lstm_backward_v3"), big
    work = 2 * 64 * 4 * 256 * 256
    with versions.overrides(steps_min_work=work + 1):
        assert rule(direction="backward", D=2, N=64, H=256).version != "v3"
    with versions.overrides(steps_min_work=None):  # never
        assert rule(direction="backward", D=2, N=64, H=256).version != "v3"
    row_tiles, blocks = versions.tile_blocks(cell="lstm", direction="backward", D=2, N=64, H=256)
    assert count(big, direction="backward", D=2, N=64, H=256) == \
        2 * row_tiles * blocks * versions.V3_THREADS
    # else v1: packed below the range, rows where packing leaves few threadgroups
    v1 = rule(direction="forward", D=1, N=1, H=32)
    assert (v1.version, v1.kernel) == ("packed", "lstm_forward"), v1
    rows = rule(direction="forward", D=2, N=33, H=128)  # D·N = 66 > v2_max_rows
    assert (rows.version, rows.kernel) == ("rows", "lstm_forward")
    assert count(rows, direction="forward", D=2, N=33, H=128) == 66 * 1024
    assert count(v1, direction="forward", D=1, N=1, H=32) == 32
    single = functools.partial(versions.recurrence, cell="single_gate", N=64, H=512)
    assert single(direction="forward", D=1).version == "v2"  # 64·512² = 2**24 < 2**25
    assert single(direction="backward", D=1).version == "rows"  # past v2_h's 256
    assert single(direction="forward", D=2).version == "v3"  # 2·64·512² = 2**25
    # a GRU without reset_after: v1 (r of every unit within a step), even where v3 would run
    gru = functools.partial(versions.recurrence, cell="gru", direction="forward", D=1)
    assert gru(N=8, H=128).version == "v2" and gru(N=8, H=128, reset_after=False).version == "rows"
    assert gru(N=64, H=512).version == "v3" and gru(N=64, H=512, reset_after=False).version == "rows"
    # on the CPU harness auto is v1 packed
    harness = rule(direction="forward", D=1, N=8, H=128, device="metal-emulated")
    assert harness.version == "packed"


def test_recurrence_overrides_and_their_errors(monkeypatch):
    rule = functools.partial(versions.recurrence, cell="lstm", direction="forward", D=1, N=8)
    monkeypatch.setenv(versions.RECURRENCE_ENV, "v1")  # v1 in the grid its rule picks
    v1 = rule(H=128)
    assert (v1.version, v1.kernel) == ("rows", "lstm_forward")
    monkeypatch.setenv(versions.RECURRENCE_ENV, "packed")
    assert rule(H=128).version == "packed"
    monkeypatch.setenv(versions.RECURRENCE_ENV, "v3")
    assert rule(H=4).kernel == "lstm_forward_v3"
    gru = versions.recurrence(cell="gru", direction="forward", D=1, N=8, H=128, reset_after=False)
    assert gru.version == "rows"  # v3 cannot run it: the rule's choice
    monkeypatch.setenv(versions.RECURRENCE_ENV, "v2")  # v2 at any H its bodies fit
    forced = rule(H=16, device="metal-emulated")
    assert forced.kernel == "lstm_forward_v2_spread_512" and "forced by" in forced.reason
    past = versions.recurrence(cell="lstm", direction="backward", D=1, N=1, H=2000)
    assert past.version == "packed"  # no v2 body fits: v1
    gru = versions.recurrence(cell="gru", direction="backward", D=1, N=1, H=64, reset_after=False)
    assert gru.version == "packed"
    with versions.overrides(recurrence="packed"):  # the override wins over the variable
        choice = rule(H=128)
        assert choice.version == "packed" and "forced by overrides(recurrence" in choice.reason
    monkeypatch.setenv(versions.RECURRENCE_ENV, "v2-steps")
    with pytest.raises(ValueError, match="RNNGRAD_METAL_RECURRENCE: expected one of v1, packed, "
                                         "rows, v2, v3, auto, got 'v2-steps'"):
        rule(H=4)


def test_a_declined_entry_runs_v1_in_its_grid():
    """Where a device declined an entry point (its threadgroups of another size), the rule
    names v1 for it, with the reason, and keeps the other entries."""
    choice = versions.recurrence(cell="lstm", direction="forward", D=1, N=8, H=128,
                                 declined=frozenset({"lstm_forward_v2_full_held_512"}))
    assert (choice.version, choice.kernel) == ("rows", "lstm_forward"), choice
    other = versions.recurrence(cell="lstm", direction="backward", D=1, N=8, H=128,
                                declined=frozenset({"lstm_forward_v2_full_held_512"}))
    assert other.kernel == "lstm_backward_v2_paired_512"


# -- the products -------------------------------------------------------------------------------

def test_the_product_rule():
    big = dict(batch=1, M=12800, P=2048, K=512)
    assert versions.gemm(**big).version == "v5"
    dw = versions.gemm(batch=1, M=2048, P=512, K=12800)  # 64 tiles: 5 slices of K
    assert dw.version == "v5"
    d_source = versions.gemm(batch=1, M=8000, P=128, K=512)  # too few threadgroups for v5
    assert d_source.version == "v3"
    bias = versions.gemm(batch=1, M=1, P=2048, K=12800)  # a reduction to one row, long K
    assert (bias.version, bias.kernel) == ("v4", "strided_gemm_split"), bias
    assert versions.gemm(batch=1, M=1, P=32768, K=12800).version == "v1"  # enough threads
    assert versions.gemm(batch=1, M=1, P=2048, K=255).version == "v1"  # too short a K
    assert versions.gemm(batch=1, M=64, P=64, K=64).version == "v1"  # too small to tile
    edge = dict(batch=1, M=32 * 16, P=32 * 8,
                K=versions.rules().tiled_min_work // (32 * 16 * 32 * 8))
    assert versions.gemm(**edge).version == "v3"  # 128 32x32 tiles, 2**20 multiply-adds
    assert versions.gemm(**dict(edge, P=32 * 8 - 1)).version == "v1"
    few = versions.gemm(batch=1, M=512, P=128, K=8000)  # 64 tiles: v5 over slices of K
    assert few.version == "v5", few
    assert versions.gemm(batch=1, M=128, P=128, K=8000).version == "v4"
    assert "input weight gradient (batch=1" in str(versions.gemm(**big, product="input weight gradient"))


def test_product_overrides_and_their_errors(monkeypatch):
    small = dict(batch=1, M=1, P=3, K=2)
    monkeypatch.setenv(versions.GEMM_ENV, "v3")
    choice = versions.gemm(**small)
    assert (choice.version, choice.kernel) == ("v3", "strided_gemm_blocked")
    assert "forced by RNNGRAD_METAL_GEMM=v3" in choice.reason
    with versions.overrides(gemm="v1"):  # the override wins over the variable
        choice = versions.gemm(batch=1, M=4096, P=4096, K=4096)
        assert choice.version == "v1" and "forced by overrides(gemm" in choice.reason
    assert versions.rules() is versions.RULES  # and ends with its block
    monkeypatch.setenv(versions.GEMM_ENV, " AUTO ")
    assert versions.gemm(**small).version == "v1"
    monkeypatch.setenv(versions.GEMM_ENV, "v2")
    with pytest.raises(ValueError, match="RNNGRAD_METAL_GEMM: expected one of v1, v3, v4, v5, "
                                         "auto, got 'v2'"):
        versions.gemm(**small)
    with pytest.raises(ValueError, match="overrides: gemm expected one of v1, v3, v4, v5, auto or "
                                         "None, got 'tiled'"):
        with versions.overrides(gemm="tiled"):
            pass
    with pytest.raises(ValueError, match="overrides: expected fields of Rules .*, got tile_size"):
        with versions.overrides(tile_size=3):
            pass


def test_the_tile_counts_mirror_the_kernels():
    """The host sizes the tiled products' grids by the kernels' own tile constants."""
    text = library.read("gemm.metal")
    enum = dict(re.findall(r"\b(G[BSW]_\w+)\s*=\s*(\d+)", text))
    assert int(enum["GB_TILE"]) == versions.BLOCKED_TILE
    assert (versions.BLOCKED_TILE // int(enum["GB_MICRO"])) ** 2 == versions.BLOCKED_THREADS
    assert (int(enum["GS_COLS"]), int(enum["GS_THREADS"])) == (versions.SPLIT_COLUMNS,
                                                                versions.SPLIT_THREADS)
    for kernel, threads in (("strided_gemm_blocked", versions.BLOCKED_THREADS),
                            ("strided_gemm_split", versions.SPLIT_THREADS),
                            ("strided_gemm_wide", versions.WIDE_THREADS)):
        assert re.search(r"\[\[max_total_threads_per_threadgroup\(" + str(threads)
                         + r"\)\]\]\s*kernel void " + kernel + r"\(", text), kernel
    assert versions.gemm_tiles(batch=2, M=99, P=33, block=33, b_block=0) == 2 * 4 * 2
    assert versions.gemm_tiles(batch=2, M=99, P=33, block=33, b_block=5) == 2 * 3 * 2 * 2
    v4 = versions.Choice("v4", versions.GEMM_KERNELS["v4"], "test")
    assert versions.gemm_threads(v4, batch=2, M=3, P=65, block=3, b_block=0) == 2 * 3 * 3 * 1024
    v3 = versions.Choice("v3", versions.GEMM_KERNELS["v3"], "test")
    assert versions.gemm_threads(v3, batch=2, M=130, P=65, block=65, b_block=7) == 256 * 16
