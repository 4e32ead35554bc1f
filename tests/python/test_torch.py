"""normjit.torch against PyTorch: forward and backward of RMSNorm (Zhang &
Sennrich 2019) and LayerNorm (Ba et al. 2016) over many shapes and dtypes,
the variants (no weight / bias, weight offset, llama casting, fused residual,
strided QK-norm views, mixed dtypes), the modules in a small model, errors.

References are torch.nn.functional's rms_norm / layer_norm (or the formula)
computed in float64 from the same inputs; errors are measured relative to the
reference's largest magnitude. Needs torch, a CUDA device and the library.
"""

import copy

import pytest

import normjit

from conftest import gpu_torch_or_skip

torch = gpu_torch_or_skip()

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import normjit.torch as njt  # noqa: E402

DEV = torch.device("cuda")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
NS = [1, 64, 128, 1000, 4096, 8192, 65536]
MS = [1, 7, 256, 2048]


# ---- references and comparisons ---------------------------------------------


def ref_rms(x, shape, w=None, eps=1e-6, offset=0.0):
    """float64 RMSNorm; F.rms_norm where the formula is torch's."""
    if offset == 0.0 and hasattr(F, "rms_norm"):
        return F.rms_norm(x, shape, w, eps)
    dims = tuple(range(-len(shape), 0))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y * ((w if w is not None else 1.0) + offset)


def ref_ln(x, shape, w=None, b=None, eps=1e-5, offset=0.0):
    if offset == 0.0:
        return F.layer_norm(x, shape, w, b, eps)
    y = F.layer_norm(x, shape, None, None, eps) * ((w if w is not None else 1.0) + offset)
    return y + b if b is not None else y


def rel_err(got, ref, floor=0.0):
    got, ref = got.double(), ref.double()
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, floor, 1e-30)
    return (got - ref).abs().max().item() / scale if ref.numel() else 0.0


def check(name, got, ref, tol, floor=0.0):
    assert got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    e = rel_err(got, ref, floor)
    assert e <= tol, f"{name}: relative error {e:.3g} > {tol:.3g}"


def leaf(t):
    return t.detach().clone().requires_grad_(True)


def f64(t):
    return None if t is None else t.detach().double().requires_grad_(True)


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(*shape, device=DEV, dtype=torch.float32) * scale + shift).to(dtype)


def dx_floor(dy, x64, norm, N, w=None):
    """The magnitude of dx's terms (rstd * dy * w'): dx of tiny rows (N = 1)
    cancels to far below them, and is judged against them instead."""
    if N > 1:
        return 0.0
    dims = (-1,)
    if norm == "rms":
        rstd = torch.rsqrt(x64.pow(2).mean(dims, keepdim=True) + EPS["rms"])
    else:
        rstd = torch.rsqrt(x64.var(dims, unbiased=False, keepdim=True) + EPS["ln"])
    wmax = w.abs().max().item() if w is not None else 1.0
    return (dy.double().abs() * rstd).max().item() * wmax


EPS = {"rms": 1e-6, "ln": 1e-5}


def run_pair(norm, x, dy, w=None, b=None, eps=None, offset=0.0, cast_mode="default"):
    """normjit and the float64 reference on the same inputs: (ours, ref) dicts
    of y and the gradients that exist."""
    eps = EPS[norm] if eps is None else eps
    N = x.shape[-1]
    xs, ws, bs = leaf(x), (leaf(w) if w is not None else None), (leaf(b) if b is not None else None)
    if norm == "rms":
        y = njt.rms_norm(xs, (N,), ws, eps, weight_offset=offset, cast_mode=cast_mode)
    else:
        y = njt.layer_norm(xs, (N,), ws, bs, eps, weight_offset=offset, cast_mode=cast_mode)
    y.backward(dy)
    x64, w64, b64 = f64(x), f64(w), f64(b)
    if norm == "rms":
        y64 = ref_rms(x64, (N,), w64, eps, offset)
    else:
        y64 = ref_ln(x64, (N,), w64, b64, eps, offset)
    y64.backward(dy.double())
    ours = {"y": y, "dx": xs.grad}
    ref = {"y": y64, "dx": x64.grad}
    if w is not None:
        ours["dweight"], ref["dweight"] = ws.grad, w64.grad
    if b is not None:
        ours["dbias"], ref["dbias"] = bs.grad, b64.grad
    return ours, ref


def check_pair(ours, ref, tol, floors=None):
    floors = floors or {}
    for k in ref:
        check(k, ours[k], ref[k], tol, floors.get(k, 0.0))


# ---- forward and backward over shapes and dtypes ------------------------------


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm", ["rms", "ln"])
def test_matches_torch(norm, dtype, N, M):
    torch.manual_seed(N * 31 + M)
    x = randn(M, N, dtype=dtype, shift=0.5 if norm == "ln" else 0.0)
    dy = randn(M, N, dtype=dtype)
    w = randn(N, dtype=dtype, scale=0.2, shift=1.0)
    b = randn(N, dtype=dtype, scale=0.2) if norm == "ln" else None
    ours, ref = run_pair(norm, x, dy, w, b)
    assert ours["y"].dtype == dtype and ours["y"].is_contiguous()
    assert ours["dweight"].dtype == dtype
    # Rows of one element cancel: dx and dweight are judged against their terms' size.
    floors = {"dx": dx_floor(dy, x.double(), norm, N, w)}
    if N == 1:
        floors["dweight"] = dy.double().abs().sum(0).max().item()
    check_pair(ours, ref, TOL[dtype], floors)


@pytest.mark.parametrize("N", [64, 1000, 4096])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("variant", ["rms-none", "ln-none", "ln-weight-only", "ln-bias-only"])
def test_without_weight_or_bias(variant, dtype, N):
    torch.manual_seed(N)
    M = 96
    x = randn(M, N, dtype=dtype, shift=0.3)
    dy = randn(M, N, dtype=dtype)
    w = randn(N, dtype=dtype, scale=0.2, shift=1.0) if variant == "ln-weight-only" else None
    b = randn(N, dtype=dtype, scale=0.2) if variant == "ln-bias-only" else None
    ours, ref = run_pair(variant.split("-")[0], x, dy, w, b)
    assert set(ours) == set(ref)
    check_pair(ours, ref, TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("norm", ["rms", "ln"])
def test_weight_offset_one_against_the_formula(norm, dtype):
    torch.manual_seed(5)
    M, N = 300, 2048
    x = randn(M, N, dtype=dtype)
    dy = randn(M, N, dtype=dtype)
    w = randn(N, dtype=dtype, scale=0.1)  # zero-centred: w' = 1 + w
    b = randn(N, dtype=dtype, scale=0.1) if norm == "ln" else None
    ours, ref = run_pair(norm, x, dy, w, b, offset=1.0)
    check_pair(ours, ref, TOL[dtype])
    # An offset without a weight is refused (w' = 1 without a weight).
    with pytest.raises(ValueError, match="weight_offset = 1.0 needs a weight"):
        run_pair(norm, x, dy, None, None, offset=1.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_llama_cast_mode(dtype):
    torch.manual_seed(7)
    M, N = 512, 4096
    eps = 1e-6
    x = randn(M, N, dtype=dtype)
    w = randn(N, dtype=dtype, scale=0.3, shift=1.0)
    dy = randn(M, N, dtype=dtype)
    # Llama: the normalised row is rounded to x's dtype before the weight.
    x64 = x.double()
    xhat = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    want = (xhat.double() * w.double()).to(dtype)
    xs, ws = leaf(x), leaf(w)
    y = njt.rms_norm(xs, N, ws, eps, cast_mode="llama")
    check("y", y, want.double(), TOL[dtype])
    # Products of two 16-bit values are exact in fp32: y rounds like the reference
    # except where fp32 and fp64 rstd round xhat differently.
    assert (y == want).double().mean().item() >= 0.99
    # The backward computes in fp32 in every mode: torch's gradients.
    y.backward(dy)
    x64, w64 = f64(x), f64(w)
    ref_rms(x64, (N,), w64, eps).backward(dy.double())
    check("dx", xs.grad, x64.grad, TOL[dtype])
    check("dweight", ws.grad, w64.grad, TOL[dtype])


# ---- fused residual add -------------------------------------------------------


def _fused_reference(norm, x, r, w, b, eps, dy, dh, rounding):
    x64, r64, w64, b64 = f64(x), f64(r), f64(w), f64(b)
    s = x64 + r64
    # h as torch's unfused `x + residual` makes it: an fp32 sum rounded to residual's dtype.
    h_rounded = (x.float() + r.float()).to(r.dtype).double()
    h = s + (h_rounded - s).detach()  # rounded value, identity gradient
    normed = h if rounding == "residual" else s
    N = x.shape[-1]
    y = ref_rms(normed, (N,), w64, eps) if norm == "rms" else ref_ln(normed, (N,), w64, b64, eps)
    loss = (y * dy.double()).sum()
    if dh is not None:
        loss = loss + (h * dh.double()).sum()
    loss.backward()
    return y, h_rounded, x64.grad, r64.grad, w64.grad, (b64.grad if b is not None else None)


@pytest.mark.parametrize("use_h", [True, False], ids=["y+h", "y-only"])
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                    (torch.float32, torch.float32), (torch.bfloat16, torch.float32)],
                         ids=["bf16", "fp16", "fp32", "x-bf16-residual-fp32"])
@pytest.mark.parametrize("norm", ["rms", "ln"])
def test_fused_residual(norm, dtypes, use_h):
    xdt, rdt = dtypes
    torch.manual_seed(11)
    M, N = 257, 4096
    eps = EPS[norm]
    x, r = randn(M, N, dtype=xdt), randn(M, N, dtype=rdt, scale=2.0)
    w = randn(N, dtype=xdt, scale=0.2, shift=1.0)
    b = randn(N, dtype=xdt, scale=0.2) if norm == "ln" else None
    dy = randn(M, N, dtype=xdt)
    dh = randn(M, N, dtype=rdt) if use_h else None
    xs, rs, ws = leaf(x), leaf(r), leaf(w)
    bs = leaf(b) if b is not None else None
    if norm == "rms":
        y, h = njt.add_rms_norm(xs, rs, N, ws, eps)
    else:
        y, h = njt.add_layer_norm(xs, rs, N, ws, bs, eps)
    assert y.dtype == xdt and h.dtype == rdt
    loss = (y.float() * dy.float()).sum()
    if use_h:
        loss = loss + (h.float() * dh.float()).sum()
    loss.backward()
    y64, h64, dx64, dr64, dw64, db64 = _fused_reference(norm, x, r, w, b, eps, dy, dh, "residual")
    tol = max(TOL[xdt], TOL[rdt])
    assert torch.equal(h.double(), h64), "h must be x + residual rounded to residual's dtype"
    check("y", y, y64, tol)
    assert xs.grad.dtype == xdt and rs.grad.dtype == rdt
    check("dx", xs.grad, dx64, tol)
    check("dresidual", rs.grad, dr64, tol)
    check("dweight", ws.grad, dw64, tol)
    if b is not None:
        check("dbias", bs.grad, db64, tol)


def test_fused_residual_fp32_rounding():
    torch.manual_seed(12)
    M, N = 64, 1024
    x, r = randn(M, N, dtype=torch.bfloat16), randn(M, N, dtype=torch.bfloat16)
    w = randn(N, dtype=torch.bfloat16, scale=0.2, shift=1.0)
    y, h = njt.add_rms_norm(x, r, N, w, 1e-6, residual_rounding="fp32")
    y64, h64, *_ = _fused_reference("rms", x, r, w, None, 1e-6, torch.zeros_like(x), None, "fp32")
    assert torch.equal(h.double(), h64)
    check("y", y, y64, TOL[torch.bfloat16])


# ---- layouts ------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["rms", "ln"])
def test_qk_norm_on_strided_views_of_qkv(norm):
    torch.manual_seed(13)
    T, Hq, Hkv, D = 37, 8, 2, 128
    dt = torch.bfloat16
    qkv = randn(T, (Hq + 2 * Hkv) * D, dtype=dt)
    wq, wk = randn(D, dtype=dt, scale=0.2, shift=1.0), randn(D, dtype=dt, scale=0.2, shift=1.0)
    dq, dk = randn(T, Hq, D, dtype=dt), randn(T, Hkv, D, dtype=dt)

    def views(t):
        q = t[:, : Hq * D].view(T, Hq, D)
        k = t.view(T, Hq + 2 * Hkv, D)[:, Hq: Hq + Hkv]
        return q, k

    q0, k0 = views(qkv)
    for v, H in ((q0, Hq), (k0, Hkv)):  # read in place: tokens x heads, no copy
        t, heads, ts, hs = njt._rows(v, 1, D)
        assert t is v and (heads, ts, hs) == (H, (Hq + 2 * Hkv) * D, D)

    a = leaf(qkv)
    wqs, wks = leaf(wq), leaf(wk)
    q, k = views(a)
    fn = njt.rms_norm if norm == "rms" else njt.layer_norm
    yq, yk = fn(q, D, wqs, eps=1e-6), fn(k, D, wks, eps=1e-6)
    ((yq.float() * dq.float()).sum() + (yk.float() * dk.float()).sum()).backward()

    a64, wq64, wk64 = f64(qkv), f64(wq), f64(wk)
    q64, k64 = views(a64)
    ref = (lambda t, w: ref_rms(t, (D,), w, 1e-6)) if norm == "rms" else (lambda t, w: ref_ln(t, (D,), w, None, 1e-6))
    yq64, yk64 = ref(q64, wq64), ref(k64, wk64)
    ((yq64 * dq.double()).sum() + (yk64 * dk.double()).sum()).backward()
    tol = TOL[dt]
    check("yq", yq, yq64, tol)
    check("yk", yk, yk64, tol)
    check("dqkv", a.grad, a64.grad, tol)
    check("dwq", wqs.grad, wq64.grad, tol)
    check("dwk", wks.grad, wk64.grad, tol)


def test_row_stride_transpose_and_3d_inputs():
    torch.manual_seed(14)
    N = 256
    base = randn(50, 3 * N)
    w = randn(N, scale=0.2, shift=1.0)
    cases = {
        "row stride": base[:, N: 2 * N],               # heads = 1, stride 3N
        "transposed": randn(N, 50).t(),                # last dim not contiguous: copied
        "3-D batch": randn(4, 9, N),                   # leading dims merge
        "broadcast rows": randn(1, N).expand(20, N),   # stride 0: copied
        "multi-dim normalized": randn(6, 4, 64),       # normalized_shape (4, 64)
    }
    for name, x in cases.items():
        shape = (4, 64) if name == "multi-dim normalized" else (N,)
        wt = w.view(shape)
        y = njt.rms_norm(x, shape, wt, 1e-6)
        check(name, y, ref_rms(x.double(), shape, wt.double(), 1e-6), TOL[torch.float32])
        xs = leaf(x)
        dy = randn(*x.shape).t().contiguous().t() if x.dim() == 2 else randn(*x.shape)  # strided dy too
        njt.layer_norm(xs, shape, None, None).backward(dy)
        x64 = f64(x)
        F.layer_norm(x64, shape).backward(dy.double())
        check(name + " dx", xs.grad, x64.grad, 1e-4)


def test_mixed_dtypes_bf16_x_fp32_weight():
    torch.manual_seed(15)
    M, N = 384, 4096
    x, dy = randn(M, N, dtype=torch.bfloat16), randn(M, N, dtype=torch.bfloat16)
    w, b = randn(N, scale=0.2, shift=1.0), randn(N, scale=0.2)
    for norm in ("rms", "ln"):
        ours, ref = run_pair(norm, x, dy, w, b if norm == "ln" else None)
        assert ours["y"].dtype == torch.bfloat16 and ours["dweight"].dtype == torch.float32
        check("y", ours["y"], ref["y"], TOL[torch.bfloat16])
        check("dx", ours["dx"], ref["dx"], TOL[torch.bfloat16])
        check("dweight", ours["dweight"], ref["dweight"], 1e-4)  # fp32 output of exact inputs
        if norm == "ln":
            check("dbias", ours["dbias"], ref["dbias"], 1e-4)


def test_empty_batch_and_determinism_and_stream():
    N = 512
    x = leaf(randn(0, N))
    w = leaf(randn(N))
    y = njt.rms_norm(x, N, w)
    y.sum().backward()
    assert y.shape == (0, N) and torch.equal(w.grad, torch.zeros_like(w))

    torch.manual_seed(16)
    x, dy, w = randn(1000, N, dtype=torch.bfloat16), randn(1000, N, dtype=torch.bfloat16), randn(N, shift=1.0)
    grads = []
    for _ in range(2):
        ws = leaf(w)
        njt.rms_norm(x, N, ws).backward(dy)
        grads.append(ws.grad)
    assert torch.equal(grads[0], grads[1]), "dweight must be bitwise deterministic"

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = njt.rms_norm(x, N, w)
    s.synchronize()
    check("y on a side stream", y, ref_rms(x.double(), (N,), w.double(), torch.finfo(torch.bfloat16).eps),
          TOL[torch.bfloat16])


def test_default_eps_is_finfo_eps():
    x = randn(4, 64, dtype=torch.float16, scale=1e-3)  # mean(x^2) ~ 1e-6: eps matters
    y = njt.rms_norm(x, 64)
    check("y", y, ref_rms(x.double(), (64,), None, torch.finfo(torch.float16).eps), TOL[torch.float16])
    y_big = njt.rms_norm(x, 64, eps=1e-2)
    assert rel_err(y_big, y.double()) > 0.1  # and eps is really used


# ---- errors -------------------------------------------------------------------


def test_errors_name_the_argument():
    x = randn(4, 64)
    with pytest.raises(ValueError, match="x is on device 'cpu'"):
        njt.rms_norm(x.cpu(), 64)
    with pytest.raises(TypeError, match="torch.float64"):
        njt.layer_norm(x.double(), 64)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        njt.rms_norm([1.0, 2.0], 2)
    with pytest.raises(ValueError, match=r"normalized_shape = \[32\]"):
        njt.rms_norm(x, 32)
    with pytest.raises(ValueError, match="weight is on device 'cpu'"):
        njt.rms_norm(x, 64, torch.ones(64))
    with pytest.raises(ValueError, match=r"weight.shape = \[63\]"):
        njt.rms_norm(x, 64, torch.ones(63, device=DEV))
    with pytest.raises(TypeError, match="bias.dtype = torch.float64"):
        njt.layer_norm(x, 64, None, torch.zeros(64, device=DEV, dtype=torch.float64))
    with pytest.raises(ValueError, match="cast_mode = 'mistral'"):
        njt.rms_norm(x, 64, cast_mode="mistral")
    with pytest.raises(ValueError, match="eps = -1.0"):
        njt.rms_norm(x, 64, eps=-1.0)
    with pytest.raises(ValueError, match=r"residual.shape = \[4, 32\]"):
        njt.add_rms_norm(x, randn(4, 32), 64)
    with pytest.raises(ValueError, match="residual_rounding = 'bf16'"):
        njt.add_rms_norm(x, x, 64, residual_rounding="bf16")
    with pytest.raises(normjit.NormjitError, match="N = 300000") as e:
        njt.rms_norm(randn(1, 300000), 300000)
    assert e.value.kind == "invalid_argument"


# ---- modules ------------------------------------------------------------------


def test_modules_match_torch_parameters_state_dict_and_repr():
    pairs = [(njt.LayerNorm(8), nn.LayerNorm(8)),
             (njt.LayerNorm([4, 8], eps=1e-6, bias=False), nn.LayerNorm([4, 8], eps=1e-6, bias=False)),
             (njt.LayerNorm(8, elementwise_affine=False), nn.LayerNorm(8, elementwise_affine=False))]
    if hasattr(nn, "RMSNorm"):
        pairs += [(njt.RMSNorm(8), nn.RMSNorm(8)), (njt.RMSNorm(8, eps=1e-6), nn.RMSNorm(8, eps=1e-6)),
                  (njt.RMSNorm(8, elementwise_affine=False), nn.RMSNorm(8, elementwise_affine=False))]
    for ours, theirs in pairs:
        assert list(ours.state_dict()) == list(theirs.state_dict())
        for k, v in theirs.state_dict().items():
            assert torch.equal(ours.state_dict()[k], v), k
        assert repr(ours) == repr(theirs)
        ours.load_state_dict(theirs.state_dict())
    m = njt.RMSNorm(16, weight_offset=1.0, device=DEV, dtype=torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cuda"
    assert torch.equal(m.weight, torch.zeros_like(m.weight))  # w' = weight + 1 starts at 1
    assert "weight_offset=1.0" in repr(m)


class Block(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.linear = nn.Linear(64, 64)
        self.norm = norm
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.norm(self.linear(x)))


class TinyModel(nn.Module):
    def __init__(self, make_norm):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.blocks = nn.Sequential(Block(make_norm()), Block(make_norm()))
        self.head = nn.Linear(64, 10)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def _train(model, data, steps=5):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for tokens, target in data[:steps]:
        opt.zero_grad()
        loss = F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["rms", "ln"])
def test_modules_swap_into_a_model_and_train_alike(kind):
    if kind == "rms" and not hasattr(nn, "RMSNorm"):
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    torch.manual_seed(17)
    torch_norm = (lambda: nn.RMSNorm(64, eps=1e-6)) if kind == "rms" else (lambda: nn.LayerNorm(64))
    our_norm = (lambda: njt.RMSNorm(64, eps=1e-6)) if kind == "rms" else (lambda: njt.LayerNorm(64))
    reference = TinyModel(torch_norm).to(DEV)
    with torch.no_grad():  # non-trivial norm parameters
        for m in reference.modules():
            if isinstance(m, (nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm))):
                m.weight.uniform_(0.5, 1.5)
                if getattr(m, "bias", None) is not None:
                    m.bias.uniform_(-0.1, 0.1)

    swapped = copy.deepcopy(reference)
    assert njt.replace_norms(swapped) == 2
    assert all(type(b.norm) is type(our_norm()) for b in swapped.blocks)
    assert list(swapped.state_dict()) == list(reference.state_dict())

    loaded = TinyModel(our_norm).to(DEV)
    loaded.load_state_dict(reference.state_dict())

    batch = (torch.randint(0, 100, (8, 16), device=DEV), torch.randint(0, 10, (8, 16), device=DEV))
    data = [batch] * 5  # the same data each step: the loss must fall
    want = _train(reference, data)
    for model in (swapped, loaded):
        got = _train(model, data)
        assert got == pytest.approx(want, rel=1e-4), (got, want)
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            check(name, p, q, 1e-3)
    assert want[-1] < want[0]  # the steps did train


def test_replace_norms_keeps_the_parameter_objects():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8, bias=False), nn.Sequential(nn.LayerNorm(8))).to(DEV)
    w1, w2, b2 = model[1].weight, model[2][0].weight, model[2][0].bias
    assert njt.replace_norms(model) == 2
    assert isinstance(model[1], njt.LayerNorm) and isinstance(model[2][0], njt.LayerNorm)
    assert model[1].weight is w1 and model[1].bias is None
    assert model[2][0].weight is w2 and model[2][0].bias is b2
    x = randn(3, 8)
    y = model(x)
    ref = F.layer_norm(F.layer_norm(model[0](x).double(), (8,), w1.double(), None), (8,), w2.double(), b2.double())
    check("y", y, ref, 1e-5)


# ---- settings -----------------------------------------------------------------


def test_cache_dir_and_tune_policy_from_python(tmp_path, restore_settings):
    normjit.set_cache_dir(tmp_path)
    normjit.set_tune_policy("never")
    assert normjit.cache_dir() == str(tmp_path)
    assert normjit.tune_policy() == "never"
    x = randn(8, 192)
    check("y", njt.rms_norm(x, 192), ref_rms(x.double(), (192,), None, torch.finfo(torch.float32).eps), 1e-5)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files, "the engine compiled into its new cache directory"
