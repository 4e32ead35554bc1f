"""Fused quantized norms under the conventions of the engines users port
from, as thin functions over normjit.torch.rms_norm_fp8 / layer_norm_fp8:

- normjit.conventions.vllm: vLLM's fused FP8 RMSNorm ops (static per-tensor,
  dynamic per-token, per-token-group; the fused residual add updating the
  residual in place; the Llama cast before quantization; vLLM's minimum
  scale and its scale_ub on amax).
- normjit.conventions.te: TransformerEngine's FP8 norm forward under delayed
  scaling (a quantizing scale, scale_inv beside the output, amax returned
  for the amax history; zero-centred gamma).

Each convention is written down in its module's docstring and tested
against a float64 implementation written from it (tests/python/test_conventions.py).
"""

from . import te, vllm

__all__ = ["te", "vllm"]
