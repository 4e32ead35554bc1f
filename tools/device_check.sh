#!/usr/bin/env bash
# Checks on a GPU machine over a carried build, in phases (default: all):
#   tests   the GPU test suite
#   tune    tune the target shapes (the issues' speed targets, the LayerNorm
#           sweep and the comparison suite's shapes) into the user cache
#   bench   benchmark them with the float64 check, JSON to $OUT
#   main    the main job (tools/main.sh) on a carried build
#   python  the pytest suite and the comparison against PyTorch / Liger
# Logs go to $OUT (or ./device-out). Usage:
#   NORMJIT_BUILD_DIR=.dev bash tools/device_check.sh tests tune bench
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export NORMJIT_SHIPPED_CACHE_PATH="${NORMJIT_SHIPPED_CACHE_PATH:-$root/autotune_cache}"
nj="$build/normjit"
phases=("$@")
[ ${#phases[@]} -eq 0 ] && phases=(tests tune bench main python)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

shapes=(
  # RMSNorm targets, decode and wide rows
  rms:bf16:8192x4096 rms:fp32:32768x4096 rms:bf16:32768x128 rms:bf16:1x4096 rms:bf16:32x8192
  rms:bf16:4096x16384 rms:bf16:4096x65536 rms:bf16:1024x131072
  rms:fp32:32768x1024 rms:fp32:32768x2048 rms:fp32:32768x8192
  rms:bf16:32768x1024 rms:bf16:32768x2048 rms:bf16:32768x4096 rms:bf16:32768x8192
  # LayerNorm targets and the M = 4096 sweep
  ln:bf16:8192x4096 ln:fp16:4096x256 ln:fp16:4096x512 ln:fp16:4096x1024 ln:fp16:4096x2048
  ln:fp16:4096x4096 ln:fp16:4096x8192 ln:fp16:4096x16384 ln:fp16:4096x32768
  # fused residual add + RMSNorm, QK-norm read through a view into a fused QKV projection
  rms:bf16:8192x4096:res rms:bf16:32768x128:heads=32:x_stride=6144
)
# NORMJIT_SHAPES="spec spec ..." replaces the list (e.g. to tune in parts).
[ -n "${NORMJIT_SHAPES:-}" ] && read -r -a shapes <<< "$NORMJIT_SHAPES"
args=()
for s in "${shapes[@]}"; do args+=(--shape "$s"); done

for phase in "${phases[@]}"; do
  case "$phase" in
    tests)
      gt="$build/tests/normjit_gpu_tests"
      [ -x "$gt" ] || gt="$build/normjit_gpu_tests"  # a flat carried build
      ( time timeout "${GPU_TEST_TIMEOUT:-300}" "$gt" ) > "$out/gpu_tests.log" 2>&1
      echo "gpu tests rc=$?"; grep -E "ERROR|test cases|assertions|Status|real" "$out/gpu_tests.log" | head -20 ;;
    tune)
      timeout "${TUNE_TIMEOUT:-420}" "$nj" tune "${args[@]}" > "$out/tune.log" 2>&1
      echo "tune rc=$?"; grep -c winner "$out/tune.log"
      cp "$("$nj" cache list | sed -n 's/^user cache: //p')"/*.json "$out/" 2>/dev/null ;;
    bench)
      "$nj" bench "${args[@]}" --json "$out/bench.json" > "$out/bench.log" 2>&1
      echo "bench rc=$?"; tail -n +4 "$out/bench.log" | cut -c1-200 ;;
    main)
      NORMJIT_SKIP_BUILD=1 NORMJIT_BUILD_DIR="$build" timeout "${MAIN_TIMEOUT:-400}" bash "$root/tools/main.sh" > "$out/main.log" 2>&1
      echo "main rc=$?"; tail -n 24 "$out/main.log"
      cp "$("$nj" cache list | sed -n 's/^user cache: //p')"/*.json "$out/" 2>/dev/null ;;
    python)
      export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$root/tools/python" NORMJIT_LIBRARY="$build/libnormjit_c.so"
      ( cd "$root" && timeout "${PYTEST_TIMEOUT:-300}" python3 -m pytest -q -rs tests/python ) > "$out/pytest.log" 2>&1
      echo "pytest rc=$?"; tail -n 15 "$out/pytest.log"
      ( cd "$root" && timeout "${COMPARE_TIMEOUT:-360}" python3 tools/compare.py --tune --max-seconds 300 --json "$out/compare.json" ) > "$out/compare.log" 2>&1
      echo "compare rc=$?"; tail -n 60 "$out/compare.log" | cut -c1-220
      python3 "$root/tools/plot.py" "$out/compare.json" --out "$out/compare.png" ;;
    *) echo "unknown phase '$phase' (tests tune bench main python)"; exit 2 ;;
  esac
done
