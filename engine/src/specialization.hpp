// A kernel specialisation: which template, and the constants and types its
// generated prelude defines. Value type; the JIT turns it into a cubin.
#pragma once

#include <string>
#include <vector>

#include "kernel_sources.hpp"
#include "normjit/normjit.hpp"

namespace normjit::detail {

enum class KernelKind { Forward, Backward, DweightFinalize };

/// "rms_fwd", "ln_bwd": an op as errors, cache keys and the CLI name it.
std::string op_label(Op op, NormKind norm);

/// Everything of a descriptor that is compiled into a row kernel (besides N
/// and the launch config): the norm, the dtypes and the variant's switches.
/// Fields a kernel does not use keep their defaults, so they do not split
/// the cache.
struct Variant {
  NormKind norm = NormKind::RMSNorm;
  DType x = DType::BF16;   ///< forward: x; backward: the normalised input (x or h)
  DType y = DType::BF16;   ///< y and dy
  DType w = DType::BF16;   ///< weight, bias and their gradients
  DType r = DType::BF16;   ///< forward residual
  DType ro = DType::BF16;  ///< forward residual_out; backward dresidual
  DType h = DType::BF16;   ///< forward: dtype a cached row is kept in
  DType dx = DType::BF16;  ///< backward: dx
  bool has_w = true, has_b = false;
  float w_offset = 0.f;
  bool residual = false, store_res = false, round_res = false;
  bool llama = false;       ///< forward: CastMode::Llama
  bool heads = false;       ///< 3-D rows
  bool dres = false;        ///< backward: add dresidual into dx
  bool store_rstd = false, store_mean = false;
  // FP8 (forward): how y is quantized, and the extra outputs.
  QuantScaling quant = QuantScaling::None;
  int qgroup = 0;           ///< Group: G; MX: 32; else 0
  bool ue8m0 = false, colmajor = false;
  bool store_yhp = false, store_yt = false;
  DType yhp = DType::BF16;  ///< y_hp's dtype (store_yhp)
  int xgroup = 0;           ///< FP8 x (forward, or the backward's normalised input): QB; else 0

  /// The variant's part of cache keys and kernel names, e.g.
  /// "ln_fwd:x=fp16:y=fp16:w=fp16:bias:mean:rstd"; the dtypes and flags that
  /// matter for `kind` only.
  std::string tags(KernelKind kind) const;
  /// fp32 partial rows per program of the backward: dw (has_w) and db (has_b).
  int partials() const { return (has_w ? 1 : 0) + (has_b ? 1 : 0); }
};

/// The variant of `op` for `desc`.
Variant make_variant(Op op, const NormDesc& desc);

struct KernelSpec {
  KernelKind kind = KernelKind::Forward;
  int N = 0;  ///< unused by DweightFinalize
  Variant v;  ///< DweightFinalize uses v.w only
  LaunchConfig cfg;       ///< unused by DweightFinalize
  bool index64 = false;   ///< 64-bit row offsets
  bool dw_smem = false;   ///< backward: weight and dw / db sums in shared memory
  bool peel = false;      ///< forward: rows start anywhere in a vector (config_grid.hpp's peeled)
  int min_blocks = 1;     ///< forward: CTAs an SM must hold at once (forward_min_blocks)

  /// The extern "C" kernel in the template: "normjit_norm_fwd", ...
  const char* kernel_name() const;
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

/// How a forward thread that keeps its row in registers loads the weight
/// and bias of its chunks. Its pointers are not restrict, so the compiler
/// keeps every load behind the stores before it: chunk by chunk, a
/// load-store pair waits one memory round trip each (8 for a 128-thread row
/// of 7400 bf16). with_row: all of them with the row, before the reduction;
/// else `batch` chunks at a time after it, all loaded before their stores.
/// cfg.stages 0 (unstaged, what the grid holds): with the row up to
/// kUnstagedWeightBytes, else one chunk at a time, so the row's registers
/// alone decide how many CTAs an SM holds. cfg.stages 1 (staged,
/// launch_config's choice for launches whose CTAs are all resident at once,
/// where registers cost no CTAs): up to kWeightStagingBytes at once, as far
/// as a thread's registers allow. The prelude carries both as WB_WITH_ROW
/// and WB_BATCH.
struct WeightStaging {
  bool with_row = false;
  int batch = 1;  ///< chunks whose weight and bias load at once
  int bytes = 0;  ///< bytes of weight and bias a thread holds at once
};
inline constexpr int kUnstagedWeightBytes = 32;
inline constexpr int kWeightStagingBytes = 128;
WeightStaging weight_staging(const Variant& v, const LaunchConfig& cfg, int N, bool peel);

/// Registers a thread of the forward kernel of `v` under `cfg` needs to keep
/// its row without spilling (N: the row's columns; peel: peeled rows), and
/// from it the CTAs of cfg.threads() an SM can hold at once: the kernel is
/// compiled with __launch_bounds__(threads, min blocks), so ptxas keeps its
/// registers within 65536 / (min blocks * threads), and the config model
/// counts that many programs an SM. The need: 24, one register per element
/// a thread caches (16-bit rows are widened to fp32), 8 more from 16
/// elements on, and shares for LayerNorm's second sum (4), a cluster's
/// exchange (8), peeled edges (16), a residual summed in fp32 (8) and, when
/// staged (cfg.stages 1), the weight and bias weight_staging holds;
/// two-pass rows 32 (LayerNorm 40) and the fp32 sum's share.
/// Fitted to the lowest register caps at which ptxas (CUDA 13.0, sm_90)
/// spilled nothing over the forward grids of 22 shapes (every dtype, both
/// norms, residual, odd N, clusters); tests/test_nvrtc_compile.cpp checks
/// that the grids it compiles spill nothing. Quantized, FP8-input and
/// two-pass kernels: 1 (ptxas chooses). The register file (65536) and the 2048
/// threads and 32 CTAs an SM are those of sm_80 and sm_90.
int forward_register_need(const Variant& v, const LaunchConfig& cfg, int N, bool peel);
/// Registers a thread of a `threads`-thread block may hold: 65536 a CTA, 255 a thread.
int thread_register_cap(int threads);
int forward_min_blocks(const Variant& v, const LaunchConfig& cfg, int N, bool peel);

/// The spec of `op` for `desc` under `cfg`.
KernelSpec make_spec(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The source hash a tuned entry for `op` on `desc` with winner `cfg`
/// records: make_spec's, with 32-bit offsets (the entry serves every M of its
/// bucket, and 64-bit offsets only change the index type).
std::string tuned_kernel_hash(Op op, const NormDesc& desc, const LaunchConfig& cfg);
/// The finalize kernel of `desc`'s backward.
KernelSpec finalize_spec(const NormDesc& desc);

/// NVRTC options every kernel is compiled with (part of the cache key).
const std::vector<std::string>& nvrtc_options();

}  // namespace normjit::detail
