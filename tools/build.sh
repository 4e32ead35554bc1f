#!/usr/bin/env bash
# Configures and builds normjit (Release) into ${NORMJIT_BUILD_DIR:-build}.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
extra=()
[ -n "${CUDA_HOME:-}" ] && extra+=("-DNORMJIT_CUDA_INCLUDE_DIR=$CUDA_HOME/include")
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${extra[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
