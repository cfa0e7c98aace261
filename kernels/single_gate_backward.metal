// single_gate_backward.metal: the recurrence of singleGateRNNGradients (SEMANTICS.md §3.3).
//
//   dh = source_gradient[t] + dh_next;   da = dh ⊙ f'(a);   dh_next = (da R) ⊙ m
//
// The gradient op gets no forward output, so h[t−1] = f(z_state[t−1]) (init_state at t = 0).
// The kernel writes da (input time: the source gradient without input_weight, the left factor
// of every weight gradient) and h[t−1] ⊙ m (the right factor of dR, same rows); strided_gemm
// reduces them to dR, dW, db after this dispatch.
//
// Kernel versions (kernels/README.md: each entry point's grid, and when the host picks it)
//   v1 single_gate_backward: rows (d, n) in contiguous blocks per threadgroup, a loop down the
//      dispatch's processing steps [p.s_begin, p.s_end); phase A (element-wise da) and phase B
//      (dh_next[j] = m_j Σ_k da_k R[k,j], a dot product per (row, j)) separated by one
//      device-memory barrier per step. dh_next lives in the init-state-gradient buffer: only
//      the thread that owns (row, j) reads or writes it, and it carries over to the next
//      dispatch. Correct for every shape and threadgroup size.
//   v2 single_gate_backward_v2_<body>[_512]: one row a threadgroup of 1024 threads (512 for a
//      _512 entry), all of the dispatch's steps: thread u < H runs unit u's phase A, stages da
//      and keeps its dh_next in a register; in phase B, da R, S lanes a unit split k and their
//      sums meet in threadgroup memory (two barriers a step). Rᵀ comes instead of R (k
//      contiguous). Every entry needs S · H <= threads and 2H floats of RG_STAGE, and declines
//      otherwise (rg_declines).
//        single_gate_backward_v2_held        Rᵀ's row held in registers across steps (rg_hold):
//                                            H a multiple of 4 and <= 4·RG_HOLD·S (H <= 128)
//        single_gate_backward_v2_paired      2S lanes own units j and j + H/2, each float4 of
//                                            the stage read once for both rows (rg_pairs: every
//                                            thread in the product, H a multiple of 4, 2S <=
//                                            RG_LANES), the first round of each row held
//        single_gate_backward_v2_streamed    the first RG_HOLD / 2 float4 of Rᵀ's row held, the
//                                            rest read at every step: any H the pass covers
//        single_gate_backward_v2_paired_512  the paired body in threadgroups of 512: at H = 128,
//                                            4 lanes a unit, 8 a pair, RG_PAIR_HOLD_512 rounds
//                                            of each row held
//   v3 single_gate_backward_v3: one dispatch a step, threadgroups of 256 over tiles of up to
//      16 rows of one direction × a block of units: first the carry of the step before,
//      dh_next = m ⊙ (da R) for the tile, da read back from dx (v3_tiles.metal, rs_product); then
//      phase A for each (row, unit) of the tile. T + 1 dispatches, the last one the carry alone.
//
// Buffers of single_gate_backward (count = D·N·H, or D·N·1024: a threadgroup a row)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         R     [D,H,H]
//   2      device const float*         h0    [N,D·H] (zeros when absent)
//   3      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   4      device const float*         dy    [T,N,D·H] source_gradient, output time
//   5      device const float*         zs    [T,N,D·H] z_state, output time
//   6      device float*               dx    [T,N,D·H] da, input time
//   7      device float*               rhs   [T,N,D·H] h[t−1] ⊙ m, input time
//   8      device float*               dhn   [N,D·H] in: state_gradient (or zeros);
//                                            out: init_state gradient
//   9      device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// Buffers of single_gate_backward_v2_held and single_gate_backward_v2_paired
// Buffers of single_gate_backward_v2_streamed and single_gate_backward_v2_paired_512
// Buffers of single_gate_backward_v3
// (count = v2: D·N·1024, D·N·512 for _512; v3: 256 per tile of versions.tile_blocks)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         Rt    [D,H,H] R transposed: Rt[d,j,k] = R[d,k,j]
//   2      device const float*         h0    [N,D·H] (zeros when absent)
//   3      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   4      device const float*         dy    [T,N,D·H] source_gradient, output time
//   5      device const float*         zs    [T,N,D·H] z_state, output time
//   6      device float*               dx    [T,N,D·H] da, input time
//   7      device float*               rhs   [T,N,D·H] h[t−1] ⊙ m, input time
//   8      device float*               dhn   [N,D·H] in: state_gradient (or zeros);
//                                            out: init_state gradient
//   9      device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// An entry point of this file: `name` with the buffers of the tables above, the recurrent weight
// named W (R in v1, Rt in v2 and v3); its body follows.
#define instantiate_single_gate_backward(name, W)                                                  \
    kernel void name(                                                                              \
            constant RecurrenceParams& p [[buffer(0)]], device const float* W [[buffer(1)]],       \
            device const float* h0 [[buffer(2)]], device const float* mask [[buffer(3)]],          \
            device const float* dy [[buffer(4)]], device const float* zs [[buffer(5)]],            \
            device float* dx [[buffer(6)]], device float* rhs [[buffer(7)]],                       \
            device float* dhn [[buffer(8)]], device uint2* status [[buffer(9)]],                   \
            uint lid [[thread_position_in_threadgroup]],                                           \
            uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]])

// Phase A of v1 and v3 for (row, j) at processing step s: da = (dy + dh_next) ⊙ f'(a)
// into dx, and h[t−1] ⊙ m into rhs (the right factor of dR); returns da.
inline float single_gate_da(constant RecurrenceParams& p, device const float* h0,
                            device const float* mask, device const float* dy,
                            device const float* zs, device float* dx, device float* rhs,
                            device const float* dhn, uint s, uint row, uint j) {
    uint N = p.N, H = p.H, DH = p.D * p.H;
    uint d = row / N, n = row % N;
    uint col = d * H + j;
    uint out = (rg_out_time(p, d, s) * N + n) * DH + col;
    uint xin = (rg_x_time(p, d, s) * N + n) * DH + col;
    float hp = s == 0 ? h0[n * DH + col]
                      : rg_activate(p.act0, zs[(rg_out_time(p, d, s - 1) * N + n) * DH + col]);
    float m = mask[rg_mask_step(p, s) + n * DH + col];
    float dh = dy[out] + dhn[n * DH + col];
    float da = dh * rg_derivative(p.act0, zs[out]);
    dx[xin] = da;
    rhs[xin] = hp * m;
    return da;
}

instantiate_single_gate_backward(single_gate_backward, R) {
    uint N = p.N, H = p.H, DH = p.D * p.H;
    uint2 rows = rg_rows(p.D * N, p.count, tpg, tgid);
    if (rows.x >= rows.y) {
        rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
        return;  // the whole threadgroup owns no row
    }
    uint work = (rows.y - rows.x) * H;
    for (uint step = p.s_end; step > p.s_begin; --step) {
        uint s = step - 1;
        for (uint e = lid; e < work; e += tpg) {
            single_gate_da(p, h0, mask, dy, zs, dx, rhs, dhn, s, rows.x + e / H, e % H);
        }
        // Phase B reads every da of its row. Phase A of the next step writes other rows of dx
        // (another time index) and only its own dh_next, so one barrier per step suffices.
        threadgroup_barrier(mem_flags::mem_device);
        for (uint e = lid; e < work; e += tpg) {
            uint row = rows.x + e / H, j = e % H;
            uint d = row / N, n = row % N;
            device const float* da = dx + (rg_x_time(p, d, s) * N + n) * DH + d * H;
            device const float* Rd = R + d * H * H;
            float acc = 0.0f;
            for (uint k = 0; k < H; ++k) {
                acc += da[k] * Rd[k * H + j];
            }
            dhn[n * DH + d * H + j] = acc * mask[rg_mask_step(p, s) + n * DH + d * H + j];
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// The v2 entry points' one-row body, where its conditions hold (rg_declines): thread u < H runs
// unit u's phase A and keeps its dh_next in a register (dhn read once and written once); in phase B
// thread lid is lane lid mod S of unit lid / S. HOLD: the thread's share of Rᵀ's row in registers.
// PW > 0 (not HOLD; rg_pairs): 2S lanes own units j and j + H / 2 (rg_pair_sums), the first PW
// rounds of each row held.
template <bool HOLD, uint PW>
inline void single_gate_backward_v2_run(uint threads, constant RecurrenceParams& p,
                                        device const float* Rt, device const float* h0,
                                        device const float* mask, device const float* dy,
                                        device const float* zs, device float* dx, device float* rhs,
                                        device float* dhn, device uint2* status,
                                        threadgroup float4* staged, uint lid, uint tgid, uint tpg) {
    bool fits = rg_one_pass(p, tpg, tgid) && 2 * p.H <= RG_STAGE
                && (!HOLD || rg_holds(p.H, RG_HOLD, rg_slices(p.H, tpg)))
                && (PW == 0 || rg_pairs(p.H, rg_slices(p.H, tpg), tpg));
    if (rg_declines(fits, threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)staged;
    threadgroup float* sums = stage + p.H;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H;
    RgRow r = rg_row(p, row);
    const bool PAIR = PW > 0;
    uint S = rg_slices(H, tpg), L = PAIR ? 2 * S : S, U = PAIR ? H / 2 : H;
    uint lane = lid % L, j = lid / L;
    bool unit = j < U, idle = rg_simd_idle(0, lid, L, U), cell = lid < H;
    device const float* Rj = Rt + (r.d * H + min(j, U - 1)) * H;
    const uint HW = HOLD ? RG_HOLD : (PAIR ? PW : RG_HOLD / 2);
    float4 held[2][HW];
    if (HOLD) {
        rg_hold<RG_HOLD>(held[0], Rj, unit ? H : 0u, lane, S);
    } else if (PAIR) {
        rg_hold_pair<HW>(held, Rj, U * H, unit ? H : 0u, lane, L);
    } else {
        rg_hold_some<RG_HOLD / 2>(held[0], Rj, unit ? H : 0u, lane, S);
    }
    float dh = 0.0f, mj = 0.0f, g = 0.0f, a = 0.0f, ap = 0.0f;
    if (cell) {
        dh = dhn[r.at + lid];
        mj = mask[r.at + lid];
        if (p.s_end > p.s_begin) {
            uint s = p.s_end - 1;
            g = dy[r.o0 + s * r.os + lid];
            a = zs[r.o0 + s * r.os + lid];
            ap = s == 0 ? 0.0f : zs[r.o0 + (s - 1) * r.os + lid];
        }
    }
    for (uint step = p.s_end; step > p.s_begin; --step) {
        uint s = step - 1;
        float m = 0.0f;
        if (cell) {
            m = r.ms != 0 ? mask[s * r.ms + r.at + lid] : mj;
            float hp = s == 0 ? h0[r.at + lid] : rg_activate(p.act0, ap);
            float da = (g + dh) * rg_derivative(p.act0, a);
            if (s > p.s_begin) {
                // the next step's inputs, in flight over the product
                g = dy[r.o0 + (s - 1) * r.os + lid];
                a = ap;
                ap = s == 1 ? 0.0f : zs[r.o0 + (s - 2) * r.os + lid];
            }
            stage[lid] = da;
            uint xin = r.x0 + s * r.xs + lid;
            dx[xin] = da;
            rhs[xin] = hp * m;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Phase B: dh_next[j] = m_j Σ_k da_k R[k,j].
        if (PAIR && !idle) {
            rg_pair_sums<HW>(sums, held, stage, Rj, U, H, j, lane, L, unit);
        } else if (!idle) {
            float dot = 0.0f;
            if (unit) {
                dot = HOLD ? rg_held_dot<RG_HOLD>(held[0], stage, H, lane, S)
                           : rg_row_dot_held<RG_HOLD / 2>(held[0], stage, Rj, H, lane, S);
            }
            rg_unit_sum(sums, dot, j, lane, S, unit);
        }
        // Every sum is in, and the stage read before phase A writes it again.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (cell) {
            dh = sums[lid] * m;
        }
    }
    if (cell) {
        dhn[r.at + lid] = dh;
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// ---------------------------------------------------------------------------------------------
// `name`: an entry point compiled for threadgroups of `threads` that calls
// single_gate_backward_v2_run with the template arguments after them.
#define instantiate_single_gate_backward_v2(name, threads, ...)                                    \
    [[max_total_threads_per_threadgroup(threads)]] instantiate_single_gate_backward(name, Rt) {    \
        threadgroup float4 staged[RG_STAGE / 4]; /* 16-byte aligned: rg_dots reads float4 */       \
        single_gate_backward_v2_run<__VA_ARGS__>(threads, p, Rt, h0, mask, dy, zs, dx, rhs, dhn,   \
                                                 status, staged, lid, tgid, tpg);                  \
    }

instantiate_single_gate_backward_v2(single_gate_backward_v2_held, RG_THREADS, true, 0)
instantiate_single_gate_backward_v2(single_gate_backward_v2_paired, RG_THREADS, false, 1)
instantiate_single_gate_backward_v2(single_gate_backward_v2_streamed, RG_THREADS, false, 0)
instantiate_single_gate_backward_v2(single_gate_backward_v2_paired_512, RG_THREADS_512,
                                    false, RG_PAIR_HOLD_512)

[[max_total_threads_per_threadgroup(256)]]
instantiate_single_gate_backward(single_gate_backward_v3, Rt) {
    threadgroup float4 stage[RS_STAGE / 4];  // the staged chunk, k-major (rs_product)
    threadgroup float red[RS_RED];
    if (!rs_fits(p, 1u)) {
        return;  // a unit block wider than the tile: no completion mark, the host reports it
    }
    uint2 mine = rg_rows(rs_tiles(p), p.count, tpg, tgid);
    for (uint t = mine.x; t < mine.y; ++t) {
        RsTile g = rs_backward_tile(stage, red, p, t, 1u, dx, Rt, lid, tpg);
        for (uint e = lid; e < g.rows * g.units; e += tpg) {
            uint3 at = rs_carry(p, g, red, e, mask, dhn, false);  // row, unit, dhn's index
            if (p.s_end > p.s_begin) {
                single_gate_da(p, h0, mask, dy, zs, dx, rhs, dhn, p.s_begin, at.x, at.y);
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}
