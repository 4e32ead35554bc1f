#!/usr/bin/env bash
# A/B of a kernel-template edit on a GPU machine: one normjit binary times
# the shapes twice with the templates of a git revision (through
# NORMJIT_KERNELS_DIR) and twice with its own embedded ones, alternating,
# with no tuned cache (every config is the config model's, the same for
# both), then prints a table of the lower medians (us, GB/s, SOL%, old/new).
#   AB_OLD_KERNELS  a directory of the old kernels_src/*.cuh (make it here
#                   with: git archive REV kernels_src | tar -x -C DIR)
#   AB_OLD_BUILD_DIR  a build whose normjit runs the old side instead, with
#                   its own templates unless AB_OLD_KERNELS is set (an edit
#                   of the host too, such as the kernels' argument layout)
# One of AB_OLD_KERNELS and AB_OLD_BUILD_DIR is required.
#   AB_NEW_KERNELS  a directory of the new templates (default: the binary's own)
#   AB_OP           fwd or bwd (default bwd)
#   NORMJIT_BUILD_DIR  a build with the normjit CLI (default build/)
# Usage: AB_OLD_KERNELS=.dev/oldk/kernels_src bash tools/ab_kernels.sh rms:bf16:147x6560 ...
#        AB_OLD_BUILD_DIR=.dev/old bash tools/ab_kernels.sh rms:bf16:147x6560 ...
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nj="${NORMJIT_BUILD_DIR:-$root/build}/normjit"
out="${OUT:-$root/device-out}"
old="${AB_OLD_KERNELS:-}"
old_nj="${AB_OLD_BUILD_DIR:+$AB_OLD_BUILD_DIR/normjit}"
[ -n "$old$old_nj" ] || { echo "set AB_OLD_KERNELS (old templates) or AB_OLD_BUILD_DIR (old build)" >&2; exit 2; }
op="${AB_OP:-bwd}"
[ $# -gt 0 ] || { echo "usage: AB_OLD_KERNELS=DIR | AB_OLD_BUILD_DIR=DIR $0 SHAPE..." >&2; exit 2; }
mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
args=()
for s in "$@"; do args+=(--shape "$s"); done
caches=$(mktemp -d)
trap 'rm -rf "$caches"' EXIT
for r in 1 2; do
  for b in old new; do
    if [ $b = old ]; then kd="$old" bin="${old_nj:-$nj}"; else kd="${AB_NEW_KERNELS:-}" bin="$nj"; fi  # kd empty: the binary's embedded templates
    NORMJIT_KERNELS_DIR="$kd" NORMJIT_BUILTIN_CACHES=0 "$bin" --cache-dir "$caches/$b$r" bench --op "$op" --reps 30 \
      --no-check --json "$out/ab-$b$r.json" "${args[@]}" > "$out/ab-$b$r.log" 2>&1 ||
      { echo "bench $b run $r failed; see $out/ab-$b$r.log" >&2; exit 1; }
  done
done
python3 - "$out" <<'EOF'
import json, math, sys
out = sys.argv[1]
runs = {n: {r["name"]: r for r in json.load(open(f"{out}/ab-{n}.json"))["rows"]} for n in ("old1", "old2", "new1", "new2")}
print("| shape | config | old us | new us | new GB/s | new SOL% | copy us | old/new |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
ratios = []
for k in runs["new1"]:
    o = min(runs["old1"][k]["us"], runs["old2"][k]["us"])
    n = min((runs["new1"][k], runs["new2"][k]), key=lambda r: r["us"])
    ratios.append(o / n["us"])
    print(f"| {k} | {n['config']} | {o:.2f} | {n['us']:.2f} | {n['gbps']:.0f} | {n['sol_pct']:.1f}% | {n['copy_us']:.2f} | {o / n['us']:.3f} |")
print(f"\ngeomean old/new {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over {len(ratios)} shapes")
for b in ("old", "new"):  # the spread between a build's two runs: what a ratio must exceed to mean anything
    d = [abs(math.log(runs[b + "1"][k]["us"] / runs[b + "2"][k]["us"])) for k in runs[b + "1"]]
    print(f"{b}: largest run-to-run difference {math.exp(max(d)) - 1:.1%}")
EOF
