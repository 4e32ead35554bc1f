#!/usr/bin/env bash
# One call on a GPU machine over a carried build: target-shape tuning and
# benchmark, the GPU test suite, then the main job. Logs go to $OUT (or
# ./device-out). Usage: NORMJIT_BUILD_DIR=.dev bash tools/device_check.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export NORMJIT_SHIPPED_CACHE_PATH="$root/autotune_cache"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
# The issue's speed targets, then decode and wide rows.
targets=(--shape rms:bf16:8192x4096 --shape rms:fp32:32768x4096 --shape rms:bf16:32768x128
         --shape rms:bf16:1x4096 --shape rms:bf16:4096x12288 --shape rms:bf16:4096x16384 --shape rms:bf16:4096x65536)
"$build/normjit" tune "${targets[@]}" > "$out/tune_targets.log" 2>&1
echo "tune targets rc=$?"
"$build/normjit" bench "${targets[@]}" --json "$out/bench_targets.json" 2>&1 | tee "$out/bench_targets.log" | tail -17
gt="$build/tests/normjit_gpu_tests"
[ -x "$gt" ] || gt="$build/normjit_gpu_tests"  # a flat carried build
( time timeout "${GPU_TEST_TIMEOUT:-300}" "$gt" ) > "$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"; grep -E "test cases|assertions|Status|real" "$out/gpu_tests.log"
NORMJIT_SKIP_BUILD=1 NORMJIT_BUILD_DIR="$build" timeout "${MAIN_TIMEOUT:-400}" bash "$root/tools/main.sh" > "$out/main.log" 2>&1
echo "main rc=$?"; tail -n 24 "$out/main.log"
cp "$HOME"/.cache/normjit/tuned/*.json "$out/" 2>/dev/null
