// Names, parsing and validation of the public value types.
#include <cmath>
#include <regex>

#include <fmt/format.h>

#include "normjit/normjit.hpp"

namespace normjit {

namespace {
Error bad(const std::string& msg) { return Error(ErrorKind::InvalidArgument, msg); }
}  // namespace

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

int dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }

DType parse_dtype(const std::string& s, const char* what) {
  if (s == "fp32" || s == "f32" || s == "float32" || s == "float") return DType::F32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw bad(fmt::format("{} = '{}' is not a dtype (expected fp32, fp16 or bf16)", what, s));
}

const char* op_name(Op op) {
  switch (op) {
    case Op::RmsForward: return "rms_fwd";
    case Op::RmsBackward: return "rms_bwd";
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

const char* config_source_name(ConfigSource s) {
  switch (s) {
    case ConfigSource::Memory: return "memory";
    case ConfigSource::UserCache: return "user cache";
    case ConfigSource::ShippedCache: return "shipped cache";
    case ConfigSource::Tuned: return "tuned now";
    case ConfigSource::Heuristic: return "heuristic";
  }
  return "?";
}

// The largest N the kernels support; one place for the fact.
constexpr std::int64_t kMaxN = 262144;

void NormDesc::validate() const {
  if (M < 0) throw bad(fmt::format("M = {} must be >= 0", M));
  if (N < 1 || N > kMaxN) throw bad(fmt::format("N = {} must be in [1, {}]", N, kMaxN));
  const std::pair<const char*, std::int64_t> strides[] = {
      {"x_stride", x_stride}, {"y_stride", y_stride}, {"dy_stride", dy_stride}, {"dx_stride", dx_stride}};
  for (auto& [name, v] : strides)
    if (v != 0 && v < N) throw bad(fmt::format("{} = {} must be 0 (contiguous) or >= N = {}", name, v, N));
  for (auto [name, t] : {std::pair{"x_dtype", x_dtype}, std::pair{"y_dtype", y_dtype},
                         std::pair{"weight_dtype", weight_dtype}})
    if (static_cast<int>(t) > 2) throw bad(fmt::format("{} = {} is not a dtype", name, static_cast<int>(t)));
  if (!std::isfinite(eps) || eps < 0) throw bad(fmt::format("eps = {} must be finite and >= 0", eps));
}

std::string NormDesc::str() const {
  return fmt::format("{}x{} x={} y={} w={}", M, N, dtype_name(x_dtype), dtype_name(y_dtype),
                     dtype_name(weight_dtype));
}

std::string LaunchConfig::str() const {
  return fmt::format("v{}.t{}.r{}{}{}{}", vec, threads_per_row, rows_per_pid, two_pass ? ".2p" : "",
                     stages ? fmt::format(".s{}", stages) : "",
                     programs_per_sm ? fmt::format(".p{}", programs_per_sm) : "");
}

LaunchConfig LaunchConfig::parse(const std::string& text) {
  // At most 4 digits a field: stoi cannot overflow, and every valid value fits.
  static const std::regex re(R"(v(\d{1,4})\.t(\d{1,4})\.r(\d{1,4})(\.2p)?(?:\.s(\d{1,4}))?(?:\.p(\d{1,4}))?)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw bad(fmt::format("config = '{}' is not of the form v<vec>.t<threads>.r<rows>[.2p][.s<stages>][.p<programs>]", text));
  LaunchConfig c;
  c.vec = std::stoi(m[1]);
  c.threads_per_row = std::stoi(m[2]);
  c.rows_per_pid = std::stoi(m[3]);
  c.two_pass = m[4].matched;
  c.stages = m[5].matched ? std::stoi(m[5]) : 0;
  c.programs_per_sm = m[6].matched ? std::stoi(m[6]) : 0;
  auto pow2 = [](int v) { return v > 0 && (v & (v - 1)) == 0; };
  if (!pow2(c.vec) || c.vec > 8 || !pow2(c.threads_per_row) || c.threads_per_row > 1024 ||
      !pow2(c.rows_per_pid) || c.threads() > 1024 || c.programs_per_sm > 64 || c.stages > 8)
    throw bad(fmt::format("config = '{}' is out of range (vec <= 8, threads <= 1024, powers of two, p <= 64)", text));
  return c;
}

}  // namespace normjit
