// lstm_forward.metal: LSTM, a range of steps per dispatch (SEMANTICS.md §2.2).
//
//   a_k = x'_k[t] + (h[t−1] ⊙ m) R_kᵀ + p_k ⊙ c[t−1]      k in i, f, z, o (gate blocks gate0..3)
//   c[t] = f ⊙ c[t−1] + i ⊙ z        h[t] = o ⊙ g(c[t])     z_state[t] = [a_i, a_f, a_z, a_o]
//
// Kernel versions (kernels/README.md: each entry point's grid, and when the host picks it)
//   v1 lstm_forward: rows (d, n) of both directions split in contiguous blocks across
//      threadgroups; each threadgroup loops over the dispatch's processing steps
//      [p.s_begin, p.s_end); the thread that owns (row, j) computes the four gate dot products
//      of length H for unit j (in one pass over k) and the whole cell update. h[t−1] is read
//      back from the output buffer after a device-memory barrier. R comes transposed
//      (consecutive j read consecutive addresses). One barrier per step. Correct for every
//      shape and threadgroup size.
//   v2 lstm_forward_v2_<body>[_512]: one row a threadgroup of 1024 threads (512 for a _512
//      entry), all of the dispatch's steps (lstm_forward_v2_run). Per step, S lanes a unit
//      split the four gates' products over k; lane k < 4 of the unit then finishes gate k, the
//      four activations meet by simd_shuffle, and lane 0 writes c[t], h[t] and the next step's
//      stage (two buffers alternate: one barrier a step). R comes as it is (k contiguous). Every
//      entry needs S >= 4 and S · H <= threads, and declines otherwise (rg_declines).
//        lstm_forward_v2_spread          R read at every step
//        lstm_forward_v2_full            the spread body where every thread is a unit's lane
//                                        (rg_full: S · H = threads, H a multiple of 4), with
//                                        no per-step test of which
//        lstm_forward_v2_spread_512      the spread body in threadgroups of 512
//        lstm_forward_v2_full_whole_512  the full body in threadgroups of 512, the first 2
//                                        float4 of each row held: the rows whole at H = 64
//        lstm_forward_v2_full_held_512   the full body in threadgroups of 512, the first
//                                        RG_LSTM_HOLD_512 float4 of each row held: half of it
//                                        at H = 128
//   v3 lstm_forward_v3: one dispatch a step, threadgroups of 256 over tiles of up to 16 rows
//      of one direction × a block of units; the four gate products are one product whose
//      columns are the units × gates i, f, z, o (v3_tiles.metal, rs_product); then lstm_cell for
//      each (row, unit) of the tile.
//
// Buffers of lstm_forward (count = D·N·H, or D·N·1024: a threadgroup a row)
//   index  type                        name      layout
//   0      constant RecurrenceParams&  p         scalars
//   1      device const float*         x         [T,N,D·4H] projected input, input time
//   2      device const float*         bias      [D·4H] added to x
//                                                (zeros if the projection added it)
//   3      device const float*         Rt        [D,H,4H] R transposed: Rt[d,k,q] = R[d,q,k]
//   4      device const float*         h0        [N,D·H] (zeros when absent)
//   5      device const float*         c0        [N,D·H] (zeros when absent)
//   6      device const float*         mask      [N,D·H], or [T,N,D·H] per processing step
//   7      device const float*         peephole  [D,4H] (read when p.has_peephole)
//   8      device float*               h         [T,N,D·H] output time
//   9      device float*               c         [T,N,D·H] output time
//   10     device float*               zs        [T,N,D·4H] output time (written when p.training)
//   11     device uint2*               status    [ceil(count/32)] completion marks (common.metal)

// Buffers of lstm_forward_v2_spread and lstm_forward_v2_full
// Buffers of lstm_forward_v2_spread_512 and lstm_forward_v2_full_whole_512
// Buffers of lstm_forward_v2_full_held_512 and lstm_forward_v3
// (count = v2: D·N·1024, D·N·512 for _512; v3: 256 per tile of versions.tile_blocks)
//   index  type                        name      layout
//   0      constant RecurrenceParams&  p         scalars
//   1      device const float*         x         [T,N,D·4H] projected input, input time
//   2      device const float*         bias      [D·4H] added to x
//                                                (zeros if the projection added it)
//   3      device const float*         R         [D,4H,H] recurrent weight as given
//   4      device const float*         h0        [N,D·H] (zeros when absent)
//   5      device const float*         c0        [N,D·H] (zeros when absent)
//   6      device const float*         mask      [N,D·H], or [T,N,D·H] per processing step
//   7      device const float*         peephole  [D,4H] (read when p.has_peephole)
//   8      device float*               h         [T,N,D·H] output time
//   9      device float*               c         [T,N,D·H] output time
//   10     device float*               zs        [T,N,D·4H] output time (written when p.training)
//   11     device uint2*               status    [ceil(count/32)] completion marks (common.metal)

// An entry point of this file: `name` with the buffers of the tables above, the recurrent weight
// named W (Rt in v1, R in v2 and v3); its body follows.
#define instantiate_lstm_forward(name, W)                                                          \
    kernel void name(                                                                              \
            constant RecurrenceParams& p [[buffer(0)]], device const float* x [[buffer(1)]],       \
            device const float* bias [[buffer(2)]], device const float* W [[buffer(3)]],           \
            device const float* h0 [[buffer(4)]], device const float* c0 [[buffer(5)]],            \
            device const float* mask [[buffer(6)]], device const float* peephole [[buffer(7)]],    \
            device float* h [[buffer(8)]], device float* c [[buffer(9)]],                          \
            device float* zs [[buffer(10)]], device uint2* status [[buffer(11)]],                  \
            uint lid [[thread_position_in_threadgroup]],                                           \
            uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]])

// The cell update of v1 and v3 for (row, j) at processing step s, from the four gates'
// recurrent products (h[t−1] ⊙ m) R_kᵀ of unit j in the cell's order i, f, z, o: writes
// z_state (when training), c[t] and h[t]; returns h[t].
inline float lstm_cell(constant RecurrenceParams& p, device const float* x,
                      device const float* bias, device const float* c0,
                      device const float* peephole, device float* h, device float* c,
                      device float* zs, uint s, uint row, uint j, float4 dots) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 4 * p.H, DGH = p.D * 4 * p.H;
    uint d = row / N, n = row % N;
    uint col = d * H;
    uint prev = s == 0 ? 0u : (rg_out_time(p, d, s - 1) * N + n) * DH + col;
    uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
    uint zrow = (rg_out_time(p, d, s) * N + n) * DGH + d * GH;
    // Every load, and the whole update, before the first store: zs may alias x (and, where
    // metal-cuda binds p as a device pointer, p) for all the compiler knows.
    float cp = s == 0 ? c0[n * DH + col + j] : c[prev + j];
    uint q[4];
    float xb[4], pw[4];
    #pragma unroll
    for (uint k = 0; k < 4; ++k) {
        q[k] = rg_gate(p, k) * H + j;  // unit j of gate k within the direction
        xb[k] = x[xrow + q[k]] + bias[d * GH + q[k]];
        pw[k] = p.has_peephole != 0 ? peephole[d * GH + q[k]] : 0.0f;
    }
    float a[4], act[4];
    #pragma unroll
    for (uint k = 0; k < 4; ++k) {
        a[k] = xb[k] + dots[k];
        if (p.has_peephole != 0) {
            a[k] += pw[k] * cp;
        }
        act[k] = rg_activate(rg_act(p, k), a[k]);
    }
    float ct = act[1] * cp + act[0] * act[2];
    float ht = act[3] * rg_activate(p.act4, ct);
    uint out = (rg_out_time(p, d, s) * N + n) * DH + col + j;
    if (p.training != 0) {
        #pragma unroll
        for (uint k = 0; k < 4; ++k) {
            zs[zrow + q[k]] = a[k];
        }
    }
    c[out] = ct;
    h[out] = ht;
    return ht;
}

instantiate_lstm_forward(lstm_forward, Rt) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 4 * p.H;
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
            uint prev = s == 0 ? 0u : (rg_out_time(p, d, s - 1) * N + n) * DH + col;
            device const float* hp = s == 0 ? h0 + n * DH + col : h + prev;
            device const float* m = mask + rg_mask_step(p, s) + n * DH + col;
            // one pass over k for the four gates: h[t−1] ⊙ m is read once, not once a gate
            device const float* Rk = Rt + d * H * GH + j;
            uint q0 = rg_gate(p, 0) * H, q1 = rg_gate(p, 1) * H, q2 = rg_gate(p, 2) * H,
                 q3 = rg_gate(p, 3) * H;
            float4 dots = float4(0.0f);
            for (uint l = 0; l < H; ++l) {
                float hm = hp[l] * m[l];
                dots.x += hm * Rk[l * GH + q0];
                dots.y += hm * Rk[l * GH + q1];
                dots.z += hm * Rk[l * GH + q2];
                dots.w += hm * Rk[l * GH + q3];
            }
            lstm_cell(p, x, bias, c0, peephole, h, c, zs, s, row, j, dots);
        }
        // h[t] must be complete before any thread of the block reads it as h[t−1].
        threadgroup_barrier(mem_flags::mem_device);
    }
    // Every thread has passed the barrier that ends the last step.
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// The v2 entry points' one-row body, where its conditions hold (rg_declines): thread lid is lane
// lid mod S of unit lid / S; the unit's lanes run its cell and keep c[t] in registers. Unlike the
// other one-row bodies, the cell runs on the product's SIMD-groups, so that a SIMD-group's long
// cell (four activations) overlaps the others' products rather than following all of them after a
// second barrier.
// S >= 4: lane k < 4 of the unit finishes gate k (x' + bias, peephole term, activation,
// z_state) and the four activations meet on every such lane through simd_shuffle; lanes 0 .. 3
// each find c[t] (the same arithmetic on the same values) for the next step's peephole terms,
// and lane 0 alone h[t].
// FULL (rg_full: every thread a unit's, float4 reads): no per-step test of the unit, of an idle
// SIMD-group or of H's alignment, whose operands would otherwise stay live across the step.
// HW > 0 (FULL, in the 512-thread entries): the first HW rounds of the thread's share of its
// four rows of R stay in registers, the rest read at every step after them, in rg_dots' order
// (the sums bitwise those of HW = 0): the rows whole at H = 64 (HW = 2), half at H = 128.
template <bool FULL, uint HW>
inline void lstm_forward_v2_run(uint threads, constant RecurrenceParams& p, device const float* x,
                                device const float* bias, device const float* R,
                                device const float* h0, device const float* c0,
                                device const float* mask, device const float* peephole,
                                device float* h, device float* c, device float* zs,
                                device uint2* status, threadgroup float4* staged,
                                threadgroup float4* nexts, uint lid, uint tgid, uint tpg) {
    bool fits = rg_one_pass(p, tpg, tgid) && p.H <= RG_NEXT && rg_slices(p.H, tpg) >= 4
                && (!FULL || rg_full(p.H, rg_slices(p.H, tpg), tpg));
    if (rg_declines(fits, threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)staged;
    threadgroup float* after = (threadgroup float*)nexts;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H, GH = 4 * p.H;
    RgRow r = rg_row(p, row);
    uint S = rg_slices(H, tpg), lane = lid % S, j = lid / S;
    bool unit = FULL || j < H, idle = !FULL && rg_simd_idle(0, lid, S, H);
    uint ju = min(j, H - 1);
    // unit j of gate k (the cell's order i, f, z, o) within the direction's 4H
    uint q[4] = {p.gate0 * H + ju, p.gate1 * H + ju, p.gate2 * H + ju, p.gate3 * H + ju};
    device const float* Rd = R + r.d * GH * H;
    float4 held[4][HW > 0 ? HW : 1];
    if (FULL && HW > 0) {
        #pragma unroll
        for (uint k = 0; k < 4; ++k) {
            rg_hold<(HW > 0 ? HW : 1)>(held[k], Rd + q[k] * H, H, lane, S);
        }
    }
    RgRow z = rg_row_of(p, row, GH);  // x' and z_state: [T, N, D·4H]
    // the gate lanes' inputs: gate k's on lane k
    uint gk = min(lane, 3u);  // the lane's gate
    uint qk = gk == 0 ? q[0] : (gk == 1 ? q[1] : (gk == 2 ? q[2] : q[3]));
    bool gate = unit && lane < 4;
    float cp = 0.0f, mj = 0.0f;
    float bk = gate ? bias[r.d * GH + qk] : 0.0f;
    float pw = gate && p.has_peephole != 0 ? peephole[r.d * GH + qk] : 0.0f;
    float xb = gate && p.s_end > p.s_begin ? x[z.x0 + p.s_begin * z.xs + qk] : 0.0f;
    if (gate) {
        mj = mask[r.at + j];
        if (p.s_end > p.s_begin) {
            uint s = p.s_begin;
            cp = s == 0 ? c0[r.at + j] : c[r.o0 + (s - 1) * r.os + j];
        }
    }
    bool peep = p.has_peephole != 0, training = p.training != 0;
    for (uint s = p.s_begin; s < p.s_end; ++s) {
        bool odd = ((s - p.s_begin) & 1u) != 0;
        threadgroup float* cur = odd ? after : stage;
        threadgroup float* next = odd ? stage : after;
        if (s == p.s_begin) {
            rg_stage_hm(cur, p, h0, h, mask, row, 1, s, lid, tpg);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        if (!idle) {
            float dots[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (unit) {  // gates in the cell's order i, f, z, o
                RgAcc<4, 1> acc;
                rg_clear(acc);
                if (FULL) {  // rg_dots' float4 reads, with no test of H
                    uint off[4] = {q[0] * H, q[1] * H, q[2] * H, q[3] * H};
                    uint k0 = 4 * lane;
                    if (HW > 0) {  // the held rounds first, in rg_dots' order
                        float part[4];
                        rg_held_dots<4, (HW > 0 ? HW : 1)>(part, held, cur, H, lane, S);
                        #pragma unroll
                        for (uint k = 0; k < 4; ++k) {
                            acc.v[k][0] = part[k];
                        }
                        k0 += 4 * S * HW;
                    }
                    rg_dots_float4(acc, 4, 1, cur, H, Rd, off, k0, H, S);
                } else {
                    rg_dots(acc, 4, 1, cur, H, Rd, q[0] * H, q[1] * H, q[2] * H, q[3] * H, H,
                            lane, S);
                }
                #pragma unroll
                for (uint k = 0; k < 4; ++k) {
                    dots[k] = acc.v[k][0];
                }
            }
            rg_lane_totals<4>(dots, S);
            // lstm_cell's arithmetic, in its order
            float act[4], mine = 0.0f, am = 0.0f;
            if (gate) {
                float dk = gk == 0 ? dots[0] : (gk == 1 ? dots[1] : (gk == 2 ? dots[2] : dots[3]));
                am = (xb + bk) + dk;
                if (peep) {
                    am += pw * cp;
                }
                mine = rg_activate(rg_act(p, gk), am);
                if (training) {
                    zs[z.o0 + s * z.os + qk] = am;
                }
                if (s + 1 < p.s_end) {
                    xb = x[z.x0 + (s + 1) * z.xs + qk];  // in flight over the barrier
                }
            }
            uint first = (lid & 31u) - lane;  // the unit's lane 0 in its SIMD-group
            #pragma unroll
            for (uint k = 0; k < 4; ++k) {
                act[k] = simd_shuffle(mine, (ushort)(first + k));
            }
            if (gate) {
                float ct = act[1] * cp + act[0] * act[2];
                if (lane == 0) {
                    float ht = act[3] * rg_activate(p.act4, ct);
                    if (s + 1 < p.s_end) {
                        next[j] = ht * (r.ms != 0 ? mask[(s + 1) * r.ms + r.at + j] : mj);
                    }
                    uint out = r.o0 + s * r.os + j;
                    c[out] = ct;
                    h[out] = ht;
                }
                cp = ct;
            }
        }
        // The next stage is complete before any thread reads it, and this one read before
        // any thread writes it again (a step later).
        threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    }
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// ---------------------------------------------------------------------------------------------
// `name`: an entry point compiled for threadgroups of `threads` that calls
// lstm_forward_v2_run with the template arguments after them.
#define instantiate_lstm_forward_v2(name, threads, ...)                                            \
    [[max_total_threads_per_threadgroup(threads)]] instantiate_lstm_forward(name, R) {             \
        threadgroup float4 staged[RG_STAGE / 4]; /* 16-byte aligned: rg_dots reads float4 */       \
        threadgroup float4 nexts[RG_NEXT / 4];   /* the stage's other buffer */                    \
        lstm_forward_v2_run<__VA_ARGS__>(threads, p, x, bias, R, h0, c0, mask, peephole, h, c, zs, \
                                         status, staged, nexts, lid, tgid, tpg);                   \
    }

instantiate_lstm_forward_v2(lstm_forward_v2_spread, RG_THREADS, false, 0)
instantiate_lstm_forward_v2(lstm_forward_v2_full, RG_THREADS, true, 0)
instantiate_lstm_forward_v2(lstm_forward_v2_spread_512, RG_THREADS_512, false, 0)
instantiate_lstm_forward_v2(lstm_forward_v2_full_whole_512, RG_THREADS_512, true, 2)
instantiate_lstm_forward_v2(lstm_forward_v2_full_held_512, RG_THREADS_512, true, RG_LSTM_HOLD_512)

[[max_total_threads_per_threadgroup(256)]]
instantiate_lstm_forward(lstm_forward_v3, R) {
    threadgroup float4 stage[RS_STAGE / 4];  // the staged chunk, k-major (rs_product)
    threadgroup float red[RS_RED];
    if (!rs_fits(p, 4u)) {
        return;  // a unit block wider than the tile: no completion mark, the host reports it
    }
    uint2 mine = rg_rows(p.s_end > p.s_begin ? rs_tiles(p) : 0u, p.count, tpg, tgid);
    for (uint t = mine.x; t < mine.y; ++t) {
        RsTile g = rs_forward_tile(stage, red, p, t, 4u, h0, h, mask, R, lid, tpg);
        for (uint e = lid; e < g.rows * g.units; e += tpg) {
            uint r = e / g.units, u = e % g.units, row = g.d * p.N + g.n0 + r;
            lstm_cell(p, x, bias, c0, peephole, h, c, zs, p.s_begin, row, g.u0 + u,
                      rs_unit_sums(red, g, r, u));
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}
