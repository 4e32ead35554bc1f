#include "runtime/plan.hpp"

#include <algorithm>
#include <cstring>

#include "core/hash.hpp"  // header-only xxHash

#include "runtime/ops.hpp"

namespace normjit::detail {

namespace {
std::int64_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
template <class... A>
std::array<std::int64_t, sizeof...(A)> words(A... a) {
  return {static_cast<std::int64_t>(a)...};
}
}  // namespace

// A field added to NormDesc changes its size: add it to plan_key too (a plan
// reused across descriptors that differ in it would launch the wrong kernel).
static_assert(sizeof(NormDesc) == 192, "NormDesc changed: update plan_key and this size");

std::size_t PlanKeyHash::operator()(const PlanKey& k) const {
  return static_cast<std::size_t>(XXH3_64bits(k.w.data(), sizeof k.w));
}

std::int64_t alignment_classes(const void* const* ptrs, int n) {
  // Each pointer's address modulo 16, or null, as a digit in base 17: the
  // residue, not just the alignment, because a peeled row's tensors must
  // start at the same place in a vector (fit_alignment). Vectors are at most
  // 16 bytes, so addresses alike modulo 16 are alike. 17^13 < 2^63.
  std::int64_t word = 0;
  for (int i = n - 1; i >= 0; --i) {
    const auto p = reinterpret_cast<std::uintptr_t>(ptrs[i]);
    word = word * 17 + (p ? static_cast<std::int64_t>(p % 16) + 1 : 0);
  }
  return word;
}

PlanKey plan_key(Op op, const NormDesc& d, std::int64_t alignment) {
  PlanKey k;
  // words() checks the count: a field left out no longer fits PlanKey.
  k.w = words(op, d.norm, d.M, d.N, d.heads, d.x_stride, d.y_stride, d.dy_stride, d.dx_stride, d.x_head_stride,
              d.y_head_stride, d.dy_head_stride, d.dx_head_stride, d.residual_stride, d.residual_out_stride,
              d.dresidual_stride, d.x_dtype, d.y_dtype, d.weight_dtype, d.residual_dtype, d.residual_out_dtype,
              bits(d.eps), d.has_weight, d.has_bias, bits(d.weight_offset), d.residual, d.store_residual_out,
              d.residual_rounding, d.has_dresidual, d.cast_mode, d.store_rstd, d.store_mean, d.quant, d.quant_group,
              d.scale_ue8m0, d.scale_col_major, d.scale_stride, bits(d.scale_ub), d.store_y_hp, d.y_hp_dtype,
              d.store_y_t, d.x_group, d.grad_dtype, bits(d.scale_min), d.store_amax, alignment);
  return k;
}

PlanKey plan_key(const NormDesc& d, const ForwardTensors& t) {
  const void* p[] = {t.x, t.residual, t.weight, t.bias, t.y, t.residual_out, t.mean,
                     t.rstd, t.x_scale, t.y_scale, t.amax, t.y_hp, t.y_t};
  return plan_key(Op::Forward, d, alignment_classes(p, 13));
}

PlanKey plan_key(const NormDesc& d, const BackwardTensors& t) {
  const void* p[] = {t.dy, t.x, t.weight, t.mean, t.rstd, t.dresidual, t.x_scale, t.dx, t.dweight, t.dbias,
                     t.workspace};
  return plan_key(Op::Backward, d, alignment_classes(p, 11));
}

void Plan::forward(const ForwardTensors& t, CUstream s) const {
  launch_forward(*kernel, desc, layout, t, geometry, resident, qt_cols, s);
}

void Plan::backward(const BackwardTensors& t, CUstream s) const {
  launch_backward(*kernel, finalize.get(), layout, t, geometry, s);
}

}  // namespace normjit::detail
