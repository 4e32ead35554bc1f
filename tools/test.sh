#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every ctest suite.
# GPU suites (label "gpu") skip where no GPU is usable; the reason is printed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${NORMJIT_BUILD_DIR:-$root/build}"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh"
cd "$build"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
ctest --output-on-failure "$@" | tee "$log"
if grep -q "normjit_gpu_tests (Skipped)" "$log"; then
  echo "GPU tests skipped: $("$build/tests/normjit_gpu_tests" 2>&1 | head -n 1)"
fi
