// FP8 (OCP 8-bit floating point, v1.0) conversions: E4M3 ("fn": no
// infinities, 0x7f/0xff NaN, largest finite 448) and E5M2 (IEEE-like:
// infinities, largest finite 57344). Encoding rounds to nearest even and
// saturates to the largest finite value (infinities too); NaN stays NaN.
// Pure integer arithmetic on the fp32 bits, so it is correct on every
// architecture and compiles for the host as well (the CPU tests check it
// against a float64 reference); hermetic like common.cuh (no cuda_fp8.h).
#pragma once

#if defined(__CUDACC__)
#define NJ_FP8_FN __host__ __device__ __forceinline__
#else
#include <cstring>
#define NJ_FP8_FN inline
#endif

namespace nj {

// Bits of a format: exponent and mantissa widths, bias, the largest finite
// code (sign clear) and the NaN code (sign clear).
struct Fp8Format {
  int exp_bits, man_bits, bias;
  unsigned max_code, nan_code;
};
constexpr Fp8Format kE4M3{4, 3, 7, 0x7e, 0x7f};
constexpr Fp8Format kE5M2{5, 2, 15, 0x7b, 0x7f};

NJ_FP8_FN unsigned fp8_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  unsigned u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
NJ_FP8_FN float fp8_bits_float(unsigned u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// `v` >> `shift` rounded to nearest, ties to even (shift in [1, 31]).
NJ_FP8_FN unsigned fp8_shift_rne(unsigned v, int shift) {
  const unsigned q = v >> shift, rem = v & ((1u << shift) - 1), half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// fp32 -> FP8 code of format `F`.
NJ_FP8_FN unsigned char fp32_to_fp8(float x, const Fp8Format& F) {
  const unsigned bits = fp8_float_bits(x);
  const unsigned sign = (bits >> 24) & 0x80u;
  const unsigned mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<unsigned char>(sign | F.nan_code);  // NaN
  const int e32 = static_cast<int>(mag >> 23);  // biased fp32 exponent; 255: infinity (saturates below)
  const int e = e32 - 127;                      // unbiased
  const int emin = 1 - F.bias;                  // smallest normal exponent of the format
  unsigned code;
  if (e32 == 0) {
    code = 0;  // fp32 subnormals are far below half the smallest FP8 subnormal
  } else if (e > F.bias + 1) {
    code = F.max_code;  // well past the largest finite (and infinity): saturate
  } else if (e >= emin) {
    // Normal: round the 23-bit mantissa to man_bits; a carry bumps the exponent.
    const unsigned m = fp8_shift_rne(mag & 0x7fffffu, 23 - F.man_bits);
    code = (static_cast<unsigned>(e - emin + 1) << F.man_bits) + m;
  } else {
    // Subnormal: the significand in units of the smallest subnormal,
    // 2^(emin - man_bits); rounding up to 2^man_bits gives the smallest normal.
    const int shift = 23 - F.man_bits + (emin - e);
    const unsigned sig = (mag & 0x7fffffu) | 0x800000u;
    code = shift > 31 ? 0u : fp8_shift_rne(sig, shift);
  }
  if (code > F.max_code) code = F.max_code;
  return static_cast<unsigned char>(sign | code);
}

// FP8 code of format `F` -> fp32 (exact).
NJ_FP8_FN float fp8_to_fp32(unsigned char q, const Fp8Format& F) {
  const unsigned sign = (static_cast<unsigned>(q) & 0x80u) << 24;
  const unsigned mag = static_cast<unsigned>(q) & 0x7fu;
  const unsigned exp = mag >> F.man_bits, man = mag & ((1u << F.man_bits) - 1);
  if (F.exp_bits == 4 ? mag == 0x7fu : exp == 0x1fu) {
    // E4M3: one NaN; E5M2: infinity (mantissa 0) or NaN.
    return fp8_bits_float(sign | (F.exp_bits == 5 && man == 0 ? 0x7f800000u : 0x7fc00000u));
  }
  if (exp == 0) {
    // Subnormal: man * 2^(1 - bias - man_bits), built from the fp32 bits of
    // the power of two (exact: man < 8).
    const float unit = fp8_bits_float(static_cast<unsigned>(127 + 1 - F.bias - F.man_bits) << 23);
    return fp8_bits_float(sign | fp8_float_bits(static_cast<float>(man) * unit));
  }
  return fp8_bits_float(sign | ((exp + 127 - F.bias) << 23) | (man << (23 - F.man_bits)));
}

// Scale rules of quantized outputs (normjit.hpp, QuantScaling), here so the
// host tests check the kernels' own arithmetic against the float64 reference.
// A dequantization scale from amax: amax / fmax, at least smin (2^-126,
// kMinScale, unless the caller asks for more) so that an all-zero group has
// a finite 1 / scale (and q = 0).
NJ_FP8_FN float fp8_scale_of(float amax, float fmax, float smin) {
  const float s = amax / fmax;
  return s > smin ? s : smin;  // NaN-free: amax never holds NaN
}
// s (a positive normal) rounded up to a power of two (UE8M0 scales): y / scale stays in range.
NJ_FP8_FN float fp8_pow2_ceil(float s) {
  unsigned b = fp8_float_bits(s);
  if (b & 0x7fffffu) b = (b & 0xff800000u) + 0x800000u;
  return fp8_bits_float(b);
}
// OCP MX v1.0 shared exponent of a block: floor(log2(amax)) - emax (8 for
// E4M3, 15 for E5M2), clamped to E8M0's range [-127, 127]; all-zero and
// subnormal blocks get -127.
NJ_FP8_FN int fp8_mx_exponent(float amax, int emax) {
  const int e = amax >= 0x1p-126f ? static_cast<int>(fp8_float_bits(amax) >> 23) - 127 : -127;
  const int d = e - emax;
  return d < -127 ? -127 : d > 127 ? 127 : d;
}
// 2^e for e in [-127, 127] (2^-127 is an fp32 subnormal).
NJ_FP8_FN float fp8_exp2i(int e) {
  return e >= -126 ? fp8_bits_float(static_cast<unsigned>(e + 127) << 23) : 0x1p-127f;
}

}  // namespace nj

#if defined(__CUDACC__)
// Device storage types and conversions for the kernels. sm_89+ (Ada,
// Hopper) converts in hardware, two values per instruction; older GPUs use
// the integer conversions above, which give the same codes (.satfinite:
// saturate, NaN kept).
#include "common.cuh"

namespace nj {

struct e4m3_t { unsigned char bits; };
struct e5m2_t { unsigned char bits; };

// The largest finite value and the exponent of the largest power of two
// (emax, for MX shared exponents) of a format.
template <class T> struct Fp8Limits;
template <> struct Fp8Limits<e4m3_t> {
  static constexpr float MAX = 448.f;
  static constexpr int EMAX = 8;
};
template <> struct Fp8Limits<e5m2_t> {
  static constexpr float MAX = 57344.f;
  static constexpr int EMAX = 15;
};

__device__ __forceinline__ float to_float(e4m3_t v) {
#if __CUDA_ARCH__ >= 890
  unsigned h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(static_cast<unsigned short>(v.bits)));
  return to_float(half_t{static_cast<unsigned short>(h2 & 0xffffu)});
#else
  return fp8_to_fp32(v.bits, kE4M3);
#endif
}
__device__ __forceinline__ float to_float(e5m2_t v) {
  // E5M2 is the top byte of an fp16: widening is a shift on every GPU.
  return to_float(half_t{static_cast<unsigned short>(static_cast<unsigned>(v.bits) << 8)});
}

// Two floats to two codes packed in 16 bits (lo in the low byte).
template <class T> __device__ __forceinline__ unsigned short fp8x2(float lo, float hi);
template <> __device__ __forceinline__ unsigned short fp8x2<e4m3_t>(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  unsigned short p;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p) : "f"(hi), "f"(lo));
  return p;
#else
  return static_cast<unsigned short>(fp32_to_fp8(lo, kE4M3) | (fp32_to_fp8(hi, kE4M3) << 8));
#endif
}
template <> __device__ __forceinline__ unsigned short fp8x2<e5m2_t>(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  unsigned short p;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(p) : "f"(hi), "f"(lo));
  return p;
#else
  return static_cast<unsigned short>(fp32_to_fp8(lo, kE5M2) | (fp32_to_fp8(hi, kE5M2) << 8));
#endif
}
// Four floats to four codes in one 32-bit word (a in the low byte). The two
// conversions write the word's halves directly (ptxas merges them), where
// bytes assembled from 16-bit pairs cost about five instructions a pair.
template <class T> __device__ __forceinline__ unsigned fp8x4(float a, float b, float c, float d);
template <> __device__ __forceinline__ unsigned fp8x4<e4m3_t>(float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 890
  unsigned w;
  asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\ncvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}"
      : "=r"(w)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return w;
#else
  return __byte_perm(fp8x2<e4m3_t>(a, b), fp8x2<e4m3_t>(c, d), 0x5410);
#endif
}
template <> __device__ __forceinline__ unsigned fp8x4<e5m2_t>(float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 890
  unsigned w;
  asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\ncvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}"
      : "=r"(w)
      : "f"(a), "f"(b), "f"(c), "f"(d));
  return w;
#else
  return __byte_perm(fp8x2<e5m2_t>(a, b), fp8x2<e5m2_t>(c, d), 0x5410);
#endif
}
template <> __device__ __forceinline__ e4m3_t from_float<e4m3_t>(float f) {
  return {static_cast<unsigned char>(fp8x2<e4m3_t>(f, 0.f) & 0xffu)};
}
template <> __device__ __forceinline__ e5m2_t from_float<e5m2_t>(float f) {
  return {static_cast<unsigned char>(fp8x2<e5m2_t>(f, 0.f) & 0xffu)};
}

}  // namespace nj
#endif
