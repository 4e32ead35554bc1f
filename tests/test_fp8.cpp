// FP8 conversions of kernels_src/fp8.cuh, compiled for the host: every code
// decodes to the OCP value; encoding rounds to nearest even against a float64
// reference (at every midpoint, just either side, random values), saturates,
// keeps NaN; the header compiles with NVRTC for sm_80 and sm_90; the bounds
// the GPU tests hold quantized outputs to pass an fp32 computation and fail
// one code or one scale off.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "fp8.cuh"
#include "compile/kernel_sources.hpp"
#include "compile/nvrtc.hpp"
#include "core/reference.hpp"
#include "core/shape_spec.hpp"
#include "compile/specialization.hpp"

namespace {

struct Fmt {
  const char* name;
  nj::Fp8Format f;
  double max_finite;
};
const Fmt kFormats[] = {{"e4m3", nj::kE4M3, 448.0}, {"e5m2", nj::kE5M2, 57344.0}};

// The OCP value of a code, from the definition (float64).
double ocp_value(unsigned code, const nj::Fp8Format& f) {
  const int s = code >> 7, e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.man_bits) - 1);
  const double sign = s ? -1.0 : 1.0;
  if (f.exp_bits == 4 && (code & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  if (f.exp_bits == 5 && e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.man_bits);
  return sign * std::ldexp(1.0 + m / double(1 << f.man_bits), e - f.bias);
}

// Reference encoder in float64: the nearest finite code, ties to the even
// code, saturating beyond the largest finite value; NaN -> NaN.
unsigned ref_encode(double x, const nj::Fp8Format& f) {
  if (std::isnan(x)) return f.nan_code | (std::signbit(x) ? 0x80u : 0u);
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  const double a = std::fabs(x);
  if (a >= ocp_value(f.max_code, f)) return sign | f.max_code;  // saturate (distances to huge values tie in float64)
  unsigned best = 0;
  double best_d = INFINITY;
  for (unsigned c = 0; c <= f.max_code; ++c) {
    const double d = std::fabs(ocp_value(c, f) - a);
    if (d < best_d || (d == best_d && (c & 1u) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return sign | best;
}

}  // namespace

TEST_CASE("fp8: every code decodes to its OCP value") {
  for (const auto& F : kFormats) {
    CAPTURE(F.name);
    for (unsigned c = 0; c < 256; ++c) {
      CAPTURE(c);
      const double want = ocp_value(c, F.f);
      const float got = nj::fp8_to_fp32(static_cast<unsigned char>(c), F.f);
      if (std::isnan(want)) {
        CHECK(std::isnan(got));
      } else {
        CHECK(static_cast<double>(got) == want);
        CHECK(std::signbit(got) == bool(c & 0x80));
      }
    }
    CHECK(nj::fp8_to_fp32(static_cast<unsigned char>(F.f.max_code), F.f) == F.max_finite);
  }
}

TEST_CASE("fp8: encoding rounds to nearest even at every midpoint and saturates") {
  for (const auto& F : kFormats) {
    CAPTURE(F.name);
    std::vector<double> values;
    for (unsigned c = 0; c < F.f.max_code; ++c) {
      const double lo = ocp_value(c, F.f), hi = ocp_value(c + 1, F.f), mid = (lo + hi) / 2;
      for (double v : {lo, hi, mid, std::nextafter(mid, 0.0), std::nextafter(mid, INFINITY)}) {
        values.push_back(v);
        values.push_back(-v);
      }
    }
    for (double v : {F.max_finite, F.max_finite * 1.0625, F.max_finite * 1.2, 1e30, double(INFINITY), 1e-30, 1e-45, 0.0})
      for (double s : {1.0, -1.0}) values.push_back(s * v);
    std::mt19937_64 rng(11);
    for (int i = 0; i < 200000; ++i) {
      const double mag = std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng),
                                    std::uniform_int_distribution<int>(-24, 20)(rng));
      values.push_back(rng() & 1 ? mag : -mag);
    }
    for (double v : values) {
      const float x = static_cast<float>(v);  // the kernels encode fp32
      CAPTURE(v);
      CHECK(nj::fp32_to_fp8(x, F.f) == ref_encode(static_cast<double>(x), F.f));
    }
    // Saturation and NaN.
    CHECK(nj::fp32_to_fp8(INFINITY, F.f) == F.f.max_code);
    CHECK(nj::fp32_to_fp8(-INFINITY, F.f) == (0x80u | F.f.max_code));
    CHECK(std::isnan(nj::fp8_to_fp32(nj::fp32_to_fp8(NAN, F.f), F.f)));
    // Round trip of every finite code.
    for (unsigned c = 0; c < 256; ++c) {
      const float v = nj::fp8_to_fp32(static_cast<unsigned char>(c), F.f);
      if (!std::isnan(v) && !std::isinf(v)) CHECK(nj::fp32_to_fp8(v, F.f) == c);
    }
  }
}

TEST_CASE("fp8: the header compiles with NVRTC for sm_80 and sm_90") {
  const std::string src = R"(#include "fp8.cuh"
extern "C" __global__ void fp8_roundtrip(const float* x, unsigned char* q, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { q[i] = nj::fp32_to_fp8(x[i], nj::kE4M3); y[i] = nj::fp8_to_fp32(q[i], nj::kE5M2); }
})";
  for (const char* arch : {"sm_80", "sm_90"}) {
    CAPTURE(arch);
    const auto k = normjit::detail::compile_cubin(src, "fp8.cu", normjit::detail::kernel_sources(),
                                                  normjit::detail::nvrtc_options(), "fp8_roundtrip", arch);
    CHECK(!k.cubin.empty());
  }
}

TEST_CASE("fp8: the kernels' scale rules equal the float64 reference's formulas") {
  // The float64 reference (quantize_reference) computes scales from its
  // own formulas; the kernels use fp8.cuh's. They must agree on every amax,
  // the edges included: zero, fp32 subnormals, exact powers of two, huge.
  std::vector<float> amax = {0.f, 0x1p-149f, 0x1p-130f, 0x1p-126f, 1.f, 448.f, 57344.f, 3.5f, 0x1.fffffep127f,
                             0x1p100f, 1e-30f, 7.f * 0x1p-120f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-140, 127);
  for (int i = 0; i < 20000; ++i) amax.push_back(static_cast<float>(std::exp2(exponent(rng))));
  for (const auto& [fmax, emax] : {std::pair{448.0, 8}, std::pair{57344.0, 15}}) {
    for (float a : amax) {
      CAPTURE(a);
      const float s = nj::fp8_scale_of(a, static_cast<float>(fmax), normjit::kMinScale);
      const double ref = std::fmax(static_cast<double>(a) / fmax, 0x1p-126);
      CHECK(std::fabs(s - ref) <= 0x1p-24 * ref);
      CHECK(s >= 0x1p-126f);
      // UE8M0: the smallest power of two >= the scale.
      const float p = nj::fp8_pow2_ceil(s);
      CHECK(static_cast<double>(p) == std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(static_cast<double>(s))))));
      // MX: floor(log2(amax)) - emax, clamped; -127 for blocks below the normal range.
      const int e = nj::fp8_mx_exponent(a, emax);
      const int want = a >= 0x1p-126f ? std::clamp(static_cast<int>(std::floor(std::log2(static_cast<double>(a)))) - emax, -127, 127) : -127;
      CHECK(e == want);
      // a / 2^e never passes 2 * fmax's exponent: saturation, not overflow, handles the rest.
      if (a > 0) CHECK(static_cast<double>(a) / std::ldexp(1.0, e) < 2 * std::ldexp(1.0, emax + 1));
    }
  }
  for (int e = -127; e <= 127; ++e) {
    CAPTURE(e);
    CHECK(static_cast<double>(nj::fp8_exp2i(e)) == std::ldexp(1.0, e));
  }
}

// ---- quant_bounds: the bounds the GPU tests hold quantized outputs to --------

namespace {

using normjit::DType;
using normjit::NormDesc;
using normjit::detail::HostTensors;

// A kernel's arithmetic in fp32 on the host (one order the bounds allow):
// statistics, y, amax per group, scale, q = fp8(y * (1 / scale)).
struct Fp32Run {
  std::vector<float> rstd, mean, scale, q;
};

Fp32Run fp32_forward(const NormDesc& d, const HostTensors& in) {
  const bool ln = d.norm == normjit::NormKind::LayerNorm;
  const std::size_t M = d.M, N = d.N, G = d.quant == normjit::QuantScaling::Group ? d.quant_group : N;
  const float fmax = normjit::fp8_max(d.y_dtype);
  const auto f8 = d.y_dtype == DType::E4M3 ? nj::kE4M3 : nj::kE5M2;
  Fp32Run r;
  std::vector<float> y(N);
  for (std::size_t i = 0; i < M; ++i) {
    float s = 0, s2 = 0;
    for (std::size_t j = 0; j < N; ++j) s += static_cast<float>(in.at("x")[i * N + j]);
    const float mu = ln ? s / N : 0.f;
    for (std::size_t j = 0; j < N; ++j) {
      const float c = static_cast<float>(in.at("x")[i * N + j]) - mu;
      s2 += c * c;
    }
    const float rs = 1.f / std::sqrt(s2 / N + d.eps);
    r.rstd.push_back(rs);
    r.mean.push_back(mu);
    for (std::size_t j = 0; j < N; ++j) {
      y[j] = (static_cast<float>(in.at("x")[i * N + j]) - mu) * rs * static_cast<float>(in.at("weight")[j]);
      if (ln) y[j] += static_cast<float>(in.at("bias")[j]);
    }
    for (std::size_t g = 0; g < N / G; ++g) {
      float a = 0;
      for (std::size_t j = g * G; j < (g + 1) * G; ++j) a = std::fmax(a, std::fabs(y[j]));
      const float sc = nj::fp8_scale_of(a, fmax, normjit::kMinScale), inv = 1.f / sc;
      r.scale.push_back(sc);
      for (std::size_t j = g * G; j < (g + 1) * G; ++j) r.q.push_back(nj::fp8_to_fp32(nj::fp32_to_fp8(y[j] * inv, f8), f8));
    }
  }
  return r;
}

}  // namespace

TEST_CASE("fp8: quant_bounds accept an fp32 kernel's q and scales, and reject a code or a scale off") {
  using namespace normjit::detail;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (const char* spec : {"rms:bf16:16x1024:quant=e4m3/token", "ln:bf16:16x1024:quant=e5m2/token",
                           "rms:bf16:16x1024:quant=e4m3/group128", "ln:bf16:16x1024:quant=e5m2/group64"}) {
    CAPTURE(spec);
    const NormDesc d = parse_shape_spec(spec).desc;
    HostTensors in;
    for (int k = 0; k < 16 * 1024; ++k) in["x"].push_back(round_as(DType::BF16, u(rng)));
    for (int j = 0; j < 1024; ++j) in["weight"].push_back(round_as(DType::BF16, 1.f + u(rng) / 4));
    if (d.norm == normjit::NormKind::LayerNorm)
      for (int j = 0; j < 1024; ++j) in["bias"].push_back(round_as(DType::BF16, u(rng) / 4));
    const Fp32Run run = fp32_forward(d, in);
    const auto bounds = [&](const std::vector<float>& scale) {
      return quant_bounds(d, in, run.rstd, d.norm == normjit::NormKind::LayerNorm ? run.mean : std::vector<float>{},
                          scale, tolerance(DType::F32));
    };
    const QuantBounds qb = bounds(run.scale);
    CHECK(count_outside(run.scale, qb.scale_lo, qb.scale_hi) == 0);
    CHECK(count_codes_outside(d.y_dtype, run.q, qb, d.M, d.N, false) == 0);
    // Without the kernel's statistics: float64's, widened by their tolerance.
    const QuantBounds wide = quant_bounds(d, in, {}, {}, run.scale, tolerance(DType::F32));
    CHECK(count_outside(run.scale, wide.scale_lo, wide.scale_hi) == 0);
    CHECK(count_codes_outside(d.y_dtype, run.q, wide, d.M, d.N, false) == 0);
    // A scale 1e-5 off (about 170 fp32 units) is outside its bound.
    std::vector<float> bad_scale = run.scale;
    bad_scale[3] *= 1.00001f;
    CHECK(count_outside(bad_scale, qb.scale_lo, qb.scale_hi) == 1);
    // The largest |q| of row 0 one code nearer zero is outside its range.
    std::vector<float> bad_q = run.q;
    std::size_t k = 0;
    for (std::size_t j = 0; j < static_cast<std::size_t>(d.N); ++j)
      if (std::fabs(bad_q[j]) > std::fabs(bad_q[k])) k = j;
    const auto f8 = d.y_dtype == DType::E4M3 ? nj::kE4M3 : nj::kE5M2;
    const unsigned code = nj::fp32_to_fp8(bad_q[k], f8);
    bad_q[k] = nj::fp8_to_fp32(static_cast<unsigned char>((code & 0x7f) > 0 ? code - 1 : code + 1), f8);
    CHECK(count_codes_outside(d.y_dtype, bad_q, qb, d.M, d.N, false) == 1);
    // A NaN where a number is due, and a number where NaN is due, fail.
    bad_q = run.q;
    bad_q[5] = NAN;
    CHECK(count_codes_outside(d.y_dtype, bad_q, qb, d.M, d.N, false) == 1);
  }
}
