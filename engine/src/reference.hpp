// float64 CPU references of the kernels, for the tests, the benchmark's
// check column and anyone validating a tuned kernel.
#pragma once

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
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      double v = x[i * N + j];
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
  const auto& x = in.at("x");
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

}  // namespace normjit::detail
