"""Does the time between the L2 flush and a timed kernel change a decode row's
kernel time?  compare.py zeroes a 2x-L2 buffer (dirty lines), sleeps 1000
cycles, then the call: a call whose host side is slower than the flush starts
after an idle gap, a fast one right behind the flush.  Here every kernel is
timed with gaps of 1e3, 1e5 and 1e6 sleep cycles after the flush, and after a
flush that only reads (clean lines).  normjit's cubins (normjit compile --dump,
launched by tools/cubin_probe.py), Liger and torch.compile; outputs checked.
Usage (GPU machine): python3 gap_probe.py CUBIN_DIR"""
import os, statistics, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch, torch.nn.functional as F
import compare
from cubin_probe import launch, rms_row
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

kdir = sys.argv[1]
R = compare.Runner(["normjit"], False, "/tmp/probe-cache", 30, 5, 10)
modes = [("zero", 1000), ("zero", 100_000), ("zero", 1_000_000), ("read", 1000)]


def kernel_us(call, mode, gap):
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(30):
            if mode == "zero":
                R.flush_buf.zero_()
            else:
                R.flush_buf.view(torch.int64).max()
            torch.cuda._sleep(gap)
            out = call()
            torch.cuda._sleep(1000)
            del out
    ev, flagged = compare.device_activities(prof.events())
    # the first marker of a pair is the gap sleep: keep the pairs (gap, 1000)
    calls = compare.split_calls(ev, drop_enclosing=not flagged)
    return statistics.median(c[0] for c in calls)


cases = [(1, 4096, "v8.t256.r1"), (64, 4096, "v8.t256.r1"), (32, 8192, "v8.t512.r1"), (1, 8192, "v8.t512.r1")]
res, compiled = {}, {}
for rep in range(2):
    for M, N, cfg in cases:
        x, w, y, rstd, (a, q), fn, threads = rms_row(kdir, M, N, cfg)
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        f = compiled.setdefault((M, N), torch.compile(lambda x, w: F.rms_norm(x, (N,), w, 1e-6), dynamic=False))
        impls = {"normjit " + cfg: lambda: launch(fn, M, threads, [a, q]),
                 "liger": lambda: LigerRMSNormFunction.apply(xg, wg, 1e-6),
                 "compile": lambda: f(xg, wg)}
        for name, call in impls.items():
            for mode, gap in modes:
                res.setdefault((f"rms bf16 {M}x{N}", name, mode, gap), []).append(kernel_us(call, mode, gap))
print(torch.cuda.get_device_name())
print("| shape | impl | " + " | ".join(f"{m} gap {g}" for m, g in modes) + " |")
print("|---|---|" + "---:|" * len(modes))
for M, N, cfg in cases:
    for name in ["normjit " + cfg, "liger", "compile"]:
        vals = [statistics.median(res[(f"rms bf16 {M}x{N}", name, m, g)]) for m, g in modes]
        print(f"| rms bf16 {M}x{N} | {name} | " + " | ".join(f"{v:.2f}" for v in vals) + " |")
