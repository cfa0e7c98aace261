// The CUDA target's half of the stand-in <metal_stdlib> (rnngrad.backends.metal.cuda),
// compiled by NVRTC with -default-device, so every function without an annotation is a device
// function. MSL's `device` and `constant` qualifiers cannot be macros here (CUDA's own
// __device__ and __constant__ are macros built on those words): the translator removes them from
// the kernel text instead. Included first by ../metal_stdlib.h.
#pragma once

#include <cuda_fp16.h>

#define kernel
#define thread
#define threadgroup
#define METAL_FUNC __forceinline__
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)

// metal::precise:: is CUDA's correctly rounded (or few-ulp) libm; metal::fast:: uses the
// hardware approximations where CUDA has them (__expf, __logf, tanh.approx, ...), as Apple's
// fast math does.
#define EMU_M(f) ::f
#define EMU_M_FAST(f) ::__emu_fast::f
#define EMU_ISNAN(x) ::isnan(x)
#define EMU_ISINF(x) ::isinf(x)
#define EMU_ISFINITE(x) ::isfinite(x)
#define EMU_SIGNBIT(x) ::signbit(x)
#define EMU_ISNORMAL(x) (::isfinite(x) && ::fabsf(x) >= 1.17549435e-38f)
#define EMU_POPCOUNT(x) __popc(x)
#define EMU_CLZ(x) __clz(x)
#define EMU_CTZ(x) (__ffs(x) - 1)
#define EMU_BIT_CAST(To, x) (*reinterpret_cast<const To*>(&(x)))

typedef __half half;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;

inline half operator"" h(long double v) { return __float2half((float)v); }
inline half operator"" h(unsigned long long v) { return __float2half((float)v); }

namespace __emu_fast {
inline float expf(float x) { return __expf(x); }
inline float exp2f(float x) { return ::exp2f(x); }
inline float logf(float x) { return __logf(x); }
inline float log2f(float x) { return __log2f(x); }
inline float log10f(float x) { return __log10f(x); }
inline float sqrtf(float x) { return __fsqrt_rn(x); }
inline float sinf(float x) { return __sinf(x); }
inline float cosf(float x) { return __cosf(x); }
inline float tanf(float x) { return __tanf(x); }
inline float tanhf(float x) { float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }
inline float powf(float x, float y) { return __powf(x, y); }
using ::asinf; using ::acosf; using ::atanf; using ::sinhf; using ::coshf; using ::asinhf;
using ::acoshf; using ::atanhf; using ::floorf; using ::ceilf; using ::roundf; using ::rintf;
using ::truncf; using ::fabsf; using ::atan2f; using ::fmodf; using ::fminf; using ::fmaxf;
using ::copysignf; using ::fdimf; using ::fmaf;
}  // namespace __emu_fast
