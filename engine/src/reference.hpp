// float64 CPU references of the kernels, for the tests, the benchmark's
// check column and anyone validating a tuned kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "host_dtype.hpp"

namespace normjit::detail {

/// Tensors by name (op_tensors' names), each its rows one after another
/// (rows x cols, no gaps), as float64.
using HostTensors = std::map<std::string, std::vector<double>>;

/// v rounded to dtype t (how model code that computes in t sees it).
inline double round_as(DType t, double v) {
  unsigned char b[4];
  store_as(t, b, 0, static_cast<float>(v));
  return load_as(t, b, 0);
}

/// Quantizes out["y"] (the float64 y) as `d.quant` says (QuantScaling):
/// y becomes the FP8 values q, with y_scale (and amax, y_hp, y_t) beside it.
/// amax ignores NaN, as the kernels do.
inline void quantize_reference(const NormDesc& d, const HostTensors& in, HostTensors& out) {
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  std::vector<double>& y = out["y"];
  const double fmax = fp8_max(d.y_dtype), min_scale = static_cast<double>(kMinScale);
  auto amax_of = [&](std::size_t i, std::size_t j0, std::size_t n) {
    double a = 0;
    for (std::size_t j = j0; j < j0 + n; ++j) a = std::fmax(a, std::fabs(y[i * N + j]));
    return a;
  };
  // Every element's scale: one per tensor, row or group.
  std::vector<double> scale_of(M * N);
  auto& sc = out["y_scale"];
  switch (d.quant) {
    case QuantScaling::None: return;
    case QuantScaling::TensorStatic:
    case QuantScaling::Tensor: {
      double s = in.count("y_scale") ? in.at("y_scale")[0] : 0.0;
      if (d.quant == QuantScaling::Tensor) {
        double a = 0;
        for (std::size_t i = 0; i < M; ++i) a = std::fmax(a, amax_of(i, 0, N));
        out["amax"] = {a};
        s = std::fmax(a / fmax, min_scale);
        sc = {s};
      } else {
        out.erase("y_scale");  // an input
      }
      std::fill(scale_of.begin(), scale_of.end(), s);
      break;
    }
    case QuantScaling::Token:
      for (std::size_t i = 0; i < M; ++i) {
        double s = std::fmax(amax_of(i, 0, N) / fmax, min_scale);
        if (d.scale_ub > 0) s = std::fmin(s, static_cast<double>(d.scale_ub));
        sc.push_back(s);
        std::fill(scale_of.begin() + i * N, scale_of.begin() + (i + 1) * N, s);
      }
      break;
    case QuantScaling::Group:
    case QuantScaling::MX: {
      const bool mx = d.quant == QuantScaling::MX;
      const std::size_t G = mx ? 32 : static_cast<std::size_t>(d.quant_group), NG = N / G;
      sc.assign(M * NG, 0.0);
      for (std::size_t i = 0; i < M; ++i)
        for (std::size_t g = 0; g < NG; ++g) {
          const double a = amax_of(i, g * G, G);
          double s;
          if (mx) {
            const int emax = d.y_dtype == DType::E4M3 ? 8 : 15;
            const int e = a >= 0x1p-126 ? static_cast<int>(std::floor(std::log2(a))) : -127;
            s = std::ldexp(1.0, std::clamp(e - emax, -127, 127));
          } else {
            s = std::fmax(a / fmax, min_scale);
            if (d.scale_ue8m0) s = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(s))));
          }
          sc[d.scale_col_major ? g * M + i : i * NG + g] = s;
          std::fill(scale_of.begin() + i * N + g * G, scale_of.begin() + i * N + (g + 1) * G, s);
        }
      break;
    }
  }
  if (d.store_y_hp) out["y_hp"] = y;
  for (std::size_t k = 0; k < M * N; ++k) y[k] = round_as(d.y_dtype, y[k] / scale_of[k]);
  if (d.store_y_t) {
    auto& t = out["y_t"];
    t.resize(M * N);
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) t[j * M + i] = y[i * N + j];
  }
}

/// The forward of any variant (RMSNorm or LayerNorm, residual add, weight
/// offset, no weight / bias, casting modes) in float64 from `in` (x,
/// residual, weight, bias). Returns y, residual_out, mean, rstd (those the
/// descriptor writes; with mean, mean_scale: each row's root mean square). Roundings that are part of the definition (the
/// residual sum in ResidualDtype mode, xhat in Llama mode) are applied.
inline HostTensors forward_reference(const NormDesc& d, const HostTensors& in) {
  const bool ln = d.norm == NormKind::LayerNorm;
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  HostTensors out;
  auto& y = out["y"];
  y.resize(M * N);
  std::vector<double> mean(M), rstd(M), h(N), ho;
  const std::vector<double>& x = in.at("x");
  const bool fp8_x = is_fp8(d.x_dtype);
  const std::size_t xg = static_cast<std::size_t>(d.x_group);
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      double v = x[i * N + j];
      if (fp8_x) v *= in.at("x_scale")[i * (N / xg) + j / xg];  // dequantized on load
      if (d.residual) {
        v += in.at("residual")[i * N + j];
        if (d.residual_rounding == ResidualRounding::ResidualDtype) v = round_as(d.residual_dtype, v);
        if (d.store_residual_out) ho.push_back(round_as(d.residual_out_dtype, v));
      }
      h[j] = v;
    }
    double mu = 0;
    if (ln) {
      for (double v : h) mu += v;
      mu /= N;
    }
    double var = 0;
    for (double v : h) var += (v - mu) * (v - mu);
    const double r = 1.0 / std::sqrt(var / N + static_cast<double>(d.eps));
    mean[i] = mu;
    rstd[i] = r;
    for (std::size_t j = 0; j < N; ++j) {
      double v = (h[j] - mu) * r;
      if (d.cast_mode == CastMode::Llama) v = round_as(d.x_dtype, v);
      if (d.has_weight) v *= in.at("weight")[j] + d.weight_offset;
      if (ln && d.has_bias) v += in.at("bias")[j];
      y[i * N + j] = v;
    }
  }
  if (d.store_residual_out) out["residual_out"] = std::move(ho);
  if (ln && d.store_mean) {
    // The scale a mean's error is judged against: the row's root mean
    // square, sqrt(mean^2 + var) (a mean near 0 is not known to its own
    // relative precision: fp32 sums carry errors of the order of the values).
    auto& ms = out["mean_scale"];
    for (std::size_t i = 0; i < M; ++i) ms.push_back(std::sqrt(mean[i] * mean[i] + 1.0 / (rstd[i] * rstd[i])));
    out["mean"] = std::move(mean);
  }
  if (d.store_rstd) out["rstd"] = std::move(rstd);
  if (d.quant != QuantScaling::None) quantize_reference(d, in, out);
  return out;
}

/// The backward of any variant in float64 from `in` (dy, x, weight, mean,
/// rstd, dresidual), with the given mean and rstd. Returns dx, dweight,
/// dbias (those the descriptor writes) and dx_scale: per element
/// |rstd*g| + |rstd*c1| + |rstd*xhat*c2| (+ |dresidual|), the size of the
/// terms whose difference is dx. When they nearly cancel (N = 1, say) dx is
/// tiny and only an error measured against them is fair.
inline HostTensors backward_reference(const NormDesc& d, const HostTensors& in) {
  const bool ln = d.norm == NormKind::LayerNorm;
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  HostTensors out;
  auto& dx = out["dx"];
  auto& scale = out["dx_scale"];
  dx.resize(M * N);
  scale.resize(M * N);
  std::vector<double> dw(N, 0.0), db(N, 0.0);
  const auto& dy = in.at("dy");
  std::vector<double> x = in.at("x");
  if (is_fp8(d.normed_dtype())) {  // dequantized, as the forward read it
    const std::size_t xg = static_cast<std::size_t>(d.x_group);
    for (std::size_t k = 0; k < M * N; ++k) x[k] *= in.at("x_scale")[(k / N) * (N / xg) + (k % N) / xg];
  }
  for (std::size_t i = 0; i < M; ++i) {
    const double r = in.at("rstd")[i], mu = ln ? in.at("mean")[i] : 0.0;
    auto wp = [&](std::size_t j) { return d.has_weight ? in.at("weight")[j] + d.weight_offset : 1.0; };
    double c1 = 0, c2 = 0;
    for (std::size_t j = 0; j < N; ++j) {
      const double g = dy[i * N + j] * wp(j), xh = (x[i * N + j] - mu) * r;
      c1 += g;
      c2 += g * xh;
    }
    c1 = ln ? c1 / N : 0.0;
    c2 /= N;
    for (std::size_t j = 0; j < N; ++j) {
      const double g = dy[i * N + j] * wp(j), xh = (x[i * N + j] - mu) * r;
      double v = r * (g - c1 - xh * c2);
      double sc = std::fabs(r * g) + std::fabs(r * c1) + std::fabs(r * xh * c2);
      if (d.has_dresidual) {
        v += in.at("dresidual")[i * N + j];
        sc += std::fabs(in.at("dresidual")[i * N + j]);
      }
      dx[i * N + j] = v;
      scale[i * N + j] = sc;
      dw[j] += dy[i * N + j] * xh;
      db[j] += dy[i * N + j];
    }
  }
  if (d.has_weight) out["dweight"] = std::move(dw);
  if (ln && d.has_bias) out["dbias"] = std::move(db);
  return out;
}

/// The rows x n values of a raw host buffer with leading dimension ld, as float64.
inline std::vector<double> host_rows(DType t, const void* p, std::int64_t rows, std::int64_t ld, std::int64_t n) {
  std::vector<double> v;
  v.reserve(static_cast<std::size_t>(rows * n));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) v.push_back(load_as(t, p, r * ld + j));
  return v;
}

/// RMSNorm forward_reference on raw host buffers laid out as the device's
/// (row strides from `d`); returns y (M x N, dense) and rstd (M).
inline void rms_forward_reference(const NormDesc& d, const void* x, const void* w, std::vector<double>* y,
                                  std::vector<double>* rstd) {
  NormDesc r = d;
  r.store_rstd = true;
  HostTensors out = forward_reference(
      r, {{"x", host_rows(d.x_dtype, x, d.M, d.x_ld(), d.N)}, {"weight", host_rows(d.weight_dtype, w, 1, d.N, d.N)}});
  *y = std::move(out["y"]);
  *rstd = std::move(out["rstd"]);
}

/// RMSNorm backward_reference on raw host buffers with the given rstd;
/// returns dx (M x N, dense), dw (N) and, if asked, dx_scale.
inline void rms_backward_reference(const NormDesc& d, const void* dy, const void* x, const void* w,
                                   const float* rstd, std::vector<double>* dx, std::vector<double>* dw,
                                   std::vector<double>* dx_scale = nullptr) {
  HostTensors out = backward_reference(d, {{"dy", host_rows(d.y_dtype, dy, d.M, d.dy_ld(), d.N)},
                                           {"x", host_rows(d.x_dtype, x, d.M, d.x_ld(), d.N)},
                                           {"weight", host_rows(d.weight_dtype, w, 1, d.N, d.N)},
                                           {"rstd", std::vector<double>(rstd, rstd + d.M)}});
  *dx = std::move(out["dx"]);
  *dw = std::move(out["dweight"]);
  if (dx_scale) *dx_scale = std::move(out["dx_scale"]);
}

/// ||got - ref|| / ||scale||; +inf if any got is NaN/inf.
inline double scaled_error(const std::vector<float>& got, const std::vector<double>& ref,
                           const std::vector<double>& scale) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double e = got[i] - ref[i];
    num += e * e;
    den += scale[i] * scale[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// ||got - ref|| / ||ref|| over all elements; +inf if any got is NaN/inf.
inline double relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  return scaled_error(got, ref, ref);
}

/// Tolerance on relative_error for an output of dtype `t`: a few roundings of
/// the output plus fp32 accumulation.
inline double tolerance(DType t) { return t == DType::F32 ? 1e-4 : 4 * unit_roundoff(t); }

/// An FP8 code's place on the number line (sign-magnitude to ordered).
inline int fp8_ordinal(DType t, float v) {
  const int c = nj::fp32_to_fp8(v, t == DType::E4M3 ? nj::kE4M3 : nj::kE5M2);
  return c & 0x80 ? -(c & 0x7f) : c;
}

/// FP8 outputs against the reference's: the fraction of elements whose code
/// differs, or +inf when any is more than one code apart (the fp32 vs float64
/// rounding boundary moves a code by one at most) or NaN where the
/// reference is not.
inline double fp8_code_mismatch(DType t, const std::vector<float>& got, const std::vector<double>& ref) {
  std::size_t differ = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const bool gn = std::isnan(got[i]), rn = std::isnan(ref[i]);
    if (gn || rn) {
      if (gn != rn) return INFINITY;
      continue;
    }
    const int dist = std::abs(fp8_ordinal(t, got[i]) - fp8_ordinal(t, static_cast<float>(ref[i])));
    if (dist > 1) return INFINITY;
    differ += dist;
  }
  return ref.empty() ? 0.0 : static_cast<double>(differ) / ref.size();
}

/// The largest relative error of any element (scales, amax); +inf for a NaN
/// where the reference has a number.
inline double max_relative_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double e = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) && std::isnan(got[i])) continue;
    const double d = std::fabs(got[i] - ref[i]) / std::fmax(std::fabs(ref[i]), 1e-300);
    if (!(d <= e)) e = std::isnan(d) ? INFINITY : std::fmax(e, d);
  }
  return e;
}

}  // namespace normjit::detail
