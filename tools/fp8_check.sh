#!/usr/bin/env bash
# FP8 checks on a GPU machine over a carried build: the GPU test suite, the
# FP8 Python suites through the PyTorch operators, and tools/bench_fp8.py
# (kernel time against torch.compile). Results go to $OUT (or ./device-out).
#   NORMJIT_BUILD_DIR  the carried build: normjit_gpu_tests (or
#                      tests/normjit_gpu_tests), libnormjit_c.so,
#                      libnormjit_torch.so (default .dev)
#   NOSUITE=1, NOPY=1  leave the suite / the Python suites out
#   PYFILES            the Python suites (default: the three FP8 files)
#   SHAPES, VARIANTS   bench_fp8's --shapes / --variants (no SHAPES: no bench)
#   BARGS              more bench_fp8 arguments, e.g. "--reps 20"
# Usage: SHAPES=8192x4096,1x4096 VARIANTS=tensor,tensor+t bash tools/fp8_check.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/.dev}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
cd "$root"
export NORMJIT_LIBRARY="$build/libnormjit_c.so" NORMJIT_TORCH_LIBRARY="$build/libnormjit_torch.so"
export PYTHONPATH="$root/tools/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
if [ -z "${NOSUITE:-}" ]; then
  tests="$build/normjit_gpu_tests"
  [ -x "$tests" ] || tests="$build/tests/normjit_gpu_tests"
  start=$SECONDS
  "$tests" > "$out/suite.txt" 2>&1
  echo "suite rc=$? $((SECONDS - start)) s" | tee -a "$out/suite.txt"
  tail -n 4 "$out/suite.txt"
fi
if [ -z "${NOPY:-}" ]; then
  start=$SECONDS
  # shellcheck disable=SC2086
  python3 -m pytest -q -p no:cacheprovider ${PYFILES:-tests/python/test_fp8.py tests/python/test_fp8_ops.py tests/python/test_conventions.py} > "$out/pytest.txt" 2>&1
  echo "pytest rc=$? $((SECONDS - start)) s" | tee -a "$out/pytest.txt"
  tail -n 3 "$out/pytest.txt"
fi
if [ -n "${SHAPES:-}" ]; then
  start=$SECONDS
  # shellcheck disable=SC2086
  python3 tools/bench_fp8.py --shapes "$SHAPES" --variants "${VARIANTS:-tensor,tensor+t}" ${BARGS:-} \
    --json "$out/bench.json" --markdown "$out/bench.md" > "$out/bench.log" 2>&1
  echo "bench rc=$? $((SECONDS - start)) s"
  cat "$out/bench.md"
fi
