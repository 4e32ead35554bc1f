#include "shapes.hpp"

#include <algorithm>
#include <climits>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace normjit::detail {

namespace {
// Default eps of each norm, as torch's modules and most model configs have it.
float default_eps(NormKind k) { return k == NormKind::LayerNorm ? 1e-5f : 1e-6f; }
}  // namespace

NamedShape parse_shape_spec(const std::string& text) {
  static const std::regex head(R"((rms|ln):([a-z0-9]+):(\d+)x(\d+)((?::[a-z_0-9]+(?:=[a-z0-9.+/-]+)?)*))");
  static const std::regex option(R"(:([a-z_0-9]+)(?:=([a-z0-9.+/-]+))?)");
  // quant=<e4m3|e5m2>/<tensor|tensor-static|token|group<G>|mx32>, x=<e4m3|e5m2>/group<QB>
  static const std::regex quant_re(R"((e4m3|e5m2)/(tensor|tensor-static|token|group(\d{1,3})|mx32))");
  static const std::regex xfp8_re(R"((e4m3|e5m2)/group(\d{1,3}))");
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
      const std::string key = (*it)[1], val = (*it)[2];
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
      else if (key == "yhp") {
        d.store_y_hp = true;
        if (!val.empty()) d.y_hp_dtype = parse_dtype(val, "yhp");
      } else if (key == "transpose") d.store_y_t = true;
      else if (key == "grad") d.grad_dtype = parse_dtype(val, "grad");
      else throw Error(ErrorKind::InvalidArgument, fmt::format("option '{}' is not one of w, y, res, fp32sum, dres, nw, nb, off, cast, eps, heads, x_stride, ro, noro, norstd, nomean, quant, x, ue8m0, colmajor, ub, yhp, transpose, grad", key));
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
    if (d.store_y_hp) s += fmt::format(":yhp={}", dtype_name(d.y_hp_dtype));
    if (d.store_y_t) s += ":transpose";
  }
  if ((is_fp8(d.x_dtype) || is_fp8(d.y_dtype)) && d.grad_dtype != head)
    s += fmt::format(":grad={}", dtype_name(d.grad_dtype));
  return s;
}

const std::vector<std::int64_t>& default_token_counts() {
  static const std::vector<std::int64_t> t = {1, 1024, 8192};
  return t;
}

std::string full_shape_spec(const NormDesc& d) {
  std::string s = shape_spec(d);
  if (d.x_stride != 0) s += fmt::format(":x_stride={}", d.x_stride);
  return s + fmt::format(":eps={}", d.eps);
}

namespace {

using nlohmann::json;

// Reads a model config's keys, text_config's before the top level's (Gemma 3
// and other multimodal configs keep the language model's keys there), and
// names each key it read as it was found: "hidden_size",
// "text_config.head_dim", "rms_norm_eps (absent: 1e-06)".
class ConfigReader {
 public:
  ConfigReader(const json& top, std::string path) : top_(top), path_(std::move(path)) {
    if (top.contains("text_config") && top["text_config"].is_object()) text_ = &top["text_config"];
  }

  bool nested() const { return text_ != nullptr; }
  const std::string& path() const { return path_; }

  // The value of `key` and its label, or nullptr (a JSON null counts as absent).
  const json* find(const std::string& key, std::string* label) const {
    if (text_ && text_->contains(key) && !(*text_)[key].is_null()) {
      if (label) *label = "text_config." + key;
      return &(*text_)[key];
    }
    if (top_.contains(key) && !top_[key].is_null()) {
      if (label) *label = key;
      return &top_[key];
    }
    return nullptr;
  }
  bool has(const std::string& key) const { return find(key, nullptr) != nullptr; }

  std::string where(const std::string& key) const { return text_ ? fmt::format("'text_config.{}' or '{}'", key, key) : fmt::format("'{}'", key); }

  Error error(const std::string& what) const {
    return Error(ErrorKind::InvalidArgument, fmt::format("--model '{}': {}", path_, what));
  }

  // An integer >= 1; `fallback` (with its reason) when absent, else an error
  // naming the key and `why` it is needed.
  std::int64_t integer(const std::string& key, std::string& label, const char* why,
                       std::optional<std::pair<std::int64_t, std::string>> fallback = std::nullopt) const {
    const json* v = find(key, &label);
    if (!v) {
      if (fallback) {
        label = fmt::format("{} (absent: {})", key, fallback->second);
        return fallback->first;
      }
      throw error(fmt::format("has no integer {} ({})", where(key), why));
    }
    if (!v->is_number_integer() || v->get<std::int64_t>() < 1)
      throw error(fmt::format("'{}' is {}, not an integer >= 1 ({})", label, v->dump(), why));
    return v->get<std::int64_t>();
  }

  float eps(const std::string& key, float fallback, std::string& label) const {
    const json* v = find(key, &label);
    if (!v) {
      label = fmt::format("{} (absent: {})", key, fallback);
      return fallback;
    }
    if (!v->is_number()) throw error(fmt::format("'{}' is {}, not a number", label, v->dump()));
    return static_cast<float>(v->get<double>());
  }

  DType dtype(std::string& label) const {
    for (const char* key : {"torch_dtype", "dtype"})
      if (const json* v = find(key, &label)) {
        if (!v->is_string()) throw error(fmt::format("'{}' is {}, not a dtype name", label, v->dump()));
        DType t;
        try {
          t = parse_dtype(v->get<std::string>(), label.c_str());
        } catch (const Error& e) {
          throw error(e.message());
        }
        if (is_fp8(t)) throw error(fmt::format("{} = '{}' is not a model dtype (fp32, fp16 or bf16)", label, v->get<std::string>()));
        return t;
      }
    label = "torch_dtype (absent: bf16)";
    return DType::BF16;
  }

  std::string string(const std::string& key) const {
    const json* v = find(key, nullptr);
    return v && v->is_string() ? v->get<std::string>() : std::string();
  }

  const json& top() const { return top_; }

 private:
  const json& top_;
  const json* text_ = nullptr;
  std::string path_;
};

enum class QkNorm { None, PerHead, FullWidth };

// How a family of models calls its norms.
struct Family {
  NormKind norm = NormKind::RMSNorm;
  CastMode cast = CastMode::Default;
  float weight_offset = 0.f;
  const char* hidden_key = "hidden_size";
  const char* eps_key = "rms_norm_eps";
  bool fused_residual = false;  // serving engines fuse the residual add into the pre-norms
  QkNorm qk = QkNorm::None;
  bool mla = false;             // DeepSeek V2/V3 low-rank q and kv norms
  bool gemma3_defaults = false; // Gemma3TextConfig's defaults for absent head counts
  bool known = true;
  std::string what;             // the norm, for the summary
  std::string hidden_modules, residual_modules, qk_modules;
};

Family family_of(const std::string& type, const ConfigReader& c) {
  Family f;
  static const std::set<std::string> llama = {"llama", "mistral", "mixtral", "phi3", "qwen2",
                                              "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"};
  const char* pre_norm = "input_layernorm, post_attention_layernorm, norm (final)";
  const char* pre_norm_res =
      "input_layernorm (from the second layer), post_attention_layernorm, norm (final), with the residual add fused";
  if (llama.count(type)) {
    f.cast = CastMode::Llama;
    f.fused_residual = true;
    f.what = "RMSNorm, Llama cast (weight * xhat rounded to the input dtype)";
    f.hidden_modules = pre_norm;
    f.residual_modules = pre_norm_res;
    if (type == "qwen3" || type == "qwen3_moe") {
      f.qk = QkNorm::PerHead;
      f.qk_modules = "over each head (tokens * heads x head_dim rows)";
    }
    if (type == "deepseek_v2" || type == "deepseek_v3") {
      f.mla = true;
      if (type == "deepseek_v3")
        f.hidden_modules = "input_layernorm, post_attention_layernorm, norm (final), the MTP layers' enorm / hnorm";
    }
  } else if (type == "gemma" || type == "gemma2" || type == "gemma3" || type == "gemma3_text") {
    f.cast = CastMode::Gemma;
    f.weight_offset = 1.f;
    f.fused_residual = true;
    f.what = "RMSNorm, zero-centred weight (1 + weight), Gemma cast (fp32 throughout)";
    if (type == "gemma") {
      f.hidden_modules = pre_norm;
      f.residual_modules = pre_norm_res;
    } else {
      f.hidden_modules = "input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, "
                         "post_feedforward_layernorm (4 a layer), norm (final)";
      f.residual_modules = "input_layernorm (from the second layer), pre_feedforward_layernorm, norm (final), with "
                           "the residual add fused";
    }
    if (type == "gemma3" || type == "gemma3_text") {
      f.qk = QkNorm::PerHead;
      f.gemma3_defaults = true;
      f.qk_modules = "over each head (tokens * heads x head_dim rows), 1 + weight";
    }
  } else if (type == "olmo2") {
    // Post-norms (norm, then the residual add): nothing to fuse; weight * x
    // in fp32 (Olmo2RMSNorm).
    f.what = "RMSNorm, weight applied in fp32 (default cast)";
    f.qk = QkNorm::FullWidth;
    f.hidden_modules = "post_attention_layernorm, post_feedforward_layernorm, norm (final)";
    f.qk_modules = "over the whole projection, not per head (tokens x heads * head_dim rows)";
  } else if (type == "gpt2" || (!c.has("hidden_size") && c.has("n_embd"))) {
    f.norm = NormKind::LayerNorm;
    f.hidden_key = "n_embd";
    f.eps_key = "layer_norm_epsilon";
    f.what = "LayerNorm with bias";
    f.hidden_modules = "ln_1, ln_2, ln_f";
    f.known = type == "gpt2";
  } else if (type == "gpt_neox") {
    f.norm = NormKind::LayerNorm;
    f.eps_key = "layer_norm_eps";
    f.what = "LayerNorm with bias";
    f.hidden_modules = "input_layernorm, post_attention_layernorm, final_layer_norm";
  } else if (type == "falcon" || type == "RefinedWeb" || type == "RefinedWebModel") {
    f.norm = NormKind::LayerNorm;
    f.eps_key = "layer_norm_epsilon";
    f.what = "LayerNorm with bias";
    f.hidden_modules = "input_layernorm (ln_attn and ln_mlp with new_decoder_architecture), ln_f";
  } else {
    f.known = false;
    f.what = "RMSNorm (model_type not known to normjit: a plain RMSNorm, default cast)";
    f.hidden_modules = "the hidden norms (model_type not known: check its norm code)";
  }
  return f;
}

void add_op(std::vector<Op>& ops, Op op) {
  if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  std::sort(ops.begin(), ops.end());
}

}  // namespace

ModelNorms model_norms(const std::string& path, const std::vector<std::int64_t>& tokens) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' cannot be opened", path));
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' is not valid JSON: {}", path, e.what()));
  }
  if (!j.is_object()) throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' is not a JSON object", path));
  const ConfigReader c(j, path);
  ModelNorms out;
  const std::string type = c.string("model_type");
  // json::value throws type_error for a key of another type: read strings only.
  const std::string top_type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : std::string();
  out.model_type = type.empty() ? "(none)" : type;
  if (c.nested() && top_type != type && !top_type.empty())
    out.model_type = fmt::format("{} (text_config: {})", top_type, type.empty() ? "(none)" : type);
  const Family f = family_of(type, c);

  // The hidden size: no recognisable key is an architecture normjit cannot read.
  std::string hidden_label;
  if (!c.has(f.hidden_key)) {
    std::vector<std::string> tried;
    for (const char* k : {"hidden_size", "n_embd"}) tried.push_back(c.where(k));
    throw c.error(fmt::format(
        "no hidden size: none of the keys {} is in the config (model_type '{}'{}); normjit reads hidden_size (Llama, "
        "Qwen, Gemma, DeepSeek, OLMo 2, GPT-NeoX, Falcon families) or n_embd (GPT-2)",
        fmt::join(tried, ", "), type, f.known ? "" : ", not a model_type normjit knows"));
  }
  const std::int64_t hidden = c.integer(f.hidden_key, hidden_label, "the hidden size");

  NormDesc base;
  base.norm = f.norm;
  base.has_bias = f.norm == NormKind::LayerNorm;
  base.cast_mode = f.cast;
  base.weight_offset = f.weight_offset;
  std::string dtype_label, eps_label;
  base.x_dtype = base.y_dtype = base.weight_dtype = base.residual_dtype = base.residual_out_dtype =
      base.y_hp_dtype = base.grad_dtype = c.dtype(dtype_label);
  base.eps = c.eps(f.eps_key, default_eps(f.norm), eps_label);
  out.summary = fmt::format("{}, {}, eps {}", f.what, dtype_name(base.x_dtype), base.eps);
  std::string type_label = "model_type";
  c.find("model_type", &type_label);

  // QK-norm geometry.
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  std::string heads_label, kv_label, head_dim_label;
  if (f.qk != QkNorm::None) {
    using Fallback = std::optional<std::pair<std::int64_t, std::string>>;
    const char* why = "QK-norm rows";
    heads = c.integer("num_attention_heads", heads_label, why,
                      f.gemma3_defaults ? Fallback{{8, "8, Gemma3TextConfig's default"}} : std::nullopt);
    kv_heads = c.integer("num_key_value_heads", kv_label, why,
                         f.gemma3_defaults ? Fallback{{4, "4, Gemma3TextConfig's default"}}
                                           : Fallback{{heads, "= num_attention_heads"}});
    head_dim = c.integer("head_dim", head_dim_label, why,
                         f.gemma3_defaults ? Fallback{{256, "256, Gemma3TextConfig's default"}}
                                           : Fallback{{hidden / heads, "hidden size / num_attention_heads"}});
  }
  // MLA ranks: a null q_lora_rank (DeepSeek-V2-Lite) has no q_a_layernorm.
  // Absent ranks take the defaults of transformers' DeepseekV2/V3Config.
  std::int64_t q_rank = 0, kv_rank = 0, rope_dim = 0;
  std::string q_rank_label, kv_rank_label, rope_label;
  if (f.mla) {
    const bool q_null = (j.contains("q_lora_rank") && j["q_lora_rank"].is_null()) ||
                        (j.contains("text_config") && j["text_config"].is_object() &&
                         j["text_config"].contains("q_lora_rank") && j["text_config"]["q_lora_rank"].is_null());
    const std::string cls = type == "deepseek_v2" ? "DeepseekV2Config" : "DeepseekV3Config";
    using Fallback = std::optional<std::pair<std::int64_t, std::string>>;
    if (!q_null)
      q_rank = c.integer("q_lora_rank", q_rank_label, "q_a_layernorm's width", Fallback{{1536, "1536, " + cls + "'s default"}});
    kv_rank = c.integer("kv_lora_rank", kv_rank_label, "kv_a_layernorm's width", Fallback{{512, "512, " + cls + "'s default"}});
    rope_dim = c.integer("qk_rope_head_dim", rope_label, "the row stride of kv_a_layernorm's input",
                         Fallback{{64, "64, " + cls + "'s default"}});
  }
  // FP8 checkpoints (DeepSeek-V3 style: quantization_config.quant_method
  // "fp8" with weight_block_size [128, 128]) quantize the activations the
  // hidden norms feed into per-token groups of the block's width, with
  // column-major scales (the layout DeepGEMM-style GEMMs read); without a
  // block size, per token.
  std::int64_t fp8_group = -1;  // -1: no FP8; 0: per token
  std::vector<std::string> fp8_keys;
  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const auto& q = j["quantization_config"];
    if (q.contains("quant_method") && q["quant_method"] == "fp8") {  // false for a non-string
      fp8_group = 0;
      fp8_keys.push_back("quantization_config.quant_method");
      if (q.contains("weight_block_size") && q["weight_block_size"].is_array() && q["weight_block_size"].size() == 2 &&
          q["weight_block_size"][1].is_number_integer()) {
        fp8_group = q["weight_block_size"][1].get<std::int64_t>();
        // An int cast of 2^32 + 128 gave group 128; a group < 1 gave no FP8 norm at all.
        if (fp8_group < 1 || fp8_group > 1 << 20)
          throw c.error(fmt::format("'quantization_config.weight_block_size' [.., {}] is not a block size", fp8_group));
        fp8_keys.push_back("quantization_config.weight_block_size");
      }
    }
  }

  auto add_kind = [&](const std::string& kind, const std::string& modules) {
    for (const auto& k : out.kinds)
      if (k.first == kind) return;
    out.kinds.emplace_back(kind, modules);
  };
  std::map<std::string, std::size_t> seen;  // full spec -> index in out.norms
  auto add = [&](const std::string& kind, std::int64_t t, const NormDesc& d, std::vector<Op> ops,
                 std::vector<std::string> keys) {
    const std::string name = fmt::format("{}[{}]", kind, t);
    try {
      d.validate();
    } catch (const Error& e) {
      throw c.error(fmt::format("{} ({}): {}", name, shape_spec(d), e.message()));
    }
    const std::string spec = full_shape_spec(d);
    if (auto it = seen.find(spec); it != seen.end()) {
      ModelNorm& m = out.norms[it->second];
      m.also.push_back(name);
      for (Op op : ops) add_op(m.ops, op);
      for (auto& k : keys)
        if (std::find(m.keys.begin(), m.keys.end(), k) == m.keys.end()) m.keys.push_back(k);
      return;
    }
    seen.emplace(spec, out.norms.size());
    out.norms.push_back({{name, d}, kind, std::move(ops), std::move(keys), {}});
  };
  const std::vector<Op> train = {Op::Forward, Op::Backward}, serve = {Op::Forward};

  add_kind("hidden", f.hidden_modules);
  if (f.fused_residual) add_kind("hidden_res", f.residual_modules);
  if (fp8_group >= 0)
    add_kind("hidden_fp8", fmt::format("the hidden norms feeding FP8 GEMMs, y quantized to E4M3 ({}), inference only",
                                       fp8_group > 0 ? fmt::format("per-token groups of {}, column-major scales", fp8_group)
                                                     : std::string("per token")));
  if (f.qk != QkNorm::None) {
    add_kind("q_norm", "self_attn.q_norm " + f.qk_modules);
    add_kind("k_norm", "self_attn.k_norm " + f.qk_modules);
  }
  if (f.mla) {
    if (q_rank) add_kind("q_a_norm", "self_attn.q_a_layernorm over the q_lora_rank wide q_a_proj output");
    add_kind("kv_a_norm", "self_attn.kv_a_layernorm over the first kv_lora_rank columns of kv_a_proj_with_mqa's output "
                          "(a view: row stride kv_lora_rank + qk_rope_head_dim)");
  }

  if (f.mla && (kv_rank > INT64_MAX / 2 || rope_dim > INT64_MAX / 2))
    throw c.error(fmt::format("{} + {} overflows", kv_rank_label, rope_label));
  // a * b, or an error naming what overflowed (huge token counts or head counts).
  auto product = [&](std::int64_t a, std::int64_t b, const std::string& what) {
    if (a > 0 && b > INT64_MAX / a) throw c.error(fmt::format("{} = {} x {} overflows", what, a, b));
    return a * b;
  };
  const std::vector<std::string> common = {eps_label, dtype_label, type_label};
  auto keys_of = [&](std::vector<std::string> k) {
    k.insert(k.end(), common.begin(), common.end());
    return k;
  };
  for (std::int64_t t : tokens) {
    if (t < 1) throw Error(ErrorKind::InvalidArgument, fmt::format("--tokens value {} must be >= 1", t));
    NormDesc d = base;
    d.M = t;
    d.N = hidden;
    add("hidden", t, d, train, keys_of({hidden_label}));
    if (f.fused_residual) {
      NormDesc r = d;
      r.residual = r.store_residual_out = true;  // h = x + residual, rounded to and written in the model dtype
      add("hidden_res", t, r, serve, keys_of({hidden_label}));
    }
    if (fp8_group >= 0) {
      NormDesc q = d;
      q.y_dtype = DType::E4M3;
      q.quant = fp8_group > 0 ? QuantScaling::Group : QuantScaling::Token;
      if (fp8_group > 0) {
        q.quant_group = static_cast<int>(fp8_group);
        q.scale_col_major = true;
      }
      q.store_rstd = false;  // inference: nothing for a backward
      std::vector<std::string> k = {hidden_label};
      k.insert(k.end(), fp8_keys.begin(), fp8_keys.end());
      add("hidden_fp8", t, q, serve, keys_of(k));
    }
    if (f.qk == QkNorm::PerHead) {
      NormDesc q = d;
      q.N = head_dim;
      q.M = product(t, heads, "tokens x " + heads_label);
      add("q_norm", t, q, train, keys_of({heads_label, head_dim_label}));
      q.M = product(t, kv_heads, "tokens x " + kv_label);
      add("k_norm", t, q, train, keys_of({kv_label, head_dim_label}));
    } else if (f.qk == QkNorm::FullWidth) {
      NormDesc q = d;
      q.N = product(heads, head_dim, heads_label + " x " + head_dim_label);
      add("q_norm", t, q, train, keys_of({heads_label, head_dim_label}));
      q.N = product(kv_heads, head_dim, kv_label + " x " + head_dim_label);
      add("k_norm", t, q, train, keys_of({kv_label, head_dim_label}));
    }
    if (f.mla) {
      NormDesc m = d;
      if (q_rank) {
        m.N = q_rank;
        add("q_a_norm", t, m, train, keys_of({q_rank_label}));
      }
      m.N = kv_rank;
      // A view into [kv_lora_rank | k_pe]; dx is dense. Both are <= INT64_MAX / 2 (see above).
      m.x_stride = kv_rank + rope_dim;
      add("kv_a_norm", t, m, train, keys_of({kv_rank_label, rope_label}));
    }
  }
  return out;
}

std::vector<NamedShape> shapes_from_model_config(const std::string& path, const std::vector<std::int64_t>& tokens) {
  std::vector<NamedShape> out;
  for (auto& n : model_norms(path, tokens).norms)
    if (n.kind == "hidden" || n.kind == "hidden_fp8" || n.kind == "q_norm" || n.kind == "k_norm")
      out.push_back(std::move(n.shape));
  return out;
}

}  // namespace normjit::detail
