// Descriptors, parsers and argument checks of the public API, shape specs and
// model configs, host-side fp16/bf16 conversions. No GPU or driver needed.
#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/host_dtype.hpp"
#include "test_util.hpp"
#include "models/model_norms.hpp"

using namespace normjit;
using namespace normjit::detail;
namespace fs = std::filesystem;


using namespace normjit_test;  // shared helpers (test_util.hpp)

namespace {

void check_invalid_desc(const NormDesc& d, const std::vector<std::string>& parts) {
  check_invalid([&] { d.validate(); }, parts);
}

}  // namespace

// ---- NormDesc ---------------------------------------------------------------

TEST_CASE("descriptors: NormDesc::validate names the bad field and its value") {
  check_invalid_desc(make_desc(-1, 64), {"M = -1"});
  check_invalid_desc(make_desc(8, 0), {"N = 0"});
  check_invalid_desc(make_desc(8, -5), {"N = -5"});
  check_invalid_desc(make_desc(8, 262145), {"N = 262145", "262144"});

  std::int64_t NormDesc::*const strides[] = {&NormDesc::x_stride, &NormDesc::y_stride, &NormDesc::dy_stride,
                                             &NormDesc::dx_stride};
  const std::string names[] = {"x_stride", "y_stride", "dy_stride", "dx_stride"};
  for (int i = 0; i < 4; ++i) {
    CAPTURE(names[i]);
    NormDesc d = make_desc(8, 64);
    d.*strides[i] = 63;
    check_invalid_desc(d, {fmt::format("{} = 63", names[i]), "64"});
    d.*strides[i] = -64;
    check_invalid_desc(d, {fmt::format("{} = -64", names[i])});
    d.*strides[i] = 64;
    CHECK_NOTHROW(d.validate());
  }

  NormDesc d = make_desc(8, 64);
  d.eps = std::numeric_limits<float>::quiet_NaN();
  check_invalid_desc(d, {"eps = nan"});
  d.eps = -1.f;
  check_invalid_desc(d, {"eps = -1"});
  d.eps = std::numeric_limits<float>::infinity();
  check_invalid_desc(d, {"eps = inf"});
  d = make_desc(8, 64);
  d.weight_dtype = static_cast<DType>(7);
  check_invalid_desc(d, {"weight_dtype = 7"});
}

TEST_CASE("descriptors: valid descriptors pass, str() describes them") {
  const std::pair<std::int64_t, std::int64_t> sizes[] = {{0, 1}, {1, 1}, {8192, 4096}, {3, 262144}};
  for (const auto& [M, N] : sizes) {
    CAPTURE(M);
    CAPTURE(N);
    CHECK_NOTHROW(make_desc(M, N).validate());
  }
  NormDesc d = make_desc(8192, 4096);
  d.x_stride = 4096;
  d.y_stride = 5000;
  d.dy_stride = 8192;
  d.dx_stride = 4097;
  d.eps = 0.f;
  CHECK_NOTHROW(d.validate());
  CHECK(d.x_ld() == 4096);
  CHECK(d.y_ld() == 5000);
  CHECK(make_desc(2, 7).dx_ld() == 7);
  d.x_dtype = DType::F32;
  d.weight_dtype = DType::F16;
  CHECK(d.str() == "rms 8192x4096 x=fp32 y=bf16 w=fp16");
}

TEST_CASE("descriptors: every variant field is validated, naming the field and its value") {
  auto base = [] {
    NormDesc d = make_desc(64, 128);
    d.norm = NormKind::LayerNorm;
    return d;
  };
  struct Case {
    void (*edit)(NormDesc&);
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {[](NormDesc& d) { d.norm = static_cast<NormKind>(7); }, {"norm = 7"}},
      {[](NormDesc& d) { d.heads = 0; }, {"heads = 0"}},
      {[](NormDesc& d) { d.heads = 3; }, {"heads = 3", "divide M = 64"}},
      {[](NormDesc& d) { d.x_head_stride = 100; }, {"x_head_stride = 100", "N = 128"}},
      {[](NormDesc& d) { d.residual_stride = 5; }, {"residual_stride = 5"}},
      {[](NormDesc& d) { d.residual_out_stride = 5; }, {"residual_out_stride = 5"}},
      {[](NormDesc& d) { d.dresidual_stride = 5; }, {"dresidual_stride = 5"}},
      {[](NormDesc& d) { d.residual_dtype = static_cast<DType>(9); }, {"residual_dtype = 9"}},
      {[](NormDesc& d) { d.residual_out_dtype = static_cast<DType>(9); }, {"residual_out_dtype = 9"}},
      {[](NormDesc& d) { d.weight_offset = NAN; }, {"weight_offset = nan"}},
      {[](NormDesc& d) { d.has_weight = false; d.weight_offset = 1.f; }, {"weight_offset = 1", "has_weight"}},
      {[](NormDesc& d) { d.norm = NormKind::RMSNorm; d.has_bias = true; }, {"has_bias = true", "LayerNorm only"}},
      {[](NormDesc& d) { d.cast_mode = static_cast<CastMode>(5); }, {"cast_mode = 5"}},
      {[](NormDesc& d) { d.residual_rounding = static_cast<ResidualRounding>(5); }, {"residual_rounding = 5"}},
      {[](NormDesc& d) { d.residual = true; d.heads = 2; }, {"residual = true", "heads = 2"}},
      {[](NormDesc& d) { d.store_residual_out = true; }, {"store_residual_out = true", "residual = true"}},
      {[](NormDesc& d) { d.has_dresidual = true; }, {"has_dresidual = true", "residual = true"}},
      // 3-D rows that overlap: 4 heads of 128 in a token stride of 256.
      {[](NormDesc& d) { d.heads = 4; d.x_stride = 256; }, {"x_stride = 256", "x_head_stride = 128", "overlap"}},
      {[](NormDesc& d) { d.heads = 4; d.dx_stride = 300; d.dx_head_stride = 128; }, {"dx_stride = 300", "overlap"}},
  };
  for (const auto& c : cases) {
    NormDesc d = base();
    c.edit(d);
    check_invalid([&] { d.validate(); }, c.parts);
  }
  // Valid 3-D layouts: token-major views and a transposed (head-major) tensor.
  NormDesc ok = base();
  ok.heads = 4;
  ok.x_stride = 3 * 4 * 128;
  CHECK_NOTHROW(ok.validate());
  ok.x_stride = 128;
  ok.x_head_stride = 16 * 128;  // [heads, tokens, N]
  CHECK_NOTHROW(ok.validate());
  CHECK(ok.x_hs() == 16 * 128);
  CHECK(base().y_ld() == 128);
}

TEST_CASE("descriptors: engine calls name missing pointers of a variant before anything runs") {
  Engine e;  // no GPU needed: pointers are checked first
  NormDesc d = make_desc(4, 64);
  d.norm = NormKind::LayerNorm;
  d.has_bias = true;
  d.residual = d.store_residual_out = true;
  int dummy = 0;
  ForwardTensors f;
  float* p = reinterpret_cast<float*>(&dummy);
  f.x = f.weight = f.residual = p;
  f.y = p;
  f.rstd = f.mean = p;
  check_invalid([&] { e.forward(d, f, nullptr); }, {"bias = null", "has_bias", "ln_fwd"});
  f.bias = &dummy;
  check_invalid([&] { e.forward(d, f, nullptr); }, {"residual_out = null", "store_residual_out"});
  BackwardTensors b;
  b.dy = b.x = b.weight = b.dx = b.dweight = b.workspace = p;
  b.rstd = p;
  check_invalid([&] { e.backward(d, b, nullptr); }, {"mean = null", "LayerNorm"});
  b.mean = p;
  check_invalid([&] { e.backward(d, b, nullptr); }, {"dbias = null", "has_bias"});
  check_invalid([&] { e.rms_norm_forward(d, &dummy, &dummy, &dummy, nullptr, nullptr); },
                {"rms_norm_forward", "desc.norm = ln"});
}

TEST_CASE("descriptors: Error composes its message from the parts") {
  const Error e(ErrorKind::Driver, "cuLaunchKernel failed", "rms_fwd", "8x64 x=bf16 y=bf16 w=bf16", "v8.t8.r4",
                "ops.cpp:12");
  CHECK(e.kind() == ErrorKind::Driver);
  CHECK(e.message() == "cuLaunchKernel failed");
  CHECK(std::string(e.what()) ==
        "normjit: cuLaunchKernel failed [op rms_fwd] [shape 8x64 x=bf16 y=bf16 w=bf16] [config v8.t8.r4] "
        "(at ops.cpp:12)");
  CHECK(std::string(Error(ErrorKind::Cache, "locked").what()) == "normjit: locked");
  CHECK(std::string(error_kind_name(ErrorKind::InvalidArgument)) == "invalid argument");
}

// ---- parsers ----------------------------------------------------------------

TEST_CASE("descriptors: parse_dtype accepts the aliases and names what it rejects") {
  for (const char* s : {"fp32", "f32", "float32", "float"}) CHECK(parse_dtype(s) == DType::F32);
  for (const char* s : {"fp16", "f16", "float16", "half"}) CHECK(parse_dtype(s) == DType::F16);
  for (const char* s : {"bf16", "bfloat16"}) CHECK(parse_dtype(s) == DType::BF16);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) CHECK(parse_dtype(dtype_name(t)) == t);
  CHECK(dtype_size(DType::F32) == 4);
  CHECK(dtype_size(DType::BF16) == 2);
  check_invalid([] { parse_dtype("fp8", "x_dtype"); }, {"x_dtype", "'fp8'"});
  check_invalid([] { parse_dtype("BF16"); }, {"'BF16'"});
  check_invalid([] { parse_dtype(""); }, {"dtype = ''"});
}

TEST_CASE("descriptors: LaunchConfig str and parse round-trip; parse rejects bad text") {
  for (const std::string text : {"v8.t512.r1", "v1.t32.r1", "v4.t1024.r1.2p", "v2.t8.r4", "v8.t1.r1024", "v1.t2.r16",
                           "v8.t256.r1.p2", "v4.t1024.r1.2p.p4"}) {
    CAPTURE(text);
    const LaunchConfig c = LaunchConfig::parse(text);
    CHECK(c.str() == text);
    CHECK(LaunchConfig::parse(c.str()) == c);
  }
  const LaunchConfig c = LaunchConfig::parse("v4.t64.r2.2p.p8");
  CHECK(c.vec == 4);
  CHECK(c.threads_per_row == 64);
  CHECK(c.rows_per_pid == 2);
  CHECK(c.two_pass);
  CHECK(c.programs_per_sm == 8);
  CHECK(c.threads() == 128);
  CHECK(LaunchConfig::parse("v4.t64.r2") != LaunchConfig::parse("v4.t64.r2.2p"));
  CHECK(LaunchConfig::parse("v4.t64.r2") != LaunchConfig::parse("v4.t64.r2.p1"));
  CHECK(LaunchConfig().str() == "v1.t32.r1");
  for (const std::string bad : {"v3.t32.r1", "v8.t2048.r1", "garbage", "v16.t32.r1", "v8.t512.r4", "v8.t48.r1",
                          "v8.t32.r0", "v8.t32", "v8.t32.r1.3p", "v8.t32.r1.p2.2p", " v8.t32.r1", ""}) {
    CAPTURE(bad);
    check_invalid([&] { LaunchConfig::parse(bad); }, {fmt::format("'{}'", bad)});
  }
}

TEST_CASE("descriptors: parse_tune_policy") {
  CHECK(parse_tune_policy("never") == TunePolicy::Never);
  CHECK(parse_tune_policy("first") == TunePolicy::OnFirstUse);
  CHECK(parse_tune_policy("on_first_use") == TunePolicy::OnFirstUse);
  CHECK(parse_tune_policy("on-first-use") == TunePolicy::OnFirstUse);
  CHECK(parse_tune_policy("always") == TunePolicy::Always);
  for (TunePolicy p : {TunePolicy::Never, TunePolicy::OnFirstUse, TunePolicy::Always})
    CHECK(parse_tune_policy(tune_policy_name(p)) == p);
  check_invalid([] { parse_tune_policy("sometimes"); }, {"'sometimes'"});
  check_invalid([] { parse_tune_policy("Never"); }, {"'Never'"});
}

// ---- shapes -----------------------------------------------------------------

TEST_CASE("descriptors: parse_shape_spec") {
  const NamedShape a = parse_shape_spec("rms:bf16:8192x4096");
  CHECK(a.name == "rms:bf16:8192x4096");
  CHECK(a.desc.M == 8192);
  CHECK(a.desc.N == 4096);
  CHECK(a.desc.x_dtype == DType::BF16);
  CHECK(a.desc.y_dtype == DType::BF16);
  CHECK(a.desc.weight_dtype == DType::BF16);

  const NamedShape b = parse_shape_spec("rms:fp16:3x7:w=fp32");
  CHECK(b.desc.M == 3);
  CHECK(b.desc.N == 7);
  CHECK(b.desc.x_dtype == DType::F16);
  CHECK(b.desc.y_dtype == DType::F16);
  CHECK(b.desc.weight_dtype == DType::F32);
  CHECK(parse_shape_spec("rms:float:0x1").desc.M == 0);

  // LayerNorm: a bias and eps 1e-5 as torch.nn.LayerNorm; options.
  const NormDesc ln = parse_shape_spec("ln:fp16:4096x256").desc;
  CHECK(ln.norm == NormKind::LayerNorm);
  CHECK(ln.has_bias);
  CHECK(ln.eps == 1e-5f);
  const NormDesc lnb = parse_shape_spec("ln:fp16:4096x256:nb:nw:eps=0.001").desc;
  CHECK_FALSE(lnb.has_bias);
  CHECK_FALSE(lnb.has_weight);
  CHECK(lnb.eps == 1e-3f);
  const NormDesc add = parse_shape_spec("rms:bf16:8x4096:res=fp32:fp32sum:dres:off=1:cast=gemma").desc;
  CHECK(add.residual);
  CHECK(add.store_residual_out);
  CHECK(add.has_dresidual);
  CHECK(add.residual_dtype == DType::F32);
  CHECK(add.residual_out_dtype == DType::F32);
  CHECK(add.residual_rounding == ResidualRounding::Fp32);
  CHECK(add.weight_offset == 1.f);
  CHECK(add.cast_mode == CastMode::Gemma);
  const NormDesc qk = parse_shape_spec("rms:bf16:32768x128:heads=32:x_stride=6144").desc;
  CHECK(qk.heads == 32);
  CHECK(qk.x_ld() == 6144);
  CHECK(qk.x_hs() == 128);
  CHECK(qk.y_ld() == 32 * 128);  // outputs stay contiguous

  check_invalid([] { parse_shape_spec("rms:bf17:8x8"); }, {"bf17"});
  check_invalid([] { parse_shape_spec("rms:bf16:8x8:w=fp8"); }, {"fp8"});
  check_invalid([] { parse_shape_spec("rms:bf16:8x0"); }, {"N = 0"});
  check_invalid([] { parse_shape_spec("rms:bf16:8x262145"); }, {"N = 262145"});
  check_invalid([] { parse_shape_spec("gn:bf16:8x8"); }, {"'gn:bf16:8x8'", "<rms|ln>:<dtype>:<M>x<N>"});
  check_invalid([] { parse_shape_spec("ln:bf16:8x8:zz=1"); }, {"'ln:bf16:8x8:zz=1'", "option 'zz'"});
  check_invalid([] { parse_shape_spec("rms:bf16:8x8:nb:off=1:nw"); }, {"weight_offset = 1", "has_weight"});
  check_invalid([] { parse_shape_spec("rms:bf16:8x8:heads=3"); }, {"heads = 3", "M = 8"});
  check_invalid([] { parse_shape_spec("rms:bf16:-8x8"); }, {"'rms:bf16:-8x8'"});
  check_invalid([] { parse_shape_spec("rms:bf16:8x8x8"); }, {"'rms:bf16:8x8x8'"});
  check_invalid([] { parse_shape_spec("rms:bf16:99999999999999999999x8"); },
                {"'rms:bf16:99999999999999999999x8'", "out of range"});
}

namespace {

void check_shape(const NamedShape& s, const std::string& name, std::int64_t M, std::int64_t N, DType t, float eps) {
  CAPTURE(s.name);
  CHECK(s.name == name);
  CHECK(s.desc.M == M);
  CHECK(s.desc.N == N);
  CHECK(s.desc.x_dtype == t);
  CHECK(s.desc.y_dtype == t);
  CHECK(s.desc.weight_dtype == t);
  CHECK(s.desc.eps == eps);
}

const char* const kLlamaConfig =
    R"({"model_type": "llama", "hidden_size": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "num_attention_heads": 32, "num_key_value_heads": 8})";

}  // namespace

TEST_CASE("descriptors: shapes_from_model_config reads Qwen3's hidden and QK-norm shapes") {
  const auto shapes = shapes_from_model_config(NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json", {1, 1024});
  REQUIRE(shapes.size() == 6);
  for (std::size_t i = 0; i < 2; ++i) {
    const std::int64_t t = i == 0 ? 1 : 1024;
    CAPTURE(t);
    check_shape(shapes[3 * i], fmt::format("hidden[{}]", t), t, 4096, DType::BF16, 1e-6f);
    check_shape(shapes[3 * i + 1], fmt::format("q_norm[{}]", t), t * 32, 128, DType::BF16, 1e-6f);
    check_shape(shapes[3 * i + 2], fmt::format("k_norm[{}]", t), t * 8, 128, DType::BF16, 1e-6f);
  }
  check_invalid([] { shapes_from_model_config(NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json", {1, 0}); },
                {"--tokens value 0"});
}

namespace {

// A model config.json in a directory of its own.
class ModelFile {
 public:
  explicit ModelFile(const std::string& json) : dir_(make_temp_dir("model")), path_((*dir_ / "config.json").string()) {
    write_text_file(path_, json);
  }
  const std::string& path() const { return path_; }
  std::vector<NamedShape> shapes(const std::vector<std::int64_t>& tokens) const {
    return shapes_from_model_config(path_, tokens);
  }

 private:
  std::shared_ptr<const fs::path> dir_;
  std::string path_;
};

// Reading `json` as a model config fails, naming the file and every one of `parts`.
void check_bad_model(const std::string& json, std::vector<std::string> parts) {
  const ModelFile model(json);
  parts.push_back(model.path());
  check_invalid([&] { model.shapes({1}); }, parts);
}

}  // namespace

TEST_CASE("descriptors: shapes_from_model_config reads GPT-2's LayerNorm (n_embd, layer_norm_epsilon)") {
  const auto shapes = shapes_from_model_config(NORMJIT_TEST_MODELS_DIR "/gpt2.config.json", {1, 1024});
  REQUIRE(shapes.size() == 2);
  for (const auto& s : shapes) {
    CHECK(s.desc.norm == NormKind::LayerNorm);
    CHECK(s.desc.has_bias);
    CHECK(s.desc.N == 768);
    CHECK(s.desc.eps == 1e-5f);
  }
  CHECK(shapes[1].desc.M == 1024);
}

TEST_CASE("descriptors: shapes_from_model_config for models without QK-norm") {
  const auto shapes = ModelFile(kLlamaConfig).shapes({1, 1024});
  REQUIRE(shapes.size() == 2);
  check_shape(shapes[0], "hidden[1]", 1, 4096, DType::BF16, 1e-5f);
  check_shape(shapes[1], "hidden[1024]", 1024, 4096, DType::BF16, 1e-5f);

  // No torch_dtype or rms_norm_eps: bf16 and 1e-6.
  const auto minimal = ModelFile(R"({"hidden_size": 768})").shapes({5});
  REQUIRE(minimal.size() == 1);
  check_shape(minimal[0], "hidden[5]", 5, 768, DType::BF16, 1e-6f);

  const auto fp16 = ModelFile(R"({"hidden_size": 2048, "torch_dtype": "float16", "rms_norm_eps": 1e-5})").shapes({2});
  REQUIRE(fp16.size() == 1);
  check_shape(fp16[0], "hidden[2]", 2, 2048, DType::F16, 1e-5f);
}

TEST_CASE("descriptors: shapes_from_model_config names what is wrong with a bad file") {
  const auto dir = make_temp_dir("models");
  const std::string missing = (*dir / "missing.json").string();
  check_invalid([&] { shapes_from_model_config(missing, {1}); }, {missing, "cannot be opened"});

  check_bad_model(R"({"hidden_size": 4096,)", {"not valid JSON"});
  check_bad_model(R"({"model_type": "llama", "rms_norm_eps": 1e-5})", {"'hidden_size'"});
  check_bad_model(R"({"hidden_size": "4096"})", {"'hidden_size'"});
  check_bad_model(R"({"model_type": "qwen3", "hidden_size": 4096})", {"'num_attention_heads'"});
  // These name the bad value, but not the file.
  const ModelFile int8(R"({"hidden_size": 4096, "torch_dtype": "int8"})");
  check_invalid([&] { int8.shapes({1}); }, {"torch_dtype", "'int8'"});
  const ModelFile huge(R"({"hidden_size": 300000})");
  check_invalid([&] { huge.shapes({1}); }, {"N = 300000"});
}

TEST_CASE("descriptors: FP8 fields are validated, naming the field and its value") {
  auto fp8 = [](const char* spec) { return parse_shape_spec(spec).desc; };
  NormDesc d = fp8("rms:bf16:64x4096:quant=e4m3/group128");
  d.quant_group = 96;
  check_invalid([&] { d.validate(); }, {"quant_group = 96", "16, 32, 64 or 128"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1000:quant=e4m3/group128"); }, {"quant_group = 128", "N = 1000"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1000:quant=e4m3/mx32"); }, {"mx32", "N = 1000"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/token:ue8m0"); }, {"scale_ue8m0", "quant = token"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/mx32:ub=2"); }, {"scale_ub = 2", "quant = mx32"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/token:amax"); }, {"store_amax", "tensor-static"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/mx32:smin=0.001"); }, {"scale_min = 0.001", "mx32"});
  {
    NormDesc tiny = parse_shape_spec("rms:bf16:64x1024:quant=e4m3/token").desc;
    tiny.scale_min = 1e-40f;  // subnormal: 1 / scale would overflow
    check_invalid([&] { tiny.validate(); }, {"scale_min", "2^-126"});
  }
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/group128:x_stride=1026"); },
                {"quant_group = 128", "1026", "multiples of 4"});
  CHECK_NOTHROW(parse_shape_spec("rms:bf16:64x1024:quant=e4m3/group64:x_stride=1026:ub=0.01:smin=0.0001"));
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/token:transpose"); }, {"store_y_t", "quant = token"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:yhp"); }, {"store_y_hp", "quant"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1000:x=e4m3/group16"); }, {"x_group = 16", "N = 1000"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:x=e4m3/group64"); }, {"x_group = 64", "16, 32 or 128"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:x=e4m3/group16:cast=llama"); }, {"cast_mode = llama", "e4m3"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:quant=e4m3/int8"); }, {"quant = 'e4m3/int8'"});
  check_invalid([&] { parse_shape_spec("rms:bf16:64x1024:w=e4m3"); }, {"weight_dtype = e4m3", "x and y only"});
  NormDesc y8 = fp8("rms:bf16:64x1024");
  y8.y_dtype = DType::E5M2;
  check_invalid([&] { y8.validate(); }, {"y_dtype = e5m2", "needs quant"});
  NormDesc q = fp8("rms:bf16:64x1024");
  q.quant = QuantScaling::Token;
  check_invalid([&] { q.validate(); }, {"quant = token", "y_dtype = bf16"});
  NormDesc cm = fp8("rms:bf16:64x4096:quant=e4m3/group128:colmajor");
  cm.scale_stride = 32;
  check_invalid([&] { cm.validate(); }, {"scale_stride = 32", "M = 64"});
  cm.scale_stride = 128;
  CHECK_NOTHROW(cm.validate());
  CHECK(cm.scale_ld() == 128);
  CHECK(cm.quant_groups() == 32);
}

TEST_CASE("descriptors: an FP8 model config (DeepSeek-V3 style) adds per-token-group FP8 hidden norms") {
  const ModelFile ds(R"({"model_type": "deepseek_v3", "hidden_size": 7168, "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16", "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
    "quant_method": "fp8", "weight_block_size": [128, 128]}})");
  const auto shapes = ds.shapes({1, 4096});
  int fp8 = 0;
  for (const auto& s : shapes) {
    if (s.name.rfind("hidden_fp8", 0) != 0) continue;
    ++fp8;
    CHECK(s.desc.N == 7168);
    CHECK(s.desc.y_dtype == DType::E4M3);
    CHECK(s.desc.quant == QuantScaling::Group);
    CHECK(s.desc.quant_group == 128);
    CHECK(s.desc.scale_col_major);
  }
  CHECK(fp8 == 2);
  const ModelFile plain(R"({"hidden_size": 4096})");
  for (const auto& s : plain.shapes({1})) CHECK(s.desc.quant == QuantScaling::None);
}

// ---- Engine argument checks (before any driver call) ------------------------

namespace {

// Distinct non-null fake device addresses: never dereferenced, because every
// call below fails its argument checks first.
void* fake(std::uintptr_t i) { return reinterpret_cast<void*>(std::uintptr_t{1} << 20 | i << 8); }

EngineOptions private_options(const fs::path& dir) {
  EngineOptions o;
  o.cache_dir = dir.string();
  return o;
}

}  // namespace

TEST_CASE("descriptors: Engine rejects bad arguments before it touches the driver") {
  const auto dir = make_temp_dir("engine");
  Engine e(private_options(*dir));
  CHECK(e.cache_dir() == dir->string());
  const NormDesc d = make_desc(8, 64);
  float* rstd = static_cast<float*>(fake(4));

  check_invalid([&] { e.rms_norm_forward(d, nullptr, fake(2), fake(3), rstd, nullptr); }, {"x = null", "rms_fwd"});
  check_invalid([&] { e.rms_norm_forward(d, fake(1), nullptr, fake(3), rstd, nullptr); }, {"weight = null"});
  check_invalid([&] { e.rms_norm_forward(d, fake(1), fake(2), nullptr, rstd, nullptr); }, {"y = null"});
  check_invalid([&] { e.rms_norm_forward(d, fake(1), fake(2), fake(3), nullptr, nullptr); }, {"rstd = null"});
  check_invalid([&] { e.rms_norm_forward(make_desc(8, 0), fake(1), fake(2), fake(3), rstd, nullptr); }, {"N = 0"});
  check_invalid([&] { e.rms_norm_forward(make_desc(-2, 64), nullptr, nullptr, nullptr, nullptr, nullptr); },
                {"M = -2"});
  // M = 0 is a no-op, whatever the pointers.
  CHECK_NOTHROW(e.rms_norm_forward(make_desc(0, 64), nullptr, nullptr, nullptr, nullptr, nullptr));
  CHECK_NOTHROW(e.rms_norm_backward(make_desc(0, 64), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0,
                                    nullptr));
  CHECK(e.rms_norm_backward_workspace_size(make_desc(0, 64)) == 0);

  auto backward = [&](const NormDesc& bd, void* workspace) {
    e.rms_norm_backward(bd, fake(1), fake(2), fake(3), rstd, fake(5), fake(6), workspace, 1 << 20, nullptr);
  };
  check_invalid([&] { backward(d, nullptr); }, {"workspace = null", "rms_bwd"});
  check_invalid([&] { backward(d, static_cast<char*>(fake(7)) + 16); }, {"workspace = 0x", "32-byte aligned"});
  check_invalid([&] { backward(make_desc(8, 262145), fake(7)); }, {"N = 262145"});
  check_invalid(
      [&] { e.rms_norm_backward(d, nullptr, fake(2), fake(3), rstd, fake(5), fake(6), fake(7), 64, nullptr); },
      {"dy = null"});
  check_invalid([&] { e.rms_norm_backward_workspace_size(make_desc(8, 0)); }, {"N = 0"});
  check_invalid([&] { e.config_for(Op::Forward, make_desc(8, 0)); }, {"N = 0"});
  check_invalid([&] { e.tune(Op::Forward, make_desc(0, 64)); }, {"M = 0"});
}

// ---- host fp16 / bf16 conversions --------------------------------------------

namespace {

bool is_nan16(std::uint16_t h, int exp_bits) {
  const int mant_bits = 15 - exp_bits;
  const std::uint16_t exp_mask = static_cast<std::uint16_t>(((1u << exp_bits) - 1) << mant_bits);
  return (h & exp_mask) == exp_mask && (h & ((1u << mant_bits) - 1)) != 0;
}

// Every 16-bit pattern that is a number survives float and back unchanged;
// NaNs stay NaNs.
template <class ToFloat, class FromFloat>
void check_every_pattern_round_trips(ToFloat to_float, FromFloat from_float, int exp_bits) {
  int mismatches = 0;
  for (std::uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    const float f = to_float(h);
    if (is_nan16(h, exp_bits)) {
      CHECK(std::isnan(f));
      CHECK(is_nan16(from_float(f), exp_bits));
    } else if (from_float(f) != h && ++mismatches <= 5) {
      FAIL_CHECK(fmt::format("0x{:04x} -> {} -> 0x{:04x}", h, f, from_float(f)));
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("host_dtype: bf16 conversions") {
  check_every_pattern_round_trips(bf16_to_float, float_to_bf16, 8);
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(float_to_bf16(-2.5f) == 0xc020);
  // Round to nearest, ties to even (the step at 1.0 is 2^-7).
  CHECK(float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);
  CHECK(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
  CHECK(float_to_bf16(1.0f + 0x1p-8f - 0x1p-20f) == 0x3f80);
  // inf, NaN, subnormals, overflow.
  CHECK(float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xff80);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(float_to_bf16(0x1p-133f) == 0x0001);
  CHECK(bf16_to_float(0x0001) == 0x1p-133f);
  CHECK(float_to_bf16(0x1p-134f) == 0x0000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
}

TEST_CASE("host_dtype: fp16 conversions") {
  check_every_pattern_round_trips(fp16_to_float, float_to_fp16, 5);
  CHECK(float_to_fp16(1.0f) == 0x3c00);
  CHECK(fp16_to_float(0x3c00) == 1.0f);
  CHECK(float_to_fp16(-2.0f) == 0xc000);
  // Round to nearest, ties to even: the step is 2^-10 at 1.0 and 2 at 2048.
  CHECK(float_to_fp16(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(float_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(float_to_fp16(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);
  CHECK(float_to_fp16(2049.0f) == 0x6800);
  CHECK(float_to_fp16(2051.0f) == 0x6802);
  // Overflow: 65504 is the largest finite value; 65520 is the tie to inf.
  CHECK(float_to_fp16(65504.0f) == 0x7bff);
  CHECK(float_to_fp16(65519.0f) == 0x7bff);
  CHECK(float_to_fp16(65520.0f) == 0x7c00);
  CHECK(float_to_fp16(-65520.0f) == 0xfc00);
  CHECK(float_to_fp16(1e30f) == 0x7c00);
  CHECK(float_to_fp16(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(fp16_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
  CHECK(is_nan16(float_to_fp16(std::numeric_limits<float>::quiet_NaN()), 5));
  // Subnormals: the smallest is 2^-24; ties to even there too.
  CHECK(float_to_fp16(0x1p-24f) == 0x0001);
  CHECK(fp16_to_float(0x0001) == 0x1p-24f);
  CHECK(fp16_to_float(0x8001) == -0x1p-24f);
  CHECK(float_to_fp16(0x1p-25f) == 0x0000);
  CHECK(float_to_fp16(3 * 0x1p-25f) == 0x0002);
  CHECK(float_to_fp16(0x1p-25f + 0x1p-40f) == 0x0001);
  CHECK(float_to_fp16(0x1p-14f - 0x1p-25f) == 0x0400);  // largest subnormal's tie rounds into the normals
  CHECK(float_to_fp16(0x1p-14f) == 0x0400);
  CHECK(float_to_fp16(-0x1p-30f) == 0x8000);
  CHECK(std::signbit(fp16_to_float(0x8000)));
}
