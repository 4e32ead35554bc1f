#!/usr/bin/env bash
# Nsight Compute reports of forward kernels on a GPU machine, one per shape:
# speed of light, occupancy, launch, warp stalls, scheduler and instruction
# statistics of one launch of normjit_norm_fwd (after warm-up) inside
# `normjit bench`. Clocks are left alone (--clock-control none, METHOD.md).
#   NORMJIT_BUILD_DIR  the carried build holding `normjit` (default .dev)
#   SKIP               launches of the kernel to skip first (default 3)
#   NCU_OP             bwd: the backward instead, normjit_norm_bwd and its
#                      dweight finalize launch (one each; default fwd)
# Usage: bash tools/ncu_fwd.sh OUTDIR SHAPE...
#   e.g. bash tools/ncu_fwd.sh "$OUT" rms:bf16:8192x4096:quant=e4m3/group128
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cli="${NORMJIT_BUILD_DIR:-$root/.dev}/normjit"
out="$1"
shift
mkdir -p "$out"
for shape in "$@"; do
  name="$(echo "$shape" | tr ':/=' '___')"
  if [ "${NCU_OP:-fwd}" = bwd ]; then kernels='normjit_norm_bwd|normjit_dw_finalize' count=2; else kernels=normjit_norm_fwd count=1; fi
  ncu --clock-control none -k regex:"$kernels" --launch-skip "${SKIP:-3}" --launch-count "$count" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
    "$cli" bench --op "${NCU_OP:-fwd}" --no-check --reps 10 --shape "$shape" > "$out/ncu-$name.txt" 2>&1
  echo "$shape: rc=$? $(grep -E 'DRAM Throughput|Achieved Occupancy|Registers Per' "$out/ncu-$name.txt" | tr -s ' ' | tr '\n' ';')"
done
