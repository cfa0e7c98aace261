// A stand-in for Metal's <metal_stdlib> that lets unchanged MSL compute kernels compile as
// C++17 for every target of the harness (rnngrad.backends.metal.harness): the CPU (g++) and CUDA
// (NVRTC). Each target supplies two headers found on its include path: "target.h" (address-space
// keywords, the scalar math builtins behind EMU_M / EMU_M_FAST, half, fixed-width integers) and
// "target_sync.h" (barriers, SIMD collectives, atomics, threadgroup memory).
//
// Shared here: scalar and vector types with MSL sizes and alignment (float3 is 16 bytes,
// packed_float3 is 12); swizzles of two and three components; metal::, metal::fast:: and
// metal::precise:: math (metal:: is fast:: when EMU_FAST_MATH is defined, as metalcompute compiles);
// relational and geometric functions; as_type; simdgroup_matrix load / store / multiply /
// multiply_accumulate (emulated per lane: every lane holds the whole 8x8 tile, which is exact
// when all 32 lanes make the same call, as Metal requires).
//
// Differences from Apple's compiler that a kernel can notice: math is IEEE single precision
// unless the target maps fast:: to approximations (the CPU target never does: fast::tanh does not
// return NaN for large inputs there); simd_sum adds lanes in the target's order. C++ accepts
// some code that Apple's compiler rejects.
#pragma once

#include "target.h"

#define __METAL_VERSION__ 230
#define __HAVE_SIMDGROUP_MATRIX__ 1
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
namespace metal {
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
}  // namespace metal

// MSL also names the vector types outside metal::. A target whose compiler has vector types of
// its own at global scope (CUDA's float4 ...) defines EMU_VECTORS_IN_NAMESPACE and resolves the
// names in the translated program instead.
#ifndef EMU_VECTORS_IN_NAMESPACE
#define EMU_VEC_USING(NAME)                                                                    \
    using metal::NAME##2; using metal::NAME##3; using metal::NAME##4;                           \
    using metal::packed_##NAME##2; using metal::packed_##NAME##3; using metal::packed_##NAME##4;
EMU_VEC_USING(float)
EMU_VEC_USING(half)
EMU_VEC_USING(int)
EMU_VEC_USING(uint)
EMU_VEC_USING(short)
EMU_VEC_USING(ushort)
EMU_VEC_USING(char)
EMU_VEC_USING(uchar)
EMU_VEC_USING(long)
EMU_VEC_USING(ulong)
EMU_VEC_USING(bool)
#endif


static_assert(sizeof(metal::float3) == 16 && alignof(metal::float3) == 16, "MSL float3 is 16 bytes");
static_assert(sizeof(metal::packed_float3) == 12 && alignof(metal::packed_float3) == 4, "packed_float3");
static_assert(sizeof(metal::half4) == 8 && sizeof(half) == 2, "MSL half4 is 8 bytes");

// ----------------------------------------------------------------------------- math
namespace metal {

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
    inline half NAME(half x) { return (half)(BUILTIN((float)x)); }                             \
    EMU_MAP1(NAME)
#define EMU_FLOAT2(NAME, BUILTIN)                                                              \
    inline float NAME(float x, float y) { return BUILTIN(x, y); }                              \
    inline half NAME(half x, half y) { return (half)(BUILTIN((float)x, (float)y)); }           \
    EMU_MAP2(NAME)

// The float functions, declared for metal::, metal::fast:: and metal::precise:: with M, the
// target's mapping of a libm name to its precise (EMU_M) or fast (EMU_M_FAST) implementation.
#define EMU_FLOAT_FUNCTIONS(M)                                                                   \
    EMU_FLOAT1(exp, M(expf))                                                            \
    EMU_FLOAT1(exp2, M(exp2f))                                                          \
    EMU_FLOAT1(log, M(logf))                                                            \
    EMU_FLOAT1(log2, M(log2f))                                                          \
    EMU_FLOAT1(log10, M(log10f))                                                        \
    EMU_FLOAT1(sqrt, M(sqrtf))                                                          \
    EMU_FLOAT1(sin, M(sinf))                                                            \
    EMU_FLOAT1(cos, M(cosf))                                                            \
    EMU_FLOAT1(tan, M(tanf))                                                            \
    EMU_FLOAT1(asin, M(asinf))                                                          \
    EMU_FLOAT1(acos, M(acosf))                                                          \
    EMU_FLOAT1(atan, M(atanf))                                                          \
    EMU_FLOAT1(sinh, M(sinhf))                                                          \
    EMU_FLOAT1(cosh, M(coshf))                                                          \
    EMU_FLOAT1(tanh, M(tanhf))                                                          \
    EMU_FLOAT1(asinh, M(asinhf))                                                        \
    EMU_FLOAT1(acosh, M(acoshf))                                                        \
    EMU_FLOAT1(atanh, M(atanhf))                                                        \
    EMU_FLOAT1(floor, M(floorf))                                                        \
    EMU_FLOAT1(ceil, M(ceilf))                                                          \
    EMU_FLOAT1(round, M(roundf))                                                        \
    EMU_FLOAT1(rint, M(rintf))                                                          \
    EMU_FLOAT1(trunc, M(truncf))                                                        \
    EMU_FLOAT1(fabs, M(fabsf))                                                          \
    EMU_FLOAT1(rsqrt, 1.0f / M(sqrtf))                                                  \
    EMU_FLOAT1(exp10, ::__emu_exp10f)                                                          \
    EMU_FLOAT1(fract, ::__emu_fractf)                                                          \
    EMU_FLOAT2(pow, M(powf))                                                            \
    EMU_FLOAT2(powr, M(powf))                                                           \
    EMU_FLOAT2(atan2, M(atan2f))                                                        \
    EMU_FLOAT2(fmod, M(fmodf))                                                          \
    EMU_FLOAT2(fmin, M(fminf))                                                          \
    EMU_FLOAT2(fmax, M(fmaxf))                                                          \
    EMU_FLOAT2(copysign, M(copysignf))                                                  \
    EMU_FLOAT2(fdim, M(fdimf))                                                          \
    EMU_FLOAT2(divide, ::__emu_dividef)                                                        \
    inline float fma(float a, float b, float c) { return M(fmaf)(a, b, c); }            \
    inline half fma(half a, half b, half c) { return (half)M(fmaf)(a, b, c); }          \
    EMU_MAP3(fma)                                                                              \
    inline float sincos(float x, thread float& c) { c = M(cosf)(x); return M(sinf)(x); }

}  // namespace metal

inline float __emu_exp10f(float x) { return EMU_M(powf)(10.0f, x); }
inline float __emu_fractf(float x) {
    float f = x - EMU_M(floorf)(x);
    return f < 0x1.fffffep-1f ? f : 0x1.fffffep-1f;
}
inline float __emu_dividef(float x, float y) { return x / y; }

namespace metal {
#ifdef EMU_FAST_MATH
EMU_FLOAT_FUNCTIONS(EMU_M_FAST)
#else
EMU_FLOAT_FUNCTIONS(EMU_M)
#endif
namespace fast { using metal::vec; EMU_FLOAT_FUNCTIONS(EMU_M_FAST) }
namespace precise { using metal::vec; EMU_FLOAT_FUNCTIONS(EMU_M) }

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
inline float min(float a, float b) { return EMU_M(fminf)(a, b); }
inline float max(float a, float b) { return EMU_M(fmaxf)(a, b); }
inline half min(half a, half b) { return (half)EMU_M(fminf)(a, b); }
inline half max(half a, half b) { return (half)EMU_M(fmaxf)(a, b); }
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
inline float abs(float x) { return EMU_M(fabsf)(x); }
inline half abs(half x) { return (half)EMU_M(fabsf)(x); }
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
inline bool isnan(float x) { return EMU_ISNAN(x); }
inline bool isnan(half x) { return EMU_ISNAN((float)x); }
inline bool isinf(float x) { return EMU_ISINF(x); }
inline bool isinf(half x) { return EMU_ISINF((float)x); }
inline bool isfinite(float x) { return EMU_ISFINITE(x); }
inline bool isfinite(half x) { return EMU_ISFINITE((float)x); }
inline bool signbit(float x) { return EMU_SIGNBIT(x); }
inline bool isnormal(float x) { return EMU_ISNORMAL(x); }
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
inline uint popcount(uint x) { return (uint)EMU_POPCOUNT(x); }
inline uint clz(uint x) { return x ? (uint)EMU_CLZ(x) : 32u; }
inline uint ctz(uint x) { return x ? (uint)EMU_CTZ(x) : 32u; }
inline int popcount(int x) { return EMU_POPCOUNT((uint)x); }
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
    return EMU_BIT_CAST(To, x);
}


enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4, mem_threadgroup_imageblock = 8 };
inline mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags((int)a | (int)b); }
}  // namespace metal

#include "target_sync.h"

namespace metal {
// ----------------------------------------------------------------------------- simdgroup_matrix
// Emulated per lane: each lane holds the whole tile. Exact when all 32 lanes make the same call
// with the same arguments, which Metal requires. A target whose SIMD-groups really run together
// (CUDA) defines EMU_TARGET_SIMDGROUP_MATRIX in target_sync.h and distributes the tile instead.
#ifndef EMU_TARGET_SIMDGROUP_MATRIX
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
#endif  // EMU_TARGET_SIMDGROUP_MATRIX

}  // namespace metal

// Scalar and vector types are visible with and without metal::, as in MSL.
namespace metal {
using ::uint; using ::ushort; using ::uchar; using ::ulong; using ::half;
}


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

}  // namespace __emu
