#include "core/variant.hpp"

#include <fmt/format.h>

namespace normjit::detail {

// A field added to Variant must reach the shape key (tags) and the kernel's
// prelude (KernelSpec::source): add it to both and to the keys test
// (tests/test_kernel_hash.cpp), then update this size.
static_assert(sizeof(Variant) == 44, "Variant changed: update Variant::tags, KernelSpec::source and this size");

std::string op_label(Op op, NormKind norm) { return fmt::format("{}_{}", norm_kind_name(norm), op_name(op)); }

std::string Variant::tags(KernelKind kind) const {
  const bool fwd = kind == KernelKind::Forward;
  std::string s = fmt::format("{}:x={}:y={}:w={}", op_label(fwd ? Op::Forward : Op::Backward, norm), dtype_name(x),
                              dtype_name(y), dtype_name(w));
  if (!has_w) s += ":nw";
  if (has_b) s += ":bias";
  if (w_offset != 0.f) s += fmt::format(":off={}", w_offset);
  if (fwd && residual)
    s += fmt::format(":res={}{}:h={}{}", dtype_name(r), store_res ? fmt::format(":ro={}", dtype_name(ro)) : "",
                     dtype_name(h), round_res ? "" : ":fp32sum");
  if (!fwd && dx != x) s += fmt::format(":dx={}", dtype_name(dx));
  if (!fwd && dres) s += fmt::format(":dres={}", dtype_name(ro));
  if (fwd && llama) s += ":llama";
  if (heads) s += ":3d";
  if (fwd && store_mean) s += ":mean";
  if (fwd && store_rstd) s += ":rstd";
  if (xgroup) s += fmt::format(":xg={}", xgroup);
  if (fwd && quant != QuantScaling::None) {
    s += fmt::format(":q={}", quant_scaling_name(quant));
    if (quant == QuantScaling::Group) s += fmt::format("{}{}{}", qgroup, ue8m0 ? ":ue8m0" : "", colmajor ? ":colmajor" : "");
    if (store_yhp) s += fmt::format(":yhp={}", dtype_name(yhp));
    if (store_yt) s += yt_by_rows ? ":yt=rows" : ":yt";
    if (store_amax) s += ":amax";
  }
  return s;
}

std::vector<std::int64_t> row_strides(Op op, const NormDesc& d) {
  const bool h3 = d.heads > 1;  // head strides exist for 3-D rows only
  if (op == Op::Forward)
    return {d.x_ld(), h3 ? d.x_hs() : 0, d.y_ld(), h3 ? d.y_hs() : 0, d.residual ? d.residual_ld() : 0,
            d.store_residual_out ? d.residual_out_ld() : 0};
  // The backward of a fused residual add reads h (residual_out) as its x.
  return {d.dy_ld(), h3 ? d.dy_hs() : 0, d.residual ? d.residual_out_ld() : d.x_ld(), h3 ? d.x_hs() : 0, d.dx_ld(),
          h3 ? d.dx_hs() : 0, d.has_dresidual ? d.dresidual_ld() : 0};
}

bool transposed_by_rows(const NormDesc& d) {
  // Measured on an H100: 229K byte stores (32 x 7168) added 9.7 us, about
  // 42 ps each; up to 2^15 cost less than a launch (about 2 us at decode).
  // One row's transpose is the row itself.
  return d.store_y_t && (d.M == 1 || d.M * d.N <= (1LL << 15));
}

Variant make_variant(Op op, const NormDesc& d) {
  Variant v;
  const bool fwd = op == Op::Forward;
  const bool ln = d.norm == NormKind::LayerNorm;
  v.norm = d.norm;
  v.x = fwd ? d.x_dtype : d.normed_dtype();
  v.y = d.y_dtype;
  v.w = d.weight_dtype;
  v.has_w = d.has_weight;
  v.has_b = ln && d.has_bias;
  v.w_offset = d.has_weight ? d.weight_offset : 0.f;
  v.heads = d.heads > 1;
  v.h = v.r = v.ro = v.dx = v.x;
  if (fwd) {
    v.residual = d.residual;
    if (d.residual) {
      v.r = d.residual_dtype;
      v.store_res = d.store_residual_out;
      v.ro = d.store_residual_out ? d.residual_out_dtype : v.x;
      v.round_res = d.residual_rounding == ResidualRounding::ResidualDtype;
      v.h = v.round_res ? d.residual_dtype : DType::F32;
    }
    v.llama = d.cast_mode == CastMode::Llama;
    v.store_rstd = d.store_rstd;
    v.store_mean = ln && d.store_mean;
    // An FP8 x is dequantized on load: a cached row is fp32.
    if (is_fp8(d.x_dtype) && !d.residual) v.h = DType::F32;
    v.quant = d.quant;
    if (d.quant == QuantScaling::Group) v.qgroup = d.quant_group;
    if (d.quant == QuantScaling::MX) v.qgroup = 32;
    v.ue8m0 = d.quant == QuantScaling::Group && d.scale_ue8m0;
    v.colmajor = d.quant == QuantScaling::Group && d.scale_col_major;
    v.store_yhp = d.quant != QuantScaling::None && d.store_y_hp;
    if (v.store_yhp) v.yhp = d.y_hp_dtype;
    v.store_yt = d.store_y_t;
    v.yt_by_rows = transposed_by_rows(d);
    v.store_amax = d.quant == QuantScaling::TensorStatic && d.store_amax;
  } else {
    v.y = d.dy_dtype();
    v.dx = d.dx_dtype();
    v.dres = d.has_dresidual;
    if (d.has_dresidual) v.ro = d.residual_out_dtype;
  }
  if (is_fp8(v.x)) v.xgroup = d.x_group;
  return v;
}

std::int64_t m_bucket(std::int64_t M) {
  constexpr std::int64_t kCap = 65536;
  if (M <= 0) return 0;
  if (M >= kCap) return kCap;
  std::int64_t b = 1;
  while (b < M) b *= 2;
  return b;
}

std::string shape_key(Op op, const NormDesc& desc) {
  const KernelKind kind = op == Op::Forward ? KernelKind::Forward : KernelKind::Backward;
  return fmt::format("{}:N={}:M<={}", make_variant(op, desc).tags(kind), desc.N, m_bucket(desc.M));
}


Op shape_key_op(const std::string& key) {
  const std::string label = key.substr(0, key.find(':'));
  if (label.size() > 4 && label.compare(label.size() - 4, 4, "_fwd") == 0) return Op::Forward;
  if (label.size() > 4 && label.compare(label.size() - 4, 4, "_bwd") == 0) return Op::Backward;
  throw Error(ErrorKind::InvalidArgument, fmt::format("shape key '{}' names neither a forward nor a backward", key));
}

}  // namespace normjit::detail
