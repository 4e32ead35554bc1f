"""The same decode config launched two ways, normjit.torch's operator (the
engine) and the dumped cubin (tools/cubin_probe.py), beside Liger (gemma
casting, as compare.py calls it): timed interleaved (kernel_us_many) and one
after another (kernel_us), compare.py's method otherwise. Two rounds.
Usage (GPU machine): python3 path_probe.py CUBIN_DIR"""
import glob, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch
import compare
import normjit.torch as njt
from cubin_probe import launch, load, rms_args
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

kdir = sys.argv[1]
R = compare.Runner(["normjit"], False, "/tmp/probe-cache", 30, 5, 10)
cases = [(32, 8192, "v8.t512.r1"), (64, 4096, "v8.t512.r1")]
res, keep = {}, {}
for rnd in range(2):
    for M, N, cfg in cases:
        if (M, N) not in keep:
            g = torch.Generator(device="cuda").manual_seed(1)
            x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_(True)
            w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(torch.bfloat16).requires_grad_(True)
            y = torch.empty_like(x); rstd = torch.empty(M, device="cuda")
            a, q = rms_args(x, w, y, rstd)
            fn = load(glob.glob(os.path.join(kdir, f"rms_fwd.x=bf16*N{N}.{cfg}.i32.cubin"))[0])
            t = int(cfg.split(".")[1][1:])
            ref = njt.rms_norm(x, (N,), w, 1e-6).detach()
            y.fill_(float("nan")); launch(fn, M, t, [a, q]); torch.cuda.synchronize()
            assert torch.equal(y, ref), "the cubin and the operator disagree"
            calls = {"op": (lambda x=x, w=w, N=N: njt.rms_norm(x, (N,), w, 1e-6), None),
                     "op-nograd": (lambda x=x, w=w, N=N: njt.rms_norm(x.detach(), (N,), w.detach(), 1e-6), None),
                     "cubin": (lambda fn=fn, M=M, t=t, a=a, q=q: launch(fn, M, t, [a, q]), None),
                     "liger": (lambda x=x, w=w: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "gemma", True), None)}
            keep[(M, N)] = (x, w, y, rstd, a, q, calls)
        calls = keep[(M, N)][-1]
        for n, t in R.kernel_us_many(calls).items():
            res.setdefault((M, N, "interleaved", n), []).append(t[0])
        for n, c in calls.items():
            res.setdefault((M, N, "one after another", n), []).append(R.kernel_us(*c)[0])
print(torch.cuda.get_device_name(), "us, rounds 1 / 2")
for M, N, cfg in cases:
    for mode in ("interleaved", "one after another"):
        print(f"rms bf16 {M}x{N} {cfg} {mode}: " + " | ".join(
            f"{n} " + " / ".join(f"{v:.2f}" for v in res[(M, N, mode, n)]) for n in keep[(M, N)][-1]))
