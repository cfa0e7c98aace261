// lstm_backward.metal: the recurrence of LSTMGradients (SEMANTICS.md §3.3).
//
//   dc   = dh ⊙ o ⊙ g'(c[t]) + dc_next (+ cell_gradient[t] per step)
//   da_o = dh ⊙ g(c[t]) ⊙ f_out'(a_o)     da_i = dc ⊙ z ⊙ f_in'(a_i)
//   da_f = dc ⊙ c[t−1] ⊙ f_forget'(a_f)    da_z = dc ⊙ i ⊙ f_cell'(a_z)
//   dh_next = (dA R) ⊙ m;   dc_next = dc ⊙ f + Σ_k da_k ⊙ p_k;   dp_k += Σ_n da_k ⊙ c[t−1]
//
// h[t−1] = o[t−1] ⊙ g(c[t−1]) is rebuilt from z_state and cell_output_fwd (init_state at t = 0).
// The kernel writes dA (input time) and h[t−1] ⊙ m for the dR / dW / db reductions, and the
// peephole gradient's per-row partial sums over time, prow[row, ·] (summed over the batch by
// strided_gemm afterwards: no float atomics).
//
// Kernel versions (kernels/README.md: each entry point's grid, and when the host picks it)
//   v1 lstm_backward: rows (d, n) in contiguous blocks per threadgroup, a loop down the
//      dispatch's processing steps [p.s_begin, p.s_end); phase A (the element-wise cell chain
//      of unit j: all four da, dc_next, the peephole partials) and phase B (dh_next[j] =
//      m_j Σ_q dA_q R[q,j], a dot product of length 4H) separated by one device-memory barrier
//      per step. dh_next and dc_next live in the init-state and init-cell gradient buffers;
//      only the thread owning (row, j) touches them; they and prow carry over to the next
//      dispatch. Correct for every shape and threadgroup size.
//   v2 lstm_backward_v2_<body>[_512]: one row a threadgroup of 1024 threads (512 for a _512
//      entry), all of the dispatch's steps (lstm_backward_v2_run). Thread u < H runs unit u's
//      phase A, stages dA and keeps dh_next, dc_next and the peephole partials in registers;
//      in phase B, dA R, S lanes a unit split the 4H gate rows and their sums meet in
//      threadgroup memory (two barriers a step). Rᵀ [D,H,4H] comes instead of R (the gate index
//      contiguous). Each body comes with and without a peephole (_peephole: registers for its
//      weights and partial sums). Every entry needs S · H <= threads, 5H floats of RG_STAGE and
//      the peephole it was compiled for, and declines otherwise (rg_declines).
//        lstm_backward_v2_ahead[_peephole]     the threads past the product's (where too few,
//                                              the product's after it) find the next step's
//                                              activations, an item each (lstm_backward_ahead):
//                                              6H <= threads, 16H floats of RG_STAGE (H <= 170)
//        lstm_backward_v2_streamed[_peephole]  phase A finds them itself; Rᵀ's row read at
//                                              every step: any H the pass covers
//        lstm_backward_v2_paired[_peephole]_512  2S lanes own units j and j + H/2 in
//                                              threadgroups of 512, each float4 of the stage
//                                              read once for both rows (rg_pairs: every thread
//                                              in the product, H a multiple of 4, 2S <=
//                                              RG_LANES; H = 128: 4 lanes a unit, 8 a pair),
//                                              RG_PAIR_WHOLE_512 rounds of each row held
//   v3 lstm_backward_v3: one dispatch a step, threadgroups of 256 over tiles of up to 16
//      rows of one direction × a block of units: first the carry of the step before,
//      dh_next = m ⊙ (dA R) over the 4H gate rows, dA read back from dx (v3_tiles.metal,
//      rs_product); then phase A (lstm_cell_gradients) for each (row, unit) of the tile.
//      T + 1 dispatches, the last one the carry alone.
//
// Buffers of lstm_backward (count = D·N·H, or D·N·1024: a threadgroup a row)
//   index  type                        name      layout
//   0      constant RecurrenceParams&  p         scalars
//   1      device const float*         R         [D,4H,H]
//   2      device const float*         h0        [N,D·H] (zeros when absent)
//   3      device const float*         c0        [N,D·H] (zeros when absent)
//   4      device const float*         mask      [N,D·H], or [T,N,D·H] per processing step
//   5      device const float*         peephole  [D,4H] (read when p.has_peephole)
//   6      device const float*         dy        [T,N,D·H] source_gradient, output time
//   7      device const float*         zs        [T,N,D·4H] z_state, output time
//   8      device const float*         cfwd      [T,N,D·H] cell_output_fwd, output time
//   9      device const float*         cg        [T,N,D·H] per-step cell_gradient
//                                                (read when p.cell_gradient_per_step)
//   10     device float*               dx        [T,N,D·4H] dA, input time
//   11     device float*               rhs       [T,N,D·H] h[t−1] ⊙ m, input time
//   12     device float*               dhn       [N,D·H] in: state_gradient (or zeros);
//                                                out: init_state gradient
//   13     device float*               dcn       [N,D·H] in: final cell_gradient (or zeros);
//                                                out: init_cell gradient
//   14     device float*               prow      [D·N,4H] in: zeros; out: Σ_t da ⊙ c[t−1] per row
//   15     device uint2*               status    [ceil(count/32)] completion marks (common.metal)

// Buffers of lstm_backward_v2_ahead and lstm_backward_v2_ahead_peephole
// Buffers of lstm_backward_v2_streamed and lstm_backward_v2_streamed_peephole
// Buffers of lstm_backward_v2_paired_512 and lstm_backward_v2_paired_peephole_512
// Buffers of lstm_backward_v3
// (count = v2: D·N·1024, D·N·512 for _512; v3: 256 per tile of versions.tile_blocks)
//   index  type                        name      layout
//   0      constant RecurrenceParams&  p         scalars
//   1      device const float*         Rt        [D,H,4H] R transposed: Rt[d,j,q] = R[d,q,j]
//   2      device const float*         h0        [N,D·H] (zeros when absent)
//   3      device const float*         c0        [N,D·H] (zeros when absent)
//   4      device const float*         mask      [N,D·H], or [T,N,D·H] per processing step
//   5      device const float*         peephole  [D,4H] (read when p.has_peephole)
//   6      device const float*         dy        [T,N,D·H] source_gradient, output time
//   7      device const float*         zs        [T,N,D·4H] z_state, output time
//   8      device const float*         cfwd      [T,N,D·H] cell_output_fwd, output time
//   9      device const float*         cg        [T,N,D·H] per-step cell_gradient
//                                                (read when p.cell_gradient_per_step)
//   10     device float*               dx        [T,N,D·4H] dA, input time
//   11     device float*               rhs       [T,N,D·H] h[t−1] ⊙ m, input time
//   12     device float*               dhn       [N,D·H] in: state_gradient (or zeros);
//                                                out: init_state gradient
//   13     device float*               dcn       [N,D·H] in: final cell_gradient (or zeros);
//                                                out: init_cell gradient
//   14     device float*               prow      [D·N,4H] in: zeros; out: Σ_t da ⊙ c[t−1] per row
//   15     device uint2*               status    [ceil(count/32)] completion marks (common.metal)

// An entry point of this file: `name` with the buffers of the tables above, the recurrent weight
// named W (R in v1, Rt in v2 and v3); its body follows.
#define instantiate_lstm_backward(name, W)                                                         \
    kernel void name(                                                                              \
            constant RecurrenceParams& p [[buffer(0)]], device const float* W [[buffer(1)]],       \
            device const float* h0 [[buffer(2)]], device const float* c0 [[buffer(3)]],            \
            device const float* mask [[buffer(4)]], device const float* peephole [[buffer(5)]],    \
            device const float* dy [[buffer(6)]], device const float* zs [[buffer(7)]],            \
            device const float* cfwd [[buffer(8)]], device const float* cg [[buffer(9)]],          \
            device float* dx [[buffer(10)]], device float* rhs [[buffer(11)]],                     \
            device float* dhn [[buffer(12)]], device float* dcn [[buffer(13)]],                    \
            device float* prow [[buffer(14)]], device uint2* status [[buffer(15)]],                \
            uint lid [[thread_position_in_threadgroup]],                                           \
            uint tgid [[threadgroup_position_in_grid]], uint tpg [[threads_per_threadgroup]])

// Phase A of v1 and v3 for (row, j) at processing step s: the cell chain of unit j. Writes
// da of the four gates (dx), dc_next (dcn), the peephole partials (prow) and h[t−1] ⊙ m (rhs);
// returns da in the cell's order i, f, z, o.
inline float4 lstm_cell_gradients(constant RecurrenceParams& p, device const float* h0,
                                  device const float* c0, device const float* mask,
                                  device const float* peephole, device const float* dy,
                                  device const float* zs, device const float* cfwd,
                                  device const float* cg, device float* dx, device float* rhs,
                                  device float* dhn, device float* dcn, device float* prow,
                                  uint s, uint row, uint j) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 4 * p.H, DGH = p.D * 4 * p.H;
    uint d = row / N, n = row % N;
    uint col = d * H + j;
    uint own = n * DH + col;
    uint out = (rg_out_time(p, d, s) * N + n) * DH + col;
    uint zrow = (rg_out_time(p, d, s) * N + n) * DGH + d * GH;
    uint tx = rg_x_time(p, d, s) * N + n;  // (input time, n)
    uint xrow = tx * DGH + d * GH;
    float a[4], g[4];
    for (uint k = 0; k < 4; ++k) {
        a[k] = zs[zrow + rg_gate(p, k) * H + j];
        g[k] = rg_activate(rg_act(p, k), a[k]);
    }
    float cp, hp;
    if (s == 0) {
        cp = c0[own];
        hp = h0[own];
    } else {
        uint prev = (rg_out_time(p, d, s - 1) * N + n) * DH + col;
        uint zprev = (rg_out_time(p, d, s - 1) * N + n) * DGH + d * GH;
        cp = cfwd[prev];
        hp = rg_activate(p.act3, zs[zprev + p.gate3 * H + j]) * rg_activate(p.act4, cp);
    }
    float m = mask[rg_mask_step(p, s) + own];
    float ct = cfwd[out];
    float dh = dy[out] + dhn[own];
    float gc = rg_activate(p.act4, ct);
    float dc = dh * g[3] * rg_derivative_at(p.act4, ct, gc) + dcn[own];
    if (p.cell_gradient_per_step != 0) {
        dc += cg[out];
    }
    // f'(a) from f(a), which g holds (rg_act(p, k) is p.act0 .. p.act3)
    float4 da;
    da[3] = dh * gc * rg_derivative_at(p.act3, a[3], g[3]);
    da[0] = dc * g[2] * rg_derivative_at(p.act0, a[0], g[0]);
    da[1] = dc * cp * rg_derivative_at(p.act1, a[1], g[1]);
    da[2] = dc * g[0] * rg_derivative_at(p.act2, a[2], g[2]);
    float dc_next = dc * g[1];
    // Every load, and p.has_peephole, before the first store: a store may alias any buffer (and
    // p, where metal-cuda binds it as a device pointer) for all the compiler knows.
    bool peephole_on = p.has_peephole != 0;
    uint q[4];
    float pw[4], pr[4];
    #pragma unroll
    for (uint k = 0; k < 4; ++k) {
        q[k] = rg_gate(p, k) * H + j;
        pw[k] = peephole_on ? peephole[d * GH + q[k]] : 0.0f;
        pr[k] = peephole_on ? prow[row * GH + q[k]] : 0.0f;
    }
    #pragma unroll
    for (uint k = 0; k < 4; ++k) {
        dx[xrow + q[k]] = da[k];
        if (peephole_on) {
            dc_next += da[k] * pw[k];
            prow[row * GH + q[k]] = pr[k] + da[k] * cp;
        }
    }
    dcn[own] = dc_next;
    rhs[tx * DH + col] = hp * m;
    return da;
}

instantiate_lstm_backward(lstm_backward, R) {
    uint N = p.N, H = p.H, DH = p.D * p.H, GH = 4 * p.H, DGH = p.D * 4 * p.H;
    uint2 rows = rg_rows(p.D * N, p.count, tpg, tgid);
    if (rows.x >= rows.y) {
        rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
        return;  // the whole threadgroup owns no row
    }
    uint work = (rows.y - rows.x) * H;
    for (uint step = p.s_end; step > p.s_begin; --step) {
        uint s = step - 1;
        for (uint e = lid; e < work; e += tpg) {
            lstm_cell_gradients(p, h0, c0, mask, peephole, dy, zs, cfwd, cg, dx, rhs, dhn, dcn,
                                prow, s, rows.x + e / H, e % H);
        }
        // Phase B reads every dA of its row. Phase A of the next step writes another time index
        // of dx and only its own dh_next / dc_next / partials, so one barrier per step suffices.
        threadgroup_barrier(mem_flags::mem_device);
        for (uint e = lid; e < work; e += tpg) {
            uint row = rows.x + e / H, j = e % H;
            uint d = row / N, n = row % N;
            device const float* dA = dx + (rg_x_time(p, d, s) * N + n) * DGH + d * GH;
            device const float* Rd = R + d * GH * H;
            float acc = 0.0f;
            // 16 loads of the chain in flight, more than the compiler's own unrolling keeps
            #pragma unroll 16
            for (uint q = 0; q < GH; ++q) {
                acc += dA[q] * Rd[q * H + j];
            }
            uint own = n * DH + d * H + j;
            dhn[own] = acc * mask[rg_mask_step(p, s) + own];
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// The activations of step t that lstm_backward_v2_run<true>'s phase A reads, and their
// derivatives (none depends on dh_next), unit u's at pre[LSTM_PRE·u]: slot k = f_k(a_k) and
// slot 4 + k = f_k'(a_k) for gate k < 4, slot 8 = g(c[t]), slot 9 = g'(c[t]), slot 10 = h[t−1],
// lstm_cell_gradients' arithmetic. The 6H items go to the threads from `first` on. Unit-major,
// so that phase A reads them at constant offsets from one address (an odd pitch: no bank
// conflicts).
#define LSTM_PRE 11
inline void lstm_backward_ahead(constant RecurrenceParams& p, RgRow r, RgRow z,
                                device const float* h0, device const float* c0,
                                device const float* zs, device const float* cfwd,
                                threadgroup float* pre, uint t, uint first, uint lid, uint tpg) {
    uint H = p.H;
    for (uint e = rg_ahead_item(first, lid, tpg); e < 6 * H; e += tpg) {
        uint k = e / H, u = e % H;
        if (k < 4) {
            float a = zs[z.o0 + t * z.os + rg_gate(p, k) * H + u];
            float y = rg_activate(rg_act(p, k), a);
            pre[LSTM_PRE * u + k] = y;
            pre[LSTM_PRE * u + 4 + k] = rg_derivative_at(rg_act(p, k), a, y);
        } else if (k == 4) {
            float ct = cfwd[r.o0 + t * r.os + u];
            float gc = rg_activate(p.act4, ct);
            pre[LSTM_PRE * u + 8] = gc;
            pre[LSTM_PRE * u + 9] = rg_derivative_at(p.act4, ct, gc);
        } else {
            float hp;
            if (t == 0) {
                hp = h0[r.at + u];
            } else {
                float zo = zs[z.o0 + (t - 1) * z.os + p.gate3 * H + u];
                float cp = cfwd[r.o0 + (t - 1) * r.os + u];
                hp = rg_activate(p.act3, zo) * rg_activate(p.act4, cp);
            }
            pre[LSTM_PRE * u + 10] = hp;
        }
    }
}

// The v2 entry points' one-row body, where its conditions hold (rg_declines): thread u < H runs
// unit u's phase A and keeps what crosses steps in registers (dh_next, dc_next, the peephole
// partials: dhn, dcn and prow read once and written once; c[t−1] is the next step's c[t]); in
// phase B thread lid is lane lid mod S of unit lid / S over Rᵀ's row (4H long, read at every
// step: the step's values need the registers).
// AHEAD (11H floats of threadgroup memory more; 6H <= tpg): the threads past the product's (or
// the product's, after it) find the next step's activations and derivatives
// (lstm_backward_ahead) while the product runs, so that phase A, on the step's critical path,
// is a few multiplications.
// PEEP (p.has_peephole): without a peephole, its weights and partial sums take no registers.
// PW > 0 (rg_pairs, in the _512 entries; not AHEAD): 2S lanes own units j and j + H / 2
// (rg_pair_sums), the first PW rounds of each row held (the 512-thread entries have the
// registers for them).
template <bool AHEAD, bool PEEP, uint PW>
inline void lstm_backward_v2_run(uint threads, constant RecurrenceParams& p, device const float* Rt,
                                 device const float* h0, device const float* c0,
                                 device const float* mask, device const float* peephole,
                                 device const float* dy, device const float* zs,
                                 device const float* cfwd, device const float* cg, device float* dx,
                                 device float* rhs, device float* dhn, device float* dcn,
                                 device float* prow, device uint2* status,
                                 threadgroup float4* staged, uint lid, uint tgid, uint tpg) {
    bool fits = rg_one_pass(p, tpg, tgid) && 5 * p.H <= RG_STAGE
                && (!AHEAD || (6 * p.H <= tpg && 16 * p.H <= RG_STAGE))
                && PEEP == (p.has_peephole != 0)
                && (PW == 0 || rg_pairs(p.H, rg_slices(p.H, tpg), tpg));
    if (rg_declines(fits, threads, status, lid, tgid, tpg)) {
        return;
    }
    threadgroup float* stage = (threadgroup float*)staged;
    threadgroup float* sums = stage + 4 * p.H;
    threadgroup float* pre = stage + 5 * p.H;
    uint row = rg_group_rows(p, tpg, tgid).x;
    uint H = p.H, GH = 4 * p.H;
    RgRow r = rg_row(p, row);
    RgRow z = rg_row_of(p, row, GH);  // z_state and dA: [T, N, D·4H]
    const bool PAIR = PW > 0;
    uint S = rg_slices(H, tpg), L = PAIR ? 2 * S : S, U = PAIR ? H / 2 : H;
    uint lane = lid % L, j = min(lid / L, U - 1);
    bool unit = lid / L < U, idle = rg_simd_idle(0, lid, L, U), cell = lid < H;
    device const float* Rj = Rt + (r.d * H + j) * GH;
    const uint HW = PAIR ? PW : 1;
    float4 held[2][HW];  // PAIR: the first PW rounds of each of the two rows
    if (PAIR) {
        rg_hold_pair<HW>(held, Rj, U * GH, unit ? GH : 0u, lane, L);
    }
    uint u = min(lid, H - 1);
    uint q[4] = {p.gate0 * H + u, p.gate1 * H + u, p.gate2 * H + u, p.gate3 * H + u};
    bool peep = PEEP, per_step = p.cell_gradient_per_step != 0;  // PEEP: p.has_peephole
    uint first = rg_ahead_first(S, H, tpg);
    float dh = 0.0f, dcc = 0.0f, mj = 0.0f, pw[4], pr[4], a[4];
    float ct = 0.0f, cp = 0.0f, zo = 0.0f, g = 0.0f, gcell = 0.0f;
    #pragma unroll
    for (uint k = 0; k < 4; ++k) {
        pw[k] = cell && peep ? peephole[r.d * GH + q[k]] : 0.0f;
        pr[k] = cell && peep ? prow[row * GH + q[k]] : 0.0f;
        a[k] = 0.0f;
    }
    if (cell) {
        dh = dhn[r.at + lid];
        dcc = dcn[r.at + lid];
        mj = mask[r.at + lid];
        if (p.s_end > p.s_begin) {
            uint s = p.s_end - 1;
            if (!AHEAD) {  // else lstm_backward_ahead reads them
                #pragma unroll
                for (uint k = 0; k < 4; ++k) {
                    a[k] = zs[z.o0 + s * z.os + q[k]];
                }
                ct = cfwd[r.o0 + s * r.os + lid];
                zo = s == 0 ? 0.0f : zs[z.o0 + (s - 1) * z.os + q[3]];
            }
            cp = s == 0 ? c0[r.at + lid] : cfwd[r.o0 + (s - 1) * r.os + lid];
            g = dy[r.o0 + s * r.os + lid];
            gcell = per_step ? cg[r.o0 + s * r.os + lid] : 0.0f;
        }
    }
    if (AHEAD && p.s_end > p.s_begin) {
        lstm_backward_ahead(p, r, z, h0, c0, zs, cfwd, pre, p.s_end - 1, first, lid, tpg);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    threadgroup const float* mine = pre + LSTM_PRE * min(lid, H - 1);  // unit lid's (AHEAD)
    for (uint step = p.s_end; step > p.s_begin; --step) {
        uint s = step - 1;
        float m = 0.0f;
        if (cell) {
            // lstm_cell_gradients' arithmetic, in its order
            float gk[4], dk[4], hp, gc, dg;
            if (AHEAD) {
                #pragma unroll
                for (uint k = 0; k < 4; ++k) {
                    gk[k] = mine[k];
                    dk[k] = mine[4 + k];
                }
                gc = mine[8];
                dg = mine[9];
                hp = mine[10];
            } else {
                #pragma unroll
                for (uint k = 0; k < 4; ++k) {
                    gk[k] = rg_activate(rg_act(p, k), a[k]);
                }
                hp = s == 0 ? h0[r.at + lid] : rg_activate(p.act3, zo) * rg_activate(p.act4, cp);
                gc = rg_activate(p.act4, ct);
                dg = rg_derivative_at(p.act4, ct, gc);
                #pragma unroll
                for (uint k = 0; k < 4; ++k) {
                    dk[k] = rg_derivative_at(rg_act(p, k), a[k], gk[k]);
                }
            }
            m = r.ms != 0 ? mask[s * r.ms + r.at + lid] : mj;
            float dht = g + dh;
            float dc = dht * gk[3] * dg + dcc;
            if (per_step) {
                dc += gcell;
            }
            float da[4];
            da[3] = dht * gc * dk[3];
            da[0] = dc * gk[2] * dk[0];
            da[1] = dc * cp * dk[1];
            da[2] = dc * gk[0] * dk[2];
            dcc = dc * gk[1];
            uint xin = z.x0 + s * z.xs;
            #pragma unroll
            for (uint k = 0; k < 4; ++k) {
                stage[q[k]] = da[k];
                dx[xin + q[k]] = da[k];
                if (peep) {
                    dcc += da[k] * pw[k];
                    pr[k] = pr[k] + da[k] * cp;
                }
            }
            rhs[r.x0 + s * r.xs + lid] = hp * m;
            if (s > p.s_begin) {
                // the next step's inputs, in flight over the product
                uint t = s - 1;
                if (!AHEAD) {
                    #pragma unroll
                    for (uint k = 0; k < 4; ++k) {
                        a[k] = zs[z.o0 + t * z.os + q[k]];
                    }
                    zo = t == 0 ? 0.0f : zs[z.o0 + (t - 1) * z.os + q[3]];
                }
                ct = cp;  // phase A's own activations' (dead with AHEAD)
                cp = t == 0 ? c0[r.at + lid] : cfwd[r.o0 + (t - 1) * r.os + lid];
                g = dy[r.o0 + t * r.os + lid];
                gcell = per_step ? cg[r.o0 + t * r.os + lid] : 0.0f;
            }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
        // Phase B: dh_next[j] = m_j Σ_q dA_q R[q,j].
        if (PAIR && !idle) {
            rg_pair_sums<HW>(sums, held, stage, Rj, U, GH, j, lane, L, unit);
        } else if (!idle) {
            rg_unit_sum(sums, unit ? rg_row_dot(stage, Rj, GH, lane, S) : 0.0f, j, lane, S, unit);
        }
        if (AHEAD && s > p.s_begin) {  // phase A has read pre (the barrier above)
            lstm_backward_ahead(p, r, z, h0, c0, zs, cfwd, pre, s - 1, first, lid, tpg);
        }
        // Every sum is in, the stage read before phase A writes it again, and the next step's
        // activations in pre.
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (cell) {
            dh = sums[lid] * m;
        }
    }
    if (cell) {
        dhn[r.at + lid] = dh;
        dcn[r.at + lid] = dcc;
        if (peep) {
            #pragma unroll
            for (uint k = 0; k < 4; ++k) {
                prow[row * GH + q[k]] = pr[k];
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}

// ---------------------------------------------------------------------------------------------
// `name`: an entry point compiled for threadgroups of `threads` that calls
// lstm_backward_v2_run with the template arguments after them.
#define instantiate_lstm_backward_v2(name, threads, ...)                                           \
    [[max_total_threads_per_threadgroup(threads)]] instantiate_lstm_backward(name, Rt) {           \
        threadgroup float4 staged[RG_STAGE / 4]; /* 16-byte aligned: rg_dots reads float4 */       \
        lstm_backward_v2_run<__VA_ARGS__>(threads, p, Rt, h0, c0, mask, peephole, dy, zs, cfwd,    \
                                          cg, dx, rhs, dhn, dcn, prow, status, staged, lid, tgid,  \
                                          tpg);                                                    \
    }

instantiate_lstm_backward_v2(lstm_backward_v2_ahead, RG_THREADS, true, false, 0)
instantiate_lstm_backward_v2(lstm_backward_v2_ahead_peephole, RG_THREADS, true, true, 0)
instantiate_lstm_backward_v2(lstm_backward_v2_streamed, RG_THREADS, false, false, 0)
instantiate_lstm_backward_v2(lstm_backward_v2_streamed_peephole, RG_THREADS, false, true, 0)
instantiate_lstm_backward_v2(lstm_backward_v2_paired_512, RG_THREADS_512,
                             false, false, RG_PAIR_WHOLE_512)
instantiate_lstm_backward_v2(lstm_backward_v2_paired_peephole_512, RG_THREADS_512,
                             false, true, RG_PAIR_WHOLE_512)

[[max_total_threads_per_threadgroup(256)]]
instantiate_lstm_backward(lstm_backward_v3, Rt) {
    threadgroup float4 stage[RS_STAGE / 4];  // the staged chunk, k-major (rs_product)
    threadgroup float red[RS_RED];
    if (!rs_fits(p, 1u)) {
        return;  // a unit block wider than the tile: no completion mark, the host reports it
    }
    uint2 mine = rg_rows(rs_tiles(p), p.count, tpg, tgid);
    for (uint t = mine.x; t < mine.y; ++t) {
        RsTile g = rs_backward_tile(stage, red, p, t, 4u, dx, Rt, lid, tpg);
        for (uint e = lid; e < g.rows * g.units; e += tpg) {
            uint3 at = rs_carry(p, g, red, e, mask, dhn, false);  // row, unit, dhn's index
            if (p.s_end > p.s_begin) {
                lstm_cell_gradients(p, h0, c0, mask, peephole, dy, zs, cfwd, cg, dx, rhs, dhn, dcn,
                                    prow, p.s_begin, at.x, at.y);
            }
        }
    }
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.s_end - p.s_begin);
}
