"""normjit.torch's FP8 functions against a float64 reference built with
torch: quantized outputs (per-tensor, per-token, per-group with fp32 / UE8M0
and column-major scales, MXFP8), the fused residual add, the unquantized y
and the transposed q; the FP8-input autograd function's forward and
backward. Needs torch with float8 dtypes, a CUDA device and the library.
"""

import pytest

from conftest import gpu_torch_or_skip

torch = gpu_torch_or_skip(fp8=True)

import normjit.torch as njt  # noqa: E402

DEV = torch.device("cuda")
FMAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def ref_y(x, w, eps=1e-6, residual=None):
    h = x.double() + (residual.double() if residual is not None else 0)
    if residual is not None:
        h = h.to(residual.dtype).double()  # h rounded to the residual's dtype, as normjit's default
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def codes_close(q, ref_q):
    """At least 99.9% equal codes, none more than one apart."""
    a = q.view(torch.uint8).int()
    b = ref_q.view(torch.uint8).int()
    oa = torch.where(a >= 128, -(a - 128), a)
    ob = torch.where(b >= 128, -(b - 128), b)
    d = (oa - ob).abs()
    assert d.max().item() <= 1
    assert (d > 0).float().mean().item() <= 1e-3


def stat_bound(N):
    """Relative error bound of the kernel's fp32 y (and so of any amax over it)
    against float64: its sum of N squares in fp32, in any order, is within
    gamma_N (Higham, Accuracy and Stability of Numerical Algorithms, 4.2), rstd
    = (mean + eps)^-1/2 halves that, and the rsqrt and the products round a few
    times more (gamma_8)."""
    def gamma(k):
        return k * 2.0 ** -24 / (1 - k * 2.0 ** -24)
    return 0.5 * gamma(N) + gamma(8)


def log2_int(v, ceil):
    """floor (or ceil) of log2 v, exactly (from the exponent bits; CUDA's log2
    of 2^k may be an ulp off k)."""
    m, e = torch.frexp(v)  # v = m * 2^e, m in [0.5, 1)
    e = e.double() - 1  # floor
    return e + (m != 0.5).double() if ceil else e


def pow2_exponents(v, delta, ceil):
    """floor (or ceil) log2 of every v within a relative delta: the lowest and highest."""
    return log2_int(v * (1 - delta), ceil), log2_int(v * (1 + delta), ceil)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("quant", ["tensor", "token", "group", "group-ue8m0-col", "mx32"])
def test_rms_norm_fp8_matches_float64(quant, fp8):
    M, N = 300, 4096
    x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(N, device=DEV)).to(torch.bfloat16)
    kw = {}
    if quant.startswith("group"):
        kw = dict(quant="group", group_size=128, scale_ue8m0="ue8m0" in quant, scale_col_major="col" in quant)
    else:
        kw = dict(quant=quant)
    out = njt.rms_norm_fp8(x, (N,), w, 1e-6, fp8_dtype=fp8, return_y=True, **kw)
    q, scale, amax = out
    y = ref_y(x, w)
    fmax = FMAX[fp8]
    delta = stat_bound(N)
    # Each scale against the float64 one within the bound (a power of two may
    # then be either neighbour of a boundary); the codes against y quantized
    # with the kernel's own scales.
    if quant == "tensor":
        a = y.abs().max()
        assert abs(amax.item() - a.item()) <= delta * a.item()
        sref = (a / fmax).clamp(min=2.0 ** -126)
        assert abs(scale.double().item() - sref.item()) <= delta * sref.item()
        s = scale.double()
    elif quant == "token":
        sref = (y.abs().amax(-1, keepdim=True) / fmax).clamp(min=2.0 ** -126)
        assert ((scale.double().reshape(sref.shape) - sref).abs() <= delta * sref).all()
        s = scale.double().reshape(M, 1)
    else:
        G = 32 if quant == "mx32" else 128
        ag = y.view(M, N // G, G).abs().amax(-1)
        if quant == "mx32":
            bias = 8 if fp8 == torch.float8_e4m3fn else 15
            lo, hi = pow2_exponents(ag.clamp(min=2.0 ** -126), delta, ceil=False)
            e = scale.view(torch.uint8).int().double() - 127  # E8M0 codes
            assert ((e >= (lo - bias).clamp(-127, 127)) & (e <= (hi - bias).clamp(-127, 127))).all()
            s = torch.exp2(e)
        else:
            sref = (ag / fmax).clamp(min=2.0 ** -126)
            got = scale.double().reshape(M, N // G)  # [M, N / G] (column-major strides or not)
            if "ue8m0" in quant:
                lo, hi = pow2_exponents(sref, delta, ceil=True)
                e = log2_int(got, ceil=False)
                assert torch.equal(got, torch.exp2(e))  # powers of two
                assert ((e >= lo) & (e <= hi)).all()
            else:
                assert ((got - sref).abs() <= delta * sref).all()
            s = got
        s = s.repeat_interleave(G, -1)
    codes_close(q, (y / s).clamp(-fmax, fmax).float().to(fp8))
    assert torch.allclose(out.y.double(), y, rtol=2e-2, atol=2e-2)


# q transposed: one row (the row itself), the row kernel's bytes (M x N <= 2^15),
# the transpose launch (whole tiles, and partial ones both ways with M no multiple of 16;
# an odd M within one tile of rows, whose columns' runs lie back to back; 256-column
# tiles where the row tiles are enough to fill the SMs: M a multiple of 16, of 8, and odd;
# odd N, whose q rows start anywhere: peeled rows, and the transpose's misaligned loads).
@pytest.mark.parametrize("M,N", [(1, 2048), (7, 2048), (128, 2048), (130, 1000), (61, 1000), (1024, 2304),
                                 (1032, 2304), (1031, 2300), (37, 5111), (3, 2881),
                                 (200, 2881)])
def test_rms_norm_fp8_residual_transpose_and_static_scale(M, N):
    x = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    r = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    w = torch.ones(N, device=DEV, dtype=torch.bfloat16)
    scale = torch.tensor([0.004], device=DEV)  # some |y| / scale > 448: saturated
    out = njt.rms_norm_fp8(x, (N,), w, quant="tensor-static", scale=scale, residual=r, transpose=True)
    assert torch.equal(out.h, (x + r))
    assert torch.equal(out.q_t.view(torch.uint8), out.q.view(torch.uint8).t())
    y = ref_y(x, w, residual=r)
    codes_close(out.q, (y / 0.004).clamp(-448, 448).float().to(torch.float8_e4m3fn))
    assert (out.q.float().abs() == 448).any()


@pytest.mark.parametrize("norm", ["rms", "ln"])
def test_fp8_input_norm_forward_and_backward(norm):
    M, N, QB = 64, 1024, 16
    src = torch.randn(M, N, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    g = src.detach().float().view(M, N // QB, QB)
    x_scale = (g.abs().amax(-1) / 448).clamp(min=1e-12)
    x_q = (g / x_scale.unsqueeze(-1)).to(torch.float8_e4m3fn).view(M, N)
    w = (1 + 0.1 * torch.randn(N, device=DEV)).to(torch.bfloat16).requires_grad_()
    b = (0.1 * torch.randn(N, device=DEV)).to(torch.bfloat16).requires_grad_() if norm == "ln" else None
    if norm == "rms":
        y = njt.rms_norm_fp8_input(src, x_q, x_scale, (N,), w)
    else:
        y = njt.layer_norm_fp8_input(src, x_q, x_scale, (N,), w, b)
    dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    y.backward(dy)
    # float64 reference on the dequantized x
    xd = (x_q.double().view(M, N // QB, QB) * x_scale.double().unsqueeze(-1)).view(M, N).requires_grad_()
    wd = w.detach().double().requires_grad_()
    if norm == "rms":
        yr = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * wd
        params = (xd, wd)
    else:
        bd = b.detach().double().requires_grad_()
        yr = torch.nn.functional.layer_norm(xd, (N,), wd, bd, 1e-5)
        params = (xd, wd, bd)
    grads = torch.autograd.grad(yr, params, dy.double())
    assert torch.allclose(y.double(), yr.detach(), rtol=2e-2, atol=2e-2)
    assert torch.allclose(src.grad.double(), grads[0], rtol=3e-2, atol=3e-2)
    assert (w.grad.double() - grads[1]).abs().max() <= 2e-2 * grads[1].abs().max()
    if norm == "ln":
        assert (b.grad.double() - grads[2]).abs().max() <= 2e-2 * grads[2].abs().max()


def test_fp8_bad_arguments_name_the_argument():
    x = torch.randn(4, 100, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="group_size"):
        njt.rms_norm_fp8(x, (100,), quant="group", group_size=128)
    with pytest.raises(ValueError, match="quant"):
        njt.rms_norm_fp8(x, (100,), quant="blocky")
    with pytest.raises(ValueError, match="scale"):
        njt.rms_norm_fp8(x, (100,), quant="tensor-static")
