"""normjit's PyTorch custom operators (libnormjit_torch.so): schemas, fake
implementations, autograd through them, torch.compile tracing, opcheck.

The CPU part needs torch and the operator library (no GPU): it traces on
meta tensors, where the fake implementations run. opcheck needs a GPU.
"""

import pytest

from conftest import library_or_skip_reason

torch = pytest.importorskip("torch", reason="torch is not installed")
_ok, _why = library_or_skip_reason()
if not _ok:
    pytest.skip(_why, allow_module_level=True)

import normjit.torch as njt  # noqa: E402

if njt._NORM_FWD is None:
    pytest.skip(f"libnormjit_torch.so did not load: {njt._ops.reason()}", allow_module_level=True)

RMS, LN = 0, 1
BF16 = 15  # c10::ScalarType::BFloat16: norm_bwd's y_dtype
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available (torch.cuda.is_available() is False)")


def meta(*shape, dtype=torch.bfloat16, grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype).requires_grad_(grad)


def test_schemas_are_registered():
    fwd = torch.ops.normjit.norm_fwd.default._schema
    bwd = torch.ops.normjit.norm_bwd.default._schema
    assert [a.name for a in fwd.arguments][:6] == ["x", "residual", "weight", "bias", "norm", "normalized_shape"]
    assert len(fwd.returns) == 4 and len(bwd.returns) == 3
    assert not any(a.alias_info for a in fwd.arguments), "norm_fwd mutates nothing"


@pytest.mark.parametrize("norm", [RMS, LN])
@pytest.mark.parametrize("residual", [False, True])
def test_fake_outputs_follow_the_schema(norm, residual):
    x = meta(6, 3, 128)
    r = meta(6, 3, 128, dtype=torch.float32) if residual else None
    w = meta(128, dtype=torch.float32)
    y, h, mean, rstd = torch.ops.normjit.norm_fwd(x, r, w, w if norm == LN else None, norm, [128], 1e-6, 0.0, 0, 0)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    assert h.shape == ((6, 3, 128) if residual else (0,)) and h.dtype == (torch.float32 if residual else x.dtype)
    assert mean.shape == ((18,) if norm == LN else (0,)) and mean.dtype == torch.float32
    assert rstd.shape == (18,) and rstd.dtype == torch.float32
    dx, dw, db = torch.ops.normjit.norm_bwd(y, h if residual else x, w, w if norm == LN else None, mean, rstd, None,
                                            norm, 1, 0.0, 0, 0 if residual else -1, BF16)
    assert dx.shape == x.shape and dw.shape == w.shape and dw.dtype == w.dtype
    assert db.shape == ((128,) if norm == LN else (0,))


def test_fake_rejects_a_normalized_shape_that_does_not_match():
    with pytest.raises(RuntimeError, match="normalized_shape"):
        torch.ops.normjit.norm_fwd(meta(4, 64), None, None, None, RMS, [32], 1e-6, 0.0, 0, 0)


def test_autograd_traces_to_norm_bwd():
    from torch.fx.experimental.proxy_tensor import make_fx

    def joint(x, r, w):
        y, h = njt.add_rms_norm(x, r, 64, w, 1e-6, cast_mode="llama")
        return torch.autograd.grad(y.float().sum() + h.sum(), (x, r, w))

    g = make_fx(joint)(meta(8, 64, grad=True), meta(8, 64, dtype=torch.float32, grad=True),
                       meta(64, dtype=torch.float32, grad=True))
    ops = [n.target for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.normjit.norm_fwd.default in ops and torch.ops.normjit.norm_bwd.default in ops


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_forward_and_backward(dynamic):
    torch._dynamo.reset()
    rms = njt.RMSNorm(64, eps=1e-6, device="meta")
    ln = njt.LayerNorm(64, device="meta")

    def block(x, w):
        y = njt.rms_norm(x, 64, w, 1e-6, cast_mode="llama")
        y2, h = njt.add_rms_norm(y, x, 64, w)
        return (rms(y2) + ln(h)).float().sum()

    f = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for M in (8, 16, 24):  # new sizes: recompiles (static) or one graph (dynamic)
        x = meta(M, 4, 64, grad=True)
        w = meta(64, dtype=torch.float32, grad=True)
        f(x, w).backward()
        assert x.grad.shape == x.shape and w.grad.shape == w.shape


def test_cpu_tensors_get_the_documented_errors():
    with pytest.raises(ValueError, match="x is on device 'cpu'"):
        njt.rms_norm(torch.randn(4, 64), 64)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        njt.rms_norm([1.0, 2.0], 2)


# ---- on a GPU -----------------------------------------------------------------


@gpu
@pytest.mark.parametrize("case", ["rms", "ln", "rms_res", "ln_res_fp32", "qk_heads", "no_weight"])
def test_opcheck(case):
    dev = "cuda"
    bf = torch.bfloat16
    x = torch.randn(16, 4, 128, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(128, device=dev, dtype=torch.float32, requires_grad=True)
    b = torch.randn(128, device=dev, dtype=torch.float32, requires_grad=True)
    r = None
    norm, bias, weight, shape = RMS, None, w, [128]
    if case.startswith("ln"):
        norm, bias = LN, b
    if "res" in case:
        r = torch.randn(16, 4, 128, device=dev, dtype=torch.float32 if "fp32" in case else bf, requires_grad=True)
    if case == "qk_heads":  # a strided tokens x heads view into a wider row
        base = torch.randn(16, 4 * 128 + 64, device=dev, dtype=bf, requires_grad=True)
        x = base[:, :512].view(16, 4, 128)
    if case == "no_weight":
        weight = None
    args = (x, r, weight, bias, norm, shape, 1e-5, 0.0, 1 if case == "rms" else 0, 0)
    torch.library.opcheck(torch.ops.normjit.norm_fwd.default, args)
