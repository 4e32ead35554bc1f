#!/usr/bin/env python3
"""Kernel time of normjit's FP8-output norms against the unfused reference
composition (norm, then quantize) in PyTorch eager and under torch.compile.

Timing is compare.py's: the summed GPU time of what one call launches, read
with torch.profiler between marker kernels, L2 flushed before each call,
median of --reps; SOL% = the time of a device copy of the same bytes (timed
the same way in the same run) / the kernel time. Bytes count FP8 where FP8
travels: x and weight (and residual in, h out) in their dtypes, q at one byte
an element, the scales. Per-tensor current scaling reads x twice (its amax
launch, then the quantizing one) where one launch cannot hold the rows on
chip: SOL% counts x once, and "SOL% x twice" counts that second read as the
compulsory bytes it is past what the chip holds. With a fused residual add
(res+) both sides write h = x + residual, the residual stream's next value.
A "check" column gives the fraction of q codes that differ from the eager
composition's (the composition rounds y to bf16 first, so a few differ).

    python3 tools/bench_fp8.py --json fp8.json --markdown fp8.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402

SHAPES = [(8192, 4096), (16384, 7168), (32768, 5120), (4096, 16384), (1, 4096), (32, 7168)]
VARIANTS = ["tensor-static", "tensor", "token", "group128", "mx32", "res+token", "group64", "group128-col-ue8m0",
            "static+amax", "tensor+t", "static+amax+t", "token+y", "res+group128"]
MIN_SCALE = 2.0 ** -126


def reference(torch, F, variant, fp8, fmax):
    """The unfused composition: RMSNorm in bf16 (as a model computes it), then quantize."""

    def quant(y, scale):
        return (y.float() / scale).clamp(-fmax, fmax).to(fp8)

    def f(x, w, r, static_scale):
        if variant.startswith("res+"):
            # The fused residual add's h is an output (the residual stream
            # goes on with it), as normjit's is.
            h = x + r
            return g(h, w, static_scale) + (h,)
        return g(x, w, static_scale)

    def g(x, w, static_scale):
        y = F.rms_norm(x, (x.shape[-1],), w, 1e-6)
        v = variant[4:] if variant.startswith("res+") else variant
        if v == "tensor-static":
            return quant(y, static_scale), static_scale
        if v.startswith("static+amax"):  # TransformerEngine's delayed scaling (+t: with q transposed)
            q = quant(y, static_scale)
            return (q, y.abs().amax().float()) + ((q.t().contiguous(),) if v.endswith("+t") else ())
        if v.startswith("tensor"):
            amax = y.abs().amax().float()
            scale = (amax / fmax).clamp(min=MIN_SCALE)
            q = quant(y, scale)
            return (q, scale, amax) + ((q.t().contiguous(),) if v == "tensor+t" else ())
        if v.startswith("token"):
            scale = (y.abs().amax(-1, keepdim=True).float() / fmax).clamp(min=MIN_SCALE)
            return (quant(y, scale), scale) + ((y,) if v == "token+y" else ())
        if v.endswith("-col-ue8m0"):  # DeepGEMM's scales: powers of two, [N / G, M]
            G = int(v[len("group"):-len("-col-ue8m0")])
            yg = y.view(y.shape[0], -1, G)
            scale = torch.exp2(torch.ceil(torch.log2((yg.abs().amax(-1, keepdim=True).float() / fmax)
                                                      .clamp(min=MIN_SCALE))))
            return (yg.float() / scale).clamp(-fmax, fmax).to(fp8).view(y.shape), scale.squeeze(-1).t().contiguous()
        G = 32 if v == "mx32" else int(v[len("group"):])
        yg = y.view(y.shape[0], -1, G)
        amax = yg.abs().amax(-1, keepdim=True).float()
        if variant == "mx32":
            e = torch.floor(torch.log2(amax.clamp(min=MIN_SCALE))).clamp(-127 + 8, 127 + 8) - 8
            scale = torch.exp2(e)
            q = (yg.float() / scale).clamp(-fmax, fmax).to(fp8).view(y.shape)
            return q, (e + 127).to(torch.uint8).squeeze(-1)
        scale = (amax / fmax).clamp(min=MIN_SCALE)
        return (yg.float() / scale).clamp(-fmax, fmax).to(fp8).view(y.shape), scale.squeeze(-1)

    return f


def group_of(v):
    return int(v[len("group"):].split("-")[0])


def traffic(variant, M, N):
    b = 2 * M * N + 2 * N + M * N  # x (bf16), weight, q (1 byte)
    v = variant
    if v.startswith("res+"):
        b += 2 * 2 * M * N  # residual in, h out
        v = v[4:]
    if v.startswith("token"):
        b += 4 * M + (2 * M * N if v == "token+y" else 0)  # y_hp in bf16
    elif v.startswith("group"):
        b += 4 * M * N // group_of(v)
    elif v == "mx32":
        b += M * N // 32
    if v.endswith("+t"):
        b += M * N  # q transposed
    return b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES))
    args = ap.parse_args(argv)
    run = compare.Runner(["normjit"], False, None, args.reps, args.warmup, 100)
    if "normjit" in run.unavailable:
        print("normjit unavailable:", run.unavailable["normjit"], file=sys.stderr)
        return 3
    torch, F = run.torch, run.F
    import normjit.torch as njt

    fp8 = torch.float8_e4m3fn
    fmax = 448.0
    gpu = torch.cuda.get_device_name()
    rows = []
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(M * 131 + N)
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
        r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=g)
        w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(torch.bfloat16)
        static = torch.tensor([0.01], device="cuda")
        for variant in args.variants.split(","):
            res = variant.startswith("res+")
            v = variant[4:] if res else variant
            if (v.startswith("group") and N % group_of(v)) or (v == "mx32" and N % 32):
                print(f"{M}x{N} {variant}: skipped, the group does not divide N")
                continue
            quant = ("group" if v.startswith("group") else "tensor-static" if v.startswith("static+amax")
                     else v.split("+")[0])
            kw = dict(quant=quant, fp8_dtype=fp8, group_size=group_of(v) if v.startswith("group") else 128,
                      scale=static if quant == "tensor-static" else None, residual=r if res else None,
                      scale_col_major=v.endswith("-col-ue8m0"), scale_ue8m0=v.endswith("-col-ue8m0"),
                      return_amax=v.startswith("static+amax"), transpose=v.endswith("+t"), return_y=v == "token+y")

            def nj():
                return njt.rms_norm_fp8(x, (N,), w, 1e-6, **kw)

            ref = reference(torch, F, variant, fp8, fmax)
            torch._dynamo.reset()
            comp = torch.compile(ref, dynamic=False)
            out_nj, out_ref = nj(), ref(x, w, r, static)
            differ = (out_nj[0].view(torch.uint8) != out_ref[0].view(torch.uint8)).float().mean().item()
            comp(x, w, r, static)
            nbytes = traffic(variant, M, N)
            calls = {"normjit": (nj, None), "eager": (lambda: ref(x, w, r, static), None),
                     "compile": (lambda: comp(x, w, r, static), None), "copy": (run.copy_call(nbytes), None)}
            if v.startswith("tensor+") or v == "tensor":  # current scaling: the copy with x counted twice
                calls["copy2"] = (run.copy_call(nbytes + 2 * M * N), None)
            t = {k: us[0] for k, us in run.kernel_us_many(calls).items()}  # interleaved, as compare.py times
            copy, copy2, t_nj, t_eager, t_comp = t["copy"], t.get("copy2"), t["normjit"], t["eager"], t["compile"]
            del calls
            row = dict(gpu=gpu, shape=f"{M}x{N}", variant=variant, bytes=nbytes, copy_us=copy, normjit_us=t_nj,
                       gbps=nbytes / t_nj / 1e3, sol=copy / t_nj, sol_x_twice=copy2 / t_nj if copy2 else None,
                       eager_us=t_eager, compile_us=t_comp,
                       vs_compile=t_comp / t_nj, vs_eager=t_eager / t_nj, code_differ=differ)
            rows.append(row)
            print(f"{gpu} {M}x{N} {variant:14s} normjit {t_nj:8.2f} us {row['gbps']:7.0f} GB/s "
                  f"SOL {100 * row['sol']:5.1f}%{'' if copy2 is None else f' (x twice {100 * copy2 / t_nj:.1f}%)'}  compile {t_comp:8.2f} us ({row['vs_compile']:.2f}x)  "
                  f"eager {t_eager:8.2f} us ({row['vs_eager']:.2f}x)  q differ {differ:.4f}", flush=True)
    if args.json:
        compare.write_json(args.json, {"rows": rows})
    if args.markdown:
        lines = [f"FP8-output RMSNorm (x bf16, q e4m3), kernel time on {gpu}; median of {args.reps}.", "",
                 "| shape | variant | normjit us | GB/s | SOL% | SOL% x twice | torch.compile us | ratio | eager us | ratio |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for r_ in rows:
            twice = "" if r_["sol_x_twice"] is None else f"{100 * r_['sol_x_twice']:.1f}"
            lines.append(f"| {r_['shape']} | {r_['variant']} | {r_['normjit_us']:.2f} | {r_['gbps']:.0f} | "
                         f"{100 * r_['sol']:.1f} | {twice} | {r_['compile_us']:.2f} | {r_['vs_compile']:.2f}x | "
                         f"{r_['eager_us']:.2f} | {r_['vs_eager']:.2f}x |")
        args.markdown.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
