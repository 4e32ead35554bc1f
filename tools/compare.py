#!/usr/bin/env python3
"""Compare normjit with PyTorch eager, torch.compile and Liger-Kernel.

One process, one GPU, the same tensors for every implementation. Forward and
backward are timed with triton.testing.do_bench (median, L2 flushed before
each run); a device copy of the same number of bytes, timed the same way in
the same run, gives the speed of light (SOL) for each shape and direction.

Usage (from the repository root, with the normjit Python package on
PYTHONPATH and NORMJIT_LIBRARY naming libnormjit_c.so):

    python3 tools/compare.py                      # the full default suite
    python3 tools/compare.py --quick              # a few shapes
    python3 tools/compare.py --shapes rms:bf16:8192x4096,ln:fp16:4096x1024
    python3 tools/compare.py --impl normjit,eager --json /tmp/out.json

Shapes are NORM:DTYPE:MxN with NORM rms or ln and DTYPE fp32, bf16 or fp16,
or a suite name (default, quick). Exit status: 0 when done, 1 when normjit
failed a correctness check or raised on some shape, 2 on bad arguments,
3 when torch, CUDA or triton is missing.

This module imports only the standard library at load time, so its helpers
(shape parsing, byte counts, table formatting) can be used without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "docs" / "results" / "compare.json"

IMPLS = ("normjit", "eager", "compile", "liger")
IMPL_TITLES = {"normjit": "normjit", "eager": "torch eager", "compile": "torch.compile", "liger": "Liger"}
NORMS = {"rms": "RMSNorm", "ln": "LayerNorm"}
DTYPE_SIZE = {"fp32": 4, "bf16": 2, "fp16": 2}
# Relative error (max |out - ref| / max |ref|) allowed against the float64 reference.
TOLERANCE = {"fp32": 1e-4, "fp16": 4e-3, "bf16": 3e-2}
EPS = {"rms": 1e-6, "ln": 1e-5}
DIRECTIONS = ("fwd", "bwd")

EXIT_NORMJIT_FAILED = 1
EXIT_NO_GPU_STACK = 3


@dataclasses.dataclass(frozen=True)
class Case:
    norm: str  # "rms" or "ln"
    dtype: str  # "fp32", "bf16" or "fp16"; weight (and bias) have the same dtype
    M: int
    N: int

    @property
    def label(self) -> str:
        return f"{self.norm}:{self.dtype}:{self.M}x{self.N}"

    @property
    def eps(self) -> float:
        return EPS[self.norm]

    @property
    def has_bias(self) -> bool:
        return self.norm == "ln"


def _suite_default() -> list[str]:
    shapes = [f"rms:{dt}:32768x{n}" for dt in ("fp32", "bf16") for n in (1024, 2048, 4096, 8192)]
    shapes += ["rms:bf16:32768x128", "rms:bf16:8192x4096"]  # Qwen3 QK-norm, hidden
    shapes += [f"ln:fp16:4096x{n}" for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)]
    shapes += ["rms:bf16:4096x65536", "rms:bf16:1024x131072"]  # wide rows
    shapes += ["rms:bf16:1x4096", "rms:bf16:32x8192"]  # decode
    return shapes


def _suite_quick() -> list[str]:
    # Two families with several N (for the plot), the headline shapes, one decode.
    return [
        "rms:bf16:32768x128",
        "rms:bf16:32768x1024",
        "rms:bf16:32768x4096",
        "rms:fp32:32768x4096",
        "rms:bf16:8192x4096",
        "ln:fp16:4096x1024",
        "ln:fp16:4096x4096",
        "rms:bf16:1x4096",
    ]


SUITES = {"default": _suite_default, "quick": _suite_quick}


def parse_case(text: str) -> Case:
    """Parse one NORM:DTYPE:MxN shape, e.g. rms:bf16:8192x4096."""
    parts = text.strip().lower().split(":")
    if len(parts) != 3:
        raise ValueError(f"shape '{text}' is not NORM:DTYPE:MxN (e.g. rms:bf16:8192x4096)")
    norm, dtype, dims = parts
    if norm not in NORMS:
        raise ValueError(f"shape '{text}': norm '{norm}' is not one of {', '.join(NORMS)}")
    if dtype not in DTYPE_SIZE:
        raise ValueError(f"shape '{text}': dtype '{dtype}' is not one of {', '.join(DTYPE_SIZE)}")
    mn = dims.split("x")
    if len(mn) != 2 or not all(p.isdigit() for p in mn):
        raise ValueError(f"shape '{text}': '{dims}' is not MxN")
    M, N = int(mn[0]), int(mn[1])
    if M < 1 or N < 1:
        raise ValueError(f"shape '{text}': M and N must be positive")
    return Case(norm, dtype, M, N)


def parse_shapes(specs: list[str] | str) -> list[Case]:
    """Suite names and shapes, comma- or space-separated; duplicates dropped, order kept."""
    if isinstance(specs, str):
        specs = [specs]
    cases: list[Case] = []
    for spec in specs:
        for token in spec.replace(",", " ").split():
            if token.lower() in SUITES:
                found = [parse_case(s) for s in SUITES[token.lower()]()]
            else:
                found = [parse_case(token)]
            cases += [c for c in found if c not in cases]
    if not cases:
        raise ValueError("no shapes given")
    return cases


def parse_impls(specs: list[str] | str | None) -> list[str]:
    if not specs:
        return list(IMPLS)
    if isinstance(specs, str):
        specs = [specs]
    names = [t.lower() for spec in specs for t in spec.replace(",", " ").split()]
    bad = [n for n in names if n not in IMPLS]
    if bad:
        raise ValueError(f"unknown implementation(s) {', '.join(bad)}; choose from {', '.join(IMPLS)}")
    return [n for n in IMPLS if n in names]  # table order


def traffic_bytes(norm: str, direction: str, M: int, N: int, dtype: str) -> int:
    """Minimal DRAM traffic, one definition for every implementation.

    x, y, dy, dx, weight, bias and their grads have the dtype's size; the
    per-row statistics are fp32 (rstd; LayerNorm also mean).
    forward:  x read + y write + weight read (+ bias read) + stats write
    backward: dy, x read + dx write + weight read + dweight write
              (+ dbias write) + stats read
    """
    if norm not in NORMS or direction not in DIRECTIONS or dtype not in DTYPE_SIZE:
        raise ValueError(f"bad traffic query {norm}/{direction}/{dtype}")
    s = DTYPE_SIZE[dtype]
    stats = 4 * M * (2 if norm == "ln" else 1)
    if direction == "fwd":
        params = N * s * (2 if norm == "ln" else 1)
        return M * N * (s + s) + params + stats
    params = N * s * (3 if norm == "ln" else 2)
    return M * N * (s + s + s) + params + stats


def gbps(nbytes: int, us: float | None) -> float | None:
    return None if not us else nbytes / us / 1e3


def speedup_of(row: dict, impls: list[str]) -> tuple[str | None, float | None]:
    """(best other implementation, its us / normjit us); others that failed
    the correctness check or did not run are left out."""
    nj = row["impls"].get("normjit", {})
    best, best_us = None, None
    for name in impls:
        if name == "normjit":
            continue
        e = row["impls"].get(name, {})
        if e.get("us") and e.get("correct"):
            if best_us is None or e["us"] < best_us:
                best, best_us = name, e["us"]
    if not nj.get("us") or best_us is None:
        return best, None
    return best, best_us / nj["us"]


def geomean_speedups(rows: list[dict], impls: list[str]) -> dict:
    """Geometric mean of (other us / normjit us) per direction and other implementation."""
    out: dict = {}
    for direction in DIRECTIONS:
        for name in impls:
            if name == "normjit":
                continue
            ratios = []
            for r in rows:
                if r["direction"] != direction:
                    continue
                a, b = r["impls"].get("normjit", {}), r["impls"].get(name, {})
                if a.get("us") and b.get("us") and a.get("correct") and b.get("correct"):
                    ratios.append(b["us"] / a["us"])
            if ratios:
                g = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                out.setdefault(direction, {})[name] = {"geomean": g, "rows": len(ratios)}
    return out


# ---------------------------------------------------------------- table


def _cell(entry: dict) -> str:
    if not entry:
        return f"{'-':>8} {'':>6} {'':>5}"
    if entry.get("us") is None:
        return f"{'n/a' if entry.get('unavailable') else 'error':>8} {'':>6} {'':>5}"
    flag = "*" if not entry.get("correct") else " "
    bw = f"{entry['gbps']:6.0f}" if entry["gbps"] >= 100 else f"{entry['gbps']:6.1f}"
    sol = f"{entry['sol_pct']:5.1f}" if entry.get("sol_pct") is not None else f"{'-':>5}"
    return f"{entry['us']:7.1f}{flag} {bw} {sol}"


def table_header(impls: list[str]) -> str:
    top = f"{'':<15} {'':<9} {'':<4} {'':<3} "
    sub = f"{'shape':<15} {'norm':<9} {'dt':<4} {'dir':<3} "
    for name in impls:
        top += f"| {IMPL_TITLES[name]:<22}"
        sub += f"| {'us':>8} {'GB/s':>6} {'SOL%':>5} "
    top += "|"
    sub += f"| {'copy us':>8} {'speedup':>8}  best other"
    return top + "\n" + sub


def table_row(row: dict, impls: list[str]) -> str:
    shape = f"{row['M']}x{row['N']}"
    line = f"{shape:<15} {NORMS[row['norm']]:<9} {row['dtype']:<4} {row['direction']:<3} "
    for name in impls:
        line += f"| {_cell(row['impls'].get(name, {}))} "
    sp = f"{row['speedup']:.2f}x" if row.get("speedup") else "-"
    copy = f"{row['copy_us']:.1f}" if row.get("copy_us") else "-"
    line += f"| {copy:>8} {sp:>8}  {row.get('best_other') or '-'}"
    return line


def format_table(rows: list[dict], impls: list[str]) -> str:
    return "\n".join([table_header(impls)] + [table_row(r, impls) for r in rows])


def failure_lines(rows: list[dict], impls: list[str]) -> list[str]:
    """One line per implementation error or correctness failure."""
    lines = []
    for r in rows:
        for name in impls:
            e = r["impls"].get(name, {})
            where = f"{r['label']} {r['direction']} {name}"
            if e.get("error"):
                lines.append(f"{where}: {e['error']}")
            elif e.get("correct") is False:
                errs = ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in e.get("max_rel_err", {}).items())
                lines.append(f"{where}: max relative error {errs} over tolerance {TOLERANCE[r['dtype']]:.0e}")
    return lines


def write_json(path: Path, doc: dict) -> None:
    """Atomic write, so a run cut short leaves the previous shape's complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


def _finite_or_str(v: float):
    return v if math.isfinite(v) else str(v)


def _short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:400]


# ---------------------------------------------------------------- GPU side


class Runner:
    """Holds the imported GPU stack and the implementations' builders."""

    def __init__(self, impls: list[str], tune: bool, cache_dir: str | None):
        import torch
        import torch.nn.functional as F
        import triton
        from triton.testing import do_bench

        self.torch, self.F, self.triton, self.do_bench = torch, F, triton, do_bench
        self.dev = torch.device("cuda")
        self.tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.impls = impls
        self.unavailable: dict[str, str] = {}
        self.versions: dict[str, str | None] = {}

        # torch.compile: one static graph per shape (dynamo is reset per
        # shape; the limit only guards the forward/backward recompiles).
        dyn = torch._dynamo.config
        for knob in ("cache_size_limit", "recompile_limit"):
            if hasattr(dyn, knob):
                setattr(dyn, knob, max(getattr(dyn, knob), 256))
        # Donated buffers make a compiled backward refuse retain_graph=True,
        # which the backward timing needs; they only affect memory reuse.
        try:
            torch._functorch.config.donated_buffer = False
        except AttributeError:
            pass

        if "normjit" in impls:
            try:
                import normjit
                from normjit.torch import layer_norm as nj_ln
                from normjit.torch import rms_norm as nj_rms

                normjit.set_tune_policy("first" if tune else "never")
                if cache_dir:
                    normjit.set_cache_dir(cache_dir)
                self.nj_rms, self.nj_ln = nj_rms, nj_ln
                self.versions["normjit"] = getattr(normjit, "__version__", None)
            except Exception as exc:  # noqa: BLE001 - reported, the others still run
                self.unavailable["normjit"] = _short_error(exc)
        if "liger" in impls:
            try:
                import liger_kernel  # noqa: F401
                from liger_kernel.ops import LigerLayerNormFunction, LigerRMSNormFunction

                self.liger_rms, self.liger_ln = LigerRMSNormFunction, LigerLayerNormFunction
                try:
                    from importlib.metadata import version

                    self.versions["liger"] = version("liger-kernel")
                except Exception:  # noqa: BLE001
                    self.versions["liger"] = getattr(liger_kernel, "__version__", None)
            except Exception as exc:  # noqa: BLE001
                self.unavailable["liger"] = _short_error(exc)

    # Each builder returns fn(x, weight, bias) -> y for one case.
    def build(self, name: str, case: Case):
        F, N, eps = self.F, case.N, case.eps
        if name == "normjit":
            if case.norm == "rms":
                return lambda x, weight, bias: self.nj_rms(x, (N,), weight, eps)
            return lambda x, weight, bias: self.nj_ln(x, (N,), weight, bias, eps)
        if name in ("eager", "compile"):
            if case.norm == "rms":
                def eager(x, weight, bias):
                    return F.rms_norm(x, (N,), weight, eps)
            else:
                def eager(x, weight, bias):
                    return F.layer_norm(x, (N,), weight, bias, eps)
            if name == "eager":
                return eager
            return self.torch.compile(eager, dynamic=False)  # mode "default"
        if name == "liger":
            if case.norm == "rms":
                # apply(X, W, eps, offset, casting_mode, in_place, row_mode).
                # offset 0.0: plain x * rstd * w. casting_mode "gemma": x and w
                # upcast to fp32, one rounding of the output at the end, which
                # is what torch's fused CUDA rms_norm does ("llama" rounds
                # x * rstd to the input dtype before the weight multiply).
                # in_place=False keeps dy intact across the repeated timed
                # backward calls (True would write dx over dy).
                fn = self.liger_rms
                return lambda x, weight, bias: fn.apply(x, weight, eps, 0.0, "gemma", False)
            fn = self.liger_ln
            # apply(X, W, B, eps)
            return lambda x, weight, bias: fn.apply(x, weight, bias, eps)
        raise ValueError(name)

    def free(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()

    def inputs(self, case: Case, seed: int):
        torch = self.torch
        g = torch.Generator(device=self.dev).manual_seed(seed)
        dt = self.tdtype[case.dtype]
        x = torch.randn(case.M, case.N, device=self.dev, dtype=dt, generator=g).requires_grad_(True)
        w = (1.0 + 0.1 * torch.randn(case.N, device=self.dev, generator=g)).to(dt).requires_grad_(True)
        b = None
        if case.has_bias:
            b = (0.1 * torch.randn(case.N, device=self.dev, generator=g)).to(dt).requires_grad_(True)
        dy = torch.randn(case.M, case.N, device=self.dev, dtype=dt, generator=g)
        return x, w, b, dy

    def reference(self, case: Case, x, w, b, dy) -> dict:
        """float64 y and grads from torch on the same (rounded) inputs."""
        x64 = x.detach().double().requires_grad_(True)
        w64 = w.detach().double().requires_grad_(True)
        b64 = b.detach().double().requires_grad_(True) if b is not None else None
        if case.norm == "rms":
            y64 = self.F.rms_norm(x64, (case.N,), w64, case.eps)
        else:
            y64 = self.F.layer_norm(x64, (case.N,), w64, b64, case.eps)
        y64.backward(dy.double())
        ref = {"y": y64.detach(), "dx": x64.grad, "dweight": w64.grad}
        if b64 is not None:
            ref["dbias"] = b64.grad
        return ref

    @staticmethod
    def _rel_err(out, ref) -> float:
        if out is None:
            return float("inf")
        scale = ref.abs().max().item()
        diff = (out.detach().double() - ref).abs().max().item()
        return diff / scale if scale > 0 else diff

    def check(self, fn, case: Case, x, w, b, dy, ref) -> dict:
        """Run forward and backward once (this also compiles/warms up) and
        compare with the reference. Returns {tensor: relative error}."""
        params = [t for t in (x, w, b) if t is not None]
        for t in params:
            t.grad = None
        y = fn(x, w, b)
        errs = {"y": self._rel_err(y, ref["y"])}
        y.backward(dy)
        errs["dx"] = self._rel_err(x.grad, ref["dx"])
        errs["dweight"] = self._rel_err(w.grad, ref["dweight"])
        if b is not None:
            errs["dbias"] = self._rel_err(b.grad, ref["dbias"])
        del y
        for t in params:
            t.grad = None
        return errs

    def bench_ms(self, fn, grad_to_none=None) -> float:
        return float(self.do_bench(fn, grad_to_none=grad_to_none, return_mode="median"))

    def time_fwd(self, fn, x, w, b) -> float:
        return self.bench_ms(lambda: fn(x, w, b)) * 1e3

    def time_bwd(self, fn, x, w, b, dy) -> float:
        params = [t for t in (x, w, b) if t is not None]
        y = fn(x, w, b)  # the forward runs once, outside the timed function
        try:
            return self.bench_ms(lambda: y.backward(dy, retain_graph=True), grad_to_none=params) * 1e3
        finally:
            del y
            for t in params:
                t.grad = None

    def time_copy(self, nbytes: int) -> float:
        half = max(1, nbytes // 2)
        src = self.torch.empty(half, dtype=self.torch.uint8, device=self.dev).fill_(7)
        dst = self.torch.empty_like(src)
        try:
            return self.bench_ms(lambda: dst.copy_(src)) * 1e3
        finally:
            del src, dst

    def run_case(self, case: Case, seed: int) -> list[dict]:
        torch = self.torch
        torch._dynamo.reset()
        tol = TOLERANCE[case.dtype]
        rows = {}
        for d in DIRECTIONS:
            nbytes = traffic_bytes(case.norm, d, case.M, case.N, case.dtype)
            rows[d] = {"label": case.label, "norm": case.norm, "dtype": case.dtype, "M": case.M, "N": case.N,
                       "eps": case.eps, "direction": d, "bytes": nbytes, "tolerance": tol,
                       "copy_us": None, "copy_gbps": None, "impls": {}}

        x, w, b, dy = self.inputs(case, seed)
        fns = {}
        try:
            ref = self.reference(case, x, w, b, dy)
        except Exception as exc:  # noqa: BLE001 - e.g. OOM: no check, no timing
            ref = None
            ref_error = "reference: " + _short_error(exc)
            self.free()

        # Correctness first (also the first call: JIT, compile, autotune).
        for name in self.impls:
            entries = {d: {"us": None, "gbps": None, "sol_pct": None, "correct": None,
                           "max_rel_err": {}, "error": None} for d in DIRECTIONS}
            for d in DIRECTIONS:
                rows[d]["impls"][name] = entries[d]
            if name in self.unavailable:
                for e in entries.values():
                    e["error"] = "unavailable: " + self.unavailable[name]
                    e["unavailable"] = True
                continue
            if ref is None:
                for e in entries.values():
                    e["error"] = ref_error
                continue
            try:
                fn = self.build(name, case)
                errs = self.check(fn, case, x, w, b, dy, ref)
                fns[name] = fn
            except Exception as exc:  # noqa: BLE001
                for e in entries.values():
                    e["error"] = _short_error(exc)
                self.free()
                continue
            fwd_err = {"y": errs["y"]}
            bwd_err = {k: v for k, v in errs.items() if k != "y"}
            for d, part in (("fwd", fwd_err), ("bwd", bwd_err)):
                entries[d]["max_rel_err"] = {k: _finite_or_str(v) for k, v in part.items()}
                entries[d]["correct"] = all(math.isfinite(v) and v <= tol for v in part.values())
        del ref
        self.free()

        for name, fn in fns.items():
            for d in DIRECTIONS:
                e = rows[d]["impls"][name]
                try:
                    e["us"] = self.time_fwd(fn, x, w, b) if d == "fwd" else self.time_bwd(fn, x, w, b, dy)
                    e["gbps"] = gbps(rows[d]["bytes"], e["us"])
                except Exception as exc:  # noqa: BLE001
                    e["error"] = "timing: " + _short_error(exc)
                    self.free()
        del fns, x, w, b, dy
        torch._dynamo.reset()
        self.free()

        for d in DIRECTIONS:
            r = rows[d]
            try:
                r["copy_us"] = self.time_copy(r["bytes"])
                r["copy_gbps"] = gbps(r["bytes"], r["copy_us"])
            except Exception as exc:  # noqa: BLE001
                r["copy_error"] = _short_error(exc)
            for e in r["impls"].values():
                if e["us"] and r["copy_us"]:
                    e["sol_pct"] = r["copy_us"] / e["us"] * 100.0
            r["best_other"], r["speedup"] = speedup_of(r, self.impls)
        self.free()
        return [rows[d] for d in DIRECTIONS]

    def metadata(self) -> dict:
        torch, triton = self.torch, self.triton
        props = torch.cuda.get_device_properties(self.dev)
        return {
            "gpu": torch.cuda.get_device_name(self.dev),
            "compute_capability": "%d.%d" % torch.cuda.get_device_capability(self.dev),
            "sm_count": props.multi_processor_count,
            "gpu_memory_bytes": props.total_memory,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "normjit": self.versions.get("normjit"),
            "normjit_library": os.environ.get("NORMJIT_LIBRARY"),
            "liger": self.versions.get("liger"),
            "unavailable": dict(self.unavailable),
        }


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Time normjit against PyTorch eager, torch.compile and Liger-Kernel "
        "(forward and backward, GB/s and SOL%% against a same-size device copy).",
        epilog="Shapes: NORM:DTYPE:MxN (NORM rms|ln, DTYPE fp32|bf16|fp16), comma- or "
        f"space-separated, or a suite: {', '.join(SUITES)}. Exit 0 done, 1 normjit failed "
        "a check or raised, 2 bad arguments, 3 no torch/CUDA/triton.",
    )
    p.add_argument("--shapes", nargs="+", metavar="SPEC", default=None,
                   help="suite name or shapes (default: the 'default' suite)")
    p.add_argument("--quick", action="store_true", help="the 'quick' suite (ignored when --shapes is given)")
    p.add_argument("--impl", nargs="+", metavar="NAME", default=None,
                   help=f"implementations to run, of {', '.join(IMPLS)} (default: all)")
    p.add_argument("--tune", action="store_true",
                   help="normjit tunes shapes missing from its caches (policy 'first'; default 'never')")
    p.add_argument("--cache-dir", default=None, help="normjit cache directory (normjit.set_cache_dir)")
    p.add_argument("--json", default=str(DEFAULT_JSON), metavar="PATH",
                   help="where to write the results (default: docs/results/compare.json)")
    p.add_argument("--seed", type=int, default=0, help="input seed")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no new shape after this many seconds (the JSON keeps what ran)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cases = parse_shapes(args.shapes if args.shapes else ("quick" if args.quick else "default"))
        impls = parse_impls(args.impl)
    except ValueError as exc:
        parser.error(str(exc))

    try:
        import torch
    except ImportError as exc:
        print(f"compare.py: PyTorch is required ({exc}); run this on a machine with torch and a CUDA GPU.",
              file=sys.stderr)
        return EXIT_NO_GPU_STACK
    if not torch.cuda.is_available():
        print("compare.py: torch sees no CUDA GPU; run this on a machine with one.", file=sys.stderr)
        return EXIT_NO_GPU_STACK
    try:
        import triton.testing  # noqa: F401
    except ImportError as exc:
        print(f"compare.py: triton is required for do_bench ({exc}).", file=sys.stderr)
        return EXIT_NO_GPU_STACK

    runner = Runner(impls, tune=args.tune, cache_dir=args.cache_dir)
    meta = runner.metadata()
    meta.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "implementations": impls,
        "tune_policy": "first" if args.tune else "never",
        "timing": "triton.testing.do_bench, return_mode=median, L2 flushed before each run; "
                  "backward = y.backward(dy, retain_graph=True) alone, grads reset to None",
        "bytes": "fwd: M*N*(x+y) + N*w (*2 with bias) + 4*M rstd (+4*M mean); "
                 "bwd: M*N*(dy+x+dx) + 2*N*w (+N*b dbias) + 4*M rstd (+4*M mean)",
        "sol": "copy_us / us * 100; copy = dst.copy_(src), uint8, bytes/2 each way",
        "tolerance": TOLERANCE,
        "liger_rms_casting_mode": "gemma",
    })
    print(f"GPU: {meta['gpu']} (sm_{meta['compute_capability'].replace('.', '')}, {meta['sm_count']} SMs)  "
          f"torch {meta['torch']} (CUDA {meta['torch_cuda']})  triton {meta['triton']}  "
          f"normjit {meta['normjit'] or '?'}  liger {meta['liger'] or '-'}  tune={meta['tune_policy']}")
    for name, why in runner.unavailable.items():
        print(f"{name}: unavailable ({why})")
    print(f"{len(cases)} shapes; '*' after us = failed the correctness check (tolerance fp32 1e-4, "
          "fp16 4e-3, bf16 3e-2); speedup = best other (correct) us / normjit us\n")
    print(table_header(impls), flush=True)

    rows: list[dict] = []
    doc = {"schema": "normjit-compare/1", "meta": meta, "rows": rows}
    json_path = Path(args.json)
    start = time.monotonic()
    skipped = []
    for i, case in enumerate(cases):
        if args.max_seconds is not None and time.monotonic() - start > args.max_seconds:
            skipped = [c.label for c in cases[i:]]
            break
        t0 = time.monotonic()
        case_rows = runner.run_case(case, args.seed)
        rows += case_rows
        for r in case_rows:
            print(table_row(r, impls), flush=True)
        print(f"  [{i + 1}/{len(cases)}] {case.label} {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        meta["elapsed_s"] = round(time.monotonic() - start, 1)
        write_json(json_path, doc)
    if skipped:
        meta["skipped_over_time"] = skipped
        print(f"\nover --max-seconds: skipped {', '.join(skipped)}")

    summary = geomean_speedups(rows, impls)
    meta["geomean_speedup"] = summary
    meta["elapsed_s"] = round(time.monotonic() - start, 1)
    write_json(json_path, doc)

    if summary:
        print("\nnormjit speed-up, geometric mean over rows where both passed:")
        for d, per in summary.items():
            print(f"  {d}: " + ", ".join(f"vs {IMPL_TITLES[n]} {v['geomean']:.2f}x ({v['rows']} rows)"
                                         for n, v in per.items()))
    fails = failure_lines(rows, impls)
    if fails:
        print("\nfailures:")
        for line in fails:
            print("  " + line)
    print(f"\nwrote {json_path} ({len(rows)} rows, {meta['elapsed_s']} s)")

    nj_bad = [r for r in rows if "normjit" in r["impls"]
              and (r["impls"]["normjit"].get("error") or r["impls"]["normjit"].get("correct") is False)]
    return EXIT_NORMJIT_FAILED if nj_bad else 0


if __name__ == "__main__":
    sys.exit(main())
