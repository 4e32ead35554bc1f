"""PyTorch front end of normjit: functions, autograd functions and nn.Modules.

RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"):
    y = x * rstd * w' (+ bias),  rstd = 1 / sqrt(mean(x^2) + eps)
LayerNorm (Ba et al. 2016, "Layer Normalization"):
    y = (x - mean) * rstd * w' + bias,  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
with w' = weight + weight_offset (1 + weight_offset without a weight), the
mean and rstd over the last N elements of each row (N = the product of
normalized_shape), computed in fp32.

The functions have the signatures and semantics of torch.nn.functional's
rms_norm and layer_norm, plus keyword-only extras; the modules are drop-in
replacements of torch.nn.RMSNorm / torch.nn.LayerNorm (same parameters and
state_dict keys). Tensors must be CUDA tensors of dtype float32, float16 or
bfloat16 (weight and bias may have a dtype other than x's). Kernels run on
torch.cuda.current_stream(x.device). Outputs are new contiguous tensors.

Inputs whose rows are not contiguous are read through strides without a copy
when the leading dimensions collapse to one row stride, or (without a
residual) to tokens x heads, e.g. a per-head QK-norm on
``qkv[..., :heads * D].view(T, heads, D)``; other layouts are copied with
.contiguous() first.
"""

import ctypes
import math
import numbers
import re

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from . import _capi, _engine_handle, _engine_listeners, _ops
from ._capi import NormjitError

__all__ = [
    "FP8InputNormFunction",
    "FP8Output",
    "layer_norm_fp8",
    "layer_norm_fp8_input",
    "rms_norm_fp8",
    "rms_norm_fp8_input",
    "AddLayerNormFunction",
    "AddRMSNormFunction",
    "LayerNorm",
    "LayerNormFunction",
    "RMSNorm",
    "RMSNormFunction",
    "add_layer_norm",
    "add_rms_norm",
    "layer_norm",
    "patch",
    "replace_norms",
    "rms_norm",
    "sharded_layer_norm",
    "sharded_rms_norm",
]

_DTYPES = {torch.float32: _capi.FP32, torch.float16: _capi.FP16, torch.bfloat16: _capi.BF16}
_CAST_MODES = {"default": _capi.CAST_DEFAULT, "llama": _capi.CAST_LLAMA, "gemma": _capi.CAST_GEMMA}
_RESIDUAL_ROUNDING = {"residual": _capi.RESIDUAL_ROUND_RESIDUAL_DTYPE, "fp32": _capi.RESIDUAL_ROUND_FP32}


# ---- argument checks --------------------------------------------------------


def _check_tensor(name, t, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on device '{t.device}': normjit runs on CUDA tensors only (move it with .cuda())")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}.dtype = {t.dtype} is not supported: use torch.float32, torch.float16 or torch.bfloat16")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on device '{t.device}' but x is on '{device}'")


def _normalized(x, normalized_shape):
    """normalized_shape as a tuple, and N = the product of its sizes."""
    if isinstance(normalized_shape, numbers.Integral):
        shape = (int(normalized_shape),)
    else:
        try:
            shape = tuple(int(s) for s in normalized_shape)
        except TypeError:
            raise TypeError(
                f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}") from None
    if not shape or len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(
            f"normalized_shape = {list(shape)} does not match the trailing dimensions of x.shape = {list(x.shape)}")
    return shape, math.prod(shape)


def _check_param(name, p, shape, device):
    if p is None:
        return
    _check_tensor(name, p, device)
    if tuple(p.shape) != shape:
        raise ValueError(f"{name}.shape = {list(p.shape)} must equal normalized_shape = {list(shape)}")


def _option(name, value, table):
    if value not in table:
        raise ValueError(f"{name} = {value!r} is not one of {', '.join(repr(k) for k in table)}")
    return table[value]


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}: {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} = {value} must be finite")
    return value


# ---- layouts ----------------------------------------------------------------


def _leading_dims(t, k):
    """t's leading dims (all but the last k) as (size, stride) pairs, size-1
    dims dropped and mergeable neighbours merged; None when the last k dims
    are not one contiguous block of elements."""
    shape, strides = t.shape, t.stride()
    expect = 1
    for i in range(t.dim() - 1, t.dim() - 1 - k, -1):
        if shape[i] != 1 and strides[i] != expect:
            return None
        expect *= shape[i]
    dims = []
    for size, stride in zip(shape[: t.dim() - k], strides[: t.dim() - k]):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = (dims[-1][0] * size, stride)
        else:
            dims.append((size, stride))
    return dims


def _rows(t, k, N, heads=None):
    """How to read t's rows: (tensor, heads, token_stride, head_stride), the
    strides in elements, 0 = contiguous. heads=None: tokens x heads allowed
    and found here; heads=1: 2-D rows only; heads=H: t must be readable as
    tokens x H rows. The tensor is t, or t.contiguous() when its layout does
    not fit."""
    dims = _leading_dims(t, k)
    if dims is not None:
        if len(dims) == 0:  # a single row
            return t, heads or 1, 0, 0
        if len(dims) == 1:
            (_, s), = dims
            if s >= N:
                if heads is None or heads == 1:
                    return t, 1, s, 0
                return t, heads, heads * s, s
        if len(dims) == 2 and heads != 1:
            (_, ts), (h, hs) = dims
            if (heads is None or heads == h) and hs >= N and ts >= h * hs:
                return t, h, ts, hs
    return t.contiguous(), heads or 1, 0, 0


def _stream(device):
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _ptr(t):
    return t.data_ptr() if t is not None else None


# ---- the engine calls -------------------------------------------------------


def _validate_forward(norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                      residual_rounding):
    """The Python-side checks of a forward call (TypeError / ValueError naming
    the argument). Returns (shape, N, eps, weight_offset, cast, rounding)."""
    _check_tensor("x", x)
    shape, N = _normalized(x, normalized_shape)
    _check_param("weight", weight, shape, x.device)
    _check_param("bias", bias, shape, x.device)
    if residual is not None:
        _check_tensor("residual", residual, x.device)
        if residual.shape != x.shape:
            raise ValueError(f"residual.shape = {list(residual.shape)} must equal x.shape = {list(x.shape)}")
    eps = _number("eps", eps)
    if eps < 0:
        raise ValueError(f"eps = {eps} must be >= 0")
    weight_offset = _number("weight_offset", weight_offset)
    if weight_offset != 0.0 and weight is None:
        raise ValueError(f"weight_offset = {weight_offset} needs a weight (w' = weight + weight_offset); "
                         "without one w' = 1")
    cast = _option("cast_mode", cast_mode, _CAST_MODES)
    rounding = _option("residual_rounding", residual_rounding, _RESIDUAL_ROUNDING)
    return shape, N, eps, weight_offset, cast, rounding


def _forward(ctx, norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
             residual_rounding):
    """Runs the forward; fills ctx for _backward. Returns (y, h or None)."""
    shape, N, eps, weight_offset, cast, rounding = _validate_forward(
        norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode, residual_rounding)

    k = len(shape)
    M = x.numel() // N if N else 0
    d = _capi.new_desc()
    d.norm = norm
    d.M = M
    d.N = N
    d.eps = eps
    d.weight_offset = weight_offset
    d.cast_mode = cast
    d.x_dtype = d.y_dtype = _DTYPES[x.dtype]
    # weight and bias share weight_dtype: bias follows weight's dtype.
    w = weight.contiguous() if weight is not None else None
    b = None
    if bias is not None:
        b = (bias.to(w.dtype) if w is not None else bias).contiguous()
    pdtype = w.dtype if w is not None else (b.dtype if b is not None else x.dtype)
    d.weight_dtype = _DTYPES[pdtype]
    d.has_weight = int(w is not None)
    d.has_bias = int(b is not None)
    d.store_rstd = 1
    d.store_mean = int(norm == _capi.NORM_LAYER)

    if residual is not None:
        x_in, _, xs, _ = _rows(x, k, N, heads=1)
        r_in, _, rs, _ = _rows(residual, k, N, heads=1)
        d.x_stride = xs
        d.residual = 1
        d.store_residual_out = 1
        d.residual_stride = rs
        d.residual_dtype = d.residual_out_dtype = _DTYPES[residual.dtype]
        d.residual_rounding = rounding
        h = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    else:
        x_in, heads, xs, hs = _rows(x, k, N)
        r_in, h = None, None
        d.heads = heads
        d.x_stride = xs
        d.x_head_stride = hs

    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    mean = torch.empty(M, dtype=torch.float32, device=x.device) if d.store_mean else None
    if M > 0:
        t = _capi.new_forward_tensors()
        t.x, t.residual, t.weight, t.bias = _ptr(x_in), _ptr(r_in), _ptr(w), _ptr(b)
        t.y, t.residual_out, t.mean, t.rstd = _ptr(y), _ptr(h), _ptr(mean), _ptr(rstd)
        with torch.cuda.device(x.device):
            _capi.check(_capi.load().normjit_forward(_engine_handle(), ctypes.byref(d), ctypes.byref(t),
                                                     _stream(x.device)))
    if ctx is not None:
        ctx.desc = _capi.copy_desc(d)
        ctx.k = k
        ctx.x_dtype = x.dtype
        ctx.residual_dtype = residual.dtype if residual is not None else None
        ctx.weight_dtype = weight.dtype if weight is not None else None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        # The backward reads the normalised input: x (through its strides) or h.
        ctx.save_for_backward(h if residual is not None else x_in, w, b, mean, rstd)
        ctx.set_materialize_grads(False)
    return y, h


def _backward(ctx, dy, dh):
    """Returns (dx, dweight, dbias); dx in the normalised input's dtype."""
    xin, w, b, mean, rstd = ctx.saved_tensors
    d = _capi.copy_desc(ctx.desc)
    N, k, M = d.N, ctx.k, d.M
    y_dtype = ctx.x_dtype
    if dy is None:
        dy = torch.zeros(xin.shape, dtype=y_dtype, device=xin.device)
    elif dy.dtype != y_dtype:
        dy = dy.to(y_dtype)
    dx_dtype = ctx.residual_dtype if d.residual else ctx.x_dtype
    dx = torch.empty(xin.shape, dtype=dx_dtype, device=xin.device)
    dweight = torch.empty_like(w) if w is not None else None
    dbias = torch.empty_like(b) if b is not None else None
    if M == 0:
        if dweight is not None:
            dweight.zero_()
        if dbias is not None:
            dbias.zero_()
        return dx, dweight, dbias

    dy_in, _, dys, dyhs = _rows(dy, k, N, heads=d.heads)
    d.dy_stride, d.dy_head_stride = dys, dyhs
    dres = None
    if d.residual:
        # The backward reads h (contiguous) as its x and writes dx = dL/dh in h's dtype.
        d.x_dtype = d.residual_out_dtype
        d.x_stride = 0
        if dh is not None:
            if dh.dtype != ctx.residual_dtype:
                dh = dh.to(ctx.residual_dtype)
            dres, _, drs, _ = _rows(dh, k, N, heads=1)
            d.has_dresidual = 1
            d.dresidual_stride = drs
    _run_backward(d, dy_in, xin, None, w, mean, rstd, dres, dx, dweight, dbias)
    return dx, dweight, dbias


def _run_backward(d, dy, x, x_scale, w, mean, rstd, dres, dx, dweight, dbias):
    """normjit_backward on x's device and stream, with a workspace of the size it asks for."""
    lib, handle = _capi.load(), _engine_handle()
    with torch.cuda.device(x.device):
        nbytes = ctypes.c_size_t(0)
        _capi.check(lib.normjit_backward_workspace_size(handle, ctypes.byref(d), ctypes.byref(nbytes)))
        ws = torch.empty(nbytes.value, dtype=torch.uint8, device=x.device) if nbytes.value else None
        t = _capi.new_backward_tensors()
        t.dy, t.x, t.x_scale = _ptr(dy), _ptr(x), _ptr(x_scale)
        t.weight, t.mean, t.rstd = _ptr(w), _ptr(mean), _ptr(rstd)
        t.dresidual, t.dx, t.dweight, t.dbias = _ptr(dres), _ptr(dx), _ptr(dweight), _ptr(dbias)
        t.workspace, t.workspace_bytes = _ptr(ws), nbytes.value
        _capi.check(lib.normjit_backward(handle, ctypes.byref(d), ctypes.byref(t), _stream(x.device)))


def _param_grads(ctx, dweight, dbias, i_weight, i_bias):
    gw = dweight.to(ctx.weight_dtype) if dweight is not None and ctx.needs_input_grad[i_weight] else None
    gb = None
    if dbias is not None and i_bias is not None and ctx.needs_input_grad[i_bias]:
        gb = dbias.to(ctx.bias_dtype)
    return gw, gb


class RMSNormFunction(torch.autograd.Function):
    """Autograd function of RMSNorm (Zhang & Sennrich 2019).

    apply(x, normalized_shape, weight, eps, weight_offset, cast_mode) -> y
    Arguments as rms_norm(); eps must be a float here. Backward: dx and
    dweight from the engine (deterministic), using the forward's rstd.
    """

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps, weight_offset, cast_mode):
        y, _ = _forward(ctx, _capi.NORM_RMS, x, None, normalized_shape, weight, None, eps, weight_offset, cast_mode,
                        "residual")
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        dx, dweight, _ = _backward(ctx, dy, None)
        gw, _ = _param_grads(ctx, dweight, None, 2, None)
        return (dx if ctx.needs_input_grad[0] else None), None, gw, None, None, None


class LayerNormFunction(torch.autograd.Function):
    """Autograd function of LayerNorm (Ba et al. 2016).

    apply(x, normalized_shape, weight, bias, eps, weight_offset, cast_mode) -> y
    Arguments as layer_norm(). Backward: dx, dweight and dbias from the
    engine (deterministic), using the forward's mean and rstd.
    """

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps, weight_offset, cast_mode):
        y, _ = _forward(ctx, _capi.NORM_LAYER, x, None, normalized_shape, weight, bias, eps, weight_offset,
                        cast_mode, "residual")
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        dx, dweight, dbias = _backward(ctx, dy, None)
        gw, gb = _param_grads(ctx, dweight, dbias, 2, 3)
        return (dx if ctx.needs_input_grad[0] else None), None, gw, gb, None, None, None


def _residual_grads(ctx, dx):
    gx = dx.to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
    gr = dx.to(ctx.residual_dtype) if ctx.needs_input_grad[1] else None
    return gx, gr


class AddRMSNormFunction(torch.autograd.Function):
    """Autograd function of the fused residual add + RMSNorm.

    apply(x, residual, normalized_shape, weight, eps, weight_offset, cast_mode,
    residual_rounding) -> (y, h), h = x + residual in residual's dtype,
    y = RMSNorm(h). Backward: dL/dh (plus h's own gradient when it has one)
    goes to both x and residual.
    """

    @staticmethod
    def forward(ctx, x, residual, normalized_shape, weight, eps, weight_offset, cast_mode, residual_rounding):
        return _forward(ctx, _capi.NORM_RMS, x, residual, normalized_shape, weight, None, eps, weight_offset,
                        cast_mode, residual_rounding)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh):
        dx, dweight, _ = _backward(ctx, dy, dh)
        gx, gr = _residual_grads(ctx, dx)
        gw, _ = _param_grads(ctx, dweight, None, 3, None)
        return gx, gr, None, gw, None, None, None, None


class AddLayerNormFunction(torch.autograd.Function):
    """Autograd function of the fused residual add + LayerNorm.

    apply(x, residual, normalized_shape, weight, bias, eps, weight_offset,
    cast_mode, residual_rounding) -> (y, h); as AddRMSNormFunction.
    """

    @staticmethod
    def forward(ctx, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode, residual_rounding):
        return _forward(ctx, _capi.NORM_LAYER, x, residual, normalized_shape, weight, bias, eps, weight_offset,
                        cast_mode, residual_rounding)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dh):
        dx, dweight, dbias = _backward(ctx, dy, dh)
        gx, gr = _residual_grads(ctx, dx)
        gw, gb = _param_grads(ctx, dweight, dbias, 3, 4)
        return gx, gr, None, gw, gb, None, None, None, None


# ---- the operator path ------------------------------------------------------
#
# With libnormjit_torch.so (PyTorch custom operators in C++, see _ops.py) a
# call is one dispatcher call: no ctypes, no descriptor built in Python, and
# torch.compile / CUDA graphs see operators with schemas. Without it, the
# ctypes autograd functions above (with a one-line notice).

_OPS = _ops.load()
if _OPS is None:
    import warnings

    warnings.warn(f"normjit.torch: C++ operators unavailable, using the ctypes path ({_ops.reason()})", stacklevel=2)
    _NORM_FWD = _NORM_FWD_RAW = None
    _NORM_FWD_FP8 = _NORM_FWD_FP8_INPUT = None
else:
    # Under torch.compile the OpOverload (Dynamo knows it); in eager its C++
    # callable, one Python frame less a call.
    _NORM_FWD = _OPS[0]
    _NORM_FWD_RAW = _OPS[0]._op
    _fp8_ops = hasattr(torch, "float8_e4m3fn") and hasattr(torch.ops.normjit, "norm_fwd_fp8")
    _NORM_FWD_FP8 = torch.ops.normjit.norm_fwd_fp8.default if _fp8_ops else None
    _NORM_FWD_FP8_INPUT = torch.ops.normjit.norm_fwd_fp8_input.default if _fp8_ops else None
_is_compiling = torch.compiler.is_compiling
_EPS = {t: torch.finfo(t).eps for t in _DTYPES}
_OP_ERRORS = (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError)
_engine_state = {"stale": True}


def _sync_engine():
    """Hands the package's engine to the operators (at import, and when
    set_cache_dir / set_tune_policy replace it)."""
    _engine_state["stale"] = True
    _ops.set_engine(None)
    _ops.set_engine(_engine_handle())
    _engine_state["stale"] = False


def _engine_replaced():
    try:
        _sync_engine()
    except _capi.NormjitError:
        pass  # the next call raises it (a bad $NORMJIT_TUNE, say)


if _NORM_FWD is not None:
    _engine_listeners.append(_engine_replaced)
    _engine_replaced()


def _op_failed(e, norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
               residual_rounding):
    """Raises the error of a failed operator call as the ctypes path would:
    the success path pays for no checks, so here the argument to name is
    found (TypeError / ValueError), else the engine's NormjitError."""
    if eps is None and norm == _capi.NORM_RMS and isinstance(x, torch.Tensor) and x.dtype in _EPS:
        eps = _EPS[x.dtype]
    _validate_forward(norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                      residual_rounding)
    _raise_engine_error(e)


def _raise_engine_error(e):
    """The engine's NormjitError behind an operator's RuntimeError (else e)."""
    if _engine_state["stale"]:
        _sync_engine()  # raises why the engine cannot be created
    m = _STATUS.match(str(e))
    if m:
        raise NormjitError(int(m.group(1)), m.group(2).split("\nException raised from")[0]) from None
    raise e


_STATUS = re.compile(r"normjit status (\d+): (.*)", re.S)


def _op_forward(norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode, residual_rounding):
    """(y, h, mean, rstd) from the norm_fwd operator."""
    try:
        return (_NORM_FWD if _is_compiling() else _NORM_FWD_RAW)(
            x, residual, weight, bias, norm, (normalized_shape,) if type(normalized_shape) is int else normalized_shape,
            eps, weight_offset, _CAST_MODES[cast_mode], _RESIDUAL_ROUNDING[residual_rounding])
    except _OP_ERRORS as e:
        _op_failed(e, norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                   residual_rounding)


# ---- functional API ---------------------------------------------------------


def _default_eps(x, eps):
    _check_tensor("x", x)
    return torch.finfo(x.dtype).eps if eps is None else eps


def rms_norm(x, normalized_shape, weight=None, eps=None, *, weight_offset=0.0, cast_mode="default"):
    """RMSNorm (Zhang & Sennrich 2019) over the trailing dims, as torch.nn.functional.rms_norm.

    x: CUDA tensor [..., *normalized_shape], float32 / float16 / bfloat16.
    normalized_shape: int or sequence of ints equal to x's trailing dims; N is
        their product (1 <= N <= 262144).
    weight: None or a tensor of shape normalized_shape on x's device (any of
        the three dtypes).
    eps: added to mean(x^2); None = torch.finfo(x.dtype).eps.
    weight_offset: y = x * rstd * (weight + weight_offset); 1.0 for Gemma's
        zero-centred weight. Needs a weight (ValueError otherwise).
    cast_mode: "default" (all in fp32, rounded once, as torch), "llama"
        (x * rstd rounded to x's dtype before the weight, as Hugging Face
        Llama), "gemma" (all in fp32, cast at the end).
    Returns y: a new contiguous tensor of x's shape and dtype. Differentiable
    in x and weight.
    Raises TypeError / ValueError for a bad argument (naming it and its
    value), normjit.NormjitError when the engine fails.
    """
    if _NORM_FWD is not None:
        # _op_forward inlined: the most frequent call saves a Python frame.
        try:
            return (_NORM_FWD if _is_compiling() else _NORM_FWD_RAW)(
                x, None, weight, None, _capi.NORM_RMS, (normalized_shape,) if type(normalized_shape) is int else normalized_shape,
                _EPS[x.dtype] if eps is None else eps, weight_offset, _CAST_MODES[cast_mode], 0)[0]
        except _OP_ERRORS as e:
            _op_failed(e, _capi.NORM_RMS, x, None, normalized_shape, weight, None, eps, weight_offset, cast_mode,
                       "residual")
    eps = _default_eps(x, eps)
    return RMSNormFunction.apply(x, normalized_shape, weight, eps, weight_offset, cast_mode)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, weight_offset=0.0, cast_mode="default"):
    """LayerNorm (Ba et al. 2016) over the trailing dims, as torch.nn.functional.layer_norm.

    x, normalized_shape, weight, weight_offset, cast_mode: as rms_norm().
    bias: None or a tensor of shape normalized_shape (added after the weight).
    eps: added to the variance (default 1e-5).
    Returns y of x's shape and dtype; differentiable in x, weight and bias.
    """
    if _NORM_FWD is not None:
        try:
            return (_NORM_FWD if _is_compiling() else _NORM_FWD_RAW)(
                x, None, weight, bias, _capi.NORM_LAYER, (normalized_shape,) if type(normalized_shape) is int else normalized_shape,
                eps, weight_offset, _CAST_MODES[cast_mode], 0)[0]
        except _OP_ERRORS as e:
            _op_failed(e, _capi.NORM_LAYER, x, None, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                       "residual")
    _check_tensor("x", x)
    return LayerNormFunction.apply(x, normalized_shape, weight, bias, eps, weight_offset, cast_mode)


def add_rms_norm(x, residual, normalized_shape, weight=None, eps=None, *, weight_offset=0.0, cast_mode="default",
                 residual_rounding="residual"):
    """Fused residual add and RMSNorm: h = x + residual, y = rms_norm(h).

    x, residual: CUDA tensors of one shape [..., *normalized_shape] (dtypes
        may differ); their rows must be 2-D (no tokens x heads views).
    residual_rounding: "residual" (h rounded to residual's dtype is
        normalised, as the unfused `h = x + residual` of model code) or
        "fp32" (the fp32 sum is normalised).
    Other arguments as rms_norm().
    Returns (y, h): y in x's dtype, h in residual's dtype, both new and
    contiguous. Gradients reaching y and h flow to x and residual alike.
    """
    if _NORM_FWD is not None:
        if eps is None and isinstance(x, torch.Tensor) and x.dtype in _EPS:
            eps = _EPS[x.dtype]
        if residual is None:
            raise TypeError("residual must be a torch.Tensor, got None")
        y, h, _, _ = _op_forward(_capi.NORM_RMS, x, residual, normalized_shape, weight, None, eps, weight_offset,
                                 cast_mode, residual_rounding)
        return y, h
    eps = _default_eps(x, eps)
    return AddRMSNormFunction.apply(x, residual, normalized_shape, weight, eps, weight_offset, cast_mode,
                                    residual_rounding)


def add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps=1e-5, *, weight_offset=0.0,
                   cast_mode="default", residual_rounding="residual"):
    """Fused residual add and LayerNorm: h = x + residual, y = layer_norm(h).

    Arguments and results as add_rms_norm() and layer_norm().
    """
    if _NORM_FWD is not None:
        if residual is None:
            raise TypeError("residual must be a torch.Tensor, got None")
        y, h, _, _ = _op_forward(_capi.NORM_LAYER, x, residual, normalized_shape, weight, bias, eps, weight_offset,
                                 cast_mode, residual_rounding)
        return y, h
    _check_tensor("x", x)
    return AddLayerNormFunction.apply(x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                                      residual_rounding)


# ---- FP8 ----------------------------------------------------------------------
#
# One scale convention: scales dequantize, x ~= q * scale (normjit.h,
# enum normjit_quant, for each granularity's formula).

_FP8 = {}
for _name, _code in (("float8_e4m3fn", _capi.E4M3), ("float8_e5m2", _capi.E5M2)):
    if hasattr(torch, _name):
        _FP8[getattr(torch, _name)] = _code
_QUANTS = {"tensor-static": _capi.QUANT_TENSOR_STATIC, "tensor": _capi.QUANT_TENSOR, "token": _capi.QUANT_TOKEN,
           "group": _capi.QUANT_GROUP, "mx32": _capi.QUANT_MX}


class FP8Output(tuple):
    """The outputs of a quantized norm: (q, scale, amax) unpack like a tuple;
    y (the unquantized output, with return_y), q_t (q transposed, with
    transpose), h (x + residual, with a residual), mean and rstd ([M] fp32,
    with return_stats; mean for LayerNorm) are attributes (None when not
    asked for)."""

    def __new__(cls, q, scale, amax, y=None, q_t=None, h=None, mean=None, rstd=None):
        self = super().__new__(cls, (q, scale, amax))
        self.q, self.scale, self.amax, self.y, self.q_t, self.h = q, scale, amax, y, q_t, h
        self.mean, self.rstd = mean, rstd
        return self


def _fp8_dtype(name, dtype):
    if dtype not in _FP8:
        raise TypeError(f"{name} = {dtype} is not an FP8 dtype (torch.float8_e4m3fn or torch.float8_e5m2)")
    return _FP8[dtype]


def _fp8_desc(norm, x, normalized_shape, weight, bias, eps, weight_offset, x_dtype_code):
    """A contiguous 2-D descriptor shared by the FP8 functions: (desc, M, N, w, b)."""
    shape, N = _normalized(x, normalized_shape)
    _check_param("weight", weight, shape, x.device)
    _check_param("bias", bias, shape, x.device)
    eps = _number("eps", eps)
    d = _capi.new_desc()
    d.norm, d.N, d.eps = norm, N, eps
    d.M = x.numel() // N if N else 0
    d.weight_offset = _number("weight_offset", weight_offset)
    w = weight.contiguous() if weight is not None else None
    b = None if bias is None else (bias.to(w.dtype) if w is not None else bias).contiguous()
    pdtype = w.dtype if w is not None else (b.dtype if b is not None else torch.bfloat16)
    d.weight_dtype = _DTYPES[pdtype]
    d.has_weight, d.has_bias = int(w is not None), int(b is not None)
    d.x_dtype = x_dtype_code
    d.store_rstd = 1
    d.store_mean = int(norm == _capi.NORM_LAYER)
    return d, d.M, N, w, b


def _quantize_into(d, quant, fp8_dtype, group_size, scale_ue8m0, scale_col_major, scale, scale_ub, return_y,
                   transpose, M, N, x, out_dtype):
    """Sets the quantized-output fields of d; returns (q, scale, amax, y_hp, q_t)."""
    d.quant = _option("quant", quant, _QUANTS)
    d.y_dtype = _fp8_dtype("fp8_dtype", fp8_dtype)
    d.quant_group = int(group_size)
    d.scale_ue8m0, d.scale_col_major = int(bool(scale_ue8m0)), int(bool(scale_col_major))
    d.scale_ub = 0.0 if scale_ub is None else _number("scale_ub", scale_ub)
    d.store_y_hp, d.store_y_t = int(bool(return_y)), int(bool(transpose))
    d.y_hp_dtype = d.grad_dtype = _DTYPES[out_dtype]
    dev = x.device
    q = torch.empty(x.shape, dtype=fp8_dtype, device=dev)
    G = 32 if quant == "mx32" else d.quant_group
    amax = None
    if quant == "tensor-static":
        if scale is None:
            raise ValueError("quant = 'tensor-static' needs scale (a one-element float32 CUDA tensor)")
        _check_tensor("scale", scale, dev)
        sc = scale.float().reshape(1).contiguous()
    elif quant == "tensor":
        sc = torch.empty(1, dtype=torch.float32, device=dev)
        amax = torch.empty(1, dtype=torch.float32, device=dev)
    elif quant == "token":
        sc = torch.empty(x.shape[:-1] + (1,), dtype=torch.float32, device=dev)
    elif quant == "mx32":
        sc = torch.empty(x.shape[:-1] + (N // 32,), dtype=torch.uint8, device=dev)
    else:
        if N % G:
            raise ValueError(f"group_size = {G} does not divide N = {N}")
        # Column-major scales: a [N / G, M] buffer seen as [M, N / G] (DeepGEMM's layout).
        sc = (torch.empty(N // G, M, dtype=torch.float32, device=dev).t() if scale_col_major
              else torch.empty(x.shape[:-1] + (N // G,), dtype=torch.float32, device=dev))
    y_hp = torch.empty(x.shape, dtype=out_dtype, device=dev) if return_y else None
    q_t = torch.empty(N, M, dtype=fp8_dtype, device=dev) if transpose else None
    return q, sc, amax, y_hp, q_t


def _run_forward(d, x_in, x_scale, r_in, w, b, q, sc, amax, y_hp, q_t, h, mean, rstd, device):
    t = _capi.new_forward_tensors()
    t.x, t.residual, t.weight, t.bias = _ptr(x_in), _ptr(r_in), _ptr(w), _ptr(b)
    t.y, t.residual_out, t.mean, t.rstd = _ptr(q), _ptr(h), _ptr(mean), _ptr(rstd)
    t.x_scale, t.y_scale, t.amax, t.y_hp, t.y_t = _ptr(x_scale), _ptr(sc), _ptr(amax), _ptr(y_hp), _ptr(q_t)
    with torch.cuda.device(device):
        _capi.check(_capi.load().normjit_forward(_engine_handle(), ctypes.byref(d), ctypes.byref(t), _stream(device)))


def _fp8_args(x, quant, fp8_dtype, scale, scale_ub, scale_min, cast_mode, residual_rounding):
    """Checks of the FP8 arguments that cost no device or symbolic work
    (TypeError / ValueError naming them); returns (quant code, scale_ub,
    scale_min, cast code, rounding code). Numbers pass as given (under
    torch.compile with dynamic shapes they may be symbolic); the operator
    checks them, and _fp8_failed names a bad one."""
    q = _option("quant", quant, _QUANTS)
    _fp8_dtype("fp8_dtype", fp8_dtype)
    if quant == "tensor-static" and scale is None:
        raise ValueError("quant = 'tensor-static' needs scale (a one-element float32 CUDA tensor)")
    return (q, 0.0 if scale_ub is None else scale_ub, 0.0 if scale_min is None else scale_min,
            _option("cast_mode", cast_mode, _CAST_MODES),
            _option("residual_rounding", residual_rounding, _RESIDUAL_ROUNDING))


def _norm_fp8(norm, x, normalized_shape, weight, bias, eps, quant, fp8_dtype, group_size, scale_ue8m0,
              scale_col_major, scale, scale_ub, residual, return_y, transpose, weight_offset, cast_mode="default",
              residual_rounding="residual", scale_min=None, return_amax=False, return_stats=False):
    qc, ub, smin, cast, rounding = _fp8_args(x, quant, fp8_dtype, scale, scale_ub, scale_min, cast_mode,
                                             residual_rounding)
    if return_amax and quant != "tensor-static":
        raise ValueError(f"return_amax = True is for quant = 'tensor-static' ('tensor' returns amax anyway), "
                         f"but quant = {quant!r}")
    if _NORM_FWD_FP8 is not None:
        shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
        try:
            q, sc, amax, y, q_t, h, mean, rstd = _NORM_FWD_FP8(
                x, residual, weight, bias, scale, norm, shape, eps, weight_offset, cast, rounding, qc, fp8_dtype,
                int(group_size), bool(scale_ue8m0), bool(scale_col_major), ub, smin, bool(return_y), bool(transpose),
                bool(return_amax), bool(return_stats))
        except _OP_ERRORS as e:
            _fp8_failed(e, norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                        residual_rounding, quant, group_size, scale, scale_ub, scale_min)
        return FP8Output(q, scale if quant == "tensor-static" else sc,
                         amax if quant == "tensor" or return_amax else None, y if return_y else None,
                         q_t if transpose else None, h if residual is not None else None,
                         mean if return_stats and norm == _capi.NORM_LAYER else None,
                         rstd if return_stats else None)
    _check_tensor("x", x)
    x = x.contiguous()
    d, M, N, w, b = _fp8_desc(norm, x, normalized_shape, weight, bias, eps, weight_offset, _DTYPES[x.dtype])
    d.store_rstd = int(bool(return_stats))
    d.store_mean = int(bool(return_stats) and norm == _capi.NORM_LAYER)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if d.store_rstd else None
    mean = torch.empty(M, dtype=torch.float32, device=x.device) if d.store_mean else None
    d.cast_mode = cast
    h = r_in = None
    if residual is not None:
        _check_tensor("residual", residual, x.device)
        if residual.shape != x.shape:
            raise ValueError(f"residual.shape = {list(residual.shape)} must equal x.shape = {list(x.shape)}")
        r_in = residual.contiguous()
        d.residual = d.store_residual_out = 1
        d.residual_dtype = d.residual_out_dtype = _DTYPES[residual.dtype]
        d.residual_rounding = rounding
        h = torch.empty(x.shape, dtype=residual.dtype, device=x.device)
    q, sc, amax, y_hp, q_t = _quantize_into(d, quant, fp8_dtype, group_size, scale_ue8m0, scale_col_major, scale,
                                            scale_ub, return_y, transpose, M, N, x, x.dtype)
    d.scale_min = _number("scale_min", smin)
    if return_amax:
        d.store_amax = 1
        amax = torch.empty(1, dtype=torch.float32, device=x.device)
    if M > 0:
        _run_forward(d, x, None, r_in, w, b, q, sc, amax, y_hp, q_t, h, mean, rstd, x.device)
    return FP8Output(q, sc, amax, y_hp, q_t, h, mean, rstd)


def _fp8_failed(e, norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                residual_rounding, quant, group_size, scale, scale_ub, scale_min):
    """Raises a failed FP8 operator call's error naming the argument
    (TypeError / ValueError), else the engine's NormjitError."""
    _validate_forward(norm, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_mode,
                      residual_rounding)
    _, N = _normalized(x, normalized_shape)
    G = 32 if quant == "mx32" else int(group_size)
    if quant in ("group", "mx32") and N % G:
        raise ValueError(f"group_size = {G} does not divide N = {N}") from None
    if quant == "tensor-static":
        _check_tensor("scale", scale, x.device)
    for name, v in (("scale_ub", scale_ub), ("scale_min", scale_min)):
        if v is not None and _number(name, v) < 0:
            raise ValueError(f"{name} = {v} must be >= 0")
    _raise_engine_error(e)


_FP8_DOC = """
    x: CUDA tensor [..., N] (float32 / float16 / bfloat16), rows contiguous
        (other layouts are copied).
    quant: "tensor-static" (scale given: a [1] float32 tensor), "tensor"
        (current scaling: scale = max(amax / fmax, smin), amax returned),
        "token" (one scale per row, [..., 1]), "group"
        (one per 1 x group_size of a row, [..., N / G], powers of two with
        scale_ue8m0, a column-major [N / G, M] buffer seen as [M, N / G]
        with scale_col_major), "mx32" (MXFP8: 1 x 32 blocks, E8M0
        exponents as uint8 [..., N / 32]).
    fp8_dtype: torch.float8_e4m3fn or torch.float8_e5m2; fmax is its
        largest finite value (448 or 57344).
    scale_ub: "token" and "group": the largest scale (None: none). vLLM's
        scale_ub caps amax instead: its ub is ub / fmax here
        (normjit.conventions.vllm does that).
    scale_min: the least computed scale, smin ("tensor", "token", "group";
        None: 2^-126; vLLM's is 1 / (fmax * 512)).
    residual: h = x + residual is normalised and returned as out.h
        (residual_rounding as add_rms_norm()).
    cast_mode: as rms_norm(); with "llama" the y that gets quantized is
        rounded to x's dtype first (what the unfused Llama forward stores,
        and what vLLM's fused quant norms quantize).
    return_y: also the unquantized y (x's dtype) as out.y; transpose: q
        transposed, [N, M], as out.q_t (tensor scales only).
    return_amax: "tensor-static" only: also amax = max |y| ([1] fp32;
        delayed scaling takes its next scale from it).
    return_stats: also rstd ([M] fp32) and, for LayerNorm, mean, as out.rstd
        and out.mean (what a backward reads).
    Returns FP8Output: (q, scale, amax) with x ~= q * scale (scales
    dequantize); amax is None except for "tensor" and return_amax. Not
    differentiable (an
    inference op). A PyTorch operator (torch.ops.normjit.norm_fwd_fp8)
    where libnormjit_torch.so loads: torch.compile (fullgraph, dynamic
    shapes) and CUDA graphs hold it.
    Raises TypeError / ValueError for a bad argument (naming it and its
    value), normjit.NormjitError when the engine fails.
"""


def rms_norm_fp8(x, normalized_shape, weight=None, eps=1e-6, *, quant="token", fp8_dtype=torch.float8_e4m3fn
                 if hasattr(torch, "float8_e4m3fn") else None, group_size=128, scale_ue8m0=False,
                 scale_col_major=False, scale=None, scale_ub=None, scale_min=None, residual=None, return_y=False,
                 transpose=False, weight_offset=0.0, cast_mode="default", residual_rounding="residual",
                 return_amax=False, return_stats=False):
    return _norm_fp8(_capi.NORM_RMS, x, normalized_shape, weight, None, eps, quant, fp8_dtype, group_size,
                     scale_ue8m0, scale_col_major, scale, scale_ub, residual, return_y, transpose, weight_offset,
                     cast_mode, residual_rounding, scale_min, return_amax, return_stats)


rms_norm_fp8.__doc__ = "RMSNorm (Zhang & Sennrich 2019) with an FP8 output, quantized in the same kernel.\n" + _FP8_DOC


def layer_norm_fp8(x, normalized_shape, weight=None, bias=None, eps=1e-5, *, quant="token",
                   fp8_dtype=torch.float8_e4m3fn if hasattr(torch, "float8_e4m3fn") else None, group_size=128,
                   scale_ue8m0=False, scale_col_major=False, scale=None, scale_ub=None, scale_min=None,
                   residual=None, return_y=False, transpose=False, weight_offset=0.0, cast_mode="default",
                   residual_rounding="residual", return_amax=False, return_stats=False):
    return _norm_fp8(_capi.NORM_LAYER, x, normalized_shape, weight, bias, eps, quant, fp8_dtype, group_size,
                     scale_ue8m0, scale_col_major, scale, scale_ub, residual, return_y, transpose, weight_offset,
                     cast_mode, residual_rounding, scale_min, return_amax, return_stats)


layer_norm_fp8.__doc__ = ("LayerNorm (Ba et al. 2016) with an FP8 output, quantized in the same kernel; bias: None "
                          "or a tensor of shape normalized_shape.\n" + _FP8_DOC)


class FP8InputNormFunction(torch.autograd.Function):
    """Autograd function of a norm that reads an FP8 x with 1 x QB group scales
    (COAT-style FP8 training): x = x_q * x_scale[i, j / QB].

    apply(x_grad_proxy, x_q, x_scale, norm, normalized_shape, weight, bias, eps, out_dtype, quant, fp8_dtype)
    -> y (out_dtype), or (q, scale) / (q, scale, q_t) with quant "tensor" or
    "tensor-static" (q_t is q transposed, for the weight-gradient GEMM).
    x_grad_proxy: a tensor of x's shape and the gradient's dtype that receives
    dL/dx (autograd delivers a gradient in its input's dtype, which an FP8
    x_q cannot hold); it is not read: pass the tensor x_q was quantized from.
    Backward: dx (out_dtype) and dweight / dbias from the engine, reading
    x_q and its scales again.
    """

    @staticmethod
    def forward(ctx, x_grad_proxy, x_q, x_scale, norm, normalized_shape, weight, bias, eps, out_dtype, quant,
                fp8_dtype):
        if x_q.dtype not in _FP8:
            raise TypeError(f"x_q.dtype = {x_q.dtype} is not an FP8 dtype")
        _check_tensor("x_scale", x_scale, x_q.device)
        x_q = x_q.contiguous()
        d, M, N, w, b = _fp8_desc(norm, x_q, normalized_shape, weight, bias, eps, 0.0, _FP8[x_q.dtype])
        if x_scale.numel() == 0 or (M * N) % x_scale.numel():
            raise ValueError(f"x_scale has {x_scale.numel()} elements, not M x N / QB for x_q of {M} x {N}")
        d.x_group = (M * N) // x_scale.numel()
        x_scale = x_scale.float().contiguous()
        d.y_hp_dtype = d.grad_dtype = _DTYPES[out_dtype]
        rstd = torch.empty(M, dtype=torch.float32, device=x_q.device)
        mean = torch.empty(M, dtype=torch.float32, device=x_q.device) if d.store_mean else None
        if quant is None:
            d.y_dtype = _DTYPES[out_dtype]
            q, sc, amax, y_hp, q_t = torch.empty(x_q.shape, dtype=out_dtype, device=x_q.device), None, None, None, None
        else:
            q, sc, amax, y_hp, q_t = _quantize_into(d, quant, fp8_dtype, 128, False, False, None, None, False,
                                                    quant in ("tensor", "tensor-static"), M, N, x_q, out_dtype)
        if M > 0:
            _run_forward(d, x_q, x_scale, None, w, b, q, sc, amax, y_hp, q_t, None, mean, rstd, x_q.device)
        ctx.desc = _capi.copy_desc(d)
        ctx.weight_dtype = weight.dtype if weight is not None else None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.out_dtype = out_dtype
        ctx.save_for_backward(x_q, x_scale, w, b, mean, rstd)
        ctx.set_materialize_grads(False)
        if quant is None:
            return q
        ctx.mark_non_differentiable(q, sc, *([q_t] if q_t is not None else []))
        return (q, sc) if q_t is None else (q, sc, q_t)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, *unused):
        x_q, x_scale, w, b, mean, rstd = ctx.saved_tensors
        d = _capi.copy_desc(ctx.desc)
        d.quant, d.y_dtype, d.store_y_hp, d.store_y_t = _capi.QUANT_NONE, d.grad_dtype, 0, 0
        if dy is None:
            dy = torch.zeros(x_q.shape, dtype=ctx.out_dtype, device=x_q.device)
        dy = dy.to(ctx.out_dtype).contiguous()
        dx = torch.empty(x_q.shape, dtype=ctx.out_dtype, device=x_q.device)
        dweight = torch.empty_like(w) if w is not None else None
        dbias = torch.empty_like(b) if b is not None else None
        _run_backward(d, dy, x_q, x_scale, w, mean, rstd, None, dx, dweight, dbias)
        gw = dweight.to(ctx.weight_dtype) if dweight is not None and ctx.needs_input_grad[5] else None
        gb = dbias.to(ctx.bias_dtype) if dbias is not None and ctx.needs_input_grad[6] else None
        return (dx if ctx.needs_input_grad[0] else None), None, None, None, None, gw, gb, None, None, None, None


def _norm_fp8_input(x_grad_proxy, x_q, x_scale, norm, normalized_shape, weight, bias, eps, out_dtype, quant,
                    fp8_dtype):
    if _NORM_FWD_FP8_INPUT is None:
        return FP8InputNormFunction.apply(x_grad_proxy, x_q, x_scale, norm, normalized_shape, weight, bias, eps,
                                          out_dtype, quant, fp8_dtype)
    if quant not in (None, "tensor"):
        raise ValueError(f"quant = {quant!r} is not offered with an FP8 x: None or 'tensor'")
    if not isinstance(x_q, torch.Tensor) or x_q.dtype not in _FP8:
        raise TypeError(f"x_q must be an FP8 tensor (torch.float8_e4m3fn or torch.float8_e5m2), got "
                        f"{getattr(x_q, 'dtype', type(x_q).__name__)}")
    _fp8_dtype("fp8_dtype", fp8_dtype)
    if out_dtype not in _DTYPES:
        raise TypeError(f"out_dtype = {out_dtype} is not float32, float16 or bfloat16")
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
    try:
        y, sc, q_t, _, _ = _NORM_FWD_FP8_INPUT(x_grad_proxy, x_q, x_scale, weight, bias, norm, shape, eps, out_dtype,
                                               0 if quant is None else _capi.QUANT_TENSOR, fp8_dtype)
    except _OP_ERRORS as e:
        _check_tensor("x_q", x_q)
        _check_tensor("x_scale", x_scale, x_q.device)
        _normalized(x_q, normalized_shape)
        _raise_engine_error(e)
    return y if quant is None else (y, sc, q_t)


def rms_norm_fp8_input(x_grad_proxy, x_q, x_scale, normalized_shape, weight=None, eps=1e-6, *,
                       out_dtype=torch.bfloat16, quant=None, fp8_dtype=None):
    """RMSNorm (Zhang & Sennrich 2019) of an FP8 x with 1 x QB group scales,
    x = x_q * x_scale[i, j / QB] (see FP8InputNormFunction for x_grad_proxy);
    y in out_dtype, or with quant = "tensor" the FP8 (q, scale, q_t).
    Differentiable in x (through x_grad_proxy), weight and bias when y is
    not quantized. A PyTorch operator (norm_fwd_fp8_input, with its
    backward norm_bwd_fp8_input) where libnormjit_torch.so loads."""
    return _norm_fp8_input(x_grad_proxy, x_q, x_scale, _capi.NORM_RMS, normalized_shape, weight, None, eps,
                           out_dtype, quant, fp8_dtype or x_q.dtype)


def layer_norm_fp8_input(x_grad_proxy, x_q, x_scale, normalized_shape, weight=None, bias=None, eps=1e-5, *,
                         out_dtype=torch.bfloat16, quant=None, fp8_dtype=None):
    """LayerNorm (Ba et al. 2016) of an FP8 x with group scales; as rms_norm_fp8_input() plus bias."""
    return _norm_fp8_input(x_grad_proxy, x_q, x_scale, _capi.NORM_LAYER, normalized_shape, weight, bias, eps,
                           out_dtype, quant, fp8_dtype or x_q.dtype)


# ---- modules ----------------------------------------------------------------


def _shape_tuple(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


class RMSNorm(nn.Module):
    """Drop-in for torch.nn.RMSNorm running normjit's kernels (Zhang & Sennrich 2019).

    normalized_shape, eps (None = torch.finfo(x.dtype).eps),
    elementwise_affine, device, dtype: as torch.nn.RMSNorm; the parameter
    "weight" has shape normalized_shape (absent without elementwise_affine),
    so state_dicts load either way. Keyword-only extras: weight_offset (the
    weight is then initialised to 1 - weight_offset, so w' starts at 1) and
    cast_mode, as rms_norm().
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None, *,
                 weight_offset=0.0, cast_mode="default"):
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = float(weight_offset)
        _option("cast_mode", cast_mode, _CAST_MODES)
        self.cast_mode = cast_mode
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)

    def forward(self, x):
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, weight_offset=self.weight_offset,
                        cast_mode=self.cast_mode)

    def extra_repr(self):
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.weight_offset:
            s += f", weight_offset={self.weight_offset}"
        if self.cast_mode != "default":
            s += f", cast_mode={self.cast_mode!r}"
        return s


class LayerNorm(nn.Module):
    """Drop-in for torch.nn.LayerNorm running normjit's kernels (Ba et al. 2016).

    normalized_shape, eps (default 1e-5), elementwise_affine, bias, device,
    dtype: as torch.nn.LayerNorm; parameters "weight" (ones) and "bias"
    (zeros) of shape normalized_shape, absent as in torch. Keyword-only
    extras weight_offset and cast_mode as RMSNorm.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None, *,
                 weight_offset=0.0, cast_mode="default"):
        super().__init__()
        self.normalized_shape = _shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight_offset = float(weight_offset)
        _option("cast_mode", cast_mode, _CAST_MODES)
        self.cast_mode = cast_mode
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        if self.weight is not None:
            nn.init.constant_(self.weight, 1.0 - self.weight_offset)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps,
                          weight_offset=self.weight_offset, cast_mode=self.cast_mode)

    def extra_repr(self):
        s = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        if self.weight_offset:
            s += f", weight_offset={self.weight_offset}"
        if self.cast_mode != "default":
            s += f", cast_mode={self.cast_mode!r}"
        return s


def replace_norms(module):
    """Replaces every torch.nn.RMSNorm and torch.nn.LayerNorm submodule of
    `module` (exact types, not subclasses, which may compute something else)
    by normjit's RMSNorm / LayerNorm, in place. The new modules keep the same
    Parameter objects (so optimizers and tied weights stay valid), eps,
    normalized_shape and training mode. `module` itself is not replaced.
    Returns the number of submodules replaced.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    torch_rms = getattr(nn, "RMSNorm", None)
    count = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if torch_rms is not None and type(child) is torch_rms:
                new = RMSNorm(child.normalized_shape, child.eps, child.elementwise_affine, device="meta")
                new.weight = child.weight
            elif type(child) is nn.LayerNorm:
                new = LayerNorm(child.normalized_shape, child.eps, child.elementwise_affine,
                                bias=child.bias is not None, device="meta")
                new.weight = child.weight
                new.bias = child.bias
            else:
                continue
            new.train(child.training)
            setattr(parent, name, new)
            count += 1
    return count


from .hf import patch  # noqa: E402  (Hugging Face models; needs the functions above)
from .sharded import sharded_layer_norm, sharded_rms_norm  # noqa: E402,F401  (tensor-parallel norms)
