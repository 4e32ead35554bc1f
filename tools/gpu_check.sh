#!/usr/bin/env bash
# The GPU verification of a session, in one device call over a carried build
# (CI has no GPU; this is what runs on one):
#   suite        normjit_gpu_tests, every kernel compiled from an empty kernel
#                cache, each case's time (budget: 120 s on one H100)
#   sanitize     tools/sanitize.sh --quick: memcheck, racecheck, initcheck,
#                synccheck over the driver's quick sample (budget: 5 minutes)
#   concurrency  tools/concurrent_tune.sh: 8 tuners into one cache directory,
#                then tuners killed with SIGKILL
# and one summary table at the end (also in summary.txt). Logs go to
# ./gpu-check-out (--out DIR); with $OUT set (a remote runner's output folder),
# summary.txt and gpu-check.tar.gz (every log) are also copied there.
#
#   tools/gpu_check.sh [--build DIR] [--out DIR] [--quick] [PHASE...]
#
# --quick runs the suite's quick subset (-ts=quick, <= 30 s) instead of the
# whole suite. PHASE: suite, sanitize, concurrency (default: all three).
# Exit: 0 every phase passed, 1 otherwise.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
out="$PWD/gpu-check-out"
quick=0
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift ;;
    --out) out="$2"; shift ;;
    --quick) quick=1 ;;
    suite|sanitize|concurrency) phases+=("$1") ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
[ ${#phases[@]} -gt 0 ] || phases=(suite sanitize concurrency)
build="$(cd "$build" && pwd)" || exit 2
rm -rf "$out/suite.log" "$out/sanitizer" "$out/concurrency" "$out/repro.log"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export NORMJIT_BUILD_DIR="$build"
# The shipped tuned caches, wherever this checkout is (the build's built-in path may not exist here).
export NORMJIT_SHIPPED_CACHE_PATH="${NORMJIT_SHIPPED_CACHE_PATH:-$root/autotune_cache}"
gpu="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
echo "GPU: ${gpu:-none found}; $(nproc) cores; build $build"

declare -A result took
run_phase() {  # name, budget seconds, command...
  local name="$1" budget="$2" t0 rc
  shift 2
  t0=$(date +%s)
  echo "== $name (limit ${budget} s)"
  timeout -k 10 "$budget" "$@" > "$out/$name.log" 2>&1
  rc=$?
  took[$name]=$(( $(date +%s) - t0 ))
  result[$name]=$rc
  echo "   exit $rc in ${took[$name]} s (log: $out/$name.log)"
}

for phase in "${phases[@]}"; do
  case "$phase" in
    suite)
      args=()
      [ "$quick" = 1 ] && args+=(-ts=quick)
      # No kernel directory given: the suite compiles into a fresh one.
      run_phase suite 300 env -u NORMJIT_TEST_KERNEL_DIR "$build/tests/normjit_gpu_tests" "${args[@]}"
      ;;
    sanitize)
      run_phase sanitize 330 bash "$root/tools/sanitize.sh" --quick --build "$build" --timeout 300 "$out/sanitizer"
      # The standalone reproducer of synccheck's failure on clusters of 16
      # (why sanitize.sh gives synccheck clusters of at most 8), where nvcc is.
      nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
      cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
      if [ -x "$nvcc" ] && [ -x "$cs" ] &&
        "$nvcc" -std=c++17 -O2 -gencode=arch=compute_90,code=sm_90 "$root/tools/repro/cluster_st_async.cu" \
          -o "$out/cluster_st_async" > "$out/repro.log" 2>&1; then
        for a in "16 3 0 128 4" "16 3 0 128 16" "8 3 0 128 64"; do
          # shellcheck disable=SC2086
          p="$("$out/cluster_st_async" $a 2>&1 | tail -n 1)"
          # shellcheck disable=SC2086
          s="$("$cs" --tool synccheck "$out/cluster_st_async" $a 2>&1 | grep -vE '^=+ *$' | tr '\n' ' ')"
          echo "cluster_st_async $a | plain: $p | synccheck: $s" >> "$out/repro.log"
        done
      fi
      ;;
    concurrency)
      run_phase concurrency 240 bash "$root/tools/concurrent_tune.sh" --build "$build" "$out/concurrency"
      ;;
  esac
done

# ---- summary ----------------------------------------------------------------
fail=0
{
echo
echo "================ summary (${gpu:-no GPU}) ================"
if [ -n "${result[suite]:-}" ]; then
  log="$out/suite.log"
  echo "GPU suite$([ "$quick" = 1 ] && echo " (quick subset)"): exit ${result[suite]}, ${took[suite]} s wall"
  # doctest's --duration lines: "<seconds> s: <case>".
  grep -E '^[0-9]+\.[0-9]+ s: ' "$log" | sort -rn | awk '{ printf "  %8.2f s  %s\n", $1, substr($0, index($0, ": ") + 2) }'
  grep -E '^\[doctest\] (test cases|assertions|Status)' "$log" | sed 's/^/  /'
  grep -E '^(SKIPPED|.*ERROR: )' "$log" | head -n 20 | sed 's/^/  /'
  [ "${result[suite]}" = 0 ] || fail=1
fi
if [ -n "${result[sanitize]:-}" ]; then
  echo "Sanitizers: exit ${result[sanitize]}, ${took[sanitize]} s wall"
  sed 's/^/  /' "$out/sanitizer/summary.txt" 2>/dev/null || tail -n 5 "$out/sanitize.log" | sed 's/^/  /'
  grep -h '^cluster_st_async' "$out/repro.log" 2>/dev/null | cut -c1-400 | sed 's/^/  reproducer: /'
  [ "${result[sanitize]}" = 0 ] || fail=1
fi
if [ -n "${result[concurrency]:-}" ]; then
  echo "Concurrency: exit ${result[concurrency]}, ${took[concurrency]} s wall"
  grep -E '^(phase|  |FAIL|concurrent_tune|SKIPPED)' "$out/concurrency.log" | sed 's/^/  /'
  [ "${result[concurrency]}" = 0 ] || fail=1
fi
echo "overall: $([ $fail = 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
grep -q "^overall: PASS" "$out/summary.txt" || fail=1
tar -czf "$out/gpu-check.tar.gz" -C "$out" --exclude gpu-check.tar.gz --exclude cache . 2>/dev/null
if [ -n "${OUT:-}" ] && [ "$OUT" != "$out" ]; then cp "$out/summary.txt" "$out/gpu-check.tar.gz" "$OUT/"; fi
exit $fail
