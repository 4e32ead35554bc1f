// The norms a Hugging Face model calls, from its config.json: what the CLI
// pre-warms and tunes (--model), and the tests' model shapes. Not part of the
// runtime library: only the CLI and the tests link it (normjit_models).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/shape_spec.hpp"

namespace normjit::detail {

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

/// The hidden, hidden_fp8, q_norm and k_norm shapes of model_norms (the list
/// this function has always returned; the CLI uses model_norms).
std::vector<NamedShape> shapes_from_model_config(const std::string& path, const std::vector<std::int64_t>& tokens);

/// Default token counts for --model: decode, a prefill chunk, a training batch.
const std::vector<std::int64_t>& default_token_counts();

}  // namespace normjit::detail
