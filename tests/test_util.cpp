// Helpers shared by the CPU test files (declared in test_util.hpp).
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <fstream>

#include <fmt/format.h>

#include "core/shape_spec.hpp"

namespace fs = std::filesystem;
using namespace normjit;

namespace normjit_test {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void check_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    FAIL_CHECK("no normjit::Error was thrown; expected one mentioning " << parts.front());
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::InvalidArgument);
    const std::string what = e.what();
    for (const auto& p : parts) CHECK_MESSAGE(contains(what, p), "'" << what << "' lacks '" << p << "'");
  }
}

/// x and y of dtype `xy`, weight of `w`, contiguous.
NormDesc make_desc(std::int64_t M, std::int64_t N, DType xy, DType w) {
  NormDesc d;
  d.M = M;
  d.N = N;
  d.x_dtype = d.y_dtype = xy;
  d.weight_dtype = w;
  return d;
}

std::vector<Variant> norm_variants(std::int64_t M, std::int64_t N, DType t, std::int64_t heads) {
  // Each feature edits a descriptor; a variant is a norm plus a set of features.
  using Edit = void (*)(NormDesc&);
  const std::vector<std::pair<const char*, Edit>> features = {
      {"nw", [](NormDesc& d) { d.has_weight = false; }},
      {"nb", [](NormDesc& d) { d.has_bias = false; }},
      {"off1", [](NormDesc& d) { d.weight_offset = 1.f; }},
      {"llama", [](NormDesc& d) { d.cast_mode = CastMode::Llama; }},
      {"gemma", [](NormDesc& d) { d.cast_mode = CastMode::Gemma; }},
      {"res", [](NormDesc& d) { d.residual = d.store_residual_out = d.has_dresidual = true; }},
      {"fp32sum", [](NormDesc& d) { d.residual_rounding = ResidualRounding::Fp32; }},
      {"mixed", [](NormDesc& d) {  // every dtype its own
         d.y_dtype = DType::F32;
         d.weight_dtype = DType::F32;
         d.residual_dtype = d.x_dtype == DType::F16 ? DType::BF16 : DType::F16;
         d.residual_out_dtype = DType::F32;
       }},
      {"3d", [](NormDesc& d) {  // a view into a fused [tokens, 3 * heads, N] projection
         d.x_stride = d.dx_stride = 3 * d.heads * d.N;
       }},
  };
  const std::vector<std::pair<NormKind, std::vector<std::string>>> sets = {
      {NormKind::RMSNorm, {}},
      {NormKind::RMSNorm, {"nw"}},
      {NormKind::RMSNorm, {"off1", "gemma"}},
      {NormKind::RMSNorm, {"llama"}},
      {NormKind::RMSNorm, {"res"}},
      {NormKind::RMSNorm, {"res", "fp32sum", "mixed"}},
      {NormKind::RMSNorm, {"3d"}},
      {NormKind::LayerNorm, {}},
      {NormKind::LayerNorm, {"nb"}},
      {NormKind::LayerNorm, {"nw", "nb"}},
      {NormKind::LayerNorm, {"nw"}},
      {NormKind::LayerNorm, {"off1", "llama"}},
      {NormKind::LayerNorm, {"res", "mixed"}},
      {NormKind::LayerNorm, {"3d"}},
  };
  std::vector<Variant> out;
  for (const auto& [norm, names] : sets) {
    NormDesc d = make_desc(M, N, t, t);
    d.norm = norm;
    d.residual_dtype = d.residual_out_dtype = t;
    if (norm == NormKind::LayerNorm) {
      d.has_bias = true;
      d.eps = 1e-5f;
    }
    std::string name = norm_kind_name(norm);
    bool skip = false;
    for (const auto& n : names) {
      if (n == "3d") {
        if (M % heads) skip = true;
        d.heads = heads;
      }
      for (const auto& [fname, edit] : features)
        if (n == fname) edit(d);
      name += "." + n;
    }
    if (skip) continue;
    d.validate();
    out.push_back({name, d});
  }
  return out;
}

/// A fresh empty directory; removed with its contents when the last copy of
/// the pointer goes.
std::shared_ptr<const fs::path> make_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  auto* dir = new fs::path(fs::temp_directory_path() / fmt::format("normjit-{}-{}-{}", tag, ::getpid(), counter++));
  fs::remove_all(*dir);
  fs::create_directories(*dir);
  return std::shared_ptr<const fs::path>(dir, [](const fs::path* p) {
    std::error_code ec;
    fs::remove_all(*p, ec);
    delete p;
  });
}

/// Writes `text` to `path`, replacing the file.
void write_text_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}


std::vector<Variant> fp8_variants(std::int64_t M, std::int64_t N, DType t) {
  // Options of the shape spec (core/shape_spec.hpp): one line a variant.
  const std::vector<std::pair<const char*, const char*>> sets = {
      {"rms", ":quant=e4m3/tensor-static"},
      {"rms", ":quant=e5m2/tensor-static:transpose"},
      {"rms", ":quant=e4m3/tensor:yhp:transpose"},
      {"ln", ":quant=e5m2/tensor"},
      {"rms", ":quant=e4m3/token"},
      {"rms", ":quant=e4m3/token:ub=0.004"},
      {"ln", ":quant=e5m2/token:res"},
      // No bias: LayerNorm's amax taken with its squared deviations; a
      // weight offset in the amax taken with the sum of squares.
      {"ln", ":quant=e4m3/token:nb"},
      {"rms", ":quant=e5m2/tensor-static:amax:off=1"},
      {"rms", ":quant=e4m3/group128"},
      {"rms", ":quant=e4m3/group128:ue8m0:colmajor"},
      {"rms", ":quant=e5m2/group16:ue8m0"},
      {"ln", ":quant=e4m3/group64:colmajor"},
      {"rms", ":quant=e4m3/group32:res:yhp"},
      {"rms", ":quant=e4m3/mx32"},
      {"ln", ":quant=e5m2/mx32"},
      {"rms", ":x=e4m3/group16"},
      {"ln", ":x=e5m2/group32"},
      {"rms", ":x=e4m3/group128:res"},
      {"rms", ":x=e4m3/group16:quant=e4m3/tensor:transpose"},
      {"ln", ":x=e4m3/group16:quant=e4m3/group128:ue8m0"},
      // The conventions' switches: Llama rounding before quantization with
      // a least scale (vLLM), a cap on group scales, amax of a static scale
      // (TransformerEngine's delayed scaling).
      {"rms", ":quant=e4m3/token:cast=llama:smin=0.0001"},
      {"rms", ":quant=e4m3/group64:ub=0.002:smin=0.00001"},
      {"rms", ":quant=e4m3/tensor-static:amax"},
      {"ln", ":quant=e5m2/tensor-static:amax:transpose"},
  };
  std::vector<Variant> out;
  for (const auto& [norm, opts] : sets) {
    // Groups (of y's scales, MX blocks, x's scales) must divide N: an odd N
    // keeps the other variants (the groups read from the spec at N = 128).
    const normjit::NormDesc g =
        normjit::detail::parse_shape_spec(fmt::format("{}:{}:1x128{}", norm, dtype_name(t), opts)).desc;
    const int group = g.quant == normjit::QuantScaling::MX ? 32 : g.quant == normjit::QuantScaling::Group ? g.quant_group : 0;
    if ((group && N % group) || (normjit::is_fp8(g.x_dtype) && N % g.x_group)) continue;
    const std::string spec = fmt::format("{}:{}:{}x{}{}", norm, dtype_name(t), M, N, opts);
    out.push_back({spec, normjit::detail::parse_shape_spec(spec).desc});
  }
  return out;
}
}  // namespace normjit_test
