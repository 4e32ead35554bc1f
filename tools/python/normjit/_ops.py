"""normjit's PyTorch custom operators (libnormjit_torch.so) and their fake
implementations, loaded by normjit.torch.

The operators (schemas in tools/python/csrc/torch_ops.cpp):
    torch.ops.normjit.norm_fwd(x, residual?, weight?, bias?, norm, normalized_shape,
                               eps, weight_offset, cast_mode, residual_rounding)
        -> (y, h, mean, rstd)
    torch.ops.normjit.norm_bwd(dy, xin, weight?, bias?, mean, rstd, dh?, norm, n_dims,
                               weight_offset, cast_mode, heads, y_dtype)
        -> (dx, dweight, dbias)
y: x's shape and dtype, contiguous; h: x's shape in residual's dtype ([0]
without a residual); mean: [M] fp32 for LayerNorm ([0] for RMSNorm); rstd: [M]
fp32; M = x.numel() / N, N = prod(normalized_shape). norm_fwd is
differentiable (its autograd kernel is C++ and calls norm_bwd), so autograd,
torch.compile (fullgraph, dynamic shapes) and CUDA graphs all see two
operators with schemas.

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
        dx = xin.new_empty(xin.shape)
        dweight = torch.empty_like(weight, memory_format=torch.contiguous_format) if weight is not None \
            else xin.new_empty((0,))
        if bias is None:
            dbias = xin.new_empty((0,))
        else:
            dbias = bias.new_empty(bias.shape, dtype=weight.dtype if weight is not None else bias.dtype)
        return dx, dweight, dbias


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
        return _state["ops"]
    _state["why"] = "; ".join(errors) or "no candidate path"
    return None


def reason():
    """Why load() returned None ('' when it loaded)."""
    return _state["why"] or ""


def set_engine(handle):
    """Hands the process-wide engine (a C handle; None: none) to the operators."""
    _state["lib"].normjit_torch_set_engine(handle)
