"""The numba kernels' GEMM entry points (``rnngrad/backends/numba/blas.py``) and every GEMM
library found here (``libraries.py``), against float64 NumPy products; the rule that picks the
libraries (``rule.py``); and the kernels on OpenBLAS alone (in a fresh process,
``RNNGRAD_BLAS=openblas``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")
import numba  # noqa: E402

from rnngrad import machine  # noqa: E402
from rnngrad.backends.numba import blas, libraries, rule  # noqa: E402
from rnngrad.backends.numba.common import dot  # noqa: E402

DTYPES = (np.float32, np.float64)


@numba.njit(error_model="numpy")  # not cached: numba would not see a change in the helpers it inlines
def _gemm(a, b, out):
    blas.gemm(a, b, out)


@numba.njit(error_model="numpy")  # not cached: numba would not see a change in the helpers it inlines
def _step_product(a, packed, out):
    dot(a, packed, out)  # the kernels' per-step product


def _close(got, a, b, dtype):
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)  # bounds the rounding
    eps = np.finfo(dtype).eps
    assert np.all(np.abs(got - want) <= 4 * a.shape[1] * eps * scale + 1e-300)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_order,b_order", [("C", "C"), ("C", "F"), ("F", "C"), ("F", "F")])
def test_gemm_every_operand_layout(dtype, a_order, b_order):
    rng = np.random.default_rng(3)
    a = np.asarray(rng.standard_normal((37, 53)), dtype=dtype, order=a_order)  # [M,K]
    b = np.asarray(rng.standard_normal((53, 29)), dtype=dtype, order=b_order)  # [K,N]
    out = np.full((37, 29), np.nan, dtype)  # [M,N] written whole (beta = 0 ignores it)
    _gemm(a, b, out)
    _close(out, a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_on_transposed_row_blocks_and_strided_rows(dtype):
    """The large products' operands: xᵀ of a block of rows, and rows with a leading dimension
    longer than the row."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((60, 37)).astype(dtype)  # [K,M]
    b = rng.standard_normal((60, 29)).astype(dtype)  # [K,N]
    out = np.empty((37, 29), dtype)  # [M,N]
    _gemm(x[5:58].T, b[5:58], out)
    _close(out, x[5:58].T, b[5:58], dtype)
    wide = rng.standard_normal((20, 90)).astype(dtype)  # [M, ld]
    out = np.empty((20, 29), dtype)
    _gemm(wide[:, :60], b, out)
    _close(out, wide[:, :60], b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_with_an_empty_inner_dimension_gives_zeros(dtype):
    out = np.full((3, 4), np.nan, dtype)
    _gemm(np.empty((3, 0), dtype), np.empty((0, 4), dtype), out)
    assert np.array_equal(out, np.zeros((3, 4), dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 64, 256), (32, 256, 512), (40, 40, 120), (7, 300, 33)])
def test_packed_parts_multiply_like_their_matrices(dtype, M, K, N):
    """MKL's packed panels (each part packed in place: a packed buffer must not move), or B
    itself (without MKL, or when packing does not pay), through ``common.dot``."""
    rng = np.random.default_rng(M * 1000 + K + N)
    parts = rng.standard_normal((3, K, N)).astype(dtype)  # [P,K,N]
    a = rng.standard_normal((M, K)).astype(dtype)  # [M,K]
    columns = np.ascontiguousarray(parts.transpose(0, 2, 1)).transpose(0, 2, 1)  # each part bᵀ row-major
    wide = np.repeat(parts, 2, axis=2)[:, :, ::2]  # neither rows nor columns contiguous
    for given in (parts, columns, wide):
        for steps in (1, 10 ** 6):  # B kept as it is, and (with MKL) packed
            packed = blas.pack_parts(given, M, steps)  # [P,S]
            is_packed = packed.shape[1] != K * N
            assert is_packed == blas.packs(K, N, M, steps, dtype)
            for p in range(3):
                assert packed[p].ctypes.data % 64 == 0 or not is_packed
                out = np.full((M, N), np.nan, dtype)
                _step_product(a, packed[p], out)
                _close(out, a, parts[p], dtype)


def test_the_library_in_use_is_reported():
    text = blas.library()
    for p, dtype in (("s", "float32"), ("d", "float64")):
        assert f"{dtype} per-step products: {blas.CHOICE.step[p]}" in text
        assert f"{dtype} large products: {blas.CHOICE.large[p]}" in text
    for name in ("mkl", "openblas", "onednn"):
        assert f"{name}: " in text  # found (its version) or not (why)


@pytest.mark.parametrize("name", sorted(blas.LIBRARIES))
@pytest.mark.parametrize("p", ["s", "d"])
@pytest.mark.parametrize("ta,tb", [(111, 111), (112, 111), (111, 112), (112, 112)])
def test_every_library_found_multiplies_in_every_layout(name, p, ta, tb):
    """Each library's function with the CBLAS signature (oneDNN's through its adapter), with
    leading dimensions longer than the rows, alpha and beta (the weight gradients add)."""
    fn = blas.LIBRARIES[name].function(p)
    if fn is None:
        pytest.skip(f"{name} has no {p}gemm")
    dtype = rule.DTYPES[p]
    rng = np.random.default_rng(ta + 2 * tb)
    M, K, N, pad = 19, 45, 23, 3
    a = rng.standard_normal((K, M + pad) if ta == 112 else (M, K + pad)).astype(dtype)
    b = rng.standard_normal((N, K + pad) if tb == 112 else (K, N + pad)).astype(dtype)
    c = rng.standard_normal((M, N + pad)).astype(dtype)
    op_a = a[:, :M].T if ta == 112 else a[:, :K]
    op_b = b[:, :K].T if tb == 112 else b[:, :N]
    want = 0.5 * op_a.astype(np.float64) @ op_b.astype(np.float64) + 2.0 * c[:, :N]
    keep = c[:, N:].copy()
    with machine.blas_threads("scipy", 1):
        fn(101, ta, tb, M, N, K, 0.5, a.ctypes.data, a.shape[1], b.ctypes.data, b.shape[1], 2.0,
           c.ctypes.data, c.shape[1])
    scale = np.abs(op_a).astype(np.float64) @ np.abs(op_b).astype(np.float64) + np.abs(want)
    assert np.all(np.abs(c[:, :N] - want) <= 8 * K * np.finfo(dtype).eps * scale)
    assert np.array_equal(c[:, N:], keep)  # past N in each row: untouched


def test_blas_threads_limits_inside_the_block_and_restores_after_it():
    lib = machine.blas_libraries().get("scipy")
    if lib is None or lib.num_threads is None:
        pytest.skip("SciPy's bundled OpenBLAS not found")
    before = lib.num_threads
    lib.set_num_threads(2)
    try:
        with machine.blas_threads("scipy", 1):
            assert lib.num_threads == 1
        assert lib.num_threads == 2
        with pytest.raises(KeyError):
            with machine.blas_threads("scipy", 1):
                raise KeyError("inside")
        assert lib.num_threads == 2
    finally:
        lib.set_num_threads(before)


def test_a_missing_library_is_skipped_with_the_reason(monkeypatch, tmp_path):
    not_dnnl = tmp_path / "libdnnl.so.3"
    not_dnnl.write_bytes(b"not a library")
    monkeypatch.setattr(libraries, "_onednn_candidates", lambda: iter([str(not_dnnl)]))
    lib, why = libraries.load_onednn()
    assert lib is None and str(not_dnnl) in why
    monkeypatch.setattr(libraries, "_onednn_candidates", lambda: iter([str(tmp_path / "none")]))
    lib, why = libraries.load_onednn()
    assert lib is None and "not installed" in why


class _Fake:
    def __init__(self, name, kinds="sd"):
        self.name, self.detail, self.gemm = name, f"{name} 1.0", {p: 1 for p in kinds}


_RATES = {"s": {"step": {"mkl": 50.0, rule.PACKED: 70.0, "openblas": 60.0, "onednn": 90.0},
                "large": {"mkl": 80.0, "openblas": 95.0, "onednn": 85.0}},
          "d": {"step": {"mkl": 30.0, rule.PACKED: 45.0, "openblas": 40.0},
                "large": {"mkl": 41.0, "openblas": 40.0}}}


@pytest.fixture
def fakes(monkeypatch):
    """Three libraries (oneDNN without float64) whose measured rates are ``_RATES``, and the
    number of measurements made."""
    calls = []

    def measure(libs, p, rounds=rule.ROUNDS):
        calls.append(p)
        return {kind: {n: r for n, r in rates.items() if n.split("-")[0] in libs}
                for kind, rates in _RATES[p].items()}
    monkeypatch.setattr(rule, "measure", measure)
    monkeypatch.delenv("RNNGRAD_BLAS", raising=False)
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")  # nothing kept unless a folder is given
    libs = {"mkl": _Fake("mkl"), "openblas": _Fake("openblas"), "onednn": _Fake("onednn", "s")}
    return libs, calls


def test_the_rule_takes_the_fastest_of_each_kind_and_dtype(fakes):
    libs, _ = fakes
    choice = rule.choose(libs)
    assert choice.step == {"s": "onednn", "d": rule.PACKED}
    assert choice.large == {"s": "openblas", "d": "mkl"}
    assert choice.library("step", "d") == "mkl"
    del libs["onednn"]
    assert rule.choose(libs).step["s"] == rule.PACKED  # an absent library is not a candidate


def test_the_rates_are_kept_per_cpu_and_candidates(fakes, tmp_path, monkeypatch):
    libs, calls = fakes
    first = rule.choose(libs, str(tmp_path))
    assert len(calls) == 2 and "measured now" in first.how
    again = rule.choose(libs, str(tmp_path))
    assert len(calls) == 2 and "before" in again.how and again.step == first.step
    monkeypatch.setattr(machine, "cpu_name", lambda: "another CPU")
    rule.choose(libs, str(tmp_path))
    assert len(calls) == 4  # a new CPU measures again
    libs["extra"] = _Fake("extra")
    rule.choose(libs, str(tmp_path))
    assert len(calls) == 6  # so does a newly found library
    rule.choose(libs, str(tmp_path), remeasure=True)
    assert len(calls) == 8


def test_with_numba_cache_dir_the_rates_are_kept_there(fakes, tmp_path, monkeypatch):
    libs, calls = fakes
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    rule.choose(libs)
    rule.choose(libs)
    assert len(calls) == 2 and list(tmp_path.glob("gemm-rule-*.json"))


def test_rnngrad_blas_names_the_library_of_every_product_it_has(fakes, monkeypatch):
    libs, calls = fakes
    monkeypatch.setenv("RNNGRAD_BLAS", "openblas")
    choice = rule.choose(libs)
    assert choice.step == choice.large == {"s": "openblas", "d": "openblas"} and not calls
    monkeypatch.setenv("RNNGRAD_BLAS", "MKL")
    assert rule.choose(libs).step == {"s": rule.PACKED, "d": rule.PACKED}
    monkeypatch.setenv("RNNGRAD_BLAS", "onednn")  # float32 only: float64 by the rule
    choice = rule.choose(libs)
    assert choice.step == {"s": "onednn", "d": rule.PACKED} and choice.large["d"] == "mkl"
    monkeypatch.setenv("RNNGRAD_BLAS", "blis")
    with pytest.warns(UserWarning, match="RNNGRAD_BLAS: expected one of"):
        assert rule.choose(libs).step["s"] == "onednn"


def test_measuring_gives_a_rate_for_every_candidate_of_each_kind():
    rates = rule.measure(blas.LIBRARIES, "s", rounds=1)
    assert set(rates["large"]) == set(blas.LIBRARIES)
    assert set(rates["step"]) == set(blas.LIBRARIES) | ({rule.PACKED} if blas.MKL else set())
    assert all(0 < r < 1e5 for kind in rates.values() for r in kind.values())


_FALLBACK = r"""
import json, numpy as np
from rnngrad.backends.numba import blas
from rnngrad.testing.cases import random_case
from rnngrad.testing import check_case
worst = {}
for cell in ("single_gate", "gru", "lstm"):
    for dtype in (np.float32, np.float64):
        for N, H in ((40, 40), (2, 8)):
            case = random_case(7, cell, T=3, N=N, H=H, I=5, dtype=dtype)
            w, bad = check_case(case, "numba", False)
            worst[f"{cell}-{np.dtype(dtype).name}-{N}x{H}"] = [float(w), [str(m) for m in bad[:2]]]
print(json.dumps({"choice": [blas.CHOICE.step, blas.CHOICE.large], "worst": worst}))
"""


@pytest.mark.slow  # a new process compiles the ops' kernels with OpenBLAS bound
def test_openblas_fallback_runs_the_same_kernels_and_matches_the_reference():
    """With ``RNNGRAD_BLAS=openblas`` the symbols the kernels call are bound to OpenBLAS:
    40×40 (120 columns) takes OpenBLAS's GEMM, 2×8 the compiled loop for small products."""
    env = dict(os.environ, RNNGRAD_BLAS="openblas")
    proc = subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["choice"] == [{"s": "openblas", "d": "openblas"}] * 2
    for key, (worst, bad) in out["worst"].items():
        assert not bad, (key, bad)
