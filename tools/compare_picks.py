#!/usr/bin/env python3
"""Compare the config two normjit builds resolve for every shape recorded in
autotune_cache/model/*.json, on each shipped device's facts (no GPU: `normjit
explain --device`). An edit meant to leave the config model's picks alone
(a new kernel path the model excludes, say) should print `differences 0`.

  python3 tools/compare_picks.py OLD/normjit NEW/normjit [--devices SLUG ...]
"""
import argparse
import concurrent.futures
import glob
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def recorded_shapes():
    shapes = set()
    for fn in glob.glob(os.path.join(ROOT, "autotune_cache", "model", "*.json")):
        with open(fn) as f:
            d = json.load(f)
        for r in d.get("rows", []) if isinstance(d, dict) else []:
            if "shape" in r:
                shapes.add(("bwd" if "bwd" in r.get("op", "") else "fwd", r["shape"]))
    return sorted(shapes)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--devices", nargs="+", default=["nvidia-h200.cc90.132sm.60mib",
                                                     "nvidia-h100-80gb-hbm3.cc90.132sm.50mib"])
    a = p.parse_args()
    cache = tempfile.mkdtemp()

    def pick(binary, op, shape, dev):
        r = subprocess.run([binary, "--cache-dir", cache, "explain", "--op", op, "--shape", shape, "--device", dev],
                           capture_output=True, text=True)
        for line in r.stdout.splitlines():
            if line.strip().startswith("config:"):
                return line.split()[1]
        return "error: " + r.stderr.strip()[-200:]

    def both(t):
        op, shape = t
        return [(op, shape, dev, pick(a.old, op, shape, dev), pick(a.new, op, shape, dev)) for dev in a.devices]

    shapes = recorded_shapes()
    diff = 0
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        for rows in ex.map(both, shapes):
            for op, shape, dev, x, y in rows:
                if x != y:
                    diff += 1
                    print(f"{op} {shape} {dev}: {x} -> {y}")
    print(f"{len(shapes)} shapes x {len(a.devices)} devices, differences {diff}")


if __name__ == "__main__":
    main()
