// single_gate_forward.metal: singleGateRNN, a range of steps per dispatch (SEMANTICS.md §2.2).
//
//   a[t] = x'[t] + (h[t−1] ⊙ m) Rᵀ        h[t] = f(a[t])        z_state[t] = a[t]
//
// Kernel versions (kernels/README.md: each entry point's grid, and when the host picks it)
//   v1 single_gate_forward: rows (d, n) of both directions split in contiguous blocks across
//      threadgroups; each threadgroup loops over the dispatch's processing steps
//      [p.s_begin, p.s_end) (all T unless the host splits a long sequence), its threads
//      striding over (row, j) with one dot product of length H each; h[t−1] is read back from
//      the output buffer after a device-memory barrier, so H is not limited by threadgroup
//      memory. R comes transposed, so consecutive j read consecutive addresses. One barrier per
//      step. Correct for every shape and threadgroup size.
//   v2 single_gate_forward_v2_<body>[_512]: one row a threadgroup of 1024 threads (512 for a
//      _512 entry), all of the dispatch's steps (v2_rows.metal's helpers). Per step, S lanes
//      a unit split (h[t−1] ⊙ m) Rᵀ over k, their sums meet in threadgroup memory, and thread
//      u < H runs unit u's activation and stages h[t] ⊙ m for the next step (two barriers a
//      step). R comes as it is (k contiguous). Every entry needs S · H <= threads and declines
//      otherwise (rg_declines).
//        single_gate_forward_v2_held       R's row held in registers across steps (rg_hold):
//                                          H a multiple of 4 and <= 4·RG_HOLD·S (H <= 128)
//        single_gate_forward_v2_streamed   the first RG_HOLD / 2 float4 of R's row held, the
//                                          rest read at every step: any H the pass covers
//        single_gate_forward_v2_held_512   the held body in threadgroups of 512 (H <= 64)
//   v3 single_gate_forward_v3: one dispatch a step, threadgroups of 256 over tiles of up to 16
//      rows of one direction × a block of units (p.unit_blocks blocks): the tile's
//      (h[t−1] ⊙ m) Rᵀ as a staged, register-blocked product (v3_tiles.metal, rs_product), then
//      the activation for each (row, unit) of the tile.
//
// Buffers of single_gate_forward (count = D·N·H, or D·N·1024: a threadgroup a row)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         x     [T,N,D·H] projected input, input time
//   2      device const float*         bias  [D·H] added to x (zeros if the projection added it)
//   3      device const float*         Rt    [D,H,H] R transposed: Rt[d,k,j] = R[d,j,k]
//   4      device const float*         h0    [N,D·H] (zeros when absent)
//   5      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   6      device float*               h     [T,N,D·H] output time
//   7      device float*               zs    [T,N,D·H] output time (written when p.training)
//   8      device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// Buffers of single_gate_forward_v2_held and single_gate_forward_v2_streamed
// Buffers of single_gate_forward_v2_held_512 and single_gate_forward_v3
// (count = v2: D·N·1024, D·N·512 for _512; v3: 256 per tile of versions.tile_blocks)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         x     [T,N,D·H] projected input, input time
//   2      device const float*         bias  [D·H] added to x (zeros if the projection added it)
//   3      device const float*         R     [D,H,H] recurrent weight as given
//   4      device const float*         h0    [N,D·H] (zeros when absent)
//   5      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   6      device float*               h     [T,N,D·H] output time
//   7      device float*               zs    [T,N,D·H] output time (written when p.training)
//   8      device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// An entry point of this file: `name` with the buffers of the tables above, the recurrent weight
// named W (Rt in v1, R in v2 and v3); its body follows.
#define instantiate_single_gate_forward(name, W)                                                   \
    kernel void name(                                                                              \
            constant RecurrenceParams& p [[buffer(0)]], device const float* x [[buffer(1)]],       \
            device const float* bias [[buffer(2)]], device const float* W [[buffer(3)]],           \
            device const float* h0 [[buffer(4)]], device const float* mask [[buffer(5)]],          \
            device float* h [[buffer(6)]], device float* zs [[buffer(7)]],                         \
            device uint2* status [[buffer(8)]], uint lid [[thread_position_in_threadgroup]],       \
            uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]])

// The step of v1 and v3 for (row, j) at processing step s, from the recurrent product
// (h[t−1] ⊙ m) Rᵀ of unit j: writes z_state (when training) and h[t]; returns h[t]. (The v2
// body repeats its arithmetic with its indices found once.)
inline float single_gate_cell(constant RecurrenceParams& p, device const float* x,
                             device const float* bias, device float* h, device float* zs,
                             uint s, uint row, uint j, float dot) {
    uint N = p.N, DH = p.D * p.H;
    uint d = row / N, n = row % N;
    uint col = d * p.H + j;
    float a = (x[(rg_x_time(p, d, s) * N + n) * DH + col] + bias[col]) + dot;
    uint out = (rg_out_time(p, d, s) * N + n) * DH + col;
    float ht = rg_activate(p.act0, a);  // before the stores, after which p may be loaded again
    if (p.training != 0) {
        zs[out] = a;
    }
    h[out] = ht;
    return ht;
}

instantiate_single_gate_forward(single_gate_forward, Rt) {
    uint N = p.N, H = p.H, DH = p.D * p.H;
    uint2 rows = rg_rows(p.D * N, p.count, tpg, tgid);
    if (rows.x >= rows.y) {
        rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
        return;  // the whole threadgroup owns no row
    }
    uint work = (rows.y - rows.x) * H;
    for (uint s = p.s_begin; s < p.s_end; ++s) {
        for (uint e = lid; e < work; e += tpg) {
            uint row = rows.x + e / H, j = e % H;
            uint d = row / N, n = row % N;
            uint col = d * H;
            device const float* hp = s == 0 ? h0 + n * DH + col
                                            : h + (rg_out_time(p, d, s - 1) * N + n) * DH + col;
            device const float* m = mask + rg_mask_step(p, s) + n * DH + col;
            device const float* Rk = Rt + d * H * H + j;
            float acc = 0.0f;
            for (uint k = 0; k < H; ++k) {
                acc += hp[k] * m[k] * Rk[k * H];
            }
            single_gate_cell(p, x, bias, h, zs, s, row, j, acc);
        }
        // h[t] must be complete before any thread of the block reads it as h[t−1].
        threadgroup_barrier(mem_flags::mem_device);
    }
    // Every thread has passed the barrier that ends the last step.
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// The v2 entry points' one-row body, where its conditions hold (rg_declines): thread lid is lane
// lid mod S of unit lid / S in the product; thread u < H runs unit u's cell. HOLD: the thread's
// share of R's row in registers.
template <bool HOLD>
inline void single_gate_forward_v2_run(uint threads, constant RecurrenceParams& p,
                                       device const float* x, device const float* bias,
                                       device const float* R, device const float* h0,
                                       device const float* mask, device float* h, device float* zs,
                                       device uint2* status, threadgroup float4* staged,
                                       threadgroup float4* nexts, uint lid, uint tgid, uint tpg) {
    bool fits = rg_one_pass(p, tpg, tgid) && p.H <= RG_NEXT
                && (!HOLD || rg_holds(p.H, RG_HOLD, rg_slices(p.H, tpg)));
    if (rg_declines(fits, threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)staged;
    threadgroup float* sums = (threadgroup float*)nexts;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H;
    RgRow r = rg_row(p, row);
    uint S = rg_slices(H, tpg), lane = lid % S, j = lid / S;
    bool unit = j < H, idle = rg_simd_idle(0, lid, S, H), cell = lid < H;
    device const float* Rj = R + (r.d * H + min(j, H - 1)) * H;
    float4 held[RG_HOLD];
    if (HOLD) {
        rg_hold<RG_HOLD>(held, Rj, unit ? H : 0u, lane, S);
    } else {
        rg_hold_some<RG_HOLD / 2>(held, Rj, unit ? H : 0u, lane, S);
    }
    float bj = 0.0f, mj = 0.0f, xa = 0.0f;
    if (cell) {
        bj = bias[r.d * H + lid];
        mj = mask[r.at + lid];
        xa = p.s_end > p.s_begin ? x[r.x0 + p.s_begin * r.xs + lid] : 0.0f;
    }
    if (p.s_end > p.s_begin) {
        rg_stage_hm(stage, p, h0, h, mask, row, 1, p.s_begin, lid, tpg);
    }
    for (uint s = p.s_begin; s < p.s_end; ++s) {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the stage is complete
        if (!idle) {
            float dot = 0.0f;
            if (unit) {
                dot = HOLD ? rg_held_dot<RG_HOLD>(held, stage, H, lane, S)
                           : rg_row_dot_held<RG_HOLD / 2>(held, stage, Rj, H, lane, S);
            }
            rg_unit_sum(sums, dot, j, lane, S, unit);
        }
        // Every sum is in, and the stage read before the cells write the next one.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (cell) {
            float a = (xa + bj) + sums[lid];
            uint out = r.o0 + s * r.os + lid;
            float ht = rg_activate(p.act0, a);
            if (s + 1 < p.s_end) {
                xa = x[r.x0 + (s + 1) * r.xs + lid];  // the next step's, in flight over the product
                stage[lid] = ht * (r.ms != 0 ? mask[(s + 1) * r.ms + r.at + lid] : mj);
            }
            if (p.training != 0) {
                zs[out] = a;
            }
            h[out] = ht;
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// ---------------------------------------------------------------------------------------------
// `name`: an entry point compiled for threadgroups of `threads` that calls
// single_gate_forward_v2_run with the template arguments after them.
#define instantiate_single_gate_forward_v2(name, threads, ...)                                     \
    [[max_total_threads_per_threadgroup(threads)]] instantiate_single_gate_forward(name, R) {      \
        threadgroup float4 staged[RG_STAGE / 4]; /* 16-byte aligned: rg_dots reads float4 */       \
        threadgroup float4 nexts[RG_NEXT / 4];   /* the product's sums */                          \
        single_gate_forward_v2_run<__VA_ARGS__>(threads, p, x, bias, R, h0, mask, h, zs, status,   \
                                                staged, nexts, lid, tgid, tpg);                    \
    }

instantiate_single_gate_forward_v2(single_gate_forward_v2_held, RG_THREADS, true)
instantiate_single_gate_forward_v2(single_gate_forward_v2_streamed, RG_THREADS, false)
instantiate_single_gate_forward_v2(single_gate_forward_v2_held_512, RG_THREADS_512, true)

[[max_total_threads_per_threadgroup(256)]]
instantiate_single_gate_forward(single_gate_forward_v3, R) {
    threadgroup float4 stage[RS_STAGE / 4];  // the staged chunk, k-major (rs_product)
    threadgroup float red[RS_RED];
    if (!rs_fits(p, 1u)) {
        return;  // a unit block wider than the tile: no completion mark, the host reports it
    }
    uint2 mine = rg_rows(p.s_end > p.s_begin ? rs_tiles(p) : 0u, p.count, tpg, tgid);
    for (uint t = mine.x; t < mine.y; ++t) {
        RsTile g = rs_forward_tile(stage, red, p, t, 1u, h0, h, mask, R, lid, tpg);
        for (uint e = lid; e < g.rows * g.units; e += tpg) {
            uint r = e / g.units, u = e % g.units, row = g.d * p.N + g.n0 + r;
            single_gate_cell(p, x, bias, h, zs, p.s_begin, row, g.u0 + u, rs_sum(red, g, r, u));
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}
