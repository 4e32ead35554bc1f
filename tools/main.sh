#!/usr/bin/env bash
# The main job on the embedded default (Qwen3-8B): install, build, compile
# every kernel variant for sm_90, then on a GPU tune every norm shape of
# the model, check each tuned kernel against the float64 reference and print
# the benchmark table.
#   NORMJIT_MODEL      model config (default autotune_cache/models/qwen3-8b.config.json)
#   NORMJIT_SKIP_BUILD=1  use an existing build (e.g. one carried to a GPU machine)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
model="${NORMJIT_MODEL:-$root/autotune_cache/models/qwen3-8b.config.json}"
if [ "${NORMJIT_SKIP_BUILD:-0}" != 1 ]; then
  bash "$root/tools/setup.sh"
  bash "$root/tools/build.sh"
fi
nj="$build/normjit"

echo "== compiling every kernel variant of $(basename "$model") for sm_90 (NVRTC, no GPU needed)"
"$nj" compile --arch sm_90 --model "$model"

echo "== tuning every norm shape of $(basename "$model")"
set +e
"$nj" tune --model "$model"
rc=$?
set -e
if [ $rc -eq 3 ]; then
  echo "normjit: the kernels are compiled; tuning and benchmarks need an NVIDIA GPU (see the reason above)."
  exit 0
fi
[ $rc -eq 0 ] || exit $rc

echo "== checking each tuned kernel against the float64 reference, and timing it"
mkdir -p "$build/results"
"$nj" bench --model "$model" --json "$build/results/bench.json"
