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

/// Parses "<rms|ln>:<dtype>:<M>x<N>[:<option>]...": x, y, weight (and
/// residual) in one dtype, eps 1e-6 (rms) / 1e-5 (ln), LayerNorm with a bias.
/// Options: w=<dtype>, y=<dtype>, res[=<dtype>] (fused residual add writing
/// h), fp32sum, dres, nw (no weight), nb (no bias), off=<weight offset>,
/// cast=<default|llama|gemma>, eps=<eps>, heads=<H> (3-D rows),
/// x_stride=<token stride of x and dx>, ro=<dtype> (residual_out's dtype,
/// after res), noro (the residual sum is not written), norstd, nomean. E.g. "rms:bf16:32768x128:heads=32:x_stride=6144"
/// is QK-norm on a view into a fused QKV projection. Throws
/// Error(InvalidArgument) naming the text and what is wrong.
NamedShape parse_shape_spec(const std::string& text);

/// The spec of `desc`'s kernel variant, N and M: parse_shape_spec of it
/// gives a descriptor with the same variant (Variant::tags), N and M. Strides
/// and eps are left out (they are not compiled in).
std::string shape_spec(const NormDesc& desc);

/// The norm shapes of a Hugging Face config.json for each token count: the
/// hidden norm (tokens x hidden_size: RMSNorm, eps from rms_norm_eps; or, for
/// GPT-2 style configs, tokens x n_embd LayerNorm with bias, eps from
/// layer_norm_epsilon) and, for models with QK-norm (Qwen3, Gemma 3, OLMo 2),
/// the per-head norms (tokens * heads x head_dim) of q and k. dtype from
/// torch_dtype (default bf16).
/// Throws Error(InvalidArgument) for an unreadable file or missing fields.
std::vector<NamedShape> shapes_from_model_config(const std::string& path, const std::vector<std::int64_t>& tokens);

/// Default token counts for --model: decode, a prefill chunk, a training batch.
const std::vector<std::int64_t>& default_token_counts();

}  // namespace normjit::detail
