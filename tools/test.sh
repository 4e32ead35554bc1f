#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every ctest suite.
# GPU suites (label "gpu") skip with the reason printed when no GPU is usable.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/tools/setup.sh"
bash "$root/tools/build.sh"
cd "${NORMJIT_BUILD_DIR:-$root/build}"
ctest --output-on-failure "$@"
