"""The Metal kernels, run through the CPU execution harness ("metal-emulated"), against the
float64 reference: every cell, option and optional input, boundary sizes, an adversarial
schedule with a forced threadgroup size of 64, mixed pipelines, NaN, and the number of
dispatches per op (which must not grow with T); every test that runs a recurrence runs both of
its versions, v1 and v2. Also the kernel files' own contracts: parameter
structs against their NumPy mirrors, buffer tables against signatures and launchers.
"""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from rnngrad import registry
from rnngrad.testing.cases import CELLS, random_case, random_descriptor
from rnngrad.descriptors import Activation
from rnngrad.backends.metal import library, versions
from rnngrad.backends.metal.backends import EMULATED_BACKEND, EMULATED_HOST
from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal.harness.contexts import emulated_device
from rnngrad.testing import check_case
from draws import ALL_OPTIONAL, conditioned, option_variants

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
    for name in library.HEADERS + library.KERNEL_FILES:
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

@both_versions
@pytest.mark.parametrize("cell", CELLS)
def test_every_descriptor_option(cell):
    for i, options in enumerate(option_variants(cell)):
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


# -- v2: every entry point as the rule runs it ----------------------------------------------------

def v2_shapes() -> dict:
    """{(cell, H, peephole): the v2 entry points the rule runs there, forward and backward} for
    a list of H that, together, reach every v2 entry point (tests/test_metal_versions.py checks
    the rule reaches every compiled one)."""
    shapes = {}
    for cell in CELLS:
        for H in (64, 65, 68, 94, 128, 129, 256):
            for peephole in ((False, True) if cell == "lstm" else (False,)):
                kernels = tuple(versions.recurrence(cell=cell, direction=direction, D=2, N=1, H=H,
                                                    peephole=peephole).kernel
                                for direction in ("forward", "backward"))
                shapes[(cell, H, peephole)] = kernels
    return shapes


V2_SHAPES = v2_shapes()


def test_the_shapes_below_reach_every_v2_entry_point():
    reached = {k for kernels in V2_SHAPES.values() for k in kernels if "_v2_" in k}
    assert reached == {k for k in library.BUFFERS if "_v2_" in k}


@pytest.mark.parametrize("cell, H, peephole", list(V2_SHAPES), ids=lambda v: str(v))
def test_v2_entry_points_match_the_reference(cell, H, peephole, monkeypatch):
    """Each v2 entry point the rule runs at (cell, H), forward and backward, at the threadgroup
    size the rule chose it for: bidirectional, every optional input (the LSTM's peephole as
    given), adversarial schedule, against the float64 reference; the trace names the entry
    points that ran, at that size."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")  # auto is v1 packed on the harness
    optional = {**ALL_OPTIONAL, "peephole": peephole} if cell == "lstm" else ALL_OPTIONAL
    fixed = dict(reset_after=True) if cell == "gru" else {}
    rng = np.random.default_rng(H + 7 * peephole)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True, **fixed)
    case = random_case(rng, cell, descriptor=desc, T=3, N=1, H=H, I=3, dtype=np.float32,
                       optional=optional, cell_gradient_form="per_step")
    with emulated_device(schedule="adversarial", seed=H) as dev:
        assert_matches(case, False)
        assert_matches(case, True)
    ran = {(d.kernel, d.threadgroup_size) for d in dev.trace if "_v2_" in d.kernel}
    assert ran == {(k, 512 if k.endswith("_512") else 1024) for k in V2_SHAPES[(cell, H, peephole)]}


class _Untold(metalcompute.Device):
    """A harness device whose functions, like metalcompute's, neither tell their threadgroup
    size nor prepare their calls: the host learns of a size only from the marks."""

    def kernel(self, source):
        library = super().kernel(source)
        return type("Library", (), {"function": lambda _, name: _Call(library.function(name))})()


class _Call:
    def __init__(self, function):
        self._function = function

    def __call__(self, count, *buffers):
        return self._function(count, *buffers)


def _v2_case(cell):
    rng = np.random.default_rng(3)
    return random_case(rng, cell, T=3, N=2, H=64, I=3, dtype=np.float32, optional=ALL_OPTIONAL,
                       descriptor=random_descriptor(rng, cell, bidirectional=True, training=True,
                                                    **({"reset_after": True} if cell == "gru"
                                                       else {})))


@pytest.mark.parametrize("cell", CELLS)
def test_v2_entries_in_another_threadgroup_size_run_v1(cell, monkeypatch):
    """A device whose pipelines get smaller threadgroups than v2 asks for (as a Mac may). Where
    its functions say their size, the host runs v1 for those entries before any dispatch; where
    they do not (metalcompute), each v2 dispatch is declined by all its threadgroups, the host
    notes it and runs the op again with v1. Either way the results match the reference, the
    entries are noted with the size, and from then on the rule runs v1 for them."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v2")
    case = _v2_case(cell)
    wanted = {versions.recurrence(cell=cell, direction=direction, D=2, N=2, H=64,
                                  peephole=cell == "lstm").kernel
              for direction in ("forward", "backward")}
    assert all("_v2_" in k for k in wanted)
    for device, declined_at_run_time in ((metalcompute.Device(max_threads_per_threadgroup=256),
                                          False),
                                         (_Untold(max_threads_per_threadgroup=256), True)):
        with EMULATED_HOST.using(device) as dev:
            assert_matches(case, True)
            kernels = [d.kernel for d in dev.trace if not d.kernel.startswith("strided")]
            declined = dict(EMULATED_HOST.declined)
            dev.trace.clear()
            assert_matches(case, True)
            again = [d.kernel for d in dev.trace if not d.kernel.startswith("strided")]
        assert set(declined) == wanted and set(declined.values()) == {256}, declined
        ran_v2 = {k for k in kernels if "_v2_" in k}
        assert ran_v2 == (wanted if declined_at_run_time else set()), kernels
        assert f"{cell}_forward" in kernels and f"{cell}_backward" in kernels
        assert again == [f"{cell}_forward", f"{cell}_backward"]  # v1 only, no declined dispatch


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


# -- v3's tiles, one step a dispatch ---------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("N, H, min_tiles, threads", [
    (13, 70, 1, 32),     # the widest blocks: 36-56 workers over 32 threads, in two rounds
    (17, 20, 1, 1024),   # two row tiles (16 + 1 rows) a direction; k split over 4 slices
    (5, 9, 128, 64),     # the narrowest blocks: 4 columns a tile, 8 slices of k
])
def test_v3_tiles_one_step_a_dispatch(cell, N, H, min_tiles, threads, monkeypatch, metal_rules):
    """v3 against the reference, bidirectional, every optional input, adversarial schedule: T
    forward dispatches and T + 1 backward ones (the last the carry alone), each of
    versions.tile_blocks' tiles; a GRU without reset_after gets the rule's version."""
    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", "v3")
    metal_rules(v3_min_tiles=min_tiles)
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
    """The widest power-of-two block of units within 64 columns that still gives v3_min_tiles
    tiles, else the narrowest (4 columns); the choice names the grid."""
    assert versions.tile_blocks(cell="lstm", direction="forward", D=1, N=64, H=512) == (4, 32)
    assert versions.tile_blocks(cell="lstm", direction="backward", D=1, N=64, H=512) == (4, 32)
    assert versions.tile_blocks(cell="single_gate", direction="forward", D=2, N=64, H=512) == (4, 16)
    assert versions.tile_blocks(cell="gru", direction="forward", D=1, N=1, H=64) == (1, 64)
    assert versions.tile_blocks(cell="gru", direction="backward", D=1, N=1, H=64) == (1, 16)
    choice = versions.recurrence(cell="lstm", direction="forward", D=1, N=32, H=256)
    assert choice.version != "v3"  # forced, or by the rule from steps_min_work (2**25; this 2**23)
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


@pytest.mark.parametrize("grid, kernel", [("v3", "lstm_backward_v3")])
@pytest.mark.parametrize("which", ["a step", "the last carry"])
def test_a_stopped_v3_dispatch_raises_naming_it(which, grid, kernel, monkeypatch):
    """A backward dispatch of v3's one-step grid whose later threadgroups never ran:
    no result, and the error names the dispatch, its step (or the carry alone) and what is
    missing."""
    from rnngrad.backends.metal import IncompleteDispatch

    monkeypatch.setenv("RNNGRAD_METAL_RECURRENCE", grid)
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
