// gru_backward.metal: the recurrence of GRUGradients (SEMANTICS.md §3.3).
//
//   flip_z = 0:  da_o = dh ⊙ (1−z) ⊙ f_output'(a_o);  da_z = dh ⊙ (hp − o) ⊙ f_update'(a_z)
//                keep = z
//   flip_z = 1:  da_o = dh ⊙ z ⊙ f_output'(a_o);      da_z = dh ⊙ (o − hp) ⊙ f_update'(a_z)
//                keep = 1−z
//   reset_after = 0:  g = da_o R_o;  da_r = g ⊙ hp ⊙ m ⊙ f_reset'(a_r)
//                     dh_next = dh ⊙ keep + g ⊙ r ⊙ m + (da_z R_z + da_r R_r) ⊙ m
//   reset_after = 1:  da_r = da_o ⊙ q ⊙ f_reset'(a_r);  dq = da_o ⊙ r
//                     dh_next = dh ⊙ keep + (dq R_o + da_z R_z + da_r R_r) ⊙ m
//
// hp = h[t−1] comes from output_fwd (init_state at t = 0). The kernel writes, in input time:
// dA (the source gradient without input_weight), lhs (dA, with dq in the o block when
// reset_after: the left factor of dR) and rhs (the right factor of dR per gate block: h[t−1] ⊙ m,
// or [hm, hm, hm ⊙ r] without reset_after, whose o gate reads h[t−1] ⊙ r ⊙ m; the o gate is
// block 2 in both gate layouts). With reset_after it also writes the per-row partial sums of
// dq over time (prow) for the secondary-bias gradient.
//
// Kernel versions (kernels/README.md: each entry point's grid, and when the host picks it)
//   v1 gru_backward: rows (d, n) in contiguous blocks per threadgroup, a loop down the
//      dispatch's processing steps [p.s_begin, p.s_end), three phases per step separated by two
//      device-memory barriers: A (element-wise da_z, da_o, and with reset_after da_r, dq), B
//      (without reset_after: g[j] = Σ_k da_o,k R_o[k,j] and da_r), C (dh_next[j], a dot product
//      of length 3H over lhs). dh_next lives in the init-state gradient buffer and g in a
//      scratch buffer; only the thread owning (row, j) touches either. dh_next and prow carry
//      over to the next dispatch. Correct for every shape and threadgroup size.
//   v2 gru_backward_v2_<body>[_512], with reset_after only (without it, phase B's da_r reads
//      da_o of every unit): one row a threadgroup of 1024 threads (512 for a _512 entry), all
//      of the dispatch's steps (gru_backward_v2_run). Thread u < H runs unit u's phase A, stages
//      lhs (da_z, da_r, dq) and keeps dh_next and Σ dq in registers; in phase C, lhs·R, S lanes
//      a unit split the 3H gate rows and their sums meet in threadgroup memory (two barriers a
//      step). Rᵀ [D,H,3H] comes instead of R (the gate index contiguous). Every entry needs
//      reset_after, S · H <= threads and 4H floats of RG_STAGE, and declines otherwise
//      (rg_declines).
//        gru_backward_v2_ahead       the 3H threads past the product's find the next step's
//                                    activations while it runs (gru_backward_ahead): 3H <=
//                                    threads − S·H and 11H floats of RG_STAGE (H <= 93, or
//                                    129 .. 146)
//        gru_backward_v2_paired      2S lanes own units j and j + H/2, each float4 of the stage
//                                    read once for both rows (rg_pairs: every thread in the
//                                    product, H a multiple of 4, 2S <= RG_LANES; H = 256), the
//                                    first round of each row held
//        gru_backward_v2_streamed    the first RG_HOLD / 2 float4 of Rᵀ's row held, the rest
//                                    read at every step: any H the pass covers
//        gru_backward_v2_paired_512  the paired body in threadgroups of 512: at H = 128, 4 lanes
//                                    a unit, 8 a pair, RG_PAIR_WHOLE_512 rounds of each row held
//   v3 gru_backward_v3 (reset_after only): one dispatch a step, threadgroups of 256 over tiles
//      of up to 16 rows of one direction × a block of units: first the carry of the step
//      before, m ⊙ (lhs R) over the 3H gate rows (v3_tiles.metal, rs_product) added to the
//      dh ⊙ keep that phase A left in dhn; then phase A for each (row, unit) of the tile.
//      T + 1 dispatches, the last one the carry alone.
//
// Buffers of gru_backward (count = D·N·H, or D·N·1024: a threadgroup a row)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         R     [D,3H,H]
//   2      device const float*         h0    [N,D·H] (zeros when absent)
//   3      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   4      device const float*         dy    [T,N,D·H] source_gradient, output time
//   5      device const float*         zs    [T,N,D·Z·H] z_state, output time
//   6      device const float*         hfwd  [T,N,D·H] output_fwd, output time
//   7      device float*               dx    [T,N,D·3H] dA, input time
//   8      device float*               lhs   [T,N,D·3H] left factor of dR, input time
//   9      device float*               rhs   [T,N,D·B·H] right factor of dR, input time;
//                                            B = 1 (reset_after) or 3
//   10     device float*               dhn   [N,D·H] in: state_gradient (or zeros);
//                                            out: init_state gradient
//   11     device float*               work  [D·N,H] scratch: g
//   12     device float*               prow  [D·N,H] in: zeros; out: Σ_t dq per row (reset_after)
//   13     device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// Buffers of gru_backward_v2_ahead and gru_backward_v2_paired
// Buffers of gru_backward_v2_streamed and gru_backward_v2_paired_512
// Buffers of gru_backward_v3
// (count = v2: D·N·1024, D·N·512 for _512; v3: 256 per tile of versions.tile_blocks)
//   index  type                        name  layout
//   0      constant RecurrenceParams&  p     scalars
//   1      device const float*         Rt    [D,H,3H] R transposed: Rt[d,j,q] = R[d,q,j]
//   2      device const float*         h0    [N,D·H] (zeros when absent)
//   3      device const float*         mask  [N,D·H], or [T,N,D·H] per processing step
//   4      device const float*         dy    [T,N,D·H] source_gradient, output time
//   5      device const float*         zs    [T,N,D·Z·H] z_state, output time
//   6      device const float*         hfwd  [T,N,D·H] output_fwd, output time
//   7      device float*               dx    [T,N,D·3H] dA, input time
//   8      device float*               lhs   [T,N,D·3H] left factor of dR, input time
//   9      device float*               rhs   [T,N,D·B·H] right factor of dR, input time;
//                                            B = 1 (reset_after) or 3
//   10     device float*               dhn   [N,D·H] in: state_gradient (or zeros);
//                                            out: init_state gradient
//   11     device float*               work  [D·N,H] scratch: g
//   12     device float*               prow  [D·N,H] in: zeros; out: Σ_t dq per row (reset_after)
//   13     device uint2*               status  [ceil(count/32)] completion marks (common.metal)

// An entry point of this file: `name` with the buffers of the tables above, the recurrent weight
// named W (R in v1, Rt in v2 and v3); its body follows.
#define instantiate_gru_backward(name, W)                                                          \
    kernel void name(                                                                              \
            constant RecurrenceParams& p [[buffer(0)]], device const float* W [[buffer(1)]],       \
            device const float* h0 [[buffer(2)]], device const float* mask [[buffer(3)]],          \
            device const float* dy [[buffer(4)]], device const float* zs [[buffer(5)]],            \
            device const float* hfwd [[buffer(6)]], device float* dx [[buffer(7)]],                \
            device float* lhs [[buffer(8)]], device float* rhs [[buffer(9)]],                      \
            device float* dhn [[buffer(10)]], device float* work [[buffer(11)]],                   \
            device float* prow [[buffer(12)]], device uint2* status [[buffer(13)]],                \
            uint lid [[thread_position_in_threadgroup]],                                           \
            uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]])

// Phase A of v1 and v3 for (row, j) at processing step s: the element-wise gate gradients
// of unit j. Writes dx (da_z, da_o, and da_r with reset_after), lhs, rhs and, with reset_after,
// the partial sums of dq (prow); returns (da_z, da_r, da_o, dq), da_r and dq 0 without
// reset_after (phase B finds da_r).
inline float4 gru_gate_gradients(constant RecurrenceParams& p, device const float* h0,
                                 device const float* mask, device const float* dy,
                                 device const float* zs, device const float* hfwd,
                                 device float* dx, device float* lhs, device float* rhs,
                                 device const float* dhn, device float* prow,
                                 uint s, uint row, uint j) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 3 * p.H, DGH = p.D * 3 * p.H;
    uint ZH = p.Z * p.H, DZH = p.D * p.Z * p.H;
    uint B = p.reset_after != 0 ? 1u : 3u;
    uint qz = p.gate0 * H, qr = p.gate1 * H, qo = p.gate2 * H;
    uint d = row / N, n = row % N;
    uint col = d * H + j;
    uint own = n * DH + col;
    uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
    uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
    float a_z = zs[zrow + qz + j], a_r = zs[zrow + qr + j], a_o = zs[zrow + qo + j];
    float z = rg_activate(p.act0, a_z);
    float r = rg_activate(p.act1, a_r);
    float o = rg_activate(p.act2, a_o);
    float hp = s == 0 ? h0[own] : hfwd[(rg_out_time(p, d, s - 1) * N + n) * DH + col];
    float m = mask[rg_mask_step(p, s) + own];
    float dh = dy[(rg_out_time(p, d, s) * N + n) * DH + col] + dhn[own];
    // Every load, and p's flags, before the first store: a store may alias any buffer (and p,
    // where metal-cuda binds it as a device pointer) for all the compiler knows.
    float q = p.reset_after != 0 ? zs[zrow + 3 * H + j] : 0.0f;
    float dq_before = p.reset_after != 0 ? prow[row * H + j] : 0.0f;
    bool after = p.reset_after != 0;
    float da_o, da_z;
    if (p.flip_z != 0) {
        da_o = dh * z * rg_derivative_at(p.act2, a_o, o);
        da_z = dh * (o - hp) * rg_derivative_at(p.act0, a_z, z);
    } else {
        da_o = dh * (1.0f - z) * rg_derivative_at(p.act2, a_o, o);
        da_z = dh * (hp - o) * rg_derivative_at(p.act0, a_z, z);
    }
    float d_r = after ? rg_derivative_at(p.act1, a_r, r) : 0.0f;
    uint rrow = (rg_x_time(p, d, s) * N + n) * p.D * B * H + d * B * H;
    float hm = hp * m;
    dx[xrow + qz + j] = da_z;
    dx[xrow + qo + j] = da_o;
    lhs[xrow + qz + j] = da_z;
    if (after) {
        float da_r = da_o * q * d_r;
        float dq = da_o * r;
        dx[xrow + qr + j] = da_r;
        lhs[xrow + qr + j] = da_r;
        lhs[xrow + qo + j] = dq;
        prow[row * H + j] = dq_before + dq;
        rhs[rrow + j] = hm;
        return float4(da_z, da_r, da_o, dq);
    }
    lhs[xrow + qo + j] = da_o;
    rhs[rrow + j] = hm;
    rhs[rrow + H + j] = hm;
    rhs[rrow + 2 * H + j] = hm * r;
    return float4(da_z, 0.0f, da_o, 0.0f);
}

// dh ⊙ keep of (row, j) at processing step s, with dh = dy + dh_next and keep = z (1 − z
// with flip_z): the part of dh_next that passes the update gate, in v1 and v3.
inline float gru_kept(constant RecurrenceParams& p, device const float* dy,
                      device const float* zs, device const float* dhn, uint s, uint row,
                      uint j) {
    uint N = p.N, H = p.H, DH = p.D * p.H, ZH = p.Z * p.H, DZH = p.D * p.Z * p.H;
    uint d = row / N, n = row % N;
    uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
    float z = rg_activate(p.act0, zs[zrow + p.gate0 * H + j]);
    float keep = p.flip_z != 0 ? 1.0f - z : z;
    float dh = dy[(rg_out_time(p, d, s) * N + n) * DH + d * H + j] + dhn[n * DH + d * H + j];
    return dh * keep;
}

instantiate_gru_backward(gru_backward, R) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 3 * p.H, DGH = p.D * 3 * p.H;
    uint ZH = p.Z * p.H, DZH = p.D * p.Z * p.H;
    uint2 rows = rg_rows(p.D * N, p.count, tpg, tgid);
    if (rows.x >= rows.y) {
        rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
        return;  // the whole threadgroup owns no row
    }
    uint elems = (rows.y - rows.x) * H;
    uint qr = p.gate1 * H, qo = p.gate2 * H;
    for (uint step = p.s_end; step > p.s_begin; --step) {
        uint s = step - 1;
        for (uint e = lid; e < elems; e += tpg) {
            gru_gate_gradients(p, h0, mask, dy, zs, hfwd, dx, lhs, rhs, dhn, prow, s,
                               rows.x + e / H, e % H);
        }
        // Phase B reads da_o of every unit of its row.
        threadgroup_barrier(mem_flags::mem_device);
        if (p.reset_after == 0) {
            for (uint e = lid; e < elems; e += tpg) {
                uint row = rows.x + e / H, j = e % H;
                uint d = row / N, n = row % N;
                uint col = d * H + j;
                uint own = n * DH + col;
                uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
                uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
                device const float* Rd = R + d * GH * H;
                float g = 0.0f;
                for (uint k = 0; k < H; ++k) {
                    g += lhs[xrow + qo + k] * Rd[(qo + k) * H + j];
                }
                float hp = s == 0 ? h0[own] : hfwd[(rg_out_time(p, d, s - 1) * N + n) * DH + col];
                float m = mask[rg_mask_step(p, s) + own];
                float da_r = g * hp * m * rg_derivative(p.act1, zs[zrow + qr + j]);
                dx[xrow + qr + j] = da_r;
                lhs[xrow + qr + j] = da_r;
                work[row * H + j] = g;
            }
        }
        // Phase C reads da_r of every unit of its row. Phase A of the next step writes another
        // time index and only its own dh_next, so no barrier is needed after phase C.
        threadgroup_barrier(mem_flags::mem_device);
        for (uint e = lid; e < elems; e += tpg) {
            uint row = rows.x + e / H, j = e % H;
            uint d = row / N, n = row % N;
            uint col = d * H + j;
            uint own = n * DH + col;
            uint zrow = (rg_out_time(p, d, s) * N + n) * DZH + d * ZH;
            uint xrow = (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
            device const float* Rd = R + d * GH * H;
            float acc = 0.0f;
            // Without reset_after the o block [qo, qo + H) enters through g ⊙ r instead: the sum
            // runs over q < skip, then q >= resume, in order, 16 loads in flight.
            uint skip = p.reset_after != 0 ? GH : qo, resume = p.reset_after != 0 ? GH : qo + H;
            #pragma unroll 16
            for (uint q = 0; q < skip; ++q) {
                acc += lhs[xrow + q] * Rd[q * H + j];
            }
            #pragma unroll 16
            for (uint q = resume; q < GH; ++q) {
                acc += lhs[xrow + q] * Rd[q * H + j];
            }
            float m = mask[rg_mask_step(p, s) + own];
            float next = gru_kept(p, dy, zs, dhn, s, row, j);
            if (p.reset_after == 0) {
                next += work[row * H + j] * rg_activate(p.act1, zs[zrow + qr + j]) * m;
            }
            dhn[own] = next + acc * m;
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// The activations of step t that gru_backward_v2_run<true>'s phase A reads, and their
// derivatives (none depends on dh_next), unit u's at pre[GRU_PRE·u]: slot k = f_k(a_k) and slot
// 3 + k = f_k'(a_k) for gate k < 3 (z, r, o), gru_gate_gradients' arithmetic. The 3H items go
// to the threads from `first` on. Unit-major, the pitch odd for no bank conflicts.
#define GRU_PRE 7
inline void gru_backward_ahead(constant RecurrenceParams& p, uint zt, device const float* zs,
                               threadgroup float* pre, uint first, uint lid, uint tpg) {
    uint H = p.H;
    for (uint e = rg_ahead_item(first, lid, tpg); e < 3 * H; e += tpg) {
        uint k = e / H, u = e % H;
        uint act = rg_act(p, k);
        float a = zs[zt + rg_gate(p, k) * H + u];
        float y = rg_activate(act, a);
        pre[GRU_PRE * u + k] = y;
        pre[GRU_PRE * u + 3 + k] = rg_derivative_at(act, a, y);
    }
}

// The v2 entry points' one-row body, where its conditions hold (rg_declines; reset_after):
// thread u < H runs unit u's phase A (gru_gate_gradients' and gru_kept's arithmetic, bitwise
// their results) and keeps its dh_next and its sum of dq in registers (dhn and prow read once
// and written once), the next step's inputs loaded a step ahead. In phase C thread lid is lane
// lid mod S of unit lid / S over Rᵀ's row j (3H long), the first two float4 of its share held
// (held whole, it would crowd the step's values out of registers).
// AHEAD (7H floats of threadgroup memory more): the 3H threads past the product's find the next
// step's activations and derivatives (gru_backward_ahead) while the product runs, so that
// phase A is a few multiplications.
// PW > 0 (rg_pairs; not AHEAD): 2S lanes own units j and j + H / 2 (rg_pair_sums), the first PW
// rounds of each row held.
template <bool AHEAD, uint PW>
inline void gru_backward_v2_run(uint threads, constant RecurrenceParams& p, device const float* Rt,
                                device const float* h0, device const float* mask,
                                device const float* dy, device const float* zs,
                                device const float* hfwd, device float* dx, device float* lhs,
                                device float* rhs, device float* dhn, device float* work,
                                device float* prow, device uint2* status,
                                threadgroup float4* staged, uint lid, uint tgid, uint tpg) {
    bool fits = p.reset_after != 0 && rg_one_pass(p, tpg, tgid) && 4 * p.H <= RG_STAGE
                && (!AHEAD || (3 * p.H <= tpg - rg_slices(p.H, tpg) * p.H
                               && (4 + GRU_PRE) * p.H <= RG_STAGE))
                && (PW == 0 || rg_pairs(p.H, rg_slices(p.H, tpg), tpg));
    if (rg_declines(fits, threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)staged;
    threadgroup float* sums = stage + 3 * p.H;
    threadgroup float* pre = stage + 4 * p.H;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H, GH = 3 * p.H;
    RgRow r = rg_row(p, row);
    const bool PAIR = PW > 0;
    uint S = rg_slices(H, tpg), L = PAIR ? 2 * S : S, U = PAIR ? H / 2 : H;
    uint lane = lid % L, j = min(lid / L, U - 1);
    bool unit = lid / L < U, idle = rg_simd_idle(0, lid, L, U), cell = lid < H;
    uint qz = p.gate0 * H, qr = p.gate1 * H, qo = p.gate2 * H;
    // The row's units of step s in dx and lhs ([T,N,D·3H]) start at x3 + s·x3s, in z_state
    // ([T,N,D·Z·H]) at z3 + s·z3s: RgRow's offsets times 3 and Z (rhs is [T,N,D·H]: RgRow's).
    uint x3 = 3 * r.x0, x3s = 3 * r.xs, z3 = p.Z * r.o0, z3s = p.Z * r.os;
    device const float* Rj = Rt + (r.d * H + j) * GH;
    const uint HW = PAIR ? PW : RG_HOLD / 2;
    float4 held[2][HW];
    if (PAIR) {
        rg_hold_pair<HW>(held, Rj, U * GH, unit ? GH : 0u, lane, L);
    } else {
        rg_hold_some<RG_HOLD / 2>(held[0], Rj, unit ? GH : 0u, lane, S);
    }
    float dh = 0.0f, pq = 0.0f, mj = 0.0f;
    float g = 0.0f, a_z = 0.0f, a_r = 0.0f, a_o = 0.0f, q = 0.0f, hp = 0.0f;
    if (cell) {
        dh = dhn[r.at + lid];
        pq = prow[row * H + lid];
        mj = mask[r.at + lid];
        if (p.s_end > p.s_begin) {
            uint s = p.s_end - 1, zt = z3 + s * z3s;
            g = dy[r.o0 + s * r.os + lid];
            if (!AHEAD) {
                a_z = zs[zt + qz + lid];
                a_r = zs[zt + qr + lid];
                a_o = zs[zt + qo + lid];
            }
            q = zs[zt + GH + lid];
            hp = s == 0 ? h0[r.at + lid] : hfwd[r.o0 + (s - 1) * r.os + lid];
        }
    }
    uint first = rg_ahead_first(S, H, tpg);
    if (AHEAD && p.s_end > p.s_begin) {
        gru_backward_ahead(p, z3 + (p.s_end - 1) * z3s, zs, pre, first, lid, tpg);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    threadgroup const float* mine = pre + GRU_PRE * min(lid, H - 1);  // unit lid's (AHEAD)
    for (uint step = p.s_end; step > p.s_begin; --step) {
        uint s = step - 1;
        float m = 0.0f, kept = 0.0f;
        if (cell) {
            m = r.ms != 0 ? mask[s * r.ms + r.at + lid] : mj;
            float z, rr, o, d_z, d_r, d_o;
            if (AHEAD) {
                z = mine[0];
                rr = mine[1];
                o = mine[2];
                d_z = mine[3];
                d_r = mine[4];
                d_o = mine[5];
            } else {
                z = rg_activate(p.act0, a_z);
                rr = rg_activate(p.act1, a_r);
                o = rg_activate(p.act2, a_o);
                d_z = rg_derivative_at(p.act0, a_z, z);
                d_r = rg_derivative_at(p.act1, a_r, rr);
                d_o = rg_derivative_at(p.act2, a_o, o);
            }
            float dht = g + dh;
            float da_o, da_z;
            if (p.flip_z != 0) {
                da_o = dht * z * d_o;
                da_z = dht * (o - hp) * d_z;
            } else {
                da_o = dht * (1.0f - z) * d_o;
                da_z = dht * (hp - o) * d_z;
            }
            float da_r = da_o * q * d_r;
            float dq = da_o * rr;
            float hm = hp * m;
            kept = dht * (p.flip_z != 0 ? 1.0f - z : z);
            pq = pq + dq;
            if (s > p.s_begin) {
                // the next step's inputs, in flight over the barrier and the product
                uint zt = z3 + (s - 1) * z3s;
                g = dy[r.o0 + (s - 1) * r.os + lid];
                if (!AHEAD) {
                    a_z = zs[zt + qz + lid];
                    a_r = zs[zt + qr + lid];
                    a_o = zs[zt + qo + lid];
                }
                q = zs[zt + GH + lid];
                hp = s == 1 ? h0[r.at + lid] : hfwd[r.o0 + (s - 2) * r.os + lid];
            }
            uint xt = x3 + s * x3s;
            dx[xt + qz + lid] = da_z;
            dx[xt + qr + lid] = da_r;
            dx[xt + qo + lid] = da_o;
            lhs[xt + qz + lid] = da_z;
            lhs[xt + qr + lid] = da_r;
            lhs[xt + qo + lid] = dq;
            rhs[r.x0 + s * r.xs + lid] = hm;
            stage[qz + lid] = da_z;
            stage[qr + lid] = da_r;
            stage[qo + lid] = dq;
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Phase C: dh_next[j] = dh ⊙ keep + m_j Σ_q lhs_q Rᵀ[j, q].
        if (PAIR && !idle) {
            rg_pair_sums<HW>(sums, held, stage, Rj, U, GH, j, lane, L, unit);
        } else if (!idle) {
            float dot = unit ? rg_row_dot_held<RG_HOLD / 2>(held[0], stage, Rj, GH, lane, S) : 0.0f;
            rg_unit_sum(sums, dot, j, lane, S, unit);
        }
        if (AHEAD && s > p.s_begin) {  // phase A has read pre (the barrier above)
            gru_backward_ahead(p, z3 + (s - 1) * z3s, zs, pre, first, lid, tpg);
        }
        // Every sum is in, the stage read before phase A writes it again, and the next step's
        // activations in pre.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (cell) {
            dh = kept + sums[lid] * m;
        }
    }
    if (cell) {
        dhn[r.at + lid] = dh;
        prow[row * H + lid] = pq;
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// ---------------------------------------------------------------------------------------------
// `name`: an entry point compiled for threadgroups of `threads` that calls
// gru_backward_v2_run with the template arguments after them.
#define instantiate_gru_backward_v2(name, threads, ...)                                            \
    [[max_total_threads_per_threadgroup(threads)]] instantiate_gru_backward(name, Rt) {            \
        threadgroup float4 staged[RG_STAGE / 4]; /* 16-byte aligned: rg_dots reads float4 */       \
        gru_backward_v2_run<__VA_ARGS__>(threads, p, Rt, h0, mask, dy, zs, hfwd, dx, lhs, rhs,     \
                                         dhn, work, prow, status, staged, lid, tgid, tpg);         \
    }

instantiate_gru_backward_v2(gru_backward_v2_ahead, RG_THREADS, true, 0)
instantiate_gru_backward_v2(gru_backward_v2_paired, RG_THREADS, false, 1)
instantiate_gru_backward_v2(gru_backward_v2_streamed, RG_THREADS, false, 0)
instantiate_gru_backward_v2(gru_backward_v2_paired_512, RG_THREADS_512, false, RG_PAIR_WHOLE_512)

[[max_total_threads_per_threadgroup(256)]]
instantiate_gru_backward(gru_backward_v3, Rt) {
    threadgroup float4 stage[RS_STAGE / 4];  // the staged chunk, k-major (rs_product)
    threadgroup float red[RS_RED];
    if (p.reset_after == 0) {
        return;  // its da_r reads da_o of every unit: no completion mark, the host reports it
    }
    if (!rs_fits(p, 1u)) {
        return;  // a unit block wider than the tile: no completion mark, the host reports it
    }
    uint2 mine = rg_rows(rs_tiles(p), p.count, tpg, tgid);
    for (uint t = mine.x; t < mine.y; ++t) {
        RsTile g = rs_backward_tile(stage, red, p, t, 3u, lhs, Rt, lid, tpg);
        for (uint e = lid; e < g.rows * g.units; e += tpg) {
            uint3 at = rs_carry(p, g, red, e, mask, dhn, true);  // row, unit, dhn's index
            if (p.s_end > p.s_begin) {
                gru_gate_gradients(p, h0, mask, dy, zs, hfwd, dx, lhs, rhs, dhn, prow, p.s_begin,
                                   at.x, at.y);
                dhn[at.z] = gru_kept(p, dy, zs, dhn, p.s_begin, at.x, at.y);
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}
