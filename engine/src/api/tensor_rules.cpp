// Which tensors a descriptor needs: checked before a plan is built, and the
// ones it does not need dropped, so that a kernel never sees them.
#include "api/tensor_rules.hpp"

#include <cstdint>

#include <fmt/format.h>

#include "core/variant.hpp"

namespace normjit::detail {

namespace {
// Pointers the descriptor asks for must be there, and only those are used.
void require(bool ok, const char* what, const char* why, Op op, const NormDesc& d) {
  if (!ok)
    throw Error(ErrorKind::InvalidArgument, fmt::format("{} = null: a device pointer is required ({})", what, why),
                op_label(op, d.norm), d.str());
}
}  // namespace

// Pointers a descriptor does not use are dropped: the kernel never sees them.
ForwardTensors used_tensors(const NormDesc& d, const ForwardTensors& t) {
  const bool ln = d.norm == NormKind::LayerNorm, quant = d.quant != QuantScaling::None;
  ForwardTensors u = t;
  if (!is_fp8(d.x_dtype)) u.x_scale = nullptr;
  if (!quant) u.y_scale = nullptr;
  if (d.quant != QuantScaling::Tensor && !d.store_amax) u.amax = nullptr;
  if (!quant || !d.store_y_hp) u.y_hp = nullptr;
  if (!d.store_y_t) u.y_t = nullptr;
  if (!d.has_weight) u.weight = nullptr;
  if (!d.has_bias) u.bias = nullptr;
  if (!d.residual) u.residual = nullptr;
  if (!d.store_residual_out) u.residual_out = nullptr;
  if (!d.store_rstd) u.rstd = nullptr;
  if (!ln || !d.store_mean) u.mean = nullptr;
  return u;
}

BackwardTensors used_tensors(const NormDesc& d, const BackwardTensors& t) {
  const bool ln = d.norm == NormKind::LayerNorm;
  BackwardTensors u = t;
  if (!ln) u.mean = nullptr;
  if (!d.has_weight) u.weight = u.dweight = nullptr;
  if (!ln || !d.has_bias) u.dbias = nullptr;
  if (!d.has_dresidual) u.dresidual = nullptr;
  if (!is_fp8(d.normed_dtype())) u.x_scale = nullptr;
  return u;
}

void require_forward(const NormDesc& d, const ForwardTensors& t) {
  constexpr Op op = Op::Forward;
  const bool ln = d.norm == NormKind::LayerNorm;
  require(t.x, "x", "always", op, d);
  require(t.y, "y", "always", op, d);
  if (d.has_weight) require(t.weight, "weight", "has_weight", op, d);
  if (d.has_bias) require(t.bias, "bias", "has_bias", op, d);
  if (d.residual) require(t.residual, "residual", "residual", op, d);
  if (d.store_residual_out) require(t.residual_out, "residual_out", "store_residual_out", op, d);
  if (d.store_rstd) require(t.rstd, "rstd", "store_rstd", op, d);
  if (ln && d.store_mean) require(t.mean, "mean", "store_mean", op, d);
  const bool quant = d.quant != QuantScaling::None;
  if (is_fp8(d.x_dtype)) require(t.x_scale, "x_scale", "an FP8 x_dtype", op, d);
  if (quant) require(t.y_scale, "y_scale", "a quantized y", op, d);
  if (d.quant == QuantScaling::Tensor) require(t.amax, "amax", "quant = tensor", op, d);
  if (d.store_amax) require(t.amax, "amax", "store_amax", op, d);
  if (quant && d.store_y_hp) require(t.y_hp, "y_hp", "store_y_hp", op, d);
  if (d.store_y_t) require(t.y_t, "y_t", "store_y_t", op, d);
}

void require_backward(const NormDesc& d, const BackwardTensors& t) {
  constexpr Op op = Op::Backward;
  const bool ln = d.norm == NormKind::LayerNorm;
  require(t.dy, "dy", "always", op, d);
  require(t.x, "x", d.residual ? "h = residual_out of the forward" : "always", op, d);
  require(t.rstd, "rstd", "always", op, d);
  require(t.dx, "dx", "always", op, d);
  if (ln) require(t.mean, "mean", "LayerNorm", op, d);
  if (d.has_weight) {
    require(t.weight, "weight", "has_weight", op, d);
    require(t.dweight, "dweight", "has_weight", op, d);
  }
  if (ln && d.has_bias) require(t.dbias, "dbias", "has_bias", op, d);
  if (d.has_dresidual) require(t.dresidual, "dresidual", "has_dresidual", op, d);
  if (is_fp8(d.normed_dtype())) require(t.x_scale, "x_scale", "an FP8 x_dtype", op, d);
  if (make_variant(op, d).partials() > 0) {
    require(t.workspace, "workspace", "dweight / dbias partial sums", op, d);
    // Partial rows move as whole vectors of up to 8 floats.
    if (reinterpret_cast<std::uintptr_t>(t.workspace) % kWorkspaceAlignment)
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("workspace = {} is not {}-byte aligned (any cudaMalloc or PyTorch allocation is)",
                              t.workspace, kWorkspaceAlignment),
                  op_label(op, d.norm), d.str());
  }
}

}  // namespace normjit::detail
