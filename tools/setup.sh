#!/usr/bin/env bash
# Installs what building normjit needs, from Debian's packages. Idempotent:
# does nothing when everything is present. The CUDA toolkit is needed only for
# cuda.h and nvrtc.h (set CUDA_HOME if it is not in /usr/local/cuda).
set -euo pipefail

pkgs=(cmake g++ make libfmt-dev nlohmann-json3-dev doctest-dev libcli11-dev libxxhash-dev python3-pytest python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "normjit setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda_inc="${CUDA_HOME:-/usr/local/cuda}/include"
if [ ! -f "$cuda_inc/cuda.h" ] || [ ! -f "$cuda_inc/nvrtc.h" ]; then
  echo "normjit setup: cuda.h and nvrtc.h not found in $cuda_inc; install the CUDA toolkit or set CUDA_HOME" >&2
  exit 1
fi
