"""normjit's PyTorch custom operators (libnormjit_torch.so) and their fake
implementations, loaded by normjit.torch.

The operators (schemas in tools/python/csrc/torch_ops.cpp):
    torch.ops.normjit.norm_fwd(x, residual?, weight?, bias?, norm, normalized_shape,
                               eps, weight_offset, cast_mode, residual_rounding)
        -> (y, h, mean, rstd)
    torch.ops.normjit.norm_bwd(dy, xin, weight?, bias?, mean, rstd, dh?, norm, n_dims,
                               weight_offset, cast_mode, heads, y_dtype)
        -> (dx, dweight, dbias)
    torch.ops.normjit.norm_fwd_fp8(x, residual?, weight?, bias?, scale?, norm, normalized_shape, eps,
                                   weight_offset, cast_mode, residual_rounding, quant, fp8_dtype,
                                   group_size, scale_ue8m0, scale_col_major, scale_ub, scale_min,
                                   return_y, transpose, store_amax, return_stats)
        -> (q, scale, amax, y, q_t, h, mean, rstd)
    torch.ops.normjit.norm_fwd_fp8_input(x_grad_proxy, x_q, x_scale, weight?, bias?, norm,
                                         normalized_shape, eps, out_dtype, quant, fp8_dtype)
        -> (y, scale, q_t, mean, rstd)
    torch.ops.normjit.norm_bwd_fp8_input(dy, x_q, x_scale, weight?, bias?, mean, rstd, norm, n_dims,
                                         out_dtype) -> (dx, dweight, dbias)
y: x's shape and dtype, contiguous; h: x's shape in residual's dtype ([0]
without a residual); mean: [M] fp32 for LayerNorm ([0] for RMSNorm); rstd: [M]
fp32; M = x.numel() / N, N = prod(normalized_shape). norm_fwd is
differentiable (its autograd kernel is C++ and calls norm_bwd), so autograd,
torch.compile (fullgraph, dynamic shapes) and CUDA graphs all see two
operators with schemas. The FP8 operators (normjit.torch's rms_norm_fp8 and
friends) return [0] tensors for the outputs a call does not ask for;
norm_fwd_fp8_input's autograd formula is registered here and calls
norm_bwd_fp8_input.

load() returns the OpOverloads, or None with the reason when the library is
absent or does not load (built for another torch, say): normjit.torch then
uses its ctypes autograd functions.
"""

import ctypes
import os

import torch

from . import _capi

_state = {"ops": None, "why": None, "lib": None}
_NAMES = ("libnormjit_torch.so",)


def _candidates():
    env = os.environ.get("NORMJIT_TORCH_LIBRARY")
    if env:
        yield env
        return
    try:
        here = os.path.dirname(_capi.library_path())
    except _capi.NormjitError:
        here = None
    for d in filter(None, (here, os.path.dirname(os.path.abspath(__file__)))):
        for n in _NAMES:
            yield os.path.join(d, n)


def _param_grad_fakes(like, weight, bias):
    """dweight and dbias as the backward operators allocate them ([0] when absent)."""
    dweight = torch.empty_like(weight, memory_format=torch.contiguous_format) if weight is not None \
        else like.new_empty((0,))
    if bias is None:
        return dweight, like.new_empty((0,))
    return dweight, bias.new_empty(bias.shape, dtype=weight.dtype if weight is not None else bias.dtype)


def _register_fakes():
    @torch.library.register_fake("normjit::norm_fwd")
    def _(x, residual, weight, bias, norm, normalized_shape, eps, weight_offset, cast_mode, residual_rounding):
        k = len(normalized_shape)
        torch._check(k >= 1 and tuple(x.shape[x.dim() - k:]) == tuple(normalized_shape),
                     lambda: f"normalized_shape = {list(normalized_shape)} does not match x.shape = {list(x.shape)}")
        N = 1
        for s in normalized_shape:
            N *= s
        M = x.numel() // N
        y = x.new_empty(x.shape)
        h = residual.new_empty(x.shape) if residual is not None else x.new_empty((0,))
        mean = x.new_empty((M if norm == _capi.NORM_LAYER else 0,), dtype=torch.float32)
        rstd = x.new_empty((M,), dtype=torch.float32)
        return y, h, mean, rstd

    @torch.library.register_fake("normjit::norm_bwd")
    def _(dy, xin, weight, bias, mean, rstd, dh, norm, n_dims, weight_offset, cast_mode, heads, y_dtype):
        return (xin.new_empty(xin.shape),) + _param_grad_fakes(xin, weight, bias)


_QUANT_TENSOR_STATIC, _QUANT_TENSOR, _QUANT_TOKEN, _QUANT_GROUP, _QUANT_MX = 1, 2, 3, 4, 5


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _quant_fakes(x, n_dims, quant, fp8_dtype, group_size, scale_col_major, return_y, transpose, out_dtype):
    """(q, scale, amax, y, q_t) as quant_outputs (torch_ops.cpp) allocates them."""
    N = 1
    for s in x.shape[x.dim() - n_dims:]:
        N *= s
    M = x.numel() // N
    lead = tuple(x.shape[:x.dim() - n_dims])
    f32 = torch.float32
    q = x.new_empty(x.shape, dtype=fp8_dtype)
    amax = x.new_empty((1 if quant == _QUANT_TENSOR else 0,), dtype=f32)
    if quant == _QUANT_TENSOR_STATIC:
        scale = x.new_empty((0,), dtype=f32)
    elif quant == _QUANT_TENSOR:
        scale = x.new_empty((1,), dtype=f32)
    elif quant == _QUANT_TOKEN:
        scale = x.new_empty(lead + (1,), dtype=f32)
    elif quant == _QUANT_MX:
        scale = x.new_empty(lead + (N // 32,), dtype=torch.uint8)
    elif scale_col_major:
        scale = x.new_empty_strided((M, N // group_size), (1, M), dtype=f32)
    else:
        scale = x.new_empty(lead + (N // group_size,), dtype=f32)
    y = x.new_empty(x.shape, dtype=out_dtype) if return_y else x.new_empty((0,))
    q_t = x.new_empty((N, M), dtype=fp8_dtype) if transpose else x.new_empty((0,))
    return q, scale, amax, y, q_t


def _register_fp8():
    @torch.library.register_fake("normjit::norm_fwd_fp8")
    def _(x, residual, weight, bias, scale, norm, normalized_shape, eps, weight_offset, cast_mode, residual_rounding,
          quant, fp8_dtype, group_size, scale_ue8m0, scale_col_major, scale_ub, scale_min, return_y, transpose,
          store_amax, return_stats):
        q, sc, amax, y, q_t = _quant_fakes(x, len(normalized_shape), quant, fp8_dtype, group_size, scale_col_major,
                                           return_y, transpose, x.dtype)
        if store_amax:
            amax = x.new_empty((1,), dtype=torch.float32)
        h = residual.new_empty(x.shape) if residual is not None else x.new_empty((0,))
        N = _prod(normalized_shape)
        M = x.numel() // N if N else 0
        rstd = x.new_empty((M if return_stats else 0,), dtype=torch.float32)
        mean = x.new_empty((M if return_stats and norm == _capi.NORM_LAYER else 0,), dtype=torch.float32)
        return q, sc, amax, y, q_t, h, mean, rstd

    @torch.library.register_fake("normjit::norm_fwd_fp8_input")
    def _(x_grad_proxy, x_q, x_scale, weight, bias, norm, normalized_shape, eps, out_dtype, quant, fp8_dtype):
        N = 1
        for s in normalized_shape:
            N *= s
        M = x_q.numel() // N
        f32 = torch.float32
        rstd = x_q.new_empty((M,), dtype=f32)
        mean = x_q.new_empty((M if norm == _capi.NORM_LAYER else 0,), dtype=f32)
        if quant == 0:
            return (x_q.new_empty(x_q.shape, dtype=out_dtype), x_q.new_empty((0,), dtype=f32), x_q.new_empty((0,)),
                    mean, rstd)
        q, sc, _, _, q_t = _quant_fakes(x_q, len(normalized_shape), quant, fp8_dtype, 128, False, False, True,
                                        out_dtype)
        return q, sc, q_t, mean, rstd

    @torch.library.register_fake("normjit::norm_bwd_fp8_input")
    def _(dy, x_q, x_scale, weight, bias, mean, rstd, norm, n_dims, out_dtype):
        dx = x_q.new_empty(x_q.shape, dtype=out_dtype)
        return (dx,) + _param_grad_fakes(dx, weight, bias)

    # dL/dx reaches x_grad_proxy (an FP8 x_q cannot hold a gradient); the
    # quantized outputs, mean and rstd carry none.
    def setup_context(ctx, inputs, output):
        _, x_q, x_scale, weight, bias, norm, normalized_shape, _, out_dtype, _, _ = inputs
        _, _, _, mean, rstd = output
        ctx.save_for_backward(x_q, x_scale, weight, bias, mean, rstd)
        ctx.norm, ctx.n_dims, ctx.out_dtype = norm, len(normalized_shape), out_dtype

    def backward(ctx, dy, *unused):
        x_q, x_scale, weight, bias, mean, rstd = ctx.saved_tensors
        if dy is None or not (ctx.needs_input_grad[0] or ctx.needs_input_grad[3] or ctx.needs_input_grad[4]):
            return (None,) * 11
        dx, dweight, dbias = torch.ops.normjit.norm_bwd_fp8_input(dy, x_q, x_scale, weight, bias, mean, rstd,
                                                                  ctx.norm, ctx.n_dims, ctx.out_dtype)
        gw = dweight.to(weight.dtype) if weight is not None and ctx.needs_input_grad[3] else None
        gb = dbias.to(bias.dtype) if bias is not None and ctx.needs_input_grad[4] else None
        return (dx if ctx.needs_input_grad[0] else None), None, None, gw, gb, None, None, None, None, None, None

    torch.library.register_autograd("normjit::norm_fwd_fp8_input", backward, setup_context=setup_context)


def load():
    """(norm_fwd, norm_bwd) OpOverloads, or None (see reason())."""
    if _state["ops"] is not None or _state["why"] is not None:
        return _state["ops"]
    errors = []
    for path in _candidates():
        if not os.path.exists(path):
            errors.append(f"{path}: not found")
            continue
        try:
            torch.ops.load_library(path)
            lib = ctypes.CDLL(path)
            lib.normjit_torch_set_engine.argtypes = [ctypes.c_void_p]
            lib.normjit_torch_set_engine.restype = None
        except (OSError, RuntimeError, AttributeError) as e:
            errors.append(f"{path}: {e}")
            continue
        _state["lib"] = lib
        _register_fakes()
        _state["ops"] = (torch.ops.normjit.norm_fwd.default, torch.ops.normjit.norm_bwd.default)
        if hasattr(torch.ops.normjit, "norm_fwd_fp8") and hasattr(torch, "float8_e4m3fn"):
            _register_fp8()
        return _state["ops"]
    _state["why"] = "; ".join(errors) or "no candidate path"
    return None


def reason():
    """Why load() returned None ('' when it loaded)."""
    return _state["why"] or ""


def set_engine(handle):
    """Hands the process-wide engine (a C handle; None: none) to the operators."""
    _state["lib"].normjit_torch_set_engine(handle)
