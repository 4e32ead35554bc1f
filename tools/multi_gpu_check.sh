#!/usr/bin/env bash
# Several GPUs, on a machine of two or more, over a carried build (one device
# call): the GPU suite's device and sharded cases, the two-rank NCCL test of
# the sharded norms, `normjit tune --devices` of a model from empty caches
# (twice: the second finds every entry), a minute of `tune --grid --devices`,
# and tools/bench_tp.py. Results go
# to $OUT (or ./device-out).
#   NORMJIT_BUILD_DIR  normjit, normjit_gpu_tests (or tests/...), libnormjit_c.so (default .dev)
#   DEVICES            ordinals for tune --devices (default: every GPU)
#   MODEL              the model to pre-warm (default autotune_cache/models/qwen3-8b.config.json)
#   SHAPES             bench_tp's --shapes (default its own)
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the rest, below).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/.dev}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NORMJIT_LIBRARY="$build/libnormjit_c.so" NORMJIT_SHIPPED_CACHE_PATH="$root/autotune_cache"
export PYTHONPATH="$root/tools/python${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee "$out/gpus.txt"
n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
devices="${DEVICES:-$(seq -s, 0 $((n - 1)))}"
tests="$build/normjit_gpu_tests"
[ -x "$tests" ] || tests="$build/tests/normjit_gpu_tests"
start=$SECONDS
"$tests" -tc='devices:*,sharded:*' --duration=true > "$out/suite.txt" 2>&1
echo "suite (devices, sharded) rc=$? $((SECONDS - start)) s" | tee -a "$out/suite.txt"
tail -n 4 "$out/suite.txt"
start=$SECONDS
python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_sharded.py > "$out/pytest.txt" 2>&1
echo "pytest test_sharded rc=$? $((SECONDS - start)) s" | tee -a "$out/pytest.txt"
tail -n 3 "$out/pytest.txt"
cache="$(mktemp -d)"
for pass in 1 2; do
  start=$SECONDS
  NORMJIT_BUILTIN_CACHES=0 "$build/normjit" --cache-dir "$cache" tune --devices "$devices" \
    --model "${MODEL:-autotune_cache/models/qwen3-8b.config.json}" > "$out/tune-devices-$pass.txt" 2>&1
  echo "tune --devices $devices pass $pass rc=$? $((SECONDS - start)) s" | tee -a "$out/tune-devices-$pass.txt"
  grep -E '^(tune |devices )' "$out/tune-devices-$pass.txt"
done
ls "$cache/tuned" | tee "$out/tuned-files.txt"
# The shipped grid on every GPU for a minute: groups shared by the GPUs of a kind.
start=$SECONDS
"$build/normjit" --cache-dir "$(mktemp -d)" tune --grid autotune_cache/grid/grid.json --devices "$devices" \
  --max-seconds 60 > "$out/tune-grid-devices.txt" 2>&1
echo "tune --grid --devices $devices rc=$? $((SECONDS - start)) s" | tee -a "$out/tune-grid-devices.txt"
grep -E '^grid ' "$out/tune-grid-devices.txt"
start=$SECONDS
# shellcheck disable=SC2086
python3 tools/bench_tp.py --tp 2 ${SHAPES:+--shapes $SHAPES} --json "$out/tp.json" --markdown "$out/tp.md" \
  > "$out/bench_tp.log" 2>&1
echo "bench_tp rc=$? $((SECONDS - start)) s"
cat "$out/tp.md" 2>/dev/null || tail -n 20 "$out/bench_tp.log"
