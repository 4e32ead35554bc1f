"""TransformerEngine's FP8 norm forward under delayed scaling, on normjit.

TransformerEngine names scales the other way round from normjit: its
`scale` quantizes (q = fp8(y * scale), the scale it derives from the amax
history, fmax / amax), and `scale_inv` = 1 / scale dequantizes (kept beside
the FP8 data; normjit calls that the scale). The forward also returns
amax = max |y| of this call, which TransformerEngine appends to the amax
history for the next step's scale, and rstd (and LayerNorm's mean) for the
backward. zero_centered_gamma: y uses (1 + gamma), normjit's weight_offset
= 1. The norm itself is computed in fp32 and rounded once (RMSNorm: Zhang &
Sennrich 2019; LayerNorm: Ba et al. 2016).

normjit quantizes with q = saturate(round(y * (1 / scale_inv))) where
scale_inv = fl32(1 / scale): that multiplier may differ from scale in its
last bit, which moves a code only where y * scale lies within an fp32 ulp of
a rounding boundary of the FP8 grid.
"""

import torch

from .. import torch as njt

__all__ = ["layernorm_fwd_fp8", "rmsnorm_fwd_fp8"]


def _run(norm_fn, inp, weight, bias, eps, scale, fp8_dtype, zero_centered_gamma, amax):
    scale = scale.reshape(1).float()
    scale_inv = torch.reciprocal(scale)
    kw = dict(quant="tensor-static", fp8_dtype=fp8_dtype, scale=scale_inv, return_amax=True, return_stats=True,
              weight_offset=1.0 if zero_centered_gamma else 0.0)
    r = norm_fn(inp, inp.shape[-1], weight, bias, eps, **kw) if bias is not False else \
        norm_fn(inp, inp.shape[-1], weight, eps, **kw)
    if amax is not None:
        amax.reshape(-1)[:1].copy_(r.amax)
    return r, scale_inv


def rmsnorm_fwd_fp8(inp, weight, eps, scale, fp8_dtype, *, zero_centered_gamma=False, amax=None):
    """RMSNorm forward to FP8 with a delayed-scaling `scale` (quantizing).

    inp: [..., N] CUDA tensor (fp32 / fp16 / bf16); weight: [N]; scale: [1]
    fp32 tensor; fp8_dtype: torch.float8_e4m3fn or torch.float8_e5m2;
    amax: optional fp32 tensor whose first element receives max |y|.
    Returns (out, scale_inv, amax, rstd): out FP8 of inp's shape, scale_inv
    [1] fp32 = 1 / scale, amax [1] fp32, rstd [M] fp32.
    """
    r, scale_inv = _run(njt.rms_norm_fp8, inp, weight, False, eps, scale, fp8_dtype, zero_centered_gamma, amax)
    return r.q, scale_inv, r.amax, r.rstd


def layernorm_fwd_fp8(inp, weight, bias, eps, scale, fp8_dtype, *, zero_centered_gamma=False, amax=None):
    """LayerNorm forward to FP8 with a delayed-scaling `scale`; as
    rmsnorm_fwd_fp8() plus bias ([N]). Returns (out, scale_inv, amax, mean,
    rstd)."""
    r, scale_inv = _run(njt.layer_norm_fp8, inp, weight, bias, eps, scale, fp8_dtype, zero_centered_gamma, amax)
    return r.q, scale_inv, r.amax, r.mean, r.rstd
