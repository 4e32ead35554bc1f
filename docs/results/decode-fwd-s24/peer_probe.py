"""normjit's decode rows (cubins of normjit compile --dump, launched by
tools/cubin_probe.py) beside Liger in both casting modes and torch.compile,
timed by compare.Runner.kernel_us_many (interleaved repetitions, L2 flushed,
profiler kernel sums, median of 30); outputs checked. Two rounds.
Usage (GPU machine): python3 peer_probe.py CUBIN_DIR"""
import glob, os, statistics, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch, torch.nn.functional as F
import compare
from cubin_probe import NormArgs, QuantArgs, load, launch
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

kdir = sys.argv[1]
R = compare.Runner(["normjit"], False, "/tmp/probe-cache", 30, 5, 10)
cases = [(1, 4096, "v8.t256.r1"), (64, 4096, "v8.t256.r1"), (32, 8192, "v8.t512.r1"), (1, 8192, "v8.t512.r1")]
res, keep = {}, {}
for rnd in range(2):
    for M, N, cfg in cases:
        if (M, N) not in keep:
            g = torch.Generator(device="cuda").manual_seed(1)
            x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
            w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(torch.bfloat16)
            y = torch.empty_like(x); rstd = torch.empty(M, device="cuda")
            ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
            a, q = NormArgs(), QuantArgs()
            a.x, a.w, a.y, a.rstd = x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr()
            a.M, a.heads, a.x_ld, a.x_hs, a.y_ld, a.y_hs, a.eps = M, 1, N, N, N, N, 1e-6
            q.scale_min = 2.0 ** -126
            fn = load(glob.glob(os.path.join(kdir, f"rms_fwd.x=bf16*N{N}.{cfg}.i32.cubin"))[0])
            threads = int(cfg.split(".")[1][1:])
            y.fill_(float("nan")); launch(fn, M, threads, [a, q]); torch.cuda.synchronize()
            assert ((y.double() - ref).abs() / (ref.abs() + 1e-3)).max().item() < 2 ** -7
            xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
            f = torch.compile(lambda x, w, N=N: F.rms_norm(x, (N,), w, 1e-6), dynamic=False)
            calls = {"normjit " + cfg: (lambda fn=fn, M=M, t=threads, a=a, q=q: launch(fn, M, t, [a, q]), None),
                     "liger llama": (lambda xg=xg, wg=wg: LigerRMSNormFunction.apply(xg, wg, 1e-6), None),
                     "liger gemma": (lambda xg=xg, wg=wg: LigerRMSNormFunction.apply(xg, wg, 1e-6, 0.0, "gemma", True), None),
                     "compile": (lambda f=f, xg=xg, wg=wg: f(xg, wg), None)}
            keep[(M, N)] = (x, w, y, rstd, a, q, xg, wg, calls)
        for name, t in R.kernel_us_many(keep[(M, N)][-1]).items():
            res.setdefault((M, N, name), []).append(t[0])
print(torch.cuda.get_device_name(), "us, rounds 1 / 2")
for M, N, cfg in cases:
    print(f"rms bf16 {M}x{N}: " + " | ".join(f"{n.split(' ', 1)[0] if n.startswith('normjit') else n} "
          + " / ".join(f"{v:.2f}" for v in res[(M, N, n)]) for n in keep[(M, N)][-1]))
