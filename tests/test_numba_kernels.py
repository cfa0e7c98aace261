"""The numba backend's building blocks against independent computations: its vectorised
activations against the float64 reference (whole real line, ±inf, NaN, tiny and huge values),
its GEMM helpers against NumPy, and the parallel split of the hidden units and the overlap of
the recurrence with the large products, each forced on small problems of every cell and
option."""

import numpy as np
import pytest

pytest.importorskip("numba")

from hypothesis import given, settings, strategies as st  # noqa: E402

from rnngrad.testing.cases import CELLS, random_case  # noqa: E402
from rnngrad.descriptors import DESCRIPTORS, Activation  # noqa: E402
from rnngrad.backends.reference import activations as ref  # noqa: E402
from rnngrad.testing import TOLERANCES, check_case  # noqa: E402
from draws import conditioned  # noqa: E402
from rnngrad import validation  # noqa: E402
from rnngrad.backends.numba import (activations as act, blas, common, driver, gemm, gru, lstm,  # noqa: E402
                                   overlap, single_gate)

DTYPES = (np.float32, np.float64)
KINDS = (act.NONE, act.RELU, act.TANH, act.SIGMOID, act.HARD_SIGMOID)


def _points():
    """The real line densely near 0 and the saturation edges, far out, and the specials."""
    return np.concatenate([
        np.linspace(-40, 40, 40001), np.linspace(-800, 800, 4001),
        np.logspace(-40, 4, 2000), -np.logspace(-40, 4, 2000),
        [0.0, -0.0, 2.5, -2.5, np.inf, -np.inf, np.nan, 87.0, -87.0, 708.0, -708.0, 1e300, -1e300],
    ])  # [K]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_activations_match_reference(kind, dtype):
    with np.errstate(over="ignore"):
        x = _points().astype(dtype)  # [K] (large values overflow to ±inf in float32, on purpose)
    y, dy, y_only = np.empty_like(x), np.empty_like(x), np.empty_like(x)
    act.activate_with_derivative(kind, x, y, dy)
    act.activate(kind, x, y_only)
    x64 = x.astype(np.float64)
    want = ref.activate(Activation(kind), x64)
    want_d = ref.derivative(Activation(kind), x64)
    atol, rtol = TOLERANCES[(np.dtype(dtype).name, "output")]
    np.testing.assert_allclose(y, want, rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_allclose(dy, want_d, rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_array_equal(y_only, y)  # one formula for the value, with or without f'
    assert np.array_equal(np.isnan(y), np.isnan(want)) and np.array_equal(np.isnan(dy), np.isnan(want_d))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tanh_keeps_relative_accuracy_near_zero(dtype):
    """tanh goes through expm1, so tiny arguments are not lost to cancellation."""
    x = np.logspace(-30, -1, 500).astype(dtype)  # [K]
    y = np.empty_like(x)
    act.activate(act.TANH, x, y)
    rtol = TOLERANCES[(np.dtype(dtype).name, "output")][1]
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64)), rtol=rtol, atol=0)


@settings(max_examples=30, deadline=None)
@given(M=st.integers(0, 70), K=st.integers(0, 70), N=st.integers(0, 70), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), transposed_b=st.booleans())
def test_gemm_helpers_match_numpy(M, K, N, seed, dtype, transposed_b):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(dtype)  # [M,K]
    b = rng.standard_normal((N, K)).astype(dtype).T if transposed_b else \
        rng.standard_normal((K, N)).astype(dtype)  # [K,N]
    x = rng.standard_normal((K, M)).astype(dtype)  # [K,M]
    out = rng.standard_normal((M, N)).astype(dtype)  # [M,N]
    want = out.astype(np.float64) + x.T.astype(np.float64) @ b
    atol, rtol = TOLERANCES[(np.dtype(dtype).name, "parameter")]
    np.testing.assert_allclose(gemm.rows_times(a, b), a.astype(np.float64) @ b, rtol=rtol, atol=atol)
    gemm.add_transposed_times(x, b, out)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=atol)


@settings(max_examples=20, deadline=None)
@given(K=st.integers(0, 40), M=st.integers(1, 30), N=st.integers(1, 30), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), step=st.integers(1, 7))
def test_accumulate_matches_numpy(K, M, N, seed, dtype, step):
    """out += xᵀ b chunk by chunk over the rows, x a column slice of a wider array (the
    gradients' dX of one direction)."""
    rng = np.random.default_rng(seed)
    wide = rng.standard_normal((K, M + 5)).astype(dtype)  # [K,M+5]
    x, b = wide[:, 2:2 + M], rng.standard_normal((K, N)).astype(dtype)  # [K,M], [K,N]
    out = rng.standard_normal((M, N)).astype(dtype)  # [M,N]
    want = out.astype(np.float64) + x.T.astype(np.float64) @ b
    for r in range(0, K, step):
        gemm.accumulate(x[r:r + step], b[r:r + step], out)
    atol, rtol = TOLERANCES[(np.dtype(dtype).name, "parameter")]
    np.testing.assert_allclose(out, want, rtol=rtol, atol=atol)


def test_gemm_helpers_parallel_split():
    """Large enough that the products are split between threads (by rows of the result)."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((301, 97)), rng.standard_normal((97, 83))  # [M,K], [K,N]
    x = rng.standard_normal((301, 97))  # [K,M]
    atol, rtol = TOLERANCES[("float64", "parameter")]
    out = rng.standard_normal((97, 83))  # [M,N]
    want = out + x.T @ a[:, :83]
    np.testing.assert_allclose(gemm.rows_times(a, b), a @ b, rtol=rtol, atol=atol)
    gemm.add_transposed_times(x, a[:, :83], out)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("M,K,N", [(1, 64, 256), (3, 5, 7), (4, 128, 128), (0, 3, 2)])
def test_compiled_small_product(M, K, N):
    """The per-step product on B as pack_parts leaves it for a single step (unpacked)."""
    rng = np.random.default_rng(M * 100 + K)
    a, b = rng.standard_normal((M, K)), rng.standard_normal((K, N))  # [M,K], [K,N]
    out = np.full((M, N), np.nan)  # [M,N] every element must be written
    common.dot(a, blas.pack_parts(b[None], M, 1)[0], out)
    atol, rtol = TOLERANCES[("float64", "parameter")]
    np.testing.assert_allclose(out, a @ b, rtol=rtol, atol=atol)


@settings(max_examples=30, deadline=None)
@given(P=st.integers(1, 3), K=st.integers(1, 40), N=st.integers(1, 40), seed=st.integers(0, 2**16),
       dtype=st.sampled_from(DTYPES), layout=st.sampled_from(["C", "transposed", "broadcast", "strided"]))
def test_unpacked_weights_are_row_major_copies(P, K, N, seed, dtype, layout):
    """pack_parts without packing (one step) gives each part b[p] row-major, whatever b's
    strides: the tiled transpose of parts whose transpose is contiguous (Rᵀ), NumPy's copy of
    the rest; a new writable array unless b already is one."""
    rng = np.random.default_rng(seed)
    if layout == "C":
        b = rng.standard_normal((P, K, N)).astype(dtype)  # [P,K,N]
    elif layout == "transposed":
        b = rng.standard_normal((P, N, K)).astype(dtype).transpose(0, 2, 1)  # [P,K,N] parts Rᵀ
    elif layout == "broadcast":
        b = np.broadcast_to(rng.standard_normal((N, K)).astype(dtype).T, (P, K, N))  # read-only
    else:
        b = rng.standard_normal((P, 2 * K, N)).astype(dtype)[:, ::2]  # [P,K,N] every other row
    want = np.array(b)  # [P,K,N]
    out = blas.pack_parts(b, 1, 1)  # [P,K·N]
    assert out.shape == (P, K * N) and out.flags.c_contiguous and out.flags.writeable
    np.testing.assert_array_equal(out.reshape(P, K, N), want)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES),
       parts=st.sampled_from([2, 3]))
def test_forced_parts_match_reference(seed, cell, dtype, parts):
    """Every cell and option with the hidden units split into 2 or 3 parts (uneven splits, a
    part of one unit), whatever the size: the parallel code path on small problems."""
    case = conditioned(random_case(seed, cell, dtype=dtype, H=int(np.random.default_rng(seed).integers(parts, 9))))
    original = driver.schedule
    driver.schedule = lambda N, H, G: min(parts, H)
    try:
        for gradients in (False, True):
            worst, mismatches = check_case(case, "numba", gradients)
            assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"
    finally:
        driver.schedule = original


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES),
       parts=st.sampled_from([2, 3]))
def test_forced_row_parts_match_reference(seed, cell, dtype, parts):
    """Every cell and option with the forward's batch rows split into 2 or 3 parts (uneven
    splits, a part of one row), whatever the size: the row-parallel forward on small problems,
    its outputs and the gradients it feeds."""
    rng = np.random.default_rng(seed)
    case = conditioned(random_case(seed, cell, dtype=dtype, N=int(rng.integers(parts, 9))))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "forward_schedule", lambda T, N, H, G: (1, parts))
        for gradients in (False, True):
            worst, mismatches = check_case(case, "numba", gradients)
            assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES),
       parts=st.sampled_from([2, 3]))
def test_forced_gradient_row_parts_match_reference(seed, cell, dtype, parts):
    """Every cell and option with the gradients' batch rows split into 2 or 3 parts (uneven
    splits, a part of one row), whatever the size: the row-parallel gradient recurrence on
    small problems, each part running its rows through every step."""
    rng = np.random.default_rng(seed)
    case = conditioned(random_case(seed, cell, dtype=dtype, N=int(rng.integers(parts, 9))))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "gradient_schedule", lambda P: (1, parts))
        worst, mismatches = check_case(case, "numba", gradients=True)
        assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"


@pytest.mark.parametrize("T", [1, 2, 5, 17])
def test_overlap_bounds_cover_the_loop(T, monkeypatch):
    monkeypatch.setattr(overlap, "MIN_FLOPS", 0)
    monkeypatch.setattr(overlap, "MIN_CHUNK_ROWS", 1)
    b = overlap.bounds(T, 3, 1, 1.0)
    if T < 2:
        assert b is None
    else:
        assert b[0] == 0 and b[-1] == T and all(x < y for x, y in zip(b, b[1:])), b
    assert overlap.bounds(T, 3, 2, 1.0) is None  # a parallel recurrence: nothing to overlap


def test_overlap_waits_for_the_helper_when_the_recurrence_fails(monkeypatch):
    """A failing chunk of the recurrence leaves no helper task running or unseen: what was
    handed over before the failure is done when the error arrives, and nothing after."""
    monkeypatch.setattr(overlap, "EAGER", True)
    out, rows = np.zeros((1, 1)), np.arange(8.0)[:, None]  # [1,1], [8,1]

    def recur(s0, s1):
        if s0 == 4:
            raise ValueError("chunk 4")
    with pytest.raises(ValueError, match="chunk 4"):
        overlap.gradients(recur, [(out, rows, np.ones((8, 1)))], [0, 2, 4, 6, 8], 8, 1, False)
    assert out[0, 0] == 7.0  # step 7's row only: steps 7… were complete before the failure
    projected = []
    with pytest.raises(ValueError, match="chunk 4"):
        overlap.forward(recur, lambda s0, s1: projected.append((s0, s1)), [0, 2, 4, 6, 8])
    assert projected == [(0, 2), (2, 4), (4, 6), (6, 8)]  # the last one submitted, finished


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES),
       chunk=st.integers(1, 3), eager=st.booleans())
def test_forced_overlap_matches_reference(seed, cell, dtype, chunk, eager):
    """Every cell and option with the projection and the weight gradients beside the
    recurrence in chunks of 1–3 steps, whatever the size: the overlapped code path on small
    problems (reverse and bidirectional ops, masks, every optional input), with each chunk
    of the gradients handed over and finished at the earliest moment (eager) or as the
    threads run."""
    case = conditioned(random_case(seed, cell, dtype=dtype, T=int(np.random.default_rng(seed).integers(2, 9))))
    calls = []

    def bounds(T, N, parts, flops):
        calls.append(T)
        return list(range(0, T, chunk)) + [T]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(overlap, "bounds", bounds)
        mp.setattr(overlap, "EAGER", eager)
        for gradients in (False, True):
            worst, mismatches = check_case(case, "numba", gradients)
            assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"
    assert calls  # the overlap did run


@pytest.mark.skipif(__import__("numba").get_num_threads() < 2, reason="needs two threads")
@pytest.mark.parametrize("cell, with_weight", [
    # one case of each outcome by default (the LSTM's products beside, the single gate's rows
    # split); the other cells and the cases without an input weight are slow
    pytest.param(cell, with_weight, marks=() if with_weight and cell in ("lstm", "single_gate")
                 else pytest.mark.slow)
    for with_weight in (True, False) for cell in CELLS])
def test_gradients_run_on_one_thread_beside_dominant_weight_products(cell, with_weight,
                                                                     monkeypatch):
    """At 100×32×256×256 the hidden units would be split into parts; with an input weight the
    weight gradients (dR and dW) are twice the recurrence's products and run beside it on
    the other core, the recurrence on one thread, where a step's product is large enough (GRU,
    LSTM); otherwise (the single-gate RNN's 4.2 MFLOP a step, or dR alone without an input
    weight) the batch rows are split and nothing runs beside. Both bidirectional (one
    recurrence each way), against the float64 reference."""
    seed = CELLS.index(cell) * 2 + with_weight
    descriptor = DESCRIPTORS[cell](training=True, bidirectional=True)
    case = random_case(seed, cell, T=100, N=32, I=256, H=256, dtype=np.float32,
                       descriptor=descriptor, optional={"input_weight": with_weight})
    G = case.descriptor.gates
    assert driver.schedule(32, 256, G) > 1  # the units would be split
    overlapped, original = [], overlap.gradients

    def spy(*args):
        overlapped.append(args[2])
        return original(*args)
    monkeypatch.setattr(overlap, "gradients", spy)
    schedules, chosen = [], driver.gradient_schedule
    monkeypatch.setattr(driver, "gradient_schedule", lambda P: schedules.append(chosen(P)) or schedules[-1])
    worst, mismatches = check_case(case, "numba", gradients=True)
    assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"
    serial = with_weight and 2 * 32 * G * 256 * 256 >= driver.SERIAL_GRADIENTS_MIN_STEP_FLOPS
    assert serial == (with_weight and cell != "single_gate")
    assert len(overlapped) == (2 if serial else 0), overlapped
    assert schedules == [(1, 1) if serial else (1, 2)], schedules


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_overlap_runs_in_a_forked_child():
    """A child forked after the helper thread started gets a helper of its own (the parent's
    thread does not exist there: without one, the child would wait forever)."""
    import multiprocessing
    overlap._helper().submit(int).result()  # the parent's helper thread is running
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_projected_in_child).get(timeout=30)
    assert got == [(0, 2), (2, 4)]


def _projected_in_child():
    projected = []
    overlap.forward(lambda s0, s1: None, lambda s0, s1: projected.append((s0, s1)), [0, 2, 4])
    return projected


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), cell=st.sampled_from(CELLS), dtype=st.sampled_from(DTYPES),
       one_call=st.booleans())
def test_one_call_and_kernel_calls_match_reference(seed, cell, dtype, one_call):
    """Every cell, option and optional input: a small problem runs whole in one compiled call
    per op (each cell's ``forward_op`` and ``gradient_op``); forced off, the driver calls the
    kernels and the products one by one. Both against the float64 reference, and each time
    the path taken is the one asked for."""
    case = conditioned(random_case(seed, cell, dtype=dtype))
    module = {"single_gate": single_gate, "gru": gru, "lstm": lstm}[cell]
    calls = []
    with pytest.MonkeyPatch.context() as mp:
        for name in ("forward_op", "gradient_op"):
            mp.setattr(module, name, lambda *a, _f=getattr(module, name), _n=name: calls.append(_n) or _f(*a))
        if not one_call:
            mp.setattr(driver, "in_one_call", lambda *a: False)
        for gradients in (False, True):
            worst, mismatches = check_case(case, "numba", gradients)
            assert not mismatches, f"{[str(m) for m in mismatches[:3]]}\nrepro:\n{case!r}"
    assert calls == (["forward_op", "forward_op", "gradient_op"] if one_call else []), calls


def test_one_call_only_where_nothing_is_split_packed_or_overlapped(monkeypatch):
    """The one-call ops take exactly the problems whose recurrence runs on one thread with R
    unpacked and nothing beside it (here the LSTM's forward)."""
    def problem(T, N, I, H):
        case = random_case(0, "lstm", T=T, N=N, I=I, H=H, dtype=np.float32,
                           descriptor=DESCRIPTORS["lstm"](training=True),
                           optional={"input_weight": True})
        return validation.forward_problem("lstm", case.descriptor, **case.inputs)[0]
    small = problem(50, 1, 64, 64)
    assert driver.in_one_call(small, 1, driver._projection_flops(small))
    assert not driver.in_one_call(small, 2, driver._projection_flops(small))  # split
    monkeypatch.setattr(overlap, "MIN_FLOPS", 0)
    monkeypatch.setattr(overlap, "MIN_CHUNK_ROWS", 1)
    if __import__("numba").get_num_threads() >= 2:  # the projection would run beside the recurrence
        assert not driver.in_one_call(small, 1, driver._projection_flops(small))
    monkeypatch.undo()
    packed = problem(1000, 8, 16, 128)
    assert driver.in_one_call(packed, 1, 0.0) == (not blas.packs(128, 512, 8, 1000))  # R packed?


def test_both_paths_share_one_compiled_kernel_per_dtype():
    """The one-call ops hand the kernels the argument types the driver hands them, so each
    kernel is compiled (and cached) once per dtype, not once per path (an integer literal
    where the driver passes an int64 made a second specialization)."""
    for cell in CELLS:
        case = random_case(1, cell, T=3, N=2, I=3, H=4, dtype=np.float32,
                           descriptor=DESCRIPTORS[cell](training=True))
        for one_call in (True, False):
            with pytest.MonkeyPatch.context() as mp:
                if not one_call:
                    mp.setattr(driver, "in_one_call", lambda *a: False)
                worst, mismatches = check_case(case, "numba", gradients=True)
                assert not mismatches
    for module in (single_gate, gru, lstm):
        for kernel in (module.forward, module.backward):
            float32 = [sig for sig in kernel.signatures if sig[0].dtype.name == "float32"]
            assert len(float32) == 1, (kernel, float32)
