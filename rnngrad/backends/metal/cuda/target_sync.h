// The CUDA target's synchronisation for the stand-in <metal_stdlib>: a threadgroup is a CUDA
// block, a SIMD-group a warp of 32 lanes. threadgroup_barrier is __syncthreads (which orders
// shared and global memory within the block, whatever mem_flags says), simdgroup_barrier is
// __syncwarp, the simd_* collectives are warp shuffles over all 32 lanes, atomics are CUDA's
// relaxed atomics. Threadgroup arrays are __shared__ (the translator rewrites their
// declarations). Included by ../metal_stdlib.h after the types and math.
#pragma once

namespace metal {

// ----------------------------------------------------------------------------- atomics (relaxed)
enum memory_order { memory_order_relaxed = 0 };
template <class T> struct _atomic { T value; };
typedef _atomic<int> atomic_int;
typedef _atomic<uint> atomic_uint;
template <class T> using atomic = _atomic<T>;
template <class T> inline T* __emu_at(volatile _atomic<T>* a) { return (T*)&a->value; }
template <class T, class U> inline void atomic_store_explicit(volatile _atomic<T>* a, U v, memory_order) { atomicExch(__emu_at(a), (T)v); }
template <class T> inline T atomic_load_explicit(volatile _atomic<T>* a, memory_order) { return *(volatile T*)&a->value; }
template <class T, class U> inline T atomic_exchange_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicExch(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_add_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicAdd(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_sub_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicSub(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_and_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicAnd(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_or_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicOr(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_xor_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicXor(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_min_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicMin(__emu_at(a), (T)v); }
template <class T, class U> inline T atomic_fetch_max_explicit(volatile _atomic<T>* a, U v, memory_order) { return atomicMax(__emu_at(a), (T)v); }
template <class T, class U> inline bool atomic_compare_exchange_weak_explicit(volatile _atomic<T>* a, T* expected, U desired, memory_order, memory_order) {
    T old = atomicCAS(__emu_at(a), *expected, (T)desired);
    bool ok = old == *expected;
    *expected = old;
    return ok;
}

// ----------------------------------------------------------------------------- synchronisation
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) { __syncthreads(); }
inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) { __syncwarp(); }

inline uint __emu_lane() { return threadIdx.x & 31u; }

// x, of any trivially copyable type, from another lane a word at a time: lane `arg` (XOR
// false: an indexed shuffle) or this lane's index XOR `arg` (true: the warp's butterfly).
template <bool XOR, class T> inline T __emu_shfl_words(const T& x, int arg) {
    constexpr int W = (sizeof(T) + 3) / 4;
    unsigned w[W] = {};
    memcpy(w, &x, sizeof(T));
    for (int i = 0; i < W; ++i) {
        w[i] = XOR ? __shfl_xor_sync(0xffffffffu, w[i], arg) : __shfl_sync(0xffffffffu, w[i], arg);
    }
    T r;
    memcpy(&r, w, sizeof(T));
    return r;
}

// One lane's value of x.
template <class T> inline T __emu_shfl(const T& x, uint src) { return __emu_shfl_words<false>(x, (int)src); }

template <class T> inline T simd_sum(T x) { for (uint o = 16; o; o >>= 1) x = x + __emu_shfl(x, __emu_lane() ^ o); return x; }
template <class T> inline T simd_product(T x) { for (uint o = 16; o; o >>= 1) x = x * __emu_shfl(x, __emu_lane() ^ o); return x; }
template <class T> inline T simd_max(T x) { for (uint o = 16; o; o >>= 1) x = max(x, __emu_shfl(x, __emu_lane() ^ o)); return x; }
template <class T> inline T simd_min(T x) { for (uint o = 16; o; o >>= 1) x = min(x, __emu_shfl(x, __emu_lane() ^ o)); return x; }
template <class T> inline T simd_and(T x) { for (uint o = 16; o; o >>= 1) x = x & __emu_shfl(x, __emu_lane() ^ o); return x; }
template <class T> inline T simd_or(T x) { for (uint o = 16; o; o >>= 1) x = x | __emu_shfl(x, __emu_lane() ^ o); return x; }
template <class T> inline T simd_xor(T x) { for (uint o = 16; o; o >>= 1) x = x ^ __emu_shfl(x, __emu_lane() ^ o); return x; }
template <class T> inline T simd_broadcast(T x, ushort lane) { return __emu_shfl(x, lane & 31u); }
template <class T> inline T simd_broadcast_first(T x) { return __emu_shfl(x, 0u); }
template <class T> inline T simd_shuffle(T x, ushort lane) { T y = __emu_shfl(x, lane & 31u); return lane < 32 ? y : x; }
template <class T> inline T simd_shuffle_up(T x, ushort d) { uint l = __emu_lane(); T y = __emu_shfl(x, l >= d ? l - d : l); return l >= d ? y : x; }
template <class T> inline T simd_shuffle_down(T x, ushort d) { uint l = __emu_lane(); T y = __emu_shfl(x, l + d < 32 ? l + d : l); return l + d < 32 ? y : x; }
// simd_shuffle_xor is the warp's butterfly (shfl.sync.bfly): no lane index to compute, so a
// kernel's butterfly sum is one shuffle and one add a level. Past lane 31 the caller keeps its
// value, as Metal's does.
template <class T> inline T simd_shuffle_xor(T x, ushort m) { return m < 32 ? __emu_shfl_words<true>(x, (int)m) : x; }
template <class T> inline T simd_shuffle_rotate_up(T x, ushort d) { return __emu_shfl(x, (__emu_lane() + 32u - (d & 31u)) & 31u); }
template <class T> inline T simd_shuffle_rotate_down(T x, ushort d) { return __emu_shfl(x, (__emu_lane() + d) & 31u); }
template <class T> inline T simd_prefix_inclusive_sum(T x) {
    T s = __emu_shfl(x, 0u);
    for (uint i = 1; i < 32; ++i) { T v = __emu_shfl(x, i); if (i <= __emu_lane()) s = s + v; }
    return s;
}
template <class T> inline T simd_prefix_exclusive_sum(T x) {
    T s = T(0);
    for (uint i = 0; i < 32; ++i) { T v = __emu_shfl(x, i); if (i < __emu_lane()) s = s + v; }
    return s;
}
template <class T> inline T simd_prefix_inclusive_product(T x) {
    T s = __emu_shfl(x, 0u);
    for (uint i = 1; i < 32; ++i) { T v = __emu_shfl(x, i); if (i <= __emu_lane()) s = s * v; }
    return s;
}
template <class T> inline T simd_prefix_exclusive_product(T x) {
    T s = T(1);
    for (uint i = 0; i < 32; ++i) { T v = __emu_shfl(x, i); if (i < __emu_lane()) s = s * v; }
    return s;
}
inline bool simd_all(bool x) { return __all_sync(0xffffffffu, x); }
inline bool simd_any(bool x) { return __any_sync(0xffffffffu, x); }
struct simd_vote {
    typedef ulong vote_t;
    vote_t v;
    explicit operator vote_t() const { return v; }
    bool all() const { return v == 0xffffffffull; }
    bool any() const { return v != 0; }
};
inline simd_vote simd_ballot(bool x) { return simd_vote{(ulong)__ballot_sync(0xffffffffu, x)}; }
inline bool simd_is_first() { return __emu_lane() == (uint)(__ffs(__activemask()) - 1); }

// ----------------------------------------------------------------------------- simdgroup_matrix
// Distributed over the warp as on Apple GPUs: lane l holds row l/4, columns 2(l%4) and
// 2(l%4)+1 of the 8x8 tile. A product fetches its operands' rows and columns by shuffles
// (24 per lane) instead of every lane computing the whole tile.
#define EMU_TARGET_SIMDGROUP_MATRIX 1
template <class T, int R, int C> struct simdgroup_matrix {
    static_assert(R == 8 && C == 8, "simdgroup_matrix: the CUDA target supports 8x8 tiles");
    T v[2];
    simdgroup_matrix() = default;
    explicit simdgroup_matrix(T diagonal) {
        const uint r = __emu_lane() >> 2, c = (__emu_lane() & 3u) << 1;
        v[0] = r == c ? diagonal : T(0);
        v[1] = r == c + 1 ? diagonal : T(0);
    }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int R, int C> inline simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
    simdgroup_matrix<T, R, C> m;
    m.v[0] = v;
    m.v[1] = v;
    return m;
}
template <class T, int R, int C, class U>
inline void simdgroup_load(thread simdgroup_matrix<T, R, C>& d, const U* src, ulong elements_per_row = C,
                           ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
    const U* base = src + matrix_origin.y * elements_per_row + matrix_origin.x;
    const uint r = __emu_lane() >> 2, c = (__emu_lane() & 3u) << 1;
    for (uint s = 0; s < 2; ++s)
        d.v[s] = T(transpose_matrix ? base[(c + s) * elements_per_row + r] : base[r * elements_per_row + c + s]);
}
template <class T, int R, int C, class U>
inline void simdgroup_store(const thread simdgroup_matrix<T, R, C>& a, U* dst, ulong elements_per_row = C,
                            ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
    U* base = dst + matrix_origin.y * elements_per_row + matrix_origin.x;
    const uint r = __emu_lane() >> 2, c = (__emu_lane() & 3u) << 1;
    for (uint s = 0; s < 2; ++s) {
        if (transpose_matrix) base[(c + s) * elements_per_row + r] = U(a.v[s]);
        else base[r * elements_per_row + c + s] = U(a.v[s]);
    }
}
template <class T, int R, int K, int C>
inline void simdgroup_multiply_accumulate(thread simdgroup_matrix<T, R, C>& d, const thread simdgroup_matrix<T, R, K>& a,
                                          const thread simdgroup_matrix<T, K, C>& b, const thread simdgroup_matrix<T, R, C>& c) {
    const uint lane = __emu_lane(), r = lane >> 2, q = lane & 3u;
    T s0 = c.v[0], s1 = c.v[1];
    for (uint kk = 0; kk < 4; ++kk) {  // a(r, 2kk) and a(r, 2kk+1) live in lane 4r + kk
        const T a0 = __emu_shfl(a.v[0], 4u * r + kk), a1 = __emu_shfl(a.v[1], 4u * r + kk);
        // b(2kk, ·) lives in lanes 8kk + q, b(2kk+1, ·) in lanes 8kk + 4 + q: this lane's columns
        const T b00 = __emu_shfl(b.v[0], 8u * kk + q), b01 = __emu_shfl(b.v[1], 8u * kk + q);
        const T b10 = __emu_shfl(b.v[0], 8u * kk + 4u + q), b11 = __emu_shfl(b.v[1], 8u * kk + 4u + q);
        s0 = s0 + a0 * b00 + a1 * b10;
        s1 = s1 + a0 * b01 + a1 * b11;
    }
    d.v[0] = s0;
    d.v[1] = s1;
}
template <class T, int R, int K, int C>
inline void simdgroup_multiply(thread simdgroup_matrix<T, R, C>& d, const thread simdgroup_matrix<T, R, K>& a,
                               const thread simdgroup_matrix<T, K, C>& b) {
    simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<T, R, C>(T(0)));
}

}  // namespace metal
