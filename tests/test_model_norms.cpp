// model_norms: every norm a model's forward and backward call, derived from
// its config.json, with the variant the runtime calls (cast mode, weight
// offset, fused residual add, strides) and the config keys it came from.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "models/model_norms.hpp"
#include "test_util.hpp"

using namespace normjit;
using namespace normjit::detail;
using namespace normjit_test;
namespace fs = std::filesystem;

namespace {

const std::vector<std::int64_t> kTokens = {1, 1024, 8192};
const std::vector<Op> kTrain = {Op::Forward, Op::Backward}, kServe = {Op::Forward};

// A config.json of its own in a fresh directory.
struct Config {
  explicit Config(const std::string& json) : dir(make_temp_dir("model-norms")), path((*dir / "config.json").string()) {
    write_text_file(path, json);
  }
  std::shared_ptr<const fs::path> dir;
  std::string path;
};

const ModelNorm& find(const ModelNorms& m, const std::string& name) {
  const auto it = std::find_if(m.norms.begin(), m.norms.end(), [&](const ModelNorm& n) { return n.shape.name == name; });
  REQUIRE_MESSAGE(it != m.norms.end(), "no norm " << name);
  return *it;
}

// The names, ops and full shape specs of `m`, one line each.
std::vector<std::string> lines(const ModelNorms& m) {
  std::vector<std::string> out;
  for (const auto& n : m.norms) {
    std::string ops;
    for (Op op : n.ops) ops += (ops.empty() ? "" : "+") + std::string(op_name(op));
    out.push_back(fmt::format("{} {} {}", n.shape.name, ops, full_shape_spec(n.shape.desc)));
  }
  return out;
}

void check_invalid_model(const std::string& json, std::initializer_list<const char*> parts) {
  const Config c(json);
  try {
    model_norms(c.path, {1});
    FAIL("no error for " << json);
  } catch (const Error& e) {
    CAPTURE(e.what());
    CHECK(e.kind() == ErrorKind::InvalidArgument);
    CHECK(contains(e.what(), c.path));
    for (const char* p : parts) CHECK_MESSAGE(contains(e.what(), p), "the error lacks '" << p << "'");
  }
}

}  // namespace

TEST_CASE("model norms: Qwen3-8B: Llama-cast hidden norms, the fused residual add, per-head QK-norm") {
  const auto m = model_norms(NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json", kTokens);
  std::vector<std::string> want;
  for (std::int64_t t : kTokens) {
    want.push_back(fmt::format("hidden[{}] fwd+bwd rms:bf16:{}x4096:cast=llama:eps=1e-06", t, t));
    want.push_back(fmt::format("hidden_res[{}] fwd rms:bf16:{}x4096:res=bf16:cast=llama:eps=1e-06", t, t));
    want.push_back(fmt::format("q_norm[{}] fwd+bwd rms:bf16:{}x128:cast=llama:eps=1e-06", t, 32 * t));
    want.push_back(fmt::format("k_norm[{}] fwd+bwd rms:bf16:{}x128:cast=llama:eps=1e-06", t, 8 * t));
  }
  CHECK(lines(m) == want);
  CHECK(m.model_type == "qwen3");

  const NormDesc& h = find(m, "hidden[1024]").shape.desc;
  CHECK(h.norm == NormKind::RMSNorm);
  CHECK(h.cast_mode == CastMode::Llama);
  CHECK(h.weight_offset == 0.f);
  CHECK_FALSE(h.residual);
  CHECK(h.x_dtype == DType::BF16);
  CHECK(h.eps == 1e-6f);
  const NormDesc& r = find(m, "hidden_res[1024]").shape.desc;
  CHECK(r.residual);
  CHECK(r.store_residual_out);
  CHECK(r.residual_dtype == DType::BF16);
  CHECK(r.residual_out_dtype == DType::BF16);
  CHECK(r.residual_rounding == ResidualRounding::ResidualDtype);
  CHECK(find(m, "hidden_res[1024]").ops == kServe);
  const ModelNorm& q = find(m, "q_norm[8192]");
  CHECK(q.shape.desc.M == 8192 * 32);
  CHECK(q.shape.desc.N == 128);
  CHECK(q.shape.desc.heads == 1);  // contiguous [tokens, heads, head_dim]: 2-D rows
  CHECK(q.ops == kTrain);
  CHECK(q.keys == std::vector<std::string>{"num_attention_heads", "head_dim", "rms_norm_eps", "torch_dtype", "model_type"});
  CHECK(find(m, "hidden[1]").keys == std::vector<std::string>{"hidden_size", "rms_norm_eps", "torch_dtype", "model_type"});
}

TEST_CASE("model norms: Gemma 3 (multimodal config): text_config keys, 1 + weight, Gemma cast, per-head QK-norm") {
  const auto m = model_norms(NORMJIT_TEST_MODELS_DIR "/gemma-3-27b-it.config.json", kTokens);
  std::vector<std::string> want;
  for (std::int64_t t : kTokens) {
    want.push_back(fmt::format("hidden[{}] fwd+bwd rms:bf16:{}x5376:off=1:cast=gemma:eps=1e-06", t, t));
    want.push_back(fmt::format("hidden_res[{}] fwd rms:bf16:{}x5376:res=bf16:off=1:cast=gemma:eps=1e-06", t, t));
    want.push_back(fmt::format("q_norm[{}] fwd+bwd rms:bf16:{}x128:off=1:cast=gemma:eps=1e-06", t, 32 * t));
    want.push_back(fmt::format("k_norm[{}] fwd+bwd rms:bf16:{}x128:off=1:cast=gemma:eps=1e-06", t, 16 * t));
  }
  CHECK(lines(m) == want);
  CHECK(m.model_type == "gemma3 (text_config: gemma3_text)");
  const NormDesc& h = find(m, "hidden[1]").shape.desc;
  CHECK(h.weight_offset == 1.f);
  CHECK(h.cast_mode == CastMode::Gemma);
  CHECK(find(m, "q_norm[1]").shape.desc.weight_offset == 1.f);
  CHECK(find(m, "hidden[1]").keys ==
        std::vector<std::string>{"text_config.hidden_size", "rms_norm_eps (absent: 1e-06)", "torch_dtype",
                                 "text_config.model_type"});
  // The four norms of a layer and the final norm are one shape.
  REQUIRE(!m.kinds.empty());
  CHECK(m.kinds[0].first == "hidden");
  CHECK(contains(m.kinds[0].second, "pre_feedforward_layernorm"));
  CHECK(contains(m.kinds[0].second, "post_feedforward_layernorm"));

  // Gemma 3 4B's text_config leaves the head counts to Gemma3TextConfig's defaults.
  const Config g4(R"({"model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 2560, "model_type": "gemma3_text", "num_hidden_layers": 34}})");
  const auto m4 = model_norms(g4.path, {2});
  CHECK(lines(m4) == std::vector<std::string>{"hidden[2] fwd+bwd rms:bf16:2x2560:off=1:cast=gemma:eps=1e-06",
                                              "hidden_res[2] fwd rms:bf16:2x2560:res=bf16:off=1:cast=gemma:eps=1e-06",
                                              "q_norm[2] fwd+bwd rms:bf16:16x256:off=1:cast=gemma:eps=1e-06",
                                              "k_norm[2] fwd+bwd rms:bf16:8x256:off=1:cast=gemma:eps=1e-06"});
  CHECK(find(m4, "q_norm[2]").keys[0] == "num_attention_heads (absent: 8, Gemma3TextConfig's default)");

  // Gemma 2: no QK-norm; its dtype may be fp32 (weights, residual and all).
  const Config g2(R"({"model_type": "gemma2", "hidden_size": 3584, "rms_norm_eps": 1e-6, "torch_dtype": "float32"})");
  CHECK(lines(model_norms(g2.path, {4})) ==
        std::vector<std::string>{"hidden[4] fwd+bwd rms:fp32:4x3584:off=1:cast=gemma:eps=1e-06",
                                 "hidden_res[4] fwd rms:fp32:4x3584:res=fp32:off=1:cast=gemma:eps=1e-06"});
}

TEST_CASE("model norms: DeepSeek-V3: MLA low-rank norms, FP8 hidden norms") {
  const auto m = model_norms(NORMJIT_TEST_MODELS_DIR "/deepseek-v3.config.json", kTokens);
  std::vector<std::string> want;
  for (std::int64_t t : kTokens) {
    want.push_back(fmt::format("hidden[{}] fwd+bwd rms:bf16:{}x7168:cast=llama:eps=1e-06", t, t));
    want.push_back(fmt::format("hidden_res[{}] fwd rms:bf16:{}x7168:res=bf16:cast=llama:eps=1e-06", t, t));
    want.push_back(fmt::format(
        "hidden_fp8[{}] fwd rms:bf16:{}x7168:cast=llama:norstd:quant=e4m3/group128:colmajor:eps=1e-06", t, t));
    want.push_back(fmt::format("q_a_norm[{}] fwd+bwd rms:bf16:{}x1536:cast=llama:eps=1e-06", t, t));
    want.push_back(fmt::format("kv_a_norm[{}] fwd+bwd rms:bf16:{}x512:cast=llama:x_stride=576:eps=1e-06", t, t));
  }
  CHECK(lines(m) == want);
  const NormDesc& kv = find(m, "kv_a_norm[1024]").shape.desc;
  CHECK(kv.x_stride == 512 + 64);  // a view into [kv_lora_rank | k_pe]
  CHECK(kv.dx_stride == 0);
  CHECK(kv.cast_mode == CastMode::Llama);
  CHECK(find(m, "kv_a_norm[1]").keys ==
        std::vector<std::string>{"kv_lora_rank", "qk_rope_head_dim", "rms_norm_eps", "torch_dtype", "model_type"});
  const NormDesc& q8 = find(m, "hidden_fp8[1]").shape.desc;
  CHECK(q8.y_dtype == DType::E4M3);
  CHECK(q8.quant == QuantScaling::Group);
  CHECK(q8.quant_group == 128);

  // DeepSeek-V2-Lite: q_lora_rank null, so no q_a_layernorm.
  const Config lite(R"({"model_type": "deepseek_v2", "hidden_size": 2048, "q_lora_rank": null, "kv_lora_rank": 512,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"})");
  CHECK(lines(model_norms(lite.path, {3})) ==
        std::vector<std::string>{"hidden[3] fwd+bwd rms:bf16:3x2048:cast=llama:eps=1e-06",
                                 "hidden_res[3] fwd rms:bf16:3x2048:res=bf16:cast=llama:eps=1e-06",
                                 "kv_a_norm[3] fwd+bwd rms:bf16:3x512:cast=llama:x_stride=576:eps=1e-06"});
}

TEST_CASE("model norms: LayerNorm with bias for GPT-2, GPT-NeoX and Falcon; no fused residual") {
  auto m = model_norms(NORMJIT_TEST_MODELS_DIR "/gpt2.config.json", kTokens);
  CHECK(lines(m) == std::vector<std::string>{"hidden[1] fwd+bwd ln:bf16:1x768:eps=1e-05",
                                             "hidden[1024] fwd+bwd ln:bf16:1024x768:eps=1e-05",
                                             "hidden[8192] fwd+bwd ln:bf16:8192x768:eps=1e-05"});
  for (const auto& n : m.norms) {
    CHECK(n.shape.desc.norm == NormKind::LayerNorm);
    CHECK(n.shape.desc.has_bias);
    CHECK(n.shape.desc.cast_mode == CastMode::Default);
    CHECK(n.keys == std::vector<std::string>{"n_embd", "layer_norm_epsilon", "torch_dtype (absent: bf16)", "model_type"});
  }
  m = model_norms(NORMJIT_TEST_MODELS_DIR "/pythia-1b.config.json", {7});
  CHECK(lines(m) == std::vector<std::string>{"hidden[7] fwd+bwd ln:fp16:7x2048:eps=1e-05"});
  CHECK(m.norms[0].keys == std::vector<std::string>{"hidden_size", "layer_norm_eps", "torch_dtype", "model_type"});
  m = model_norms(NORMJIT_TEST_MODELS_DIR "/falcon-7b.config.json", {7});
  CHECK(lines(m) == std::vector<std::string>{"hidden[7] fwd+bwd ln:bf16:7x4544:eps=1e-05"});
  CHECK(m.norms[0].keys == std::vector<std::string>{"hidden_size", "layer_norm_epsilon", "torch_dtype", "model_type"});
}

TEST_CASE("model norms: OLMo 2: default cast, post-norms (nothing fused), QK-norm over the whole projection") {
  const Config olmo(R"({"model_type": "olmo2", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "dtype": "float32"})");
  CHECK(lines(model_norms(olmo.path, {5})) ==
        std::vector<std::string>{"hidden[5] fwd+bwd rms:fp32:5x4096:eps=1e-06",
                                 "k_norm[5] fwd+bwd rms:fp32:5x1024:eps=1e-06"});
  // q_norm is the hidden norm's shape: merged into it.
  const auto m = model_norms(olmo.path, {5});
  CHECK(m.norms[0].also == std::vector<std::string>{"q_norm[5]"});
  CHECK(std::find(m.norms[0].keys.begin(), m.norms[0].keys.end(), "dtype") != m.norms[0].keys.end());
}

TEST_CASE("model norms: unknown architectures, missing and wrong keys are named") {
  check_invalid_model(R"({"model_type": "mamba", "d_model": 768})",
                      {"no hidden size", "'hidden_size'", "'n_embd'", "model_type 'mamba'"});
  check_invalid_model(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}})",
                      {"'text_config.hidden_size' or 'hidden_size'", "'text_config.n_embd' or 'n_embd'"});
  check_invalid_model(R"({"model_type": "qwen3", "hidden_size": 4096})", {"'num_attention_heads'", "QK-norm"});
  check_invalid_model(R"({"model_type": "llama", "hidden_size": 4096, "rms_norm_eps": "small"})", {"'rms_norm_eps'", "\"small\""});
  check_invalid_model(R"({"hidden_size": 4096, "torch_dtype": "float8_e4m3fn"})", {"torch_dtype", "not a model dtype"});
  check_invalid_model(R"({"model_type": "llama", "hidden_size": 0})", {"'hidden_size' is 0"});
  check_invalid_model(R"([1, 2])", {"not a JSON object"});
  // An unknown model_type with a hidden size: a plain RMSNorm, said so.
  const Config other(R"({"model_type": "somenet", "hidden_size": 1024})");
  const auto m = model_norms(other.path, {2});
  CHECK(lines(m) == std::vector<std::string>{"hidden[2] fwd+bwd rms:bf16:2x1024:eps=1e-06"});
  CHECK(contains(m.summary, "not known"));
}

TEST_CASE("model norms: every derived shape spec parses back to its variant; shapes_from_model_config is the old list") {
  for (const char* f : {"qwen3-8b", "gemma-3-27b-it", "deepseek-v3", "gpt2", "pythia-1b", "falcon-7b"}) {
    const auto m = model_norms(fmt::format("{}/{}.config.json", NORMJIT_TEST_MODELS_DIR, f), kTokens);
    for (const auto& n : m.norms) {
      CAPTURE(n.shape.name);
      const NormDesc back = parse_shape_spec(full_shape_spec(n.shape.desc)).desc;
      CHECK(shape_spec(back) == shape_spec(n.shape.desc));
      CHECK(back.eps == n.shape.desc.eps);
      CHECK(back.x_stride == n.shape.desc.x_stride);
    }
  }
  const auto old = shapes_from_model_config(NORMJIT_TEST_MODELS_DIR "/qwen3-8b.config.json", {1});
  REQUIRE(old.size() == 3);
  CHECK(old[0].name == "hidden[1]");
  CHECK(old[1].name == "q_norm[1]");
  CHECK(old[2].name == "k_norm[1]");
}
