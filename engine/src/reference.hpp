// float64 CPU references of the kernels, for the tests, the benchmark's
// check column and anyone validating a tuned kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "host_dtype.hpp"

namespace normjit::detail {

/// RMSNorm forward on raw host buffers laid out as the device's (row
/// strides from `d`); returns y (M x N, dense) and rstd (M) in float64.
inline void rms_forward_reference(const NormDesc& d, const void* x, const void* w, std::vector<double>* y,
                                  std::vector<double>* rstd) {
  y->assign(static_cast<std::size_t>(d.M * d.N), 0.0);
  rstd->assign(static_cast<std::size_t>(d.M), 0.0);
  for (std::int64_t i = 0; i < d.M; ++i) {
    double ss = 0;
    for (std::int64_t j = 0; j < d.N; ++j) {
      const double v = load_as(d.x_dtype, x, i * d.x_ld() + j);
      ss += v * v;
    }
    const double r = 1.0 / std::sqrt(ss / d.N + static_cast<double>(d.eps));
    (*rstd)[i] = r;
    for (std::int64_t j = 0; j < d.N; ++j)
      (*y)[i * d.N + j] = load_as(d.x_dtype, x, i * d.x_ld() + j) * r * load_as(d.weight_dtype, w, j);
  }
}

/// RMSNorm backward with the given rstd; returns dx (M x N, dense) and dw
/// (N), and in dx_scale (if given) |rstd*dy*w| + |rstd*xhat*c| per element:
/// the size of the two terms whose difference is dx. When they nearly cancel
/// (N = 1, say) dx is tiny and only an error measured against them is fair.
inline void rms_backward_reference(const NormDesc& d, const void* dy, const void* x, const void* w,
                                   const float* rstd, std::vector<double>* dx, std::vector<double>* dw,
                                   std::vector<double>* dx_scale = nullptr) {
  if (dx_scale) dx_scale->assign(static_cast<std::size_t>(d.M * d.N), 0.0);
  dx->assign(static_cast<std::size_t>(d.M * d.N), 0.0);
  dw->assign(static_cast<std::size_t>(d.N), 0.0);
  for (std::int64_t i = 0; i < d.M; ++i) {
    const double r = rstd[i];
    double dot = 0;
    for (std::int64_t j = 0; j < d.N; ++j)
      dot += load_as(d.y_dtype, dy, i * d.dy_ld() + j) * load_as(d.weight_dtype, w, j) *
             load_as(d.x_dtype, x, i * d.x_ld() + j) * r;
    const double c = dot / d.N;
    for (std::int64_t j = 0; j < d.N; ++j) {
      const double xh = load_as(d.x_dtype, x, i * d.x_ld() + j) * r;
      const double g = load_as(d.y_dtype, dy, i * d.dy_ld() + j);
      const double gw = g * load_as(d.weight_dtype, w, j);
      (*dx)[i * d.N + j] = r * (gw - xh * c);
      if (dx_scale) (*dx_scale)[i * d.N + j] = std::fabs(r * gw) + std::fabs(r * xh * c);
      (*dw)[j] += g * xh;
    }
  }
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
