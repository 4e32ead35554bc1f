"""normjit's decode forward cubins from four template variants (kA main, kU loads without the row guard,
kB + one barrier, kW + the weight's loads pinned with the row's) against Liger and torch.compile.
compare.py's timing (profiler kernel sums, L2 flushed, median of 30); every output checked."""
import glob, os, sys, statistics
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch, torch.nn.functional as F
import compare
here = os.path.dirname(os.path.abspath(__file__))
from cubin_probe import NormArgs, QuantArgs, load, launch
R = compare.Runner(["normjit", "liger"], False, "/tmp/probe-cache", 30, 5, 10)
from liger_kernel.ops.rms_norm import LigerRMSNormFunction
cases = [(1, 8192, ["v8.t512.r1", "v8.t1024.r1"]), (32, 8192, ["v8.t512.r1", "v8.t1024.r1", "v4.t256.r1.s1"]),
         (1, 4096, ["v8.t256.r1", "v8.t512.r1"]), (64, 4096, ["v8.t256.r1", "v8.t512.r1"]), (1, 2048, ["v8.t128.r1", "v8.t256.r1"])]
V = ["kA", "kU", "kB", "kW"]
rows = {}
for rep in range(2):
  for M, N, cfgs in cases:
    tag = f"rms:bf16:{M}x{N}"; r = rows.setdefault(tag, {})
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(torch.bfloat16)
    y = torch.empty_like(x); rstd = torch.empty(M, device="cuda")
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double())
    def t(label, call): r.setdefault(label, []).append(R.kernel_us(call)[0])
    f = torch.compile(lambda x, w: F.rms_norm(x, (N,), w, 1e-6), dynamic=False); t("compile", lambda: f(xg, wg))
    t("liger", lambda: LigerRMSNormFunction.apply(xg, wg, 1e-6))
    a = NormArgs(); q = QuantArgs()
    a.x, a.w, a.y, a.rstd = x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr()
    a.M, a.heads, a.x_ld, a.x_hs, a.y_ld, a.y_hs = M, 1, N, N, N, N
    a.eps = 1e-6; q.scale_min = 2.0 ** -126
    for cfg in cfgs:
        threads = int(cfg.split(".")[1][1:])
        for v in V:
            fn = load(glob.glob(os.path.join(here, v, f"rms_fwd.x=bf16*N{N}.{cfg}.i32.cubin"))[0])
            y.fill_(float("nan")); launch(fn, M, threads, [a, q]); torch.cuda.synchronize()
            err = ((y.double() - ref).abs() / (ref.abs() + 1e-3)).max().item()
            assert err < 2 ** -7, (tag, cfg, v, err)
            t(f"{cfg} {v}", lambda: launch(fn, M, threads, [a, q]))
for tag, r in rows.items():
    med = {k: statistics.median(v) for k, v in r.items()}
    print(tag, " | ".join(f"{k}={v:.2f}" for k, v in med.items()), flush=True)
