// A stand-in for Metal's <metal_stdlib> that lets unchanged MSL compute kernels compile as
// C++17 and run on the CPU execution harness (rnngrad.backends.metal.harness.cpu).
//
// Covered: address-space keywords; scalar and vector types with MSL sizes and alignment
// (float3 is 16 bytes, packed_float3 is 12); swizzles of two and three components;
// metal::, metal::fast:: and metal::precise:: math; relational and geometric functions;
// as_type; relaxed atomics on atomic_int / atomic_uint; threadgroup_barrier,
// simdgroup_barrier and the simd_* collectives (exact: every lane waits for the others);
// simdgroup_matrix load / store / multiply / multiply_accumulate.
//
// Differences from Apple's compiler that a kernel can notice: math is IEEE single precision
// (no fast-math approximations: fast::tanh does not return NaN for large inputs here); half is
// _Float16; simd_sum adds lanes in lane order; simdgroup_matrix is emulated per lane (every
// lane holds the whole 8x8 tile), which is exact when all 32 lanes make the same call, as Metal
// requires. C++ accepts some code that Apple's compiler rejects.
#pragma once

#include "emulator_abi.h"

#define kernel
#define device
#define constant const
#define thread
#define threadgroup
#define METAL_FUNC inline __attribute__((always_inline))
#define __METAL_VERSION__ 230
#define __HAVE_SIMDGROUP_MATRIX__ 1
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif
#define MAXFLOAT 3.402823466e+38f
#define FLT_MAX 3.402823466e+38f
#define FLT_MIN 1.175494351e-38f
#define FLT_EPSILON 1.1920929e-07f
#define HALF_MAX ((half)65504.0f)
#define M_PI_F 3.14159265358979323846f
#define M_E_F 2.71828182845904523536f
#define M_LN2_F 0.69314718055994530942f
#define M_LOG2E_F 1.44269504088896340736f

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
typedef __SIZE_TYPE__ size_t;
typedef __PTRDIFF_TYPE__ ptrdiff_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;

constexpr half operator"" h(long double v) { return (half)v; }
constexpr half operator"" h(unsigned long long v) { return (half)v; }

// ----------------------------------------------------------------------------- vectors
namespace __emu {

template <class T, int N> struct vec;

template <class... A> struct count_components;
template <> struct count_components<> { static constexpr int value = 0; };
template <class T> struct components_of { static constexpr int value = 1; };
template <class T, int N> struct components_of<vec<T, N>> { static constexpr int value = N; };
template <class T, int N, int... I> struct swizzle;
template <class T, int N, int... I> struct components_of<swizzle<T, N, I...>> {
    static constexpr int value = sizeof...(I);
};
template <class H, class... A> struct count_components<H, A...> {
    static constexpr int value = components_of<H>::value + count_components<A...>::value;
};

// A swizzle: a view of components I... of the enclosing vector's storage.
template <class T, int N, int... I> struct swizzle {
    T s[N == 3 ? 4 : N];
    operator vec<T, sizeof...(I)>() const { return vec<T, sizeof...(I)>(s[I]...); }
    swizzle& operator=(const vec<T, sizeof...(I)>& v) {
        int k = 0;
        ((s[I] = v[k++]), ...);
        return *this;
    }
    swizzle& operator=(const swizzle& o) { return *this = vec<T, sizeof...(I)>(o); }
    template <int... J> swizzle& operator=(const swizzle<T, N, J...>& o) {
        return *this = vec<T, sizeof...(I)>(o);
    }
};

#define EMU_VEC_BODY(N)                                                                        \
    typedef T value_type;                                                                      \
    vec() = default;                                                                           \
    vec(const vec&) = default;                                                                 \
    vec& operator=(const vec& o) {                                                             \
        for (int i = 0; i < N; ++i) v[i] = o.v[i];                                             \
        return *this;                                                                          \
    }                                                                                          \
    vec(T s) { for (int i = 0; i < N; ++i) v[i] = s; }                                         \
    template <class U, class = decltype(T(U()))>                                               \
    vec(U s) { for (int i = 0; i < N; ++i) v[i] = T(s); }                                      \
    template <class U> explicit vec(const vec<U, N>& o) {                                      \
        for (int i = 0; i < N; ++i) v[i] = T(o[i]);                                            \
    }                                                                                          \
    template <class A0, class A1, class... A,                                                  \
              class = typename enable_if<count_components<A0, A1, A...>::value == N>::type>    \
    vec(A0 a0, A1 a1, A... a) {                                                                \
        int k = 0;                                                                             \
        put(k, a0); put(k, a1); (put(k, a), ...);                                              \
    }                                                                                          \
    template <class U> void put(int& k, const U& s) { v[k++] = T(s); }                         \
    template <class U, int M> void put(int& k, const vec<U, M>& s) {                           \
        for (int i = 0; i < M; ++i) v[k++] = T(s[i]);                                          \
    }                                                                                          \
    template <class U, int M, int... I> void put(int& k, const swizzle<U, M, I...>& s) {       \
        put(k, vec<U, sizeof...(I)>(s));                                                       \
    }                                                                                          \
    T& operator[](int i) { return v[i]; }                                                      \
    const T& operator[](int i) const { return v[i]; }

template <bool B, class T = void> struct enable_if {};
template <class T> struct enable_if<true, T> { typedef T type; };

#define EMU_SW2(A, B, IA, IB) swizzle<T, NN, IA, IB> A##B;
#define EMU_SW2_ROW(A, IA, ...)

template <class T> struct alignas(2 * sizeof(T)) vec<T, 2> {
    static constexpr int NN = 2;
    union {
        T v[2];
        struct { T x, y; };
        struct { T r, g; };
        swizzle<T, 2, 0, 1> xy;
        swizzle<T, 2, 1, 0> yx;
        swizzle<T, 2, 0, 0> xx;
        swizzle<T, 2, 1, 1> yy;
    };
    EMU_VEC_BODY(2)
};

template <class T> struct alignas(4 * sizeof(T)) vec<T, 3> {
    static constexpr int NN = 3;
    union {
        T v[4];
        struct { T x, y, z; };
        struct { T r, g, b; };
        swizzle<T, 3, 0, 1> xy;
        swizzle<T, 3, 1, 2> yz;
        swizzle<T, 3, 0, 2> xz;
        swizzle<T, 3, 1, 0> yx;
        swizzle<T, 3, 0, 1, 2> xyz;
        swizzle<T, 3, 2, 1, 0> zyx;
    };
    EMU_VEC_BODY(3)
};

template <class T> struct alignas(4 * sizeof(T)) vec<T, 4> {
    static constexpr int NN = 4;
    union {
        T v[4];
        struct { T x, y, z, w; };
        struct { T r, g, b, a; };
        swizzle<T, 4, 0, 1> xy;
        swizzle<T, 4, 2, 3> zw;
        swizzle<T, 4, 1, 2> yz;
        swizzle<T, 4, 0, 2> xz;
        swizzle<T, 4, 1, 3> yw;
        swizzle<T, 4, 0, 3> xw;
        swizzle<T, 4, 1, 0> yx;
        swizzle<T, 4, 3, 2> wz;
        swizzle<T, 4, 0, 1, 2> xyz;
        swizzle<T, 4, 1, 2, 3> yzw;
        swizzle<T, 4, 3, 2, 1, 0> wzyx;
        swizzle<T, 4, 0, 1, 2, 3> xyzw;
    };
    EMU_VEC_BODY(4)
};

// Packed vectors: no padding, alignment of the element (MSL packed_floatN).
template <class T, int N> struct packed_vec {
    T v[N];
    packed_vec() = default;
    packed_vec(const vec<T, N>& o) { for (int i = 0; i < N; ++i) v[i] = o[i]; }
    template <class... A> packed_vec(A... a) : packed_vec(vec<T, N>(a...)) {}
    operator vec<T, N>() const { vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = v[i]; return r; }
    T& operator[](int i) { return v[i]; }
    const T& operator[](int i) const { return v[i]; }
};

template <class T> struct is_vec { static constexpr bool value = false; };
template <class T, int N> struct is_vec<vec<T, N>> { static constexpr bool value = true; };

#define EMU_VEC_BINOP(OP)                                                                      \
    template <class T, int N> inline vec<T, N> operator OP(const vec<T, N>& a, const vec<T, N>& b) { \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = a[i] OP b[i]; return r;                \
    }                                                                                          \
    template <class T, int N, class S, class = typename enable_if<!is_vec<S>::value>::type>    \
    inline vec<T, N> operator OP(const vec<T, N>& a, S b) {                                    \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = a[i] OP T(b); return r;                \
    }                                                                                          \
    template <class T, int N, class S, class = typename enable_if<!is_vec<S>::value>::type>    \
    inline vec<T, N> operator OP(S a, const vec<T, N>& b) {                                    \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = T(a) OP b[i]; return r;                \
    }                                                                                          \
    template <class T, int N, class S>                                                         \
    inline vec<T, N>& operator OP##=(vec<T, N>& a, const S& b) { return a = a OP b; }
EMU_VEC_BINOP(+)
EMU_VEC_BINOP(-)
EMU_VEC_BINOP(*)
EMU_VEC_BINOP(/)
EMU_VEC_BINOP(%)
EMU_VEC_BINOP(&)
EMU_VEC_BINOP(|)
EMU_VEC_BINOP(^)
EMU_VEC_BINOP(<<)
EMU_VEC_BINOP(>>)

#define EMU_VEC_CMP(OP)                                                                        \
    template <class T, int N> inline vec<bool, N> operator OP(const vec<T, N>& a, const vec<T, N>& b) { \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r[i] = a[i] OP b[i]; return r;             \
    }                                                                                          \
    template <class T, int N, class S, class = typename enable_if<!is_vec<S>::value>::type>    \
    inline vec<bool, N> operator OP(const vec<T, N>& a, S b) {                                 \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r[i] = a[i] OP T(b); return r;             \
    }                                                                                          \
    template <class T, int N, class S, class = typename enable_if<!is_vec<S>::value>::type>    \
    inline vec<bool, N> operator OP(S a, const vec<T, N>& b) {                                 \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r[i] = T(a) OP b[i]; return r;             \
    }
EMU_VEC_CMP(==)
EMU_VEC_CMP(!=)
EMU_VEC_CMP(<)
EMU_VEC_CMP(>)
EMU_VEC_CMP(<=)
EMU_VEC_CMP(>=)
EMU_VEC_CMP(&&)
EMU_VEC_CMP(||)

template <class T, int N> inline vec<T, N> operator-(const vec<T, N>& a) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = -a[i]; return r;
}
template <class T, int N> inline vec<T, N> operator+(const vec<T, N>& a) { return a; }
template <class T, int N> inline vec<T, N> operator~(const vec<T, N>& a) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = ~a[i]; return r;
}
template <class T, int N> inline vec<bool, N> operator!(const vec<T, N>& a) {
    vec<bool, N> r; for (int i = 0; i < N; ++i) r[i] = !a[i]; return r;
}

}  // namespace __emu

#define EMU_VEC_TYPES(T, NAME)                                                                 \
    typedef __emu::vec<T, 2> NAME##2;                                                          \
    typedef __emu::vec<T, 3> NAME##3;                                                          \
    typedef __emu::vec<T, 4> NAME##4;                                                          \
    typedef __emu::packed_vec<T, 2> packed_##NAME##2;                                          \
    typedef __emu::packed_vec<T, 3> packed_##NAME##3;                                          \
    typedef __emu::packed_vec<T, 4> packed_##NAME##4;
EMU_VEC_TYPES(float, float)
EMU_VEC_TYPES(half, half)
EMU_VEC_TYPES(int, int)
EMU_VEC_TYPES(uint, uint)
EMU_VEC_TYPES(short, short)
EMU_VEC_TYPES(ushort, ushort)
EMU_VEC_TYPES(char, char)
EMU_VEC_TYPES(uchar, uchar)
EMU_VEC_TYPES(long, long)
EMU_VEC_TYPES(ulong, ulong)
EMU_VEC_TYPES(bool, bool)

static_assert(sizeof(float3) == 16 && alignof(float3) == 16, "MSL float3 is 16 bytes");
static_assert(sizeof(packed_float3) == 12 && alignof(packed_float3) == 4, "packed_float3");
static_assert(sizeof(half4) == 8 && sizeof(half) == 2, "MSL half4 is 8 bytes");

// ----------------------------------------------------------------------------- math
namespace metal {

using __emu::vec;
template <class T, int N> using vec = __emu::vec<T, N>;

#define EMU_MAP1(NAME)                                                                         \
    template <class T, int N> inline vec<T, N> NAME(const vec<T, N>& a) {                      \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = NAME(a[i]); return r;                  \
    }
#define EMU_MAP2(NAME)                                                                         \
    template <class T, int N> inline vec<T, N> NAME(const vec<T, N>& a, const vec<T, N>& b) {  \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = NAME(a[i], b[i]); return r;            \
    }                                                                                          \
    template <class T, int N> inline vec<T, N> NAME(const vec<T, N>& a, T b) {                 \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = NAME(a[i], b); return r;               \
    }
#define EMU_MAP3(NAME)                                                                         \
    template <class T, int N>                                                                  \
    inline vec<T, N> NAME(const vec<T, N>& a, const vec<T, N>& b, const vec<T, N>& c) {        \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = NAME(a[i], b[i], c[i]); return r;      \
    }                                                                                          \
    template <class T, int N> inline vec<T, N> NAME(const vec<T, N>& a, T b, T c) {            \
        vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = NAME(a[i], b, c); return r;            \
    }

#define EMU_FLOAT1(NAME, BUILTIN)                                                              \
    inline float NAME(float x) { return BUILTIN(x); }                                          \
    inline half NAME(half x) { return (half)BUILTIN((float)x); }                               \
    EMU_MAP1(NAME)
#define EMU_FLOAT2(NAME, BUILTIN)                                                              \
    inline float NAME(float x, float y) { return BUILTIN(x, y); }                              \
    inline half NAME(half x, half y) { return (half)BUILTIN((float)x, (float)y); }             \
    EMU_MAP2(NAME)

// The float functions, declared once for metal::, metal::fast:: and metal::precise::.
#define EMU_FLOAT_FUNCTIONS                                                                    \
    EMU_FLOAT1(exp, __builtin_expf)                                                            \
    EMU_FLOAT1(exp2, __builtin_exp2f)                                                          \
    EMU_FLOAT1(log, __builtin_logf)                                                            \
    EMU_FLOAT1(log2, __builtin_log2f)                                                          \
    EMU_FLOAT1(log10, __builtin_log10f)                                                        \
    EMU_FLOAT1(sqrt, __builtin_sqrtf)                                                          \
    EMU_FLOAT1(sin, __builtin_sinf)                                                            \
    EMU_FLOAT1(cos, __builtin_cosf)                                                            \
    EMU_FLOAT1(tan, __builtin_tanf)                                                            \
    EMU_FLOAT1(asin, __builtin_asinf)                                                          \
    EMU_FLOAT1(acos, __builtin_acosf)                                                          \
    EMU_FLOAT1(atan, __builtin_atanf)                                                          \
    EMU_FLOAT1(sinh, __builtin_sinhf)                                                          \
    EMU_FLOAT1(cosh, __builtin_coshf)                                                          \
    EMU_FLOAT1(tanh, __builtin_tanhf)                                                          \
    EMU_FLOAT1(asinh, __builtin_asinhf)                                                        \
    EMU_FLOAT1(acosh, __builtin_acoshf)                                                        \
    EMU_FLOAT1(atanh, __builtin_atanhf)                                                        \
    EMU_FLOAT1(floor, __builtin_floorf)                                                        \
    EMU_FLOAT1(ceil, __builtin_ceilf)                                                          \
    EMU_FLOAT1(round, __builtin_roundf)                                                        \
    EMU_FLOAT1(rint, __builtin_rintf)                                                          \
    EMU_FLOAT1(trunc, __builtin_truncf)                                                        \
    EMU_FLOAT1(fabs, __builtin_fabsf)                                                          \
    EMU_FLOAT1(rsqrt, 1.0f / __builtin_sqrtf)                                                  \
    EMU_FLOAT1(exp10, ::__emu_exp10f)                                                          \
    EMU_FLOAT1(fract, ::__emu_fractf)                                                          \
    EMU_FLOAT2(pow, __builtin_powf)                                                            \
    EMU_FLOAT2(powr, __builtin_powf)                                                           \
    EMU_FLOAT2(atan2, __builtin_atan2f)                                                        \
    EMU_FLOAT2(fmod, __builtin_fmodf)                                                          \
    EMU_FLOAT2(fmin, __builtin_fminf)                                                          \
    EMU_FLOAT2(fmax, __builtin_fmaxf)                                                          \
    EMU_FLOAT2(copysign, __builtin_copysignf)                                                  \
    EMU_FLOAT2(fdim, __builtin_fdimf)                                                          \
    EMU_FLOAT2(divide, ::__emu_dividef)                                                        \
    inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }            \
    inline half fma(half a, half b, half c) { return (half)__builtin_fmaf(a, b, c); }          \
    EMU_MAP3(fma)                                                                              \
    inline float sincos(float x, thread float& c) { c = __builtin_cosf(x); return __builtin_sinf(x); }

}  // namespace metal

inline float __emu_exp10f(float x) { return __builtin_powf(10.0f, x); }
inline float __emu_fractf(float x) {
    float f = x - __builtin_floorf(x);
    return f < 0x1.fffffep-1f ? f : 0x1.fffffep-1f;
}
inline float __emu_dividef(float x, float y) { return x / y; }

namespace metal {
EMU_FLOAT_FUNCTIONS
namespace fast { using metal::vec; EMU_FLOAT_FUNCTIONS }
namespace precise { using metal::vec; EMU_FLOAT_FUNCTIONS }

// min / max return the other operand when one is NaN, as Metal's do (fast and precise).
#define EMU_MINMAX(T)                                                                          \
    inline T min(T a, T b) { return b < a ? b : a; }                                           \
    inline T max(T a, T b) { return a < b ? b : a; }                                           \
    inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
EMU_MINMAX(int)
EMU_MINMAX(uint)
EMU_MINMAX(short)
EMU_MINMAX(ushort)
EMU_MINMAX(char)
EMU_MINMAX(uchar)
EMU_MINMAX(long)
EMU_MINMAX(ulong)
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline half min(half a, half b) { return (half)__builtin_fminf(a, b); }
inline half max(half a, half b) { return (half)__builtin_fmaxf(a, b); }
inline float clamp(float x, float lo, float hi) { return min(max(x, lo), hi); }
inline half clamp(half x, half lo, half hi) { return min(max(x, lo), hi); }
EMU_MAP2(min)
EMU_MAP2(max)
EMU_MAP3(clamp)
namespace fast { using metal::min; using metal::max; using metal::clamp; }
namespace precise { using metal::min; using metal::max; using metal::clamp; }

inline int abs(int x) { return x < 0 ? -x : x; }
inline long abs(long x) { return x < 0 ? -x : x; }
inline short abs(short x) { return x < 0 ? -x : x; }
inline char abs(char x) { return x < 0 ? -x : x; }
inline uint abs(uint x) { return x; }
inline float abs(float x) { return __builtin_fabsf(x); }
inline half abs(half x) { return (half)__builtin_fabsf(x); }
EMU_MAP1(abs)
namespace fast { using metal::abs; }
namespace precise { using metal::abs; }
template <class T> inline T absdiff(T a, T b) { return a > b ? a - b : b - a; }

template <class T> inline T saturate(T x) { return clamp(x, T(0), T(1)); }
template <class T, class U> inline T mix(T a, T b, U t) { return a + (b - a) * t; }
template <class T> inline T step(T edge, T x) { return x < edge ? T(0) : T(1); }
template <class T, int N> inline vec<T, N> step(const vec<T, N>& e, const vec<T, N>& x) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = step(e[i], x[i]); return r;
}
template <class T> inline T smoothstep(T e0, T e1, T x) {
    T t = clamp((x - e0) / (e1 - e0), T(0), T(1));
    return t * t * (T(3) - T(2) * t);
}
inline float sign(float x) { return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x == 0.0f ? 0.0f * x : 0.0f; }
inline half sign(half x) { return (half)sign((float)x); }
EMU_MAP1(sign)
inline float mad(float a, float b, float c) { return a * b + c; }
inline half mad(half a, half b, half c) { return a * b + c; }
EMU_MAP3(mad)

// Relational functions.
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isnan(half x) { return __builtin_isnan((float)x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
inline bool isinf(half x) { return __builtin_isinf((float)x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline bool isfinite(half x) { return __builtin_isfinite((float)x); }
inline bool signbit(float x) { return __builtin_signbit(x); }
inline bool isnormal(float x) { return __builtin_isnormal(x); }
#define EMU_PRED(NAME)                                                                         \
    template <class T, int N> inline vec<bool, N> NAME(const vec<T, N>& a) {                   \
        vec<bool, N> r; for (int i = 0; i < N; ++i) r[i] = NAME(a[i]); return r;               \
    }
EMU_PRED(isnan)
EMU_PRED(isinf)
EMU_PRED(isfinite)
EMU_PRED(signbit)
inline bool any(bool b) { return b; }
inline bool all(bool b) { return b; }
template <class T, int N> inline bool any(const vec<T, N>& a) {
    for (int i = 0; i < N; ++i) if (a[i]) return true;
    return false;
}
template <class T, int N> inline bool all(const vec<T, N>& a) {
    for (int i = 0; i < N; ++i) if (!a[i]) return false;
    return true;
}
// select(a, b, c): c ? b : a, per component.
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
template <class T, int N> inline vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, const vec<bool, N>& c) {
    vec<T, N> r; for (int i = 0; i < N; ++i) r[i] = c[i] ? b[i] : a[i]; return r;
}
template <class T, int N> inline vec<T, N> select(const vec<T, N>& a, const vec<T, N>& b, bool c) {
    return c ? b : a;
}

// Geometric functions.
template <class T, int N> inline T dot(const vec<T, N>& a, const vec<T, N>& b) {
    T s = a[0] * b[0];
    for (int i = 1; i < N; ++i) s += a[i] * b[i];
    return s;
}
template <class T, int N> inline T length(const vec<T, N>& a) { return sqrt(dot(a, a)); }
template <class T, int N> inline T length_squared(const vec<T, N>& a) { return dot(a, a); }
template <class T, int N> inline T distance(const vec<T, N>& a, const vec<T, N>& b) { return length(a - b); }
template <class T, int N> inline vec<T, N> normalize(const vec<T, N>& a) { return a * rsqrt(dot(a, a)); }
template <class T> inline vec<T, 3> cross(const vec<T, 3>& a, const vec<T, 3>& b) {
    return vec<T, 3>(a.y * b.z - a.z * b.y, a.z * b.x - a.x * b.z, a.x * b.y - a.y * b.x);
}
namespace fast { using metal::dot; using metal::length; using metal::normalize; using metal::distance; }
namespace precise { using metal::dot; using metal::length; using metal::normalize; using metal::distance; }

// Integer functions.
inline uint popcount(uint x) { return (uint)__builtin_popcount(x); }
inline uint clz(uint x) { return x ? (uint)__builtin_clz(x) : 32u; }
inline uint ctz(uint x) { return x ? (uint)__builtin_ctz(x) : 32u; }
inline int popcount(int x) { return __builtin_popcount((uint)x); }
inline uint mulhi(uint a, uint b) { return (uint)(((ulong)a * b) >> 32); }
inline int mulhi(int a, int b) { return (int)(((long)a * b) >> 32); }
inline uint reverse_bits(uint x) {
    uint r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
inline uint rotate(uint v, uint i) { i &= 31; return i ? (v << i) | (v >> (32 - i)) : v; }

// Bit reinterpretation.
template <class To, class From> inline To as_type(const From& x) {
    static_assert(sizeof(To) == sizeof(From), "as_type: types of different sizes");
    return __builtin_bit_cast(To, x);
}

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

// ----------------------------------------------------------------------------- synchronisation
enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags((int)a | (int)b); }

inline void __emu_threadgroup_barrier_at(int line, mem_flags = mem_flags::mem_none) { ::__emu_barrier(line, 0); }
inline void __emu_simdgroup_barrier_at(int line, mem_flags = mem_flags::mem_none) { ::__emu_simd_gather(line, 1, nullptr, 0); }

enum __emu_op {
    op_sum = 2, op_product, op_max, op_min, op_and, op_or, op_xor, op_broadcast, op_broadcast_first,
    op_shuffle, op_shuffle_up, op_shuffle_down, op_shuffle_xor, op_rotate_up, op_rotate_down,
    op_prefix_inclusive_sum, op_prefix_exclusive_sum, op_prefix_inclusive_product,
    op_prefix_exclusive_product, op_all, op_any, op_ballot, op_is_first
};

// All 32 lanes' values of a collective, in lane order.
template <class T> struct __emu_lanes {
    const char* base;
    const T& operator[](uint lane) const { return *(const T*)(base + lane * 64); }
};
template <class T> inline __emu_lanes<T> __emu_gather(int line, int op, const T& x) {
    static_assert(sizeof(T) <= 64, "simd collective on a value larger than 64 bytes");
    return __emu_lanes<T>{::__emu_simd_gather(line, op, &x, sizeof(T))};
}
inline uint __emu_lane() { return ::__emu_cur->lane; }

template <class T> inline T __emu_simd_sum(int line, T x) {
    auto g = __emu_gather(line, op_sum, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s += g[i]; return s;
}
template <class T> inline T __emu_simd_product(int line, T x) {
    auto g = __emu_gather(line, op_product, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s *= g[i]; return s;
}
template <class T> inline T __emu_simd_max(int line, T x) {
    auto g = __emu_gather(line, op_max, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s = max(s, g[i]); return s;
}
template <class T> inline T __emu_simd_min(int line, T x) {
    auto g = __emu_gather(line, op_min, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s = min(s, g[i]); return s;
}
template <class T> inline T __emu_simd_and(int line, T x) {
    auto g = __emu_gather(line, op_and, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s &= g[i]; return s;
}
template <class T> inline T __emu_simd_or(int line, T x) {
    auto g = __emu_gather(line, op_or, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s |= g[i]; return s;
}
template <class T> inline T __emu_simd_xor(int line, T x) {
    auto g = __emu_gather(line, op_xor, x); T s = g[0]; for (uint i = 1; i < 32; ++i) s ^= g[i]; return s;
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
    auto g = __emu_gather(line, op_all, x); for (uint i = 0; i < 32; ++i) if (!g[i]) return false; return true;
}
inline bool __emu_simd_any(int line, bool x) {
    auto g = __emu_gather(line, op_any, x); for (uint i = 0; i < 32; ++i) if (g[i]) return true; return false;
}
struct simd_vote {
    typedef ulong vote_t;
    vote_t v;
    explicit operator vote_t() const { return v; }
    bool all() const { return v == 0xffffffffull; }
    bool any() const { return v != 0; }
};
inline simd_vote __emu_simd_ballot(int line, bool x) {
    auto g = __emu_gather(line, op_ballot, x); ulong m = 0;
    for (uint i = 0; i < 32; ++i) if (g[i]) m |= 1ull << i;
    return simd_vote{m};
}
inline bool __emu_simd_is_first(int line) {
    auto g = __emu_gather(line, op_is_first, true); (void)g; return __emu_lane() == 0;
}

// ----------------------------------------------------------------------------- simdgroup_matrix
// Emulated per lane: each lane holds the whole tile. Exact when all 32 lanes make the same call
// with the same arguments, which Metal requires.
template <class T, int R, int C> struct simdgroup_matrix {
    T m[R][C];
    simdgroup_matrix() = default;
    explicit simdgroup_matrix(T diagonal) {
        for (int i = 0; i < R; ++i) for (int j = 0; j < C; ++j) m[i][j] = i == j ? diagonal : T(0);
    }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int R, int C> inline simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
    simdgroup_matrix<T, R, C> r;
    for (int i = 0; i < R; ++i) for (int j = 0; j < C; ++j) r.m[i][j] = v;
    return r;
}
// matrix_origin is (column, row) in the source; with transpose_matrix the source is read as
// a C x R matrix and transposed.
template <class T, int R, int C, class U>
inline void simdgroup_load(thread simdgroup_matrix<T, R, C>& d, const U* src, ulong elements_per_row = C,
                           ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
    const U* base = src + matrix_origin.y * elements_per_row + matrix_origin.x;
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j)
            d.m[i][j] = T(transpose_matrix ? base[j * elements_per_row + i] : base[i * elements_per_row + j]);
}
template <class T, int R, int C, class U>
inline void simdgroup_store(const thread simdgroup_matrix<T, R, C>& a, U* dst, ulong elements_per_row = C,
                            ulong2 matrix_origin = ulong2(0), bool transpose_matrix = false) {
    U* base = dst + matrix_origin.y * elements_per_row + matrix_origin.x;
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) {
            if (transpose_matrix) base[j * elements_per_row + i] = U(a.m[i][j]);
            else base[i * elements_per_row + j] = U(a.m[i][j]);
        }
}
template <class T, int R, int K, int C>
inline void simdgroup_multiply_accumulate(thread simdgroup_matrix<T, R, C>& d, const thread simdgroup_matrix<T, R, K>& a,
                                          const thread simdgroup_matrix<T, K, C>& b, const thread simdgroup_matrix<T, R, C>& c) {
    simdgroup_matrix<T, R, C> r;
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) {
            T s = c.m[i][j];
            for (int k = 0; k < K; ++k) s += a.m[i][k] * b.m[k][j];
            r.m[i][j] = s;
        }
    d = r;
}
template <class T, int R, int K, int C>
inline void simdgroup_multiply(thread simdgroup_matrix<T, R, C>& d, const thread simdgroup_matrix<T, R, K>& a,
                               const thread simdgroup_matrix<T, K, C>& b) {
    simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<T, R, C>(T(0)));
}

}  // namespace metal

// Scalar and vector types are visible with and without metal::, as in MSL.
namespace metal {
using ::uint; using ::ushort; using ::uchar; using ::ulong; using ::half;
using ::float2; using ::float3; using ::float4; using ::half2; using ::half3; using ::half4;
using ::int2; using ::int3; using ::int4; using ::uint2; using ::uint3; using ::uint4;
using ::packed_float2; using ::packed_float3; using ::packed_float4;
}

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

// ----------------------------------------------------------------------------- launcher support
namespace __emu {
template <class T> struct binder;
template <class T> struct binder<T*> { static T* get(void* p) { return (T*)p; } };
template <class T> struct binder<T&> { static T& get(void* p) { return *(T*)p; } };
template <class T> inline T bind(void* p) { return binder<T>::get(p); }

// A builtin argument: scalars take the value; vectors take it in .x, with 1 (sizes) or 0
// (positions) in the other components, since the grid is 1-D.
template <class T> struct builtin_of { static T get(unsigned v, bool) { return (T)v; } };
template <class T, int N> struct builtin_of<vec<T, N>> {
    static vec<T, N> get(unsigned v, bool size) {
        vec<T, N> r(T(size ? 1 : 0));
        r[0] = (T)v;
        return r;
    }
};
template <class T> inline T builtin(unsigned v, bool size) { return builtin_of<T>::get(v, size); }
template <class T> struct strip_ref { typedef T type; };
template <class T> struct strip_ref<T&> { typedef T type; };

// Threadgroup arrays declared in a kernel body are rewritten to references into the arena.
template <class T> inline T& tg_array() { return *(T*)::__emu_tg_alloc(sizeof(T), alignof(T)); }
}  // namespace __emu
