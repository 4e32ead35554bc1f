// Host-side conversions between float and the 16-bit storage formats, for
// scratch data, the tuner's output comparison and the tests' references.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fp8.cuh"
#include "normjit/normjit.hpp"

namespace normjit::detail {

inline std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float -> bf16, round to nearest even (NaN stays NaN).
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
inline float bf16_to_float(std::uint16_t h) { return bits_f32(static_cast<std::uint32_t>(h) << 16); }

/// float -> IEEE binary16, round to nearest even, with subnormals and overflow to inf.
inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = f32_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;         // rounds to >= 65520: inf
  if (a < 0x38800000u) {                               // fp16 subnormal or zero
    const float m = bits_f32(a) * 16777216.0f;         // scale by 2^24: units of the smallest subnormal
    return sign | static_cast<std::uint16_t>(std::nearbyint(m));
  }
  std::uint32_t r = a - 0x38000000u;                   // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);                      // round to nearest even
  return sign | static_cast<std::uint16_t>(r >> 13);
}
inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return (sign ? -1.f : 1.f) * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/// Stores `v` as dtype `t` at element `i` of the raw buffer `p`.
inline void store_as(DType t, void* p, std::size_t i, float v) {
  switch (t) {
    case DType::F32: static_cast<float*>(p)[i] = v; break;
    case DType::F16: static_cast<std::uint16_t*>(p)[i] = float_to_fp16(v); break;
    case DType::BF16: static_cast<std::uint16_t*>(p)[i] = float_to_bf16(v); break;
    case DType::E4M3: static_cast<std::uint8_t*>(p)[i] = nj::fp32_to_fp8(v, nj::kE4M3); break;
    case DType::E5M2: static_cast<std::uint8_t*>(p)[i] = nj::fp32_to_fp8(v, nj::kE5M2); break;
    case DType::E8M0: {  // the nearest power of two's exponent, clamped to the code range
      const int e = v > 0 && std::isfinite(v) ? std::ilogb(v) : -127;
      static_cast<std::uint8_t*>(p)[i] = static_cast<std::uint8_t>(std::clamp(e, -127, 127) + 127);
      break;
    }
  }
}
/// Element `i` of the raw buffer `p` of dtype `t`, as float.
inline float load_as(DType t, const void* p, std::size_t i) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(p)[i];
    case DType::F16: return fp16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::BF16: return bf16_to_float(static_cast<const std::uint16_t*>(p)[i]);
    case DType::E4M3: return nj::fp8_to_fp32(static_cast<const std::uint8_t*>(p)[i], nj::kE4M3);
    case DType::E5M2: return nj::fp8_to_fp32(static_cast<const std::uint8_t*>(p)[i], nj::kE5M2);
    case DType::E8M0: {
      const int c = static_cast<const std::uint8_t*>(p)[i];
      return c == 0xff ? NAN : std::ldexp(1.f, c - 127);
    }
  }
  return 0.f;
}

/// Relative rounding step of a dtype (2^-8 for bf16, 2^-11 for fp16, 2^-24
/// for fp32, 2^-4 for E4M3, 2^-3 for E5M2, 1 for E8M0).
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::BF16: return 0x1p-8;
    case DType::F16: return 0x1p-11;
    case DType::E4M3: return 0x1p-4;
    case DType::E5M2: return 0x1p-3;
    case DType::E8M0: return 1.0;
    case DType::F32: break;
  }
  return 0x1p-24;
}

/// Deterministic fast generator (splitmix64) for scratch and test data.
class Random {
 public:
  explicit Random(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }

 private:
  std::uint64_t s_;
};

}  // namespace normjit::detail
