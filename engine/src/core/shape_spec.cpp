#include "core/shape_spec.hpp"

#include <regex>

#include <fmt/format.h>

namespace normjit::detail {

float default_eps(NormKind k) { return k == NormKind::LayerNorm ? 1e-5f : 1e-6f; }

namespace {
// One ":key[=val]" option of a shape spec applied to `d`.
void apply_option(NormDesc& d, const std::string& key, const std::string& val) {
  // quant=<e4m3|e5m2>/<tensor|tensor-static|token|group<G>|mx32>, x=<e4m3|e5m2>/group<QB>
  static const std::regex quant_re(R"((e4m3|e5m2)/(tensor|tensor-static|token|group(\d{1,3})|mx32))");
  static const std::regex xfp8_re(R"((e4m3|e5m2)/group(\d{1,3}))");
  auto num = [&] { return std::stoll(val); };
  if (key == "w") d.weight_dtype = parse_dtype(val, "w");
  else if (key == "y") d.y_dtype = parse_dtype(val, "y");
  else if (key == "res") {  // fused residual add, h written in the residual's dtype
    d.residual = d.store_residual_out = true;
    if (!val.empty()) d.residual_dtype = d.residual_out_dtype = parse_dtype(val, "res");
  } else if (key == "fp32sum") d.residual_rounding = ResidualRounding::Fp32;
  else if (key == "dres") d.has_dresidual = true;
  else if (key == "nw") d.has_weight = false;
  else if (key == "nb") d.has_bias = false;
  else if (key == "off") d.weight_offset = std::stof(val);
  else if (key == "cast") d.cast_mode = parse_cast_mode(val, "cast");
  else if (key == "eps") d.eps = std::stof(val);
  else if (key == "heads") d.heads = num();
  else if (key == "x_stride") d.x_stride = d.dx_stride = num();  // a view: x and dx alike
  else if (key == "ro") d.residual_out_dtype = parse_dtype(val, "ro");
  else if (key == "noro") d.store_residual_out = false;
  else if (key == "norstd") d.store_rstd = false;
  else if (key == "nomean") d.store_mean = false;
  else if (key == "quant") {
    std::smatch q;
    if (!std::regex_match(val, q, quant_re))
      throw Error(ErrorKind::InvalidArgument,
                  fmt::format("quant = '{}' is not <e4m3|e5m2>/<tensor|tensor-static|token|group<G>|mx32>", val));
    d.y_dtype = parse_dtype(q[1], "quant");
    const std::string g = q[2];
    d.quant = g == "tensor" ? QuantScaling::Tensor : g == "tensor-static" ? QuantScaling::TensorStatic
              : g == "token" ? QuantScaling::Token : g == "mx32" ? QuantScaling::MX : QuantScaling::Group;
    if (q[3].matched) d.quant_group = std::stoi(q[3]);
  } else if (key == "x") {
    std::smatch q;
    if (!std::regex_match(val, q, xfp8_re))
      throw Error(ErrorKind::InvalidArgument, fmt::format("x = '{}' is not <e4m3|e5m2>/group<QB>", val));
    d.x_dtype = parse_dtype(q[1], "x");
    d.x_group = std::stoi(q[2]);
  } else if (key == "ue8m0") d.scale_ue8m0 = true;
  else if (key == "colmajor") d.scale_col_major = true;
  else if (key == "ub") d.scale_ub = std::stof(val);
  else if (key == "smin") d.scale_min = std::stof(val);
  else if (key == "amax") d.store_amax = true;
  else if (key == "yhp") {
    d.store_y_hp = true;
    if (!val.empty()) d.y_hp_dtype = parse_dtype(val, "yhp");
  } else if (key == "transpose") d.store_y_t = true;
  else if (key == "grad") d.grad_dtype = parse_dtype(val, "grad");
  else throw Error(ErrorKind::InvalidArgument, fmt::format("option '{}' is not one of w, y, res, fp32sum, dres, nw, nb, off, cast, eps, heads, x_stride, ro, noro, norstd, nomean, quant, x, ue8m0, colmajor, ub, smin, amax, yhp, transpose, grad", key));
}
}  // namespace

NamedShape parse_shape_spec(const std::string& text) {
  static const std::regex head(R"((rms|ln):([a-z0-9]+):(\d+)x(\d+)((?::[a-z_0-9]+(?:=[a-z0-9.+/-]+)?)*))");
  static const std::regex option(R"(:([a-z_0-9]+)(?:=([a-z0-9.+/-]+))?)");
  // std::regex matches by recursion, a few frames a character: a spec of
  // ~100k characters (a damaged tuned-cache entry's shape) overflowed the stack.
  constexpr std::size_t kMaxSpecLength = 1024;
  if (text.size() > kMaxSpecLength)
    throw Error(ErrorKind::InvalidArgument, fmt::format("--shape '{}...' is {} characters long; a shape spec has at most {}",
                                                        text.substr(0, 40), text.size(), kMaxSpecLength));
  std::smatch m;
  if (!std::regex_match(text, m, head))
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("--shape '{}' is not of the form <rms|ln>:<dtype>:<M>x<N>[:<option>]... "
                            "(e.g. rms:bf16:8192x4096, ln:fp16:4096x4096:nb, rms:bf16:32768x128:heads=32:x_stride=6144)",
                            text));
  NamedShape s;
  s.name = text;
  NormDesc& d = s.desc;
  try {
    d.norm = m[1] == "ln" ? NormKind::LayerNorm : NormKind::RMSNorm;
    d.x_dtype = d.y_dtype = d.weight_dtype = d.residual_dtype = d.residual_out_dtype = parse_dtype(m[2], "dtype");
    d.M = std::stoll(m[3]);
    d.N = std::stoll(m[4]);
    d.eps = default_eps(d.norm);
    d.has_bias = d.norm == NormKind::LayerNorm;  // as torch.nn.LayerNorm
    d.y_hp_dtype = d.grad_dtype = d.x_dtype;
    const std::string opts = m[5];
    for (std::sregex_iterator it(opts.begin(), opts.end(), option), end; it != end; ++it) {
      apply_option(d, (*it)[1], (*it)[2]);
    }
    d.validate();
  } catch (const Error& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--shape '{}': {}", text, e.message()));
  } catch (const std::exception&) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--shape '{}': a number is out of range", text));
  }
  return s;
}

std::string shape_spec(const NormDesc& d) {
  const bool ln = d.norm == NormKind::LayerNorm;
  // The head dtype is x's, or the weight's for an FP8 x (given by x=...).
  const DType head = is_fp8(d.x_dtype) ? d.weight_dtype : d.x_dtype;
  std::string s = fmt::format("{}:{}:{}x{}", ln ? "ln" : "rms", dtype_name(head), d.M, d.N);
  if (d.y_dtype != head && !is_fp8(d.y_dtype)) s += fmt::format(":y={}", dtype_name(d.y_dtype));
  if (d.weight_dtype != head) s += fmt::format(":w={}", dtype_name(d.weight_dtype));
  if (d.residual) {
    s += fmt::format(":res={}", dtype_name(d.residual_dtype));
    if (d.residual_out_dtype != d.residual_dtype) s += fmt::format(":ro={}", dtype_name(d.residual_out_dtype));
    if (!d.store_residual_out) s += ":noro";
    if (d.residual_rounding == ResidualRounding::Fp32) s += ":fp32sum";
  }
  if (d.has_dresidual) s += ":dres";
  if (!d.has_weight) s += ":nw";
  if (ln && !d.has_bias) s += ":nb";
  if (d.weight_offset != 0.f) s += fmt::format(":off={}", d.weight_offset);
  if (d.cast_mode != CastMode::Default) s += fmt::format(":cast={}", cast_mode_name(d.cast_mode));
  if (d.heads > 1) s += fmt::format(":heads={}", d.heads);
  if (!d.store_rstd) s += ":norstd";
  if (ln && !d.store_mean) s += ":nomean";
  if (is_fp8(d.x_dtype)) s += fmt::format(":x={}/group{}", dtype_name(d.x_dtype), d.x_group);
  if (d.quant != QuantScaling::None) {
    s += fmt::format(":quant={}/{}", dtype_name(d.y_dtype),
                     d.quant == QuantScaling::Group ? fmt::format("group{}", d.quant_group) : quant_scaling_name(d.quant));
    if (d.scale_ue8m0) s += ":ue8m0";
    if (d.scale_col_major) s += ":colmajor";
    if (d.scale_ub != 0.f) s += fmt::format(":ub={}", d.scale_ub);
    if (d.scale_min != 0.f) s += fmt::format(":smin={}", d.scale_min);
    if (d.store_amax) s += ":amax";
    if (d.store_y_hp) s += fmt::format(":yhp={}", dtype_name(d.y_hp_dtype));
    if (d.store_y_t) s += ":transpose";
  }
  if ((is_fp8(d.x_dtype) || is_fp8(d.y_dtype)) && d.grad_dtype != head)
    s += fmt::format(":grad={}", dtype_name(d.grad_dtype));
  return s;
}

std::string full_shape_spec(const NormDesc& d) {
  std::string s = shape_spec(d);
  if (d.x_stride != 0) s += fmt::format(":x_stride={}", d.x_stride);
  return s + fmt::format(":eps={}", d.eps);
}


}  // namespace normjit::detail
