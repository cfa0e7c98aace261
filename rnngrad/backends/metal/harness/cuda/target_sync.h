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

// One lane's value of x, for any trivially copyable type (a word at a time).
template <class T> inline T __emu_shfl(const T& x, uint src) {
    constexpr int W = (sizeof(T) + 3) / 4;
    unsigned w[W] = {};
    memcpy(w, &x, sizeof(T));
    for (int i = 0; i < W; ++i) w[i] = __shfl_sync(0xffffffffu, w[i], (int)src);
    T r;
    memcpy(&r, w, sizeof(T));
    return r;
}

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
template <class T> inline T simd_shuffle_xor(T x, ushort m) { uint l = __emu_lane() ^ m; T y = __emu_shfl(x, l & 31u); return l < 32 ? y : x; }
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

}  // namespace metal
