// common.metal: the shared header of rnngrad's Metal kernels.
//
// metalcompute compiles one source string and local #include does not work, so the host
// (rnngrad/backends/metal/library.py) prepends this file to every kernel file: the parameter
// structs, the MPSGraph activations, the index helpers and the helpers of the v2 and v3 bodies.
//
// Notation: T steps, N batch, H hidden units, G gates, D directions, Z blocks of H per direction
// in z_state (G, or 4 for GRU with reset_after). A "row" of a recurrence is one (direction,
// batch) pair, row = d·N + n; rows never talk to each other, so a threadgroup owns a block of
// rows and loops over time on its own.
//
// Time indices. s is the processing step of a direction. The projected input x' (and every
// gradient of it) is in input time: xt = T−1−s for the backward direction and for a
// unidirectional reverse op, else s. h, c, z_state, source_gradient, output_fwd,
// cell_output_fwd and a per-step cell_gradient are in output time: ot = T−1−s for the backward
// direction of a bidirectional op only (rnngrad/backends/reference/SEMANTICS.md §2.1). A per-step
// mask is indexed by s.
//
// Fast math is forced by metalcompute, so NaN is never trusted to propagate by itself: every
// activation and derivative tests for NaN on the bits (the compiler may fold isnan(x) to false
// under fast math) and returns the NaN (SEMANTICS.md §4).
//
// Completion marks. metalcompute never checks a command buffer's status, so a dispatch that
// faults or that the GPU watchdog stops leaves its outputs partly written and says nothing. Every
// kernel takes a status buffer as its last binding, one uint2 per threadgroup (the host zeroes
// ceil(count / 32), enough for any threadgroup size), and thread 0 of each threadgroup writes
// {rg_done(steps), threads per threadgroup} (rg_mark) after a threadgroup_barrier that every
// thread reaches only once its own work is done. The host checks that each threadgroup left that
// mark with the step count it asked for (rnngrad/backends/metal/host.py). A threadgroup that owns
// no row marks before its (uniform) early return.

#include <metal_stdlib>
using namespace metal;

// Scalars of every recurrence kernel, one buffer; mirrored by
// rnngrad.backends.metal.library.RECURRENCE_PARAMS. All fields are 4-byte uints, in this order.
struct RecurrenceParams {
    uint count;            // threads the host dispatched (versions.recurrence_count): v1 D·N·H,
                           //   or D·N·1024 for one threadgroup a row; v2 D·N·1024 (D·N·512 for
                           //   a _512 entry); v3 256 per tile
    uint T;
    uint N;
    uint H;
    uint D;
    uint G;
    uint Z;
    uint reverse;          // unidirectional reverse (0 when bidirectional)
    uint training;         // write z_state (single_gate, lstm forward)
    uint mask_per_step;    // mask is [T,N,D·H] indexed by processing step, else [N,D·H]
    uint has_peephole;     // lstm
    uint cell_gradient_per_step;  // lstm backward: a [T,N,D·H] cell gradient buffer is bound
    uint reset_after;      // gru
    uint flip_z;           // gru
    uint act0;             // single_gate: activation; gru: update, reset, output; lstm: input,
    uint act1;             //   forget, cell, output gate, then the cell activation
    uint act2;
    uint act3;
    uint act4;
    uint gate0;            // block index of each gate in the packed layout; lstm: i, f, z, o;
    uint gate1;            //   gru: z, r, o
    uint gate2;
    uint gate3;
    uint s_begin;          // processing steps [s_begin, s_end) run by this dispatch: the forward
    uint s_end;            //   runs them upward, the backward downward; the state carries over
                           //   between dispatches in the output buffers (h, c; dhn, dcn, prow)
    uint unit_blocks;      // v3: the blocks of units of its tiles (rs_tile); 0 for v1 and v2
};

// Scalars of every matrix-product kernel (gemm.metal), one buffer; mirrored by
// rnngrad.backends.metal.library.GEMM_PARAMS.
// C[b,i,j] = Σ_k A[b·a_batch + i·a_row + k·a_k]
//              · B[b·b_batch + k·b_k + j·b_col + (i / block)·b_block]
//            (+ bias[j] when has_bias); C is contiguous [batch, M, P].
struct GemmParams {
    uint count;            // threads the host dispatched (versions.gemm_threads): batch·M·P
                           // (strided_gemm), 1024 per 32 elements of a row (strided_gemm_split),
                           // 256 per tile (strided_gemm_blocked), 256 per tile and slice of K
                           // (strided_gemm_wide)
    uint batch;
    uint M;
    uint P;
    uint K;
    uint a_batch;
    uint a_row;
    uint a_k;
    uint b_batch;
    uint b_k;
    uint b_col;
    uint block;            // rows of C per block of B (H for the GRU recurrent weight gradient)
    uint b_block;          // offset of B per block of C rows (0: every row reads the same B)
    uint has_bias;
    uint k_split;          // strided_gemm_wide: k per slice of K (0: one slice); slice s of
                           // C[batch, M, P] goes to C + s·batch·M·P (others ignore it)
};

// MPSGraphRNNActivation
enum RnnActivation : uint { ACT_NONE = 0, ACT_RELU = 1, ACT_TANH = 2, ACT_SIGMOID = 3, ACT_HARD_SIGMOID = 4 };

inline bool rg_isnan(float x) {
    return (as_type<uint>(x) & 0x7fffffffu) > 0x7f800000u;
}

// 1/(1+e^(−x)) without overflow: e^(−|x|) is in (0, 1].
inline float rg_sigmoid(float x) {
    float e = precise::exp(-fabs(x));
    float s = x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    return rg_isnan(x) ? x : s;
}

// f(x) for an MPSGraphRNNActivation; NaN in, NaN out.
inline float rg_activate(uint kind, float x) {
    float y = x;
    if (kind == ACT_RELU) {
        y = x > 0.0f ? x : 0.0f;
    } else if (kind == ACT_TANH) {
        y = precise::tanh(x);
    } else if (kind == ACT_SIGMOID) {
        y = rg_sigmoid(x);
    } else if (kind == ACT_HARD_SIGMOID) {
        float v = 0.2f * x + 0.5f;
        y = v < 0.0f ? 0.0f : (v > 1.0f ? 1.0f : v);
    }
    return rg_isnan(x) ? x : y;
}

// f'(x) from x and y = rg_activate(kind, x): tanh's and the sigmoid's from y, so that a caller
// holding f(x) does not evaluate f again; NaN where x is NaN (never multiplied away).
inline float rg_derivative_at(uint kind, float x, float y) {
    float d = 1.0f;
    if (kind == ACT_RELU) {
        d = x > 0.0f ? 1.0f : 0.0f;
    } else if (kind == ACT_TANH) {
        d = 1.0f - y * y;
    } else if (kind == ACT_SIGMOID) {
        d = y * (1.0f - y);
    } else if (kind == ACT_HARD_SIGMOID) {
        d = fabs(x) <= 2.5f ? 0.2f : 0.0f;
    }
    return rg_isnan(x) ? x : d;
}

// f'(x) from the pre-activation x alone.
inline float rg_derivative(uint kind, float x) {
    return rg_derivative_at(kind, x, rg_activate(kind, x));
}

// The block of rows [x, y) that threadgroup tgid owns. Only the kernel knows the threadgroup
// size, so it splits the rows over the ceil(count / tpg) threadgroups, found from count (not
// [[threadgroups_per_grid]]) so that the split is the one the completion check expects.
inline uint2 rg_rows(uint rows, uint count, uint tpg, uint tgid) {
    uint groups = (count + tpg - 1) / tpg;
    uint per = (rows + groups - 1) / groups;
    uint begin = min(tgid * per, rows);
    uint end = min(begin + per, rows);
    return uint2(begin, end);
}

// Input-time index of processing step s of direction d.
inline uint rg_x_time(constant RecurrenceParams& p, uint d, uint s) {
    return (d == 1 || p.reverse != 0) ? p.T - 1 - s : s;
}

// Output-time index of processing step s of direction d.
inline uint rg_out_time(constant RecurrenceParams& p, uint d, uint s) {
    return d == 1 ? p.T - 1 - s : s;
}

// Offset of the mask at processing step s (a [N,D·H] mask is the same at every step).
inline uint rg_mask_step(constant RecurrenceParams& p, uint s) {
    return p.mask_per_step != 0 ? s * p.N * p.D * p.H : 0u;
}

// Block index of gate k (in the cell's canonical order) in the packed layout.
inline uint rg_gate(constant RecurrenceParams& p, uint k) {
    return k == 0 ? p.gate0 : (k == 1 ? p.gate1 : (k == 2 ? p.gate2 : p.gate3));
}

// Activation of gate k (in the cell's canonical order), or the cell activation for k = 4.
inline uint rg_act(constant RecurrenceParams& p, uint k) {
    return k == 0 ? p.act0 : (k == 1 ? p.act1 : (k == 2 ? p.act2 : (k == 3 ? p.act3 : p.act4)));
}

// The value of a completion mark: the flag keeps a zeroed status entry from reading as done.
inline uint rg_done(uint steps) {
    return 0x80000000u | steps;
}

// Thread 0 marks threadgroup tgid done with `steps` steps. Call it where every thread of the
// threadgroup has finished its work: after a threadgroup_barrier that follows the last of it.
inline void rg_mark(device uint2* status, uint tgid, uint lid, uint tpg, uint steps) {
    if (lid == 0) {
        status[tgid] = uint2(rg_done(steps), tpg);
    }
}

// The first word of a declined mark (rg_declines; rnngrad.backends.metal.library.DECLINED).
#define RG_DECLINED 0x40000000u

// Whether a v2 entry point declines threadgroup tgid: its body's conditions fail, or the device
// gave the pipeline another threadgroup size than the `threads` the host chose it for (a Mac
// may, where a pipeline needs more registers). Thread 0 marks the threadgroup declined and the
// host runs v1 instead. The conditions are uniform: the whole threadgroup returns.
inline bool rg_declines(bool fits, uint threads, device uint2* status, uint lid, uint tgid,
                        uint tpg) {
    bool declines = !fits || tpg != threads;
    if (declines && lid == 0) {
        status[tgid] = uint2(RG_DECLINED, tpg);
    }
    return declines;
}

// ---------------------------------------------------------------------------------------------
// Helpers of the v2 recurrence kernels (<cell>_<direction>_v2_<body>[_512]).
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

// The most rows (RgAcc's B) the product helpers are meant for; every v2 body passes one.
// The loops over gates, rows and k are unrolled so that the partial sums stay in registers.
#define RG_BMAX 8
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
// that holds a unit also runs the step's own work; 8 ran faster than 16
// (verification/PERFORMANCE.md).
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
// eight rounds, two a loop, so that the weight loads of both are in flight together (with four
// or fewer, two a loop measured slower).
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

// float4 of a weight row a thread of the one-row body holds at most (rg_hold): a single gate's
// row RG_HOLD (H <= 128 at S = 8), each of the GRU forward's three RG_HOLD / 2 (H <= 64). More
// spilled in the CUDA translation's 64 registers a thread; the 512-thread entries, with 128,
// hold more:
#define RG_HOLD 4
// each of the GRU forward's three rows in gru_forward_v2_spread_512 (its whole share at
// H <= 128, S = 4): RG_HOLD_512 − 1 float4 in registers, the last in threadgroup memory;
#define RG_HOLD_512 8
// each of the LSTM forward's four rows in lstm_forward_v2_full_held_512 (half its share at
// H = 128; with 5, ptxas spills);
#define RG_LSTM_HOLD_512 4
// each of the two rows of Rᵀ in the single gate's paired_512 entry; the GRU's and the LSTM's
// hold their whole share at H = 128 (8 float4 a row), the faster of 4, 6 and 8 for each
// (verification/PERFORMANCE.md).
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
// 2S within RG_LANES (16 lanes spilled more and ran slower).
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

// A backward's product with S lanes a unit: the lanes of unit j meet their shares of its sum
// (rg_lane_total) and lane 0 writes sums[j]. Every lane of a SIMD-group with a unit calls it.
inline void rg_unit_sum(threadgroup float* sums, float dot, uint j, uint lane, uint S, bool unit) {
    dot = rg_lane_total(dot, S);
    if (unit && lane == 0) {
        sums[j] = dot;
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers of the v3 recurrence kernels (<cell>_{forward,backward}_v3): one step a dispatch,
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
