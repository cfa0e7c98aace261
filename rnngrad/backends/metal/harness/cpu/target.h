// The CPU target's half of the stand-in <metal_stdlib> (rnngrad.backends.metal.harness.cpu):
// address-space keywords, the scalar builtins the shared header calls through EMU_M, half, and
// the fixed-width integer types. Included first by ../metal_stdlib.h.
#pragma once

#include "emulator_abi.h"

#define kernel
#define device
#define constant const
#define thread
#define threadgroup
#define METAL_FUNC inline __attribute__((always_inline))
#ifndef INFINITY
#define INFINITY __builtin_inff()
#endif
#ifndef NAN
#define NAN __builtin_nanf("")
#endif

// The float function `f` (expf, sqrtf, ...): precise, and as metal::fast:: computes it. Math here
// is IEEE single precision either way: fast math is not modelled on the CPU.
#define EMU_M(f) __builtin_##f
#define EMU_M_FAST(f) __builtin_##f
#define EMU_ISNAN(x) __builtin_isnan(x)
#define EMU_ISINF(x) __builtin_isinf(x)
#define EMU_ISFINITE(x) __builtin_isfinite(x)
#define EMU_SIGNBIT(x) __builtin_signbit(x)
#define EMU_ISNORMAL(x) __builtin_isnormal(x)
#define EMU_POPCOUNT(x) __builtin_popcount(x)
#define EMU_CLZ(x) __builtin_clz(x)
#define EMU_CTZ(x) __builtin_ctz(x)
#define EMU_BIT_CAST(To, x) __builtin_bit_cast(To, x)

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
