"""Host cost of one norm call from PyTorch: normjit (C++ operators, and the
ctypes fallback) beside eager, Liger-Kernel and Quack.

Wall time per call over back-to-back calls on one stream (warm-up first, then
`--calls` calls between two synchronisations; the median of `--repeats`),
for the forward and for forward + backward. Small shapes make this the host's
time: their kernels take a few microseconds, so the host, not the GPU, sets
the pace. Kernel time is a separate measurement (tools/compare.py).

    python3 tools/bench_host.py [--json out.json] [--markdown out.md]

Peers that do not import are left out with the reason printed.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))

SHAPES = [(1, 4096), (32, 8192), (4096, 256), (1, 2880), (256, 7168)]
EPS = 1e-6


def implementations():
    """name -> (forward(x, w) -> y), or a string saying why it is missing."""
    import torch.nn.functional as F

    impls = {"eager": lambda x, w: F.rms_norm(x, (x.shape[-1],), w, EPS)}
    try:
        import normjit.torch as njt

        if njt._NORM_FWD is not None:
            impls["normjit"] = lambda x, w: njt.rms_norm(x, x.shape[-1], w, EPS)
        else:
            impls["normjit"] = f"operators did not load: {njt._ops.reason()}"
        impls["normjit-ctypes"] = lambda x, w: njt.RMSNormFunction.apply(x, x.shape[-1], w, EPS, 0.0, "default")
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        impls["normjit"] = f"{type(e).__name__}: {e}"
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        impls["liger"] = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS)
    except Exception as e:  # noqa: BLE001
        impls["liger"] = f"{type(e).__name__}: {e}"
    try:
        from quack.rmsnorm import rmsnorm

        impls["quack"] = lambda x, w: rmsnorm(x, w, eps=EPS)
    except Exception as e:  # noqa: BLE001
        impls["quack"] = f"{type(e).__name__}: {e}"
    return impls


def per_call_us(fns, calls, repeats):
    """{name: median us per call}; the implementations take turns in each
    repeat, so drift in the host's speed reaches them alike."""
    for fn in fns.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    impls = implementations()
    for name, f in impls.items():
        if isinstance(f, str):
            print(f"# {name}: left out ({f})")
    live = {k: v for k, v in impls.items() if not isinstance(v, str)}
    rows = []
    for M, N in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        ok = {}
        for name, f in live.items():  # one call each first: a failing peer must not hide the others
            try:
                f(x, w)
                f(xg, wg).backward(dy)
                ok[name] = f
            except Exception as e:  # noqa: BLE001
                rows.append({"impl": name, "M": M, "N": N, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"})
        fwd = per_call_us({k: (lambda f=f: f(x, w)) for k, f in ok.items()}, a.calls, a.repeats)
        both = per_call_us({k: (lambda f=f: f(xg, wg).backward(dy)) for k, f in ok.items()}, a.calls, a.repeats)
        rows += [{"impl": k, "M": M, "N": N, "fwd_us": fwd[k], "fwd_bwd_us": both[k]} for k in ok]
    eager = {(r["M"], r["N"]): r for r in rows if r["impl"] == "eager"}
    lines = [f"Host wall time per call, bf16 RMSNorm, {a.calls} back-to-back calls, median of {a.repeats}; {dev}",
             "", "| shape | impl | forward (us) | x eager | fwd + bwd (us) | x eager |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        e = eager[(r["M"], r["N"])]
        if "error" in r:
            lines.append(f"| {r['M']}x{r['N']} | {r['impl']} | {r['error']} | | | |")
            continue
        lines.append(f"| {r['M']}x{r['N']} | {r['impl']} | {r['fwd_us']:.1f} | {r['fwd_us'] / e['fwd_us']:.2f} | "
                     f"{r['fwd_bwd_us']:.1f} | {r['fwd_bwd_us'] / e['fwd_bwd_us']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if a.markdown:
        a.markdown.write_text(text + "\n")
    if a.json:
        a.json.write_text(json.dumps({"device": dev, "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
