// gemm.metal: the one matrix-product kernel of rnngrad, for everything that is not sequential.
//
// Every product the ops need outside the recurrence is a strided, batched C = A·B with one
// thread per element of C (GemmParams in common.metal gives the strides):
//   input projection      x'[T·N, D·G·H] = source[T·N, I] · input_weightᵀ + bias
//   source gradient       d_source[T·N, I] = dA[T·N, D·G·H] · input_weight
//   input weight gradient dW[D·G·H, I] = dAᵀ · source                  (a reduction over T·N rows)
//   bias gradient         db[1, D·G·H] = 1ᵀ · dA                       (A is a one-float buffer of 1)
//   recurrent weight grad dR[d][G·H, H] = lhs[d]ᵀ · rhs[d]             (batched over directions;
//                         GRU without reset_after reads a different rhs block for the o gate)
//   peephole / secondary-bias gradients: 1ᵀ · per-row partial sums the recurrence wrote
// The reductions run after the recurrence as separate passes: MSL 2.3 has no float atomics.
//
// Kernel versions
//   v1 strided_gemm: one thread per element of C, a sequential loop over K summed in chunks
//      of 64 (a partial sum per chunk, then the chunk totals), no threadgroup memory. One
//      barrier, at the very end, before the completion mark (common.metal): padded threads
//      (gid >= count) skip the work but not the barrier. Correct for any shape and any
//      threadgroup size; not tiled.
//
// Buffers of strided_gemm
//   index  type                       name    layout
//   0      constant GemmParams&       p       scalars
//   1      device const float*        A       strided by p.a_batch, p.a_row, p.a_k
//   2      device const float*        B       strided by p.b_batch, p.b_k, p.b_col, p.b_block
//   3      device const float*        bias    [P] (read only when p.has_bias)
//   4      device float*              C       [batch, M, P]
//   5      device uint2*              status  [ceil(count/32)] completion marks (steps: K)

kernel void strided_gemm(constant GemmParams& p [[buffer(0)]],
                         device const float* A [[buffer(1)]],
                         device const float* B [[buffer(2)]],
                         device const float* bias [[buffer(3)]],
                         device float* C [[buffer(4)]],
                         device uint2* status [[buffer(5)]],
                         uint gid [[thread_position_in_grid]],
                         uint lid [[thread_position_in_threadgroup]],
                         uint tgid [[threadgroup_position_in_grid]],
                         uint tpg [[threads_per_threadgroup]]) {
    if (gid < p.count) {  // the grid is padded to whole threadgroups
        uint j = gid % p.P;
        uint rest = gid / p.P;
        uint i = rest % p.M;
        uint b = rest / p.M;
        device const float* a = A + b * p.a_batch + i * p.a_row;
        device const float* bb = B + b * p.b_batch + j * p.b_col + (i / p.block) * p.b_block;
        // Chunked summation keeps a T·N-row reduction accurate in float32.
        float total = 0.0f;
        float chunk = 0.0f;
        for (uint k = 0; k < p.K; ++k) {
            chunk += a[k * p.a_k] * bb[k * p.b_k];
            if ((k & 63u) == 63u) {
                total += chunk;
                chunk = 0.0f;
            }
        }
        total += chunk;
        if (p.has_bias != 0) {
            total += bias[j];
        }
        C[gid] = total;
    }
    // Every thread of the threadgroup has stored its element (or had none to store).
    threadgroup_barrier(mem_flags::mem_device);
    rg_mark(status, tgid, lid, tpg, p.K);
}
