// Checking an op's outputs in a Scratch against the float64 reference,
// shared by the benchmark's check column and the GPU tests.
#pragma once

#include <string>
#include <vector>

#include "autotune.hpp"
#include "reference.hpp"

namespace normjit::detail {

struct OutputCheck {
  std::string name;   ///< "y", "rstd", "dx", ...
  double err = 0;     ///< relative error (dx: scaled by its terms' size; mean: by the rows' RMS)
  double tol = 0;     ///< tolerance(dtype)
  bool ok() const { return err <= tol; }
};

/// The float64 reference outputs of `op` from the inputs in `s`.
inline HostTensors reference_outputs(Op op, const NormDesc& d, const Scratch& s) {
  HostTensors in;
  for (const auto& t : s.specs)
    if (!t.output) {
      const auto f = s.download(t.name);
      in[t.name].assign(f.begin(), f.end());
    }
  return op == Op::Forward ? forward_reference(d, in) : backward_reference(d, in);
}

/// Compares every output of `op` in `s` (after the op ran on s's inputs)
/// with `ref` (reference_outputs of the same inputs): several configs can
/// share one reference.
inline std::vector<OutputCheck> compare_outputs(const Scratch& s, const HostTensors& ref) {
  std::vector<OutputCheck> out;
  for (const auto& t : s.specs) {
    if (!t.output) continue;
    const auto got = s.download(t.name);
    const auto& r = ref.at(t.name);
    if (is_fp8(t.dtype)) {  // q: at least 99.9% equal codes, none more than one apart
      out.push_back({t.name, fp8_code_mismatch(t.dtype, got, r), 1e-3});
      continue;
    }
    if (t.name == "y_scale" || t.name == "amax") {  // within 1e-6 relative, every element
      out.push_back({t.name, max_relative_error(got, r), 1e-6});
      continue;
    }
    const double err = t.name == "dx"     ? scaled_error(got, r, ref.at("dx_scale"))
                       : t.name == "mean" ? scaled_error(got, r, ref.at("mean_scale"))
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
