"""Launch a normjit kernel dumped by `normjit compile --dump` (or any cubin)
on torch's current stream through the CUDA Driver API, outside the library:
for probes that time the same machine code the engine launches
(docs/results/decode-fwd-probe-s22, decode-fwd-s23). NormArgs and QuantArgs
mirror kernels_src/norm_args.cuh and quant_args.cuh field for field."""
import ctypes

import torch

P = ctypes.c_void_p
LL = ctypes.c_longlong
_cu = ctypes.CDLL("libcuda.so.1")


class NormArgs(ctypes.Structure):
    _fields_ = [(n, P) for n in "x residual w b y residual_out mean rstd dy dresidual dx partial dw db".split()] + \
               [(n, LL) for n in "M heads x_ld x_hs y_ld y_hs dy_ld dy_hs dx_ld dx_hs res_ld res_out_ld dres_ld".split()] + \
               [("eps", ctypes.c_float), ("x_scale", P)]


class QuantArgs(ctypes.Structure):
    _fields_ = [("scale", P), ("amax", P), ("y_hp", P), ("y_t", P), ("scale_ld", LL), ("scale_ub", ctypes.c_float),
                ("scale_min", ctypes.c_float), ("phase", ctypes.c_int)]


def _check(r: int, what: str) -> None:
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def load(path: str, name: str = "normjit_norm_fwd") -> P:
    """The function `name` of the cubin at `path`, in torch's (primary) context."""
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context exists
    mod, fn = P(), P()
    data = open(path, "rb").read()
    _check(_cu.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), "cuModuleLoadData " + path)
    _check(_cu.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction " + name)
    return fn


def launch(fn: P, grid: int, block: int, params: list) -> None:
    """One launch of `grid` x 1 x 1 CTAs of `block` threads; params are ctypes values (structs by value)."""
    arr = (P * len(params))(*[ctypes.cast(ctypes.pointer(p), P) for p in params])
    stream = P(torch.cuda.current_stream().cuda_stream)
    _check(_cu.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, arr, None), "cuLaunchKernel")


def rms_args(x, w, y, rstd, eps: float = 1e-6) -> list:
    """[NormArgs, QuantArgs] of an unquantized RMSNorm forward over contiguous
    rows: x, y [M, N], w [N], rstd [M] fp32 (torch tensors on the GPU)."""
    M, N = x.shape
    a, q = NormArgs(), QuantArgs()
    a.x, a.w, a.y, a.rstd = x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr()
    a.M, a.heads, a.x_ld, a.x_hs, a.y_ld, a.y_hs, a.eps = M, 1, N, N, N, N, eps
    q.scale_min = 2.0 ** -126  # the engine's default (read only by quantized rows)
    return [a, q]


def rms_row(kdir: str, M: int, N: int, cfg: str, seed: int = 1):
    """A random rms bf16 [M, N] row set and the cubin of `cfg` from `kdir`
    (normjit compile --dump), launched once and checked against float64:
    (x, w, y, rstd, args, fn, threads)."""
    import glob
    import os

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(torch.bfloat16)
    y = torch.empty_like(x)
    rstd = torch.empty(M, device="cuda")
    args = rms_args(x, w, y, rstd)
    fn = load(glob.glob(os.path.join(kdir, f"rms_fwd.x=bf16*N{N}.{cfg}.i32.cubin"))[0])
    threads = int(cfg.split(".")[1][1:])
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    y.fill_(float("nan"))
    launch(fn, M, threads, args)
    torch.cuda.synchronize()
    assert ((y.double() - ref).abs() / (ref.abs() + 1e-3)).max().item() < 2 ** -7, (M, N, cfg)
    return x, w, y, rstd, args, fn, threads
