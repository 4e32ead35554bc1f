// A kernel specialisation: which template, and the constants and types its
// generated prelude defines. Value type; the JIT turns it into a cubin.
#pragma once

#include <string>
#include <vector>

#include "compile/kernel_sources.hpp"
#include "config/row_budget.hpp"
#include "core/variant.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

struct KernelSpec {
  KernelKind kind = KernelKind::Forward;
  int N = 0;  ///< unused by DweightFinalize
  Variant v;  ///< DweightFinalize uses v.w only
  LaunchConfig cfg;       ///< unused by DweightFinalize
  bool index64 = false;   ///< 64-bit row offsets
  bool dw_smem = false;   ///< backward: weight and dw / db sums in shared memory
  bool peel = false;      ///< rows start anywhere in a vector (config_grid.hpp's peeled)
  int min_blocks = 1;     ///< forward: CTAs an SM must hold at once (forward_min_blocks)

  /// The extern "C" kernel in the template: "normjit_norm_fwd", ...
  const char* kernel_name() const;
  /// The module's other kernels, or null: q transposed (forward with
  /// store_y_t), and tensor scaling's two phases in one program (decode).
  const char* transpose_kernel_name() const;
  const char* once_kernel_name() const;
  /// The template it includes: "norm_fwd.cuh", ...
  const char* template_file() const;
  /// The generated prelude (a struct Spec of using/constexpr lines) followed
  /// by the #include of the template.
  std::string source() const;
  /// Hash of what NVRTC compiles for this spec: the prelude, the templates
  /// it includes (transitively) and the NVRTC options. Keys compiled kernels
  /// and tells whether a tuned entry still describes its kernel.
  std::string source_hash(const SourceMap& files = kernel_sources()) const;
  /// Readable unique name, e.g. "rms_fwd.x=bf16.y=bf16.w=bf16.rstd.N4096.v8.t512.r1.i32".
  std::string name() const;
  /// Dynamic shared memory of a launch: the cp.async row stages, and the
  /// weight and sums when they live in shared memory.
  int dynamic_smem() const;
  /// Block size the kernel is compiled for.
  int threads() const { return kind == KernelKind::DweightFinalize ? 1024 : cfg.threads(); }
};

/// The spec of `op` for `desc` under `cfg`.
KernelSpec make_spec(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The kernel a tuned entry for `op` on `desc` with winner `cfg` describes:
/// make_spec's, with 32-bit offsets (the entry serves every M of its bucket,
/// and 64-bit offsets only change the index type).
KernelSpec tuned_spec(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The source hash such an entry records: tuned_spec's.
std::string tuned_kernel_hash(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The finalize kernel of `desc`'s backward.
KernelSpec finalize_spec(const NormDesc& desc);
/// The module of a sharded norm's four kernels (sharded.cuh) for `desc`,
/// with vectors of `vec` elements and blocks of `threads`.
KernelSpec sharded_spec(const ShardedNormDesc& desc, int vec, int threads);
/// The kernels of a sharded norm's module, in call order.
enum class ShardKernel { Stats, Apply, BackwardStats, BackwardApply };
const char* shard_kernel_name(ShardKernel k);

/// NVRTC options every kernel is compiled with (part of the cache key).
const std::vector<std::string>& nvrtc_options();

}  // namespace normjit::detail
