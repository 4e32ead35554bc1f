"""Hugging Face transformers models on normjit's norm modules: patch(model).

RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization") and
LayerNorm (Ba et al. 2016, "Layer Normalization") modules of a model are
swapped, in place, for normjit.torch.RMSNorm / normjit.torch.LayerNorm set up
to compute what the class they replace computes (see normjit.torch and the
README's cast-mode table).

The norm classes are recognised by their class name, so transformers itself
is never imported here; torch and normjit.torch are imported at the first
call. Each known class maps to (family, eps attribute, weight_offset,
cast_mode), taken from the class's forward() in transformers 5.x:

  LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm, Qwen3RMSNorm (also q_norm /
  k_norm), Phi3RMSNorm, DeepseekV3RMSNorm (also the MLA q_a_layernorm /
  kv_a_layernorm): `self.weight * hidden.to(input_dtype)`, x * rstd rounded
  to x's dtype before the weight: cast_mode "llama", eps in
  `variance_epsilon`, weight used as stored.
  GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm: `output * (1.0 +
  self.weight.float())` in fp32, then `type_as(x)`: zero-centred weight,
  weight_offset 1.0, cast_mode "gemma", eps in `eps`.
  Olmo2RMSNorm: `(self.weight * hidden).to(input_dtype)`, the product in
  fp32 and rounded once: cast_mode "default", eps in `variance_epsilon`.
  torch.nn.LayerNorm (GPT-2, GPT-NeoX, ...) and torch.nn.RMSNorm, exact
  types only: cast_mode "default", their own eps (family "torch").
"""

import math
import numbers
import warnings

__all__ = ["FAMILIES", "patch"]

# class name -> (family, eps attribute, weight_offset, cast_mode); all RMSNorm.
_HF_RMS_CLASSES = {
    "LlamaRMSNorm": ("llama", "variance_epsilon", 0.0, "llama"),
    "MistralRMSNorm": ("mistral", "variance_epsilon", 0.0, "llama"),
    "Qwen2RMSNorm": ("qwen2", "variance_epsilon", 0.0, "llama"),
    "Qwen3RMSNorm": ("qwen3", "variance_epsilon", 0.0, "llama"),
    "Phi3RMSNorm": ("phi3", "variance_epsilon", 0.0, "llama"),
    "DeepseekV3RMSNorm": ("deepseek_v3", "variance_epsilon", 0.0, "llama"),
    "GemmaRMSNorm": ("gemma", "eps", 1.0, "gemma"),
    "Gemma2RMSNorm": ("gemma2", "eps", 1.0, "gemma"),
    "Gemma3RMSNorm": ("gemma3", "eps", 1.0, "gemma"),
    "Olmo2RMSNorm": ("olmo2", "variance_epsilon", 0.0, "default"),
}
_TORCH_FAMILY = "torch"  # exact torch.nn.LayerNorm / torch.nn.RMSNorm

#: The family names patch() accepts in `families`.
FAMILIES = tuple(sorted({f for f, _, _, _ in _HF_RMS_CLASSES.values()} | {_TORCH_FAMILY}))

# Hook tables of torch.nn.Module moved to the new module (shared, so that the
# handles returned when they were registered still remove them).
_HOOK_ATTRS = (
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_backward_pre_hooks", "_backward_hooks", "_is_full_backward_hook",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def _family_set(families):
    if families is None:
        return set(FAMILIES)
    if isinstance(families, str):
        families = (families,)
    try:
        items = list(families)
    except TypeError:
        raise TypeError("families must be None, a family name or an iterable of family names, got "
                        f"{type(families).__name__}: {families!r}") from None
    chosen = set()
    for f in items:
        if not isinstance(f, str):
            raise TypeError(f"families must hold family names (str), got {type(f).__name__}: {f!r}")
        if f not in FAMILIES:
            raise ValueError(f"families contains {f!r}, which is not one of {', '.join(map(repr, FAMILIES))}")
        chosen.add(f)
    return chosen


def _hf_eps(child, eps_attr):
    """The module's eps when it is shaped as the class patch() knows (one
    Parameter `weight`, no bias, buffers or submodules, a finite eps >= 0);
    else None."""
    import torch

    params = dict(child.named_parameters(recurse=False))
    if set(params) != {"weight"} or not isinstance(params["weight"], torch.nn.Parameter):
        return None
    if params["weight"].dim() < 1 or next(child.children(), None) is not None:
        return None
    if next(child.buffers(recurse=False), None) is not None:
        return None
    eps = getattr(child, eps_attr, None)
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        return None
    return float(eps)


def _replacement(child, chosen, skipped):
    """normjit's module standing in for `child`, or None to leave it alone."""
    from torch import nn

    from . import torch as njt

    cls = type(child)
    if _TORCH_FAMILY in chosen and cls is nn.LayerNorm:
        new = njt.LayerNorm(child.normalized_shape, child.eps, child.elementwise_affine,
                            bias=child.bias is not None, device="meta")
        new.weight, new.bias = child.weight, child.bias
        return new
    if _TORCH_FAMILY in chosen and cls is getattr(nn, "RMSNorm", None):
        new = njt.RMSNorm(child.normalized_shape, child.eps, child.elementwise_affine, device="meta")
        new.weight = child.weight
        return new
    entry = _HF_RMS_CLASSES.get(cls.__name__)
    if entry is None or entry[0] not in chosen:
        return None
    _, eps_attr, offset, cast_mode = entry
    eps = _hf_eps(child, eps_attr)
    if eps is None:
        skipped.append(f"{cls.__module__}.{cls.__qualname__} (not shaped as transformers' {cls.__name__}: "
                       f"one weight Parameter and a float `{eps_attr}`)")
        return None
    weight = child.weight
    new = njt.RMSNorm(tuple(weight.shape), eps, True, device="meta", weight_offset=offset, cast_mode=cast_mode)
    new.weight = weight
    return new


def patch(model, *, families=None):
    """Swaps the norm modules of a Hugging Face transformers model for normjit's, in place.

    Every submodule of `model` whose class is one of the known norm classes
    (module docstring; RMSNorm of Zhang & Sennrich 2019, LayerNorm of Ba et
    al. 2016) is replaced by a normjit.torch.RMSNorm or normjit.torch.LayerNorm
    with the same normalized_shape (the weight's shape), eps, weight offset
    and casting as the class's forward(): Llama, Mistral, Qwen2, Qwen3 (with
    q_norm / k_norm), Phi-3, DeepSeek-V3 (with q_a_layernorm /
    kv_a_layernorm), Gemma, Gemma 2, Gemma 3 (zero-centred weight, offset 1),
    OLMo 2, and exact torch.nn.LayerNorm / torch.nn.RMSNorm (GPT-2,
    GPT-NeoX). The new modules hold the same Parameter objects (optimizers,
    tied or shared weights stay valid; parameters keep their device, dtype
    and requires_grad), the training mode, the attribute names (so
    state_dict keys are unchanged) and torch hooks registered on the old
    modules. A module shared by several parents stays shared. `model` itself
    is never replaced. Calling patch() again swaps nothing.

    model: a torch.nn.Module (a PreTrainedModel or any module holding one).
    families: None (all), a family name or an iterable of them, from
        normjit.hf.FAMILIES: "deepseek_v3", "gemma", "gemma2", "gemma3",
        "llama", "mistral", "olmo2", "phi3", "qwen2", "qwen3", "torch".
    Returns the number of modules swapped (int).

    After patching, the norms run normjit's kernels: inputs must be CUDA
    tensors of float32, float16 or bfloat16 of shape [..., *normalized_shape]
    (rows may be strided views, e.g. DeepSeek's kv_a_layernorm input);
    weights may have another of these dtypes; y has x's dtype. (The Llama
    classes return the promotion of the weight's and x's dtypes; that differs
    only with a weight wider than x, e.g. fp32 weights and bf16 q / k under
    autocast, where normjit returns that result rounded to x's dtype, as the
    next autocast matmul or attention rounds it anyway.)
    Left alone: classes not in the table, subclasses of the torch classes, a
    known class name whose module is not shaped as transformers' (warned
    with its name), and modules whose forward was replaced on the instance
    (accelerate's device-map hooks; warned).

    Raises TypeError if model is not a torch.nn.Module or families is not
    None / a str / an iterable of str, ValueError for an unknown family name
    (both messages name the argument and its value).
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}: {model!r:.80}")
    chosen = _family_set(families)
    replaced = {}  # id(old module) -> new module
    skipped = []
    count = 0
    for parent in list(model.modules()):
        # _modules, not named_children(): that lists a child held twice by one parent once.
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) in replaced:
                setattr(parent, name, replaced[id(child)])
                continue
            new = _replacement(child, chosen, skipped)
            if new is None:
                continue
            if "forward" in vars(child) or getattr(child, "_hf_hook", None) is not None:
                skipped.append(f"{name} ({type(child).__name__}): its forward is replaced on the instance "
                               "(accelerate hook?)")
                continue
            for attr in _HOOK_ATTRS:
                table = vars(child).get(attr)
                if table:
                    vars(new)[attr] = table
            new.train(child.training)
            replaced[id(child)] = new
            setattr(parent, name, new)
            count += 1
    if skipped:
        warnings.warn("normjit.hf.patch left these norm modules alone: " + "; ".join(sorted(set(skipped))),
                      stacklevel=2)
    return count
