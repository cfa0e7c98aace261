"""The numba kernels' GEMM entry points (``rnngrad/backends/numba/blas.py``), against float64
NumPy products, with MKL where it is installed and with the OpenBLAS fallback (in a fresh
process, ``RNNGRAD_BLAS=openblas``)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")
import numba  # noqa: E402

from rnngrad.backends.numba import blas  # noqa: E402
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
            assert is_packed == (blas.MKL is not None and blas.worth_packing(K, N, M, steps))
            for p in range(3):
                assert packed[p].ctypes.data % 64 == 0 or not is_packed
                out = np.full((M, N), np.nan, dtype)
                _step_product(a, packed[p], out)
                _close(out, a, parts[p], dtype)


def test_the_library_in_use_is_reported():
    text = blas.library()
    if blas.MKL is not None:
        assert "Math Kernel Library" in text or "MKL" in text
    else:
        assert "OpenBLAS" in text and blas.WHY_NOT_MKL in text


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
print(json.dumps({"mkl": blas.MKL is not None, "library": blas.library(), "worst": worst}))
"""


@pytest.mark.slow  # a new process compiles the ops' kernels with OpenBLAS bound
def test_openblas_fallback_runs_the_same_kernels_and_matches_the_reference():
    """With ``RNNGRAD_BLAS=openblas`` the symbols the kernels call are bound to the OpenBLAS
    cfuncs: 40×40 (120 columns) takes OpenBLAS's GEMM, 2×8 the cfuncs' compiled loop for
    small products."""
    env = dict(os.environ, RNNGRAD_BLAS="openblas")
    proc = subprocess.run([sys.executable, "-c", _FALLBACK], env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mkl"] is False and "RNNGRAD_BLAS=openblas" in out["library"]
    for key, (worst, bad) in out["worst"].items():
        assert not bad, (key, bad)
