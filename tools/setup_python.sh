#!/usr/bin/env bash
# Prepares the Python environment in which tools/test.sh builds and tests the
# wheel: a venv at $1 made by the first of python3, /usr/bin/python3 that can
# make one (tools/setup.sh installs python3-venv), seeing that Python's own
# packages (--system-site-packages: a torch already installed there is used
# as it is), with scikit-build-core and pytest from PyPI. Unless torch
# imports, torch 2.11.0 from PyPI without its nvidia-* dependencies (the CUDA
# toolkit's libraries stand in; three it lacks are installed) and
# transformers; when that fails the torch tests skip and say why.
# NORMJIT_WHEEL_TORCH=0: no torch install. Idempotent.
set -euo pipefail
venv="${1:?usage: tools/setup_python.sh VENV_DIR}"

if [ ! -x "$venv/bin/python" ]; then
  base=""
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c "import venv, ensurepip" 2>/dev/null; then base="$p"; break; fi
  done
  if [ -z "$base" ]; then
    echo "normjit setup_python: no python3 with the venv module (install python3-venv)" >&2
    exit 1
  fi
  "$base" -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)

has() { "$py" -c "import $1" 2>/dev/null; }
has scikit_build_core || "${pip[@]}" "scikit-build-core>=0.10"
has pytest || "${pip[@]}" pytest

if [ "${NORMJIT_WHEEL_TORCH:-1}" = 0 ]; then
  has torch || echo "normjit setup_python: NORMJIT_WHEEL_TORCH=0: torch not installed; the torch tests will skip"
  exit 0
fi
if ! has torch; then
  echo "normjit setup_python: installing torch 2.11.0 (PyPI, without its nvidia-* dependencies) into $venv"
  # The small dependencies first: pip checks no dependencies after a --no-deps install.
  if "${pip[@]}" filelock typing-extensions sympy networkx jinja2 fsspec numpy &&
     "${pip[@]}" --no-deps torch==2.11.0 nvidia-cusparselt-cu13==0.8.0 nvidia-nvshmem-cu13==3.4.5 \
       "nvidia-cufile==1.15.1.6.*"; then
    if ! err="$("$py" -c "import torch" 2>&1)"; then
      echo "normjit setup_python: torch was installed but does not import, so it is removed and the torch" \
           "tests will skip: $(printf '%s\n' "$err" | tail -n 1)"
      "$py" -m pip uninstall -q -y torch || true
    fi
  else
    echo "normjit setup_python: torch could not be installed; the torch tests will skip"
  fi
fi
if has torch && ! has transformers; then
  "${pip[@]}" transformers ||
    echo "normjit setup_python: transformers could not be installed; the Hugging Face tests will skip"
fi
