#!/usr/bin/env bash
# compute-sanitizer over normjit's kernels, one process per (tool, case), and a
# table of tool x case -> error count at the end.
#
#   tools/sanitize.sh [--quick] [--tools memcheck,racecheck,initcheck,synccheck]
#                     [--gpu-tests] [--no-driver] [--cases REGEX] [--build DIR]
#                     [--timeout SECONDS] [--jobs N] LOGDIR
#
# Cases: those of tests/sanitize_driver.cpp (normjit_sanitize --list): every
# config of each shape's autotune grid, plus the engine's own call; --quick
# takes a sample of the shapes and one config of each kind, so all four tools
# finish in a few minutes on an H100. --gpu-tests also runs every case of
# normjit_gpu_tests (-ltc) alone (-tc=NAME): slow under racecheck/initcheck.
# Each case first runs without a sanitizer (column "plain": the float64 check,
# and it fills the kernel cache the sanitizer runs share). --jobs N runs N
# processes at once (default: half the cores, at most 8): a sanitizer run
# spends most of its time on the host (patching each loaded module), so
# runs overlap well on one GPU. synccheck runs clusters of at most 8 CTAs
# (it fails on valid clusters of 16: tools/repro/cluster_st_async.cu).
# Logs go to LOGDIR/<tool>/<case>.log, the table to LOGDIR/summary.txt.
#
# Exit: 0 no error anywhere; 1 a sanitizer error, a failed check, a crash or a
# timeout; 2 bad usage; 77 skipped (no GPU, no compute-sanitizer, or one that
# cannot attach to this GPU), with the reason on the first line.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
tools="memcheck,racecheck,initcheck,synccheck"
quick=0 gpu_tests=0 driver_cases=1 filter="" timeout_s="" logdir="" jobs=""

usage() { sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --tools) tools="$2"; shift ;;
    --gpu-tests) gpu_tests=1 ;;
    --no-driver) driver_cases=0 ;;
    --cases) filter="$2"; shift ;;
    --build) build="$2"; shift ;;
    --timeout) timeout_s="$2"; shift ;;
    --jobs) jobs="$2"; shift ;;
    -h|--help) usage ;;
    -*) echo "sanitize.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$logdir" ] || usage; logdir="$1" ;;
  esac
  shift
done
[ -n "$logdir" ] || usage
[ -n "$timeout_s" ] || timeout_s=$([ "$quick" = 1 ] && echo 900 || echo 3600)
if [ -z "$jobs" ]; then
  jobs=$(( $(nproc) / 2 ))
  [ "$jobs" -ge 1 ] || jobs=1
  [ "$jobs" -le 8 ] || jobs=8
fi
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "sanitize.sh: --jobs $jobs is not a positive integer" >&2; exit 2; }

driver="$build/tests/normjit_sanitize"
gputests="$build/tests/normjit_gpu_tests"
for b in "$driver" "$gputests"; do
  [ -x "$b" ] || { echo "sanitize.sh: $b is not built (cmake --build $build --target $(basename "$b"))" >&2; exit 2; }
done

skip() { echo "SKIPPED: $*"; exit 77; }

# compute-sanitizer: $COMPUTE_SANITIZER, PATH, the toolkit's usual places.
cs="${COMPUTE_SANITIZER:-}"
if [ -z "$cs" ]; then
  for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
           /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /opt/cuda/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then cs="$c"; break; fi
  done
fi

mkdir -p "$logdir" || exit 2
logdir="$(cd "$logdir" && pwd)"
cache="$logdir/cache"  # compiled kernels, shared by every run

# A GPU first (the driver says why not), then a sanitizer that can attach.
probe="$("$driver" --probe --cache-dir "$cache" 2>&1)"
rc=$?
[ $rc -eq 77 ] && skip "$(echo "$probe" | sed -n 's/^SKIPPED: //p' | head -n 1)"
[ $rc -eq 0 ] || { echo "sanitize.sh: the driver's probe failed without a sanitizer:"; echo "$probe"; exit 1; }
[ -n "$cs" ] || skip "compute-sanitizer not found (set COMPUTE_SANITIZER, or put the CUDA toolkit's bin/ on PATH)"
memcheck_args="--padding 256"  # an access just past an allocation never lands in the next one
# shellcheck disable=SC2086
probe="$("$cs" --tool memcheck --error-exitcode 86 $memcheck_args "$driver" --probe --cache-dir "$cache" 2>&1)"
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 86 ]; then  # without the padding option (an older or newer sanitizer)?
  p2="$("$cs" --tool memcheck --error-exitcode 86 "$driver" --probe --cache-dir "$cache" 2>&1)" && {
    echo "note: compute-sanitizer refused '$memcheck_args'; memcheck runs without it"
    memcheck_args="" probe="$p2" rc=0
  }
fi
if [ $rc -ne 0 ] && [ $rc -ne 86 ]; then
  echo "$probe" > "$logdir/probe.log"
  skip "compute-sanitizer cannot run here (exit $rc; $logdir/probe.log): $(echo "$probe" | grep -v '^$' | tail -n 3 | tr '\n' ' ')"
fi
echo "compute-sanitizer: $cs ($("$cs" --version 2>/dev/null | grep -i version | head -n 1))"
echo "$probe" | grep -m1 '^probe ok' || true

# Cases: "driver:<name>" and "gpu:<doctest case name>".
cases=()
if [ "$driver_cases" = 1 ]; then
  list_args=(--list)
  [ "$quick" = 1 ] && list_args+=(--quick)
  while IFS= read -r c; do
    [ -n "$c" ] && cases+=("driver:$c")
  done < <("$driver" "${list_args[@]}")
fi
if [ "$gpu_tests" = 1 ]; then
  # -ltc prints the names between two lines of '='.
  while IFS= read -r c; do
    [ -n "$c" ] && cases+=("gpu:$c")
  done < <("$gputests" -ltc | awk '/^==========/ { n++; next } n == 1')
fi
if [ -n "$filter" ]; then
  kept=()
  for c in "${cases[@]}"; do [[ "$c" =~ $filter ]] && kept+=("$c"); done
  cases=("${kept[@]}")
fi
[ ${#cases[@]} -gt 0 ] || { echo "sanitize.sh: no case selected" >&2; exit 2; }

IFS=',' read -r -a tool_list <<< "$tools"
for t in "${tool_list[@]}"; do
  case "$t" in memcheck|racecheck|initcheck|synccheck) ;; *) echo "sanitize.sh: unknown tool $t" >&2; exit 2 ;; esac
done

# A file name for a case.
slug() { printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-100; }

# The command of a case (after the sanitizer, if any); $2: the tool.
case_cmd() {
  local c="$1" tool="$2"
  if [ "${c%%:*}" = driver ]; then
    cmd=("$driver" --case "${c#driver:}" --cache-dir "$cache")
    [ "$quick" = 1 ] && cmd+=(--quick)
    [ "$tool" = initcheck ] && cmd+=(--no-poison)  # outputs left uninitialised: reads of them are reported
    # synccheck ends a launch of 16 or more clusters of 16 CTAs with an
    # illegal address and no report, a standalone kernel with no normjit
    # code included (tools/repro/cluster_st_async.cu): it checks clusters
    # of up to 8.
    [ "$tool" = synccheck ] && cmd+=(--max-cluster 8)
  else
    # doctest splits filters at commas: escape them.
    local name="${c#gpu:}"
    cmd=("$gputests" "-tc=${name//,/\\,}")
  fi
  return 0
}

tool_args() {
  case "$1" in
    memcheck) echo "$memcheck_args" ;;
    *) echo "" ;;
  esac
}

# One run: (case, tool) -> LOGDIR/<tool>/<case>.log and a result line
# "<cell> <seconds> <errors>" in LOGDIR/results/<tool>/<case>.
run_one() {
  local c="$1" tool="$2" log res t0 rc secs errs v
  mkdir -p "$logdir/$tool" "$logdir/results/$tool"
  log="$logdir/$tool/$(slug "$c").log"
  res="$logdir/results/$tool/$(slug "$c")"
  case_cmd "$c" "$tool"
  t0=$(date +%s)
  if [ "$tool" = plain ]; then
    NORMJIT_CACHE_DIR="$cache/user" timeout -k 30 "$timeout_s" "${cmd[@]}" > "$log" 2>&1
    rc=$?
  else
    # shellcheck disable=SC2046
    NORMJIT_CACHE_DIR="$cache/user" timeout -k 30 "$timeout_s" "$cs" --tool "$tool" --error-exitcode 86 --print-limit 50 \
      $(tool_args "$tool") "${cmd[@]}" > "$log" 2>&1
    rc=$?
  fi
  secs=$(( $(date +%s) - t0 ))
  errs=""
  if [ "$tool" != plain ]; then
    errs="$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$log" | tail -n 1 | grep -Eo '[0-9]+$')"
    [ -n "$errs" ] || errs="$(grep -Eo 'RACECHECK SUMMARY: .*\(([0-9]+) error' "$log" | tail -n 1 | grep -Eo '[0-9]+ error' | grep -Eo '[0-9]+')"
  fi
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    v="TIMEOUT"
  elif [ "$tool" = plain ]; then
    if [ $rc -eq 0 ]; then v="ok"; else v="FAIL($rc)"; fi
  elif [ -z "$errs" ]; then
    v="?($rc)"  # no summary: the sanitizer itself failed
  else
    v="$errs"
    if [ $rc -ne 0 ] && [ $rc -ne 86 ]; then v="$errs/FAIL($rc)"; fi
  fi
  echo "$v $secs ${errs:-0}" > "$res"
  printf '%-60.60s %-9s %-10s %4ss  %s\n' "$c" "$tool" "$v" "$secs" "$log"
}

# Up to $jobs runs at once; the plain runs first (they compile the kernels
# the sanitizer runs then load from the shared cache).
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done; }
start=$(date +%s)
echo "${#cases[@]} cases x (plain + ${#tool_list[@]} tools), $jobs at once"
for c in "${cases[@]}"; do throttle; run_one "$c" plain & done
wait
for tool in "${tool_list[@]}"; do
  for c in "${cases[@]}"; do throttle; run_one "$c" "$tool" & done
done
wait

declare -A cell
failures=0 total_errors=0
for c in "${cases[@]}"; do
  for tool in plain "${tool_list[@]}"; do
    read -r v _ errs < "$logdir/results/$tool/$(slug "$c")" || { v="?(lost)"; errs=0; }
    cell["$c|$tool"]="$v"
    total_errors=$((total_errors + errs))
    [[ "$v" =~ ^(ok|[0-9]+)$ ]] || failures=$((failures + 1))
  done
done

{
  echo
  printf '%-60s %-10s' "case" "plain"
  for t in "${tool_list[@]}"; do printf ' %-10s' "$t"; done
  echo
  for c in "${cases[@]}"; do
    printf '%-60.60s %-10s' "$c" "${cell["$c|plain"]}"
    for t in "${tool_list[@]}"; do printf ' %-10s' "${cell["$c|$t"]}"; done
    echo
  done
  echo
  echo "${#cases[@]} cases x (plain + ${#tool_list[@]} tools) in $(( $(date +%s) - start )) s: $total_errors sanitizer errors, $failures failed runs (logs: $logdir)"
} | tee "$logdir/summary.txt"
[ "$total_errors" -eq 0 ] && [ "$failures" -eq 0 ]
