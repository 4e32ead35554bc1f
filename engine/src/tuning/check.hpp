// Checking an op's outputs in a Scratch against the float64 reference,
// shared by the benchmark's check column, the sanitizer driver and the GPU
// tests.
#pragma once

#include <string>
#include <vector>

#include "tuning/autotune.hpp"
#include "core/reference.hpp"

namespace normjit::detail {

struct OutputCheck {
  std::string name;  ///< "y", "rstd", "dx", ...
  /// Norm-wise relative error (dx: scaled by its terms' size; mean: by the
  /// rows' RMS), judged against tolerance(dtype). For the quantized outputs
  /// (FP8 q, y_scale, amax): the number of elements outside the bounds
  /// quant_bounds derives, judged against 0.
  double err = 0;
  double tol = 0;
  bool ok() const { return err <= tol; }
};

/// The float64 reference of one op on one set of inputs: the inputs (to
/// derive per-run bounds from) and the outputs. Several configs can share it.
struct Reference {
  Op op = Op::Forward;
  NormDesc desc;
  HostTensors in, out;
};

/// The float64 reference outputs of `op` from the inputs in `s`.
inline Reference reference_outputs(Op op, const NormDesc& d, const Scratch& s) {
  Reference r{op, d, {}, {}};
  for (const auto& t : s.specs)
    if (!t.output) {
      const auto f = s.download(t.name);
      r.in[t.name].assign(f.begin(), f.end());
    }
  r.out = op == Op::Forward ? forward_reference(d, r.in) : backward_reference(d, r.in);
  return r;
}

/// Compares every output in `s` (after the op ran on s's inputs) with `ref`
/// (reference_outputs of the same inputs). Quantized outputs are held to
/// quant_bounds given this run's own statistics and scales.
inline std::vector<OutputCheck> compare_outputs(const Scratch& s, const Reference& ref) {
  std::vector<OutputCheck> out;
  const NormDesc& d = ref.desc;
  const bool quant = ref.op == Op::Forward && d.quant != QuantScaling::None;
  QuantBounds qb;
  if (quant) {
    // The kernel's own statistics where it wrote all it used (else quant_bounds
    // takes float64's, widened by their tolerance).
    const bool ln = d.norm == NormKind::LayerNorm;
    const bool own = s.ptr("rstd") && (!ln || s.ptr("mean"));
    qb = quant_bounds(d, ref.in, own ? s.download("rstd") : std::vector<float>{},
                      own && ln ? s.download("mean") : std::vector<float>{}, s.download("y_scale"),
                      tolerance(DType::F32));
  }
  for (const auto& t : s.specs) {
    if (!t.output) continue;
    const auto got = s.download(t.name);
    if (quant && (t.name == "y" || t.name == "y_t")) {
      out.push_back({t.name, count_codes_outside(t.dtype, got, qb, d.M, d.N, t.name == "y_t"), 0});
      continue;
    }
    if (quant && t.name == "y_scale") {
      out.push_back({t.name, count_outside(got, qb.scale_lo, qb.scale_hi), 0});
      continue;
    }
    if (quant && t.name == "amax") {
      out.push_back({t.name, count_outside(got, qb.amax_lo, qb.amax_hi), 0});
      continue;
    }
    const auto& r = ref.out.at(t.name);
    const double err = t.name == "dx"     ? scaled_error(got, r, ref.out.at("dx_scale"))
                       : t.name == "mean" ? scaled_error(got, r, ref.out.at("mean_scale"))
                                          : relative_error(got, r);
    out.push_back({t.name, err, tolerance(t.dtype)});
  }
  return out;
}

/// Compares every output of `op` in `s` (after the op ran on s's inputs)
/// with the float64 reference computed from the same inputs.
inline std::vector<OutputCheck> check_outputs(Op op, const NormDesc& d, const Scratch& s) {
  return compare_outputs(s, reference_outputs(op, d, s));
}

}  // namespace normjit::detail
