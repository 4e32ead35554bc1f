#!/usr/bin/env python3
"""Plot tools/compare.py results: GB/s (or SOL%) against N per implementation.

One figure for the GPU of the JSON: a row of panels per family (norm,
dtype) that has at least two values of N, forward on the left, backward on
the right. For each N the shape with the largest M*N is plotted (decode
shapes with M < 256 are left out: they measure latency, not bandwidth).
Kernel times as compare.py measured them; the same-size device copy (SOL)
is the dashed line. Points of an implementation that failed its
correctness check are drawn hollow. Needs matplotlib, not a GPU.

    python3 tools/plot.py [docs/results/compare.json] [--out docs/results/compare.png] [--metric gbps|sol]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_TOOLS = str(Path(__file__).resolve().parent)
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)
from compare_report import DEFAULT_JSON, DIRECTIONS, IMPL_TITLES, implementations, load_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PNG = ROOT / "docs" / "results" / "compare.png"

NORM_TITLES = {"rms": "RMSNorm", "ln": "LayerNorm"}
DIRECTION_TITLES = {"fwd": "forward", "bwd": "backward"}
IMPL_STYLE = {  # colour, marker
    "normjit": ("tab:red", "o"),
    "eager": ("tab:blue", "s"),
    "compile": ("tab:green", "^"),
    "liger": ("tab:purple", "D"),
    "quack": ("tab:orange", "v"),
}
MIN_M = 256  # rows with fewer rows than this are decode (latency) shapes


def families(rows: list[dict], min_m: int = MIN_M) -> dict[tuple, dict[str, list[dict]]]:
    """(norm, dtype) -> {direction: rows sorted by N}, one row per N (the
    largest M*N), for families with two or more N values."""
    groups: dict[tuple, dict[str, dict[int, dict]]] = {}
    for r in rows:
        if r["M"] < min_m:
            continue
        per_n = groups.setdefault((r["norm"], r["dtype"]), {}).setdefault(r["direction"], {})
        old = per_n.get(r["N"])
        if old is None or r["M"] * r["N"] > old["M"] * old["N"]:
            per_n[r["N"]] = r
    out = {}
    for key, dirs in groups.items():
        if max(len(v) for v in dirs.values()) >= 2:
            out[key] = {d: [v[n] for n in sorted(v)] for d, v in dirs.items()}
    order = sorted(out, key=lambda k: (k[0] != "rms", k[1] != "bf16", k[1]))
    return {k: out[k] for k in order}


def _value(entry: dict, metric: str):
    return entry.get("sol_pct" if metric == "sol" else "gbps")


def plot(doc: dict, out: Path, metric: str = "gbps") -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    fams = families(doc.get("rows", []))
    names = implementations(doc)
    gpu = doc.get("meta", {}).get("gpu") or "unknown GPU"
    nrows = max(1, len(fams))
    fig, axes = plt.subplots(nrows, 2, figsize=(13, 4.3 * nrows + 0.8), squeeze=False, layout="constrained")
    what = "SOL% (same-size device copy = 100%)" if metric == "sol" else \
        "GB/s of the minimal traffic; dashed: same-size device copy (SOL)"
    # Files of the first schema timed with triton's do_bench (host time included).
    how = "kernel time (torch.profiler, L2 flushed)" if doc.get("schema") == "normjit-compare/2" else \
        "do_bench time (host included)"
    fig.suptitle(f"normjit vs {', '.join(IMPL_TITLES.get(n, n) for n in names if n != 'normjit')} on {gpu}\n"
                 f"{how}; {what}", fontsize=11)
    if not fams:
        for ax in axes[0]:
            ax.text(0.5, 0.5, "no family with two or more N values", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()

    for axrow, ((norm, dtype), dirs) in zip(axes, fams.items()):
        for ax, d in zip(axrow, DIRECTIONS):
            rows = dirs.get(d, [])
            if not rows:
                ax.set_axis_off()
                continue
            Ns = [r["N"] for r in rows]
            for name in names:
                colour, marker = IMPL_STYLE.get(name, (None, "x"))
                pts = [(r["N"], _value(e, metric), e.get("status") == "failed_check" or e.get("correct") is False)
                       for r in rows if (e := r.get("impls", {}).get(name)) and _value(e, metric)]
                if not pts:
                    continue
                line = ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, marker=marker,
                               label=IMPL_TITLES.get(name, name))[0]
                bad = [p for p in pts if p[2]]
                if bad:
                    line.set_label(line.get_label() + " (hollow: failed check)")
                    ax.plot([p[0] for p in bad], [p[1] for p in bad], linestyle="none", marker=marker,
                            markersize=9, markerfacecolor="white", markeredgecolor=colour)
            if metric == "sol":
                ax.axhline(100.0, color="black", linestyle="--", linewidth=1.2, label="copy (SOL)")
            else:
                copy = [(r["N"], r["copy_gbps"]) for r in rows if r.get("copy_gbps")]
                if copy:
                    ax.plot([c[0] for c in copy], [c[1] for c in copy], color="black", linestyle="--",
                            linewidth=1.2, label="copy (SOL)")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(Ns))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([str(v) for v in Ns], rotation=45 if len(Ns) > 5 else 0, fontsize=8)
            ax.set_xlabel("N (hidden size); M*N the largest of the suite at that N")
            ax.set_ylabel("SOL %" if metric == "sol" else "GB/s")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{NORM_TITLES.get(norm, norm)} {dtype} {DIRECTION_TITLES.get(d, d)}", fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="best")

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(fams)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot GB/s or SOL% against N from tools/compare.py's JSON.")
    p.add_argument("json", nargs="?", default=str(DEFAULT_JSON), help="results (default: docs/results/compare.json)")
    p.add_argument("--out", default=str(DEFAULT_PNG), help="PNG to write (default: docs/results/compare.png)")
    p.add_argument("--metric", choices=("gbps", "sol"), default="gbps", help="y axis (default: gbps)")
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        print(f"plot.py: matplotlib is required ({exc}).", file=sys.stderr)
        return 3
    doc = load_results(args.json, "plot.py")
    if doc is None:
        return 2
    n = plot(doc, Path(args.out), args.metric)
    if n == 0:
        print("plot.py: no family has two or more N values; wrote an empty figure", file=sys.stderr)
    print(f"wrote {args.out} ({n} families)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
