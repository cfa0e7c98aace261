// common.metal: the shared header of rnngrad's Metal kernels: the parameter structs, the
// MPSGraph activations, the index helpers and the completion marks.
//
// metalcompute compiles one source string and local #include does not work, so the host
// (rnngrad/backends/metal/library.py) prepends the headers to every kernel file: this one, then
// v2_rows.metal (the helpers of the v2 one-row bodies) and v3_tiles.metal (the v3 tile product).
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
