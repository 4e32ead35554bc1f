// Shapes to tune and benchmark: from a --shape spec or a model's config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "normjit/normjit.hpp"

namespace normjit::detail {

/// A named norm shape ("hidden", "q_norm", ...).
struct NamedShape {
  std::string name;
  NormDesc desc;
};

/// Parses "rms:bf16:8192x4096" (x, y and weight in one dtype) or
/// "rms:bf16:8192x4096:w=fp32". Throws Error(InvalidArgument) naming the
/// text and what is wrong.
NamedShape parse_shape_spec(const std::string& text);

/// The RMSNorm shapes of a Hugging Face config.json for each token count:
/// the hidden_size norm (tokens x hidden_size) and, for models with QK-norm
/// (Qwen3, Gemma 3, OLMo 2), the per-head norms (tokens * heads x head_dim)
/// of q and k. dtype from torch_dtype (default bf16), eps from rms_norm_eps.
/// Throws Error(InvalidArgument) for an unreadable file or missing fields.
std::vector<NamedShape> shapes_from_model_config(const std::string& path, const std::vector<std::int64_t>& tokens);

/// Default token counts for --model: decode, a prefill chunk, a training batch.
const std::vector<std::int64_t>& default_token_counts();

}  // namespace normjit::detail
