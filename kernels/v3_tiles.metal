// v3_tiles.metal: the helpers of the v3 recurrence kernels (<cell>_{forward,backward}_v3), after
// v2_rows.metal in the library source (rnngrad/backends/metal/library.py): one step a dispatch,
// each threadgroup a tile of the step's recurrent product (both factors staged through
// threadgroup memory), then the cell's element-wise work for the tile.
//
// A tile is rows n0 .. n0 + rows − 1 of one direction d (4·WR rows, WR = min(4, ⌈N / 4⌉)) ×
// a block of units u0 .. u0 + units − 1 (p.unit_blocks = U blocks of ⌈H / U⌉). Its product is
// C[r, c] = Σ_k A[r, k] · B[c, k] over k < K, where a unit has cpu columns c (the forward of
// the LSTM and GRU: one per gate, so that the epilogue finds a unit's gates together; else 1).
// Worker w = wc + WC · wr owns the 4×4 block of C at rows 4wr.., columns 4wc.. (WC = ⌈cpu ·
// ⌈H / U⌉ / 4⌉ <= RS_COLS / 4) and reads its rows and columns at one k of the k-major stage as
// two float4 (consecutive lanes take consecutive wc: no bank conflicts). The threads split each
// chunk into KS slices (the largest power of two ≤ RS_KS with KS · W ≤ tpg), whose partial
// blocks meet in threadgroup memory (rs_sum); below W threads the workers run in rounds, each
// walking K again. Tiles are numbered t = (d · ⌈N / (4 WR)⌉ + row tile) · U + unit block.

#define RS_ROWS 16            // rows of a tile at most (4 · WR)
#define RS_COLS 64            // columns of a tile at most (4 · WC)
#define RS_K 32               // k per staged chunk at least, and its granularity (rs_chunk:
                              // rs_item's blocks of 8 k-quads)
#define RS_KMAX 96            // k per staged chunk at most
#define RS_STAGE 4096         // floats of the staged chunk: A's, then B's (rs_stage_width)
#define RS_KS 16              // slices of a chunk at most
#define RS_RED 4096           // floats of partial blocks: KS · W · 16 <= 256 · 16 (or W · 16)

// One tile of a v3 dispatch and the split of its product over the threadgroup.
struct RsTile {
    uint d, n0, rows;         // direction, first batch index, rows (<= 4 · WR)
    uint u0, units;           // first unit, units
    uint WR, WC, W;           // workers down the rows and across the columns; W = WR · WC
    uint KS, KC;              // slices of a chunk, k of a slice
    uint KCH;                 // k per staged chunk (rs_chunk)
};

// Row tiles of one direction.
inline uint rs_row_tiles(constant RecurrenceParams& p) {
    uint WR = min(4u, (p.N + 3) / 4);
    return (p.N + 4 * WR - 1) / (4 * WR);
}

// Tiles of the dispatch: D · row tiles · U.
inline uint rs_tiles(constant RecurrenceParams& p) {
    return p.D * rs_row_tiles(p) * max(p.unit_blocks, 1u);
}

// Floats a k of the stage holds for 4·WC columns of B: the next power of two from 16 (a quad
// index within it can be permuted by rs_quad), at most RS_COLS.
inline uint rs_stage_width(uint WC) {
    uint cols = 4 * WC;
    return cols <= 16 ? 16u : (cols <= 32 ? 32u : (uint)RS_COLS);
}

// k per staged chunk: as many multiples of 32 as RS_STAGE holds for the tile's A (RS_ROWS a
// k) and B (rs_stage_width a k), at most RS_KMAX, so that the backward's narrow tiles take a
// third of the chunks (and barriers) over a long K.
inline uint rs_chunk(uint WC) {
    return min((uint)RS_KMAX, RS_STAGE / (RS_ROWS + rs_stage_width(WC)) / RS_K * RS_K);
}

// Tile t with cpu columns a unit, for a threadgroup of tpg threads.
inline RsTile rs_tile(constant RecurrenceParams& p, uint t, uint cpu, uint tpg) {
    RsTile g;
    uint U = max(p.unit_blocks, 1u);
    uint per = (p.H + U - 1) / U;
    uint rt = rs_row_tiles(p);
    g.WR = min(4u, (p.N + 3) / 4);
    uint ub = t % U;
    uint rb = (t / U) % rt;
    g.d = t / (U * rt);
    g.n0 = rb * 4 * g.WR;
    g.rows = min(4 * g.WR, p.N - g.n0);
    g.u0 = min(ub * per, p.H);
    g.units = min(per, p.H - g.u0);
    g.WC = (per * cpu + 3) / 4;
    g.W = g.WR * g.WC;
    uint ks = 1;
    while (ks < RS_KS && 2 * ks * g.W <= tpg) {
        ks *= 2;
    }
    g.KS = ks;
    g.KCH = rs_chunk(g.WC);
    g.KC = g.KCH / ks;
    return g;
}

// Whether the host's unit blocks fit the kernel's tile (a unit block of at most RS_COLS
// columns); a threadgroup whose tiles do not fit leaves no completion mark.
inline bool rs_fits(constant RecurrenceParams& p, uint cpu) {
    uint U = max(p.unit_blocks, 1u);
    return ((p.H + U - 1) / U) * cpu <= RS_COLS;
}

// Staged float4 items of a chunk a thread keeps in registers (rs_product's held path).
#define RS_ITEMS 3

// Item f of a staged chunk: a k-quad of one row of A (f < 4·WR · KCH / 4) or of one column of
// B. Items go in blocks of 32, 4 rows (or columns) × 8 k-quads, so that a SIMD-group reads four
// runs of 128 contiguous bytes and its stores spread over the banks (rs_quad).
struct RsItem {
    uint off, k, pos;         // source offset, first k within the chunk, row or column
    bool a, ok, in;           // of A; read (else zeros); stored
};

inline RsItem rs_item(RsTile g, uint f, uint lda, uint K, uint cpu, uint4 goff, uint ng) {
    uint quads = g.KCH / 4, groups = quads / 8;  // k-quads a row, blocks of 8 of them
    uint na = 4 * g.WR * quads;
    bool a = f < na;
    uint e = a ? f : f - na;
    uint block = e / 32, w = e % 32;
    uint pos = 4 * (block / groups) + w / 8;
    RsItem it;
    it.k = 4 * (8 * (block % groups) + w % 8);
    it.pos = pos;
    it.a = a;
    if (a) {
        it.ok = pos < g.rows;
        it.in = true;
        it.off = pos * lda;
    } else {
        uint u = pos / cpu, gs = pos % cpu;
        uint o = gs == 0 ? goff.x : (gs == 1 ? goff.y : (gs == 2 ? goff.z : goff.w));
        it.in = pos < 4 * g.WC;
        it.ok = it.in && u < g.units && gs < ng;
        it.off = it.ok ? (o + g.u0 + u) * K : 0u;
    }
    return it;
}

// The item's four values at chunk k0 (kn k in the chunk) of src (a, am or w, whose offsets the
// item holds), zeros past the edges; vec: one float4 load (every offset a multiple of 4 floats).
inline float4 rs_fetch(RsItem it, uint k0, uint kn, device const float* src, bool vec) {
    float4 v = float4(0.0f);
    if (!it.ok || it.k >= kn) {
        return v;
    }
    src += it.off + k0 + it.k;
    if (vec) {
        return *(device const float4*)src;
    }
    #pragma unroll
    for (uint j = 0; j < 4; ++j) {
        if (it.k + j < kn) {
            v[j] = src[j];
        }
    }
    return v;
}

// The item's values (v) and factors (m: A's mask where masked, else ones) at chunk k0: loads
// only, so that their round trips overlap whatever the thread does before it stores v · m.
inline void rs_fetch_item(RsItem it, uint k0, uint kn, device const float* a,
                          device const float* am, bool masked, device const float* w, bool vec,
                          thread float4& v, thread float4& m) {
    v = rs_fetch(it, k0, kn, it.a ? a : w, vec);
    m = it.a && masked ? rs_fetch(it, k0, kn, am, vec) : float4(1.0f);
}

// The float4 of the k-major stage that holds rows (of A: RS_ROWS floats a k) or columns (of B:
// width floats a k) 4q .. 4q + 3 at chunk k: the quads of a k permuted by an XOR with ⌊k / 4⌋
// (mod at most 8), so that consecutive threads' stores spread over the banks.
inline uint rs_quad(uint k, uint q, uint width) {
    uint quads = width / 4;
    return k * quads + (q ^ ((k / 4) % (quads < 8 ? quads : 8u)));
}

// Store an item's four values in the k-major stage: A's at As, B's at Bs (bw floats a k).
inline void rs_put(threadgroup float* As, threadgroup float* Bs, uint bw, RsItem it, float4 v) {
    if (!it.in) {
        return;
    }
    uint width = it.a ? (uint)RS_ROWS : bw;
    threadgroup float* stage = it.a ? As : Bs;
    uint lane = it.pos % 4, q = it.pos / 4;
    stage[4 * rs_quad(it.k, q, width) + lane] = v.x;
    stage[4 * rs_quad(it.k + 1, q, width) + lane] = v.y;
    stage[4 * rs_quad(it.k + 2, q, width) + lane] = v.z;
    stage[4 * rs_quad(it.k + 3, q, width) + lane] = v.w;
}

// The tile's product, left in red for rs_sum: C[r, c] = Σ_{k<K} A[r, k] · B[c, k] with
//   A[r, k] = a[r · lda + k] (· am[r · lda + k] when masked) for r < g.rows, else 0;
//   B[c, k] = w[(o + g.u0 + c / cpu) · K + k], o = goff's entry c mod cpu, for
//             c / cpu < g.units and c mod cpu < ng, else 0.
// K is walked in chunks of g.KCH k staged in stage (A's chunk k-major, then B's); each thread
// issues the loads of up to RS_ITEMS items before it stores any. Where a chunk has at most
// RS_ITEMS items a thread (held), the next chunk's loads are issued before this chunk's product
// and stored after it. Every thread calls it (g uniform); it ends with a barrier.
inline void rs_product(threadgroup float4* stage, threadgroup float* red, RsTile g, uint K,
                       device const float* a, device const float* am, bool masked, uint lda,
                       device const float* w, uint cpu, uint4 goff, uint ng, uint lid,
                       uint tpg) {
    uint KCH = g.KCH, bw = rs_stage_width(g.WC);
    threadgroup float4* As4 = stage;
    threadgroup float4* Bs4 = stage + KCH * RS_ROWS / 4;
    threadgroup float* As = (threadgroup float*)As4;
    threadgroup float* Bs = (threadgroup float*)Bs4;
    uint items = (4 * g.WR + 4 * g.WC) * (KCH / 4);  // float4 items a chunk
    bool held = items <= RS_ITEMS * tpg;
    bool vec = K % 4 == 0 && lda % 4 == 0;
    uint rounds = (g.W + tpg - 1) / tpg;  // > 1 only when tpg < W (then KS = 1)
    uint chunks = (K + KCH - 1) / KCH;
    RsItem mine[RS_ITEMS];
    float4 v[RS_ITEMS], m[RS_ITEMS];  // an item's values and their factors (rs_fetch_item)
    #pragma unroll
    for (uint i = 0; i < RS_ITEMS; ++i) {
        mine[i] = rs_item(g, held ? lid + i * tpg : items, lda, K, cpu, goff, ng);
    }
    for (uint turn = 0; turn < rounds; ++turn) {
        uint slot = lid + turn * tpg;
        uint sl = slot / g.W, wk = slot % g.W;
        bool active = sl < g.KS;
        uint wr = wk / g.WC, wc = wk % g.WC;
        float acc[4][4];
        #pragma unroll
        for (uint i = 0; i < 4; ++i) {
            #pragma unroll
            for (uint j = 0; j < 4; ++j) {
                acc[i][j] = 0.0f;
            }
        }
        if (held) {
            #pragma unroll
            for (uint i = 0; i < RS_ITEMS; ++i) {
                rs_fetch_item(mine[i], 0, min(K, KCH), a, am, masked, w, vec, v[i], m[i]);
            }
        }
        for (uint ch = 0; ch < chunks; ++ch) {
            uint k0 = ch * KCH;
            if (held) {
                #pragma unroll
                for (uint i = 0; i < RS_ITEMS; ++i) {
                    rs_put(As, Bs, bw, mine[i], v[i] * m[i]);
                }
            } else {
                uint kn = min(K - k0, KCH);
                for (uint base = lid; base < items; base += RS_ITEMS * tpg) {
                    #pragma unroll
                    for (uint i = 0; i < RS_ITEMS; ++i) {  // mine holds nothing when not held
                        uint f = base + i * tpg;
                        mine[i] = rs_item(g, f < items ? f : items, lda, K, cpu, goff, ng);
                        rs_fetch_item(mine[i], k0, kn, a, am, masked, w, vec, v[i], m[i]);
                    }
                    #pragma unroll
                    for (uint i = 0; i < RS_ITEMS; ++i) {
                        rs_put(As, Bs, bw, mine[i], v[i] * m[i]);
                    }
                }
            }
            threadgroup_barrier(mem_flags::mem_threadgroup);
            if (held && ch + 1 < chunks) {  // the next chunk's loads, in flight meanwhile
                uint k1 = k0 + KCH;
                #pragma unroll
                for (uint i = 0; i < RS_ITEMS; ++i) {
                    rs_fetch_item(mine[i], k1, min(K - k1, KCH), a, am, masked, w, vec, v[i],
                                  m[i]);
                }
            }
            if (active) {
                for (uint kk = 0; kk < g.KC; ++kk) {
                    uint k = sl * g.KC + kk;
                    float4 fa = As4[rs_quad(k, wr, RS_ROWS)];
                    float4 fb = Bs4[rs_quad(k, wc, bw)];
                    #pragma unroll
                    for (uint i = 0; i < 4; ++i) {
                        #pragma unroll
                        for (uint j = 0; j < 4; ++j) {
                            acc[i][j] += fa[i] * fb[j];
                        }
                    }
                }
            }
            // Every slice is done with this chunk before the next is staged.
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (active) {
            #pragma unroll
            for (uint i = 0; i < 4; ++i) {
                #pragma unroll
                for (uint j = 0; j < 4; ++j) {
                    red[(sl * g.W + wk) * 16 + i * 4 + j] = acc[i][j];
                }
            }
        }
    }
    // The partial blocks are in red before any thread sums them.
    threadgroup_barrier(mem_flags::mem_threadgroup);
}

// C[r, c] of the tile rs_product left in red: its KS slices' partial sums, in slice order.
inline float rs_sum(threadgroup const float* red, RsTile g, uint r, uint c) {
    uint w = c / 4 + g.WC * (r / 4), e = (r % 4) * 4 + c % 4;
    float s = 0.0f;
    for (uint sl = 0; sl < g.KS; ++sl) {
        s += red[(sl * g.W + w) * 16 + e];
    }
    return s;
}

// The G sums of unit u in row r of a tile whose units have 4 columns (cpu = 4), in gate order.
inline float4 rs_unit_sums(threadgroup const float* red, RsTile g, uint r, uint u) {
    return float4(rs_sum(red, g, r, 4 * u), rs_sum(red, g, r, 4 * u + 1),
                  rs_sum(red, g, r, 4 * u + 2), rs_sum(red, g, r, 4 * u + 3));
}

// Tile t of a v3 forward's step s = p.s_begin, its product left in red (rs_sum): (h[t−1] ⊙ m) Rᵀ
// for the rows of the tile, h[t−1] = h0 at s = 0, R [D,G·H,H] as given. A single gate's columns
// are its units; the G > 1 gates of a unit are its columns 4u + k, k in the cell's order (the
// blocks gate0.. of the packed layout), so that the cell finds a unit's gates together.
inline RsTile rs_forward_tile(threadgroup float4* stage, threadgroup float* red,
                              constant RecurrenceParams& p, uint t, uint G, device const float* h0,
                              device const float* h, device const float* mask,
                              device const float* R, uint lid, uint tpg) {
    uint H = p.H, DH = p.D * p.H, s = p.s_begin;
    uint cpu = G == 1 ? 1u : 4u;
    RsTile g = rs_tile(p, t, cpu, tpg);
    uint at = g.n0 * DH + g.d * H;
    device const float* a = s == 0 ? h0 + at : h + rg_out_time(p, g.d, s - 1) * p.N * DH + at;
    uint4 gates = G == 1 ? uint4(0u) : uint4(p.gate0 * H, p.gate1 * H, p.gate2 * H,
                                              G == 4 ? p.gate3 * H : 0u);
    rs_product(stage, red, g, H, a, mask + rg_mask_step(p, s) + at, true, DH, R + g.d * G * H * H,
               cpu, gates, G, lid, tpg);
    return g;
}

// Tile t of a v3 backward dispatch, for the carry of step c = p.s_end (none at c = T, where dhn
// holds the host's): the product lhs R for the rows of the tile left in red (rs_carry), lhs
// [T,N,D·G·H] in input time, Rt [D,H,G·H]. Every thread calls it (rs_product ends with a
// barrier).
inline RsTile rs_backward_tile(threadgroup float4* stage, threadgroup float* red,
                               constant RecurrenceParams& p, uint t, uint G,
                               device const float* lhs, device const float* Rt, uint lid,
                               uint tpg) {
    uint GH = G * p.H, DGH = p.D * G * p.H, c = p.s_end;
    RsTile g = rs_tile(p, t, 1u, tpg);
    if (c < p.T) {
        device const float* a = lhs + (rg_x_time(p, g.d, c) * p.N + g.n0) * DGH + g.d * GH;
        rs_product(stage, red, g, GH, a, a, false, DGH, Rt + g.d * p.H * GH, 1u, uint4(0u), 1u,
                   lid, tpg);
    }
    return g;
}

// Item e of tile g of a v3 backward: the carry of step p.s_end for its (row, unit),
// dh_next = m ⊙ (lhs R), into dhn where p.s_end < T (added to what the GRU's phase A kept there:
// `add`); returns its row, unit and index in dhn, for the phase A that follows.
inline uint3 rs_carry(constant RecurrenceParams& p, RsTile g, threadgroup const float* red,
                      uint e, device const float* mask, device float* dhn, bool add) {
    uint DH = p.D * p.H, c = p.s_end;
    uint r = e / g.units, u = e % g.units;
    uint row = g.d * p.N + g.n0 + r, j = g.u0 + u;
    uint own = (g.n0 + r) * DH + g.d * p.H + j;
    if (c < p.T) {
        float carry = rs_sum(red, g, r, u) * mask[rg_mask_step(p, c) + own];
        dhn[own] = add ? dhn[own] + carry : carry;
    }
    return uint3(row, j, own);
}
