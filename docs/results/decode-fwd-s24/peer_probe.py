"""normjit's decode rows (cubins of normjit compile --dump, launched by
tools/cubin_probe.py) beside Liger in both casting modes and torch.compile,
timed by compare.Runner.kernel_us_many (interleaved repetitions, L2 flushed,
profiler kernel sums, median of 30); outputs checked. Two rounds.
Usage (GPU machine): python3 peer_probe.py CUBIN_DIR"""
import os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch, torch.nn.functional as F
import compare
from cubin_probe import launch, rms_row
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

kdir = sys.argv[1]
R = compare.Runner(["normjit"], False, "/tmp/probe-cache", 30, 5, 10)
cases = [(1, 4096, "v8.t256.r1"), (64, 4096, "v8.t256.r1"), (32, 8192, "v8.t512.r1"), (1, 8192, "v8.t512.r1")]
res, keep = {}, {}
for rnd in range(2):
    for M, N, cfg in cases:
        if (M, N) not in keep:
            x, w, y, rstd, (a, q), fn, threads = rms_row(kdir, M, N, cfg)
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
