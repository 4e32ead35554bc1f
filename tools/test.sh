#!/usr/bin/env bash
# The test command: installs dependencies, builds, runs every ctest suite.
# GPU suites (label "gpu") skip where no GPU is usable; the reason is printed.
# Then the Python suites (tests/python) over the built libnormjit_c.so, with
# the first of python3, /usr/bin/python3 that has pytest; skips print why.
# Then the wheel: pip builds it through CMake (pyproject.toml, the libraries
# only) in a venv that tools/setup_python.sh prepares (scikit-build-core,
# pytest, torch + transformers for the CPU-side torch tests), installs it
# there, and runs tests/python against the installed package.
# NORMJIT_SKIP_WHEEL=1 leaves the wheel out.
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

if [ "${NORMJIT_SKIP_WHEEL:-0}" = 1 ]; then
  echo "Wheel skipped: NORMJIT_SKIP_WHEEL=1"
  exit 0
fi
venv="$build/wheel-venv"
bash "$root/tools/setup_python.sh" "$venv"
rm -rf "$build/wheelhouse"
echo "Building the wheel (pip wheel $root)"
start=$SECONDS
# The venv first on PATH: its python3 is the one CMake finds torch with.
PATH="$venv/bin:$PATH" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$venv/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$build/wheelhouse" \
  --config-settings=build-dir="$build/wheel-build" "$root"
wheel=("$build"/wheelhouse/normjit-*.whl)
echo "Built ${wheel[0]##*/} in $((SECONDS - start)) s"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "${wheel[0]}"
# Outside the checkout and without NORMJIT_LIBRARY/PYTHONPATH: the installed package, its bundled library.
(cd "$build/wheelhouse" &&
  env -u NORMJIT_LIBRARY -u PYTHONPATH NORMJIT_TEST_INSTALLED=1 \
    "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/tests/python")
