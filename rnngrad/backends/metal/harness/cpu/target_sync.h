// The CPU target's synchronisation for the stand-in <metal_stdlib>: relaxed atomics,
// threadgroup_barrier, simdgroup_barrier and the simd_* collectives (exact: every lane of the
// fiber scheduler waits for the others), and threadgroup memory as an arena. Included by
// ../metal_stdlib.h after the types and math.
#pragma once

namespace metal {

// ----------------------------------------------------------------------------- atomics (relaxed)
enum memory_order { memory_order_relaxed = 0 };
template <class T> struct _atomic { volatile T value; };
typedef _atomic<int> atomic_int;
typedef _atomic<uint> atomic_uint;
template <class T> using atomic = _atomic<T>;
template <class T, class U> inline void atomic_store_explicit(volatile _atomic<T>* a, U v, memory_order) { __atomic_store_n(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T> inline T atomic_load_explicit(const volatile _atomic<T>* a, memory_order) { return __atomic_load_n(&a->value, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_exchange_explicit(volatile _atomic<T>* a, U v, memory_order) { return __atomic_exchange_n(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_fetch_add_explicit(volatile _atomic<T>* a, U v, memory_order) { return __atomic_fetch_add(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_fetch_sub_explicit(volatile _atomic<T>* a, U v, memory_order) { return __atomic_fetch_sub(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_fetch_and_explicit(volatile _atomic<T>* a, U v, memory_order) { return __atomic_fetch_and(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_fetch_or_explicit(volatile _atomic<T>* a, U v, memory_order) { return __atomic_fetch_or(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_fetch_xor_explicit(volatile _atomic<T>* a, U v, memory_order) { return __atomic_fetch_xor(&a->value, (T)v, __ATOMIC_RELAXED); }
template <class T, class U> inline T atomic_fetch_min_explicit(volatile _atomic<T>* a, U v, memory_order) { T o = a->value; if ((T)v < o) a->value = (T)v; return o; }
template <class T, class U> inline T atomic_fetch_max_explicit(volatile _atomic<T>* a, U v, memory_order) { T o = a->value; if ((T)v > o) a->value = (T)v; return o; }
template <class T, class U> inline bool atomic_compare_exchange_weak_explicit(volatile _atomic<T>* a, T* expected, U desired, memory_order, memory_order) {
    return __atomic_compare_exchange_n(&a->value, expected, (T)desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}



inline void __emu_threadgroup_barrier_at(int line, mem_flags = mem_flags::mem_none) { ::__emu_barrier(line, 0); }
inline void __emu_simdgroup_barrier_at(int line, mem_flags = mem_flags::mem_none) { ::__emu_simd_gather(line, 1, nullptr, 0); }

enum __emu_op {
    op_sum = 2, op_product, op_max, op_min, op_and, op_or, op_xor, op_broadcast, op_broadcast_first,
    op_shuffle, op_shuffle_up, op_shuffle_down, op_shuffle_xor, op_rotate_up, op_rotate_down,
    op_prefix_inclusive_sum, op_prefix_exclusive_sum, op_prefix_inclusive_product,
    op_prefix_exclusive_product, op_all, op_any, op_ballot, op_is_first
};

// Every lane's value of a collective, in lane order: the SIMD-group's lanes (__emu_width(), 32
// but in the short last SIMD-group of a threadgroup whose size is not a multiple of 32), then
// NaN bytes for the lanes it lacks (what a collective that reads one returns: Metal leaves it
// undefined).
template <class T> struct __emu_lanes {
    const char* base;
    const T& operator[](uint lane) const { return *(const T*)(base + lane * 64); }
};
template <class T> inline __emu_lanes<T> __emu_gather(int line, int op, const T& x) {
    static_assert(sizeof(T) <= 64, "simd collective on a value larger than 64 bytes");
    return __emu_lanes<T>{::__emu_simd_gather(line, op, &x, sizeof(T))};
}
inline uint __emu_lane() { return ::__emu_cur->lane; }
inline uint __emu_width() { return ::__emu_cur->sg_n; }

template <class T> inline T __emu_simd_sum(int line, T x) {
    auto g = __emu_gather(line, op_sum, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s += g[i]; return s;
}
template <class T> inline T __emu_simd_product(int line, T x) {
    auto g = __emu_gather(line, op_product, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s *= g[i]; return s;
}
template <class T> inline T __emu_simd_max(int line, T x) {
    auto g = __emu_gather(line, op_max, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s = max(s, g[i]); return s;
}
template <class T> inline T __emu_simd_min(int line, T x) {
    auto g = __emu_gather(line, op_min, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s = min(s, g[i]); return s;
}
template <class T> inline T __emu_simd_and(int line, T x) {
    auto g = __emu_gather(line, op_and, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s &= g[i]; return s;
}
template <class T> inline T __emu_simd_or(int line, T x) {
    auto g = __emu_gather(line, op_or, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s |= g[i]; return s;
}
template <class T> inline T __emu_simd_xor(int line, T x) {
    auto g = __emu_gather(line, op_xor, x); T s = g[0]; for (uint i = 1; i < __emu_width(); ++i) s ^= g[i]; return s;
}
template <class T> inline T __emu_simd_broadcast(int line, T x, ushort lane) {
    auto g = __emu_gather(line, op_broadcast, x); return g[lane & 31];
}
template <class T> inline T __emu_simd_broadcast_first(int line, T x) {
    auto g = __emu_gather(line, op_broadcast_first, x); return g[0];
}
template <class T> inline T __emu_simd_shuffle(int line, T x, ushort lane) {
    auto g = __emu_gather(line, op_shuffle, x); return lane < 32 ? g[lane] : x;
}
template <class T> inline T __emu_simd_shuffle_up(int line, T x, ushort d) {
    auto g = __emu_gather(line, op_shuffle_up, x); uint l = __emu_lane(); return l >= d ? g[l - d] : x;
}
template <class T> inline T __emu_simd_shuffle_down(int line, T x, ushort d) {
    auto g = __emu_gather(line, op_shuffle_down, x); uint l = __emu_lane(); return l + d < 32 ? g[l + d] : x;
}
template <class T> inline T __emu_simd_shuffle_xor(int line, T x, ushort m) {
    auto g = __emu_gather(line, op_shuffle_xor, x); uint l = __emu_lane() ^ m; return l < 32 ? g[l] : x;
}
template <class T> inline T __emu_simd_shuffle_rotate_up(int line, T x, ushort d) {
    auto g = __emu_gather(line, op_rotate_up, x); return g[(__emu_lane() + 32 - (d & 31)) & 31];
}
template <class T> inline T __emu_simd_shuffle_rotate_down(int line, T x, ushort d) {
    auto g = __emu_gather(line, op_rotate_down, x); return g[(__emu_lane() + d) & 31];
}
template <class T> inline T __emu_simd_prefix_inclusive_sum(int line, T x) {
    auto g = __emu_gather(line, op_prefix_inclusive_sum, x); T s = g[0];
    for (uint i = 1; i <= __emu_lane(); ++i) s += g[i];
    return s;
}
template <class T> inline T __emu_simd_prefix_exclusive_sum(int line, T x) {
    auto g = __emu_gather(line, op_prefix_exclusive_sum, x); T s = T(0);
    for (uint i = 0; i < __emu_lane(); ++i) s += g[i];
    return s;
}
template <class T> inline T __emu_simd_prefix_inclusive_product(int line, T x) {
    auto g = __emu_gather(line, op_prefix_inclusive_product, x); T s = g[0];
    for (uint i = 1; i <= __emu_lane(); ++i) s *= g[i];
    return s;
}
template <class T> inline T __emu_simd_prefix_exclusive_product(int line, T x) {
    auto g = __emu_gather(line, op_prefix_exclusive_product, x); T s = T(1);
    for (uint i = 0; i < __emu_lane(); ++i) s *= g[i];
    return s;
}
inline bool __emu_simd_all(int line, bool x) {
    auto g = __emu_gather(line, op_all, x); for (uint i = 0; i < __emu_width(); ++i) if (!g[i]) return false; return true;
}
inline bool __emu_simd_any(int line, bool x) {
    auto g = __emu_gather(line, op_any, x); for (uint i = 0; i < __emu_width(); ++i) if (g[i]) return true; return false;
}
// A ballot's bits: 0 for the lanes a short SIMD-group lacks; all() asks of its own lanes.
struct simd_vote {
    typedef ulong vote_t;
    vote_t v;
    vote_t lanes = 0xffffffffull;
    explicit operator vote_t() const { return v; }
    bool all() const { return v == lanes; }
    bool any() const { return v != 0; }
};
inline simd_vote __emu_simd_ballot(int line, bool x) {
    auto g = __emu_gather(line, op_ballot, x); ulong m = 0;
    for (uint i = 0; i < __emu_width(); ++i) if (g[i]) m |= 1ull << i;
    return simd_vote{m, __emu_width() == 32 ? 0xffffffffull : (1ull << __emu_width()) - 1};
}
inline bool __emu_simd_is_first(int line) {
    auto g = __emu_gather(line, op_is_first, true); (void)g; return __emu_lane() == 0;
}

}  // namespace metal

// Calls that synchronise carry their source line, for error messages.
#define threadgroup_barrier(...) __emu_threadgroup_barrier_at(__LINE__, __VA_ARGS__)
#define simdgroup_barrier(...) __emu_simdgroup_barrier_at(__LINE__, __VA_ARGS__)
#define simd_sum(...) __emu_simd_sum(__LINE__, __VA_ARGS__)
#define simd_product(...) __emu_simd_product(__LINE__, __VA_ARGS__)
#define simd_max(...) __emu_simd_max(__LINE__, __VA_ARGS__)
#define simd_min(...) __emu_simd_min(__LINE__, __VA_ARGS__)
#define simd_and(...) __emu_simd_and(__LINE__, __VA_ARGS__)
#define simd_or(...) __emu_simd_or(__LINE__, __VA_ARGS__)
#define simd_xor(...) __emu_simd_xor(__LINE__, __VA_ARGS__)
#define simd_broadcast(...) __emu_simd_broadcast(__LINE__, __VA_ARGS__)
#define simd_broadcast_first(...) __emu_simd_broadcast_first(__LINE__, __VA_ARGS__)
#define simd_shuffle(...) __emu_simd_shuffle(__LINE__, __VA_ARGS__)
#define simd_shuffle_up(...) __emu_simd_shuffle_up(__LINE__, __VA_ARGS__)
#define simd_shuffle_down(...) __emu_simd_shuffle_down(__LINE__, __VA_ARGS__)
#define simd_shuffle_xor(...) __emu_simd_shuffle_xor(__LINE__, __VA_ARGS__)
#define simd_shuffle_rotate_up(...) __emu_simd_shuffle_rotate_up(__LINE__, __VA_ARGS__)
#define simd_shuffle_rotate_down(...) __emu_simd_shuffle_rotate_down(__LINE__, __VA_ARGS__)
#define simd_prefix_inclusive_sum(...) __emu_simd_prefix_inclusive_sum(__LINE__, __VA_ARGS__)
#define simd_prefix_exclusive_sum(...) __emu_simd_prefix_exclusive_sum(__LINE__, __VA_ARGS__)
#define simd_prefix_inclusive_product(...) __emu_simd_prefix_inclusive_product(__LINE__, __VA_ARGS__)
#define simd_prefix_exclusive_product(...) __emu_simd_prefix_exclusive_product(__LINE__, __VA_ARGS__)
#define simd_all(...) __emu_simd_all(__LINE__, __VA_ARGS__)
#define simd_any(...) __emu_simd_any(__LINE__, __VA_ARGS__)
#define simd_ballot(...) __emu_simd_ballot(__LINE__, __VA_ARGS__)
#define simd_is_first() __emu_simd_is_first(__LINE__)

namespace __emu {
// Threadgroup arrays declared in a kernel body are rewritten to references into the arena.
template <class T> inline T& tg_array() { return *(T*)::__emu_tg_alloc(sizeof(T), alignof(T)); }
}  // namespace __emu
