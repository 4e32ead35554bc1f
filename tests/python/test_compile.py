"""normjit under torch.compile and CUDA graphs (GPU only).

- A tiny Qwen3-style decoder (RMSNorm before attention and MLP, per-head
  q_norm / k_norm on views of the projections, the fused residual add +
  RMSNorm, a LayerNorm) patched with normjit.hf.patch: torch.compile(...,
  fullgraph=True) trains five AdamW steps as eager does, with static shapes
  and with dynamic=True over changing sequence lengths; the same for a tiny
  transformers Qwen3ForCausalLM when transformers is installed.
- rms_norm, layer_norm and add_rms_norm, forward and forward + backward,
  captured in a torch.cuda.graph and replayed on new data copied into the
  static inputs, against eager calls on that data.
- torch.compile(mode="reduce-overhead") (CUDA graph trees) of a module with
  normjit norms against eager, with no CUDA-graph skips.

RMSNorm: Zhang & Sennrich 2019; LayerNorm: Ba et al. 2016.
"""

import copy

import pytest

from conftest import gpu_torch_or_skip

torch = gpu_torch_or_skip()

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import normjit.torch as njt  # noqa: E402
from normjit.hf import patch  # noqa: E402

DEV = torch.device("cuda")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


# ---- a tiny Qwen3-style decoder ---------------------------------------------------


class Block(nn.Module):
    def __init__(self, d=64, heads=4, kv_heads=2, head_dim=16, ffn=128, eps=1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_layernorm = nn.RMSNorm(d, eps=eps)
        self.q_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(d, eps=eps)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        B, T, d = x.shape
        h = self.input_layernorm(x)
        # per-head norms of [B, T, heads, head_dim] views of the projections
        q = self.q_norm(self.q_proj(h).view(B, T, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(h).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        a = self.o_proj(a.transpose(1, 2).reshape(B, T, d))
        # the residual add fused with the post-attention norm: x = a + x, y = RMSNorm(x)
        norm = self.post_attention_layernorm
        y, x = njt.add_rms_norm(a, x, d, norm.weight, norm.eps)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class TinyDecoder(nn.Module):
    def __init__(self, vocab=128, d=64, layers=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.embed_norm = nn.LayerNorm(d)  # a LayerNorm on the path too
        self.layers = nn.ModuleList(Block(d) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed_norm(self.embed_tokens(ids))
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())


def _tiny_decoder():
    if not hasattr(nn, "RMSNorm"):
        pytest.skip("torch.nn.RMSNorm needs torch >= 2.4")
    torch.manual_seed(0)
    model = TinyDecoder().to(DEV)
    with torch.no_grad():  # norm weights away from 1, LayerNorm bias away from 0
        for m in model.modules():
            if isinstance(m, (nn.RMSNorm, nn.LayerNorm)):
                for p in m.parameters():
                    p.add_(0.1 * torch.randn_like(p))
    # per block: input, q_norm, k_norm, post-attention; then the final norm and embed_norm
    assert patch(model, families="torch") == 2 * 4 + 2
    return model


def _train(model, step_fn, batches, lr=1e-2):
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = step_fn(batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _norm_weights(model):
    return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "norm" in n])


def _check_training(eager_model, compiled_model, compiled, batches, call):
    want = _train(eager_model, lambda b: call(eager_model, b), batches)
    got = _train(compiled_model, lambda b: call(compiled, b), batches)
    # fp32 throughout: compiled and eager differ only by Inductor's fusion of the
    # surrounding ops (~1e-6 relative); 1e-3 is far from what a missing or wrong
    # norm gradient does to five steps of lr 1e-2.
    assert got == pytest.approx(want, rel=1e-3), (got, want)
    assert want[-1] < want[0]  # the steps did train
    a, b = _norm_weights(compiled_model), _norm_weights(eager_model)
    assert ((a - b).norm() / b.norm()).item() <= 1e-3


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_patched_decoder_trains_like_eager(dynamic):
    eager_model = _tiny_decoder()
    compiled_model = copy.deepcopy(eager_model)
    compiled = torch.compile(compiled_model, fullgraph=True, dynamic=dynamic)
    tokens = torch.randint(0, 128, (4, 40), device=DEV, generator=torch.Generator(device=DEV).manual_seed(2))
    # prefixes of one batch (the loss must fall); with dynamic=True of changing lengths
    lengths = [16, 24, 32, 24, 40] if dynamic else [32] * 5
    batches = [tokens[:, :t] for t in lengths]
    _check_training(eager_model, compiled_model, compiled, batches, lambda m, ids: m(ids))


def test_compiled_patched_hf_qwen3_trains_like_eager():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, vocab_size=128, max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False)
    torch.manual_seed(0)
    reference = transformers.Qwen3ForCausalLM(cfg).to(DEV)
    eager_model = copy.deepcopy(reference)
    assert patch(eager_model) == 2 * 4 + 1
    compiled_model = copy.deepcopy(eager_model)
    compiled = torch.compile(compiled_model, fullgraph=True)
    ids = torch.randint(3, 128, (2, 24), device=DEV, generator=torch.Generator(device=DEV).manual_seed(2))

    def call(m, batch):
        return m(input_ids=batch, labels=batch).loss

    try:
        call(compiled, ids).backward()
    except Exception as e:  # is it normjit, or this transformers version?
        torch._dynamo.reset()
        try:
            call(torch.compile(copy.deepcopy(reference), fullgraph=True), ids).backward()
        except Exception:
            pytest.skip(f"transformers {transformers.__version__}: Qwen3ForCausalLM does not compile with "
                        f"fullgraph=True without normjit either ({type(e).__name__})")
        raise
    compiled_model.zero_grad(set_to_none=True)
    _check_training(eager_model, compiled_model, compiled, [ids] * 5, call)


# ---- CUDA graphs --------------------------------------------------------------------

M, N, H, D = 64, 256, 4, 64


def _case(op, g):
    """(static inputs, fn(inputs) -> tuple of outputs, maker of new data)."""

    def r(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=DEV, generator=g) * scale + shift).to(torch.bfloat16)

    def w(n):
        return r(n, scale=0.1, shift=1.0)

    if op == "rms_norm":
        return {"x": r(M, N), "w": w(N)}, lambda t: (njt.rms_norm(t["x"], (N,), t["w"], 1e-6, cast_mode="llama"),), r
    if op == "rms_norm_heads":  # a per-head QK-norm read through a view of a fused QKV projection
        return ({"qkv": r(M, 3 * H * D), "w": r(D, scale=0.1)},
                lambda t: (njt.rms_norm(t["qkv"][:, :H * D].view(M, H, D), D, t["w"], 1e-6, weight_offset=1.0,
                                        cast_mode="gemma"),), r)
    if op == "layer_norm":
        return ({"x": r(M, N, shift=3.0), "w": w(N), "b": r(N, scale=0.1)},
                lambda t: (njt.layer_norm(t["x"], (N,), t["w"], t["b"], 1e-5),), r)
    assert op == "add_rms_norm"
    return ({"x": r(M, N), "res": r(M, N), "w": w(N)},
            lambda t: tuple(njt.add_rms_norm(t["x"], t["res"], N, t["w"], 1e-6)), r)


def _step(fn, inputs, cotangents):
    outs = fn(inputs)
    if cotangents is None:
        return outs
    return outs + torch.autograd.grad(outs, list(inputs.values()), cotangents)


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
@pytest.mark.parametrize("op", ["rms_norm", "rms_norm_heads", "layer_norm", "add_rms_norm"])
def test_cuda_graph_replays_match_eager(op, backward):
    g = torch.Generator(device=DEV).manual_seed(3)
    static, fn, r = _case(op, g)
    for t in static.values():
        t.requires_grad_(backward)
    cot = tuple(r(*o.shape) for o in fn(static)) if backward else None

    # Warm up on a side stream (kernels compiled, workspaces sized), then capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            _step(fn, static, cot)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _step(fn, static, cot)

    for _ in range(2):  # new data each time: nothing may be baked into the graph
        fresh = {k: r(*v.shape, shift=3.0 if op == "layer_norm" and k == "x" else 0.0) for k, v in static.items()}
        fresh_cot = tuple(r(*c.shape) for c in cot) if backward else None
        with torch.no_grad():
            for k, v in fresh.items():
                static[k].copy_(v)
            for c, v in zip(cot or (), fresh_cot or ()):
                c.copy_(v)
        graph.replay()
        want = _step(fn, {k: v.clone().requires_grad_(backward) for k, v in fresh.items()}, fresh_cot)
        torch.cuda.synchronize()
        assert len(static_out) == len(want)
        for i, (a, b) in enumerate(zip(static_out, want)):
            # the same kernels on the same data, deterministic backward: bit for bit
            assert torch.equal(a, b), f"{op} output {i}: max |diff| {(a.float() - b.float()).abs().max().item()}"


class NormNet(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.rms = njt.RMSNorm(d, eps=1e-6, cast_mode="llama")
        self.fc2 = nn.Linear(d, d)
        self.ln = njt.LayerNorm(d)
        self.d = d

    def forward(self, x):
        h = self.rms(self.fc1(x))
        y, h = njt.add_rms_norm(self.fc2(h), h, self.d, self.rms.weight, 1e-6)
        return self.ln(y + h)


def test_reduce_overhead_compile_matches_eager():
    from torch._dynamo.utils import counters

    torch.manual_seed(4)
    model = NormNet().to(DEV)
    with torch.no_grad():
        for m in (model.rms, model.ln):
            for p in m.parameters():
                p.add_(0.1 * torch.randn_like(p))
    counters.clear()
    compiled = torch.compile(model, mode="reduce-overhead")
    g = torch.Generator(device=DEV).manual_seed(5)
    # inference: several calls, so that CUDA graph trees record and then replay
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(32, 256, device=DEV, generator=g)
            got = compiled(x).clone()
            # fp32; the Linear layers may be fused differently: 1e-5 of the largest output
            assert rel_err(got, model(x)) <= 1e-5
    # training: forward + backward, gradients against eager
    for _ in range(3):
        x = torch.randn(32, 256, device=DEV, generator=g)
        model.zero_grad(set_to_none=True)
        compiled(x).square().mean().backward()
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        for n, p in model.named_parameters():
            assert rel_err(got[n], p.grad) <= 1e-4, n
    assert counters["inductor"]["cudagraph_skips"] == 0, "CUDA graphs were skipped for the normjit module"
