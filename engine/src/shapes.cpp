#include "shapes.hpp"

#include <fstream>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace normjit::detail {

NamedShape parse_shape_spec(const std::string& text) {
  static const std::regex re(R"(rms:([a-z0-9]+):(\d+)x(\d+)(?::w=([a-z0-9]+))?)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw Error(ErrorKind::InvalidArgument,
                fmt::format("--shape '{}' is not of the form rms:<dtype>:<M>x<N>[:w=<dtype>] (e.g. rms:bf16:8192x4096)", text));
  NamedShape s;
  s.name = text;
  try {
    s.desc.x_dtype = s.desc.y_dtype = parse_dtype(m[1], "dtype");
    s.desc.weight_dtype = m[4].matched ? parse_dtype(m[4], "weight dtype") : s.desc.x_dtype;
    s.desc.M = std::stoll(m[2]);
    s.desc.N = std::stoll(m[3]);
    s.desc.validate();
  } catch (const Error& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--shape '{}': {}", text, e.message()));
  } catch (const std::exception&) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--shape '{}': M or N is out of range", text));
  }
  return s;
}

const std::vector<std::int64_t>& default_token_counts() {
  static const std::vector<std::int64_t> t = {1, 1024, 8192};
  return t;
}

std::vector<NamedShape> shapes_from_model_config(const std::string& path, const std::vector<std::int64_t>& tokens) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' cannot be opened", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' is not valid JSON: {}", path, e.what()));
  }
  auto get_int = [&](const char* key) -> std::int64_t {
    if (!j.contains(key) || !j[key].is_number_integer())
      throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' has no integer '{}'", path, key));
    return j[key].get<std::int64_t>();
  };
  const std::int64_t hidden = get_int("hidden_size");
  NormDesc base;
  try {
    base.x_dtype = base.y_dtype = base.weight_dtype =
        parse_dtype(j.value("torch_dtype", std::string("bfloat16")), "torch_dtype");
  } catch (const Error& e) {
    throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}': {}", path, e.message()));
  }
  base.eps = static_cast<float>(j.value("rms_norm_eps", 1e-6));
  static const std::set<std::string> qk_norm_models = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text", "olmo2"};
  const bool qk = qk_norm_models.count(j.value("model_type", std::string()));
  std::int64_t head_dim = 0, heads = 0, kv_heads = 0;
  if (qk) {
    heads = get_int("num_attention_heads");
    kv_heads = j.contains("num_key_value_heads") ? get_int("num_key_value_heads") : heads;
    head_dim = j.contains("head_dim") ? get_int("head_dim") : hidden / heads;
  }
  std::vector<NamedShape> out;
  for (std::int64_t t : tokens) {
    if (t < 1) throw Error(ErrorKind::InvalidArgument, fmt::format("--tokens value {} must be >= 1", t));
    NormDesc d = base;
    d.M = t;
    d.N = hidden;
    out.push_back({fmt::format("hidden[{}]", t), d});
    if (qk) {
      d.N = head_dim;
      d.M = t * heads;
      out.push_back({fmt::format("q_norm[{}]", t), d});
      d.M = t * kv_heads;
      out.push_back({fmt::format("k_norm[{}]", t), d});
    }
  }
  for (auto& s : out) {
    try {
      s.desc.validate();
    } catch (const Error& e) {
      throw Error(ErrorKind::InvalidArgument, fmt::format("--model '{}' ({}): {}", path, s.name, e.message()));
    }
  }
  return out;
}

}  // namespace normjit::detail
