#!/usr/bin/env bash
# The config model on a GPU, in one device call (issue 19's checks):
#   1. the GPU suite;
#   2. held-out shapes: the model's config against the fastest candidate of
#      the whole grid, timed in alternating rounds (tools/heldout.py run);
#   3. `tune --model` of Qwen3-8B from empty caches (the pre-warm time);
#   4. `bench` of the shapes the issue names, with no tuned cache at all
#      (NORMJIT_BUILTIN_CACHES=0: the model's configs) and with the shipped ones.
# Writes summary.txt, heldout-<gpu>.json and bench-*.json to --out.
#
#   bash tools/model_check.sh --build .dev --out "$OUT" [--seed 19] [--count 60] [--skip suite,heldout,tune,bench]
set -u
build=.dev out=model-check seed=19 count=60 skip=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --count) count=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    *) echo "model_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr ' ' '-' | tr 'A-Z' 'a-z')
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
wants() { case ",$skip," in *",$1,"*) return 1 ;; *) return 0 ;; esac; }
say "GPU: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.memory --format=csv,noheader)"

if wants suite; then
  t0=$(date +%s)
  "$build/tests/normjit_gpu_tests" >"$out/suite.log" 2>&1
  rc=$?
  say "GPU suite: rc $rc in $(( $(date +%s) - t0 )) s: $(grep -E '^\[doctest\] (test cases|assertions)' "$out/suite.log" | tr '\n' ' ')"
fi

if wants heldout; then
  t0=$(date +%s)
  timeout 330 python3 tools/heldout.py run --seed "$seed" --count "$count" --normjit "$build/normjit" \
    --out "$out/heldout-$gpu.json" >"$out/heldout.log" 2>&1
  say "held-out (seed $seed, $count drawn): rc $? in $(( $(date +%s) - t0 )) s"
  python3 - "$out/heldout-$gpu.json" <<'EOF' | tee -a "$summary"
import json, math, statistics, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if "ratio" in r]
for op in ("fwd", "bwd"):
    x = sorted(r["ratio"] for r in rows if r["op"].endswith(op))
    if x:
        print(f"  {op}: {len(x)} shapes, model/fastest median {statistics.median(x):.3f}, "
              f"geomean {math.exp(sum(map(math.log, x)) / len(x)):.3f}, max {x[-1]:.3f}, "
              f"<= 1.02: {sum(v <= 1.02 for v in x)}, <= 1.05: {sum(v <= 1.05 for v in x)}")
EOF
fi

if wants tune; then
  cache=$(mktemp -d)
  t0=$(date +%s.%N)
  "$build/normjit" --cache-dir "$cache" tune --model autotune_cache/models/qwen3-8b.config.json >"$out/tune-qwen3.log" 2>&1
  rc=$?
  say "tune --model qwen3-8b from empty caches: rc $rc, $(python3 -c "import time; print(round(time.time() - $t0, 1))") s; $(tail -n 1 "$out/tune-qwen3.log")"
  rm -rf "$cache"
fi

if wants bench; then
  shapes=(rms:bf16:1x8192 rms:bf16:4x8192 rms:bf16:16x8192 rms:bf16:32x8192 rms:bf16:8192x4096 rms:bf16:4096x65536
          rms:bf16:1024x131072 ln:fp16:4096x256 rms:bf16:4096x12345 rms:bf16:256x200000 ln:bf16:8192x4096
          rms:bf16:8192x5001 ln:bf16:4096x7777 rms:fp16:2048x3001:res)
  args=()
  for s in "${shapes[@]}"; do args+=(--shape "$s"); done
  for mode in model shipped; do
    env_=()
    [ "$mode" = model ] && env_=(NORMJIT_BUILTIN_CACHES=0)
    cache=$(mktemp -d)
    env "${env_[@]}" NORMJIT_TUNE=never "$build/normjit" --cache-dir "$cache" bench --op both "${args[@]}" \
      --json "$out/bench-$mode-$gpu.json" >"$out/bench-$mode.log" 2>&1
    say "bench ($mode configs): rc $?"
    head -n 60 "$out/bench-$mode.log" >>"$summary"
    rm -rf "$cache"
  done
fi
tar czf "$out/logs.tar.gz" -C "$out" $(cd "$out" && ls *.log 2>/dev/null) 2>/dev/null
rm -f "$out"/*.log
echo "wrote $out"
