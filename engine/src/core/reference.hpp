// float64 CPU references of the kernels, for the tests, the benchmark's
// check column and anyone validating a tuned kernel.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/host_dtype.hpp"

namespace normjit::detail {

/// Runs fn(begin, end) over [0, n) split into contiguous blocks, one per
/// hardware thread (rows are independent; a float64 reference of a large
/// shape on one core takes seconds). Serial for small n.
template <class Fn>
void parallel_blocks(std::size_t n, std::size_t min_block, Fn&& fn) {
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t parts = std::min(hw, std::max<std::size_t>(1, n / std::max<std::size_t>(1, min_block)));
  if (parts <= 1) {
    fn(std::size_t{0}, n);
    return;
  }
  std::vector<std::thread> threads;
  for (std::size_t p = 0; p < parts; ++p)
    threads.emplace_back([&fn, p, parts, n] { fn(n * p / parts, n * (p + 1) / parts); });
  for (auto& t : threads) t.join();
}

/// Tensors by name (op_tensors' names), each its rows one after another
/// (rows x cols, no gaps), as float64.
using HostTensors = std::map<std::string, std::vector<double>>;

/// v rounded to dtype t (how model code that computes in t sees it).
inline double round_as(DType t, double v) {
  unsigned char b[4];
  store_as(t, b, 0, static_cast<float>(v));
  return load_as(t, b, 0);
}

/// Elements of a row that share one scale: N (Tensor, Token), G (Group),
/// 32 (MX).
inline std::size_t scale_group(const NormDesc& d) {
  if (d.quant == QuantScaling::Group) return static_cast<std::size_t>(d.quant_group);
  if (d.quant == QuantScaling::MX) return 32;
  return static_cast<std::size_t>(d.N);
}

/// Index in y_scale of row i's group g (Token: g = 0; Group: row- or
/// column-major).
inline std::size_t scale_index(const NormDesc& d, std::size_t i, std::size_t g) {
  const std::size_t NG = static_cast<std::size_t>(d.N) / scale_group(d);
  return d.scale_col_major ? g * static_cast<std::size_t>(d.M) + i : i * NG + g;
}

/// The scale of a tensor, row or group whose amax is `a` (QuantScaling):
/// max(a / fmax, 2^-126), with a / fmax first scaled by (1 + rel) (0 for the
/// reference; a bound passes the fp32 rounding it allows), capped at
/// scale_ub (Token, Group), rounded up to a power of two (UE8M0); MX: 2^e with
/// e = clamp(floor(log2 a) - emax, -127, 127).
inline double scale_rule(const NormDesc& d, double a, double rel = 0) {
  if (d.quant == QuantScaling::MX) {
    const int emax = d.y_dtype == DType::E4M3 ? 8 : 15;
    const int e = a >= 0x1p-126 ? static_cast<int>(std::floor(std::log2(a))) : -127;
    return std::ldexp(1.0, std::clamp(e - emax, -127, 127));
  }
  const double smin = d.scale_min > 0.f ? d.scale_min : kMinScale;
  double s = std::fmax(a / fp8_max(d.y_dtype) * (1 + rel), smin);
  if ((d.quant == QuantScaling::Token || d.quant == QuantScaling::Group) && d.scale_ub > 0)
    s = std::fmin(s, static_cast<double>(d.scale_ub));
  if (d.scale_ue8m0) s = std::ldexp(1.0, static_cast<int>(std::ceil(std::log2(s))));
  return s;
}

/// Quantizes out["y"] (the float64 y) as `d.quant` says (QuantScaling):
/// y becomes the FP8 values q, with y_scale (and amax, y_hp, y_t) beside it.
/// amax ignores NaN, as the kernels do.
inline void quantize_reference(const NormDesc& d, const HostTensors& in, HostTensors& out) {
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  std::vector<double>& y = out["y"];
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
      double a = 0;
      for (std::size_t i = 0; i < M; ++i) a = std::fmax(a, amax_of(i, 0, N));
      if (d.quant == QuantScaling::Tensor || d.store_amax) out["amax"] = {a};
      if (d.quant == QuantScaling::Tensor) {
        s = scale_rule(d, a);
        sc = {s};
      } else {
        out.erase("y_scale");  // an input
      }
      std::fill(scale_of.begin(), scale_of.end(), s);
      break;
    }
    case QuantScaling::Token:
    case QuantScaling::Group:
    case QuantScaling::MX: {
      const std::size_t G = scale_group(d);
      sc.assign(M * (N / G), 0.0);
      parallel_blocks(M, 1, [&](std::size_t r0, std::size_t r1) {
        for (std::size_t i = r0; i < r1; ++i)
          for (std::size_t g = 0; g < N / G; ++g) {
            const double s = scale_rule(d, amax_of(i, g * G, G));
            sc[scale_index(d, i, g)] = s;
            std::fill(scale_of.begin() + i * N + g * G, scale_of.begin() + i * N + (g + 1) * G, s);
          }
      });
      break;
    }
  }
  if (d.store_y_hp) out["y_hp"] = y;
  parallel_blocks(M * N, 1 << 16, [&](std::size_t k0, std::size_t k1) {
    for (std::size_t k = k0; k < k1; ++k) y[k] = round_as(d.y_dtype, y[k] / scale_of[k]);
  });
  if (d.store_y_t) {
    auto& t = out["y_t"];
    t.resize(M * N);
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) t[j * M + i] = y[i * N + j];
  }
}

/// Row i of h, the values a forward normalizes, in float64 from `in`: x
/// (dequantized with x_scale when FP8), plus the residual, rounded as the
/// descriptor says (ResidualDtype: to the residual's dtype).
inline void reference_h(const NormDesc& d, const HostTensors& in, std::size_t i, std::vector<double>& h) {
  const std::size_t N = static_cast<std::size_t>(d.N), xg = static_cast<std::size_t>(d.x_group);
  const double* x = in.at("x").data() + i * N;
  const double* xs = is_fp8(d.x_dtype) ? in.at("x_scale").data() + i * (N / xg) : nullptr;
  const double* res = d.residual ? in.at("residual").data() + i * N : nullptr;
  h.resize(N);
  for (std::size_t j = 0; j < N; ++j) {
    double v = x[j];
    if (xs) v *= xs[j / xg];  // dequantized on load
    if (res) {
      v += res[j];
      if (d.residual_rounding == ResidualRounding::ResidualDtype) v = round_as(d.residual_dtype, v);
    }
    h[j] = v;
  }
}

/// The forward of any variant (RMSNorm or LayerNorm, residual add, weight
/// offset, no weight / bias, casting modes, FP8 input and output) in float64
/// from `in` (x, x_scale, residual, weight, bias, y_scale). Returns y,
/// residual_out, mean, rstd (those the descriptor writes; with mean,
/// mean_scale: each row's root mean square). Roundings that are part of the
/// definition (the residual sum in ResidualDtype mode, xhat in Llama mode)
/// are applied. Rows run in parallel (parallel_blocks).
inline HostTensors forward_reference(const NormDesc& d, const HostTensors& in) {
  const bool ln = d.norm == NormKind::LayerNorm;
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  HostTensors out;
  auto& y = out["y"];
  y.resize(M * N);
  std::vector<double> mean(M), rstd(M), ho(d.store_residual_out ? M * N : 0);
  const double* w = d.has_weight ? in.at("weight").data() : nullptr;
  const double* b = ln && d.has_bias ? in.at("bias").data() : nullptr;
  parallel_blocks(M, 1, [&](std::size_t r0, std::size_t r1) {
    std::vector<double> h;
    for (std::size_t i = r0; i < r1; ++i) {
      reference_h(d, in, i, h);
      if (d.store_residual_out)
        for (std::size_t j = 0; j < N; ++j) ho[i * N + j] = round_as(d.residual_out_dtype, h[j]);
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
        if (w) v *= w[j] + d.weight_offset;
        if (b) v += b[j];
        // A quantized Llama y quantizes what the Llama forward stores.
        if (d.cast_mode == CastMode::Llama && d.quant != QuantScaling::None) v = round_as(d.x_dtype, v);
        y[i * N + j] = v;
      }
    }
  });
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

/// gamma_k = k u / (1 - k u), u = 2^-24: the relative error bound of k fp32
/// roundings (Higham, Accuracy and Stability of Numerical Algorithms, 3.1).
inline double fp32_gamma(int k) {
  const double ku = k * 0x1p-24;
  return ku / (1 - ku);
}

/// What a correct kernel may write for its quantized outputs (QuantScaling),
/// as closed intervals per element, derived from the fp32 roundings between
/// the row statistics and each output; the statistics are the ones the
/// kernel wrote itself (rstd, mean: checked against float64 on their own),
/// so no bound on a reduction of N terms enters. Per element:
///   h        as forward_reference (residual roundings are exact operations
///            on fp32 sums of two inputs, FP8 dequantization one rounding);
///   xhat     = (h - mean) * rstd:  |error| <= gamma_4 (|h| + |mean|) rstd
///            (dequantize, residual sum, subtraction, product); Llama mode
///            rounds both ends of that interval to x's dtype (monotone);
///   y        = xhat * (weight + offset) + bias: gamma_3 (|xhat w'| + |bias|);
///   amax     the max of |y| over the group, row or tensor: its interval
///            from the elements' intervals (NaN ignored, as the kernels do);
///   scale    max(amax / fmax, 2^-126): one rounding (gamma_1), then the
///            monotone steps (upper bound, power of two, MX exponent);
///   q        sat(rne(y * (1 / scale))) with the kernel's own scale: two
///            roundings and the float64-to-float conversion (gamma_3), then
///            FP8 rounding, monotone: a code range.
/// Without kernel statistics (`rstd` empty) the float64 ones are used and
/// xhat widens by `stat_rel` (the tolerance the statistics are held to).
struct QuantBounds {
  std::vector<double> amax_lo, amax_hi;    ///< Tensor: [1]
  std::vector<double> scale_lo, scale_hi;  ///< y_scale's layout (op_tensors); empty for TensorStatic
  /// q's code ordinals (fp8_ordinal), M x N; q_nan: the element must be NaN.
  std::vector<int> q_lo, q_hi;
  std::vector<char> q_nan;
};

/// An FP8 code's place on the number line (sign-magnitude to ordered).
inline int fp8_ordinal(DType t, float v) {
  const int c = nj::fp32_to_fp8(v, t == DType::E4M3 ? nj::kE4M3 : nj::kE5M2);
  return c & 0x80 ? -(c & 0x7f) : c;
}

/// The bounds above. `rstd`, `mean`: the kernel's statistics (mean for
/// LayerNorm; both empty: use float64's, widened by stat_rel). `scale`: the
/// kernel's y_scale as written (its layout), or for TensorStatic the input.
inline QuantBounds quant_bounds(const NormDesc& d, const HostTensors& in, const std::vector<float>& rstd,
                                const std::vector<float>& mean, const std::vector<float>& scale,
                                double stat_rel) {
  const bool ln = d.norm == NormKind::LayerNorm;
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  const double u = 0x1p-24;
  const double* w = d.has_weight ? in.at("weight").data() : nullptr;
  const double* b = ln && d.has_bias ? in.at("bias").data() : nullptr;
  HostTensors ref_stats;
  const bool own = !rstd.empty();
  if (!own) {
    NormDesc r = d;
    r.quant = QuantScaling::None;
    r.store_rstd = r.store_mean = true;
    ref_stats = forward_reference(r, in);
  }
  // The interval of every y.
  std::vector<double> ylo(M * N), yhi(M * N);
  parallel_blocks(M, 1, [&](std::size_t r0, std::size_t r1) {
    std::vector<double> h;
    for (std::size_t i = r0; i < r1; ++i) {
      reference_h(d, in, i, h);
      const double r = own ? rstd[i] : ref_stats.at("rstd")[i];
      const double mu = !ln ? 0.0 : own ? mean.at(i) : ref_stats.at("mean")[i];
      // LayerNorm kernels subtract the row's first element (the shift) and
      // then the rest of the mean: h - shift rounds relative to |shift|,
      // which can far exceed |h| + |mean| (an FP8 row whose first element is
      // large).
      const double shift = ln ? std::fabs(h[0]) : 0.0;
      for (std::size_t j = 0; j < N; ++j) {
        const double t = (h[j] - mu) * r;
        double e = fp32_gamma(4) * (std::fabs(h[j]) + std::fabs(mu) + shift) * std::fabs(r);
        if (!own) e += stat_rel * (std::fabs(t) + (ln ? std::fabs(r) * ref_stats.at("mean_scale")[i] : 0.0));
        double tlo = t - e, thi = t + e;
        if (d.cast_mode == CastMode::Llama) tlo = round_as(d.x_dtype, tlo), thi = round_as(d.x_dtype, thi);
        const double wp = w ? w[j] + d.weight_offset : 1.0, bj = b ? b[j] : 0.0;
        const double a = tlo * wp, c = thi * wp;
        const double slack = fp32_gamma(3) * (std::fmax(std::fabs(a), std::fabs(c)) + std::fabs(bj));
        ylo[i * N + j] = std::fmin(a, c) + bj - slack;
        yhi[i * N + j] = std::fmax(a, c) + bj + slack;
        if (d.cast_mode == CastMode::Llama) {  // rounding is monotone: the interval's ends bound it
          ylo[i * N + j] = round_as(d.x_dtype, ylo[i * N + j]);
          yhi[i * N + j] = round_as(d.x_dtype, yhi[i * N + j]);
        }
      }
    }
  });
  // |y|'s interval over elements [k0, k1) of row i (NaN ignored).
  auto amax_of = [&](std::size_t i, std::size_t j0, std::size_t n) {
    double lo = 0, hi = 0;
    for (std::size_t k = i * N + j0; k < i * N + j0 + n; ++k) {
      if (std::isnan(ylo[k]) || std::isnan(yhi[k])) continue;
      lo = std::fmax(lo, ylo[k] > 0 ? ylo[k] : yhi[k] < 0 ? -yhi[k] : 0.0);
      hi = std::fmax(hi, std::fmax(std::fabs(ylo[k]), std::fabs(yhi[k])));
    }
    return std::pair{lo, hi};
  };
  QuantBounds qb;
  switch (d.quant) {
    case QuantScaling::None: return qb;
    case QuantScaling::TensorStatic:
    case QuantScaling::Tensor: {
      if (d.quant == QuantScaling::TensorStatic && !d.store_amax) break;
      double lo = 0, hi = 0;
      for (std::size_t i = 0; i < M; ++i) {
        const auto [l, h] = amax_of(i, 0, N);
        lo = std::fmax(lo, l), hi = std::fmax(hi, h);
      }
      qb.amax_lo = {lo};
      qb.amax_hi = {hi};
      if (d.quant == QuantScaling::Tensor) {  // a static scale is the caller's
        qb.scale_lo = {scale_rule(d, lo, -u)};
        qb.scale_hi = {scale_rule(d, hi, u)};
      }
      break;
    }
    case QuantScaling::Token:
    case QuantScaling::Group:
    case QuantScaling::MX: {
      const std::size_t G = scale_group(d);
      qb.scale_lo.assign(M * (N / G), 0.0);
      qb.scale_hi.assign(M * (N / G), 0.0);
      for (std::size_t i = 0; i < M; ++i)
        for (std::size_t g = 0; g < N / G; ++g) {
          const auto [l, h] = amax_of(i, g * G, G);
          qb.scale_lo[scale_index(d, i, g)] = scale_rule(d, l, -u);
          qb.scale_hi[scale_index(d, i, g)] = scale_rule(d, h, u);
        }
      break;
    }
  }
  // The kernel's scale of element (i, j).
  const bool per_tensor = d.quant == QuantScaling::Tensor || d.quant == QuantScaling::TensorStatic;
  auto scale_at = [&](std::size_t i, std::size_t j) {
    return static_cast<double>(per_tensor ? scale.at(0) : scale.at(scale_index(d, i, j / scale_group(d))));
  };
  // q's code range, given the kernel's scale.
  qb.q_lo.assign(M * N, 0);
  qb.q_hi.assign(M * N, 0);
  qb.q_nan.assign(M * N, 0);
  parallel_blocks(M, 1, [&](std::size_t r0, std::size_t r1) {
    for (std::size_t i = r0; i < r1; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        const std::size_t k = i * N + j;
        if (std::isnan(ylo[k]) || std::isnan(yhi[k])) {
          qb.q_nan[k] = 1;
          continue;
        }
        const double s = scale_at(i, j);
        if (!(s > 0) || !std::isfinite(s)) {  // a broken scale: no q can be right
          qb.q_lo[k] = 1, qb.q_hi[k] = 0;
          continue;
        }
        const double vl = ylo[k] / s, vh = yhi[k] / s, g = fp32_gamma(3);
        qb.q_lo[k] = fp8_ordinal(d.y_dtype, static_cast<float>(vl - g * std::fabs(vl)));
        qb.q_hi[k] = fp8_ordinal(d.y_dtype, static_cast<float>(vh + g * std::fabs(vh)));
      }
  });
  return qb;
}

/// The backward of any variant in float64 from `in` (dy, x, weight, mean,
/// rstd, dresidual), with the given mean and rstd. Returns dx, dweight,
/// dbias (those the descriptor writes) and dx_scale: per element
/// |rstd*g| + |rstd*c1| + |rstd*xhat*c2| (+ |dresidual|), the size of the
/// terms whose difference is dx. When they nearly cancel (N = 1, say) dx is
/// tiny and only an error measured against them is fair. Rows run in
/// parallel; each block sums its own dweight / dbias rows, added at the end.
inline HostTensors backward_reference(const NormDesc& d, const HostTensors& in) {
  const bool ln = d.norm == NormKind::LayerNorm;
  const std::size_t M = static_cast<std::size_t>(d.M), N = static_cast<std::size_t>(d.N);
  HostTensors out;
  auto& dx = out["dx"];
  auto& scale = out["dx_scale"];
  dx.resize(M * N);
  scale.resize(M * N);
  const auto& dy = in.at("dy");
  const auto& xin = in.at("x");
  const bool fp8_x = is_fp8(d.normed_dtype());  // dequantized, as the forward read it
  const std::size_t xg = static_cast<std::size_t>(d.x_group);
  const double* w = d.has_weight ? in.at("weight").data() : nullptr;
  const double* dres = d.has_dresidual ? in.at("dresidual").data() : nullptr;
  std::mutex mu_sum;
  std::vector<double> dw(N, 0.0), db(N, 0.0);
  parallel_blocks(M, 1, [&](std::size_t r0, std::size_t r1) {
    std::vector<double> pdw(N, 0.0), pdb(N, 0.0), x(N);
    for (std::size_t i = r0; i < r1; ++i) {
      for (std::size_t j = 0; j < N; ++j)
        x[j] = fp8_x ? xin[i * N + j] * in.at("x_scale")[i * (N / xg) + j / xg] : xin[i * N + j];
      const double r = in.at("rstd")[i], mu = ln ? in.at("mean")[i] : 0.0;
      auto wp = [&](std::size_t j) { return w ? w[j] + d.weight_offset : 1.0; };
      double c1 = 0, c2 = 0;
      for (std::size_t j = 0; j < N; ++j) {
        const double g = dy[i * N + j] * wp(j), xh = (x[j] - mu) * r;
        c1 += g;
        c2 += g * xh;
      }
      c1 = ln ? c1 / N : 0.0;
      c2 /= N;
      for (std::size_t j = 0; j < N; ++j) {
        const double g = dy[i * N + j] * wp(j), xh = (x[j] - mu) * r;
        double v = r * (g - c1 - xh * c2);
        double sc = std::fabs(r * g) + std::fabs(r * c1) + std::fabs(r * xh * c2);
        if (dres) {
          v += dres[i * N + j];
          sc += std::fabs(dres[i * N + j]);
        }
        dx[i * N + j] = v;
        scale[i * N + j] = sc;
        pdw[j] += dy[i * N + j] * xh;
        pdb[j] += dy[i * N + j];
      }
    }
    std::lock_guard<std::mutex> lock(mu_sum);
    for (std::size_t j = 0; j < N; ++j) {
      dw[j] += pdw[j];
      db[j] += pdb[j];
    }
  });
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

/// ||got - ref|| / ||scale||; +inf if any got is NaN/inf where the
/// reference is a number (an element whose reference is NaN, from a NaN
/// input, must be NaN and is left out of the norms).
inline double scaled_error(const std::vector<float>& got, const std::vector<double>& ref,
                           const std::vector<double>& scale) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i])) {
      if (!std::isnan(got[i])) return INFINITY;
      continue;
    }
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

/// Elements of `got` outside [lo, hi] (NaN outside every interval).
inline double count_outside(const std::vector<float>& got, const std::vector<double>& lo,
                            const std::vector<double>& hi) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < lo.size(); ++i) n += !(got[i] >= lo[i] && got[i] <= hi[i]);
  return static_cast<double>(n);
}

/// FP8 codes of `got` outside their ranges in `b` (or not NaN where they
/// must be); `transposed`: got is q transposed ([N, M]).
inline double count_codes_outside(DType t, const std::vector<float>& got, const QuantBounds& b, std::int64_t M,
                                  std::int64_t N, bool transposed) {
  std::size_t n = 0;
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      const std::size_t k = static_cast<std::size_t>(i * N + j);
      const float g = got[transposed ? static_cast<std::size_t>(j * M + i) : k];
      if (b.q_nan[k]) {
        n += !std::isnan(g);
        continue;
      }
      const int o = fp8_ordinal(t, g);
      n += std::isnan(g) || o < b.q_lo[k] || o > b.q_hi[k];
    }
  return static_cast<double>(n);
}

}  // namespace normjit::detail
