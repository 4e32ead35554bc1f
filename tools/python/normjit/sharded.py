"""Norms over a hidden dimension sharded across ranks (tensor parallelism).

Under tensor parallelism some norms span a dimension that is split across
ranks: each rank holds a column slice of every row (OLMo 2's q/k norms over
the whole projection, say), and a row's mean and rstd need every rank's
columns. Each function here is the unsharded norm of the rows put together
(RMSNorm: Zhang & Sennrich 2019; LayerNorm: Ba et al. 2016), computed as

    normjit stats kernel -> all_reduce (torch.distributed, NCCL) -> normjit normalize kernel

per direction: a row's partial sums (sum x, sum x^2 forward; sum g,
sum g * xhat backward, g = dy * w'), 16 bytes of float64 a row, are the only
data that crosses ranks. The backward returns this rank's slice of dweight
and dbias (each rank owns its slice of the parameters: nothing to reduce).

Shapes: x [..., N] on each rank, its columns of a hidden size of
``hidden_size`` (default N x the group's size: equal slices); weight and
bias [N] (this rank's slice). dtypes float32, float16, bfloat16 (weight may
differ from x); y has x's dtype. The all-reduce runs on ``group`` (default:
the default process group), which must be initialised.
"""

import ctypes
import numbers

import torch
import torch.distributed as dist

from . import _capi, _engine_handle

__all__ = ["ShardedNormFunction", "sharded_layer_norm", "sharded_rms_norm"]

_DTYPES = {torch.float32: _capi.FP32, torch.float16: _capi.FP16, torch.bfloat16: _capi.BF16}


def _check_tensor(name, t, device):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}: normjit takes float32, float16 or bfloat16")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on device '{t.device}' but x is on '{device}'")


def _desc(norm, M, N, hidden_size, x, weight, bias, eps, weight_offset):
    d = _capi.new_sharded_desc()
    d.norm = _capi.NORM_LAYER if norm == "ln" else _capi.NORM_RMS
    d.M, d.N, d.N_total = M, N, hidden_size
    d.x_dtype = d.y_dtype = _DTYPES[x.dtype]
    d.weight_dtype = _DTYPES[(weight if weight is not None else bias if bias is not None else x).dtype]
    d.has_weight, d.has_bias = int(weight is not None), int(bias is not None)
    d.eps, d.weight_offset = eps, weight_offset
    return d


def _stream(device):
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _ptr(t):
    return t.data_ptr() if t is not None else None


def forward_stats(d, x2):
    """The forward's partial sums of this rank's rows x2 ([M, N], contiguous): [M, 2] float64."""
    stats = torch.empty(x2.shape[0], 2, dtype=torch.float64, device=x2.device)
    _capi.check(_capi.load().normjit_sharded_stats(_engine_handle(), ctypes.byref(d), _ptr(x2), _ptr(stats),
                                                    _stream(x2.device)))
    return stats


def forward_apply(d, x2, weight, bias, stats):
    """y, mean (LayerNorm, else None) and rstd from the stats summed over ranks."""
    M = x2.shape[0]
    y = torch.empty_like(x2)
    mean = torch.empty(M, dtype=torch.float32, device=x2.device) if d.norm == _capi.NORM_LAYER else None
    rstd = torch.empty(M, dtype=torch.float32, device=x2.device)
    _capi.check(_capi.load().normjit_sharded_apply(_engine_handle(), ctypes.byref(d), _ptr(x2), _ptr(weight),
                                                    _ptr(bias), _ptr(stats), _ptr(y), _ptr(mean), _ptr(rstd),
                                                    _stream(x2.device)))
    return y, mean, rstd


def backward_stats(d, dy2, x2, weight, mean, rstd):
    stats = torch.empty(x2.shape[0], 2, dtype=torch.float64, device=x2.device)
    _capi.check(_capi.load().normjit_sharded_backward_stats(_engine_handle(), ctypes.byref(d), _ptr(dy2), _ptr(x2),
                                                             _ptr(weight), _ptr(mean), _ptr(rstd), _ptr(stats),
                                                             _stream(x2.device)))
    return stats


def backward_apply(d, dy2, x2, weight, bias, mean, rstd, stats):
    """dx, and this rank's dweight / dbias (None where there is none)."""
    lib, handle = _capi.load(), _engine_handle()
    nbytes = ctypes.c_size_t(0)
    _capi.check(lib.normjit_sharded_backward_workspace_size(handle, ctypes.byref(d), ctypes.byref(nbytes)))
    ws = torch.empty(nbytes.value, dtype=torch.uint8, device=x2.device) if nbytes.value else None
    dx = torch.empty_like(x2)
    dweight = torch.empty_like(weight) if weight is not None else None
    dbias = torch.empty_like(bias) if bias is not None else None
    _capi.check(lib.normjit_sharded_backward_apply(handle, ctypes.byref(d), _ptr(dy2), _ptr(x2), _ptr(weight),
                                                    _ptr(mean), _ptr(rstd), _ptr(stats), _ptr(dx), _ptr(dweight),
                                                    _ptr(dbias), _ptr(ws), nbytes.value, _stream(x2.device)))
    return dx, dweight, dbias


class ShardedNormFunction(torch.autograd.Function):
    """Autograd function of sharded_rms_norm / sharded_layer_norm (see the module)."""

    @staticmethod
    def forward(ctx, x, weight, bias, norm, hidden_size, eps, weight_offset, group):
        N = x.shape[-1]
        x2 = x.reshape(-1, N).contiguous()
        d = _desc(norm, x2.shape[0], N, hidden_size, x, weight, bias, eps, weight_offset)
        w = weight.contiguous() if weight is not None else None
        b = bias.contiguous() if bias is not None else None
        with torch.cuda.device(x.device):
            stats = forward_stats(d, x2)
            dist.all_reduce(stats, group=group)  # the current stream waits for it
            y, mean, rstd = forward_apply(d, x2, w, b, stats)
        ctx.desc, ctx.group, ctx.shape = _capi.ShardedDesc.from_buffer_copy(d), group, x.shape
        ctx.save_for_backward(x2, w, b, mean, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, w, b, mean, rstd = ctx.saved_tensors
        d = ctx.desc
        dy2 = dy.reshape(-1, x2.shape[1]).contiguous()
        with torch.cuda.device(x2.device):
            stats = backward_stats(d, dy2, x2, w, mean, rstd)
            dist.all_reduce(stats, group=ctx.group)
            dx, dweight, dbias = backward_apply(d, dy2, x2, w, b, mean, rstd, stats)
        return (dx.view(ctx.shape), dweight if ctx.needs_input_grad[1] else None,
                dbias if ctx.needs_input_grad[2] else None, None, None, None, None, None)


def _sharded(norm, x, weight, bias, eps, hidden_size, group, weight_offset):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                           "(backend 'nccl') first; the row statistics are all-reduced over the group")
    _check_tensor("x", x, None)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x has shape {tuple(x.shape)}: its last dimension (this rank's columns) must be >= 1")
    N = x.shape[-1]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            _check_tensor(name, p, x.device)
            if tuple(p.shape) != (N,):
                raise ValueError(f"{name} has shape {tuple(p.shape)}: expected ({N},), this rank's slice")
    if not isinstance(eps, numbers.Real) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"eps = {eps} must be a finite number >= 0")
    if hidden_size is None:
        hidden_size = N * dist.get_world_size(group)
    if not isinstance(hidden_size, numbers.Integral) or hidden_size < N:
        raise ValueError(f"hidden_size = {hidden_size} must be an integer >= N = {N} (every rank's columns summed)")
    if not x.is_cuda:
        raise ValueError(f"x is on device '{x.device}': normjit runs on CUDA tensors only")
    return ShardedNormFunction.apply(x, weight, bias, norm, int(hidden_size), float(eps), float(weight_offset),
                                     group)


def sharded_rms_norm(x, weight=None, eps=1e-6, *, hidden_size=None, group=None, weight_offset=0.0):
    """RMSNorm over a hidden dimension sharded across the ranks of ``group``.

    Args:
        x: [..., N] CUDA tensor (float32/float16/bfloat16): this rank's N columns of each row.
        weight: [N] this rank's slice of the weight (gamma), or None.
        eps: added to the mean of x^2 over every rank's columns (>= 0).
        hidden_size: the whole hidden size (default N x the group's size).
        group: the process group the ranks share (default: the default group).
        weight_offset: w' = weight + weight_offset (Gemma's 1 + w).
    Returns:
        y [..., N], x's dtype: this rank's columns of the unsharded RMSNorm
        (Zhang & Sennrich 2019). Differentiable in x and weight.
    Raises:
        RuntimeError when torch.distributed is not initialised; ValueError /
        TypeError naming a bad argument and its value; normjit.NormjitError
        from the engine.
    """
    return _sharded("rms", x, weight, None, eps, hidden_size, group, weight_offset)


def sharded_layer_norm(x, weight=None, bias=None, eps=1e-5, *, hidden_size=None, group=None, weight_offset=0.0):
    """LayerNorm over a hidden dimension sharded across the ranks of ``group``.

    As sharded_rms_norm, with the mean subtracted and an optional bias (beta,
    this rank's [N] slice): the unsharded LayerNorm (Ba et al. 2016) of the
    rows put together. Differentiable in x, weight and bias.
    """
    return _sharded("ln", x, weight, bias, eps, hidden_size, group, weight_offset)
