#!/usr/bin/env python3
"""Report side of tools/compare.py, standard library only: the best peer and
the ratio per row, geometric means, progress lines, failure lines and the
markdown report. As a script it renders the markdown of a compare.json again:

    python3 tools/compare_report.py [docs/results/compare.json] [--markdown OUT.md]

Ratio = the best peer's kernel time / normjit's, so > 1 means normjit is
faster. Only peers that passed the float64 check count as the best peer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "docs" / "results" / "compare.json"

IMPLS = ("normjit", "eager", "compile", "liger", "quack")
PEERS = IMPLS[1:]
IMPL_TITLES = {"normjit": "normjit", "eager": "torch eager", "compile": "torch.compile", "liger": "Liger",
               "quack": "Quack"}
DIRECTIONS = ("fwd", "bwd")
DIRECTION_TITLES = {"fwd": "Forward", "bwd": "Backward"}

# Entry statuses. ok: timed and correct; failed_check: timed, over tolerance
# (never the best peer); skipped: a known limit of the implementation;
# unavailable: not importable, or raised on this shape; error: the harness
# failed (e.g. the float64 reference ran out of memory).
OK, FAILED_CHECK, SKIPPED, UNAVAILABLE, ERROR = "ok", "failed_check", "skipped", "unavailable", "error"
CELL = {SKIPPED: "skip", UNAVAILABLE: "n/a", ERROR: "err"}


def timed_ok(entry: dict | None) -> bool:
    return bool(entry) and entry.get("status") == OK and bool(entry.get("us"))


def best_peer(row: dict) -> tuple[str | None, float | None]:
    """(name, us) of the fastest peer that passed its check, or (None, None)."""
    best = (None, None)
    for name, e in row.get("impls", {}).items():
        if name != "normjit" and timed_ok(e) and (best[1] is None or e["us"] < best[1]):
            best = (name, e["us"])
    return best


def annotate(row: dict) -> dict:
    """Sets row's best_peer, best_peer_us and ratio (peer us / normjit us)."""
    name, us = best_peer(row)
    nj = row.get("impls", {}).get("normjit")
    row["best_peer"], row["best_peer_us"] = name, us
    row["ratio"] = us / nj["us"] if us and timed_ok(nj) else None
    return row


def geomean(values) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def summarize(rows: list[dict]) -> dict:
    """Per direction: geomean of the ratio against the best peer, against
    each peer alone, and the rows where normjit is slower (ratio < 1)."""
    out = {}
    for d in DIRECTIONS:
        drows = [r for r in rows if r.get("direction") == d]
        if not drows:
            continue
        ratios = [r["ratio"] for r in drows if r.get("ratio")]
        per = {}
        for p in PEERS:
            vals = [r["impls"][p]["us"] / r["impls"]["normjit"]["us"] for r in drows
                    if timed_ok(r["impls"].get(p)) and timed_ok(r["impls"].get("normjit"))]
            if vals:
                per[p] = {"geomean": geomean(vals), "rows": len(vals)}
        below = sorted(({"label": r["label"], "ratio": r["ratio"], "peer": r["best_peer"]}
                        for r in drows if r.get("ratio") and r["ratio"] < 1.0), key=lambda b: b["ratio"])
        out[d] = {"vs_best": {"geomean": geomean(ratios), "rows": len(ratios)}, "vs": per, "below_1": below}
    return out


# ---------------------------------------------------------------- formatting


def fmt_us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def cell(entry: dict | None) -> str:
    """A kernel time, '*' after it when the check failed, else the status."""
    if not entry:
        return "-"
    status = entry.get("status")
    if status in (OK, FAILED_CHECK) and entry.get("us") is not None:
        return fmt_us(entry["us"]) + ("*" if status == FAILED_CHECK else "")
    return CELL.get(status, "-")


def md_table(header: list[str], body: list[list[str]], left: int = 1) -> list[str]:
    """Markdown table; the first `left` columns left-aligned, the rest right."""
    align = ["---"] * left + ["---:"] * (len(header) - left)
    return ["| " + " | ".join(r) + " |" for r in [header, align] + body]


def implementations(doc: dict) -> list[str]:
    names = [n for n in doc.get("meta", {}).get("implementations") or []]
    for r in doc.get("rows", []):
        names += [n for n in r.get("impls", {}) if n not in names]
    return names


def progress_line(row: dict, impls: list[str]) -> str:
    parts = []
    for n in impls:
        e = row["impls"].get(n, {})
        c = cell(e)
        if n == "normjit" and e.get("sol_pct") is not None:
            c += f" ({e['sol_pct']:.0f}% SOL)"
        parts.append(f"{n} {c}")
    tail = f"best peer {row['best_peer']}: {fmt_ratio(row.get('ratio'))}" if row.get("best_peer") else "no peer"
    return f"{row['label']:<21} {row['direction']}  " + " | ".join(parts) + f"  -> {tail}"


def failure_lines(rows: list[dict], unavailable: dict | None = None) -> list[str]:
    """One line per implementation and shape that was not timed and correct;
    forward and backward share a line when their reasons are the same.
    Implementations in `unavailable` (not importable: said once elsewhere)
    are left out."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        for name, e in r.get("impls", {}).items():
            status = e.get("status")
            if status == OK or (unavailable and e.get("reason") == unavailable.get(name)):
                continue
            reason = e.get("reason") or ""
            if status == FAILED_CHECK:
                errs = ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in (e.get("rel_err") or {}).items())
                reason = f"relative error {errs} over tolerance {r.get('tolerance', '?')}"
            seen.setdefault((r["label"], name, status, reason), []).append(r["direction"])
    return [f"{label} {name} ({', '.join(dirs)}): {status}: {reason}"
            for (label, name, status, reason), dirs in seen.items()]


def _header_lines(meta: dict) -> list[str]:
    v = meta.get("versions") or {}
    gpu = meta.get("gpu") or "unknown GPU"
    extra = []
    if meta.get("compute_capability"):
        extra.append("sm_" + str(meta["compute_capability"]).replace(".", ""))
    if meta.get("sm_count"):
        extra.append(f"{meta['sm_count']} SMs")
    if meta.get("l2_bytes"):
        extra.append(f"L2 {meta['l2_bytes'] / 2**20:.0f} MiB")
    versions = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    lines = [f"GPU: {gpu}" + (f" ({', '.join(extra)})" if extra else "") + ".",
             f"Versions: {versions or 'unknown'}.",
             f"normjit tune policy: {meta.get('tune_policy', '?')}; run {meta.get('date', '?')}, "
             f"{meta.get('elapsed_s', '?')} s."]
    for name, why in (meta.get("unavailable") or {}).items():
        lines.append(f"{IMPL_TITLES.get(name, name)} unavailable: {why}.")
    return lines


def _summary_line(s: dict, peers: list[str]) -> str:
    vb = s["vs_best"]
    text = f"Geometric mean of best peer / normjit: **{fmt_ratio(vb['geomean'])}** over {vb['rows']} shapes"
    per = [f"{IMPL_TITLES.get(p, p)} {fmt_ratio(s['vs'][p]['geomean'])} ({s['vs'][p]['rows']})"
           for p in peers if p in s["vs"]]
    return text + ("; against each peer: " + ", ".join(per) if per else "") + "."


def markdown(doc: dict) -> str:
    meta, rows = doc.get("meta", {}), doc.get("rows", [])
    impls = implementations(doc)
    peers = [n for n in impls if n != "normjit"]
    lines = ["# normjit against " + ", ".join(IMPL_TITLES.get(p, p) for p in peers), ""]
    lines += _header_lines(meta) + [""]
    if meta.get("timing"):
        lines += [meta["timing"], ""]
    lines += ["Times in us. Ratio = best peer / normjit (> 1: normjit faster); `*` = failed the float64 "
              "check (never the best peer); skip = a known limit; n/a = not importable or raised.", ""]
    summary = summarize(rows)
    for d in DIRECTIONS:
        drows = [r for r in rows if r.get("direction") == d]
        if not drows:
            continue
        lines += [f"## {DIRECTION_TITLES[d]} (kernel time)", "", _summary_line(summary[d], peers), ""]
        header = ["shape", "normjit us", "SOL%", "GB/s", "best peer", "peer us", "ratio"]
        header += [IMPL_TITLES.get(p, p) for p in peers] + ["copy us"]
        body = []
        for r in drows:
            nj = r["impls"].get("normjit", {})
            gb = nj.get("gbps")
            body.append([r["label"], cell(nj), fmt_pct(nj.get("sol_pct")),
                         "-" if gb is None else f"{gb:.0f}" if gb >= 100 else f"{gb:.1f}",
                         IMPL_TITLES.get(r.get("best_peer"), "-"), fmt_us(r.get("best_peer_us")),
                         fmt_ratio(r.get("ratio"))] + [cell(r["impls"].get(p)) for p in peers]
                        + [fmt_us(r.get("copy_us"))])
        lines += md_table(header, body, left=1) + [""]
        below = summary[d]["below_1"]
        lines.append(f"Below 1.0x ({len(below)}): " + (", ".join(
            f"{b['label']} {fmt_ratio(b['ratio'])} ({IMPL_TITLES.get(b['peer'], b['peer'])})" for b in below)
            if below else "none") + ".")
        lines.append("")

    by_label: dict[str, dict] = {}
    for r in rows:
        by_label.setdefault(r["label"], {})[r["direction"]] = r
    if any(e.get("host_us") is not None for r in rows for e in r.get("impls", {}).values()):
        lines += ["## Host time per call", "",
                  "Wall time of K back-to-back calls / K, torch.cuda.synchronize() before and after "
                  "(includes the GPU time when the GPU is the bottleneck); forward / forward+backward, us.", ""]
        body = []
        for label, dirs in by_label.items():
            row = [label]
            for n in impls:
                f = dirs.get("fwd", {}).get("impls", {}).get(n, {}).get("host_us")
                b = dirs.get("bwd", {}).get("impls", {}).get(n, {}).get("host_us")
                row.append("-" if f is None and b is None else f"{fmt_us(f)} / {fmt_us(b)}")
            body.append(row)
        lines += md_table(["shape"] + [IMPL_TITLES.get(n, n) for n in impls], body) + [""]

    fails = failure_lines(rows, meta.get("unavailable"))
    if fails:
        lines += ["## Not timed or failed the check", ""] + [f"- {f}" for f in fails] + [""]
    if meta.get("skipped_over_time"):
        lines += [f"Not run (over --max-seconds): {', '.join(meta['skipped_over_time'])}.", ""]
    return "\n".join(lines)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_results(path: str, prog: str) -> dict | None:
    """The JSON document at `path`, or None after saying on stderr why it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        print(f"{prog}: cannot read {path}: {exc}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render the markdown report of a tools/compare.py JSON.")
    p.add_argument("json", nargs="?", default=str(DEFAULT_JSON), help="results (default: docs/results/compare.json)")
    p.add_argument("--markdown", metavar="PATH", default=None, help="write here instead of printing")
    args = p.parse_args(argv)
    doc = load_results(args.json, "compare_report.py")
    if doc is None:
        return 2
    for r in doc.get("rows", []):
        annotate(r)
    text = markdown(doc)
    if args.markdown:
        write_text(Path(args.markdown), text)
        print(f"wrote {args.markdown}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
