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
