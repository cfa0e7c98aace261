"""The matrix-product versions of the Metal path (kernels/gemm.metal), on the CPU harness (the
rule that chooses between them: tests/test_metal_versions.py).

The versions past v1 (v3 strided_gemm_blocked, v4 strided_gemm_split, v5 strided_gemm_wide) are
called directly through the harness's metalcompute API and compared with a float64 NumPy product:
tails in M, P and K around their tiles (4×4 blocks, 64×64 tiles and chunks of 32 k for v3),
batches with strides, a bias, GRU's row blocks reading other parts of B, adversarial
schedules and forced threadgroups of 32, 64 and 96 threads (and, for v3, of 160, 384 and 1024),
a long K against v1. Mutants of each kernel (a missing barrier, no zero padding, a fixed
threadgroup size, no running total) must fail the same checks. Then the whole "metal-emulated"
backend with each tiled version forced matches the reference for every cell and option, the
rule picks each version where it says, and a stopped tiled dispatch raises IncompleteDispatch.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from rnngrad.backends.metal import IncompleteDispatch, library, versions
from rnngrad.backends.metal.harness import cpu as metalcompute
from rnngrad.backends.metal.backends import EMULATED_BACKEND
from rnngrad.backends.metal.harness.contexts import emulated_device
from rnngrad.testing import check_case, compare_array
from rnngrad.testing.cases import CELLS, random_case, random_descriptor

from draws import ALL_OPTIONAL

pytestmark = pytest.mark.skipif(EMULATED_BACKEND.probe() is not None,
                                reason=f"metal-emulated unavailable: {EMULATED_BACKEND.probe()}")

BACKEND = "metal-emulated"
SIDES = (1, 7, 8, 9, 31, 33, 65)
HARSH = dict(schedule="adversarial", seed=7, max_threads_per_threadgroup=64)
NO_OPTIONAL = {k: False for k in ALL_OPTIONAL}
BLOCKED = versions.GEMM_KERNELS["v3"]
#: the versions past v1 (the tiled v3 and v5, v4's split of K), and for each the sides of M
#: and P, and of K, around its tiles, chunks and slices
VERSIONS = ("v3", "v4", "v5")
TAILS = {"v3": ((1, 4, 15, 17, 63, 64, 65, 129), (0, 1, 31, 32, 33, 127, 129)),
         "v4": ((1, 3, 31, 33, 65), (0, 1, 7, 8, 9, 63, 64, 65, 520)),
         "v5": ((1, 5, 64, 67, 128, 131), (0, 1, 7, 8, 9, 129))}
#: threads each version asks for per threadgroup
THREADS = {"v3": versions.BLOCKED_THREADS, "v4": versions.SPLIT_THREADS,
           "v5": versions.WIDE_THREADS}


@pytest.fixture(autouse=True)
def _auto_rule(monkeypatch):
    """Every test starts from the rule, whatever the environment says."""
    monkeypatch.delenv(versions.GEMM_ENV, raising=False)


# -- calling a kernel directly ------------------------------------------------------------------

class Product:
    """C[batch, M, P] = A·B (+ bias) as GemmParams describes it, with random strided operands
    and its float64 value."""

    def __init__(self, rng, batch, M, P, K, *, a_t=False, b_t=False, pad=0, bias=False,
                 block=None, b_block=0, b_blocks=1, shared_b=False):
        self.batch, self.M, self.P, self.K = batch, M, P, K
        self.block, self.b_block = block or max(M, 1), b_block
        # A: batch matrices [M, K] (a_t: stored [K, M]) with `pad` extra floats per row.
        a_rows, a_cols = (K, M) if a_t else (M, K)
        a_row_len = a_cols + pad
        self.a_batch = a_rows * a_row_len + pad
        self.a_row, self.a_k = (1, a_row_len) if a_t else (a_row_len, 1)
        # B: per batch, b_blocks blocks of [K, P] (b_t: stored [P, K]) b_block floats apart.
        b_rows, b_cols = (P, K) if b_t else (K, P)
        b_row_len = b_cols + pad
        block_len = b_rows * b_row_len
        if b_blocks > 1:
            assert b_block >= block_len
        self.b_batch = 0 if shared_b else (b_blocks - 1) * b_block + block_len + pad
        self.b_k, self.b_col = (1, b_row_len) if b_t else (b_row_len, 1)
        self.A = rng.standard_normal(max(batch * self.a_batch, 1)).astype(np.float32)
        b_size = (b_blocks - 1) * b_block + block_len + (0 if shared_b else (batch - 1) * self.b_batch)
        self.B = rng.standard_normal(max(b_size, 1)).astype(np.float32)
        self.bias = rng.standard_normal(P).astype(np.float32) if bias else None

    def params(self, count, k_split=0):
        p = np.zeros(1, library.GEMM_PARAMS)
        p["k_split"] = k_split
        for key in ("batch", "M", "P", "K", "a_batch", "a_row", "a_k", "b_batch", "b_k", "b_col",
                    "block", "b_block"):
            p[key] = getattr(self, key)
        p["count"], p["has_bias"] = count, int(self.bias is not None)
        return p

    def want(self, elementwise=False):
        """The float64 product, gathered by GemmParams' index formula; ``elementwise``: as a sum
        of the K products of each element (no BLAS, so NaN and infinity follow IEEE exactly)."""
        A, B = self.A.astype(np.float64), self.B.astype(np.float64)
        i, k = np.arange(self.M)[:, None], np.arange(self.K)[None, :]
        kk, j = np.arange(self.K)[:, None], np.arange(self.P)[None, :]
        C = np.empty((self.batch, self.M, self.P))
        for b in range(self.batch):
            a = A[b * self.a_batch + i * self.a_row + k * self.a_k]  # [M,K]
            for first in range(0, self.M, self.block):
                rows = slice(first, min(first + self.block, self.M))
                bb = B[b * self.b_batch + kk * self.b_k + j * self.b_col
                       + (first // self.block) * self.b_block]  # [K,P]
                if elementwise:
                    with np.errstate(invalid="ignore"):  # 0·inf is NaN, as it should be
                        C[b, rows] = (a[rows][:, :, None] * bb[None]).sum(axis=1)
                else:
                    C[b, rows] = a[rows] @ bb
        return C + self.bias if self.bias is not None else C


@functools.lru_cache(maxsize=None)
def _function(dev, source, kernel):
    return dev.kernel(source).function(kernel)


def run(dev, product, version="v3", source=None, k_split=0):
    """Run one version of the product on ``dev``; (C, completion marks). ``k_split`` (v5): k
    per slice of K; the slices' products are then added in order, in float32, as the host
    does."""
    choice = versions.Choice(version, versions.GEMM_KERNELS[version], "test")
    slices = max(1, -(-product.K // k_split)) if k_split else 1
    count = versions.gemm_threads(choice, batch=product.batch, M=product.M, P=product.P,
                                  block=product.block, b_block=product.b_block, slices=slices)
    fn = _function(dev, source or library.source(), choice.kernel)
    n = product.batch * product.M * product.P
    C = dev.buffer(np.full(max(slices * n, 1), np.nan, np.float32))  # never written: NaN
    status = dev.buffer(np.zeros(2 * -(-count // library.MIN_THREADGROUP), np.uint32))
    bias = product.bias if product.bias is not None else np.zeros(1, np.float32)
    fn(count, dev.buffer(product.params(count, k_split).view(np.uint8)), dev.buffer(product.A),
       dev.buffer(product.B), dev.buffer(bias), C, status)
    parts = np.frombuffer(C, np.float32, count=slices * n).reshape(slices, product.batch,
                                                                    product.M, product.P)
    out = parts[0].copy()
    for part in parts[1:]:
        out += part
    marks = np.frombuffer(status, np.uint32).reshape(-1, 2).copy()
    return out, marks


def assert_product(dev, product, version="v3", quantity="input_weight"):
    """The version's C equals the float64 product within the float32 tolerance of ``quantity``
    (a parameter gradient: relative to the largest magnitude), and every threadgroup marked."""
    got, marks = run(dev, product, version)
    ratio, mismatch = compare_array(quantity, got, product.want(), np.float32)
    shape = f"batch={product.batch} M={product.M} P={product.P} K={product.K}"
    assert mismatch is None, f"{version} {shape}: {mismatch}"
    groups = dev.trace[-1].threadgroups
    assert (marks[:groups, 0] == library.DONE | product.K).all(), f"{version} {shape}: marks {marks}"
    assert (marks[groups:] == 0).all()
    return ratio


# -- each version against float64 --------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", [dict(), HARSH, dict(schedule="reverse", max_threads_per_threadgroup=32)],
                         ids=["default", "adversarial-64", "reverse-32"])
def test_tiled_every_tail_of_m_p_k(device, version):
    """Every (M, P, K) of the version's tails, row-major operands, half of them with a bias."""
    dev = metalcompute.Device(**device)
    rng = np.random.default_rng(len(device))
    sides, ks = TAILS[version]
    for M, P, K in itertools.product(sides, sides, ks):
        assert_product(dev, Product(rng, 1, M, P, K, bias=bool((M + P + K) % 2)), version)
    assert {d.kernel for d in dev.trace} == {versions.GEMM_KERNELS[version]}
    threads = THREADS[version]
    assert dev.trace[-1].threadgroup_size == device.get("max_threads_per_threadgroup", threads)
    assert dev.trace[-1].threadgroup_memory <= 32 * 1024


@pytest.mark.parametrize("device", [HARSH, dict(schedule="adversarial", seed=3),
                                    dict(schedule="reverse", max_threads_per_threadgroup=32),
                                    dict(schedule="adversarial", seed=11, max_threads_per_threadgroup=96)],
                         ids=["adversarial-64", "adversarial-full", "reverse-32", "adversarial-96"])
@pytest.mark.parametrize("version", VERSIONS)
def test_tiled_strides_batches_and_bias_under_harsh_schedules(device, version):
    """Transposed and padded operands, batches (B shared or not), bias, on random tails; every
    combination of the two operands' layouts three times."""
    dev = metalcompute.Device(**device)
    rng = np.random.default_rng(sum(map(ord, repr(device))))
    sides, ks = TAILS[version]
    for n in range(12):
        M, P = (int(v) for v in rng.choice(sides, 2))
        K = int(rng.choice(ks))
        product = Product(rng, int(rng.integers(1, 4)), M, P, K, a_t=bool(n % 2),
                          b_t=bool(n // 2 % 2), pad=int(rng.integers(0, 3)),
                          bias=bool(rng.integers(2)), shared_b=bool(rng.integers(2)))
        assert_product(dev, product, version)
    threads = THREADS[version]
    assert dev.trace[-1].threadgroup_size == min(device.get("max_threads_per_threadgroup", threads), threads)


@pytest.mark.parametrize("device", [dict(), HARSH, dict(schedule="reverse", max_threads_per_threadgroup=32)],
                         ids=["default", "adversarial-64", "reverse-32"])
def test_wide_slices_of_k(device):
    """v5 with K split into slices (each its own threadgroups, stored apart, added in order):
    tails of K around the slice and chunk, batches, transposed operands, GRU's row blocks, and
    a bias (added by slice 0 alone); every threadgroup marks with the whole K."""
    dev = metalcompute.Device(**device)
    rng = np.random.default_rng(5 + len(device))
    products = [(Product(rng, 1, 70, 150, 1000, a_t=True), 504),
                (Product(rng, 2, 9, 131, 33, b_t=True, pad=1), 8),
                (Product(rng, 3, 130, 5, 17, bias=True, shared_b=True), 16),
                (Product(rng, 1, 64, 64, 64, a_t=True, b_t=True), 64),
                (_row_blocks(rng, 2, 9, 37), 8)]
    for product, k_split in products:
        got, marks = run(dev, product, "v5", k_split=k_split)
        slices = -(-product.K // k_split)
        ratio, mismatch = compare_array("input_weight", got, product.want(), np.float32)
        assert mismatch is None, f"K = {product.K} in {slices} slices: {mismatch}"
        groups = dev.trace[-1].threadgroups
        assert (marks[:groups, 0] == library.DONE | product.K).all()
        tiles = versions.gemm_tiles(batch=product.batch, M=product.M, P=product.P, block=product.block,
                                    b_block=product.b_block, tile=versions.WIDE_TILE)
        assert dev.trace[-1].count == versions.WIDE_THREADS * tiles * slices


def test_wide_slice_rule():
    """K splits only for few tiles and no bias, into slices of at least wide_min_slice k, a
    multiple of the chunk; the slices cover K."""
    rules = versions.rules()
    few = dict(batch=1, M=512, P=128, block=512, b_block=0)  # 4 tiles
    slices, k = versions.wide_slices(**few, K=8000, has_bias=False)
    assert k % versions.WIDE_K == 0 and k >= rules.wide_min_slice
    assert slices == -(-8000 // k) and (slices - 1) * k < 8000 <= slices * k
    assert slices * 4 <= rules.wide_split_tiles + 4 * 2
    assert versions.wide_slices(**few, K=8000, has_bias=True) == (1, 0)
    assert versions.wide_slices(**few, K=2 * rules.wide_min_slice - 1, has_bias=False) == (1, 0)
    many = dict(batch=1, M=12800, P=2048, block=12800, b_block=0)
    assert versions.wide_slices(**many, K=512, has_bias=False) == (1, 0)


def test_backend_splits_k_of_the_weight_gradients(monkeypatch, caplog, metal_rules):
    """Through the backend, with v5 the rule's tiled version and slices made small enough to
    split the weight gradients of a small op: each split product is v5 over slices followed
    by v1 adding them (M = 1, K = the slices), and every result matches the reference."""
    metal_rules(wide_min_groups=1, tiled_min_tiles=1, tiled_min_work=1, wide_min_slice=8)
    rng = np.random.default_rng(8)
    for cell in CELLS:
        desc = random_descriptor(rng, cell, training=True, **(dict(reset_after=False) if cell == "gru" else {}))
        case = random_case(rng, cell, descriptor=desc, T=7, N=9, H=9, I=10, dtype=np.float32,
                           optional=ALL_OPTIONAL)
        caplog.clear()
        with caplog.at_level("DEBUG", logger="rnngrad.backends.metal"), emulated_device(**HARSH) as dev:
            for gradients in (False, True):
                ratio, mismatches = check_case(case, BACKEND, gradients)
                assert not mismatches, f"{cell}: " + "\n".join(map(str, mismatches[:5]))
        said = [r.getMessage() for r in caplog.records]
        split = [m for m in said if "slices of" in m and "added by a second product" in m]
        sums = [m for m in said if "the sum of" in m]
        assert len(split) >= 2 and len(sums) == len(split), (cell, said)
        assert all(m.startswith(f"{BACKEND}: v5 ") for m in split), split
        assert all(m.startswith(f"{BACKEND}: v1 ") for m in sums), sums
        kernels = [d.kernel for d in dev.trace]
        after = [kernels[i + 1] for i, k in enumerate(kernels[:-1]) if k == versions.GEMM_KERNELS["v5"]]
        assert after.count(versions.GEMM_KERNELS["v1"]) >= len(split), kernels


@pytest.mark.parametrize("limit, device_max", [(1024, 1024), (1024, 384), (512, 160)])
def test_blocked_with_larger_threadgroups_than_it_asks_for(limit, device_max):
    """v3 asks for 256 threads per threadgroup; given more (its limit raised in the source, as
    a device could), the threads past 256 only stage, and a threadgroup takes several tiles."""
    source = _mutant(BLOCKED, ("[[max_total_threads_per_threadgroup(256)]]",
                               f"[[max_total_threads_per_threadgroup({limit})]]"))
    dev = metalcompute.Device(schedule="adversarial", seed=limit, max_threads_per_threadgroup=device_max)
    rng = np.random.default_rng(limit + device_max)
    for product in (Product(rng, 3, 65, 130, 33, bias=True, a_t=True),
                    Product(rng, 1, 7, 200, 129, b_t=True, pad=1),
                    Product(rng, 2, 64, 64, 64, shared_b=True)):
        got, marks = run(dev, product, "v3", source=source)
        ratio, mismatch = compare_array("input_weight", got, product.want(), np.float32)
        assert mismatch is None, f"threadgroups of {device_max}: {mismatch}"
        groups = dev.trace[-1].threadgroups
        assert (marks[:groups, 0] == library.DONE | product.K).all()
    assert dev.trace[-1].threadgroup_size == device_max


@pytest.mark.parametrize("H", [1, 7, 9, 33, 65])
def test_tiled_gru_row_blocks_read_their_own_b(H):
    """dR of GRU without reset_after, laid out as MetalHost.gradients does: per direction d,
    C[3H, H] = dA[:, d]ᵀ · rhs[:, d] with rows [kH, (k+1)H) of C reading block k of rhs
    (b_block = H floats apart), so a tile must not straddle two blocks."""
    rng = np.random.default_rng(H)
    product = _row_blocks(rng, 2, H, 37)  # K = T·N rows
    want = product.want()
    for device in (dict(), HARSH):
        dev = metalcompute.Device(**device)
        for version in ("v1",) + VERSIONS:
            assert_product(dev, product, version, quantity="recurrent_weight")
    # The blocks matter: reading block 0 for every row would be far off.
    product.b_block = 0
    if H > 1:
        assert compare_array("recurrent_weight", product.want(), want, np.float32)[1] is not None


def test_long_k_reduction_is_as_accurate_as_v1():
    """A weight-gradient-like reduction over K = 13000 rows (dAᵀ·source; operands with a mean,
    so partial sums grow): every version within the parameter tolerance of the float64 product,
    v2, v3 and v4 no worse than twice v1's error, and all far better than one running sum. A
    v3 without its running totals (one sum over K per element) must fail that last check."""
    rng = np.random.default_rng(21)
    M, P, K = 40, 33, 13000
    product = Product(rng, 1, M, P, K, a_t=True)
    product.A = (rng.standard_normal(product.A.size) + 0.5).astype(np.float32)
    product.B = (rng.standard_normal(product.B.size) + 0.5).astype(np.float32)
    want = product.want()
    scale = np.abs(want).max()
    dev = metalcompute.Device()
    errors = {}
    for version in ("v1",) + VERSIONS:
        assert_product(dev, product, version, quantity="input_weight")
        errors[version] = np.abs(run(dev, product, version)[0] - want).max() / scale
    for version in ("v3", "v5"):
        one_sum = _mutant(versions.GEMM_KERNELS[version], *MUTANTS[version]["no running total"])
        errors[f"{version} without running totals"] = (
            np.abs(run(dev, product, version, one_sum)[0] - want).max() / scale)
    A = product.A[:K * M].reshape(K, M)
    B = product.B[:K * P].reshape(K, P)
    running = np.zeros((M, P), np.float32)
    for k in range(K):  # one float32 running sum per element, in order
        running += np.outer(A[k], B[k])
    naive = np.abs(running - want).max() / scale
    assert all(errors[v] <= 2 * errors["v1"] for v in VERSIONS), errors
    assert max(errors[v] for v in ("v1",) + VERSIONS) < naive / 3, (errors, naive)
    assert errors["v3 without running totals"] >= naive / 3, (errors, naive)
    assert errors["v5 without running totals"] >= naive / 3, (errors, naive)


def test_tiled_nan_and_infinity_stay_where_the_product_puts_them():
    """A NaN in A[i, k] makes row i of C NaN, an infinity in B[k, j] makes column j infinite
    (NaN where A[·, k] is 0); no other element of the same 8×8 fragment may change. Both
    versions, with K long enough that partial sums are carried between chunks."""
    rng = np.random.default_rng(4)
    for version, device in (("v3", dict()), ("v3", HARSH),
                            ("v1", dict())):
        dev = metalcompute.Device(**device)
        product = Product(rng, 1, 20, 19, 300)
        A = product.A[:20 * 300].reshape(20, 300)
        B = product.B[:300 * 19].reshape(300, 19)
        A[3, 17] = np.nan
        A[5:9, 250] = 0.0
        B[250, 6] = -np.inf
        B[131, 11] = np.inf
        want = product.want(elementwise=True)
        assert np.isnan(want).sum() == 19 + 4 and np.isinf(want).sum() == 2 * 20 - 2 - 4
        got, _ = run(dev, product, version)
        ratio, mismatch = compare_array("input_weight", got, want, np.float32)
        assert mismatch is None, f"{version} {device}: {mismatch}"


# -- the checks can fail --------------------------------------------------------------------------

def _mutant(kernel, *edits):
    """The products' source (the header and gemm.metal: a mutant compiles only what it changes)
    with (old, new) edits made in ``kernel`` (from its attributes on)."""
    src = "\n".join([library.read(library.HEADER), library.read("gemm.metal")])
    start = src.rfind("\n\n", 0, src.index(f"kernel void {kernel}("))
    head, body = src[:start], src[start:]
    for old, new in edits:
        assert old in body, old
        body = body.replace(old, new, 1)
    return head + body


# No barrier after a chunk's multiply: the next chunk is staged over one still being read.
_NO_BARRIER = [("threadgroup_barrier(mem_flags::mem_threadgroup);\n            }\n", "\n            }\n")]
MUTANTS = {"v3": {
    "missing barrier": _NO_BARRIER,
    "no zero padding": [
        ("As[k * GB_LD + r] = (r < rows && k < kn) ? a[r * p.a_row + (k0 + k) * p.a_k] : 0.0f;",
         "if (r < rows && k < kn) As[k * GB_LD + r] = a[r * p.a_row + (k0 + k) * p.a_k];"),
        ("Bs[k * GB_LD + j] = (j < cols && k < kn) ? bb[(k0 + k) * p.b_k + j * p.b_col] : 0.0f;",
         "if (j < cols && k < kn) Bs[k * GB_LD + j] = bb[(k0 + k) * p.b_k + j * p.b_col];")],
    # Threadgroup size assumed to be 256: with fewer threads, most 4×4 blocks are never done.
    "assumes 256 threads": [("uint rounds = (GB_THREADS + tpg - 1) / tpg;", "uint rounds = 1;")],
    # A tile straddles two row blocks: its rows past the first block read the first block's B.
    "ignores row blocks": [("uint span = p.b_block != 0 ? max(p.block, 1u) : max(p.M, 1u);",
                            "uint span = max(p.M, 1u);")],
    # One sum over K per element (checked by test_long_k_reduction_is_as_accurate_as_v1).
    "no running total": [("if (c % GB_GROUP == GB_GROUP - 1) {", "if (false) {")],
}, "v4": {
    # the slices' sums read before every slice has stored its own
    "missing barrier": [("threadgroup_barrier(mem_flags::mem_threadgroup);\n        if (sl == 0",
                         "if (sl == 0")],
    # Threadgroup size assumed to be 256: with fewer threads, slices of K are never summed.
    "assumes 256 threads": [("uint slices = min(tpg, (uint)GS_THREADS) / GS_COLS;",
                             "uint slices = GS_THREADS / GS_COLS;")],
    # One sum over K per element (checked by test_long_k_reduction_is_as_accurate_as_v1).
    "no running total": [("if (((k - k0) & 63u) == 63u) {", "if (false) {")],
}, "v5": {
    # the next chunk staged while others still multiply the one it overwrites two chunks on
    "missing barrier": [("threadgroup_barrier(mem_flags::mem_threadgroup);\n            }\n            if (active) {",
                         "\n            }\n            if (active) {")],
    # the next chunk stored over the one being multiplied instead of into the other buffer
    "one buffer": [("uint nxt = (1 - cur) * chunk_floats;", "uint nxt = cur * chunk_floats;")],
    # Every element staged as if the tile and the chunk were whole: the edges read past them.
    "no zero padding": [
        ("gw_stage(as, bs, 0, p, a, bb, a_by_k, b_by_k, rows, cols, 0,\n                         min(kn_all, (uint)GW_K),",
         "gw_stage(as, bs, 0, p, a, bb, a_by_k, b_by_k, GW_TILE, GW_TILE, 0,\n                         GW_K,"),
        ("gw_a(p, a, a_by_k, e, k1, kn1, rows, at_a[q])", "gw_a(p, a, a_by_k, e, k1, GW_K, GW_TILE, at_a[q])"),
        ("gw_b(p, bb, b_by_k, e, k1, kn1, cols, at_b[q])", "gw_b(p, bb, b_by_k, e, k1, GW_K, GW_TILE, at_b[q])"),
        ("gw_stage(as, bs, nxt, p, a, bb, a_by_k, b_by_k, rows, cols, k1, kn1,",
         "gw_stage(as, bs, nxt, p, a, bb, a_by_k, b_by_k, GW_TILE, GW_TILE, k1, GW_K,"),
        ("gw_load4(a, a_by_k, p.a_row, p.a_k, lid, 0, kn0, rows)",
         "gw_load4(a, a_by_k, p.a_row, p.a_k, lid, 0, GW_K, GW_TILE)"),
        ("gw_load4(bb, b_by_k, p.b_col, p.b_k, lid, 0, kn0, cols)",
         "gw_load4(bb, b_by_k, p.b_col, p.b_k, lid, 0, GW_K, GW_TILE)"),
        ("va = gw_load4(a, a_by_k, p.a_row, p.a_k, lid, k1, kn1, rows);",
         "va = gw_load4(a, a_by_k, p.a_row, p.a_k, lid, k1, GW_K, GW_TILE);"),
        ("vb = gw_load4(bb, b_by_k, p.b_col, p.b_k, lid, k1, kn1, cols);",
         "vb = gw_load4(bb, b_by_k, p.b_col, p.b_k, lid, k1, GW_K, GW_TILE);")],
    # Threadgroup size assumed to be 256: with fewer threads, most 8×8 blocks are never done.
    "assumes 256 threads": [("uint rounds = (GW_THREADS + tpg - 1) / tpg;", "uint rounds = 1;")],
    "ignores row blocks": [("uint span = p.b_block != 0 ? max(p.block, 1u) : max(p.M, 1u);",
                            "uint span = max(p.M, 1u);")],
    # One sum over K per element (checked by test_long_k_reduction_is_as_accurate_as_v1).
    "no running total": [("if (c % GW_GROUP == GW_GROUP - 1) {", "if (false) {")],
}}


def _row_blocks(rng, D, H, K):
    """dR of GRU without reset_after (see test_tiled_gru_row_blocks_read_their_own_b)."""
    product = Product(rng, D, 3 * H, H, K, block=H, b_block=H)
    product.a_batch, product.a_row, product.a_k = 3 * H, 1, D * 3 * H  # dA [T·N, D·3H]
    product.b_batch, product.b_k, product.b_col = 3 * H, D * 3 * H, 1  # rhs [T·N, D, 3, H]
    product.A = rng.standard_normal(K * D * 3 * H).astype(np.float32)
    product.B = rng.standard_normal(K * D * 3 * H).astype(np.float32)
    return product


def assert_mutant_fails(options, product, version, source, mutant):
    """The mutant ``source`` of ``version``'s kernel gives a wrong product on a harness device
    of ``options``, or the harness stops it reading past a buffer; the real kernel then passes
    on such a device."""
    dev = metalcompute.Device(**options)
    try:
        got, _ = run(dev, product, version, source=source)
    except metalcompute.error as exc:  # the harness stopped it reading past a buffer
        # in a buffer's guard page ("past its end"), or further on, where another buffer's
        # memory or nothing is mapped (which of them depends on the process's address space)
        assert "invalid memory access" in str(exc) and "past" in str(exc), exc
        dev = metalcompute.Device(**options)
    else:
        ratio, mismatch = compare_array("input_weight", got, product.want(), np.float32)
        assert mismatch is not None, f"mutant '{mutant}' passed (worst ratio {ratio})"
    assert_product(dev, product, version)  # the real kernel passes on the same device


@pytest.mark.parametrize("version, mutant", [(v, m) for v in VERSIONS for m in MUTANTS[v]
                                             if m != "no running total"])
def test_mutants_of_the_tiled_kernels_fail(version, mutant):
    source = _mutant(versions.GEMM_KERNELS[version], *MUTANTS[version][mutant])
    rng = np.random.default_rng(1)
    if mutant == "ignores row blocks":
        product = _row_blocks(rng, 2, 9, 37)
    elif version == "v3":
        product = Product(rng, 2, 65, 67, 129, bias=True)
    else:
        product = Product(rng, 2, 33, 31, 65, bias=True)
    assert_mutant_fails(HARSH, product, version, source, mutant)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("mutant", ["missing barrier", "one buffer", "no zero padding"])
def test_mutants_of_v5_float4_staging_fail(mutant, transposed):
    """v5's float4 staging (256 threads, rows padded to a multiple of 4 floats; A along k and B
    along the tile's columns, or the other way round with transposed operands) fails each
    planted defect: M = P = 33 end inside a tile and inside a float4, K = 65 inside a chunk."""
    source = _mutant(versions.GEMM_KERNELS["v5"], *MUTANTS["v5"][mutant])
    rng = np.random.default_rng(2)
    product = Product(rng, 1, 33, 33, 65, pad=3, bias=True, a_t=transposed, b_t=transposed)
    # whole float4s, so that the harness's buffers (which end at a guard page) start 16-byte
    # aligned, as Metal's and the host's do
    product.A = np.concatenate([product.A, np.zeros(-product.A.size % 4, np.float32)])
    product.B = np.concatenate([product.B, np.zeros(-product.B.size % 4, np.float32)])
    if transposed:
        assert (product.a_row, product.b_k) == (1, 1) and product.a_k % 4 == product.b_col % 4 == 0
    else:
        assert (product.a_k, product.b_col) == (1, 1) and product.a_row % 4 == product.b_k % 4 == 0
    assert_mutant_fails(dict(schedule="adversarial", seed=7), product, "v5", source, mutant)


# -- the backend with each version ---------------------------------------------------------------------

def _descriptors(cell):
    rng = np.random.default_rng(len(cell))
    extra = [dict(reset_after=False), dict(reset_after=True)] if cell == "gru" else [{}]
    return [random_descriptor(rng, cell, bidirectional=bi, reverse=rev, training=True, **more)
            for more in extra for bi, rev in ((True, False), (False, True))]


#: T, N (T·N = 65 rows: two 64-row tiles of v3) and H, I of the whole-op checks per version
BACKEND_SHAPES = {"v3": dict(T=5, N=13, H=9, I=5),
                  "v4": dict(T=4, N=5, H=9, I=5), "v5": dict(T=5, N=13, H=9, I=5)}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("cell", CELLS)
def test_backend_with_tiled_forced_matches_the_reference(cell, version):
    """Every product of the forward and gradient ops through the tiled version, under an
    adversarial schedule with 64-thread threadgroups, for each direction mode (and GRU's
    reset_after), with every optional input and with none."""
    n = 0
    for i, desc in enumerate(_descriptors(cell)):
        for optional in (ALL_OPTIONAL, NO_OPTIONAL):
            rng = np.random.default_rng(100 * i + len(optional) + (optional is ALL_OPTIONAL))
            case = random_case(rng, cell, descriptor=desc, **BACKEND_SHAPES[version], dtype=np.float32,
                               optional=optional, cell_gradient_form="per_step" if i % 2 else "final")
            with versions.overrides(gemm=version), emulated_device(**dict(HARSH, seed=i)) as dev:
                for gradients in (False, True):
                    ratio, mismatches = check_case(case, BACKEND, gradients)
                    assert not mismatches, (
                        f"{version} {'gradients' if gradients else 'forward'}:\n"
                        + "\n".join(map(str, mismatches[:5])) + f"\nreproduce with:\n{case!r}")
            products = [d.kernel for d in dev.trace if "gemm" in d.kernel]
            assert products and set(products) == {versions.GEMM_KERNELS[version]}, products
            n += len(products)
    assert n >= 12


def test_backend_with_v3_from_the_environment(monkeypatch):
    """RNNGRAD_METAL_GEMM=v3 runs every product of a bidirectional GRU (reset_after False: dR
    in row blocks) through strided_gemm_blocked with its own 256-thread threadgroups."""
    monkeypatch.setenv(versions.GEMM_ENV, "v3")
    rng = np.random.default_rng(33)
    desc = random_descriptor(rng, "gru", bidirectional=True, training=True, reset_after=False)
    case = random_case(rng, "gru", descriptor=desc, T=9, N=8, H=23, I=70, dtype=np.float32,
                       optional=ALL_OPTIONAL)
    with emulated_device(schedule="adversarial", seed=5) as dev:
        for gradients in (False, True):
            ratio, mismatches = check_case(case, BACKEND, gradients)
            assert not mismatches, "\n".join(map(str, mismatches[:5]))
    products = [d for d in dev.trace if "gemm" in d.kernel]
    assert {d.kernel for d in products} == {BLOCKED}
    assert {d.threadgroup_size for d in products} == {256}
    assert max(d.threadgroups for d in products) >= 4


def test_backend_auto_rule_tiles_the_large_products(caplog, monkeypatch, metal_rules):
    """An LSTM whose input-side products reach 2**20 multiply-adds: the rule tiles those (v3)
    and keeps the smaller dR and the one-row reductions on v1; the result matches, and the
    choices are logged once each, naming the entry points that ran, in order. (The tile-count
    condition is lowered to 1 so that a shape the CPU harness runs quickly is tiled.)"""
    metal_rules(tiled_min_tiles=1)
    monkeypatch.setenv(versions.RECURRENCE_ENV, "v2")
    metal_rules(wide_min_groups=2)  # v5 only with two threadgroups
    TILED = BLOCKED
    rng = np.random.default_rng(8)
    desc = random_descriptor(rng, "lstm", bidirectional=False, training=True)
    case = random_case(rng, "lstm", descriptor=desc, T=16, N=8, H=32, I=64, dtype=np.float32,
                       optional=dict(ALL_OPTIONAL, mask=False))
    with caplog.at_level("DEBUG", logger="rnngrad.backends.metal"), emulated_device() as dev:
        ratio, mismatches = check_case(case, BACKEND, True)
    assert not mismatches, "\n".join(map(str, mismatches[:5]))
    # T·N = 128 rows, G·H = 128: x' and d_source and dW are 2**20 multiply-adds, dR 2**19.
    assert [d.kernel for d in dev.trace] == [
        TILED, "lstm_forward_v2_spread_512",    # x' = source·Wᵀ + b (H <= v2_512_h)
        "lstm_backward_v2_ahead_peephole", "strided_gemm",  # dR
        TILED, TILED,                           # d_source, dW
        "strided_gemm", "strided_gemm"]         # db, dpeephole: one-row reductions
    logged = [r.getMessage() for r in caplog.records if r.name == "rnngrad.backends.metal"]
    # "<backend>: <version> <entry point>: <why>", one a dispatch, made with the plans
    named = [m.split(": ")[1].split(" ")[1] for m in logged]
    forward, gradients = named[:2], named[2:]  # each plan logs its recurrence, then its products
    assert sorted(forward) == sorted(d.kernel for d in dev.trace[:2]), logged
    assert sorted(gradients) == sorted(d.kernel for d in dev.trace[2:]), logged


def test_backend_refuses_an_unknown_setting(monkeypatch):
    case = random_case(3, "gru", T=2, N=2, H=2, I=2, dtype=np.float32,
                       optional=dict(input_weight=True))
    monkeypatch.setenv(versions.GEMM_ENV, "fast")
    with pytest.raises(ValueError, match="RNNGRAD_METAL_GEMM: expected one of v1, v3, v4, v5, auto, got 'fast'"):
        case.forward(backend=BACKEND)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_stopped_tiled_dispatch_raises(version):
    """The completion marks of v3, v4 and v5: a dispatch whose later threadgroups never ran is
    named."""
    TILED = versions.GEMM_KERNELS[version]
    rng = np.random.default_rng(2)
    desc = random_descriptor(rng, "gru", bidirectional=True, training=True)
    case = random_case(rng, "gru", descriptor=desc, T=4, N=5, H=9, I=6, dtype=np.float32,
                       optional=ALL_OPTIONAL)
    with versions.overrides(gemm=version):
        with emulated_device(max_threads_per_threadgroup=32) as dev:
            case.training_forward(backend=BACKEND)
        first = dev.trace[0]
        assert first.kernel == TILED and first.threadgroups >= 2
        with emulated_device(max_threads_per_threadgroup=32, stop=(0, 1)):
            with pytest.raises(IncompleteDispatch) as info:
                case.training_forward(backend=BACKEND)
    assert info.value.kernel == TILED and info.value.dispatch == 0
    assert info.value.missing == tuple(range(1, first.threadgroups))
    assert f"kernel {TILED} did not finish" in str(info.value)


# -- the recurrences' grids ----------------------------------------------------------------------

@pytest.mark.parametrize("cell", CELLS)
def test_one_threadgroup_per_row_gives_bitwise_the_packed_results(cell, monkeypatch):
    """The grids differ only in which threadgroup owns which rows: same bits, every option."""
    rng = np.random.default_rng(21)
    desc = random_descriptor(rng, cell, bidirectional=True, training=True)
    case = random_case(rng, cell, descriptor=desc, T=3, N=3, H=5, I=4, dtype=np.float32,
                       optional=ALL_OPTIONAL)
    results, counts = [], []
    for grid in ("packed", "rows"):
        monkeypatch.setenv(versions.RECURRENCE_ENV, grid)
        with emulated_device(max_threads_per_threadgroup=64) as dev:
            forward = case.forward(backend=BACKEND)
            gradients = case.gradients(BACKEND)
        results.append([np.asarray(a) for a in list(forward) + list(gradients)])
        counts.append({d.count for d in dev.trace if not d.kernel.startswith("strided_gemm")})
    assert counts == [{2 * 3 * 5}, {2 * 3 * 1024}]
    for packed, rows in zip(*results):
        assert np.array_equal(packed, rows, equal_nan=True)
