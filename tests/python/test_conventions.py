"""normjit.conventions against float64 implementations of each convention,
written from its documentation (the module docstrings of
normjit/conventions/vllm.py and te.py): vLLM's fused FP8 RMSNorm ops
(static, fused residual add, dynamic per token with scale_ub on amax and
vLLM's minimum scale, per token group) and TransformerEngine's delayed
scaling (quantizing scale, scale_inv, amax, rstd, zero-centred gamma).

Bounds (every code must lie in its interval; none may fall outside):
- rstd: the kernels sum squares in fp32, each thread at most 64 terms in
  sequence and then a tree of at most 10 levels, so the sum is within
  gamma_74 = 74 * 2^-24 < 2^-17.7 relative, rstd within half of that plus
  rsqrtf's 2^-22: under DELTA = 2^-18 relative.
- y: h * rstd is within DELTA (relative) of float64's; where the convention
  rounds to T, both ends of that interval are rounded (rounding is
  monotone), then multiplied by the weight (exact in float64) and rounded
  again. Without T roundings (TransformerEngine), y's interval is DELTA
  times the magnitudes it is computed from.
- q: the kernels multiply y by fl32(1 / scale) and round once to E4M3, so
  q lies between the E4M3 roundings of the interval's ends widened by
  2^-23. A scale (an amax over such y, / fmax) is within 2 ulps of T.
GPU only.
"""

import pytest

from conftest import gpu_torch_or_skip

torch = gpu_torch_or_skip(fp8=True)

from normjit.conventions import te, vllm  # noqa: E402

DEV = torch.device("cuda")
E4M3 = torch.float8_e4m3fn
FMAX = 448.0


DELTA = 2.0 ** -18


def ordinal(q):
    """E4M3 codes in value order (sign-magnitude bits to integers)."""
    a = q.view(torch.uint8).int()
    return torch.where(a >= 128, -(a - 128), a)


def codes_within(q, lo, hi):
    """Every code of q within the E4M3 roundings of [lo, hi] (float64 q values)."""
    slack = 2.0 ** -23
    lo = torch.minimum(lo * (1 - slack), lo * (1 + slack))
    hi = torch.maximum(hi * (1 - slack), hi * (1 + slack))
    o = ordinal(q)
    outside = (o < ordinal(e4m3(lo))) | (o > ordinal(e4m3(hi)))
    assert outside.sum().item() == 0, f"{outside.sum().item()} codes outside their bounds"


def e4m3(v):
    """float64 values rounded once to E4M3 (nearest, ties to even, saturated
    at 448): a cast through fp32 would round twice, and y / scale lands on
    an E4M3 midpoint often (bf16 y over a scale from a bf16 amax)."""
    a = v.abs().clamp(max=FMAX)
    step = torch.exp2(torch.floor(torch.log2(a.clamp(min=2.0 ** -6))) - 3)  # 3 mantissa bits; subnormals below 2^-6
    r = (torch.round(a / step) * step).clamp(max=FMAX)  # exact in float64; round() is half-to-even
    return (torch.sign(v) * r).float().to(E4M3)  # on the E4M3 grid: the casts are exact



def vllm_y(x, w, eps, residual=None, normalise_rounded_sum=False):
    """vLLM's y in float64 with its T roundings, the interval (lo, hi) the
    kernels' y may take (see the bounds above), and the residual it leaves."""
    T = x.dtype
    h = x.double() + (residual.double() if residual is not None else 0.0)
    h_out = h.to(T) if residual is not None else None
    if normalise_rounded_sum:
        h = h_out.double()
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    t = h * rstd
    wd = w.double()

    def y_of(t):
        return (t.to(T).double() * wd).to(T).double()

    a, b = y_of(t - DELTA * t.abs()), y_of(t + DELTA * t.abs())
    return y_of(t), (torch.minimum(a, b), torch.maximum(a, b)), h_out


def inputs(M, N, T=torch.bfloat16, tiny_row=True):
    x = torch.randn(M, N, device=DEV, dtype=T)
    if tiny_row:  # a token whose scale is vLLM's minimum, 1 / (fmax * 512): eps dominates its rstd
        x[3] *= 1e-8
    w = (1 + 0.1 * torch.randn(N, device=DEV)).to(T)
    return x, w


def check_scales(got, ref, T):
    rel = 2.0 * torch.finfo(T).eps
    assert torch.all((got.double() - ref).abs() <= rel * ref), (got, ref)


@pytest.mark.parametrize("T", [torch.bfloat16, torch.float16])
def test_vllm_static_and_fused_add(T):
    M, N, eps = 64, 4096, 1e-6
    x, w = inputs(M, N, T, tiny_row=False)
    scale = torch.tensor([0.01], device=DEV)
    out = torch.full((M, N), float("nan"), device=DEV).to(E4M3)  # poisoned
    vllm.rms_norm_static_fp8_quant(out, x, w, scale, eps)
    _, (lo, hi), _ = vllm_y(x, w, eps)
    codes_within(out, lo / 0.01, hi / 0.01)
    r = torch.randn(M, N, device=DEV, dtype=T)
    r0 = r.clone()
    out2 = torch.empty(M, N, device=DEV, dtype=E4M3)
    vllm.fused_add_rms_norm_static_fp8_quant(out2, x, r, w, scale, eps)
    _, (lo, hi), h = vllm_y(x, w, eps, residual=r0, normalise_rounded_sum=True)
    assert torch.equal(r, h)  # updated in place to T(input + residual)
    codes_within(out2, lo / 0.01, hi / 0.01)


@pytest.mark.parametrize("with_ub,with_residual", [(False, False), (True, False), (True, True)])
def test_vllm_dynamic_per_token(with_ub, with_residual):
    M, N, eps, T = 96, 2048, 1e-6, torch.bfloat16
    x, w = inputs(M, N, T)
    r = torch.randn(M, N, device=DEV, dtype=T) if with_residual else None
    if with_residual:
        r[3] *= 1e-8  # h of token 3 stays tiny
    r0 = r.clone() if with_residual else None
    y, (lo, hi), h = vllm_y(x, w, eps, residual=r0)
    amax = y.abs().amax(-1, keepdim=True)
    ub = amax.median().item() if with_ub else None  # caps about half of the tokens
    q, scales = vllm.rms_norm_dynamic_per_token_quant(x, w, eps, E4M3, scale_ub=ub, residual=r)
    capped = amax.clamp(max=torch.tensor(ub, dtype=torch.float32).item()) if with_ub else amax
    s = (capped / FMAX).clamp(min=vllm.min_scale(E4M3))
    assert scales.shape == (M, 1) and scales.dtype == torch.float32
    check_scales(scales, s, T)
    assert scales[3].item() == vllm.min_scale(E4M3)
    if with_ub:
        assert (scales.double() < amax / FMAX * (1 - 1e-3)).sum().item() >= M // 3
    codes_within(q, lo / scales.double(), hi / scales.double())
    if with_residual:
        assert torch.equal(r, h)


@pytest.mark.parametrize("G,transposed", [(128, False), (64, True)])
def test_vllm_per_block(G, transposed):
    M, N, eps, T = 40, 2048, 1e-6, torch.bfloat16
    x, w = inputs(M, N, T)
    y, (lo, hi), _ = vllm_y(x, w, eps)
    ag = y.view(M, N // G, G).abs().amax(-1)
    ub = ag.median().item()
    q, scales = vllm.rms_norm_per_block_quant(x, w, eps, E4M3, [1, G], scale_ub=ub, is_scale_transposed=transposed)
    s = (ag.clamp(max=ub) / FMAX).clamp(min=vllm.min_scale(E4M3))
    assert scales.shape == (M, N // G) and (scales.stride() == (1, M)) == transposed
    check_scales(scales, s, T)
    s = scales.double().repeat_interleave(G, -1)
    codes_within(q, lo / s, hi / s)


@pytest.mark.parametrize("norm", ["rms", "ln"])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_te_delayed_scaling(norm, zero_centered):
    M, N, eps, T = 77, 1536, 1e-5, torch.bfloat16
    x = torch.randn(M, N, device=DEV, dtype=T)
    w = (0.1 * torch.randn(N, device=DEV)).to(T) if zero_centered else (1 + 0.1 * torch.randn(N, device=DEV)).to(T)
    b = (0.1 * torch.randn(N, device=DEV)).to(T)
    scale = torch.tensor([128.0], device=DEV)  # quantizing: q = y * scale; some |y| * 128 > 448 saturate
    amax_slot = torch.full((4,), float("nan"), device=DEV)
    xd, wd = x.double(), w.double() + (1.0 if zero_centered else 0.0)
    if norm == "rms":
        q, scale_inv, amax, rstd = te.rmsnorm_fwd_fp8(x, w, eps, scale, E4M3, zero_centered_gamma=zero_centered,
                                                      amax=amax_slot)
        rstd_ref = torch.rsqrt(xd.pow(2).mean(-1) + eps)
        y = xd * rstd_ref[:, None] * wd
        err = DELTA * (xd * rstd_ref[:, None] * wd).abs()
    else:
        q, scale_inv, amax, mean, rstd = te.layernorm_fwd_fp8(x, w, b, eps, scale, E4M3,
                                                              zero_centered_gamma=zero_centered, amax=amax_slot)
        mu = xd.mean(-1)
        rstd_ref = torch.rsqrt((xd - mu[:, None]).pow(2).mean(-1) + eps)
        y = (xd - mu[:, None]) * rstd_ref[:, None] * wd + b.double()
        # LayerNorm kernels subtract the row's first element before the rest
        # of the mean: (h - mean) is within DELTA of |h| + |mean| + |h[0]|.
        mag = xd.abs() + mu.abs()[:, None] + xd[:, :1].abs()
        err = DELTA * (mag * rstd_ref[:, None] * wd.abs() + b.double().abs())
        assert torch.allclose(mean.double(), mu, rtol=0, atol=1e-5)
    assert scale_inv.item() == 1.0 / 128.0
    a = y.abs().max().item()
    assert abs(amax.item() - a) <= 1e-5 * a and abs(amax_slot[0].item() - a) <= 1e-5 * a
    assert torch.isnan(amax_slot[1:]).all()  # only the first element is written
    assert torch.allclose(rstd.double(), rstd_ref, rtol=1e-5, atol=0)
    codes_within(q, (y - err) * 128.0, (y + err) * 128.0)
    assert (q.float().abs() == FMAX).any()
