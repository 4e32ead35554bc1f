// A call's variant and shape key: the part of a descriptor that is compiled
// into a row kernel (Variant), and the key tuned configs are stored under.
// Derived once per call (plan.hpp) and passed down as values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

// Sharded: the four kernels of a norm sharded across ranks (sharded.cuh, one module).
enum class KernelKind { Forward, Backward, DweightFinalize, Sharded };

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
  bool store_yhp = false;
  bool store_yt = false;     ///< q transposed is an output
  bool yt_by_rows = false;   ///< store_yt, and the row kernel stores it (transposed_by_rows)
  bool store_amax = false;  ///< TensorStatic: amax of y written too
  DType yhp = DType::BF16;  ///< y_hp's dtype (store_yhp)
  int xgroup = 0;           ///< FP8 x (forward, or the backward's normalised input): QB; else 0

  /// The variant's part of cache keys and kernel names, e.g.
  /// "ln_fwd:x=fp16:y=fp16:w=fp16:bias:mean:rstd"; the dtypes and flags that
  /// matter for `kind` only.
  std::string tags(KernelKind kind) const;
  /// fp32 partial rows per program of the backward: dw (has_w) and db (has_b).
  int partials() const { return (has_w ? 1 : 0) + (has_b ? 1 : 0); }
};

/// Element strides between the rows (and heads) of every tensor `op` moves
/// in vectors: a vector never straddles two rows, so vec must divide each.
std::vector<std::int64_t> row_strides(Op op, const NormDesc& desc);

/// The variant of `op` for `desc`.
Variant make_variant(Op op, const NormDesc& desc);

/// Does the forward's row kernel store q transposed itself (desc.store_y_t)?
/// Only at decode: each transposed code is a byte store the L2 takes as a
/// request of its own. Else a launch of its own transposes q after it, and
/// the row kernel holds no code for it.
bool transposed_by_rows(const NormDesc& desc);

/// Bucket of M used in shape keys: the smallest power of two >= M, capped at
/// 65536 (all larger M share one bucket); 0 for M == 0.
std::int64_t m_bucket(std::int64_t M);

/// "rms_fwd:x=bf16:y=bf16:w=bf16:rstd:N=4096:M<=8192": the variant's tags
/// (Variant::tags: norm, direction, dtypes, flags), N and the M bucket. The
/// same string is the JSON key.
std::string shape_key(Op op, const NormDesc& desc);

/// Op of a shape key ("rms_fwd:..." is Forward); throws Error(InvalidArgument)
/// for a key of neither direction.
Op shape_key_op(const std::string& key);

}  // namespace normjit::detail
