#!/usr/bin/env python3
"""Compare normjit's kernels with PyTorch eager, torch.compile, Liger-Kernel and Quack.

Kernel time, not Python time. For each implementation, direction and shape
the number is the summed GPU duration of the activities (kernels, memcpy,
memset) that ONE call launches, read with torch.profiler (CUDA activity).
Each repetition zeroes a buffer of twice the L2 size (the flush), then runs
the call between two marker kernels (torch.cuda._sleep); only what lies
between the markers on the GPU timeline counts, so the flush and any setup
are left out. Reported: the median over --reps repetitions, after --warmup
untimed calls. The repetitions of a shape's implementations and of its copy
interleave (one of each in turn, the order rotated), so that the GPU's drift
over a run falls on all of them alike. Backward: the forward runs once,
untimed; the timed call is
torch.autograd.grad(y, params, dy, retain_graph=True), with a fresh copy of
dy each time (Liger writes dx over dy). A device copy (uint8 copy_, bytes/2
each way) of the minimal traffic, timed the same way in the same run, gives
SOL% = copy time / time. The host time per call is reported apart: the wall
time of K back-to-back calls / K, torch.cuda.synchronize() before and after.

Usage (from the repository root, with the normjit package on PYTHONPATH and
NORMJIT_LIBRARY naming libnormjit_c.so; peers found on PYTHONPATH):

    python3 tools/compare.py                      # the default suite (50 shapes)
    python3 tools/compare.py --quick --tune       # 8 shapes, normjit tuned first
    python3 tools/compare.py --shapes rms:bf16:8192x4096,ln:fp16:4096x1024
    python3 tools/compare.py --impl normjit,quack --json /tmp/c.json --markdown /tmp/c.md
    python3 tools/compare.py --json c.json --max-seconds 500 --resume   # again: goes on where it stopped

Shapes are NORM:DTYPE:MxN with NORM rms or ln and DTYPE fp32, bf16 or fp16,
or a suite name (default, quick). Exit status: 0 when done, 1 when normjit
failed a correctness check or raised on some shape, 2 on bad arguments,
3 when torch, CUDA or the profiler-based timing is missing.

This module imports only the standard library at load time, so its helpers
(shape parsing, byte counts, splitting profiler events) work without torch.
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
import statistics
import sys
import time
from pathlib import Path

_TOOLS = str(Path(__file__).resolve().parent)
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)
import compare_report as report  # noqa: E402 - standard library only

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = report.DEFAULT_JSON

IMPLS = report.IMPLS
DIRECTIONS = report.DIRECTIONS
NORMS = {"rms": "RMSNorm", "ln": "LayerNorm"}
DTYPE_SIZE = {"fp32": 4, "bf16": 2, "fp16": 2}
# Relative error (max |out - ref| / max |ref|) allowed against the float64 reference.
TOLERANCE = {"fp32": 1e-4, "fp16": 4e-3, "bf16": 3e-2}
EPS = {"rms": 1e-6, "ln": 1e-5}
MAX_ELEMENTS = 256 * 2**20  # M*N of the suites: every peer's buffers fit an 80 GB GPU
LIGER_MAX_N = 65536  # Liger holds a row in one Triton block of at most 64K elements
MARKER = "spin_kernel"  # the kernel of torch.cuda._sleep, which brackets each timed call
MARKER_CYCLES = 1000

SCHEMA = "normjit-compare/2"
EXIT_NORMJIT_FAILED = 1
EXIT_NO_GPU_STACK = 3


class Skipped(Exception):
    """A known limit of an implementation (recorded as skipped, with the reason)."""


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


# The issue's shapes come first, so a run cut by --max-seconds has them.
ISSUE_SHAPES = ["rms:bf16:4096x16384", "rms:bf16:4096x32768", "rms:bf16:4096x65536", "rms:bf16:1024x131072",
                "ln:fp16:4096x16384", "ln:fp16:4096x32768", "rms:bf16:1x4096", "rms:bf16:32x8192"]
# RMSNorm bf16 over N (odd and wide ones included) at M*N of about 16M-64M elements: N -> M.
RMS_BF16_SWEEP = {1024: 32768, 1536: 16384, 1600: 16384, 2048: 16384, 2880: 8192, 4096: 8192, 5120: 8192,
                  6144: 8192, 7168: 8192, 8192: 4096, 12288: 4096, 20000: 2048, 100003: 512, 262144: 256}
LN_SWEEP = {1600: 16384, 2880: 8192, 4096: 8192, 5120: 8192, 8192: 4096, 20000: 2048}


def _suite_default() -> list[str]:
    shapes = list(ISSUE_SHAPES)
    shapes += ["rms:bf16:1x2048", "rms:bf16:1x7168", "rms:bf16:1x8192", "rms:bf16:8x4096", "rms:bf16:32x4096",
               "rms:fp16:1x5120"]  # decode
    shapes += ["rms:bf16:32768x128"]  # per-head QK-norm
    shapes += [f"rms:bf16:{m}x{n}" for n, m in RMS_BF16_SWEEP.items()]
    shapes += ["rms:fp16:16384x2048", "rms:fp16:8192x4096", "rms:fp16:4096x8192"]
    shapes += ["rms:fp32:16384x1024", "rms:fp32:8192x4096", "rms:fp32:4096x8192", "rms:fp32:2048x16384"]
    shapes += ["ln:fp16:4096x768", "ln:fp16:16384x1024"]
    shapes += [f"ln:{dt}:{m}x{n}" for dt in ("fp16", "bf16") for n, m in LN_SWEEP.items()]
    return shapes


def _suite_quick() -> list[str]:
    # Headline shapes, a few N of one family (for the plot), Liger's limit, QK-norm, decode.
    return ["rms:bf16:4096x16384", "rms:bf16:1024x131072", "ln:fp16:4096x16384", "rms:bf16:8192x4096",
            "rms:bf16:32768x1024", "ln:fp16:8192x2880", "rms:bf16:32768x128", "rms:bf16:1x4096"]


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


def drawn_shapes(count: int, seed: int) -> list[str]:
    """`count` shapes no issue names: tools/heldout.py's draw (issue 19's: N
    log-uniform in [64, 262144], a quarter odd; a quarter of the shapes M <=
    64, M up to 2^20 otherwise, M * N <= 2^26), as NORM:DTYPE:MxN (the fused
    residual add dropped: compare.py times plain norms)."""
    import heldout  # tools/ (on sys.path): standard library only

    out: list[str] = []
    for s in heldout.draw(seed, count):
        shape = ":".join(s["shape"].split(":")[:3])
        if shape not in out:
            out.append(shape)
    return out


def parse_shapes(specs: list[str] | str) -> list[Case]:
    """Suite names, draw:COUNT:SEED (drawn_shapes) and shapes, comma- or
    space-separated; duplicates dropped, order kept."""
    if isinstance(specs, str):
        specs = [specs]
    cases: list[Case] = []
    for spec in specs:
        for token in spec.replace(",", " ").split():
            if token.lower() in SUITES:
                found = [parse_case(s) for s in SUITES[token.lower()]()]
            elif token.lower().startswith("draw:"):
                parts = token.split(":")
                if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit() or int(parts[1]) < 1:
                    raise ValueError(f"'{token}' is not draw:COUNT:SEED (e.g. draw:40:7)")
                found = [parse_case(s) for s in drawn_shapes(int(parts[1]), int(parts[2]))]
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


# ---------------------------------------------------------------- profiler events


def device_activities(function_events) -> tuple[list[tuple[str, float, float]], bool]:
    """(name, start_us, end_us) of the GPU activities (kernels, memcpy, memset)
    among torch.profiler FunctionEvents, and whether the profiler flagged its
    GPU-side annotation spans (is_user_annotation), which are left out."""
    out, flagged = [], True
    for e in function_events:
        if not str(getattr(e, "device_type", "")).endswith("CUDA"):
            continue
        if not hasattr(e, "is_user_annotation"):
            flagged = False
        kind = str(getattr(e, "activity_type", "") or "").lower()
        if getattr(e, "is_user_annotation", False) or "annotation" in kind or "sync" in kind:
            continue
        out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return out, flagged


def split_calls(events, marker: str = MARKER, drop_enclosing: bool = False) -> list[tuple[float, list[str]]]:
    """Per timed call, (summed duration in us, names) of the GPU activities
    between a pair of marker kernels; the events (name, start_us, end_us) of
    one profiler session may come in any order. Activities outside the pairs
    (the L2 flush, setup copies) are ignored. drop_enclosing leaves out spans
    that enclose a shorter activity: GPU-side annotation ranges, for a
    profiler that does not flag them (kernels of one stream never nest)."""
    evs = sorted(events, key=lambda e: (e[1], -e[2]))
    if drop_enclosing:
        evs = [a for a in evs if not any(b is not a and a[1] <= b[1] and b[2] <= a[2]
                                         and a[2] - a[1] > b[2] - b[1] for b in evs)]
    calls, current = [], None
    for name, start, end in evs:
        if marker in name:
            if current is None:
                current = []
            else:
                calls.append((sum(d for _, d in current), [n for n, _ in current]))
                current = None
        elif current is not None:
            current.append((name, end - start))
    if current is not None:
        raise ValueError(f"odd number of '{marker}' markers in the profile")
    return calls


# ---------------------------------------------------------------- helpers


def interleaved_order(names: list[str], reps: int) -> list[str]:
    """The order in which kernel_us_many runs its calls: repetition r runs
    every name once, the list rotated by r, so that each name follows each
    other one equally often."""
    return [names[(r + i) % len(names)] for r in range(reps) for i in range(len(names))]


def calls_by_name(timed: list, order: list[str]) -> dict[str, list]:
    """split_calls' timed calls, in timeline order, given back to the names
    that ran them (order: interleaved_order's)."""
    if len(timed) != len(order):
        raise RuntimeError(f"the profile holds {len(timed)} marked calls, not {len(order)}")
    out: dict[str, list] = {n: [] for n in dict.fromkeys(order)}
    for call, who in zip(timed, order):
        out[who].append(call)
    return out


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


def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:300]


def _dist_version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return None


def new_entry() -> dict:
    return {"status": None, "reason": None, "us": None, "us_min": None, "us_max": None, "kernels": None,
            "gbps": None, "sol_pct": None, "host_us": None, "host_calls": None, "rel_err": {}, "correct": None}


# ---------------------------------------------------------------- GPU side


class Runner:
    """Holds the imported GPU stack, the implementations and the timing methods."""

    def __init__(self, impls: list[str], tune: bool, cache_dir: str | None, reps: int, warmup: int,
                 host_calls: int):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        self.dev = torch.device("cuda")
        self.tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.impls, self.reps, self.warmup, self.host_calls = impls, reps, warmup, host_calls
        self.unavailable: dict[str, str] = {}
        props = torch.cuda.get_device_properties(self.dev)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        self.flush_buf = torch.empty(2 * self.l2_bytes, dtype=torch.uint8, device=self.dev)

        # torch.compile: one static graph per shape (dynamo is reset per shape).
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

        def attempt(name, load):
            if name in impls:
                try:
                    load()
                except Exception as exc:  # noqa: BLE001 - recorded, the others still run
                    self.unavailable[name] = short_error(exc)

        attempt("normjit", lambda: self._load_normjit(tune, cache_dir))
        attempt("liger", self._load_liger)
        attempt("quack", self._load_quack)

    def _load_normjit(self, tune, cache_dir):
        import normjit
        from normjit.torch import layer_norm, rms_norm

        normjit.set_tune_policy("first" if tune else "never")  # "first": tuned at its first call
        if cache_dir:
            normjit.set_cache_dir(cache_dir)
        self.nj_rms, self.nj_ln = rms_norm, layer_norm

    def _load_liger(self):
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        self.liger_rms, self.liger_ln = LigerRMSNormFunction, LigerLayerNormFunction

    def _load_quack(self):
        # quack/__init__ rebinds the name `rmsnorm` to the function, so `import
        # quack.rmsnorm as qr` yields the function; the module is in sys.modules.
        import importlib

        qr = importlib.import_module("quack.rmsnorm")

        torch = self.torch

        class QuackLayerNorm(torch.autograd.Function):
            """Quack's LayerNorm has no autograd: its forward and backward ops, fp32 weight and bias."""

            @staticmethod
            def forward(ctx, x, w, b, eps):
                y, rstd, mean = qr.layernorm_fwd(x, w, b, eps, return_rstd=True, return_mean=True)
                ctx.save_for_backward(x, w, rstd, mean)
                return y

            @staticmethod
            def backward(ctx, dy):
                x, w, rstd, mean = ctx.saved_tensors
                dx, dw, db = qr.layernorm_bwd(x, w, dy, rstd, mean, has_bias=True)
                return dx, dw, db, None

        self.quack_rms, self.quack_ln = qr.rmsnorm, QuackLayerNorm

    def versions(self) -> dict:
        torch = self.torch
        try:
            import triton

            triton_version = triton.__version__
        except Exception:  # noqa: BLE001
            triton_version = None
        normjit_version = None
        if "normjit" in self.impls and "normjit" not in self.unavailable:
            import normjit

            normjit_version = normjit.__version__
        return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
                "liger-kernel": _dist_version("liger-kernel"), "quack-kernels": _dist_version("quack-kernels"),
                "nvidia-cutlass-dsl": _dist_version("nvidia-cutlass-dsl"), "normjit": normjit_version,
                "python": platform.python_version()}

    def metadata(self) -> dict:
        torch = self.torch
        props = torch.cuda.get_device_properties(self.dev)
        return {"gpu": torch.cuda.get_device_name(self.dev),
                "compute_capability": "%d.%d" % torch.cuda.get_device_capability(self.dev),
                "sm_count": props.multi_processor_count, "gpu_memory_bytes": props.total_memory,
                "l2_bytes": self.l2_bytes, "versions": self.versions(),
                "normjit_library": os.environ.get("NORMJIT_LIBRARY"), "unavailable": dict(self.unavailable)}

    def free(self) -> None:
        gc.collect()
        self.torch.cuda.empty_cache()

    # ---- implementations

    def build(self, name: str, case: Case, x, w, b):
        """(forward() -> y, params): a training forward (grads enabled) and the
        tensors its backward differentiates, in the order x, weight (, bias)."""
        F, N, eps, rms = self.F, case.N, case.eps, case.norm == "rms"
        params = [x, w] if rms else [x, w, b]
        if name == "normjit":
            if rms:
                return (lambda: self.nj_rms(x, (N,), w, eps)), params
            return (lambda: self.nj_ln(x, (N,), w, b, eps)), params
        if name in ("eager", "compile"):
            def f(x, w, b):
                return F.rms_norm(x, (N,), w, eps) if rms else F.layer_norm(x, (N,), w, b, eps)

            if name == "compile":
                f = self.torch.compile(f, dynamic=False)  # mode "default"
            return (lambda: f(x, w, b)), params
        if name == "liger":
            if N > LIGER_MAX_N:
                raise Skipped(f"N > {LIGER_MAX_N}: Liger keeps a row in one Triton block (at most 64K elements)")
            if rms:
                # apply(X, W, eps, offset, casting_mode, in_place). "gemma": x and w
                # in fp32, one rounding at the end, as torch's rms_norm. in_place=True
                # (Liger's default) writes dx over dy; the timing passes a fresh dy.
                return (lambda: self.liger_rms.apply(x, w, eps, 0.0, "gemma", True)), params
            return (lambda: self.liger_ln.apply(x, w, b, eps)), params
        if name == "quack":
            if rms:
                return (lambda: self.quack_rms(x, w, eps=eps)), params
            w32 = w.detach().float().requires_grad_(True)  # Quack's LayerNorm takes fp32 weight and bias
            b32 = b.detach().float().requires_grad_(True)
            return (lambda: self.quack_ln.apply(x, w32, b32, eps)), [x, w32, b32]
        raise ValueError(name)

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

    def check(self, fwd, params, dy, ref) -> dict:
        """One forward and backward (also the first call: JIT, compile, tuning),
        compared with the reference. Returns {tensor: relative error}."""
        y = fwd()
        errs = {"y": self._rel_err(y, ref["y"])}
        grads = self.torch.autograd.grad(y, params, dy.clone())
        for key, g in zip(("dx", "dweight", "dbias"), grads):
            errs[key] = self._rel_err(g, ref[key])
        return errs

    # ---- timing

    def kernel_us(self, call, setup=None) -> tuple[float, float, float, list[str]]:
        """(median, min, max) over reps of the summed GPU time of what call(*setup())
        launches, L2 flushed before each call, and the activities of one call."""
        return self.kernel_us_many({"": (call, setup)})[""]

    def kernel_us_many(self, calls: dict) -> dict:
        """kernel_us of several calls (name -> (call, setup or None)) whose
        repetitions interleave: repetition r runs every call once, the order
        rotated by r. The GPU's state drifts over a run (clocks, DRAM, what the
        L2 holds); decode rows of about 2 us moved by up to 0.5 us between runs
        timed one implementation after another, so every implementation of a
        row, and its copy, are timed across the same stretch of the run."""
        torch = self.torch
        names = list(calls)
        for n in names:
            call, setup = calls[n]
            for _ in range(self.warmup):
                call(*(setup() if setup else ()))
        torch.cuda.synchronize()
        order = interleaved_order(names, self.reps)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for n in order:
                call, setup = calls[n]
                args = setup() if setup else ()
                self.flush_buf.zero_()
                torch.cuda._sleep(MARKER_CYCLES)
                out = call(*args)
                torch.cuda._sleep(MARKER_CYCLES)
                del out, args
        events, flagged = device_activities(prof.events())
        timed = split_calls(events, drop_enclosing=not flagged)
        if not all(names_ for _, names_ in timed):
            raise RuntimeError("no GPU activity between the markers of a call")
        out = {}
        for n, mine in calls_by_name(timed, order).items():
            times = [c[0] for c in mine]
            kernels = mine[0][1]  # one call's activities, shortened: for reading, not parsing
            out[n] = (statistics.median(times), min(times), max(times), [k[:80] for k in kernels[:8]] +
                      ([f"... {len(kernels) - 8} more"] if len(kernels) > 8 else []))
        return out

    def host_us(self, call, calls: int) -> float:
        torch = self.torch
        call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6

    def _host_calls(self, est_us: float | None) -> int:
        # K back-to-back calls, fewer where the GPU time alone would pass ~0.5 s.
        if not est_us:
            return self.host_calls
        return max(10, min(self.host_calls, int(5e5 / est_us)))

    def copy_call(self, nbytes: int):
        """A device copy moving nbytes in all (half read, half written): SOL's reference."""
        half = max(1, nbytes // 2)
        src = self.torch.empty(half, dtype=self.torch.uint8, device=self.dev).fill_(7)
        dst = self.torch.empty_like(src)
        return lambda: dst.copy_(src)

    def time_copy(self, nbytes: int) -> float:
        return self.kernel_us(self.copy_call(nbytes))[0]

    def probe(self) -> None:
        """Raises when the profiler-based timing does not work on this machine."""
        us = self.time_copy(1 << 24)
        if not us > 0:
            raise RuntimeError(f"a 16 MiB device copy timed {us} us")

    COPY = "(copy)"  # the key of a direction's same-byte copy among the timed calls

    def time_all(self, built: dict, dy, rows: dict) -> None:
        """Kernel times of the built implementations (name -> (forward, params,
        entries)): per direction, every implementation's call and the copy of
        its bytes interleaved (kernel_us_many); then host times, one
        implementation at a time. A direction that raises is recorded
        unavailable for that implementation, and the others are kept."""
        torch = self.torch

        def unavailable(e, exc):
            e.update(status=report.UNAVAILABLE, reason="timing: " + short_error(exc), us=None)

        def grad_call(y, params):
            return lambda g: torch.autograd.grad(y, params, g, retain_graph=True)

        for d in DIRECTIONS:
            calls = {}
            for name, (fwd, params, entries) in built.items():
                try:
                    # the backward's forward runs here, outside the timed calls
                    call, setup = (fwd, None) if d == "fwd" else (grad_call(fwd(), params), lambda: (dy.clone(),))
                    call(*(setup() if setup else ()))  # one that raises does so here, not among the others
                    calls[name] = (call, setup)
                except Exception as exc:  # noqa: BLE001
                    unavailable(entries[d], exc)
                    self.free()
            try:
                calls[self.COPY] = (self.copy_call(rows[d]["bytes"]), None)
            except Exception as exc:  # noqa: BLE001
                rows[d]["copy_error"] = short_error(exc)
            try:
                times = self.kernel_us_many(calls)
            except Exception:  # noqa: BLE001 - then one at a time, so that one failure costs only its own
                times = {}
                for n, (call, setup) in calls.items():
                    try:
                        times[n] = self.kernel_us(call, setup)
                    except Exception as exc:  # noqa: BLE001
                        times[n] = exc
            for n, t in times.items():
                if n == self.COPY:
                    if isinstance(t, Exception):
                        rows[d]["copy_error"] = short_error(t)
                    else:
                        rows[d]["copy_us"] = t[0]
                        rows[d]["copy_gbps"] = gbps(rows[d]["bytes"], t[0])
                elif isinstance(t, Exception):
                    unavailable(built[n][2][d], t)
                else:
                    e = built[n][2][d]
                    e["us"], e["us_min"], e["us_max"], e["kernels"] = t
            del calls, times
            self.free()

        for name, (fwd, params, entries) in built.items():
            dy_h = dy.clone()  # the host loop's dy (Liger writes dx over it)
            for d, host in (("fwd", fwd), ("bwd", lambda: torch.autograd.grad(fwd(), params, dy_h))):
                e = entries[d]
                if e["us"] is None:
                    continue
                try:
                    e["host_calls"] = self._host_calls(e["us"] + ((entries["fwd"]["us"] or 0) if d == "bwd" else 0))
                    e["host_us"] = self.host_us(host, e["host_calls"])
                except Exception as exc:  # noqa: BLE001
                    unavailable(e, exc)
                    self.free()

    def run_case(self, case: Case, seed: int) -> list[dict]:
        torch = self.torch
        torch._dynamo.reset()
        tol = TOLERANCE[case.dtype]
        rows = {}
        for d in DIRECTIONS:
            nbytes = traffic_bytes(case.norm, d, case.M, case.N, case.dtype)
            rows[d] = {"label": case.label, "norm": case.norm, "dtype": case.dtype, "M": case.M, "N": case.N,
                       "eps": case.eps, "direction": d, "bytes": nbytes, "tolerance": tol, "copy_us": None,
                       "copy_gbps": None, "impls": {}}

        x, w, b, dy = self.inputs(case, seed)
        try:
            ref, ref_error = self.reference(case, x, w, b, dy), None
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: no check, no timing
            ref, ref_error = None, "reference: " + short_error(exc)
        self.free()

        built = {}  # timed together once every implementation is built and checked
        for name in self.impls:
            entries = {d: new_entry() for d in DIRECTIONS}
            for d in DIRECTIONS:
                rows[d]["impls"][name] = entries[d]
            status, reason = None, None
            if name in self.unavailable:
                status, reason = report.UNAVAILABLE, self.unavailable[name]
            elif ref is None:
                status, reason = report.ERROR, ref_error
            if status:
                for e in entries.values():
                    e.update(status=status, reason=reason)
                continue
            fwd = params = None
            try:
                fwd, params = self.build(name, case, x, w, b)
                errs = self.check(fwd, params, dy, ref)
            except Skipped as exc:
                status, reason = report.SKIPPED, str(exc)
            except Exception as exc:  # noqa: BLE001 - a peer that raises on this shape
                status, reason = report.UNAVAILABLE, short_error(exc)
            if status:
                for e in entries.values():
                    e.update(status=status, reason=reason)
                del fwd, params
                self.free()
                continue
            for d, keys in (("fwd", ("y",)), ("bwd", ("dx", "dweight", "dbias"))):
                part = {k: errs[k] for k in keys if k in errs}
                e = entries[d]
                e["rel_err"] = {k: _finite_or_str(v) for k, v in part.items()}
                e["correct"] = all(math.isfinite(v) and v <= tol for v in part.values())
                e["status"] = report.OK if e["correct"] else report.FAILED_CHECK
            built[name] = (fwd, params, entries)
            del fwd, params
        del ref
        self.time_all(built, dy, rows)
        del built, x, w, b, dy
        torch._dynamo.reset()
        self.free()

        for d in DIRECTIONS:
            r = rows[d]
            for e in r["impls"].values():
                e["gbps"] = gbps(r["bytes"], e["us"])
                if e["us"] and r["copy_us"]:
                    e["sol_pct"] = r["copy_us"] / e["us"] * 100.0
            report.annotate(r)
        self.free()
        return [rows[d] for d in DIRECTIONS]


# ---------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Time the kernels of normjit against PyTorch eager, torch.compile, Liger-Kernel and Quack "
        "(forward and backward; torch.profiler, L2 flushed; SOL% against a same-size device copy), "
        "plus the host time per call.",
        epilog="Shapes: NORM:DTYPE:MxN (NORM rms|ln, DTYPE fp32|bf16|fp16), comma- or "
        f"space-separated, or a suite: {', '.join(SUITES)}, or draw:COUNT:SEED (shapes no issue names, "
        "drawn as tools/heldout.py draws). Exit 0 done, 1 normjit failed "
        "a check or raised, 2 bad arguments, 3 no torch/CUDA/profiler timing.",
    )
    p.add_argument("--shapes", nargs="+", metavar="SPEC", default=None,
                   help="suite name or shapes (default: the 'default' suite)")
    p.add_argument("--quick", action="store_true", help="the 'quick' suite (ignored when --shapes is given)")
    p.add_argument("--impl", nargs="+", metavar="NAME", default=None,
                   help=f"implementations to run, of {', '.join(IMPLS)} (default: all)")
    p.add_argument("--tune", action="store_true",
                   help="normjit tunes each shape at its first call (policy 'first'; default 'never')")
    p.add_argument("--cache-dir", default=None, help="normjit cache directory (normjit.set_cache_dir)")
    p.add_argument("--json", default=str(DEFAULT_JSON), metavar="PATH",
                   help="where to write the results (default: docs/results/compare.json)")
    p.add_argument("--markdown", default=None, metavar="PATH",
                   help="the markdown report (default: the JSON path with .md)")
    p.add_argument("--reps", type=int, default=20, help="timed calls per measurement (median; default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each measurement (default 3)")
    p.add_argument("--host-calls", type=int, default=200,
                   help="back-to-back calls of the host-time loop (fewer where the GPU time passes 0.5 s)")
    p.add_argument("--seed", type=int, default=0, help="input seed")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows of an existing --json (same GPU) and run only the shapes it lacks")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no new shape when the time since start plus the last shape's time would "
                        "pass this; the JSON and markdown keep what ran")
    return p


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()  # --max-seconds counts the imports and the profiler's start too
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cases = parse_shapes(args.shapes if args.shapes else ("quick" if args.quick else "default"))
        impls = parse_impls(args.impl)
    except ValueError as exc:
        parser.error(str(exc))
    if args.reps < 1 or args.warmup < 0 or args.host_calls < 1:
        parser.error("--reps and --host-calls must be >= 1, --warmup >= 0")

    try:
        import torch
    except ImportError as exc:
        print(f"compare.py: PyTorch is required ({exc}); run this on a machine with torch and a CUDA GPU.",
              file=sys.stderr)
        return EXIT_NO_GPU_STACK
    if not torch.cuda.is_available():
        print("compare.py: torch sees no CUDA GPU; run this on a machine with one.", file=sys.stderr)
        return EXIT_NO_GPU_STACK

    runner = Runner(impls, tune=args.tune, cache_dir=args.cache_dir, reps=args.reps, warmup=args.warmup,
                    host_calls=args.host_calls)
    try:
        runner.probe()
    except Exception as exc:  # noqa: BLE001
        print(f"compare.py: the profiler-based kernel timing does not work here: {short_error(exc)}",
              file=sys.stderr)
        return EXIT_NO_GPU_STACK

    meta = runner.metadata()
    meta.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "implementations": impls,
        "tune_policy": "first" if args.tune else "never",
        "reps": args.reps, "warmup": args.warmup, "host_calls": args.host_calls,
        "timing": (f"Kernel time: the summed GPU durations (kernels, memcpy, memset) of what one call launches, "
                   f"read with torch.profiler; L2 flushed (a {2 * runner.l2_bytes / 2**20:.0f} MiB buffer zeroed) "
                   f"before each call; median of {args.reps} calls after {args.warmup} warm-up calls, the calls "
                   "of a shape's implementations and of its copy interleaved (one of each in turn). Backward: "
                   "torch.autograd.grad(y, params, dy, retain_graph=True) alone, the forward run before and "
                   "untimed. SOL% = the time of a device copy (uint8 copy_) of the same bytes, timed the same "
                   "way in the same run / the time; GB/s of the minimal traffic."),
        "bytes": "fwd: M*N*(x+y) + N*w (*2 with bias) + 4*M rstd (+4*M mean); "
                 "bwd: M*N*(dy+x+dx) + 2*N*w (+N*b dbias) + 4*M rstd (+4*M mean)",
        "host": "host_us: wall time of host_calls back-to-back calls / host_calls, torch.cuda.synchronize() "
                "before and after; fwd rows: forward, bwd rows: forward + backward",
        "tolerance": TOLERANCE,
        "liger": "RMSNorm casting_mode gemma, in_place True (a fresh dy per timed call)",
        "quack": "RMSNorm quack.rmsnorm.rmsnorm (autograd); LayerNorm layernorm_fwd/layernorm_bwd, fp32 w and b",
    })
    v = meta["versions"]
    print(f"GPU: {meta['gpu']} (sm_{meta['compute_capability'].replace('.', '')}, {meta['sm_count']} SMs, "
          f"L2 {runner.l2_bytes / 2**20:.0f} MiB)  " + "  ".join(f"{k} {val}" for k, val in v.items() if val)
          + f"  tune={meta['tune_policy']}", flush=True)
    for name, why in runner.unavailable.items():
        print(f"{name}: unavailable ({why})", flush=True)
    print(f"{len(cases)} shapes, {len(impls)} implementations; kernel us (median of {args.reps}), "
          "'*' = failed the float64 check", flush=True)

    json_path = Path(args.json)
    md_path = Path(args.markdown) if args.markdown else json_path.with_suffix(".md")
    rows: list[dict] = []
    if args.resume and json_path.exists():
        try:
            old = json.loads(json_path.read_text())
        except ValueError as exc:
            print(f"compare.py: --resume: cannot read {json_path}: {exc}", file=sys.stderr)
            return 2
        old_gpu = old.get("meta", {}).get("gpu")
        if old.get("schema") != SCHEMA or old_gpu != meta["gpu"]:
            print(f"compare.py: --resume: {json_path} is {old.get('schema')} from {old_gpu}, not {SCHEMA} from "
                  f"{meta['gpu']}", file=sys.stderr)
            return 2
        rows = old.get("rows", [])
        done = {r["label"] for r in rows}
        meta["resumed_rows"] = len(rows)
        print(f"--resume: {len(rows)} rows kept, {sum(c.label in done for c in cases)} shapes already done",
              flush=True)
        cases = [c for c in cases if c.label not in done]
    doc = {"schema": SCHEMA, "meta": meta, "rows": rows}
    last = 0.0
    for i, case in enumerate(cases):
        elapsed = time.monotonic() - start
        if args.max_seconds is not None and elapsed + last > args.max_seconds:
            meta["skipped_over_time"] = [c.label for c in cases[i:]]
            print(f"over --max-seconds ({elapsed:.0f} s + {last:.0f} s): not running "
                  f"{len(cases) - i} shapes", flush=True)
            break
        t0 = time.monotonic()
        case_rows = runner.run_case(case, args.seed)
        rows += case_rows
        last = time.monotonic() - t0
        for r in case_rows:
            print(report.progress_line(r, impls), flush=True)
        print(f"  [{i + 1}/{len(cases)}] {case.label} {last:.1f} s", flush=True)
        meta["elapsed_s"] = round(time.monotonic() - start, 1)
        meta["summary"] = report.summarize(rows)
        write_json(json_path, doc)
        report.write_text(md_path, report.markdown(doc))

    meta["elapsed_s"] = round(time.monotonic() - start, 1)
    meta["summary"] = report.summarize(rows)
    write_json(json_path, doc)
    text = report.markdown(doc)
    report.write_text(md_path, text)
    print("\n" + text, flush=True)
    print(f"wrote {json_path} ({len(rows)} rows) and {md_path}, {meta['elapsed_s']} s", flush=True)

    nj_bad = [r for r in rows if r["impls"].get("normjit", {}).get("status") not in (None, report.OK)]
    return EXIT_NORMJIT_FAILED if nj_bad else 0


if __name__ == "__main__":
    sys.exit(main())
