#!/usr/bin/env python3
"""Held-out check of the untuned configs (neighbour or heuristic) against tuning.

Draws random (N, M, dtype, norm, op, variant) shapes that no shipped cache
holds, and for each runs `normjit tune --vs-untuned` in a fresh cache
directory: it resolves the config the shape gets untuned (from the shipped
caches only), tunes the shape over the whole candidate grid, then times both
configs in alternating rounds (L2 flushed, medians). Reports untuned / tuned
time per shape.

  python3 tools/heldout.py draw --seed 1            # the shapes, no GPU needed
  python3 tools/heldout.py run --seed 1 --normjit build/normjit --out heldout.json
  python3 tools/heldout.py report heldout.json [more.json ...]   # markdown

The draw: N log-uniform in [64, 262144], a multiple of 8 for 3 draws in 4
(hidden sizes are) and any integer otherwise, never an N of the grid; M
log-uniform in [1, 65536] with M * N <= the grid's max_elements; dtype,
RMSNorm / LayerNorm, forward / backward uniform; forwards fuse the residual
add half the time.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRID = os.path.join(ROOT, "autotune_cache", "grid", "grid.json")


def grid_ns(grid):
    """The N values the grid tunes (the same expansion as tools/grid.cpp)."""
    lg = grid["N_log"]
    lo, hi, count, mult = lg["min"], lg["max"], lg["count"], lg["multiple"]
    ns = {max(mult, round(lo * (hi / lo) ** (i / (count - 1)) / mult) * mult) for i in range(count)}
    if "N_odd" in grid:
        od = grid["N_odd"]
        for i in range(od["count"]):
            v = round(od["min"] * (od["max"] / od["min"]) ** (i / (od["count"] - 1)))
            ns.add(v if v % 2 else (v + 1 if v + 1 <= 262144 else v - 1))
    for sizes in grid["N_models"].values():
        ns.update(sizes)
    return ns


def draw(seed, count, grid_path=GRID):
    grid = json.load(open(grid_path))
    taken = grid_ns(grid)
    max_el = grid["max_elements"]
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        n = round(math.exp(rng.uniform(math.log(64), math.log(262144))))
        if rng.random() < 0.75:
            n = max(64, n - n % 8)
        if n in taken:
            continue
        m_max = min(65536, max_el // n)
        m = round(math.exp(rng.uniform(0, math.log(m_max))))
        dtype = rng.choice(["fp32", "fp16", "bf16"])
        norm = rng.choice(["rms", "ln"])
        op = rng.choice(["fwd", "bwd"])
        res = op == "fwd" and rng.random() < 0.5
        shapes.append({"op": op, "shape": f"{norm}:{dtype}:{m}x{n}{':res' if res else ''}"})
    return shapes


def run(args):
    shapes = draw(args.seed, args.count)
    rows = []
    gpu = None
    for i, s in enumerate(shapes):
        with tempfile.TemporaryDirectory() as cache, tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [args.normjit, "--cache-dir", cache, "tune", "--op", s["op"], "--shape", s["shape"], "--vs-untuned",
                   "--json", out.name]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"[{i + 1}/{len(shapes)}] {s['op']} {s['shape']}: FAILED\n{p.stdout[-2000:]}{p.stderr[-2000:]}",
                      file=sys.stderr)
                rows.append({**s, "error": (p.stderr or p.stdout)[-500:]})
                continue
            j = json.load(open(out.name))
            gpu = j["gpu"]
            r = j["rows"][0]
            r["draw"] = s
            rows.append(r)
            print(f"[{i + 1}/{len(shapes)}] {r['op']} {s['shape']}: untuned {r['untuned_source']} {r['untuned']} "
                  f"{r['untuned_us']:.2f} us, tuned {r['tuned']} {r['tuned_us']:.2f} us -> {r['ratio']:.3f}",
                  flush=True)
    json.dump({"gpu": gpu, "seed": args.seed, "rows": rows}, open(args.out, "w"), indent=1)
    print(summary([{"gpu": gpu, "rows": rows}]))


def summary(docs):
    out = []
    for d in docs:
        ratios = [r["ratio"] for r in d["rows"] if "ratio" in r]
        failed = sum(1 for r in d["rows"] if "ratio" not in r)
        if ratios:
            out.append(f"{d['gpu']}: {len(ratios)} shapes, untuned/tuned median {statistics.median(ratios):.3f}, "
                       f"max {max(ratios):.3f}, <= 1.05: {sum(r <= 1.05 for r in ratios)}/{len(ratios)}"
                       + (f", {failed} failed" if failed else ""))
    return "\n".join(out)


def report(paths):
    docs = [json.load(open(p)) for p in paths]
    lines = [summary(docs), ""]
    for d in docs:
        lines += [f"### {d['gpu']} (seed {d.get('seed')})", "",
                  "| op | shape | untuned config (source) | untuned us | tuned config | tuned us | untuned/tuned |",
                  "|---|---|---|---|---|---|---|"]
        for r in d["rows"]:
            if "ratio" not in r:
                lines.append(f"| {r['op']} | {r['shape']} | failed | | | | |")
                continue
            lines.append(f"| {r['op']} | {r['draw']['shape']} | {r['untuned']} ({r['untuned_source']}) | "
                         f"{r['untuned_us']:.2f} | {r['tuned']} | {r['tuned_us']:.2f} | {r['ratio']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("draw", "run"):
        p = sub.add_parser(name)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--count", type=int, default=40)
        if name == "run":
            p.add_argument("--normjit", default=os.path.join(ROOT, "build", "normjit"))
            p.add_argument("--out", default="heldout.json")
    p = sub.add_parser("report")
    p.add_argument("json", nargs="+")
    a = ap.parse_args()
    if a.cmd == "draw":
        for s in draw(a.seed, a.count):
            print(s["op"], s["shape"])
    elif a.cmd == "run":
        run(a)
    else:
        print(report(a.json))


if __name__ == "__main__":
    main()
