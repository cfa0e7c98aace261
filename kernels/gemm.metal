// gemm.metal: the matrix-product kernels of rnngrad, for everything that is not sequential.
//
// Every product the ops need outside the recurrence is a strided, batched C = A·B (+ bias)
// (GemmParams in common.metal gives the strides):
//   input projection      x'[T·N, D·G·H] = source[T·N, I] · input_weightᵀ + bias
//   source gradient       d_source[T·N, I] = dA[T·N, D·G·H] · input_weight
//   input weight gradient dW[D·G·H, I] = dAᵀ · source        (a reduction over T·N rows)
//   bias gradient         db[1, D·G·H] = 1ᵀ · dA             (A is a one-float buffer of 1)
//   recurrent weight grad dR[d][G·H, H] = lhs[d]ᵀ · rhs[d]   (batched over directions; GRU
//                         without reset_after reads a different rhs block for the o gate)
//   peephole / secondary-bias gradients: 1ᵀ · per-row partial sums the recurrence wrote
// The reductions run after the recurrence as separate passes: MSL 2.3 has no float atomics.
//
// Kernel versions (the host picks one per product: rnngrad/backends/metal/versions.py, gemm;
// kernels/README.md). Their numbers are the values of RNNGRAD_METAL_GEMM that force them. Every
// version sums K in chunks (64 k, or 128 in the tiled ones) whose totals join a running sum,
// which keeps a long reduction over T·N rows accurate in float32. The tiled versions split the
// host's tiles over the threadgroups they get (rg_rows); with fewer threads than a tile's
// blocks they run the blocks in rounds, each walking K again; their tiles never straddle a
// block of p.block rows when p.b_block != 0.
//   v1 strided_gemm: one thread per element of C, a sequential loop over K, no threadgroup
//      memory. Correct for any shape and any threadgroup size; not tiled.
//   v3 strided_gemm_blocked: one threadgroup per 64×64 tile of C (at most 256 threads, each
//      a 4×4 block of C in registers: rows ty + 16·x, columns tx + 16·y of the tile, so that 16
//      neighbouring threads read and store 16 consecutive floats). K walked in chunks of 32,
//      A's staged [k][i] and B's [k][j] (zero past the edges; consecutive threads load along
//      whichever index is unit stride), two barriers per chunk; threads past 256 only stage.
//      Any threadgroup of whole SIMD-groups up to 1024; the host gives 256 threads a tile.
//   v4 strided_gemm_split: for few elements of C over a long K (the reductions to one row): a
//      threadgroup per row of C and 32 columns (one a lane), K split into tpg / 32 contiguous
//      slices, one SIMD-group each; the first SIMD-group adds the slices' sums in slice order
//      and stores the 32 elements with the bias. Any threadgroup of whole SIMD-groups up to
//      1024; the host gives 1024 threads (32 slices) per 32 elements of a row.
//   v5 strided_gemm_wide: one threadgroup per 128×128 tile of C and slice of K (at most 256
//      threads, each an 8×8 block of C in registers: rows 4·ty + i and 64 + 4·ty + i, columns
//      4·tx + j and 64 + 4·tx + j, i, j < 4, so that each k of a chunk is four float4 reads for
//      64 multiply-adds). K walked in chunks of 8 through two threadgroup buffers: each thread
//      holds its share of the next chunk in registers while this one is multiplied, one barrier
//      per chunk. A thread stages one float4 of each operand a chunk (gw_load4) where the
//      threadgroup has 256 threads and the strides allow, else four elements (gw_a, gw_b). With
//      p.k_split != 0, slice s of K (p.k_split k, its own threadgroups) is stored at
//      C + s·batch·M·P without the bias, and the host adds the slices in order (v1 over them).
//      Any threadgroup of whole SIMD-groups up to 256; the host gives 256 threads a tile and
//      slice.
//
// Buffers of strided_gemm and strided_gemm_blocked
// Buffers of strided_gemm_split and strided_gemm_wide
// (count, the threads the host dispatched: strided_gemm batch·M·P, a thread an element of C;
// strided_gemm_blocked GB_THREADS · tiles; strided_gemm_split GS_THREADS · batch · M ·
// ⌈P / GS_COLS⌉; strided_gemm_wide GW_THREADS · tiles · slices: versions.py counts them)
//   index  type                        name    layout
//   0      constant GemmParams&        p       scalars
//   1      device const float*         A       strided by p.a_batch, p.a_row, p.a_k
//   2      device const float*         B       strided by p.b_batch, p.b_k, p.b_col, p.b_block
//   3      device const float*         bias    [P] (read only when p.has_bias; by the first
//                                              slice of K in strided_gemm_wide)
//   4      device float*               C       [batch, M, P]; strided_gemm_wide:
//                                              [slices, batch, M, P]
//   5      device uint2*               status  [ceil(count/32)] completion marks (steps: K)

kernel void strided_gemm(
        constant GemmParams& p [[buffer(0)]], device const float* A [[buffer(1)]],
        device const float* B [[buffer(2)]], device const float* bias [[buffer(3)]],
        device float* C [[buffer(4)]], device uint2* status [[buffer(5)]],
        uint gid [[thread_position_in_grid]], uint lid [[thread_position_in_threadgroup]],
        uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]]) {
    if (gid < p.count) {  // the grid is padded to whole threadgroups
        uint j = gid % p.P;
        uint rest = gid / p.P;
        uint i = rest % p.M;
        uint b = rest / p.M;
        device const float* a = A + b * p.a_batch + i * p.a_row;
        device const float* bb = B + b * p.b_batch + j * p.b_col + (i / p.block) * p.b_block;
        float total = 0.0f;
        float chunk = 0.0f;
        // 16 loads of each factor in flight, more than the compiler's own unrolling keeps
        #pragma unroll 16
        for (uint k = 0; k < p.K; ++k) {
            chunk += a[k * p.a_k] * bb[k * p.b_k];
            if ((k & 63u) == 63u) {
                total += chunk;
                chunk = 0.0f;
            }
        }
        total += chunk;
        if (p.has_bias != 0) {
            total += bias[j];
        }
        C[gid] = total;
    }
    threadgroup_barrier(mem_flags::mem_device);  // padded threads (gid >= count) reach it too
    rg_mark(status, tgid, lid, tpg, p.K);
}

// Tile shape of strided_gemm_blocked; mirrored by rnngrad.backends.metal.versions
// (BLOCKED_TILE, BLOCKED_THREADS), where the host counts the tiles to size the grid.
enum GemmBlock : uint {
    GB_TILE = 64,           // rows and columns of C per tile
    GB_K = 32,              // k per staged chunk
    GB_LD = GB_TILE + 1,    // odd pitch of a staged k: a column-wise store of 32 k hits 32 banks
    GB_MICRO = 4,           // rows and columns of C per thread and micro-tile
    GB_SIDE = GB_TILE / GB_MICRO,       // 16 micro-tiles across a tile
    GB_THREADS = GB_SIDE * GB_SIDE,     // 256: one micro-tile each; the kernel's threadgroup limit
    GB_GROUP = 4,           // staged chunks summed before they join the running total (128 k)
};

[[max_total_threads_per_threadgroup(256)]]
kernel void strided_gemm_blocked(
        constant GemmParams& p [[buffer(0)]], device const float* A [[buffer(1)]],
        device const float* B [[buffer(2)]], device const float* bias [[buffer(3)]],
        device float* C [[buffer(4)]], device uint2* status [[buffer(5)]],
        uint lid [[thread_position_in_threadgroup]], uint tgid [[threadgroup_position_in_grid]],
        uint tpg [[threads_per_threadgroup]]) {
    threadgroup float As[GB_K * GB_LD];  // [k][i] chunk of the tile's A rows, transposed
    threadgroup float Bs[GB_K * GB_LD];  // [k][j] chunk of the tile's B columns

    // Rows of C that read one B: a block when B moves with the row block, else all M.
    uint span = p.b_block != 0 ? max(p.block, 1u) : max(p.M, 1u);
    uint blocks = (p.M + span - 1) / span;
    uint tiles_m = (span + GB_TILE - 1) / GB_TILE;  // per block
    uint tiles_n = (p.P + GB_TILE - 1) / GB_TILE;
    uint tiles = p.batch * blocks * tiles_m * tiles_n;
    uint2 mine = rg_rows(tiles, p.count, tpg, tgid);

    // the same number of rounds, so of barriers, for every thread
    uint rounds = (GB_THREADS + tpg - 1) / tpg;
    uint chunks = (p.K + GB_K - 1) / GB_K;
    bool a_by_k = p.a_k == 1;
    bool b_by_j = p.b_col == 1 || p.b_k != 1;

    for (uint t = mine.x; t < mine.y; ++t) {
        uint tn = t % tiles_n;
        uint rest = t / tiles_n;
        uint tm = rest % tiles_m;
        rest /= tiles_m;
        uint blk = rest % blocks;
        uint b = rest / blocks;
        uint row0 = blk * span + tm * GB_TILE;
        uint row_end = min(min(blk * span + span, p.M), row0 + GB_TILE);
        if (row0 >= row_end) {
            continue;  // past the last (short) block: the same for every thread
        }
        uint rows = row_end - row0;
        uint col0 = tn * GB_TILE;
        uint cols = min(p.P - col0, (uint)GB_TILE);
        device const float* a = A + b * p.a_batch + row0 * p.a_row;
        device const float* bb = B + b * p.b_batch + col0 * p.b_col + blk * p.b_block;
        device float* out = C + (b * p.M + row0) * p.P + col0;

        for (uint turn = 0; turn < rounds; ++turn) {
            uint m = lid + turn * tpg;  // micro-tile m: rows ty + 16·x, columns tx + 16·y
            bool active = m < GB_THREADS;
            uint tx = m % GB_SIDE;
            uint ty = (m / GB_SIDE) % GB_SIDE;
            float part[GB_MICRO][GB_MICRO];
            float total[GB_MICRO][GB_MICRO];
            for (uint x = 0; x < GB_MICRO; ++x) {
                for (uint y = 0; y < GB_MICRO; ++y) {
                    part[x][y] = 0.0f;
                    total[x][y] = 0.0f;
                }
            }
            for (uint c = 0; c < chunks; ++c) {
                uint k0 = c * GB_K;
                uint kn = min(p.K - k0, (uint)GB_K);
                for (uint e = lid; e < GB_K * GB_TILE; e += tpg) {
                    uint r = a_by_k ? e / GB_K : e % GB_TILE;
                    uint k = a_by_k ? e % GB_K : e / GB_TILE;
                    As[k * GB_LD + r] = (r < rows && k < kn) ? a[r * p.a_row + (k0 + k) * p.a_k] : 0.0f;
                }
                for (uint e = lid; e < GB_K * GB_TILE; e += tpg) {
                    uint j = b_by_j ? e % GB_TILE : e / GB_K;
                    uint k = b_by_j ? e / GB_TILE : e % GB_K;
                    Bs[k * GB_LD + j] = (j < cols && k < kn) ? bb[(k0 + k) * p.b_k + j * p.b_col] : 0.0f;
                }
                threadgroup_barrier(mem_flags::mem_threadgroup);
                if (active) {
                    for (uint k = 0; k < GB_K; ++k) {
                        float fa[GB_MICRO];
                        float fb[GB_MICRO];
                        for (uint x = 0; x < GB_MICRO; ++x) {
                            fa[x] = As[k * GB_LD + ty + GB_SIDE * x];
                            fb[x] = Bs[k * GB_LD + tx + GB_SIDE * x];
                        }
                        for (uint x = 0; x < GB_MICRO; ++x) {
                            for (uint y = 0; y < GB_MICRO; ++y) {
                                part[x][y] += fa[x] * fb[y];
                            }
                        }
                    }
                    if (c % GB_GROUP == GB_GROUP - 1) {
                        for (uint x = 0; x < GB_MICRO; ++x) {
                            for (uint y = 0; y < GB_MICRO; ++y) {
                                total[x][y] += part[x][y];
                                part[x][y] = 0.0f;
                            }
                        }
                    }
                }
                // Every thread is done with this chunk before the next is staged.
                threadgroup_barrier(mem_flags::mem_threadgroup);
            }
            if (active) {
                for (uint x = 0; x < GB_MICRO; ++x) {
                    uint r = ty + GB_SIDE * x;
                    for (uint y = 0; y < GB_MICRO; ++y) {
                        uint j = tx + GB_SIDE * y;
                        if (r < rows && j < cols) {
                            out[r * p.P + j] = (total[x][y] + part[x][y])
                                               + (p.has_bias != 0 ? bias[col0 + j] : 0.0f);
                        }
                    }
                }
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.K);
}

// Shape of strided_gemm_split; mirrored by rnngrad.backends.metal.versions (SPLIT_COLUMNS,
// SPLIT_THREADS), where the host counts the blocks of columns to size the grid.
enum GemmSplit : uint {
    GS_COLS = 32,           // columns of C per block, one a lane
    GS_THREADS = 1024,      // 32 slices of K; the kernel's threadgroup limit
};

[[max_total_threads_per_threadgroup(1024)]]
kernel void strided_gemm_split(
        constant GemmParams& p [[buffer(0)]], device const float* A [[buffer(1)]],
        device const float* B [[buffer(2)]], device const float* bias [[buffer(3)]],
        device float* C [[buffer(4)]], device uint2* status [[buffer(5)]],
        uint lid [[thread_position_in_threadgroup]], uint tgid [[threadgroup_position_in_grid]],
        uint tpg [[threads_per_threadgroup]]) {
    threadgroup float sums[GS_THREADS];  // [slice][column] of one block
    uint blocks = (p.P + GS_COLS - 1) / GS_COLS;
    uint2 mine = rg_rows(p.batch * p.M * blocks, p.count, tpg, tgid);
    uint slices = min(tpg, (uint)GS_THREADS) / GS_COLS;
    uint c = lid % GS_COLS, sl = lid / GS_COLS;
    uint kc = (p.K + slices - 1) / slices;
    for (uint u = mine.x; u < mine.y; ++u) {
        uint j = (u % blocks) * GS_COLS + c;
        uint rest = u / blocks;
        uint i = rest % p.M;
        uint b = rest / p.M;
        float total = 0.0f;
        if (sl < slices && j < p.P) {
            device const float* a = A + b * p.a_batch + i * p.a_row;
            device const float* bb = B + b * p.b_batch + j * p.b_col + (i / p.block) * p.b_block;
            uint k0 = min(sl * kc, p.K), k1 = min(k0 + kc, p.K);
            float chunk = 0.0f;
            for (uint k = k0; k < k1; ++k) {
                chunk += a[k * p.a_k] * bb[k * p.b_k];
                if (((k - k0) & 63u) == 63u) {
                    total += chunk;
                    chunk = 0.0f;
                }
            }
            total += chunk;
        }
        if (sl < slices) {
            sums[sl * GS_COLS + c] = total;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (sl == 0 && j < p.P) {
            float s = 0.0f;
            for (uint q = 0; q < slices; ++q) {
                s += sums[q * GS_COLS + c];
            }
            C[(b * p.M + i) * p.P + j] = s + (p.has_bias != 0 ? bias[j] : 0.0f);
        }
        // The sums are read before the next block's are stored.
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.K);
}

// Tile shape of strided_gemm_wide; mirrored by rnngrad.backends.metal.versions (WIDE_TILE,
// WIDE_THREADS, WIDE_K), where the host counts the tiles and slices to size the grid.
enum GemmWide : uint {
    GW_TILE = 128,          // rows and columns of C per tile
    GW_HALF = 64,           // a thread's rows (and columns) are two quads of 4, GW_HALF apart
    GW_K = 8,               // k per staged chunk
    GW_LD4 = GW_TILE / 4 + 1,  // pitch of a staged k in float4 (132 floats)
    GW_SIDE = 16,           // threads across a tile (each 2 quads of 4)
    GW_THREADS = 256,       // one 8×8 block each; the kernel's threadgroup limit
    GW_STAGE = GW_K * GW_TILE,  // floats of one operand per chunk
    GW_PRE = 4,             // of them, a thread's share held in registers (GW_STAGE / GW_THREADS)
    GW_GROUP = 16,          // chunks summed before they join the running total (128 k)
};

// Where element e of a staged chunk goes, as (row or column of the tile, k): consecutive e
// along k when that operand is contiguous in k (by_k), else along the tile's index.
inline uint2 gw_place(uint e, bool by_k) {
    return by_k ? uint2(e / GW_K, e % GW_K) : uint2(e % GW_TILE, e / GW_TILE);
}

// Element e of the A chunk at k0 (zero past the tile's rows or the slice's kn), and its place
// [k][i] in the staged chunk (in floats).
inline float gw_a(constant GemmParams& p, device const float* a, bool by_k, uint e, uint k0,
                  uint kn, uint rows, thread uint& at) {
    uint2 ik = gw_place(e, by_k);
    at = ik.y * GW_LD4 * 4 + ik.x;
    return (ik.x < rows && ik.y < kn) ? a[ik.x * p.a_row + (k0 + ik.y) * p.a_k] : 0.0f;
}

// Element e of the B chunk at k0 (zero past the tile's columns or kn), and its place [k][j].
inline float gw_b(constant GemmParams& p, device const float* b, bool by_k, uint e, uint k0,
                  uint kn, uint cols, thread uint& at) {
    uint2 jk = gw_place(e, by_k);
    at = jk.y * GW_LD4 * 4 + jk.x;
    return (jk.x < cols && jk.y < kn) ? b[(k0 + jk.y) * p.b_k + jk.x * p.b_col] : 0.0f;
}

// Stage this thread's elements e = lid + q·tpg, q in [q0, per), of the A and B chunks at k0
// (kn k of them) into the buffers at float offset at0 (elements past GW_STAGE: none).
inline void gw_stage(threadgroup float* as, threadgroup float* bs, uint at0,
                     constant GemmParams& p, device const float* a, device const float* b,
                     bool a_by_k, bool b_by_k, uint rows, uint cols, uint k0, uint kn,
                     uint q0, uint per, uint lid, uint tpg) {
    for (uint q = q0; q < per; ++q) {
        uint e = lid + q * tpg;
        if (e < GW_STAGE) {
            uint at;
            float v = gw_a(p, a, a_by_k, e, k0, kn, rows, at);
            as[at0 + at] = v;
            v = gw_b(p, b, b_by_k, e, k0, kn, cols, at);
            bs[at0 + at] = v;
        }
    }
}

// Float4 item q (< GW_STAGE / 4) of one operand's chunk at k0 (kn k of it) where the operand is
// read as float4 (the kernel's vec): along k where it is contiguous in k (by_k: row or column
// ⌊q / 2⌋, k 4·(q mod 2)), else along the tile's rows or columns, which are then contiguous
// (k ⌊q / 32⌋, rows 4·(q mod 32)); si, sk: its strides along the tile's index and along k. Zeros
// past the tile's n rows or columns and past kn.
inline float4 gw_load4(device const float* x, bool by_k, uint si, uint sk, uint q, uint k0,
                       uint kn, uint n) {
    uint i = by_k ? q / 2 : 4 * (q % 32);
    uint k = by_k ? 4 * (q % 2) : q / 32;
    device const float* at = x + i * si + (k0 + k) * sk;
    float4 v = float4(0.0f);
    if (by_k ? (i < n && k + 4 <= kn) : (k < kn && i + 4 <= n)) {
        return *(device const float4*)at;
    }
    #pragma unroll
    for (uint j = 0; j < 4; ++j) {  // an edge: the elements within it, one at a time
        if (by_k ? (i < n && k + j < kn) : (k < kn && i + j < n)) {
            v[j] = at[j];
        }
    }
    return v;
}

// Store item q (gw_load4's numbering) into a staged chunk [k][i] at pitch GW_LD4 · 4: four
// floats down k (by_k; consecutive lanes hit distinct banks: the pitch is 4 mod 32), else one
// float4 along i.
inline void gw_store4(threadgroup float* st, bool by_k, uint q, float4 v) {
    if (by_k) {
        uint i = q / 2, k = 4 * (q % 2);
        st[k * GW_LD4 * 4 + i] = v.x;
        st[(k + 1) * GW_LD4 * 4 + i] = v.y;
        st[(k + 2) * GW_LD4 * 4 + i] = v.z;
        st[(k + 3) * GW_LD4 * 4 + i] = v.w;
    } else {
        *(threadgroup float4*)(st + (q / 32) * GW_LD4 * 4 + 4 * (q % 32)) = v;
    }
}

[[max_total_threads_per_threadgroup(256)]]
kernel void strided_gemm_wide(
        constant GemmParams& p [[buffer(0)]], device const float* A [[buffer(1)]],
        device const float* B [[buffer(2)]], device const float* bias [[buffer(3)]],
        device float* C [[buffer(4)]], device uint2* status [[buffer(5)]],
        uint lid [[thread_position_in_threadgroup]], uint tgid [[threadgroup_position_in_grid]],
        uint tpg [[threads_per_threadgroup]]) {
    threadgroup float4 As[2 * GW_K * GW_LD4];  // two chunks of the tile's A rows, [k][i]
    threadgroup float4 Bs[2 * GW_K * GW_LD4];  // two chunks of its B columns, [k][j]
    threadgroup float* as = (threadgroup float*)As;
    threadgroup float* bs = (threadgroup float*)Bs;
    const uint chunk_floats = GW_K * GW_LD4 * 4;

    // Rows of C that read one B: a block when B moves with the row block, else all M.
    uint span = p.b_block != 0 ? max(p.block, 1u) : max(p.M, 1u);
    uint blocks = (p.M + span - 1) / span;
    uint tiles_m = (span + GW_TILE - 1) / GW_TILE;  // per block
    uint tiles_n = (p.P + GW_TILE - 1) / GW_TILE;
    uint kslice = p.k_split != 0 ? p.k_split : max(p.K, 1u);
    uint slices = max((p.K + kslice - 1) / kslice, 1u);
    uint2 mine = rg_rows(slices * p.batch * blocks * tiles_m * tiles_n, p.count, tpg, tgid);
    uint rounds = (GW_THREADS + tpg - 1) / tpg;
    uint per = (GW_STAGE + tpg - 1) / tpg;  // elements of each operand a thread stages
    bool a_by_k = p.a_k == 1;
    bool b_by_k = !(p.b_col == 1 || p.b_k != 1);
    // float4 staging where every offset the kernel forms is a multiple of 4 floats (A and B
    // start 16-byte aligned): along k (by_k) the row stride, else a unit stride along the tile
    // and a k stride of 4·n, and the batch and block strides.
    bool a_vec = (p.batch <= 1 || p.a_batch % 4 == 0) && (p.b_block == 0 || span % 4 == 0)
                 && (a_by_k ? p.a_row % 4 == 0 : (p.a_row == 1 && p.a_k % 4 == 0));
    bool b_vec = (p.batch <= 1 || p.b_batch % 4 == 0) && p.b_block % 4 == 0
                 && (b_by_k ? p.b_col % 4 == 0 : (p.b_col == 1 && p.b_k % 4 == 0));
    bool vec = tpg == GW_THREADS && a_vec && b_vec;

    for (uint t = mine.x; t < mine.y; ++t) {
        uint tn = t % tiles_n;
        uint rest = t / tiles_n;
        uint tm = rest % tiles_m;
        rest /= tiles_m;
        uint blk = rest % blocks;
        rest /= blocks;
        uint b = rest % p.batch;
        uint slice = rest / p.batch;
        uint row0 = blk * span + tm * GW_TILE;
        uint row_end = min(min(blk * span + span, p.M), row0 + GW_TILE);
        if (row0 >= row_end) {
            continue;  // past the last (short) block: the same for every thread
        }
        uint rows = row_end - row0;
        uint col0 = tn * GW_TILE;
        uint cols = min(p.P - col0, (uint)GW_TILE);
        uint kb = min(slice * kslice, p.K);
        uint kn_all = min(p.K - kb, kslice);
        uint chunks = (kn_all + GW_K - 1) / GW_K;
        device const float* a = A + b * p.a_batch + row0 * p.a_row + kb * p.a_k;
        device const float* bb = B + b * p.b_batch + col0 * p.b_col + blk * p.b_block + kb * p.b_k;
        device float* out = C + slice * p.batch * p.M * p.P + (b * p.M + row0) * p.P + col0;

        for (uint turn = 0; turn < rounds; ++turn) {
            uint m = lid + turn * tpg;
            bool active = m < GW_THREADS;
            uint tx = m % GW_SIDE;
            uint ty = (m / GW_SIDE) % GW_SIDE;
            float part[8][8];
            float total[8][8];
            #pragma unroll
            for (uint x = 0; x < 8; ++x) {
                #pragma unroll
                for (uint y = 0; y < 8; ++y) {
                    part[x][y] = 0.0f;
                    total[x][y] = 0.0f;
                }
            }
            // Chunk 0 into buffer 0.
            if (chunks > 0 && vec) {
                uint kn0 = min(kn_all, (uint)GW_K);
                gw_store4(as, a_by_k, lid, gw_load4(a, a_by_k, p.a_row, p.a_k, lid, 0, kn0, rows));
                gw_store4(bs, b_by_k, lid, gw_load4(bb, b_by_k, p.b_col, p.b_k, lid, 0, kn0, cols));
            } else if (chunks > 0) {
                gw_stage(as, bs, 0, p, a, bb, a_by_k, b_by_k, rows, cols, 0,
                         min(kn_all, (uint)GW_K), 0, per, lid, tpg);
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            for (uint c = 0; c < chunks; ++c) {
                uint cur = c % 2;
                bool more = c + 1 < chunks;  // the same for every thread
                uint k1 = (c + 1) * GW_K;
                uint kn1 = more ? min(kn_all - k1, (uint)GW_K) : 0u;
                // this thread's first GW_PRE elements of the next chunk, in flight meanwhile
                float pa[GW_PRE];
                float pb[GW_PRE];
                uint at_a[GW_PRE];
                uint at_b[GW_PRE];
                float4 va = float4(0.0f), vb = float4(0.0f);  // vec: the float4 of each
                if (vec && more) {
                    va = gw_load4(a, a_by_k, p.a_row, p.a_k, lid, k1, kn1, rows);
                    vb = gw_load4(bb, b_by_k, p.b_col, p.b_k, lid, k1, kn1, cols);
                }
                #pragma unroll
                for (uint q = 0; q < GW_PRE; ++q) {
                    uint e = lid + q * tpg;
                    pa[q] = 0.0f;
                    pb[q] = 0.0f;
                    at_a[q] = 0u;
                    at_b[q] = 0u;
                    if (!vec && more && e < GW_STAGE) {
                        pa[q] = gw_a(p, a, a_by_k, e, k1, kn1, rows, at_a[q]);
                        pb[q] = gw_b(p, bb, b_by_k, e, k1, kn1, cols, at_b[q]);
                    }
                }
                if (active) {
                    threadgroup const float4* ak = As + cur * GW_K * GW_LD4;
                    threadgroup const float4* bk = Bs + cur * GW_K * GW_LD4;
                    #pragma unroll
                    for (uint k = 0; k < GW_K; ++k) {
                        float4 a0 = ak[k * GW_LD4 + ty];
                        float4 a1 = ak[k * GW_LD4 + GW_SIDE + ty];
                        float4 b0 = bk[k * GW_LD4 + tx];
                        float4 b1 = bk[k * GW_LD4 + GW_SIDE + tx];
                        float fa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                        float fb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
                        #pragma unroll
                        for (uint x = 0; x < 8; ++x) {
                            #pragma unroll
                            for (uint y = 0; y < 8; ++y) {
                                part[x][y] += fa[x] * fb[y];
                            }
                        }
                    }
                    if (c % GW_GROUP == GW_GROUP - 1) {
                        #pragma unroll
                        for (uint x = 0; x < 8; ++x) {
                            #pragma unroll
                            for (uint y = 0; y < 8; ++y) {
                                total[x][y] += part[x][y];
                                part[x][y] = 0.0f;
                            }
                        }
                    }
                }
                if (more) {  // the next chunk into the other buffer (no thread reads it now)
                    uint nxt = (1 - cur) * chunk_floats;
                    if (vec) {
                        gw_store4(as + nxt, a_by_k, lid, va);
                        gw_store4(bs + nxt, b_by_k, lid, vb);
                    } else {
                        #pragma unroll
                        for (uint q = 0; q < GW_PRE; ++q) {
                            if (lid + q * tpg < GW_STAGE) {
                                as[nxt + at_a[q]] = pa[q];
                                bs[nxt + at_b[q]] = pb[q];
                            }
                        }
                        // the rest of it (threadgroups under 256 threads)
                        gw_stage(as, bs, nxt, p, a, bb, a_by_k, b_by_k, rows, cols, k1, kn1,
                                 GW_PRE, per, lid, tpg);
                    }
                }
                // The next chunk is staged, and every thread is done with this one (which the
                // chunk after next overwrites).
                threadgroup_barrier(mem_flags::mem_threadgroup);
            }
            if (active) {
                #pragma unroll
                for (uint x = 0; x < 8; ++x) {
                    uint r = (x < 4 ? 0u : (uint)GW_HALF) + 4 * ty + x % 4;
                    #pragma unroll
                    for (uint y = 0; y < 8; ++y) {
                        uint j = (y < 4 ? 0u : (uint)GW_HALF) + 4 * tx + y % 4;
                        if (r < rows && j < cols) {
                            out[r * p.P + j] = (total[x][y] + part[x][y])
                                               + (p.has_bias != 0 && slice == 0 ? bias[col0 + j] : 0.0f);
                        }
                    }
                }
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.K);
}
