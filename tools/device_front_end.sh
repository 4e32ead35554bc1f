#!/usr/bin/env bash
# The PyTorch front end on a GPU machine over a carried build (.dev: normjit,
# libnormjit_c.so, libnormjit_torch.so, normjit_bench_host, normjit_gpu_tests),
# in phases; logs and tables to $OUT:
#   pytest     tests/python (operators, opcheck, compile, CUDA graphs, HF models, FP8)
#   cppbench   normjit_bench_host: engine call vs bare launch (ns)
#   hostbench  tools/bench_host.py: host time per call beside eager (and peers on PYTHONPATH)
#   gputests   the doctest GPU suite
# Usage: NORMJIT_BUILD_DIR=.dev bash tools/device_front_end.sh pytest cppbench hostbench
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/.dev}"
out="${OUT:-$root/device-out}"
mkdir -p "$out"
export NORMJIT_LIBRARY="$build/libnormjit_c.so" NORMJIT_CACHE_DIR="${NORMJIT_CACHE_DIR:-$root/.njcache}"
export PYTHONPATH="$root/tools/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for phase in "$@"; do
  echo "== $phase"
  case "$phase" in
    pytest) timeout "${PYTEST_SECONDS:-420}" python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_ARGS:-} \
              "$root/tests/python" 2>&1 | tee "$out/pytest.log" | tail -n 40 ;;
    cppbench) "$build/normjit_bench_host" 2>&1 | tee "$out/cppbench.md" ;;
    hostbench) python3 "$root/tools/bench_host.py" --json "$out/hostbench.json" --markdown "$out/hostbench.md" 2>&1 \
                 | grep -v Warning ;;
    gputests) timeout "${GPUTEST_SECONDS:-300}" "$build/normjit_gpu_tests" ${GPUTEST_ARGS:-} 2>&1 \
                | tee "$out/gputests.log" | tail -n 30 ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
