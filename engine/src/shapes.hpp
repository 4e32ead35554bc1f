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

/// One norm a model calls, derived from its config.json: the descriptor as
/// the runtime calls it, the ops it runs (Forward; Backward too for the norms
/// training runs) and the config keys it came from.
struct ModelNorm {
  NamedShape shape;               ///< "hidden[1024]", "q_norm[1]", ...
  std::string kind;               ///< "hidden", "hidden_res", "hidden_fp8", "q_norm", "k_norm", "q_a_norm", "kv_a_norm"
  std::vector<Op> ops;            ///< Forward, then Backward where training calls it
  std::vector<std::string> keys;  ///< e.g. "hidden_size", "text_config.head_dim", "rms_norm_eps (absent: 1e-06)"
  std::vector<std::string> also;  ///< other norms with the same descriptor, merged into this one
};

/// Every norm of a Hugging Face config.json, for each token count.
struct ModelNorms {
  std::string model_type;  ///< "qwen3", "gemma3 (text_config: gemma3_text)", ...
  std::string summary;     ///< one line: the norm, its weight and casting, dtype, eps
  /// kind -> the modules that call it, in the order the kinds first appear.
  std::vector<std::pair<std::string, std::string>> kinds;
  std::vector<ModelNorm> norms;  ///< per token count in turn; no two with the same descriptor
};

/// Derives the norms a model's forward and backward call from its
/// config.json (keys read from text_config first, e.g. Gemma 3's multimodal
/// configs, then the top level):
///  - hidden: tokens x hidden_size, forward and backward (input, post-attention,
///    Gemma 2/3's pre/post feed-forward and the final norm: one shape);
///  - hidden_res: the same with the fused residual add serving engines call
///    (h = x + residual written, residual in the model dtype), forward only,
///    for the pre-norm families (not OLMo 2's post-norms, not LayerNorm models);
///  - hidden_fp8: with an fp8 quantization_config, the hidden norm writing
///    E4M3 in per-token groups of the weight block width (column-major
///    scales), forward only;
///  - q_norm / k_norm: QK-norm, per head (tokens * heads x head_dim: qwen3,
///    qwen3_moe, gemma3) or over the whole projection (tokens x heads *
///    head_dim: olmo2);
///  - q_a_norm / kv_a_norm: DeepSeek V2/V3 MLA (tokens x q_lora_rank, tokens x
///    kv_lora_rank on the kv_lora_rank + qk_rope_head_dim wide projection).
/// Variants: Llama cast for the Llama family (llama, mistral, mixtral, phi3, qwen2,
/// qwen2_moe, qwen3, qwen3_moe, deepseek_v2, deepseek_v3); weight offset 1
/// and Gemma cast for gemma, gemma2, gemma3; Default for olmo2; LayerNorm with
/// bias for gpt2 (n_embd, layer_norm_epsilon), gpt_neox (layer_norm_eps) and
/// falcon (layer_norm_epsilon). dtype from torch_dtype or dtype (default
/// bf16). An unknown model_type with hidden_size gets a plain RMSNorm (with
/// n_embd, GPT-2's LayerNorm). Throws Error(InvalidArgument) naming the file
/// and the keys that are missing or wrong.
ModelNorms model_norms(const std::string& path, const std::vector<std::int64_t>& tokens);

/// shape_spec(desc) with eps and a token stride of x: a --shape that gives
/// `desc` back (up to dx's stride).
std::string full_shape_spec(const NormDesc& desc);

/// The hidden, hidden_fp8, q_norm and k_norm shapes of model_norms (the list
/// this function has always returned; the CLI uses model_norms).
std::vector<NamedShape> shapes_from_model_config(const std::string& path, const std::vector<std::int64_t>& tokens);

/// Default token counts for --model: decode, a prefill chunk, a training batch.
const std::vector<std::int64_t>& default_token_counts();

}  // namespace normjit::detail
