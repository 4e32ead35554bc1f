#!/usr/bin/env bash
# Tunes the shipped-cache grid (autotune_cache/grid/grid.json) on this GPU by local
# search, resuming where a previous run stopped (entries already current in
# the user cache are skipped; entries whose kernel changed are re-tuned), then
# copies the device's file to $OUT (or ./device-out) for autotune_cache/.
#   NORMJIT_BUILD_DIR   a build with the normjit CLI (default build/)
#   NORMJIT_CACHE_DIR   the user cache to tune into (default .njcache/)
#   GRID_SECONDS        stop starting new shapes after this long (default 500)
# Then, optionally, the held-out check against the tuned grid:
#   HELDOUT_SEED=1 bash tools/tune_grid.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
export NORMJIT_CACHE_DIR="${NORMJIT_CACHE_DIR:-$root/.njcache}"
out="${OUT:-$root/device-out}"
mkdir -p "$out" "$NORMJIT_CACHE_DIR/tuned"
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${GRID_SECONDS:-500}" != 0 ]; then
  ( time "$build/normjit" tune --grid "$root/autotune_cache/grid/grid.json" --max-seconds "${GRID_SECONDS:-500}" ) \
    > "$out/grid.log" 2>&1
  echo "grid rc=$?"; grep -v '^\[' "$out/grid.log" | tail -8
  cp "$NORMJIT_CACHE_DIR"/tuned/*.json "$out/"
fi
if [ -n "${HELDOUT_SEED:-}" ]; then
  # The grid just tuned plays the shipped cache; each held-out shape tunes in
  # a cache of its own (heldout.py), so no held-out entry helps another.
  NORMJIT_SHIPPED_CACHE_PATH="$NORMJIT_CACHE_DIR/tuned" timeout "${HELDOUT_TIMEOUT:-300}" \
    python3 "$root/tools/heldout.py" run --seed "$HELDOUT_SEED" --normjit "$build/normjit" \
    --out "$out/heldout-seed$HELDOUT_SEED.json" > "$out/heldout.log" 2>&1
  echo "heldout rc=$?"; tail -45 "$out/heldout.log"
fi
