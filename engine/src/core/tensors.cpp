#include "core/tensors.hpp"

namespace normjit::detail {

std::int64_t TensorSpec::span() const { return rows == 0 ? 0 : offset(rows - 1) + cols; }

std::vector<TensorSpec> op_tensors(Op op, const NormDesc& d) {
  const bool ln = d.norm == NormKind::LayerNorm;
  auto rows = [&](const char* name, bool out, DType t, std::int64_t ld, std::int64_t hs, std::int64_t heads) {
    return TensorSpec{name, out, t, d.M, heads, ld, hs, d.N};
  };
  auto vec = [&](const char* name, bool out, DType t, std::int64_t n) { return TensorSpec{name, out, t, 1, 1, n, n, n}; };
  std::vector<TensorSpec> v;
  const std::int64_t H = d.heads;
  // [M, cols], rows one after another: FP8 x scales ([M, N / x_group] fp32), group and MX scales.
  auto dense = [&](const char* name, bool out, DType t, std::int64_t cols) {
    return TensorSpec{name, out, t, d.M, 1, cols, cols, cols};
  };
  auto x_scale = [&] { return dense("x_scale", false, DType::F32, d.x_groups()); };
  if (op == Op::Forward) {
    v.push_back(rows("x", false, d.x_dtype, d.x_ld(), d.x_hs(), H));
    if (is_fp8(d.x_dtype)) v.push_back(x_scale());
    if (d.quant == QuantScaling::TensorStatic) v.push_back(vec("y_scale", false, DType::F32, 1));
    if (d.residual) v.push_back(rows("residual", false, d.residual_dtype, d.residual_ld(), d.N, 1));
    if (d.has_weight) v.push_back(vec("weight", false, d.weight_dtype, d.N));
    if (ln && d.has_bias) v.push_back(vec("bias", false, d.weight_dtype, d.N));
    v.push_back(rows("y", true, d.y_dtype, d.y_ld(), d.y_hs(), H));
    if (d.store_residual_out)
      v.push_back(rows("residual_out", true, d.residual_out_dtype, d.residual_out_ld(), d.N, 1));
    if (ln && d.store_mean) v.push_back(vec("mean", true, DType::F32, d.M));
    if (d.store_rstd) v.push_back(vec("rstd", true, DType::F32, d.M));
    switch (d.quant) {
      case QuantScaling::None: break;
      case QuantScaling::TensorStatic:
        if (d.store_amax) v.push_back(vec("amax", true, DType::F32, 1));
        break;
      case QuantScaling::Tensor:
        v.push_back(vec("y_scale", true, DType::F32, 1));
        v.push_back(vec("amax", true, DType::F32, 1));
        break;
      case QuantScaling::Token: v.push_back(vec("y_scale", true, DType::F32, d.M)); break;
      case QuantScaling::Group:
        v.push_back(d.scale_col_major
                        ? TensorSpec{"y_scale", true, DType::F32, d.quant_groups(), 1, d.scale_ld(), d.scale_ld(), d.M}
                        : dense("y_scale", true, DType::F32, d.quant_groups()));
        break;
      case QuantScaling::MX: v.push_back(dense("y_scale", true, DType::E8M0, d.quant_groups())); break;
    }
    if (d.quant != QuantScaling::None && d.store_y_hp) v.push_back(rows("y_hp", true, d.y_hp_dtype, d.y_ld(), d.y_hs(), H));
    if (d.store_y_t) v.push_back(TensorSpec{"y_t", true, d.y_dtype, d.N, 1, d.M, d.M, d.M});
  } else {
    v.push_back(rows("dy", false, d.dy_dtype(), d.dy_ld(), d.dy_hs(), H));
    if (d.residual) {
      v.push_back(rows("x", false, d.residual_out_dtype, d.residual_out_ld(), d.N, 1));
    } else {
      v.push_back(rows("x", false, d.x_dtype, d.x_ld(), d.x_hs(), H));
      if (is_fp8(d.x_dtype)) v.push_back(x_scale());
    }
    if (d.has_weight) v.push_back(vec("weight", false, d.weight_dtype, d.N));
    if (ln) v.push_back(vec("mean", false, DType::F32, d.M));
    v.push_back(vec("rstd", false, DType::F32, d.M));
    if (d.has_dresidual) v.push_back(rows("dresidual", false, d.residual_out_dtype, d.dresidual_ld(), d.N, 1));
    v.push_back(rows("dx", true, d.dx_dtype(), d.dx_ld(), d.dx_hs(), H));
    if (d.has_weight) v.push_back(vec("dweight", true, d.weight_dtype, d.N));
    if (ln && d.has_bias) v.push_back(vec("dbias", true, d.weight_dtype, d.N));
  }
  return v;
}

double traffic_bytes(Op op, const NormDesc& d) {
  double b = 0;
  for (const auto& t : op_tensors(op, d)) b += t.traffic_bytes();
  return b;
}

}  // namespace normjit::detail
