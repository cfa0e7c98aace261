// v2_rows.metal: the helpers of the v2 recurrence kernels (<cell>_<direction>_v2_<body>[_512]),
// after common.metal in the library source (rnngrad/backends/metal/library.py).
//
// v2 gives each row a threadgroup of its own for all of a dispatch's steps and splits each
// step's recurrent product over it: the left factor (h[t−1] ⊙ m forward, dA backward) is staged
// in threadgroup memory, and the S lanes of a unit (consecutive lanes of one SIMD-group,
// rg_slices) each take a slice of the reduction index and meet their sums with a butterfly of
// simd_shuffle_xor (rg_lane_totals). Consecutive lanes read the weight along its contiguous
// index (R forward, Rᵀ backward); a thread may keep its share in registers (rg_hold). The
// sums meet in threadgroup memory and thread u < H alone runs unit u's element-wise work,
// keeping what crosses steps in registers (the LSTM's forward and the GRU's spread body run the
// cell on the product's lanes: their files say why). Each body is its own entry point: the
// host picks one by name for the threadgroup size it asks for (versions.py, v2_entry), and the
// entry checks its body's conditions on the threadgroup it gets (rg_declines).

// Threads of a v2 threadgroup (versions.V2_THREADS).
#define RG_THREADS 1024
// Threads of the _512 entry points (versions.V2_THREADS_512). A kernel's threadgroup limit is
// what its compiler allots registers by: the CUDA translation gets 64 a thread at 1024 threads,
// 128 at 512, room to hold more of the weight rows (RG_HOLD_512, RG_LSTM_HOLD_512,
// RG_PAIR_HOLD_512); at H = 64, 512 threads lose no lanes (8 a unit at most).
#define RG_THREADS_512 512

// One thread's partial sums: v[g][b] for gate g < G (in the order the kernel passes the
// weights) and row b < B.
template <uint G, uint B>
struct RgAcc {
    float v[G][B];
};
// Floats of a v2 body's first threadgroup array (24 KB of Apple's 32 KB): the staged left factor
// and, in the backwards, the product's sums and the activations found ahead; an entry point
// declines an H whose floats do not fit.
#define RG_STAGE 6144

// Lanes per unit at most: more shorten a unit's chain of multiply-adds, but every SIMD-group
// that holds a unit also runs the step's own work (8 is the best of those tried on NVIDIA GPUs:
// verification/PERFORMANCE.md).
#define RG_LANES 8

// Lanes per unit: the largest power of two S <= RG_LANES with S · units <= tpg (at least 1);
// SIMD-groups left without a unit skip the pass (rg_simd_idle).
inline uint rg_slices(uint units, uint tpg) {
    uint S = 1;
    while (S < RG_LANES && 2 * S * units <= tpg) {
        S *= 2;
    }
    return S;
}

// Whether the SIMD-group of thread lid has no unit in a pass whose first unit is `first` (its
// first lane's unit, first + ⌊lid / 32⌋·32 / S, is at or past `end`): it skips the pass whole,
// so its shuffles need no partner. S divides 32.
inline bool rg_simd_idle(uint first, uint lid, uint S, uint end) {
    return first + (lid & ~31u) / S >= end;
}

// R rounds of rg_dots' float4 reads from k (round r at k + 4S·r): the R · ng weight loads of all
// of them first, so that they are in flight together, then the multiply-adds, round by round.
template <uint R, uint G, uint B>
inline void rg_rounds(thread RgAcc<G, B>& acc, uint ng, uint nb, threadgroup const float* v,
                      uint ldv, device const float* w, thread const uint* off, uint k, uint S) {
    float4 wk[R][4];
    #pragma unroll
    for (uint r = 0; r < R; ++r) {
        #pragma unroll
        for (uint g = 0; g < G; ++g) {
            wk[r][g] = g < ng ? *((device const float4*)(w + off[g] + k + 4 * S * r))
                              : float4(0.0f);
        }
    }
    #pragma unroll
    for (uint b = 0; b < B; ++b) {
        if (b >= nb) {
            break;
        }
        #pragma unroll
        for (uint r = 0; r < R; ++r) {
            float4 x = *((threadgroup const float4*)(v + b * ldv + k + 4 * S * r));
            #pragma unroll
            for (uint g = 0; g < G; ++g) {
                acc.v[g][b] += wk[r][g].x * x.x;
                acc.v[g][b] += wk[r][g].y * x.y;
                acc.v[g][b] += wk[r][g].z * x.z;
                acc.v[g][b] += wk[r][g].w * x.w;
            }
        }
    }
}

// rg_dots' float4 reads (K, ldv and every offset multiples of 4) from this lane's block at k on:
// the rounds at k, k + 4S, ... below K, in order. With one row's sums (G · B <= 4) and at least
// eight rounds, two a loop, so that the weight loads of both are in flight together (in shorter
// products two a loop did not pay: verification/PERFORMANCE.md).
template <uint G, uint B>
inline void rg_dots_float4(thread RgAcc<G, B>& acc, uint ng, uint nb, threadgroup const float* v,
                           uint ldv, device const float* w, thread const uint* off, uint k, uint K,
                           uint S) {
    if (G * B <= 4 && K >= 32 * S) {
        for (; k + 4 * S < K; k += 8 * S) {
            rg_rounds<2>(acc, ng, nb, v, ldv, w, off, k, S);
        }
    }
    for (; k < K; k += 4 * S) {
        rg_rounds<1>(acc, ng, nb, v, ldv, w, off, k, S);
    }
}

// This lane's share of acc[g][b] += Σ_k v[b·ldv + k] · w[o_g + k] for g < ng, b < nb, k < K
// (v in threadgroup memory, w in device memory, both contiguous in k). Where K, ldv and every
// o_g are multiples of 4 (v and w then 16-byte aligned at every caller), the lane takes blocks
// of 4 k, k = 4·lane + 4S·i, as float4: a unit's lanes read one contiguous span per load. Else
// k ≡ lane (mod S), four k at a time. A round's weight loads are issued together, so that a
// thread keeps several in flight.
template <uint G, uint B>
inline void rg_dots(thread RgAcc<G, B>& acc, uint ng, uint nb,
                    threadgroup const float* v, uint ldv, device const float* w,
                    uint o0, uint o1, uint o2, uint o3, uint K, uint lane, uint S) {
    uint off[4] = {o0, o1, o2, o3};
    if (((K | ldv | o0 | o1 | o2 | o3) & 3u) == 0) {
        rg_dots_float4(acc, ng, nb, v, ldv, w, off, 4 * lane, K, S);
        return;
    }
    uint k = lane;
    for (; k + 3 * S < K; k += 4 * S) {
        float wk[4][4];
        #pragma unroll
        for (uint u = 0; u < 4; ++u) {
            #pragma unroll
            for (uint g = 0; g < G; ++g) {
                wk[u][g] = g < ng ? w[off[g] + k + u * S] : 0.0f;
            }
        }
        #pragma unroll
        for (uint b = 0; b < B; ++b) {
            if (b >= nb) {
                break;
            }
            #pragma unroll
            for (uint u = 0; u < 4; ++u) {
                float x = v[b * ldv + k + u * S];
                #pragma unroll
                for (uint g = 0; g < G; ++g) {
                    acc.v[g][b] += wk[u][g] * x;
                }
            }
        }
    }
    for (; k < K; k += S) {
        float wk[4];
        #pragma unroll
        for (uint g = 0; g < G; ++g) {
            wk[g] = g < ng ? w[off[g] + k] : 0.0f;
        }
        #pragma unroll
        for (uint b = 0; b < B; ++b) {
            if (b >= nb) {
                break;
            }
            float x = v[b * ldv + k];
            #pragma unroll
            for (uint g = 0; g < G; ++g) {
                acc.v[g][b] += wk[g] * x;
            }
        }
    }
}

// The rows [x, y) of threadgroup tgid of a v2 dispatch (one, where rg_one_pass holds).
inline uint2 rg_group_rows(constant RecurrenceParams& p, uint tpg, uint tgid) {
    return rg_rows(p.D * p.N, p.count, tpg, tgid);
}

// Zero the partial sums.
template <uint G, uint B>
inline void rg_clear(thread RgAcc<G, B>& acc) {
    #pragma unroll
    for (uint g = 0; g < G; ++g) {
        #pragma unroll
        for (uint b = 0; b < B; ++b) {
            acc.v[g][b] = 0.0f;
        }
    }
}

// Floats of a v2 forward's second threadgroup array (8 KB; with RG_STAGE, Apple's 32 KB): the
// product's sums, or the stage's second buffer where the next step's h[t] ⊙ m is written while
// other SIMD-groups still read this one's (the LSTM, the GRU's spread body).
#define RG_NEXT 2048

// Stage (h[t−1] ⊙ m) of rows r0 .. r0 + nb − 1 (one direction) at processing step s into
// stage[b·H + k], all threads striding over the elements; h[t−1] is h0 at s = 0.
inline void rg_stage_hm(threadgroup float* stage, constant RecurrenceParams& p,
                        device const float* h0, device const float* h, device const float* mask,
                        uint r0, uint nb, uint s, uint lid, uint tpg) {
    uint N = p.N, H = p.H, DH = p.D * p.H;
    uint d = r0 / N;
    for (uint e = lid; e < nb * H; e += tpg) {
        uint n = (r0 + e / H) % N;
        uint col = d * H + e % H;
        float hp = s == 0 ? h0[n * DH + col] : h[(rg_out_time(p, d, s - 1) * N + n) * DH + col];
        stage[e] = hp * mask[rg_mask_step(p, s) + n * DH + col];
    }
}

// float4 of a weight row a thread of the one-row body holds at most (rg_hold), sized to what a
// thread's registers keep beside the step's values (64 a thread at 1024 threads in the CUDA
// translation; the 512-thread entries, with 128, hold more): a single gate's row RG_HOLD
// (H <= 128 at S = 8), each of the GRU forward's three RG_HOLD / 2 (H <= 64);
#define RG_HOLD 4
// each of the GRU forward's three rows in gru_forward_v2_spread_512 (its whole share at
// H <= 128, S = 4): RG_HOLD_512 − 1 float4 in registers, the last in threadgroup memory;
#define RG_HOLD_512 8
// each of the LSTM forward's four rows in lstm_forward_v2_full_held_512 (half its share at
// H = 128);
#define RG_LSTM_HOLD_512 4
// each of the two rows of Rᵀ in the single gate's paired_512 entry; the GRU's and the LSTM's
// hold their whole share at H = 128 (8 float4 a row). Each is the fastest of the sizes tried
// (verification/PERFORMANCE.md, "Tried and left out").
#define RG_PAIR_HOLD_512 4
#define RG_PAIR_WHOLE_512 8

// One row of a recurrence, its indices found once: the row's C columns in an [N, D·C] array
// start at `at`; in a [T, N, D·C] array those of step s start at x0 + s·xs (input time) and
// o0 + s·os (output time), the mask's at s·ms + at (negative strides wrap, as uint does).
// rg_row: C = H (h, c, the mask); rg_row_of(p, row, G·H): x', z_state and dA.
struct RgRow {
    uint d, at, x0, xs, o0, os, ms;
};

inline RgRow rg_row_of(constant RecurrenceParams& p, uint row, uint C) {
    uint N = p.N, DC = p.D * C, NDC = p.N * p.D * C;
    RgRow r;
    r.d = row / N;
    r.at = (row % N) * DC + r.d * C;
    r.x0 = rg_x_time(p, r.d, 0) * NDC + r.at;
    r.xs = rg_x_time(p, r.d, 0) == 0 ? NDC : 0u - NDC;
    r.o0 = rg_out_time(p, r.d, 0) * NDC + r.at;
    r.os = rg_out_time(p, r.d, 0) == 0 ? NDC : 0u - NDC;
    r.ms = p.mask_per_step != 0 ? NDC : 0u;
    return r;
}

inline RgRow rg_row(constant RecurrenceParams& p, uint row) {
    return rg_row_of(p, row, p.H);
}

// Whether threadgroup tgid can run a one-row body: no unit blocks (v3's), one row, and
// S · H <= tpg, so that a thread owns one unit for the whole dispatch.
inline bool rg_one_pass(constant RecurrenceParams& p, uint tpg, uint tgid) {
    uint2 rows = rg_group_rows(p, tpg, tgid);
    return p.unit_blocks == 0 && rows.y == rows.x + 1 && rg_slices(p.H, tpg) * p.H <= tpg;
}

// Whether a thread of the one-row body holds its share of a weight row of K in W float4
// registers: rg_dots would read it as float4 (K a multiple of 4) in at most W rounds.
inline bool rg_holds(uint K, uint W, uint S) {
    return (K & 3u) == 0 && K <= 4 * W * S;
}

// This lane's share of weight row w (contiguous in k, K long): the float4 at k = 4·lane + 4S·r,
// r < W, as rg_dots reads them (zeros past K).
template <uint W>
inline void rg_hold(thread float4* held, device const float* w, uint K, uint lane, uint S) {
    #pragma unroll
    for (uint r = 0; r < W; ++r) {
        uint k = 4 * lane + 4 * S * r;
        held[r] = k < K ? *((device const float4*)(w + k)) : float4(0.0f);
    }
}

// This lane's share of Σ_k v[k] · w[k] from the share rg_hold<W> holds, in rg_dots' order.
template <uint W>
inline float rg_held_dot(thread const float4* held, threadgroup const float* v, uint K, uint lane,
                         uint S) {
    float acc = 0.0f;
    #pragma unroll
    for (uint r = 0; r < W; ++r) {
        uint k = 4 * lane + 4 * S * r;
        if (k < K) {
            float4 x = *((threadgroup const float4*)(v + k));
            acc += held[r].x * x.x;
            acc += held[r].y * x.y;
            acc += held[r].z * x.z;
            acc += held[r].w * x.w;
        }
    }
    return acc;
}

// rg_held_dot<W> of G rows at once (held[g] the share of row g), each float4 of v read once for
// all G: bitwise rg_held_dot's sums.
template <uint G, uint W>
inline void rg_held_dots(thread float* acc, thread const float4 (*held)[W],
                         threadgroup const float* v, uint K, uint lane, uint S) {
    #pragma unroll
    for (uint g = 0; g < G; ++g) {
        acc[g] = 0.0f;
    }
    #pragma unroll
    for (uint r = 0; r < W; ++r) {
        uint k = 4 * lane + 4 * S * r;
        if (k < K) {
            float4 x = *((threadgroup const float4*)(v + k));
            #pragma unroll
            for (uint g = 0; g < G; ++g) {
                acc[g] += held[g][r].x * x.x;
                acc[g] += held[g][r].y * x.y;
                acc[g] += held[g][r].z * x.z;
                acc[g] += held[g][r].w * x.w;
            }
        }
    }
}

// rg_held_dots<G, W + 1> with round W of each row in threadgroup memory rather than registers:
// tail[g · n + i] is row g's float4 of thread i of the n (rg_hold_tail), read after the W rounds
// held, so the sums are bitwise rg_held_dots<G, W + 1>'s.
template <uint G, uint W>
inline void rg_held_dots_tail(thread float* acc, thread const float4 (*held)[W],
                              threadgroup const float4* tail, uint n, uint i,
                              threadgroup const float* v, uint K, uint lane, uint S) {
    rg_held_dots<G, W>(acc, held, v, K, lane, S);
    uint k = 4 * lane + 4 * S * W;
    if (k < K) {
        float4 x = *((threadgroup const float4*)(v + k));
        #pragma unroll
        for (uint g = 0; g < G; ++g) {
            float4 w = tail[g * n + i];
            acc[g] += w.x * x.x;
            acc[g] += w.y * x.y;
            acc[g] += w.z * x.z;
            acc[g] += w.w * x.w;
        }
    }
}

// Round W of this lane's share of weight row w (K long) into tail[i] (zeros past K): the round
// rg_held_dots_tail reads from threadgroup memory.
template <uint W>
inline void rg_hold_tail(threadgroup float4* tail, uint i, device const float* w, uint K,
                         uint lane, uint S) {
    uint k = 4 * lane + 4 * S * W;
    tail[i] = k < K ? *((device const float4*)(w + k)) : float4(0.0f);
}

// This lane's share of Σ_k v[k] · w[k] read from device memory (rg_dots for one row and gate).
inline float rg_row_dot(threadgroup const float* v, device const float* w, uint K, uint lane,
                        uint S) {
    RgAcc<1, 1> acc;
    rg_clear(acc);
    rg_dots(acc, 1, 1, v, K, w, 0, 0, 0, 0, K, lane, S);
    return acc.v[0][0];
}

// rg_row_dot with the first W rounds of this lane's share of w held in registers (rg_hold<W>;
// not read unless K is a multiple of 4), the rest read as rg_dots reads them, in its order.
template <uint W>
inline float rg_row_dot_held(thread const float4* held, threadgroup const float* v,
                             device const float* w, uint K, uint lane, uint S) {
    if ((K & 3u) != 0) {
        return rg_row_dot(v, w, K, lane, S);
    }
    RgAcc<1, 1> acc;
    acc.v[0][0] = rg_held_dot<W>(held, v, K, lane, S);
    uint off[4] = {0u, 0u, 0u, 0u};
    rg_dots_float4(acc, 1, 1, v, K, w, off, 4 * lane + 4 * S * W, K, S);
    return acc.v[0][0];
}

// Whether every thread of a one-row body is in the product, reading float4 (S · H = tpg, H a
// multiple of 4): a body then need not test a thread's unit or H's alignment.
inline bool rg_full(uint H, uint S, uint tpg) {
    return S * H == tpg && (H & 3u) == 0;
}

// Whether a backward's one-row body can give 2S lanes two units (rg_pair_sums): rg_full, and
// 2S within RG_LANES (wider pairs did not pay: verification/PERFORMANCE.md).
inline bool rg_pairs(uint H, uint S, uint tpg) {
    return rg_full(H, S, tpg) && 2 * S <= RG_LANES;
}

// rg_row_dot_held<W> of two rows of w, at w and w + o1 (K a multiple of 4), the first W rounds of
// row g in held[g] (rg_hold_pair<W>): each float4 of v read once for both rows, each row's sum
// in rg_row_dot_held's order; half the threadgroup memory reads for the same weight reads.
template <uint W>
inline float2 rg_row_dots2_held(thread const float4 (*held)[W], threadgroup const float* v,
                                device const float* w, uint o1, uint K, uint lane, uint S) {
    float part[2];
    rg_held_dots<2, W>(part, held, v, K, lane, S);
    RgAcc<2, 1> acc;
    acc.v[0][0] = part[0];
    acc.v[1][0] = part[1];
    uint off[4] = {0u, o1, 0u, 0u};
    rg_dots_float4(acc, 2, 1, v, K, w, off, 4 * lane + 4 * S * W, K, S);
    return float2(acc.v[0][0], acc.v[1][0]);
}

// The first thread of a one-row body's work ahead (lstm_backward_ahead, gru_backward_ahead): the
// first past the product's S · H, else 0; item e goes to thread (first + e) mod tpg.
inline uint rg_ahead_first(uint S, uint H, uint tpg) {
    return S * H < tpg ? S * H : 0u;
}

inline uint rg_ahead_item(uint first, uint lid, uint tpg) {
    return (lid + tpg - first) % tpg;
}

// rg_hold<W> where K is a multiple of 4 (rg_row_dot_held reads held only then), else zeros.
template <uint W>
inline void rg_hold_some(thread float4* held, device const float* w, uint K, uint lane, uint S) {
    rg_hold<W>(held, w, (K & 3u) == 0 ? K : 0u, lane, S);
}

// The butterfly of G sums over a unit's S lanes (a power of two <= RG_LANES): every lane ends
// with the totals; a level's G shuffles issued together. Every lane of the SIMD-group calls it.
template <uint G>
inline void rg_lane_totals(thread float* v, uint S) {
    #pragma unroll
    for (uint m = RG_LANES / 2; m > 0; m /= 2) {
        if (m < S) {
            #pragma unroll
            for (uint g = 0; g < G; ++g) {
                v[g] += simd_shuffle_xor(v[g], (ushort)m);
            }
        }
    }
}

inline float rg_lane_total(float v, uint S) {
    rg_lane_totals<1>(&v, S);
    return v;
}

// The first W rounds of this lane's share of its two rows of w, at w and w + o1 (K long), in
// held[0] and held[1]: what rg_row_dots2_held reads from registers (rg_hold_some<W> of each).
template <uint W>
inline void rg_hold_pair(thread float4 (*held)[W], device const float* w, uint o1, uint K,
                         uint lane, uint S) {
    rg_hold_some<W>(held[0], w, K, lane, S);
    rg_hold_some<W>(held[1], w + o1, K, lane, S);
}

// A backward's product with 2S lanes a pair of units (rg_pairs): the L lanes of units j and
// j + U (rows w and w + U·K, K long) meet their sums (rg_row_dots2_held, rg_lane_totals) and
// lanes 0 and 1 write sums[j] and sums[j + U]. Every lane of a SIMD-group with a unit calls it.
template <uint W>
inline void rg_pair_sums(threadgroup float* sums, thread const float4 (*held)[W],
                         threadgroup const float* v, device const float* w, uint U, uint K,
                         uint j, uint lane, uint L, bool unit) {
    float t[2] = {0.0f, 0.0f};
    if (unit) {
        float2 d2 = rg_row_dots2_held<W>(held, v, w, U * K, K, lane, L);
        t[0] = d2.x;
        t[1] = d2.y;
    }
    rg_lane_totals<2>(t, L);
    if (unit && lane < 2) {
        sums[j + lane * U] = lane == 0 ? t[0] : t[1];
    }
}

// A product with S lanes a unit: the lanes of unit j meet their shares of its sum
// (rg_lane_total) and lane 0 writes sums[j]. Every lane of a SIMD-group with a unit calls it.
inline void rg_unit_sum(threadgroup float* sums, float dot, uint j, uint lane, uint S, bool unit) {
    dot = rg_lane_total(dot, S);
    if (unit && lane == 0) {
        sums[j] = dot;
    }
}
