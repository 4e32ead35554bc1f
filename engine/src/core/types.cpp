// Names, parsing and validation of the public value types.
#include <algorithm>
#include <cmath>
#include <regex>
#include <tuple>

#include <fmt/format.h>

#include "normjit/normjit.hpp"

#include "core/variant.hpp"

namespace normjit {

namespace {
Error bad(const std::string& msg) { return Error(ErrorKind::InvalidArgument, msg); }
}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "e4m3";
    case DType::E5M2: return "e5m2";
    case DType::E8M0: return "e8m0";
  }
  return "?";
}

int dtype_size(DType t) { return t == DType::F32 ? 4 : static_cast<int>(t) >= 3 ? 1 : 2; }

float fp8_max(DType t) { return t == DType::E4M3 ? 448.f : t == DType::E5M2 ? 57344.f : 0.f; }

DType parse_dtype(const std::string& s, const char* what) {
  if (s == "fp32" || s == "f32" || s == "float32" || s == "float") return DType::F32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "e4m3" || s == "fp8_e4m3" || s == "float8_e4m3fn") return DType::E4M3;
  if (s == "e5m2" || s == "fp8_e5m2" || s == "float8_e5m2") return DType::E5M2;
  throw bad(fmt::format("{} = '{}' is not a dtype (expected fp32, fp16, bf16, e4m3 or e5m2)", what, s));
}

const char* quant_scaling_name(QuantScaling q) {
  switch (q) {
    case QuantScaling::None: return "none";
    case QuantScaling::TensorStatic: return "tensor-static";
    case QuantScaling::Tensor: return "tensor";
    case QuantScaling::Token: return "token";
    case QuantScaling::Group: return "group";
    case QuantScaling::MX: return "mx32";
  }
  return "?";
}

const char* norm_kind_name(NormKind k) {
  switch (k) {
    case NormKind::RMSNorm: return "rms";
    case NormKind::LayerNorm: return "ln";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward: return "fwd";
    case Op::Backward: return "bwd";
  }
  return "?";
}

const char* cast_mode_name(CastMode m) {
  switch (m) {
    case CastMode::Default: return "default";
    case CastMode::Llama: return "llama";
    case CastMode::Gemma: return "gemma";
  }
  return "?";
}

CastMode parse_cast_mode(const std::string& s, const char* what) {
  if (s == "default") return CastMode::Default;
  if (s == "llama") return CastMode::Llama;
  if (s == "gemma") return CastMode::Gemma;
  throw bad(fmt::format("{} = '{}' is not one of default, llama, gemma", what, s));
}

const char* residual_rounding_name(ResidualRounding r) {
  switch (r) {
    case ResidualRounding::ResidualDtype: return "residual";
    case ResidualRounding::Fp32: return "fp32";
  }
  return "?";
}

const char* tune_policy_name(TunePolicy p) {
  switch (p) {
    case TunePolicy::Never: return "never";
    case TunePolicy::OnFirstUse: return "first";
    case TunePolicy::Always: return "always";
  }
  return "?";
}

TunePolicy parse_tune_policy(const std::string& s) {
  if (s == "never") return TunePolicy::Never;
  if (s == "first" || s == "on_first_use" || s == "on-first-use") return TunePolicy::OnFirstUse;
  if (s == "always") return TunePolicy::Always;
  throw bad(fmt::format("tune policy = '{}' is not one of never, first, always", s));
}

bool is_cache_hit(ConfigSource s) {
  return s == ConfigSource::Memory || s == ConfigSource::UserCache || s == ConfigSource::ShippedCache;
}

const char* config_source_name(ConfigSource s) {
  switch (s) {
    case ConfigSource::Memory: return "memory";
    case ConfigSource::UserCache: return "user cache";
    case ConfigSource::ShippedCache: return "shipped cache";
    case ConfigSource::Tuned: return "tuned now";
    case ConfigSource::Neighbour: return "neighbour";
    case ConfigSource::Heuristic: return "heuristic";
  }
  return "?";
}

// The largest N the kernels support; one place for the fact.
constexpr std::int64_t kMaxN = 262144;

namespace {
// The FP8 fields' part of NormDesc::validate.
void validate_fp8(const NormDesc& d) {
  if (static_cast<int>(d.quant) > 5) throw bad(fmt::format("quant = {} is not a QuantScaling", static_cast<int>(d.quant)));
  const char* qn = quant_scaling_name(d.quant);
  if (is_fp8(d.y_dtype) && d.quant == QuantScaling::None)
    throw bad(fmt::format("y_dtype = {} needs quant (tensor-static, tensor, token, group or mx32): how q is scaled",
                          dtype_name(d.y_dtype)));
  if (!is_fp8(d.y_dtype) && d.quant != QuantScaling::None)
    throw bad(fmt::format("quant = {} needs an FP8 y_dtype (e4m3 or e5m2), but y_dtype = {}", qn, dtype_name(d.y_dtype)));
  if (d.quant == QuantScaling::Group) {
    if (d.quant_group != 16 && d.quant_group != 32 && d.quant_group != 64 && d.quant_group != 128)
      throw bad(fmt::format("quant_group = {} must be 16, 32, 64 or 128", d.quant_group));
    if (d.N % d.quant_group)
      throw bad(fmt::format("quant_group = {} does not divide N = {} (a group of a row must be whole)", d.quant_group, d.N));
    // A group's lanes meet in one warp shuffle, so a group spans at most 32
    // vectors: rows must allow vectors of G / 32 elements.
    const std::int64_t least_vec = std::max(1, d.quant_group / 32);
    for (std::int64_t s : detail::row_strides(Op::Forward, d))
      if (s % least_vec)
        throw bad(fmt::format("quant_group = {} reads rows in vectors of at least {} elements, but a row stride is {} "
                              "(x_stride, y_stride, residual_stride: multiples of {})",
                              d.quant_group, least_vec, s, least_vec));
  }
  if (d.quant == QuantScaling::MX && d.N % 32)
    throw bad(fmt::format("quant = mx32 needs N a multiple of 32 (whole MX blocks), but N = {}", d.N));
  if (d.quant != QuantScaling::Group && (d.scale_ue8m0 || d.scale_col_major))
    throw bad(fmt::format("scale_ue8m0 / scale_col_major are for quant = group, but quant = {}", qn));
  if (d.scale_stride != 0 && (!d.scale_col_major || d.scale_stride < d.M))
    throw bad(fmt::format("scale_stride = {} needs scale_col_major and must be >= M = {}", d.scale_stride, d.M));
  if (!std::isfinite(d.scale_ub) || d.scale_ub < 0) throw bad(fmt::format("scale_ub = {} must be finite and >= 0", d.scale_ub));
  if (d.scale_ub != 0.f && d.quant != QuantScaling::Token && d.quant != QuantScaling::Group)
    throw bad(fmt::format("scale_ub = {} is for quant = token or group, but quant = {}", d.scale_ub, qn));
  if (!std::isfinite(d.scale_min) || d.scale_min < 0)
    throw bad(fmt::format("scale_min = {} must be finite and >= 0", d.scale_min));
  if (d.scale_min != 0.f && d.quant != QuantScaling::Token && d.quant != QuantScaling::Tensor &&
      d.quant != QuantScaling::Group)
    throw bad(fmt::format("scale_min = {} is for computed scales (quant = tensor, token or group), but quant = {}",
                          d.scale_min, qn));
  if (d.scale_min != 0.f && d.scale_min < kMinScale)
    throw bad(fmt::format("scale_min = {} is below 2^-126 (1 / scale must be finite); 0 means 2^-126", d.scale_min));
  if (d.store_amax && d.quant != QuantScaling::TensorStatic)
    throw bad(fmt::format("store_amax = true is for quant = tensor-static (current scaling writes amax anyway), but "
                          "quant = {}", qn));
  if (d.store_y_hp && d.quant == QuantScaling::None) throw bad("store_y_hp = true needs a quantized y (quant != none)");
  if (d.store_y_t) {
    if (d.quant != QuantScaling::TensorStatic && d.quant != QuantScaling::Tensor)
      throw bad(fmt::format("store_y_t = true needs one scale for the tensor (quant = tensor or tensor-static), but quant = {}", qn));
    if (d.heads != 1) throw bad(fmt::format("store_y_t = true needs 2-D rows, but heads = {}", d.heads));
  }
  if (is_fp8(d.x_dtype)) {
    if (d.cast_mode == CastMode::Llama)
      throw bad(fmt::format("cast_mode = llama rounds the normalised row to x's dtype, which x_dtype = {} cannot be",
                            dtype_name(d.x_dtype)));
    if (d.x_group != 16 && d.x_group != 32 && d.x_group != 128)
      throw bad(fmt::format("x_group = {} must be 16, 32 or 128 (x_dtype = {})", d.x_group, dtype_name(d.x_dtype)));
    if (d.N % d.x_group) throw bad(fmt::format("x_group = {} does not divide N = {} (x_dtype = {})", d.x_group, d.N, dtype_name(d.x_dtype)));
  }
}
}  // namespace

void NormDesc::validate() const {
  if (static_cast<int>(norm) > 1) throw bad(fmt::format("norm = {} is not RMSNorm (0) or LayerNorm (1)", static_cast<int>(norm)));
  if (M < 0) throw bad(fmt::format("M = {} must be >= 0", M));
  if (N < 1 || N > kMaxN) throw bad(fmt::format("N = {} must be in [1, {}]", N, kMaxN));
  if (heads < 1 || M % heads)
    throw bad(fmt::format("heads = {} must be >= 1 and divide M = {}", heads, M));
  for (auto [name, v] : {std::pair{"x_stride", x_stride}, std::pair{"y_stride", y_stride}, std::pair{"dy_stride", dy_stride},
                         std::pair{"dx_stride", dx_stride}, std::pair{"x_head_stride", x_head_stride},
                         std::pair{"y_head_stride", y_head_stride}, std::pair{"dy_head_stride", dy_head_stride},
                         std::pair{"dx_head_stride", dx_head_stride}, std::pair{"residual_stride", residual_stride},
                         std::pair{"residual_out_stride", residual_out_stride},
                         std::pair{"dresidual_stride", dresidual_stride}})
    if (v != 0 && v < N) throw bad(fmt::format("{} = {} must be 0 (contiguous) or >= N = {}", name, v, N));
  if (heads > 1) {
    // Rows of a 3-D tensor must not overlap: token-major (heads inside a
    // token) or head-major (a transposed [heads, tokens, N] tensor).
    const std::int64_t tokens = M / heads;
    for (auto [name, ld, hs] : {std::tuple{"x", x_ld(), x_hs()}, std::tuple{"y", y_ld(), y_hs()},
                                std::tuple{"dy", dy_ld(), dy_hs()}, std::tuple{"dx", dx_ld(), dx_hs()}})
      if (!(ld >= (heads - 1) * hs + N) && !(hs >= (tokens - 1) * ld + N))
        throw bad(fmt::format("{}_stride = {} and {}_head_stride = {} make rows of {} heads x {} overlap", name, ld, name,
                              hs, heads, N));
  }
  for (auto [name, t, fp8] : {std::tuple{"x_dtype", x_dtype, true}, std::tuple{"y_dtype", y_dtype, true},
                              std::tuple{"weight_dtype", weight_dtype, false},
                              std::tuple{"residual_dtype", residual_dtype, false},
                              std::tuple{"residual_out_dtype", residual_out_dtype, false},
                              std::tuple{"y_hp_dtype", y_hp_dtype, false}, std::tuple{"grad_dtype", grad_dtype, false}}) {
    if (static_cast<int>(t) > 4) throw bad(fmt::format("{} = {} is not a dtype", name, static_cast<int>(t)));
    if (is_fp8(t) && !fp8)
      throw bad(fmt::format("{} = {}: FP8 is for x and y only (expected fp32, fp16 or bf16)", name, dtype_name(t)));
  }
  validate_fp8(*this);
  if (!std::isfinite(eps) || eps < 0) throw bad(fmt::format("eps = {} must be finite and >= 0", eps));
  if (!std::isfinite(weight_offset)) throw bad(fmt::format("weight_offset = {} must be finite", weight_offset));
  if (weight_offset != 0.f && !has_weight)
    throw bad(fmt::format("weight_offset = {} needs has_weight = true (there is no weight to offset)", weight_offset));
  if (has_bias && norm != NormKind::LayerNorm) throw bad("has_bias = true: a bias is LayerNorm only (norm = rms)");
  if (static_cast<int>(cast_mode) > 2) throw bad(fmt::format("cast_mode = {} is not a CastMode", static_cast<int>(cast_mode)));
  if (static_cast<int>(residual_rounding) > 1)
    throw bad(fmt::format("residual_rounding = {} is not a ResidualRounding", static_cast<int>(residual_rounding)));
  if (residual && heads != 1) throw bad(fmt::format("residual = true needs 2-D rows, but heads = {}", heads));
  if (store_residual_out && !residual) throw bad("store_residual_out = true needs residual = true");
  if (has_dresidual && !residual) throw bad("has_dresidual = true needs residual = true");
}

void ShardedNormDesc::validate() const {
  if (static_cast<int>(norm) > 1) throw bad(fmt::format("norm = {} is not RMSNorm (0) or LayerNorm (1)", static_cast<int>(norm)));
  if (M < 0) throw bad(fmt::format("M = {} must be >= 0", M));
  if (N < 1 || N > kMaxN) throw bad(fmt::format("N = {} must be in [1, {}]", N, kMaxN));
  if (N_total < N || N_total > (std::int64_t{1} << 40))
    throw bad(fmt::format("N_total = {} must be in [N = {}, 2^40] (the hidden size every rank's N sums to)", N_total, N));
  if (M > (std::int64_t{1} << 40) / N) throw bad(fmt::format("M = {} x N = {} elements exceed 2^40", M, N));
  for (auto [name, t] : {std::pair{"x_dtype", x_dtype}, std::pair{"y_dtype", y_dtype},
                         std::pair{"weight_dtype", weight_dtype}})
    if (static_cast<int>(t) > 2) throw bad(fmt::format("{} = {} is not fp32, fp16 or bf16", name, static_cast<int>(t)));
  if (!std::isfinite(eps) || eps < 0) throw bad(fmt::format("eps = {} must be finite and >= 0", eps));
  if (!std::isfinite(weight_offset)) throw bad(fmt::format("weight_offset = {} must be finite", weight_offset));
  if (weight_offset != 0.f && !has_weight)
    throw bad(fmt::format("weight_offset = {} needs has_weight = true (there is no weight to offset)", weight_offset));
  if (has_bias && norm != NormKind::LayerNorm) throw bad("has_bias = true: a bias is LayerNorm only (norm = rms)");
}

std::string ShardedNormDesc::str() const {
  std::string s = fmt::format("{} {}x{}/{} x={} y={} w={}", norm_kind_name(norm), M, N, N_total, dtype_name(x_dtype),
                              dtype_name(y_dtype), dtype_name(weight_dtype));
  if (!has_weight) s += " no-weight";
  if (has_bias) s += " bias";
  if (weight_offset != 0.f) s += fmt::format(" offset={}", weight_offset);
  return s;
}

std::string NormDesc::str() const {
  std::string s = fmt::format("{} {}x{} x={} y={} w={}", norm_kind_name(norm), M, N, dtype_name(x_dtype),
                              dtype_name(y_dtype), dtype_name(weight_dtype));
  if (heads > 1) s += fmt::format(" heads={}", heads);
  if (!has_weight) s += " no-weight";
  if (has_bias) s += " bias";
  if (weight_offset != 0.f) s += fmt::format(" offset={}", weight_offset);
  if (residual)
    s += fmt::format(" residual={}{} sum={}", dtype_name(residual_dtype),
                     store_residual_out ? fmt::format(" residual_out={}", dtype_name(residual_out_dtype)) : "",
                     residual_rounding_name(residual_rounding));
  if (cast_mode != CastMode::Default) s += fmt::format(" cast={}", cast_mode_name(cast_mode));
  if (is_fp8(x_dtype)) s += fmt::format(" x_group={}", x_group);
  if (quant != QuantScaling::None) {
    s += fmt::format(" quant={}", quant_scaling_name(quant));
    if (quant == QuantScaling::Group)
      s += fmt::format("{}{}{}", quant_group, scale_ue8m0 ? ":ue8m0" : "", scale_col_major ? ":colmajor" : "");
    if (scale_ub != 0.f) s += fmt::format(" scale_ub={}", scale_ub);
    if (scale_min != 0.f) s += fmt::format(" scale_min={}", scale_min);
    if (store_amax) s += " amax";
    if (store_y_hp) s += fmt::format(" y_hp={}", dtype_name(y_hp_dtype));
    if (store_y_t) s += " transpose";
  }
  return s;
}

std::string LaunchConfig::str() const {
  return fmt::format("v{}.t{}.r{}{}{}{}{}{}", vec, threads_per_row, rows_per_pid,
                     cluster > 1 ? fmt::format(".c{}", cluster) : "", two_pass ? ".2p" : "", dw_cluster ? ".dc" : "",
                     stages ? fmt::format(".s{}", stages) : "",
                     programs_per_sm ? fmt::format(".p{}", programs_per_sm) : "");
}

LaunchConfig LaunchConfig::parse(const std::string& text) {
  // At most 4 digits a field: stoi cannot overflow, and every valid value fits.
  static const std::regex re(R"(v(\d{1,4})\.t(\d{1,4})\.r(\d{1,4})(?:\.c(\d{1,2}))?(\.2p)?(\.dc)?(?:\.s(\d{1,4}))?(?:\.p(\d{1,4}))?)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw bad(fmt::format("config = '{}' is not of the form v<vec>.t<threads>.r<rows>[.c<cluster>][.2p][.dc][.s<stages>][.p<programs>]", text));
  LaunchConfig c;
  c.vec = std::stoi(m[1]);
  c.threads_per_row = std::stoi(m[2]);
  c.rows_per_pid = std::stoi(m[3]);
  c.cluster = m[4].matched ? std::stoi(m[4]) : 1;
  c.two_pass = m[5].matched;
  c.dw_cluster = m[6].matched;
  c.stages = m[7].matched ? std::stoi(m[7]) : 0;
  c.programs_per_sm = m[8].matched ? std::stoi(m[8]) : 0;
  auto pow2 = [](int v) { return v > 0 && (v & (v - 1)) == 0; };
  if (!pow2(c.vec) || c.vec > 8 || !pow2(c.threads_per_row) || c.threads_per_row > 1024 ||
      !pow2(c.rows_per_pid) || c.threads() > 1024 || c.programs_per_sm > 64 || c.stages > 8 || !pow2(c.cluster) || c.cluster > kMaxCluster ||
      (c.dw_cluster && c.cluster < 2))
    throw bad(fmt::format("config = '{}' is out of range (vec <= 8, threads <= 1024, cluster <= {}, powers of two, p <= 64, "
                          ".dc with a cluster)",
                          text, kMaxCluster));
  return c;
}

}  // namespace normjit
