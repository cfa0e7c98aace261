// gru_forward.metal: GRU, a range of steps per dispatch (SEMANTICS.md §2.2).
//
//   a_z = x'_z[t] + (h[t−1] ⊙ m) R_zᵀ        z = f_update(a_z)
//   a_r = x'_r[t] + (h[t−1] ⊙ m) R_rᵀ        r = f_reset(a_r)
//   reset_after = 0:  a_o = x'_o[t] + (h[t−1] ⊙ r ⊙ m) R_oᵀ
//   reset_after = 1:  q = (h[t−1] ⊙ m) R_oᵀ + b2;   a_o = x'_o[t] + q ⊙ r
//   o = f_output(a_o);   h[t] = z ⊙ h[t−1] + (1 − z) ⊙ o   (flip_z: (1 − z) ⊙ h[t−1] + z ⊙ o)
//   z_state[t] = [a_z, a_r, a_o] in the gate layout (gate0..2 = blocks of z, r, o), then q
//
// Kernel versions (kernels/README.md: each entry point's grid, and when the host picks it)
//   v1 gru_forward: rows (d, n) of both directions split in contiguous blocks across
//      threadgroups; each threadgroup loops over the dispatch's processing steps
//      [p.s_begin, p.s_end). Phase 1: the thread owning (row, j) computes a_z, a_r (and with
//      reset_after q, a_o and h: the whole step) from dot products of length H. Phase 2
//      (without reset_after): a_o needs r of every unit, read back from z_state after a
//      device-memory barrier; z_state doubles as the staging buffer, so it is always bound.
//      Two barriers per step. R comes transposed (consecutive j read consecutive addresses).
//      Correct for every shape and threadgroup size, with or without reset_after.
//   v2 gru_forward_v2_<body>[_512], with reset_after only (without it a step's o gate reads r
//      of every unit of the row): one row a threadgroup of 1024 threads (512 for a _512 entry),
//      all of the dispatch's steps. Per step, S lanes a unit split the three gates' products
//      over k. R comes as it is (k contiguous). In the two-barrier body (gru_forward_v2_run)
//      the sums meet in threadgroup memory and thread u < H runs unit u's cell; in the spread
//      body (gru_forward_v2_spread_run) the unit's lanes run its cell, one barrier a step. Every
//      entry needs reset_after, S · H <= threads and 3H <= RG_NEXT, and declines otherwise
//      (rg_declines).
//        gru_forward_v2_streamed      the three rows of R read at every step (two barriers)
//        gru_forward_v2_streamed_512  the streamed body in threadgroups of 512
//        gru_forward_v2_held_512      the three rows held whole in RG_HOLD / 2 float4 a lane
//                                     (two barriers): H a multiple of 4, H <= 64
//        gru_forward_v2_spread_512    the spread body, the rows held whole: RG_HOLD_512 − 1
//                                     float4 of each in registers, the last in threadgroup
//                                     memory; H a multiple of 4, 4 lanes a unit or more
//                                     (H <= 128)
//   v3 gru_forward_v3 (reset_after only): one dispatch a step, threadgroups of 256 over tiles
//      of up to 16 rows of one direction × a block of units; the three gate products are one
//      product whose columns are the units × gates z, r, o (and an empty fourth)
//      (v3_tiles.metal, rs_product); then gru_cell_after for each (row, unit).
//
// Buffers of gru_forward (count = D·N·H, or D·N·1024: a threadgroup a row)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         x     [T,N,D·3H] projected input, input time
//   2      device const float*         bias  [D·3H] added to x (zeros if the projection added it)
//   3      device const float*         Rt    [D,H,3H] R transposed: Rt[d,k,q] = R[d,q,k]
//   4      device const float*         h0    [N,D·H] (zeros when absent)
//   5      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   6      device const float*         b2    [D·H] secondary bias (zeros when absent)
//   7      device float*               h     [T,N,D·H] output time
//   8      device float*               zs    [T,N,D·Z·H] output time, Z = 3 or 4 (reset_after)
//   9      device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// Buffers of gru_forward_v2_streamed and gru_forward_v2_streamed_512
// Buffers of gru_forward_v2_held_512 and gru_forward_v2_spread_512
// Buffers of gru_forward_v3
// (count = v2: D·N·1024, D·N·512 for _512; v3: 256 per tile of versions.tile_blocks)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         x     [T,N,D·3H] projected input, input time
//   2      device const float*         bias  [D·3H] added to x (zeros if the projection added it)
//   3      device const float*         R     [D,3H,H] recurrent weight as given
//   4      device const float*         h0    [N,D·H] (zeros when absent)
//   5      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   6      device const float*         b2    [D·H] secondary bias (zeros when absent)
//   7      device float*               h     [T,N,D·H] output time
//   8      device float*               zs    [T,N,D·Z·H] output time, Z = 3 or 4 (reset_after)
//   9      device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// An entry point of this file: `name` with the buffers of the tables above, the recurrent weight
// named W (Rt in v1, R in v2 and v3); its body follows.
#define instantiate_gru_forward(name, W)                                                           \
    kernel void name(                                                                              \
            constant RecurrenceParams& p [[buffer(0)]], device const float* x [[buffer(1)]],       \
            device const float* bias [[buffer(2)]], device const float* W [[buffer(3)]],           \
            device const float* h0 [[buffer(4)]], device const float* mask [[buffer(5)]],          \
            device const float* b2 [[buffer(6)]], device float* h [[buffer(7)]],                   \
            device float* zs [[buffer(8)]], device uint2* status [[buffer(9)]],                    \
            uint lid [[thread_position_in_threadgroup]],                                           \
            uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]])

// The step of v1 and v3 with reset_after (the v2 bodies repeat its arithmetic, bitwise) for
// (row, j) at processing step s, from the three gates' recurrent products (h[t−1] ⊙ m) R_kᵀ of
// unit j in the order z, r, o: writes z_state (a_z, a_r, a_o, then q) and h[t]; returns h[t].
inline float gru_cell_after(constant RecurrenceParams& p, device const float* x,
                           device const float* bias, device const float* h0,
                           device const float* b2, device float* h, device float* zs, uint s,
                           uint row, uint j, float3 dots) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 3 * p.H, DGH = p.D * 3 * p.H;
    uint ZH = p.Z * p.H, DZH = p.D * p.Z * p.H;
    uint qz = p.gate0 * H, qr = p.gate1 * H, qo = p.gate2 * H;
    uint d = row / N, n = row % N;
    uint col = d * H;
    uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
    uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
    // Every load, and the whole update, before the first store: zs may alias x (and, where
    // metal-cuda binds p as a device pointer, p) for all the compiler knows.
    float xb_z = x[xrow + qz + j] + bias[d * GH + qz + j];
    float xb_r = x[xrow + qr + j] + bias[d * GH + qr + j];
    float xb_o = x[xrow + qo + j] + bias[d * GH + qo + j];
    float hp = s == 0 ? h0[n * DH + col + j] : h[(rg_out_time(p, d, s - 1) * N + n) * DH + col + j];
    float q = dots.z + b2[col + j];
    float a_z = xb_z + dots.x;
    float a_r = xb_r + dots.y;
    float a_o = xb_o + q * rg_activate(p.act1, a_r);
    float z = rg_activate(p.act0, a_z);
    float o = rg_activate(p.act2, a_o);
    float ht = p.flip_z != 0 ? (1.0f - z) * hp + z * o : z * hp + (1.0f - z) * o;
    uint out = (rg_out_time(p, d, s) * N + n) * DH + col + j;
    zs[zrow + qz + j] = a_z;
    zs[zrow + qr + j] = a_r;
    zs[zrow + qo + j] = a_o;
    zs[zrow + 3 * H + j] = q;
    h[out] = ht;
    return ht;
}

instantiate_gru_forward(gru_forward, Rt) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 3 * p.H, DGH = p.D * 3 * p.H;
    uint ZH = p.Z * p.H, DZH = p.D * p.Z * p.H;
    uint2 rows = rg_rows(p.D * N, p.count, tpg, tgid);
    if (rows.x >= rows.y) {
        rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
        return;  // the whole threadgroup owns no row
    }
    uint work = (rows.y - rows.x) * H;
    uint qz = p.gate0 * H, qr = p.gate1 * H, qo = p.gate2 * H;
    for (uint s = p.s_begin; s < p.s_end; ++s) {
        for (uint e = lid; e < work; e += tpg) {
            uint row = rows.x + e / H, j = e % H;
            uint d = row / N, n = row % N;
            uint col = d * H;
            device const float* hp = s == 0 ? h0 + n * DH + col
                                            : h + (rg_out_time(p, d, s - 1) * N + n) * DH + col;
            device const float* m = mask + rg_mask_step(p, s) + n * DH + col;
            device const float* Rk = Rt + d * H * GH + j;
            float sz = 0.0f, sr = 0.0f, so = 0.0f;
            for (uint k = 0; k < H; ++k) {
                float hm = hp[k] * m[k];
                sz += hm * Rk[k * GH + qz];
                sr += hm * Rk[k * GH + qr];
                so += hm * Rk[k * GH + qo];
            }
            if (p.reset_after != 0) {
                gru_cell_after(p, x, bias, h0, b2, h, zs, s, row, j, float3(sz, sr, so));
            } else {
                uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
                uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
                zs[zrow + qz + j] = (x[xrow + qz + j] + bias[d * GH + qz + j]) + sz;
                zs[zrow + qr + j] = (x[xrow + qr + j] + bias[d * GH + qr + j]) + sr;
            }
        }
        // Phase 2 reads r of every unit of its row.
        threadgroup_barrier(mem_flags::mem_device);
        if (p.reset_after == 0) {
            for (uint e = lid; e < work; e += tpg) {
                uint row = rows.x + e / H, j = e % H;
                uint d = row / N, n = row % N;
                uint col = d * H;
                device const float* hp = s == 0 ? h0 + n * DH + col
                                                : h + (rg_out_time(p, d, s - 1) * N + n) * DH + col;
                device const float* m = mask + rg_mask_step(p, s) + n * DH + col;
                uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
                device const float* Rk = Rt + d * H * GH + qo + j;
                float so = 0.0f;
                for (uint k = 0; k < H; ++k) {
                    so += hp[k] * m[k] * rg_activate(p.act1, zs[zrow + qr + k]) * Rk[k * GH];
                }
                uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
                float a_o = (x[xrow + qo + j] + bias[d * GH + qo + j]) + so;
                zs[zrow + qo + j] = a_o;
                float z = rg_activate(p.act0, zs[zrow + qz + j]);
                float o = rg_activate(p.act2, a_o);
                h[(rg_out_time(p, d, s) * N + n) * DH + col + j] =
                    p.flip_z != 0 ? (1.0f - z) * hp[j] + z * o : z * hp[j] + (1.0f - z) * o;
            }
        }
        // h[t] must be complete before any thread of the block reads it as h[t−1].
        threadgroup_barrier(mem_flags::mem_device);
    }
    // Every thread has passed the barrier that ends the last step.
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// With W > 0, the thread's share of R's three rows of unit j (at oz, orr, oo of Rd), W float4 each.
template <uint W>
inline void gru_forward_v2_hold(thread float4 (*held)[W > 0 ? W : 1], device const float* Rd,
                                uint oz, uint orr, uint oo, bool unit, uint H, uint lane, uint S) {
    if (W > 0) {
        rg_hold<W>(held[0], Rd + oz, unit ? H : 0u, lane, S);
        rg_hold<W>(held[1], Rd + orr, unit ? H : 0u, lane, S);
        rg_hold<W>(held[2], Rd + oo, unit ? H : 0u, lane, S);
    }
}

// This lane's shares of the three gates' sums over the stage v, from the weights held (W > 0)
// or read from device memory (W = 0).
template <uint W>
inline void gru_forward_v2_dots(thread float* d3, thread const float4 (*held)[W > 0 ? W : 1],
                                threadgroup const float* v, device const float* Rd, uint oz,
                                uint orr, uint oo, uint H, uint lane, uint S) {
    if (W > 0) {
        rg_held_dots<3, (W > 0 ? W : 1)>(d3, held, v, H, lane, S);
    } else {
        RgAcc<3, 1> acc;
        rg_clear(acc);
        rg_dots(acc, 3, 1, v, H, Rd, oz, orr, oo, 0, H, lane, S);
        d3[0] = acc.v[0][0];
        d3[1] = acc.v[1][0];
        d3[2] = acc.v[2][0];
    }
}

// The two-barrier one-row body, where its conditions hold (rg_declines; reset_after): thread lid is
// lane lid mod S of unit lid / S in the three gates' product; thread u < H runs unit u's cell with
// h[t−1] (its own h[t] of the step before), the biases and the next step's x' in registers. W > 0:
// the thread's share of R's three rows, W float4 of each, held in registers; W = 0: read at every
// step.
template <uint W>
inline void gru_forward_v2_run(uint threads, constant RecurrenceParams& p, device const float* x,
                               device const float* bias, device const float* R,
                               device const float* h0, device const float* mask,
                               device const float* b2, device float* h, device float* zs,
                               device uint2* status, threadgroup float4* staged,
                               threadgroup float4* nexts, uint lid, uint tgid, uint tpg) {
    bool fits = p.reset_after != 0 && rg_one_pass(p, tpg, tgid) && 3 * p.H <= RG_NEXT
                && (W == 0 || rg_holds(p.H, W, rg_slices(p.H, tpg)));
    if (rg_declines(fits, threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)staged;
    threadgroup float* sums = (threadgroup float*)nexts;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H, GH = 3 * p.H;
    RgRow r = rg_row(p, row);
    RgRow xr = rg_row_of(p, row, GH);  // x': [T, N, D·3H]
    RgRow zr = rg_row_of(p, row, p.Z * H);  // z_state: [T, N, D·Z·H]
    uint S = rg_slices(H, tpg), lane = lid % S, j = min(lid / S, H - 1);
    bool unit = lid / S < H, idle = rg_simd_idle(0, lid, S, H), cell = lid < H;
    uint qz = p.gate0 * H, qr = p.gate1 * H, qo = p.gate2 * H;
    device const float* Rd = R + r.d * GH * H;
    uint oz = (qz + j) * H, orr = (qr + j) * H, oo = (qo + j) * H;
    float4 held[3][W > 0 ? W : 1];  // (one unread float4 where W = 0)
    gru_forward_v2_hold<W>(held, Rd, oz, orr, oo, unit, H, lane, S);
    uint u = min(lid, H - 1);
    float bz = 0.0f, br = 0.0f, bo = 0.0f, bq = 0.0f, mj = 0.0f;
    float x_z = 0.0f, x_r = 0.0f, x_o = 0.0f, hp = 0.0f;
    if (cell) {
        bz = bias[r.d * GH + qz + u];
        br = bias[r.d * GH + qr + u];
        bo = bias[r.d * GH + qo + u];
        bq = b2[r.d * H + u];
        mj = mask[r.at + u];
        if (p.s_end > p.s_begin) {
            uint xj = xr.x0 + p.s_begin * xr.xs + u;
            x_z = x[xj + qz];
            x_r = x[xj + qr];
            x_o = x[xj + qo];
            hp = p.s_begin == 0 ? h0[r.at + u] : h[r.o0 + (p.s_begin - 1) * r.os + u];
        }
    }
    if (p.s_end > p.s_begin) {
        rg_stage_hm(stage, p, h0, h, mask, row, 1, p.s_begin, lid, tpg);
    }
    for (uint s = p.s_begin; s < p.s_end; ++s) {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // the stage is complete
        if (!idle) {
            float dz = 0.0f, dr = 0.0f, dq = 0.0f;
            if (unit) {
                float t3[3];
                gru_forward_v2_dots<W>(t3, held, stage, Rd, oz, orr, oo, H, lane, S);
                dz = t3[0];
                dr = t3[1];
                dq = t3[2];
            }
            float d3[3] = {dz, dr, dq};
            rg_lane_totals<3>(d3, S);
            if (unit && lane == 0) {
                sums[j] = d3[0];
                sums[H + j] = d3[1];
                sums[2 * H + j] = d3[2];
            }
        }
        // Every sum is in, and the stage read before the cells write the next one.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (cell) {
            // gru_cell_after's arithmetic in its order (bitwise its results)
            float q = sums[2 * H + lid] + bq;
            float a_z = (x_z + bz) + sums[lid];
            float a_r = (x_r + br) + sums[H + lid];
            float a_o = (x_o + bo) + q * rg_activate(p.act1, a_r);
            float z = rg_activate(p.act0, a_z);
            float o = rg_activate(p.act2, a_o);
            float ht = p.flip_z != 0 ? (1.0f - z) * hp + z * o : z * hp + (1.0f - z) * o;
            hp = ht;
            if (s + 1 < p.s_end) {
                // the next step's, in flight over the product
                uint xj = xr.x0 + (s + 1) * xr.xs + lid;
                x_z = x[xj + qz];
                x_r = x[xj + qr];
                x_o = x[xj + qo];
                stage[lid] = ht * (r.ms != 0 ? mask[(s + 1) * r.ms + r.at + lid] : mj);
            }
            uint zj = zr.o0 + s * zr.os + lid;
            zs[zj + qz] = a_z;
            zs[zj + qr] = a_r;
            zs[zj + qo] = a_o;
            zs[zj + GH] = q;
            h[r.o0 + s * r.os + lid] = ht;
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// The spread body's conditions: the two-barrier body's, the rows whole in RG_HOLD_512 float4 a
// lane, S >= 4, and 12 floats a thread of threadgroup memory for the rows' last round.
inline bool gru_forward_v2_spread_fits(constant RecurrenceParams& p, uint tpg, uint tgid) {
    uint S = rg_slices(p.H, tpg);
    return p.reset_after != 0 && rg_one_pass(p, tpg, tgid) && 3 * p.H <= RG_NEXT
           && rg_holds(p.H, RG_HOLD_512, S) && S >= 4 && 12 * tpg <= RG_STAGE;
}

// The spread body (gru_forward_v2_spread_512), where gru_forward_v2_spread_fits holds
// (rg_declines): gru_forward_v2_run with the cell on the product's lanes (S >= 4), one barrier a
// step: after the lane totals every lane of unit j has its three sums, and lane k < 3 holds gate
// k's x' and bias; lanes 0 and 1 find z and r side by side, lane 2 a_o and o, and every lane of the
// unit gets them by simd_shuffle and finds h[t]. The stage alternates between two buffers (stage,
// other), so that lane 0 writes the next step's while other SIMD-groups may still read this one's.
// Bitwise gru_forward_v2_run's results. At H = 128 in 512 threads the two-barrier body waited at
// its barriers behind the cell on H / 32 SIMD-groups (verification/PERFORMANCE.md). Of the W + 1
// rounds of each row a lane's share covers, W are held in registers and the last in threadgroup
// memory (tail: 12 floats a thread), which leaves registers for the step's values (held whole, the
// rows would not).
template <uint W>
inline void gru_forward_v2_spread_run(uint threads, constant RecurrenceParams& p,
                                      device const float* x, device const float* bias,
                                      device const float* R, device const float* h0,
                                      device const float* mask, device const float* b2,
                                      device float* h, device float* zs, device uint2* status,
                                      threadgroup float4* staged, threadgroup float4* nexts,
                                      uint lid, uint tgid, uint tpg) {
    if (rg_declines(gru_forward_v2_spread_fits(p, tpg, tgid), threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)nexts;  // the stage's two buffers
    threadgroup float* other = stage + p.H;
    threadgroup float4* tail = staged;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H, GH = 3 * p.H;
    RgRow r = rg_row(p, row);
    RgRow xr = rg_row_of(p, row, GH);
    RgRow zr = rg_row_of(p, row, p.Z * H);
    uint S = rg_slices(H, tpg), lane = lid % S, j = min(lid / S, H - 1);
    bool unit = lid / S < H, idle = rg_simd_idle(0, lid, S, H);
    uint qz = p.gate0 * H, qr = p.gate1 * H, qo = p.gate2 * H;
    uint gq = lane == 0 ? qz : (lane == 1 ? qr : qo);  // the lane's gate
    device const float* Rd = R + r.d * GH * H;
    uint oz = (qz + j) * H, orr = (qr + j) * H, oo = (qo + j) * H;
    float4 held[3][W > 0 ? W : 1];
    gru_forward_v2_hold<W>(held, Rd, oz, orr, oo, unit, H, lane, S);
    rg_hold_tail<W>(tail, lid, Rd + oz, unit ? H : 0u, lane, S);
    rg_hold_tail<W>(tail, tpg + lid, Rd + orr, unit ? H : 0u, lane, S);
    rg_hold_tail<W>(tail, 2 * tpg + lid, Rd + oo, unit ? H : 0u, lane, S);
    float bk = 0.0f, bq = 0.0f, mj = 0.0f, xk = 0.0f, hp = 0.0f;
    if (unit) {
        bk = bias[r.d * GH + gq + j];
        bq = b2[r.d * H + j];
        mj = mask[r.at + j];
        if (p.s_end > p.s_begin) {
            xk = x[xr.x0 + p.s_begin * xr.xs + gq + j];
            hp = p.s_begin == 0 ? h0[r.at + j] : h[r.o0 + (p.s_begin - 1) * r.os + j];
        }
    }
    if (p.s_end > p.s_begin) {
        rg_stage_hm(stage, p, h0, h, mask, row, 1, p.s_begin, lid, tpg);
    }
    uint first = (lid & 31u) - lane;  // the unit's lane 0 in its SIMD-group
    // The lane's offsets, advanced a step at a time (uint arithmetic wraps, as RgRow's): its
    // z_state store of step s (lanes 0, 1, 2: a_z, a_r, a_o; lane 3: q), h of step s (lane 3),
    // x' (lanes 0, 1, 2) and the mask (lane 0) of step s + 1.
    uint zo = zr.o0 + p.s_begin * zr.os + (lane < 3 ? gq : GH) + j;
    uint ho = r.o0 + p.s_begin * r.os + j;
    uint xo = xr.x0 + (p.s_begin + 1) * xr.xs + gq + j;
    uint mo = (p.s_begin + 1) * r.ms + r.at + j;
    for (uint s = p.s_begin; s < p.s_end; ++s) {
        bool odd = ((s - p.s_begin) & 1u) != 0;
        threadgroup float* cur = odd ? other : stage;
        threadgroup float* nxt = odd ? stage : other;
        threadgroup_barrier(mem_flags::mem_threadgroup);  // cur is complete
        if (!idle) {
            float d3[3] = {0.0f, 0.0f, 0.0f};
            if (unit) {
                rg_held_dots_tail<3, W>(d3, held, tail, tpg, lid, cur, H, lane, S);
            }
            rg_lane_totals<3>(d3, S);
            // gru_cell_after's arithmetic in its order (bitwise its results)
            float a = (xk + bk) + (lane == 0 ? d3[0] : d3[1]);  // lanes 0, 1: a_z, a_r
            float g = rg_activate(lane == 0 ? p.act0 : p.act1, a);
            float z = simd_shuffle(g, (ushort)first);
            float rr = simd_shuffle(g, (ushort)(first + 1));
            float q = d3[2] + bq;
            float a_o = (xk + bk) + q * rr;  // lane 2's
            float o = simd_shuffle(rg_activate(p.act2, a_o), (ushort)(first + 2));
            float ht = p.flip_z != 0 ? (1.0f - z) * hp + z * o : z * hp + (1.0f - z) * o;
            hp = ht;
            if (unit) {
                if (lane < 4) {
                    zs[zo] = lane < 2 ? a : (lane == 2 ? a_o : q);
                }
                if (lane == 3) {
                    h[ho] = ht;
                }
                if (s + 1 < p.s_end) {
                    if (lane < 3) {
                        xk = x[xo];  // in flight over the barrier
                    }
                    if (lane == 0) {
                        nxt[j] = ht * (p.mask_per_step != 0 ? mask[mo] : mj);
                    }
                }
            }
        }
        zo += zr.os;
        ho += r.os;
        xo += xr.xs;
        mo += r.ms;
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// ---------------------------------------------------------------------------------------------
// `name`: an entry point compiled for threadgroups of `threads` that calls `run` (the two
// bodies have a helper each).
#define instantiate_gru_forward_v2(name, threads, run)                                             \
    [[max_total_threads_per_threadgroup(threads)]] instantiate_gru_forward(name, R) {              \
        threadgroup float4 staged[RG_STAGE / 4]; /* the stage (spread: its rows' tail) */          \
        threadgroup float4 nexts[RG_NEXT / 4];   /* the sums (spread: the stage) */                \
        run(threads, p, x, bias, R, h0, mask, b2, h, zs, status, staged, nexts, lid, tgid, tpg);   \
    }

instantiate_gru_forward_v2(gru_forward_v2_streamed, RG_THREADS, gru_forward_v2_run<0>)
instantiate_gru_forward_v2(gru_forward_v2_streamed_512, RG_THREADS_512, gru_forward_v2_run<0>)
instantiate_gru_forward_v2(gru_forward_v2_held_512, RG_THREADS_512, gru_forward_v2_run<RG_HOLD / 2>)
instantiate_gru_forward_v2(gru_forward_v2_spread_512, RG_THREADS_512,
                           gru_forward_v2_spread_run<RG_HOLD_512 - 1>)

[[max_total_threads_per_threadgroup(256)]]
instantiate_gru_forward(gru_forward_v3, R) {
    threadgroup float4 stage[RS_STAGE / 4];  // the staged chunk, k-major (rs_product)
    threadgroup float red[RS_RED];
    if (p.reset_after == 0) {
        return;  // its o gate reads r of every unit: no completion mark, the host reports it
    }
    if (!rs_fits(p, 4u)) {
        return;  // a unit block wider than the tile: no completion mark, the host reports it
    }
    uint2 mine = rg_rows(p.s_end > p.s_begin ? rs_tiles(p) : 0u, p.count, tpg, tgid);
    for (uint t = mine.x; t < mine.y; ++t) {
        RsTile g = rs_forward_tile(stage, red, p, t, 3u, h0, h, mask, R, lid, tpg);
        for (uint e = lid; e < g.rows * g.units; e += tpg) {
            uint r = e / g.units, u = e % g.units, row = g.d * p.N + g.n0 + r;
            gru_cell_after(p, x, bias, h0, b2, h, zs, p.s_begin, row, g.u0 + u,
                           rs_unit_sums(red, g, r, u).xyz);
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}
