"""normjit.hf.patch on tiny random-weight Hugging Face transformers models.

One model per family (Llama, Mistral, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3
text, Phi-3, OLMo 2, DeepSeek-V3, GPT-2, GPT-NeoX), built from its config
class on the CPU. CPU tests: patch() swaps exactly the model's norm modules
(counted here from the model's structure), keeps the Parameter objects,
training modes, state_dict keys and hooks, and each new module's settings
reproduce the replaced class's forward() bit for bit when normjit's cast
modes (README) are evaluated with torch ops on the CPU. GPU tests: bf16
logits and five AdamW steps of the patched model against an unpatched copy.
RMSNorm: Zhang & Sennrich 2019; LayerNorm: Ba et al. 2016.
"""

import copy
import warnings

import pytest

from conftest import library_or_skip_reason

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import normjit.torch as njt  # noqa: E402
from normjit.hf import FAMILIES, patch  # noqa: E402


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    ok, why = library_or_skip_reason()
    return None if ok else why


_GPU_WHY = _gpu_skip_reason()
gpu = pytest.mark.skipif(_GPU_WHY is not None, reason=f"GPU test: {_GPU_WHY}")

# ---- the tiny models ----------------------------------------------------------

EPS = 3e-6  # no class's default, so an eps read from the wrong place shows
_SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
_RMS = dict(_SMALL, rms_norm_eps=EPS)
LAYERS = 2

# model -> (config class, config kwargs, norm class name, norms per decoder layer,
#           patch family, (weight_offset, cast_mode) the class's forward() needs)
# The last field restates each class's forward() in transformers 5.x:
#   Llama / Mistral / Qwen2 / Qwen3 / Phi3 / DeepseekV3 RMSNorm:
#       `self.weight * hidden_states.to(input_dtype)`      -> (0, "llama")
#   Gemma / Gemma2 / Gemma3 RMSNorm:
#       `(output * (1.0 + self.weight.float())).type_as(x)` -> (1, "gemma")
#   Olmo2RMSNorm: `(self.weight * hidden_states).to(input_dtype)` -> (0, "default")
#   torch.nn.LayerNorm: F.layer_norm                      -> (0, "default")
MODELS = {
    "llama": ("LlamaConfig", _RMS, "LlamaRMSNorm", 2, "llama", (0.0, "llama")),
    "mistral": ("MistralConfig", _RMS, "MistralRMSNorm", 2, "mistral", (0.0, "llama")),
    "qwen2": ("Qwen2Config", _RMS, "Qwen2RMSNorm", 2, "qwen2", (0.0, "llama")),
    # input, post-attention, q_norm, k_norm (per head, head_dim 16)
    "qwen3": ("Qwen3Config", dict(_RMS, head_dim=16), "Qwen3RMSNorm", 4, "qwen3", (0.0, "llama")),
    "gemma": ("GemmaConfig", dict(_RMS, head_dim=16), "GemmaRMSNorm", 2, "gemma", (1.0, "gemma")),
    # input, post-attention, pre- and post-feedforward
    "gemma2": ("Gemma2Config", dict(_RMS, head_dim=16), "Gemma2RMSNorm", 4, "gemma2", (1.0, "gemma")),
    # as Gemma 2 plus q_norm, k_norm
    "gemma3": ("Gemma3TextConfig", dict(_RMS, head_dim=16), "Gemma3RMSNorm", 6, "gemma3", (1.0, "gemma")),
    "phi3": ("Phi3Config", _RMS, "Phi3RMSNorm", 2, "phi3", (0.0, "llama")),
    # post-attention, post-feedforward, q_norm and k_norm over all heads
    "olmo2": ("Olmo2Config", _RMS, "Olmo2RMSNorm", 4, "olmo2", (0.0, "default")),
    # input, post-attention, MLA q_a_layernorm (q_lora_rank) and kv_a_layernorm
    # (kv_lora_rank, a strided view of the kv_a projection); dense layers only
    # (first_k_dense_replace = all layers) so no expert routing can flip between
    # the two models.
    "deepseek_v3": ("DeepseekV3Config", dict(_RMS, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
                                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                             moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                                             n_group=1, topk_group=1, first_k_dense_replace=LAYERS),
                    "DeepseekV3RMSNorm", 4, "deepseek_v3", (0.0, "llama")),
    # ln_1, ln_2 (+ ln_f): torch.nn.LayerNorm
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=LAYERS, n_head=4, vocab_size=128, n_positions=64, bos_token_id=1,
                                eos_token_id=2, layer_norm_epsilon=EPS, resid_pdrop=0.0, embd_pdrop=0.0,
                                attn_pdrop=0.0),
             "LayerNorm", 2, "torch", (0.0, "default")),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                       num_attention_heads=4, vocab_size=128, max_position_embeddings=64,
                                       pad_token_id=0, bos_token_id=1, eos_token_id=2, layer_norm_eps=EPS,
                                       hidden_dropout=0.0, attention_dropout=0.0),
                 "LayerNorm", 2, "torch", (0.0, "default")),
}
# What the models have (a change in transformers shows here first).
NORM_COUNTS = {"llama": 5, "mistral": 5, "qwen2": 5, "qwen3": 9, "gemma": 5, "gemma2": 9, "gemma3": 13, "phi3": 5,
               "olmo2": 9, "deepseek_v3": 9, "gpt2": 5, "gpt_neox": 5}


def build(name, seed=0):
    """The family's tiny causal LM (fp32, CPU, train mode) with randomised
    norm parameters (HF initialises them to 1 / 0, hiding weight mistakes)."""
    cfg_name, kwargs = MODELS[name][:2]
    cfg_cls = getattr(transformers, cfg_name, None)
    if cfg_cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cfg_name}")
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg_cls(**kwargs))
    with torch.no_grad():
        for m in norm_modules(model, name).values():
            for p in m.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return model.train()


def is_norm(module, name):
    cls_name = MODELS[name][2]
    if cls_name == "LayerNorm":
        return type(module) is nn.LayerNorm
    return type(module).__name__ == cls_name


def norm_modules(model, name):
    """{qualified name: module} of the family's norm class, found independently of patch()."""
    return {n: m for n, m in model.named_modules() if is_norm(m, name)}


def eps_of(module):
    return module.eps if isinstance(module, nn.LayerNorm) else getattr(module, "variance_epsilon",
                                                                       getattr(module, "eps", None))


# ---- CPU: what patch() swaps ----------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_patch_swaps_every_norm_and_keeps_parameters(name):
    model = build(name)
    per_layer, family, (offset, cast_mode) = MODELS[name][3], MODELS[name][4], MODELS[name][5]
    old = norm_modules(model, name)
    assert len(old) == LAYERS * per_layer + 1 == NORM_COUNTS[name]
    some = sorted(old)[0]
    old[some].eval()  # a mixed tree: the mode of each module is kept
    params_before = [(n, p) for n, p in model.named_parameters()]
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    old_params = {n: dict(m.named_parameters()) for n, m in old.items()}
    old_eps = {n: eps_of(m) for n, m in old.items()}

    assert patch(model) == len(old)

    assert not norm_modules(model, name), "a norm of the family was left in place"
    for n in old:
        new = model.get_submodule(n)
        want_cls = njt.LayerNorm if family == "torch" else njt.RMSNorm
        assert type(new) is want_cls, (n, type(new))
        assert dict(new.named_parameters()).keys() == old_params[n].keys()
        for pname, p in old_params[n].items():
            assert getattr(new, pname) is p, (n, pname)
        assert new.eps == old_eps[n]
        assert (new.weight_offset, new.cast_mode) == (offset, cast_mode), n
        assert tuple(new.normalized_shape) == tuple(new.weight.shape)
        assert new.training == (n != some)
    # at least the two hidden-size norms per layer and the final one take the
    # config's eps (DeepSeek's MLA norms keep the class default)
    assert sum(model.get_submodule(n).eps == EPS for n in old) >= 2 * LAYERS + 1
    assert [(n, id(p)) for n, p in model.named_parameters()] == [(n, id(p)) for n, p in params_before]
    state_after = model.state_dict()
    assert list(state_after) == list(state_before)
    assert all(torch.equal(state_after[k], v) for k, v in state_before.items())
    assert patch(model) == 0


def emulate(module, x):
    """normjit's formula for `module` (README cast-mode table) with torch ops
    on the CPU: xhat = (x - mean) * rstd in fp32, w' = weight + weight_offset,
    "default" / "gemma": round_y(xhat * w' + b) in fp32;
    "llama": round_y(round_x(xhat) * w' + b)."""
    xf = x.float()
    dims = tuple(range(-len(module.normalized_shape), 0))
    if isinstance(module, njt.LayerNorm):
        xhat = F.layer_norm(xf, module.normalized_shape, None, None, module.eps)
    else:
        xhat = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + module.eps)
    if module.cast_mode == "llama":
        xhat = xhat.to(x.dtype).float()
    y = xhat * (module.weight.float() + module.weight_offset)
    if getattr(module, "bias", None) is not None:
        y = y + module.bias.float()
    return y.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_swapped_settings_reproduce_the_class_forward(name, dtype):
    """The table behind patch() checked against the installed transformers:
    normjit's formula with the new module's settings gives the replaced
    module's output exactly (RMSNorm; LayerNorm within CPU rounding)."""
    model = build(name).to(dtype)
    reference = copy.deepcopy(model)
    patch(model)
    g = torch.Generator().manual_seed(1)
    for n, orig in norm_modules(reference, name).items():
        new = model.get_submodule(n)
        N = new.weight.shape[-1]
        x = (torch.randn(48, 3, N, generator=g) * 2.0 + 0.5).to(dtype)
        with torch.no_grad():
            want, got = orig(x), emulate(new, x)
        assert got.dtype == want.dtype == dtype
        if isinstance(new, njt.LayerNorm):
            torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 8e-3, atol=1e-5)
            continue
        assert torch.equal(got, want), (n, (got.float() - want.float()).abs().max().item())
        if dtype == torch.bfloat16:
            # The check can tell the settings apart: the other cast mode, or
            # the other weight offset, changes some bf16 outputs.
            other = copy.copy(new)
            if new.cast_mode == "gemma":
                other.weight_offset = 1.0 - new.weight_offset
            else:
                other.cast_mode = "default" if new.cast_mode == "llama" else "llama"
            with torch.no_grad():
                assert not torch.equal(emulate(other, x), want), n


def test_families_choose_the_classes():
    assert set(FAMILIES) == {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "phi3", "olmo2",
                             "deepseek_v3", "torch"}
    qwen3 = build("qwen3")
    assert patch(qwen3, families="llama") == 0
    assert patch(qwen3, families=["gemma", "gemma2"]) == 0
    assert patch(qwen3, families=("qwen3",)) == NORM_COUNTS["qwen3"]
    gemma3 = build("gemma3")
    assert patch(gemma3, families={"gemma"}) == 0  # Gemma3RMSNorm is family "gemma3"
    assert patch(gemma3, families=[]) == 0
    assert patch(gemma3, families="gemma3") == NORM_COUNTS["gemma3"]
    gpt2 = build("gpt2")
    assert patch(gpt2, families=[f for f in FAMILIES if f != "torch"]) == 0
    assert patch(gpt2, families="torch") == NORM_COUNTS["gpt2"]


def test_bad_arguments_name_themselves():
    model = build("llama")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module.*dict"):
        patch({"layers": model})
    with pytest.raises(ValueError, match="families contains 'bert'"):
        patch(model, families=["llama", "bert"])
    with pytest.raises(TypeError, match="families must be None.*int: 3"):
        patch(model, families=3)
    with pytest.raises(TypeError, match="families must hold family names.*int: 1"):
        patch(model, families=["llama", 1])
    assert patch(model) == NORM_COUNTS["llama"]  # nothing was changed by the failed calls


def _named_class(cls_name, eps_attr="variance_epsilon", bias=False):
    def __init__(self, n):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.ones(n))
        setattr(self, eps_attr, 1e-6)
        if bias:
            self.bias = nn.Parameter(torch.zeros(n))

    return type(cls_name, (nn.Module,), {"__init__": __init__, "forward": lambda self, x: x})


def test_look_alikes_subclasses_and_shared_modules():
    class MyLayerNorm(nn.LayerNorm):  # a subclass may compute something else
        pass

    shared = nn.LayerNorm(8)
    model = nn.ModuleDict({
        "a": _named_class("LlamaRMSNorm")(8),  # shaped like transformers': swapped by its name
        "b": _named_class("LlamaRMSNorm", bias=True)(8),  # a bias: not the known class
        "c": _named_class("GemmaRMSNorm", eps_attr="variance_epsilon")(8),  # no `eps`
        "d": MyLayerNorm(8),
        "e": nn.Sequential(shared, nn.Linear(8, 8), shared),
        "f": _named_class("MixtralRMSNorm")(8),  # not in the table
    })
    with pytest.warns(UserWarning, match="left these norm modules alone.*LlamaRMSNorm.*GemmaRMSNorm|"
                                         "left these norm modules alone.*GemmaRMSNorm.*LlamaRMSNorm"):
        assert patch(model) == 2
    assert isinstance(model["a"], njt.RMSNorm) and model["a"].cast_mode == "llama"
    assert type(model["b"]).__name__ == "LlamaRMSNorm" and type(model["c"]).__name__ == "GemmaRMSNorm"
    assert type(model["d"]) is MyLayerNorm and type(model["f"]).__name__ == "MixtralRMSNorm"
    assert isinstance(model["e"][0], njt.LayerNorm) and model["e"][0] is model["e"][2]
    assert model["e"][0].weight is shared.weight and model["e"][0].bias is shared.bias


def test_hooks_move_and_instance_forwards_stay():
    model = build("qwen3")
    calls = []
    norm = model.model.norm
    handle = norm.register_forward_hook(lambda mod, args, out: calls.append(type(mod).__name__))
    patched_forward = model.model.layers[0].input_layernorm
    patched_forward.forward = lambda x: x  # as accelerate's hooks do
    with pytest.warns(UserWarning, match="input_layernorm"):
        assert patch(model) == NORM_COUNTS["qwen3"] - 1
    assert model.model.layers[0].input_layernorm is patched_forward
    new = model.model.norm
    assert isinstance(new, njt.RMSNorm) and len(new._forward_hooks) == 1
    handle.remove()
    assert len(new._forward_hooks) == 0


# ---- GPU: the patched model against the unpatched one -----------------------------


def _cuda_pair(name):
    model = build(name).to("cuda", torch.bfloat16)
    reference = copy.deepcopy(model)
    assert patch(model) == NORM_COUNTS[name]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 128, (2, 24), generator=g).cuda()
    return model, reference, ids


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


@gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_logits_match_the_unpatched_model(name):
    model, reference, ids = _cuda_pair(name)
    model.eval()
    reference.eval()
    with torch.no_grad():
        got = model(input_ids=ids).logits
        want = reference(input_ids=ids).logits
    assert torch.isfinite(got).all()
    # Both run in bf16 (unit roundoff 2^-9 ~ 2e-3). normjit and torch reduce
    # mean(x^2) in another order, so an output of a norm may round to the
    # neighbouring bf16 value (one ulp, <= 2^-8 relative); each of the 5-13
    # norms on the path passes such flips on through the matmuls. 2e-2 of the
    # largest logit allows a few ulps of that. Calibrated on the CPU with the
    # cast-mode formulas and rstd off by +-1 fp32 ulp at random: <= 3.3e-3 over
    # these models; a wrong eps (1e-2) or Gemma without its +1 gave >= 0.8.
    assert rel_err(got, want) <= 2e-2


def _train(model, ids, steps=5):
    """Five AdamW steps on one batch: (losses, norm-weight gradients of step 1)."""
    torch.manual_seed(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads = [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
                     if p.grad is not None and ("norm" in n or ".ln_" in n)}
        opt.step()
        losses.append(loss.item())
    return losses, grads


@gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_bf16_training_matches_the_unpatched_model(name):
    model, reference, ids = _cuda_pair(name)
    got, got_grads = _train(model, ids)
    want, want_grads = _train(reference, ids)
    # The loss (fp32 cross entropy over bf16 logits, ~ln(128) = 4.85, falling
    # by 0.4-0.9 over the five steps) moves by the logits' rounding differences
    # (see above) averaged over 48 tokens, and the parameters by bf16 rounding
    # of the updates. 0.02 (0.4%) holds that with room: the CPU calibration
    # above gave <= 5e-4 per step, a wrong eps or offset >= 0.28.
    for step, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 2e-2, f"step {step}: loss {g} vs {w} (all: {got} vs {want})"
    assert want[-1] < want[0] and got[-1] < got[0]  # the steps did train
    assert got_grads.keys() == want_grads.keys() and got_grads
    num = sum(((got_grads[n] - want_grads[n]) ** 2).sum() for n in want_grads)
    den = sum((want_grads[n] ** 2).sum() for n in want_grads)
    # Norm-weight gradients of step 1: sums over the 48 tokens, accumulated in
    # fp32 by both from bf16 incoming gradients. 5% (L2, all norm weights
    # together) allows their bf16 rounding (CPU calibration: <= 9e-3; a wrong
    # eps or offset >= 0.25).
    assert (num / den).sqrt().item() <= 5e-2
