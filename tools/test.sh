#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every ctest suite.
# GPU suites (label "gpu") skip where no GPU is usable; the reason is printed.
# Then the Python suites (tests/python) over the built libnormjit_c.so, with
# the first of python3, /usr/bin/python3 that has pytest; skips print why.
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
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c "import pytest" 2>/dev/null; then py="$p"; break; fi
done
if [ -n "$py" ]; then
  NORMJIT_LIBRARY="$build/libnormjit_c.so" PYTHONPATH="$root/tools/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$py" -m pytest -q -rs -p no:cacheprovider "$root/tests/python"
else
  echo "Python tests skipped: no python3 with pytest (tools/setup.sh installs python3-pytest)"
fi
