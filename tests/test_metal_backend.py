"""The Metal kernels, run through the CPU execution harness ("metal-emulated"), against the
float64 reference: every cell, option and optional input, boundary sizes, an adversarial
schedule with a forced threadgroup size of 64, mixed pipelines, NaN, and the number of
dispatches per op (which must not grow with T); every test that runs a recurrence runs both of
its versions, v1 and v2. Also the kernel files' own contracts: parameter
structs against their NumPy mirrors, buffer tables against signatures and launchers.
"""

from __future__ import annotations

import dataclasses
import re
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rnngrad import registry
from rnngrad.testing.cases import CELLS, random_case, random_descriptor
from rnngrad.descriptors import Activation
from rnngrad.backends.metal import library, versions
from rnngrad.backends.metal.host import EMULATED_BACKEND, emulated_device
from rnngrad.testing import check_case
from draws import ALL_OPTIONAL, conditioned

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")
both_versions = pytest.mark.usefixtures("recurrence_version")

BACKEND = "metal-emulated"
HARSH = dict(schedule="adversarial", seed=7, max_threads_per_threadgroup=64)
NO_OPTIONAL = {k: False for k in ALL_OPTIONAL}


def assert_matches(case, gradients, forward_backend=None, backend=BACKEND):
    ratio, mismatches = check_case(case, backend, gradients, forward_backend=forward_backend)
    assert not mismatches, (
        f"{backend} {'gradients' if gradients else 'forward'} (forward by "
        f"{forward_backend or backend}) differs from the reference:\n"
        + "\n".join(map(str, mismatches[:5])) + f"\nreproduce with:\n{case!r}")


def check_both(case, **device):
    with emulated_device(**(device or HARSH)):
        assert_matches(case, False)
        assert_matches(case, True)


# -- the kernel files' contracts ----------------------------------------------------------------

@pytest.mark.parametrize("struct, mirror", [("RecurrenceParams", library.RECURRENCE_PARAMS),
                                            ("GemmParams", library.GEMM_PARAMS)])
def test_params_struct_matches_numpy_mirror(struct, mirror):
    fields = library.struct_fields(library.read(library.HEADER), struct)
    assert [name for _, name in fields] == list(mirror.names)
    assert {ctype for ctype, _ in fields} == {"uint"}, "every field must be a 4-byte uint"
    assert mirror.itemsize == 4 * len(fields)
    assert [mirror.fields[n][1] for n in mirror.names] == [4 * i for i in range(len(fields))]


def test_buffer_tables_match_signatures_and_launchers():
    seen = set()
    for name in library.KERNEL_FILES:
        text = library.read(name)
        assert text.startswith("// " + name), f"{name}: must open with its own name"
        assert "Kernel versions" in text and re.search(r"//\s+v1 ", text), \
            f"{name}: must list its kernel versions"
        for kernel, params in library.signatures(text).items():
            seen.add(kernel)
            buffers = [(n, a) for n, a in params if a.startswith("buffer")]
            assert [a for _, a in buffers] == [f"buffer({i})" for i in range(len(buffers))], \
                f"{kernel}: buffers must be bound at 0..k-1 in parameter order"
            assert tuple(n for n, _ in buffers) == library.BUFFERS[kernel], kernel
            # a table may serve two entry points: "Buffers of k and k_512 (...)"
            table = re.search(r"Buffers of (?:\w+ and )?" + kernel + r"\b.*?\n((?://[^\n]*\n)+)",
                              text)
            assert table, f"{name}: no buffer table for {kernel}"
            rows = re.findall(r"//\s+(\d+)\s+.*?\s(\w+)\s{2,}", table.group(1))
            assert [(int(i), n) for i, n in rows] == list(enumerate(library.BUFFERS[kernel])), \
                f"{kernel}: the buffer table does not match the signature"
            assert len(buffers) <= 31
    assert seen == set(library.BUFFERS)


def test_sources_follow_metalcompute_rules():
    for name in (library.HEADER,) + library.KERNEL_FILES:
        code = re.sub(r"//[^\n]*", "", library.read(name))
        assert "#include <metal_stdlib>" in code or name != library.HEADER
        assert not re.search(r"\bdouble\b", code), f"{name}: Metal has no double"
        assert "atomic" not in code, f"{name}: no float atomics in MSL 2.3"
        assert not re.search(r"\bfast::", code), f"{name}: use precise:: math where it saturates"
        rest = code.replace("precise::tanh", "").replace("precise::exp", "")
        assert not re.search(r"\b(tanh|exp)\s*\(", rest), f"{name}: tanh and exp must be precise::"


def test_registry_view():
    rows = {name: (ok, auto, why) for name, ok, auto, why in registry.status()}
    assert rows["metal-emulated"][0] and not rows["metal-emulated"][1]
    try:
        import metalcompute  # noqa: F401
    except ImportError:
        assert not rows["metal"][0] and "metalcompute" in rows["metal"][2]
    case = random_case(0, "gru", T=2, N=2, H=2, dtype=np.float64)
    with pytest.raises(TypeError, match="float32"):
        case.forward(backend=BACKEND)


# -- every option and optional input --------------------------------------------------------------

def _variants(cell):
    """One descriptor per boolean option set, and per value of every activation field."""
    base = type(random_descriptor(np.random.default_rng(0), cell))()
    out = []
    for f in dataclasses.fields(base):
        if isinstance(getattr(base, f.name), Activation):
            out += [{f.name: a} for a in Activation]
        else:
            out.append({f.name: True})
    out.append({"bidirectional": True, "reverse": True, "training": True})
    return out


@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_every_descriptor_option(cell):
    for i, options in enumerate(_variants(cell)):
        rng = np.random.default_rng(100 + i)
        desc = random_descriptor(rng, cell, **options)
        case = random_case(rng, cell, descriptor=desc, T=3, N=2, H=3, I=2, dtype=np.float32,
                           optional=ALL_OPTIONAL if i % 2 else None)
        check_both(case, **dict(HARSH, seed=i))


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("optional", [ALL_OPTIONAL, NO_OPTIONAL, dict(ALL_OPTIONAL, mask_per_step=True),
                                      dict(NO_OPTIONAL, mask=True, mask_per_step=False)],
                         ids=["all", "none", "mask-per-step", "mask-every-step"])
@both_versions
@pytest.mark.parametrize("bidirectional", [False, True])
def test_optional_inputs(cell, optional, bidirectional):
    rng = np.random.default_rng(zlib.crc32(repr((cell, bidirectional, optional)).encode()))
    desc = random_descriptor(rng, cell, bidirectional=bidirectional)
    forms = ["per_step", "final"] if cell == "lstm" and optional.get("cell_gradient") else [None]
    for form in forms:
        case = random_case(rng, cell, descriptor=desc, T=4, N=3, H=5, I=3, dtype=np.float32,
                           optional=optional, cell_gradient_form=form)
        check_both(case)


@settings(max_examples=30, deadline=None,  # the version is fixed for all examples
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), cell=st.sampled_from(CELLS),
       schedule=st.sampled_from(["lanes", "reverse", "adversarial"]),
       threads=st.sampled_from([32, 64, 1024]))
@both_versions
def test_random_problems(seed, cell, schedule, threads):
    case = conditioned(random_case(seed, cell, dtype=np.float32, max_size=6))
    check_both(case, schedule=schedule, seed=seed, max_threads_per_threadgroup=threads)


# -- sizes ----------------------------------------------------------------------------------------

@both_versions
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("N, H", [(1, 31), (31, 1), (32, 2), (2, 32), (33, 3), (3, 33)])
def test_boundary_sizes(cell, N, H):
    rng = np.random.default_rng(N * 100 + H)
    desc = random_descriptor(rng, cell, bidirectional=bool(N % 2))
    case = random_case(rng, cell, descriptor=desc, T=2, N=N, H=H, I=3, dtype=np.float32)
    check_both(case)


@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_more_than_1024_threads(cell):
    """D·N·H = 2·17·33 = 1122 threads: several threadgroups even at the default size of 1024."""
    rng = np.random.default_rng(5)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True)
    case = random_case(rng, cell, descriptor=desc, T=2, N=17, H=33, I=4, dtype=np.float32,
                       optional=ALL_OPTIONAL)
    for device in (HARSH, dict(schedule="lanes")):
        check_both(case, **device)
        with emulated_device(**device) as dev:
            case.forward(backend=BACKEND)
            assert any(d.threadgroups > 1 for d in dev.trace if "_forward" in d.kernel)


@both_versions
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("T, N", [(0, 3), (3, 0), (1, 1)])
def test_empty_and_single(cell, T, N):
    rng = np.random.default_rng(T * 10 + N)
    desc = random_descriptor(rng, cell)
    case = random_case(rng, cell, descriptor=desc, T=T, N=N, H=2, I=2, dtype=np.float32,
                       optional=ALL_OPTIONAL, cell_gradient_form="final")
    check_both(case)


# -- pipelines, NaN, saturation ------------------------------------------------------------------

@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_mixed_pipelines(cell):
    """z_state (and h, c) of either backend feeds the other's gradients."""
    rng = np.random.default_rng(11)
    for bidirectional in (False, True):
        desc = random_descriptor(rng, cell, bidirectional=bidirectional)
        case = random_case(rng, cell, descriptor=desc, T=4, N=3, H=4, I=2, dtype=np.float32)
        with emulated_device(**HARSH):
            assert_matches(case, True, forward_backend="reference")
            assert_matches(case, True, forward_backend=BACKEND, backend="reference")


@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_nan_stays_in_its_row(cell):
    rng = np.random.default_rng(3)
    for act in (Activation.RELU, Activation.SIGMOID, Activation.HARD_SIGMOID):
        field = {"single_gate": "activation", "gru": "update_gate_activation",
                 "lstm": "input_gate_activation"}[cell]
        desc = random_descriptor(rng, cell, **{field: act})
        case = random_case(rng, cell, descriptor=desc, T=4, N=3, H=3, I=2, dtype=np.float32,
                           optional=dict(input_weight=False))
        case.inputs["source"][1, 1, 0] = np.nan
        case.source_gradient[2, 2, 0] = np.nan
        check_both(case)
        got = case.forward(backend=BACKEND).state
        assert np.isnan(got).any() and not np.isnan(got[:, 0]).any()


@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_saturated_activations(cell):
    """Pre-activations of ±100s: tanh and sigmoid must saturate, not overflow to NaN."""
    rng = np.random.default_rng(4)
    desc = random_descriptor(rng, cell)
    case = random_case(rng, cell, descriptor=desc, T=3, N=2, H=3, I=2, dtype=np.float32,
                       optional=dict(input_weight=False))
    case.inputs["source"] *= 300
    check_both(case)


# -- dispatches -----------------------------------------------------------------------------------

@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_dispatch_count_does_not_grow_with_T(cell, recurrence_version):
    """v1 and v2: the same dispatches at T = 1 and T = 1000, at most 8 (a product may take
    another version at T = 1000: v4 for a bias gradient over 1000 rows). v3 (one dispatch a
    step): T forward and T + 1 backward recurrence dispatches, the rest the same."""
    counts = {}
    desc = random_descriptor(np.random.default_rng(0), cell, bidirectional=True)
    steps = recurrence_version == "v3" and (cell != "gru" or desc.reset_after)
    for T in (1, 1000):
        case = random_case(1, cell, descriptor=desc, T=T, N=1, H=2, I=2, dtype=np.float32,
                           optional=ALL_OPTIONAL)
        with emulated_device() as dev:
            assert_matches(case, True)  # a training forward, then the gradients
            kernels = ["a product" if d.kernel.startswith("strided_gemm") else d.kernel
                       for d in dev.trace]
        if steps:
            assert kernels.count(f"{cell}_forward_v3") == T
            assert kernels.count(f"{cell}_backward_v3") == T + 1
            kernels = [k for k in kernels if not k.endswith("_v3")]
        counts[T] = kernels
    assert counts[1] == counts[1000]
    assert len(counts[1000]) <= 8, counts[1000]


# -- v2's chunks ----------------------------------------------------------------------------------

def force_v2_entry(monkeypatch, cell: str, entry: int) -> str:
    """Every v2 forward on its entry point of ``entry`` threads a threadgroup (1024 or 512:
    ``<cell>_forward_v2_512`` at any H) rather than the rule's; the forward kernel of ``cell``."""
    monkeypatch.setattr(versions, "V2_512_H", {c: 10 ** 6 for c in CELLS} if entry == 512 else None)
    return f"{cell}_forward_v2" + ("_512" if entry == 512 else "")


@pytest.mark.parametrize("entry", [1024, 512])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("N, H, threads", [(11, 3, 1024), (11, 40, 32), (5, 7, 1024)])
def test_v2_chunks_passes_and_directions(cell, N, H, threads, entry, monkeypatch):
    """Eight rows a threadgroup asked for (the rule asks for one). Bidirectional, N = 11 at 1024
    threads: 22 rows over 3 threadgroups of 8, 8 and 6 rows, the second's in a chunk of 3 rows
    of one direction and 5 of the other; H = 40 in threadgroups of 32 needs two passes of
    units (one lane a unit, the second pass 8 units short); H = 7 at 1024 threads: 8 lanes a
    unit (RG_LANES), the SIMD-groups past the 7 units skipping the pass. Chunks of eight rows
    take the kernels' B = RG_BMAX bodies. Against the reference, adversarial schedule. The
    forwards on either entry point (``entry``: threadgroups of up to 1024 or 512 threads)."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    monkeypatch.setattr(versions, "V2_GROUP_ROWS", 8)
    forward = force_v2_entry(monkeypatch, cell, entry)
    rng = np.random.default_rng(N * H + threads)
    case, device = checked_case(rng, cell, T=3, N=N, H=H, threads=threads)
    with emulated_device(**device) as dev:
        case.gradients(backend=BACKEND)
    recurrences = [d for d in dev.trace if not d.kernel.startswith("strided")]
    assert {d.kernel for d in recurrences} == {forward, f"{cell}_backward_v2"}
    groups = {d.kernel: -(-2 * N // min(8, versions.v2_rows(
        cell=cell, direction="forward" if d.kernel == forward else "backward", H=H)))
        for d in recurrences}
    assert {(d.kernel, d.count) for d in recurrences} == {
        (forward, groups[forward] * entry),
        (f"{cell}_backward_v2", groups[f"{cell}_backward_v2"] * 1024)}


@pytest.mark.parametrize("entry", [1024, 512])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("N, H, threads", [(3, 8, 1024), (2, 70, 1024), (3, 12, 32), (2, 5, 64),
                                            (2, 40, 32), (2, 32, 32), (1, 96, 1024),
                                            (1, 400, 1024), (1, 16, 64), (1, 128, 1024)])
def test_v2_one_row_a_threadgroup(cell, N, H, threads, entry, monkeypatch):
    """v2 as the rule runs it, a threadgroup of 1024 asked for per row, against the reference:
    bidirectional, every optional input, adversarial schedule (the GRU with and without
    reset_after). H = 8 and 12 (K, the stage's pitch and every weight offset multiples of 4)
    take rg_dots' float4 reads, H = 70 and 5 its scalar ones; 32 threads for 12 units leave 2
    lanes a unit (two float4 blocks a lane over the forward's K = 12), 64 threads for 5 units
    8; at 1024 threads 8 lanes a unit (RG_LANES), the SIMD-groups past the units skipping the
    product. Where one pass of the threads covers every unit (all but H = 40 at 32 threads:
    one lane a unit, two passes) the kernels run their one-row bodies (rg_one_pass), with the
    weights held in registers at H = 8 and 12 (the LSTM's never) and the GRU's only with
    reset_after; else the chunked bodies with B = 1. H = 32 at 32 threads (one lane a unit) holds
    only the first two float4 of each thread's share of a weight row and reads the rest at every
    step (rg_row_dot_held: the single gate's products, the GRU's backward). H = 16 at 64 threads
    (4 lanes a unit) and H = 32 at 32 (one) have every thread a unit's: the LSTM's forward then
    runs its body with no per-step test of which (lstm_forward_v2_row's FULL), and the GRU's
    backward (both) and the single gate's (H = 32) give 2S lanes two units (rg_pairs). The LSTM's and the
    GRU's backwards find the next step's activations ahead of phase A (lstm_backward_ahead,
    gru_backward_ahead) at H = 8, 70 and 5, where their stage has room and enough threads can find
    them, an item each (at H = 5 the LSTM's items wrap round to the product's threads); H = 400
    (2 lanes a unit), 12 and 32 at 32 threads have phase A find them.

    Each forward runs on either entry point (``entry``): ``<cell>_forward_v2`` (threadgroups of
    up to 1024) or ``<cell>_forward_v2_512`` (up to 512: at 1024 threads asked for, 4 lanes a
    unit at H = 70 and 96, one at H = 400). The GRU's 512-thread entry holds each of its three
    weight rows whole where two float4 a lane do not cover them (RG_HOLD_512): H = 96 at 512
    threads (4 lanes a unit, the last of each lane's 8 float4 past the row's end; there its
    cell runs on the product's lanes, one barrier a step: gru_forward_v2_spread) and H = 32 at
    32 threads; its 1024-thread entry reads them from memory at H = 96."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    monkeypatch.setattr(versions, "V2_GROUP_ROWS", 1)
    forward = force_v2_entry(monkeypatch, cell, entry)
    for reset_after in ((True, False) if cell == "gru" else (None,)):
        fixed = {} if reset_after is None else dict(reset_after=reset_after)
        rng = np.random.default_rng(N * H + threads + 4)
        case, device = checked_case(rng, cell, T=3, N=N, H=H, threads=threads, **fixed)
        with emulated_device(**device) as dev:
            case.gradients(backend=BACKEND)
        recurrences = [d for d in dev.trace if not d.kernel.startswith("strided")]
        # the backwards at H = 128 on their 512-thread entry (V2_512_BACKWARD_H)
        low, high = versions.V2_512_BACKWARD_H.get(cell, (1, 0))
        backward, group = ((f"{cell}_backward_v2_512", 512) if low <= H <= high
                           else (f"{cell}_backward_v2", 1024))
        assert {d.kernel for d in recurrences} == {forward, backward}
        assert {(d.kernel, d.count) for d in recurrences} == {
            (forward, 2 * N * entry), (backward, 2 * N * group)}
        assert {(d.kernel, d.threadgroup_size) for d in recurrences} == {
            (forward, min(entry, threads)), (backward, min(group, threads))}


@pytest.mark.parametrize("entry", [1024, 512])
@pytest.mark.parametrize("H, threads", [(16, 64), (8, 1024), (32, 32)])
def test_v2_lstm_one_row_without_peephole(H, threads, entry, monkeypatch):
    """The LSTM's one-row bodies with every optional input but the peephole, which the backward's
    then runs compiled without (lstm_backward_v2_row's PEEP), against the reference: H = 8 at
    1024 threads finds the next step's activations ahead of phase A (AHEAD), H = 16 at 64 and
    H = 32 at 32 in phase A; at H = 16 and 32 every thread is a unit's (the forward's FULL
    body, with 4 lanes a unit at H = 16 its cell on the product's lanes)."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    monkeypatch.setattr(versions, "V2_GROUP_ROWS", 1)
    forward = force_v2_entry(monkeypatch, "lstm", entry)
    rng = np.random.default_rng(H + threads)
    case, device = checked_case(rng, "lstm", T=4, N=2, H=H, threads=threads,
                                optional={**ALL_OPTIONAL, "peephole": False})
    assert "peephole" not in case.inputs and "mask" in case.inputs
    with emulated_device(**device) as dev:
        case.gradients(backend=BACKEND)
    assert {d.kernel for d in dev.trace if not d.kernel.startswith("strided")} == {
        forward, "lstm_backward_v2"}


@pytest.mark.parametrize("H, threads", [(128, 512), (64, 256), (32, 128), (16, 64)])
def test_v2_lstm_forward_held_rounds_give_the_streamed_bits(H, threads, monkeypatch):
    """The LSTM forward's 512-thread entry where every thread is a unit's with 4 lanes a unit:
    its threads hold the first RG_LSTM_HOLD_512 float4 of their share of each of the four rows
    of R across steps (H = 128: 4 of the 8 rounds, the rest read at every step; H = 64: all 4),
    or the rows whole in 2 where 2 cover them (H = 32 and 16). Checked against the reference
    (bidirectional, every optional input, adversarial schedule), and bitwise against the
    1024-thread entry's body at the same threadgroup size, which reads every round at every
    step: the held rounds are summed first, in the same order."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    monkeypatch.setattr(versions, "V2_GROUP_ROWS", 1)
    rng = np.random.default_rng(H + 5)
    case, device = checked_case(rng, "lstm", T=3, N=2, H=H, threads=threads)
    results = {}
    for entry in (512, 1024):
        forward = force_v2_entry(monkeypatch, "lstm", entry)
        with emulated_device(**device) as dev:
            outputs = case.training_forward(backend=BACKEND)
        assert {(d.kernel, d.threadgroup_size) for d in dev.trace
                if not d.kernel.startswith("strided")} == {(forward, threads)}
        results[entry] = [np.asarray(a) for a in outputs if a is not None]
    assert len(results[512]) == len(results[1024]) >= 3  # y, cell output, z_state
    for held, streamed in zip(results[512], results[1024]):
        assert np.array_equal(held, streamed, equal_nan=True)


def checked_case(rng, cell, T, N, H, threads, optional=ALL_OPTIONAL, **fixed):
    """A bidirectional training case with every optional input (or those ``optional`` gives;
    descriptor options ``fixed``), checked forward and gradients against the reference under
    the adversarial schedule at ``threads`` threads a threadgroup; (case, the device's
    settings)."""
    desc = random_descriptor(rng, cell, bidirectional=True, training=True, **fixed)
    case = random_case(rng, cell, descriptor=desc, T=T, N=N, H=H, I=3, dtype=np.float32,
                       optional=optional, cell_gradient_form="per_step")
    device = dict(schedule="adversarial", seed=N + H, max_threads_per_threadgroup=threads)
    check_both(case, **device)
    return case, device


def one_step_runs(rng, cell, T, N, H, threads):
    """For each descriptor a one-step grid test runs (a GRU both with and without reset_after,
    which has no one-step grid): checks forward and gradients against the reference,
    bidirectional, every optional input, adversarial schedule; yields (reset_after, forward
    recurrence dispatches, backward ones), reset_after None for the other cells."""
    for reset_after in ((True, False) if cell == "gru" else (None,)):
        fixed = {} if reset_after is None else dict(reset_after=reset_after)
        case, device = checked_case(rng, cell, T, N, H, threads, **fixed)
        with emulated_device(**device) as dev:
            case.training_forward(backend=BACKEND)
            forward = [d for d in dev.trace if not d.kernel.startswith("strided")]
            dev.trace.clear()
            case.gradients(BACKEND, forward_backend="reference")
            backward = [d for d in dev.trace if not d.kernel.startswith("strided")]
        yield reset_after, forward, backward


# -- v2's one-step grid (v2-steps) ----------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("N, H, units, rows, threads", [
    (3, 20, 8, 2, 64),     # H = 20 in 3 blocks of 7, 7 and 6 units; 6 rows in groups of 2
    (5, 9, 4, 8, 1024),    # 3 blocks of 4, 4 and 1 unit, 32 lanes a unit; whole chunks
    (2, 33, 128, 1, 32),   # one block (U = 1) at 32 threads: two passes of units
])
def test_v2_steps_blocks_of_units_one_step_a_dispatch(cell, N, H, units, rows, threads,
                                                      monkeypatch):
    """Threadgroups over groups of rows × blocks of units, one dispatch a step (the backward's
    last dispatch its carry alone); bidirectional, every optional input, against the reference
    under the adversarial schedule. A GRU without reset_after has no one-step grid: the rule's
    v2 runs."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2-steps")
    monkeypatch.setattr(versions, "V2_STEP_UNITS", units)
    monkeypatch.setattr(versions, "V2_STEP_ROWS", rows)
    rng = np.random.default_rng(N * H + units)
    T = 4
    for reset_after, forward, backward in one_step_runs(rng, cell, T, N, H, threads):
        v2 = "" if reset_after is False else "_v2"
        assert {d.kernel for d in forward} == {f"{cell}_forward{v2}"}
        assert {d.kernel for d in backward} == {f"{cell}_backward{v2}"}
        for direction, runs, steps in (("forward", forward, T), ("backward", backward, T + 1)):
            if reset_after is False:
                assert len(runs) == 1 and runs[0].count == 2 * N * H  # the rule's v1, packed
                continue
            chunk = versions.v2_rows(cell=cell, direction=direction, H=H)
            groups = -(-2 * N // min(rows, chunk)) * -(-H // units)
            assert len(runs) == steps  # a dispatch a step (and the backward's last carry)
            assert {d.count for d in runs} == {groups * 1024}
            assert {d.threadgroups for d in runs} == {groups * (1024 // threads)}


@pytest.mark.parametrize("cell", CELLS)
def test_v2_steps_with_one_block_gives_bitwise_v2s_results(cell, monkeypatch):
    """With one block of units and v2's rows a threadgroup, the one-step grid does v2's work in
    v2's order, the backward's dA·R moved to the next dispatch: the same bits, every option."""
    rng = np.random.default_rng(31)
    extra = dict(reset_after=True) if cell == "gru" else {}
    desc = random_descriptor(rng, cell, bidirectional=True, training=True, **extra)
    case = random_case(rng, cell, descriptor=desc, T=5, N=5, H=12, I=4, dtype=np.float32,
                       optional=ALL_OPTIONAL, cell_gradient_form="per_step")
    monkeypatch.setattr(versions, "V2_GROUP_ROWS", 3)
    monkeypatch.setattr(versions, "V2_STEP_ROWS", 3)
    monkeypatch.setattr(versions, "V2_STEP_UNITS", 12)
    results, kernels = [], []
    for setting in ("v2", "v2-steps"):
        monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", setting)
        with emulated_device(schedule="adversarial", seed=3, max_threads_per_threadgroup=64) as dev:
            forward = case.forward(backend=BACKEND)
            gradients = case.gradients(BACKEND)
        results.append([np.asarray(a) for a in list(forward) + list(gradients) if a is not None])
        kernels.append(sum(not d.kernel.startswith("strided") for d in dev.trace))
    assert kernels[1] > kernels[0]  # the one-step grid ran: a dispatch a step
    for v2, steps in zip(*results):
        assert np.array_equal(v2, steps, equal_nan=True)


def test_v2_steps_choice_and_its_limits(monkeypatch):
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2-steps")
    monkeypatch.setattr(versions, "V2_STEP_UNITS", 128)
    monkeypatch.setattr(versions, "V2_STEP_ROWS", None)
    choice = versions.recurrence(cell="lstm", direction="forward", D=1, N=64, H=512)
    assert (choice.version, choice.kernel) == ("v2-steps", "lstm_forward_v2")
    assert "8 row(s) × 4 block(s) of units" in choice.reason  # 6144 // 512 = 12, at most 8
    assert versions.recurrence_count(choice, cell="lstm", direction="forward", D=1, N=64,
                                     H=512) == 8 * 4 * 1024
    back = versions.recurrence(cell="lstm", direction="backward", D=1, N=64, H=256)
    assert (back.version, back.kernel) == ("v2-steps", "lstm_backward_v2")
    assert "6 row(s) × 2 block(s)" in back.reason  # 6144 // (4·256) = 6 rows a chunk
    # where it does not apply, the rule chooses: v1 in its grid
    gru = versions.recurrence(cell="gru", direction="backward", D=1, N=64, H=256)
    assert (gru.version, gru.kernel) == ("v2-steps", "gru_backward_v2")
    gru_back = versions.recurrence(cell="gru", direction="backward", D=1, N=64, H=256,
                                   reset_after=False)
    assert gru_back.version == "rows"
    assert "a GRU without reset_after needs da_o of every unit within a step, so the rule" in gru_back.reason
    wide = versions.recurrence(cell="gru", direction="backward", D=1, N=64, H=512, reset_after=False)
    assert wide.version == "rows" and wide.kernel == "gru_backward"
    gru = versions.recurrence(cell="gru", direction="forward", D=1, N=4, H=8, reset_after=False)
    assert gru.version == "rows" and "needs r of every unit" in gru.reason
    with pytest.raises(ValueError, match=r"RNNGRAD_METAL_RECURRENCE=v2-steps: lstm_forward, D=1, "
                                         r"N=1, H=7000: one row stages 1·H = 7000 floats"):
        versions.recurrence(cell="lstm", direction="forward", D=1, N=1, H=7000)
    rng = np.random.default_rng(0)
    case = random_case(rng, "lstm", T=3, N=2, H=4, I=3, dtype=np.float32)
    from rnngrad.backends.metal.host import MetalHost
    from rnngrad.validation import forward_problem
    problem = forward_problem("lstm", case.descriptor, **case.inputs)[0]
    with pytest.raises(ValueError, match=r"recurrence_values: 2 unit block\(s\) need at most "
                                         r"one step a dispatch, got steps 0..3"):
        MetalHost.recurrence_values(problem, 1024, (0, 3), 2)


# -- v3's tiles, one step a dispatch ---------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("N, H, min_tiles, threads", [
    (13, 70, 1, 32),     # the widest blocks: 36-56 workers over 32 threads, in two rounds
    (17, 20, 1, 1024),   # two row tiles (16 + 1 rows) a direction; k split over 4 slices
    (5, 9, 128, 64),     # the narrowest blocks: 4 columns a tile, 8 slices of k
])
def test_v3_tiles_one_step_a_dispatch(cell, N, H, min_tiles, threads, monkeypatch):
    """v3 against the reference, bidirectional, every optional input, adversarial schedule: T
    forward dispatches and T + 1 backward ones (the last the carry alone), each of
    versions.tile_blocks' tiles; a GRU without reset_after gets the rule's version."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v3")
    monkeypatch.setattr(versions, "V3_MIN_TILES", min_tiles)
    rng = np.random.default_rng(N * H + min_tiles)
    T = 3
    for reset_after, forward, backward in one_step_runs(rng, cell, T, N, H, threads):
        for direction, runs, steps in (("forward", forward, T), ("backward", backward, T + 1)):
            if reset_after is False:
                assert len(runs) == 1 and not runs[0].kernel.endswith("_v3")  # the rule's
                continue
            row_tiles, blocks = versions.tile_blocks(cell=cell, direction=direction, D=2, N=N,
                                                     H=H)
            assert row_tiles == -(-N // 16)
            assert {d.kernel for d in runs} == {f"{cell}_{direction}_v3"}
            assert len(runs) == steps
            assert {d.count for d in runs} == {2 * row_tiles * blocks * versions.V3_THREADS}


def test_v3_tile_blocks_and_choice():
    """The widest power-of-two block of units within 64 columns that still gives V3_MIN_TILES
    tiles, else the narrowest (4 columns); the choice names the grid."""
    assert versions.tile_blocks(cell="lstm", direction="forward", D=1, N=64, H=512) == (4, 32)
    assert versions.tile_blocks(cell="lstm", direction="backward", D=1, N=64, H=512) == (4, 32)
    assert versions.tile_blocks(cell="single_gate", direction="forward", D=2, N=64, H=512) == (4, 16)
    assert versions.tile_blocks(cell="gru", direction="forward", D=1, N=1, H=64) == (1, 64)
    assert versions.tile_blocks(cell="gru", direction="backward", D=1, N=1, H=64) == (1, 16)
    choice = versions.recurrence(cell="lstm", direction="forward", D=1, N=32, H=256)
    assert choice.version != "v3"  # forced, or by the rule from STEPS_MIN_WORK (2**25; this 2**23)
    import os
    os.environ["RNNGRAD_METAL_RECURRENCE"] = "v3"
    try:
        choice = versions.recurrence(cell="lstm", direction="forward", D=1, N=64, H=512)
        assert (choice.version, choice.kernel) == ("v3", "lstm_forward_v3")
        assert "128 tile(s) of 16 row(s) × 16 unit(s)" in choice.reason
        assert versions.recurrence_count(choice, cell="lstm", direction="forward", D=1, N=64,
                                         H=512) == 128 * 256
        gru = versions.recurrence(cell="gru", direction="forward", D=1, N=4, H=8,
                                  reset_after=False)
        assert gru.version != "v3" and "needs r of every unit" in gru.reason
    finally:
        del os.environ["RNNGRAD_METAL_RECURRENCE"]


@pytest.mark.parametrize("grid, kernel", [("v2-steps", "lstm_backward_v2"),
                                          ("v3", "lstm_backward_v3")])
@pytest.mark.parametrize("which", ["a step", "the last carry"])
def test_a_stopped_v2_steps_dispatch_raises_naming_it(which, grid, kernel, monkeypatch):
    """A backward dispatch of a one-step grid (v2-steps, v3) whose later threadgroups never ran:
    no result, and the error names the dispatch, its step (or the carry alone) and what is
    missing."""
    from rnngrad.backends.metal import IncompleteDispatch

    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", grid)
    monkeypatch.setattr(versions, "V2_STEP_UNITS", 4)
    rng = np.random.default_rng(41)
    case = random_case(rng, "lstm", T=3, N=2, H=8, I=3, dtype=np.float32,
                       descriptor=random_descriptor(rng, "lstm", training=True))
    with emulated_device() as dev:
        case.gradients(BACKEND, forward_backend="reference")
    backward = [i for i, d in enumerate(dev.trace) if d.kernel == kernel]
    assert len(backward) == 4  # T steps, then the carry of step 0
    index = backward[-1] if which == "the last carry" else backward[1]
    groups = dev.trace[index].threadgroups
    with emulated_device(stop=(index, 1)):
        with pytest.raises(IncompleteDispatch) as info:
            case.gradients(BACKEND, forward_backend="reference")
    assert info.value.kernel == kernel and info.value.missing == tuple(range(1, groups))
    where = ("no step, the carry of processing step 0 of T=3" if which == "the last carry"
             else "processing steps [1, 2) of T=3")
    assert where in str(info.value)
