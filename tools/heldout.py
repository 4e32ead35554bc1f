#!/usr/bin/env python3
"""Held-out check of the config model (the untuned config) against tuning.

Draws random (N, M, dtype, norm, op, variant) shapes that no shipped cache
holds, and for each runs `normjit tune --vs-untuned` in a fresh cache
directory: it resolves the config the shape gets untuned (the config
model's), tunes the shape over the whole candidate grid, then times that
config against the fastest candidate in alternating rounds (L2 flushed,
medians). Reports untuned / fastest time per shape; the rows keep every
candidate's time, the config model's training data (autotune_cache/model/).

  python3 tools/heldout.py draw --seed 1            # the shapes, no GPU needed
  python3 tools/heldout.py run --seed 1 --normjit build/normjit --out heldout.json
  python3 tools/heldout.py run --shapes fwd/ln:fp16:162x113662,... --out rows.json   # given shapes
  python3 tools/heldout.py report heldout.json [more.json ...]   # markdown
  python3 tools/heldout.py score heldout.json --device SLUG [--caches all|others|none]   # no GPU needed

`score` asks `normjit explain --device SLUG` (no GPU) which config each
held-out shape resolves to now, and reads its time from the row's candidate
table (every candidate's tuned time on that GPU, kept by `run`): a new rule,
or a GPU without a shipped cache of its own (`--caches others`: the device's
own entries are left out, the other devices' stay), or the model alone
(`--caches none`), is scored without the device. Candidate-table ratios are over the fastest tuned candidate, so they
read a little higher than the re-timed ratios of `run`.

The draw: see draw() (issue 19's: a quarter of the shapes decode rows, M
up to 2^20 otherwise).
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


def draw(seed, count, grid_path=GRID, ops=("fwd", "bwd"), max_m=None):
    """Issue 19's draw: N log-uniform in [64, 262144], a multiple of 8 for 3
    draws in 4 and any integer otherwise, never an N of the grid; M
    log-uniform in [1, 64] for a quarter of the shapes (decode) and in
    [1, 2^20] otherwise, with M * N <= the grid's max_elements; dtype,
    RMSNorm / LayerNorm and op uniform; forwards fuse the residual add half
    the time. max_m: the first `count` shapes of the same sequence with
    M <= max_m (max_m=64: decode rows only)."""
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
        m_max = min(64 if rng.random() < 0.25 else 1 << 20, max_el // n)
        m = round(math.exp(rng.uniform(0, math.log(m_max))))
        dtype = rng.choice(["fp32", "fp16", "bf16"])
        norm = rng.choice(["rms", "ln"])
        op = rng.choice(list(ops))
        res = op == "fwd" and rng.random() < 0.5
        if max_m is None or m <= max_m:
            shapes.append({"op": op, "shape": f"{norm}:{dtype}:{m}x{n}{':res' if res else ''}"})
    return shapes


def run(args):
    shapes = (draw(args.seed, args.count, ops=args.ops.split(","), max_m=args.max_m) if not args.shapes else
              [{"op": t.split("/", 1)[0], "shape": t.split("/", 1)[1]} for t in args.shapes.split(",")])
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
        # Written after every shape (atomically), so a run cut short keeps what it timed.
        with open(args.out + ".tmp", "w") as f:
            json.dump({"gpu": gpu, "seed": None if args.shapes else args.seed,
                       "max_m": None if args.shapes else args.max_m, "rows": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
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


def score(args):
    doc = json.load(open(args.json))
    with tempfile.TemporaryDirectory() as tmp:
        shipped = os.path.join(tmp, "shipped")
        os.makedirs(shipped)
        for f in os.listdir(os.path.join(ROOT, "autotune_cache")):
            if not f.endswith(".json"):
                continue
            src = json.load(open(os.path.join(ROOT, "autotune_cache", f)))
            own = f == args.device + ".json"
            if (args.caches == "others" and own) or args.caches == "none":
                src["entries"] = {}  # the device's facts stay, the entries go
            json.dump(src, open(os.path.join(shipped, f), "w"))
        env = dict(os.environ, NORMJIT_BUILTIN_CACHES="0", NORMJIT_SHIPPED_CACHE_PATH=shipped)
        ratios, sources = [], {}
        for r in doc["rows"]:
            if "all" not in r:
                continue
            table = {c: t for c, t in r["all"]}
            best = min(table.values())
            p = subprocess.run([args.normjit, "--cache-dir", os.path.join(tmp, "user"), "explain", "--device",
                                args.device, "--op", r["draw"]["op"], "--shape", r["draw"]["shape"]],
                               capture_output=True, text=True, env=env)
            if p.returncode != 0:
                sys.exit(f"normjit explain failed: {p.stdout}{p.stderr}")
            cfg = next(l.split()[1] for l in p.stdout.splitlines() if l.strip().startswith("config:"))
            src = next(l.split(":", 1)[1].strip() for l in p.stdout.splitlines() if l.strip().startswith("source:"))
            sources[src] = sources.get(src, 0) + 1
            ratio = table[cfg] / best if cfg in table else float("inf")  # not timed there (rejected)
            ratios.append(ratio)
            print(f"{r['draw']['op']} {r['draw']['shape']:28} {src:10} {cfg:22} {ratio:.3f}")
    finite = sorted(ratios)
    print(f"{doc['gpu']}, {args.device}, caches: {args.caches}: {len(finite)} "
          f"shapes ({sources}), table ratio median {statistics.median(finite):.3f}, "
          f"<= 1.05: {sum(x <= 1.05 for x in finite)}/{len(finite)}, not in the table: "
          f"{sum(x == float('inf') for x in finite)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("draw", "run"):
        p = sub.add_parser(name)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--count", type=int, default=40)
        p.add_argument("--ops", default="fwd,bwd", help="ops to draw from: fwd, bwd or fwd,bwd")
        p.add_argument("--max-m", type=int, default=None,
                       help="only shapes with M <= this (the first --count of the seed's sequence; 64: decode rows)")
        if name == "run":
            p.add_argument("--normjit", default=os.path.join(ROOT, "build", "normjit"))
            p.add_argument("--out", default="heldout.json")
            p.add_argument("--shapes", help="these shapes instead of a draw: op/shape,... e.g. "
                                            "fwd/ln:fp16:162x113662,bwd/rms:bf16:8x4096 (a rule's training rows)")
    p = sub.add_parser("report")
    p.add_argument("json", nargs="+")
    p = sub.add_parser("score")
    p.add_argument("json")
    p.add_argument("--device", required=True, help="tuned-cache file name of the held-out run's GPU, without .json")
    p.add_argument("--caches", choices=["all", "others", "none"], default="all",
                   help="all shipped entries; only other devices' (a GPU without its own cache); none (the heuristic)")
    p.add_argument("--normjit", default=os.path.join(ROOT, "build", "normjit"))
    a = ap.parse_args()
    if a.cmd == "draw":
        for s in draw(a.seed, a.count, ops=a.ops.split(","), max_m=a.max_m):
            print(s["op"], s["shape"])
    elif a.cmd == "run":
        run(a)
    elif a.cmd == "score":
        score(a)
    else:
        print(report(a.json))


if __name__ == "__main__":
    main()
