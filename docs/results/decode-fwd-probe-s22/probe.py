"""Decode forward in compare.py's timing (profiler kernel sums, L2 flushed,
spin-kernel markers): the same normjit cubin through the library and through
a bare ctypes cuLaunchKernel; minimal kernels; torch.compile's."""
import ctypes, glob, os, sys, statistics
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch, torch.nn.functional as F
import compare
here = os.path.dirname(os.path.abspath(__file__))
from cubin_probe import LL, P, NormArgs, QuantArgs, launch
from cubin_probe import load as _load
def load(path, name):
    return _load(path, name), None
class Big(ctypes.Structure):
    _fields_ = [("x", P), ("w", P), ("y", P), ("rstd", P), ("M", LL), ("pad", LL * 30), ("eps", ctypes.c_float)]
R = compare.Runner(["normjit"], False, "/tmp/probe-cache", 30, 5, 10)
from normjit.torch import rms_norm as nj_rms, layer_norm as nj_ln
kern = os.path.join(here, "kern.cubin")
res = []
def t(label, call):
    us = R.kernel_us(call)[0]; res.append((label, us)); print(f"{label:60s} {us:6.2f} us", flush=True)

tdt = {"fp32": torch.float32, "bf16": torch.bfloat16}
cases = [("rms", "fp32", 1, 72, "v4.t32.r1"), ("rms", "fp32", 2, 72, "v4.t32.r1"), ("ln", "bf16", 2, 960, "v8.t128.r1"),
         ("rms", "bf16", 3, 5456, "v8.t1024.r1"), ("rms", "bf16", 3, 5456, "v8.t512.r1")]
for rep in range(2):
  for norm, dt, M, N, cfg in cases:
    tag = f"{norm}:{dt}:{M}x{N}"
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, N, device="cuda", dtype=tdt[dt], generator=g)
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(tdt[dt]); b = (0.1 * torch.randn(N, device="cuda", generator=g)).to(tdt[dt])
    y = torch.empty_like(x); rstd = torch.empty(M, device="cuda"); mean = torch.empty(M, device="cuda")
    xg, wg, bg = x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    if norm == "rms":
        t(f"{tag} normjit library (training fwd)", lambda: nj_rms(xg, (N,), wg, 1e-6))
        f = torch.compile(lambda x, w: F.rms_norm(x, (N,), w, 1e-6), dynamic=False)
        t(f"{tag} torch.compile (training fwd)", lambda: f(xg, wg))
    else:
        t(f"{tag} normjit library (training fwd)", lambda: nj_ln(xg, (N,), wg, bg, 1e-5))
        f = torch.compile(lambda x, w, b: F.layer_norm(x, (N,), w, b, 1e-5), dynamic=False)
        t(f"{tag} torch.compile (training fwd)", lambda: f(xg, wg, bg))
    name = glob.glob(os.path.join(here, f"{norm}_fwd.x={dt}*N{N}.{cfg}.*.cubin"))[0]
    fn, _ = load(name, "normjit_norm_fwd")
    a = NormArgs(); q = QuantArgs()
    a.x, a.w, a.b, a.y, a.rstd = x.data_ptr(), w.data_ptr(), b.data_ptr(), y.data_ptr(), rstd.data_ptr()
    if norm == "ln": a.mean = mean.data_ptr()
    a.M, a.heads, a.x_ld, a.x_hs, a.y_ld, a.y_hs = M, 1, N, N, N, N
    a.eps = 1e-6; q.scale_min = 2.0 ** -126
    threads = int(cfg.split(".")[1][1:])
    t(f"{tag} normjit cubin, ctypes cuLaunchKernel {cfg}", lambda: launch(fn, M, threads, [a, q]))
    if N == 72:
        for kn in ("k_small", "k_small_smem"):
            kf, _ = load(kern, kn)
            args = [P(x.data_ptr()), P(w.data_ptr()), P(y.data_ptr()), P(rstd.data_ptr()), ctypes.c_float(1e-6)]
            t(f"{tag} {kn}", lambda: launch(kf, M, 32, args))
        for kn in ("k_big", "k_big_guard"):
            kf, _ = load(kern, kn); bg_ = Big(); bg_.x, bg_.w, bg_.y, bg_.rstd, bg_.M, bg_.eps = x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr(), M, 1e-6
            t(f"{tag} {kn}", lambda: launch(kf, M, 32, [bg_]))
        t(f"{tag} copy_ of x (same bytes read)", lambda: y.copy_(x))
