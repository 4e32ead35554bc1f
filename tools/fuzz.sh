#!/usr/bin/env bash
# Coverage-guided fuzzing with libFuzzer (clang, AddressSanitizer and
# UndefinedBehaviorSanitizer) of the readers the doctest fuzz cases cover
# (tests/test_fuzz.cpp): shape specs, model configs, tuned-cache files, cubins.
#
#   tools/fuzz.sh [SECONDS per target, default 60] [TARGET...]
#
# TARGET: shape_spec, model_config, tuned_cache, cubin (default: all). Builds
# in $NORMJIT_FUZZ_BUILD_DIR (default build-fuzzers/, configured with
# CXX=clang++ -DNORMJIT_FUZZERS=ON); corpora grow in <build>/corpus/<target>
# (seeded by each target) across runs; a crashing input goes to
# <build>/artifacts/<target>-crash-*. Needs clang and libclang-rt-dev (Debian).
# Exit: 0 no finding, 1 a target found a crash, leak or timeout.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_FUZZ_BUILD_DIR:-$root/build-fuzzers}"
seconds="${1:-60}"
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(shape_spec model_config tuned_cache cubin)
cxx="${CXX:-clang++}"
cc="${CC:-clang}"
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (apt-get install clang libclang-rt-14-dev)" >&2; exit 1; }

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" \
  -DNORMJIT_FUZZERS=ON -DNORMJIT_STATIC_RUNTIME=OFF -DNORMJIT_BUILD_C_LIBRARY=OFF > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
grep -q "cannot build libFuzzer" "$build.configure.log" && { grep -A2 "cannot build libFuzzer" "$build.configure.log"; exit 1; }
build_targets=()
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
cmake --build "$build" -j"$(nproc)" --target "${build_targets[@]}" || exit 1

found=0
summary=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus" "$build/artifacts"
  seeds="$build/seeds/$t"
  rm -rf "$seeds"
  mkdir -p "$seeds"
  max_len=4096
  [ "$t" = tuned_cache ] && max_len=16384
  echo "== fuzz_$t for $seconds s"
  NORMJIT_FUZZ_SEED_DIR="$seeds" NORMJIT_FUZZ_MODELS_DIR="$root/autotune_cache/models" \
  NORMJIT_FUZZ_SHIPPED_DIR="$root/autotune_cache" ASAN_OPTIONS="detect_leaks=0" \
    "$build/tests/fuzz_$t" -runs=0 "$seeds" > /dev/null 2>&1  # writes the seeds
  NORMJIT_FUZZ_MODELS_DIR="$root/autotune_cache/models" NORMJIT_FUZZ_SHIPPED_DIR="$root/autotune_cache" \
  ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1" \
    "$build/tests/fuzz_$t" -max_total_time="$seconds" -max_len="$max_len" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$corpus" "$seeds" > "$build/fuzz_$t.log" 2>&1
  rc=$?
  runs="$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$build/fuzz_$t.log" | grep -Eo '[0-9]+$')"
  cov="$(grep -Eo 'cov: [0-9]+' "$build/fuzz_$t.log" | tail -n 1)"
  if [ $rc -eq 0 ]; then
    summary+=("fuzz_$t: ok, ${runs:-?} inputs, $cov, corpus $(find "$corpus" -type f | wc -l) files")
  else
    found=1
    summary+=("fuzz_$t: FINDING (exit $rc): see $build/fuzz_$t.log and $build/artifacts/")
    grep -E -m5 'ERROR|SUMMARY|runtime error|Test unit written' "$build/fuzz_$t.log"
  fi
done
printf '%s\n' "${summary[@]}"
exit $found
