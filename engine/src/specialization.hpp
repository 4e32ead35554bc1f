// A kernel specialisation: which template, and the constants and types its
// generated prelude defines. Value type; the JIT turns it into a cubin.
#pragma once

#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

enum class KernelKind { RmsForward, RmsBackward, DweightFinalize };

struct KernelSpec {
  KernelKind kind = KernelKind::RmsForward;
  int N = 0;  ///< unused by DweightFinalize
  DType x = DType::BF16, y = DType::BF16, w = DType::BF16;
  LaunchConfig cfg;         ///< unused by DweightFinalize
  bool index64 = false;     ///< 64-bit row offsets
  bool store_rstd = false;  ///< forward only
  bool dw_smem = false;     ///< backward: weight and dw sums in shared memory

  /// The extern "C" kernel in the template: "normjit_rms_fwd", ...
  const char* kernel_name() const;
  /// The template it includes: "rmsnorm_fwd.cuh", ...
  const char* template_file() const;
  /// The generated prelude (a struct Spec of using/constexpr lines) followed
  /// by the #include of the template.
  std::string source() const;
  /// Readable unique name, e.g. "rms_fwd.N4096.bf16.bf16.bf16.v8.t512.r1.i32.rstd".
  std::string name() const;
  /// Dynamic shared memory of a launch: the cp.async row stages.
  int dynamic_smem() const {
    return kind == KernelKind::RmsBackward
               ? cfg.stages * cfg.rows_per_pid * N * (dtype_size(x) + dtype_size(y)) + (dw_smem ? N * (4 + dtype_size(w)) : 0)
               : 0;
  }
  /// Block size the kernel is compiled for.
  int threads() const { return kind == KernelKind::DweightFinalize ? 1024 : cfg.threads(); }
};

/// The spec of `op` for `desc` under `cfg`.
KernelSpec make_spec(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The finalize kernel of `desc`'s backward.
KernelSpec finalize_spec(const NormDesc& desc);

/// NVRTC options every kernel is compiled with (part of the cache key).
const std::vector<std::string>& nvrtc_options();

}  // namespace normjit::detail
