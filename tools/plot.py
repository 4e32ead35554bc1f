#!/usr/bin/env python3
"""Plot tools/compare.py results: GB/s against N for each implementation.

One subplot per family (norm, dtype, direction, M) that has at least two
values of N; the same-size device copy (the SOL bandwidth) is the dashed
line. Points of an implementation that failed its correctness check are
drawn hollow.

    python3 tools/plot.py [docs/results/compare.json] [--out docs/results/compare.png]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "docs" / "results" / "compare.json"
DEFAULT_PNG = ROOT / "docs" / "results" / "compare.png"

NORM_TITLES = {"rms": "RMSNorm", "ln": "LayerNorm"}
DIRECTION_TITLES = {"fwd": "forward", "bwd": "backward"}
IMPL_TITLES = {"normjit": "normjit", "eager": "torch eager", "compile": "torch.compile", "liger": "Liger"}
IMPL_STYLE = {  # colour, marker
    "normjit": ("tab:red", "o"),
    "eager": ("tab:blue", "s"),
    "compile": ("tab:green", "^"),
    "liger": ("tab:purple", "D"),
}
DIRECTION_ORDER = {"fwd": 0, "bwd": 1}


def families(rows: list[dict]) -> dict[tuple, list[dict]]:
    """(norm, dtype, direction, M) -> rows sorted by N, for families with >= 2 N values."""
    groups: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        key = (r["norm"], r["dtype"], r["direction"], r["M"])
        groups.setdefault(key, {})[r["N"]] = r
    out = {k: [v[n] for n in sorted(v)] for k, v in groups.items() if len(v) >= 2}
    order = sorted(out, key=lambda k: (k[0] != "rms", k[1], -k[3], DIRECTION_ORDER.get(k[2], 9)))
    return {k: out[k] for k in order}


def implementations(doc: dict) -> list[str]:
    names = list(doc.get("meta", {}).get("implementations") or [])
    for r in doc.get("rows", []):
        for n in r.get("impls", {}):
            if n not in names:
                names.append(n)
    return names


def family_title(key: tuple) -> str:
    norm, dtype, direction, M = key
    return f"{NORM_TITLES.get(norm, norm)} {dtype} {DIRECTION_TITLES.get(direction, direction)}, M={M}"


def plot(doc: dict, out: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fams = families(doc.get("rows", []))
    names = implementations(doc)
    gpu = doc.get("meta", {}).get("gpu") or "unknown GPU"
    n = len(fams)
    ncols = 2 if n > 1 else 1
    nrows = max(1, math.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.3 * nrows + 0.6),
                             squeeze=False, layout="constrained")
    fig.suptitle(f"normjit vs PyTorch eager, torch.compile and Liger-Kernel on {gpu}\n"
                 "GB/s of the minimal traffic; dashed: same-size device copy (SOL)", fontsize=11)
    if n == 0:
        axes[0][0].text(0.5, 0.5, "no family with two or more N values at one M",
                        ha="center", va="center", transform=axes[0][0].transAxes)
        axes[0][0].set_axis_off()
    for ax in axes.flat[n:]:
        ax.set_axis_off()

    for ax, (key, rows) in zip(axes.flat, fams.items()):
        Ns = [r["N"] for r in rows]
        for name in names:
            colour, marker = IMPL_STYLE.get(name, (None, "x"))
            pts = [(r["N"], e["gbps"], e.get("correct") is not False)
                   for r in rows if (e := r.get("impls", {}).get(name)) and e.get("gbps")]
            if not pts:
                continue
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker,
                           label=IMPL_TITLES.get(name, name))[0]
            bad = [p for p in pts if not p[2]]
            if bad:
                line.set_label(line.get_label() + " (hollow: failed check)")
                ax.plot([p[0] for p in bad], [p[1] for p in bad], linestyle="none", marker=marker,
                        markersize=9, markerfacecolor="white", markeredgecolor=colour)
        copy = [(r["N"], r["copy_gbps"]) for r in rows if r.get("copy_gbps")]
        if copy:
            ax.plot([c[0] for c in copy], [c[1] for c in copy], color="black", linestyle="--",
                    linewidth=1.2, label="copy (SOL)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(Ns))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(v) for v in Ns], rotation=45 if len(Ns) > 6 else 0)
        ax.set_xlabel("N (hidden size)")
        ax.set_ylabel("GB/s")
        ax.set_ylim(bottom=0)
        ax.set_title(family_title(key), fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot GB/s against N from tools/compare.py's JSON.")
    p.add_argument("json", nargs="?", default=str(DEFAULT_JSON), help="results (default: docs/results/compare.json)")
    p.add_argument("--out", default=str(DEFAULT_PNG), help="PNG to write (default: docs/results/compare.png)")
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        print(f"plot.py: matplotlib is required ({exc}).", file=sys.stderr)
        return 3
    try:
        with open(args.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"plot.py: cannot read {args.json}: {exc}", file=sys.stderr)
        return 2
    n = plot(doc, Path(args.out))
    if n == 0:
        print("plot.py: no family has two or more N values at one M; wrote an empty figure", file=sys.stderr)
    print(f"wrote {args.out} ({n} panels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
