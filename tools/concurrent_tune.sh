#!/usr/bin/env bash
# Concurrency and crash safety of the user cache, on a GPU:
#  phase 1: 8 `normjit tune` processes, each with its own shape, into one
#           NORMJIT_CACHE_DIR at once; then every tuned entry must be in the one
#           tuned-cache file (read by `normjit explain`: source "user cache", and
#           by parsing the JSON), with no temporary file left behind.
#  phase 2: a tune killed with SIGKILL midway (twice: while it compiles, and
#           after its forward entry was stored); the cache must still parse and
#           keep phase 1's entries, and the same tune run again must succeed
#           and add its entries.
#
#   tools/concurrent_tune.sh [--build DIR] [WORKDIR]
#
# WORKDIR (default: a new temporary directory) holds the cache and the logs.
# Exit: 0 ok, 1 a check failed, 77 skipped (no GPU: the reason is printed).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) work="$1" ;;
  esac
  shift
done
cli="$build/normjit"
[ -x "$cli" ] || { echo "concurrent_tune.sh: $cli is not built" >&2; exit 1; }
[ -n "$work" ] || work="$(mktemp -d "${TMPDIR:-/tmp}/normjit-concurrent-XXXXXX")"
mkdir -p "$work/logs"
cache="$work/cache"
rm -rf "$cache"
export NORMJIT_CACHE_DIR="$cache"
py="$(command -v python3 || true)"
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# The shape key of a spec (fwd or bwd) and where its config comes from, as explain says.
explain_field() {  # spec op field -> value
  "$cli" explain --shape "$1" --op "$2" 2>/dev/null | sed -n "s/^  $3: *//p" | head -n 1
}

# The tuned-cache file parses and holds every key given (python3's json; else explain only).
check_file() {  # keys...
  local files=("$cache"/tuned/*.json)
  if [ ! -e "${files[0]}" ]; then bad "no tuned-cache file in $cache/tuned"; return; fi
  [ ${#files[@]} -eq 1 ] || bad "${#files[@]} tuned-cache files in $cache/tuned (expected one, this device's)"
  [ -n "$py" ] || { echo "  (no python3: the JSON was checked through explain only)"; return; }
  "$py" - "${files[0]}" "$@" <<'EOF' || fail=1
import json, sys
path, keys = sys.argv[1], sys.argv[2:]
try:
    doc = json.load(open(path))
except Exception as e:
    print(f"FAIL: {path} does not parse: {e}"); sys.exit(1)
entries = doc.get("entries", {})
missing = [k for k in keys if k not in entries]
if doc.get("schema_version") != 2 or missing:
    print(f"FAIL: {path}: schema_version {doc.get('schema_version')}, missing entries: {missing}"); sys.exit(1)
print(f"  {path}: parses, {len(entries)} entries, all {len(keys)} expected keys present")
EOF
}

leftovers() {
  local t
  t="$(find "$cache" -name '*.tmp.*' 2>/dev/null)"
  [ -z "$t" ] || echo "$t"
}

# ---- phase 1 ------------------------------------------------------------------
shapes=(rms:bf16:512x1000 rms:bf16:512x2056 rms:fp16:512x3000 ln:bf16:512x1536 rms:bf16:512x4096:res
        ln:fp16:256x2880 rms:bf16:2048x128:heads=16 rms:bf16:256x7168:quant=e4m3/group128)
echo "phase 1: ${#shapes[@]} tunes at once into $cache"
t0=$(date +%s)
pids=()
for i in "${!shapes[@]}"; do
  "$cli" tune --shape "${shapes[$i]}" --op fwd > "$work/logs/tune$i.log" 2>&1 &
  pids+=($!)
done
ok=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  if [ $rc -eq 3 ]; then
    echo "SKIPPED: $(grep -m1 -i gpu "$work/logs/tune$i.log")"
    exit 77
  fi
  if [ $rc -eq 0 ]; then ok=$((ok + 1)); else bad "tune ${shapes[$i]} exited $rc (log: $work/logs/tune$i.log)"; tail -n 5 "$work/logs/tune$i.log"; fi
done
echo "  $ok/${#shapes[@]} tunes ok in $(( $(date +%s) - t0 )) s"
keys=()
for s in "${shapes[@]}"; do
  k="$(explain_field "$s" fwd key)"
  src="$(explain_field "$s" fwd source)"
  keys+=("$k")
  [ "$src" = "user cache" ] || bad "$s: explain says source '$src', not 'user cache' (key $k)"
done
check_file "${keys[@]}"
lo="$(leftovers)"
[ -z "$lo" ] || bad "temporary files left behind: $lo"

# ---- phase 2 ------------------------------------------------------------------
big=rms:bf16:4096x5120
echo "phase 2: $big --op both, killed with SIGKILL midway"
kill_after() {  # log, seconds or "fwd-stored"
  local log="$1" when="$2" pid waited=0
  "$cli" tune --shape "$big" --op both > "$log" 2>&1 &
  pid=$!
  if [ "$when" = fwd-stored ]; then
    # The forward's winner line comes after its entry was merged into the file.
    until grep -q "winner" "$log" 2>/dev/null || ! kill -0 $pid 2>/dev/null || [ $waited -ge 600 ]; do
      sleep 0.2; waited=$((waited + 1))
    done
    sleep 0.5
  else
    sleep "$when"
  fi
  if kill -0 $pid 2>/dev/null; then
    kill -9 $pid
    wait $pid 2>/dev/null
    echo "  killed the tune ($when; log $log)"
  else
    wait $pid
    echo "  the tune finished before the kill ($when): exit $?"
  fi
  # Whatever the kill interrupted, the file is the old one or a whole new one.
  check_file "${keys[@]}"
}
kill_after "$work/logs/kill1.log" 3
kill_after "$work/logs/kill2.log" fwd-stored
"$cli" tune --shape "$big" --op both > "$work/logs/retune.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { bad "the tune after the kills exited $rc (log: $work/logs/retune.log)"; tail -n 5 "$work/logs/retune.log"; }
for op in fwd bwd; do
  k="$(explain_field "$big" $op key)"
  src="$(explain_field "$big" $op source)"
  keys+=("$k")
  [ "$src" = "user cache" ] || bad "$big $op: explain says source '$src', not 'user cache'"
done
check_file "${keys[@]}"
# A killed process may leave its own temporary files (cleaned by nobody, used by
# nobody); the finished ones leave none.
echo "  temporary files after the kills (from the killed processes only): $(leftovers | wc -l)"
"$cli" cache list > "$work/logs/cache-list.log" 2>&1 || bad "normjit cache list failed after the kills"

if [ $fail -eq 0 ]; then
  echo "concurrent_tune: ok (${#keys[@]} entries; logs in $work/logs)"
else
  echo "concurrent_tune: FAILED (logs in $work/logs)"
fi
exit $fail
