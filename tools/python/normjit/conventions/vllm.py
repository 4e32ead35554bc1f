"""vLLM's fused FP8 RMSNorm ops (its torch.ops._C.rms_norm_static_fp8_quant,
fused_add_rms_norm_static_fp8_quant, rms_norm_dynamic_per_token_quant and
rms_norm_per_block_quant, as vllm/_custom_ops.py calls them), on normjit.

The convention (RMSNorm: Zhang & Sennrich 2019), for x of dtype T (fp16 or
bf16) and a weight of dtype T, fmax the FP8 dtype's largest value:
    rstd = 1 / sqrt(mean(h^2) + epsilon)            (fp32)
    y    = T(T(h * rstd) * weight)                   (the Llama cast)
    q    = saturate(round(y / scale))                (scales dequantize)
- static: scale is the caller's [1] fp32 tensor.
- dynamic per token: scale[i] = max(min(amax_i, scale_ub) / fmax, smin),
  amax_i = max |y[i, :]|, smin = 1 / (fmax * 512); scales [M, 1] fp32.
- per token group (1 x G, G = 64 or 128): the same per group; scales
  [M, N / G], or [N / G, M] seen as [M, N / G] with is_scale_transposed.
- the fused residual add: residual is updated in place to T(input +
  residual). The static op normalises that rounded sum; the dynamic ops
  normalise the fp32 sum.
scale_ub (vLLM caps amax) becomes normjit's scale_ub = fl32(ub / fmax):
min(amax, ub) / fmax = min(amax / fmax, ub / fmax), and fp32 division is
monotone, so the scales are the same numbers. A scale_ub tensor is read on
the host (one synchronisation): pass a float to avoid it.

Costs beside normjit's own API: out= is filled by a copy, and the in-place
residual update is a copy of normjit's h into residual. Call
normjit.torch.rms_norm_fp8 directly where those copies matter.
"""

import torch

from .. import torch as njt

__all__ = ["fused_add_rms_norm_static_fp8_quant", "min_scale", "rms_norm_dynamic_per_token_quant",
           "rms_norm_per_block_quant", "rms_norm_static_fp8_quant"]


def _f32(v):
    return torch.tensor([v], dtype=torch.float32)


def min_scale(fp8_dtype):
    """vLLM's least dynamic scale, 1 / (fmax * 512), as fp32 arithmetic gives it."""
    return (1.0 / (_f32(torch.finfo(fp8_dtype).max) * 512.0)).item()


def _scale_ub(scale_ub, fp8_dtype):
    """vLLM's amax cap as normjit's scale cap: fl32(ub / fmax) (None: none)."""
    if scale_ub is None:
        return None
    ub = float(scale_ub.reshape(-1)[0].item()) if isinstance(scale_ub, torch.Tensor) else float(scale_ub)
    return (_f32(ub) / _f32(torch.finfo(fp8_dtype).max)).item()


def rms_norm_static_fp8_quant(out, input, weight, scale, epsilon):
    """out <- q of input with the caller's scale ([1] fp32, dequantizing).

    out: FP8 tensor of input's shape; input: [..., N] fp16 / bf16 CUDA
    tensor; weight: [N], input's dtype; epsilon: float. Returns None.
    """
    r = njt.rms_norm_fp8(input, input.shape[-1], weight, epsilon, quant="tensor-static", fp8_dtype=out.dtype,
                         scale=scale, cast_mode="llama")
    out.copy_(r.q)


def fused_add_rms_norm_static_fp8_quant(out, input, residual, weight, scale, epsilon):
    """residual <- T(input + residual); out <- q of that sum's RMSNorm with
    the caller's scale. Arguments as rms_norm_static_fp8_quant(); residual
    of input's shape and dtype. Returns None."""
    r = njt.rms_norm_fp8(input, input.shape[-1], weight, epsilon, quant="tensor-static", fp8_dtype=out.dtype,
                         scale=scale, cast_mode="llama", residual=residual, residual_rounding="residual")
    out.copy_(r.q)
    residual.copy_(r.h)


def rms_norm_dynamic_per_token_quant(input, weight, epsilon, quant_dtype, scale_ub=None, residual=None):
    """(q, scales [M, 1] fp32) with one scale per token; residual (if given)
    <- T(input + residual), the fp32 sum normalised. quant_dtype: an FP8
    dtype; scale_ub: None, a float or a one-element tensor capping amax."""
    r = njt.rms_norm_fp8(input, input.shape[-1], weight, epsilon, quant="token", fp8_dtype=quant_dtype,
                         scale_ub=_scale_ub(scale_ub, quant_dtype), scale_min=min_scale(quant_dtype),
                         cast_mode="llama", residual=residual, residual_rounding="fp32")
    if residual is not None:
        residual.copy_(r.h)
    return r.q, r.scale.reshape(-1, 1)


def rms_norm_per_block_quant(input, weight, epsilon, quant_dtype, group_size, scale_ub=None, residual=None,
                             is_scale_transposed=False):
    """(q, scales) with one scale per 1 x G group of a token: [M, N / G], or
    with is_scale_transposed a [N / G, M] buffer seen as [M, N / G].
    group_size: G or vLLM's [1, G]. Other arguments as
    rms_norm_dynamic_per_token_quant()."""
    G = int(group_size[-1]) if isinstance(group_size, (list, tuple)) else int(group_size)
    r = njt.rms_norm_fp8(input, input.shape[-1], weight, epsilon, quant="group", group_size=G,
                         scale_col_major=is_scale_transposed, fp8_dtype=quant_dtype,
                         scale_ub=_scale_ub(scale_ub, quant_dtype), scale_min=min_scale(quant_dtype),
                         cast_mode="llama", residual=residual, residual_rounding="fp32")
    if residual is not None:
        residual.copy_(r.h)
    return r.q, r.scale
