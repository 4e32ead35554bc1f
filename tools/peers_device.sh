#!/usr/bin/env bash
# The peers of tools/compare.py (Liger, Quack and the CUTLASS DSL wheels
# that ../shared/peers/fetch_wheels.sh fetched into .peers/) onto a GPU
# machine, one part a device call. A call carries at most 64 MiB, the tree
# (about 19 MiB) included, and one part of the DSL wheel is 44 MiB, so the
# two parts and the small wheels travel in three calls, issued back to back
# on one warm machine (it is given back after about 30 s idle; a fresh one
# starts over from call 1):
#   call 1, carry [".peers/a"]:       bash tools/peers_device.sh stash .peers/a
#   call 2, carry [".peers/b"]:       bash tools/peers_device.sh stash .peers/b
#   call 3, carry [".peers/small", and the build]:
#     eval "$(bash tools/peers_device.sh install .peers/small)"; python3 tools/compare.py ...
# When the tree has grown so that a 44 MiB part no longer fits beside it
# (session 28: 21.6 MiB of tracked files), split each part in two first,
# here: `split -n 2 -d .peers/a/W.part-a .peers/a1/W.part-a.` then move the
# .01 piece to .peers/a2 (the same for b, with the .sha256 beside a piece),
# and stash a1, a2, b1, b2 in four calls; `install` joins the pieces.
# `install` joins the parts, checks each joined wheel against its .sha256,
# installs every wheel into /tmp/peers (once a machine) and prints the
# PYTHONPATH to use.
set -euo pipefail
parts=/root/peer-parts
usage="usage: peers_device.sh stash DIR | install DIR"
[ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
case "$1" in
  stash)
    mkdir -p "$parts"
    cp "$2"/* "$parts"/ ;;
  install)
    if [ ! -d /tmp/peers/quack ]; then
      mkdir -p "$parts"
      cp "$2"/* "$parts"/
      cd "$parts"
      for p in *.part-[ab].00; do  # parts stashed in pieces (split -n 2 -d)
        [ -e "$p" ] || continue
        cat "${p%.00}".[0-9][0-9] > "${p%.00}" && rm "${p%.00}".[0-9][0-9]
      done
      for a in *.part-a; do
        w=${a%.part-a}
        [ -f "$w.part-b" ] || { echo "peers_device.sh: $w.part-b was not stashed (call 2)" >&2; exit 3; }
        cat "$a" "$w.part-b" > "$w"
        echo "$(cat "$w.sha256")  $w" | sha256sum -c --quiet >&2 || { echo "peers_device.sh: $w: checksum mismatch" >&2; exit 3; }
      done
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/peers ./*.whl >&2
    fi
    echo "export PYTHONPATH=/tmp/peers:/tmp/peers/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}" ;;
  *)
    echo "$usage" >&2
    exit 2 ;;
esac
