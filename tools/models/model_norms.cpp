#include "models/model_norms.hpp"

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

const std::vector<std::int64_t>& default_token_counts() {
  static const std::vector<std::int64_t> t = {1, 1024, 8192};
  return t;
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

// The parsed config.json at `path`, a JSON object.
json read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' cannot be opened", path));
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' is not valid JSON: {}", path, e.what()));
  }
  if (!j.is_object()) throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' is not a JSON object", path));
  return j;
}

// The model_type for ModelNorms::model_type: "(none)" when absent, the top
// level's too when text_config names another.
std::string model_type_name(const ConfigReader& c, const std::string& type) {
  const json& j = c.top();
  // json::value throws type_error for a key of another type: read strings only.
  const std::string top_type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : std::string();
  if (c.nested() && top_type != type && !top_type.empty())
    return fmt::format("{} (text_config: {})", top_type, type.empty() ? "(none)" : type);
  return type.empty() ? "(none)" : type;
}

// The sizes the norms are built from, each with the label of the key it came
// from (see ConfigReader).
struct Geometry {
  std::int64_t hidden = 0;
  std::string hidden_label;
  // QK-norm geometry.
  std::int64_t heads = 0, kv_heads = 0, head_dim = 0;
  std::string heads_label, kv_label, head_dim_label;
  // MLA ranks.
  std::int64_t q_rank = 0, kv_rank = 0, rope_dim = 0;
  std::string q_rank_label, kv_rank_label, rope_label;
  std::int64_t fp8_group = -1;  // -1: no FP8; 0: per token
  std::vector<std::string> fp8_keys;
};

// The hidden size: no recognisable key is an architecture normjit cannot read.
void read_hidden_size(const ConfigReader& c, const Family& f, const std::string& type, Geometry& g) {
  if (!c.has(f.hidden_key)) {
    std::vector<std::string> tried;
    for (const char* k : {"hidden_size", "n_embd"}) tried.push_back(c.where(k));
    throw c.error(fmt::format(
        "no hidden size: none of the keys {} is in the config (model_type '{}'{}); normjit reads hidden_size (Llama, "
        "Qwen, Gemma, DeepSeek, OLMo 2, GPT-NeoX, Falcon families) or n_embd (GPT-2)",
        fmt::join(tried, ", "), type, f.known ? "" : ", not a model_type normjit knows"));
  }
  g.hidden = c.integer(f.hidden_key, g.hidden_label, "the hidden size");
}

// The family's norm in the config's dtype and eps, M and N unset.
NormDesc base_desc(const ConfigReader& c, const Family& f, std::string& dtype_label, std::string& eps_label) {
  NormDesc base;
  base.norm = f.norm;
  base.has_bias = f.norm == NormKind::LayerNorm;
  base.cast_mode = f.cast;
  base.weight_offset = f.weight_offset;
  base.x_dtype = base.y_dtype = base.weight_dtype = base.residual_dtype = base.residual_out_dtype =
      base.y_hp_dtype = base.grad_dtype = c.dtype(dtype_label);
  base.eps = c.eps(f.eps_key, default_eps(f.norm), eps_label);
  return base;
}

using Fallback = std::optional<std::pair<std::int64_t, std::string>>;

// QK-norm geometry.
void read_qk_geometry(const ConfigReader& c, const Family& f, Geometry& g) {
  const char* why = "QK-norm rows";
  g.heads = c.integer("num_attention_heads", g.heads_label, why,
                      f.gemma3_defaults ? Fallback{{8, "8, Gemma3TextConfig's default"}} : std::nullopt);
  g.kv_heads = c.integer("num_key_value_heads", g.kv_label, why,
                         f.gemma3_defaults ? Fallback{{4, "4, Gemma3TextConfig's default"}}
                                           : Fallback{{g.heads, "= num_attention_heads"}});
  g.head_dim = c.integer("head_dim", g.head_dim_label, why,
                         f.gemma3_defaults ? Fallback{{256, "256, Gemma3TextConfig's default"}}
                                           : Fallback{{g.hidden / g.heads, "hidden size / num_attention_heads"}});
}

// MLA ranks: a null q_lora_rank (DeepSeek-V2-Lite) has no q_a_layernorm.
// Absent ranks take the defaults of transformers' DeepseekV2/V3Config.
void read_mla_ranks(const ConfigReader& c, const std::string& type, Geometry& g) {
  const json& j = c.top();
  const bool q_null = (j.contains("q_lora_rank") && j["q_lora_rank"].is_null()) ||
                      (j.contains("text_config") && j["text_config"].is_object() &&
                       j["text_config"].contains("q_lora_rank") && j["text_config"]["q_lora_rank"].is_null());
  const std::string cls = type == "deepseek_v2" ? "DeepseekV2Config" : "DeepseekV3Config";
  if (!q_null)
    g.q_rank = c.integer("q_lora_rank", g.q_rank_label, "q_a_layernorm's width",
                         Fallback{{1536, "1536, " + cls + "'s default"}});
  g.kv_rank = c.integer("kv_lora_rank", g.kv_rank_label, "kv_a_layernorm's width",
                        Fallback{{512, "512, " + cls + "'s default"}});
  g.rope_dim = c.integer("qk_rope_head_dim", g.rope_label, "the row stride of kv_a_layernorm's input",
                         Fallback{{64, "64, " + cls + "'s default"}});
}

// FP8 checkpoints (DeepSeek-V3 style: quantization_config.quant_method
// "fp8" with weight_block_size [128, 128]) quantize the activations the
// hidden norms feed into per-token groups of the block's width, with
// column-major scales (the layout DeepGEMM-style GEMMs read); without a
// block size, per token.
void read_fp8(const ConfigReader& c, Geometry& g) {
  const json& j = c.top();
  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const auto& q = j["quantization_config"];
    if (q.contains("quant_method") && q["quant_method"] == "fp8") {  // false for a non-string
      g.fp8_group = 0;
      g.fp8_keys.push_back("quantization_config.quant_method");
      if (q.contains("weight_block_size") && q["weight_block_size"].is_array() && q["weight_block_size"].size() == 2 &&
          q["weight_block_size"][1].is_number_integer()) {
        g.fp8_group = q["weight_block_size"][1].get<std::int64_t>();
        // An int cast of 2^32 + 128 gave group 128; a group < 1 gave no FP8 norm at all.
        if (g.fp8_group < 1 || g.fp8_group > 1 << 20)
          throw c.error(
              fmt::format("'quantization_config.weight_block_size' [.., {}] is not a block size", g.fp8_group));
        g.fp8_keys.push_back("quantization_config.weight_block_size");
      }
    }
  }
}

const std::vector<Op> train_ops = {Op::Forward, Op::Backward}, serve_ops = {Op::Forward};

// Collects the norms into a ModelNorms: each kind once, in the order the
// kinds first appear; a norm with the descriptor of an earlier one merged
// into it (its name in `also`, its ops and keys added).
class NormList {
 public:
  // `common`: the keys every norm came from, after its own.
  NormList(ModelNorms& out, const ConfigReader& c, std::vector<std::string> common)
      : out_(out), c_(c), common_(std::move(common)) {}

  void add_kind(const std::string& kind, const std::string& modules) {
    for (const auto& k : out_.kinds)
      if (k.first == kind) return;
    out_.kinds.emplace_back(kind, modules);
  }

  void add(const std::string& kind, std::int64_t t, const NormDesc& d, std::vector<Op> ops,
           std::vector<std::string> keys) {
    const std::string name = fmt::format("{}[{}]", kind, t);
    try {
      d.validate();
    } catch (const Error& e) {
      throw c_.error(fmt::format("{} ({}): {}", name, shape_spec(d), e.message()));
    }
    const std::string spec = full_shape_spec(d);
    if (auto it = seen_.find(spec); it != seen_.end()) {
      ModelNorm& m = out_.norms[it->second];
      m.also.push_back(name);
      for (Op op : ops) add_op(m.ops, op);
      for (auto& k : keys)
        if (std::find(m.keys.begin(), m.keys.end(), k) == m.keys.end()) m.keys.push_back(k);
      return;
    }
    seen_.emplace(spec, out_.norms.size());
    out_.norms.push_back({{name, d}, kind, std::move(ops), std::move(keys), {}});
  }

  // `k`, then the common keys.
  std::vector<std::string> keys_of(std::vector<std::string> k) const {
    k.insert(k.end(), common_.begin(), common_.end());
    return k;
  }

  // a * b, or an error naming what overflowed (huge token counts or head counts).
  std::int64_t product(std::int64_t a, std::int64_t b, const std::string& what) const {
    if (a > 0 && b > INT64_MAX / a) throw c_.error(fmt::format("{} = {} x {} overflows", what, a, b));
    return a * b;
  }

 private:
  ModelNorms& out_;
  const ConfigReader& c_;
  std::vector<std::string> common_;
  std::map<std::string, std::size_t> seen_;  // full spec -> index in out.norms
};

// The kinds of norm the model calls and the modules that call them.
void add_kinds(const Family& f, const Geometry& g, NormList& list) {
  list.add_kind("hidden", f.hidden_modules);
  if (f.fused_residual) list.add_kind("hidden_res", f.residual_modules);
  if (g.fp8_group >= 0)
    list.add_kind("hidden_fp8",
                  fmt::format("the hidden norms feeding FP8 GEMMs, y quantized to E4M3 ({}), inference only",
                              g.fp8_group > 0 ? fmt::format("per-token groups of {}, column-major scales", g.fp8_group)
                                              : std::string("per token")));
  if (f.qk != QkNorm::None) {
    list.add_kind("q_norm", "self_attn.q_norm " + f.qk_modules);
    list.add_kind("k_norm", "self_attn.k_norm " + f.qk_modules);
  }
  if (f.mla) {
    if (g.q_rank) list.add_kind("q_a_norm", "self_attn.q_a_layernorm over the q_lora_rank wide q_a_proj output");
    list.add_kind("kv_a_norm", "self_attn.kv_a_layernorm over the first kv_lora_rank columns of kv_a_proj_with_mqa's "
                               "output (a view: row stride kv_lora_rank + qk_rope_head_dim)");
  }
}

// The hidden norm `d` writing E4M3 in `group` wide groups (0: per token).
NormDesc fp8_desc(const NormDesc& d, std::int64_t group) {
  NormDesc q = d;
  q.y_dtype = DType::E4M3;
  q.quant = group > 0 ? QuantScaling::Group : QuantScaling::Token;
  if (group > 0) {
    q.quant_group = static_cast<int>(group);
    q.scale_col_major = true;
  }
  q.store_rstd = false;  // inference: nothing for a backward
  return q;
}

// hidden[t], hidden_res[t] and hidden_fp8[t]; `d` is the hidden norm of t tokens.
void add_hidden_norms(const Family& f, const Geometry& g, const NormDesc& d, std::int64_t t, NormList& list) {
  list.add("hidden", t, d, train_ops, list.keys_of({g.hidden_label}));
  if (f.fused_residual) {
    NormDesc r = d;
    r.residual = r.store_residual_out = true;  // h = x + residual, rounded to and written in the model dtype
    list.add("hidden_res", t, r, serve_ops, list.keys_of({g.hidden_label}));
  }
  if (g.fp8_group >= 0) {
    std::vector<std::string> k = {g.hidden_label};
    k.insert(k.end(), g.fp8_keys.begin(), g.fp8_keys.end());
    list.add("hidden_fp8", t, fp8_desc(d, g.fp8_group), serve_ops, list.keys_of(k));
  }
}

// q_norm[t] and k_norm[t], per head or over the whole projection.
void add_qk_norms(const Family& f, const Geometry& g, const NormDesc& d, std::int64_t t, NormList& list) {
  NormDesc q = d;
  if (f.qk == QkNorm::PerHead) {
    q.N = g.head_dim;
    q.M = list.product(t, g.heads, "tokens x " + g.heads_label);
    list.add("q_norm", t, q, train_ops, list.keys_of({g.heads_label, g.head_dim_label}));
    q.M = list.product(t, g.kv_heads, "tokens x " + g.kv_label);
    list.add("k_norm", t, q, train_ops, list.keys_of({g.kv_label, g.head_dim_label}));
  } else if (f.qk == QkNorm::FullWidth) {
    q.N = list.product(g.heads, g.head_dim, g.heads_label + " x " + g.head_dim_label);
    list.add("q_norm", t, q, train_ops, list.keys_of({g.heads_label, g.head_dim_label}));
    q.N = list.product(g.kv_heads, g.head_dim, g.kv_label + " x " + g.head_dim_label);
    list.add("k_norm", t, q, train_ops, list.keys_of({g.kv_label, g.head_dim_label}));
  }
}

// q_a_norm[t] (without a null q_lora_rank) and kv_a_norm[t].
void add_mla_norms(const Geometry& g, const NormDesc& d, std::int64_t t, NormList& list) {
  NormDesc m = d;
  if (g.q_rank) {
    m.N = g.q_rank;
    list.add("q_a_norm", t, m, train_ops, list.keys_of({g.q_rank_label}));
  }
  m.N = g.kv_rank;
  // A view into [kv_lora_rank | k_pe]; dx is dense. Both are <= INT64_MAX / 2 (see model_norms).
  m.x_stride = g.kv_rank + g.rope_dim;
  list.add("kv_a_norm", t, m, train_ops, list.keys_of({g.kv_rank_label, g.rope_label}));
}

}  // namespace

ModelNorms model_norms(const std::string& path, const std::vector<std::int64_t>& tokens) {
  const json j = read_config(path);
  const ConfigReader c(j, path);
  ModelNorms out;
  const std::string type = c.string("model_type");
  out.model_type = model_type_name(c, type);
  const Family f = family_of(type, c);
  Geometry g;
  read_hidden_size(c, f, type, g);

  std::string dtype_label, eps_label;
  const NormDesc base = base_desc(c, f, dtype_label, eps_label);
  out.summary = fmt::format("{}, {}, eps {}", f.what, dtype_name(base.x_dtype), base.eps);
  std::string type_label = "model_type";
  c.find("model_type", &type_label);

  if (f.qk != QkNorm::None) read_qk_geometry(c, f, g);
  if (f.mla) read_mla_ranks(c, type, g);
  read_fp8(c, g);

  NormList list(out, c, {eps_label, dtype_label, type_label});
  add_kinds(f, g, list);
  if (f.mla && (g.kv_rank > INT64_MAX / 2 || g.rope_dim > INT64_MAX / 2))
    throw c.error(fmt::format("{} + {} overflows", g.kv_rank_label, g.rope_label));
  for (std::int64_t t : tokens) {
    if (t < 1) throw Error(ErrorKind::InvalidArgument, fmt::format("--tokens value {} must be >= 1", t));
    NormDesc d = base;
    d.M = t;
    d.N = g.hidden;
    add_hidden_norms(f, g, d, t, list);
    if (f.qk != QkNorm::None) add_qk_norms(f, g, d, t, list);
    if (f.mla) add_mla_norms(g, d, t, list);
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
