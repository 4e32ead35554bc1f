"""Tests of tools/compare.py and tools/compare_report.py (without a GPU) and tools/plot.py."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPARE = ROOT / "tools" / "compare.py"
REPORT = ROOT / "tools" / "compare_report.py"
PLOT = ROOT / "tools" / "plot.py"
IMPLS = ["normjit", "eager", "compile", "liger", "quack"]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def compare():
    return load(COMPARE, "normjit_compare_under_test")


@pytest.fixture(scope="module")
def report():
    return load(REPORT, "normjit_compare_report_under_test")


def torch_importable():
    return importlib.util.find_spec("torch") is not None


# ------------------------------------------------------------ compare.py: shapes and bytes


def test_importing_compare_does_not_import_torch():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('c', {str(COMPARE)!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['c'] = m; spec.loader.exec_module(m)\n"
        "print('torch' in sys.modules, 'triton' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(
    "norm,direction,M,N,dtype,expected",
    [
        # M*N*(x+y) + N*w + 4*M rstd
        ("rms", "fwd", 32768, 4096, "bf16", 32768 * 4096 * 4 + 4096 * 2 + 4 * 32768),
        ("rms", "fwd", 1, 4096, "bf16", 4096 * 4 + 4096 * 2 + 4),
        # M*N*(dy+x+dx) + 2*N*w + 4*M
        ("rms", "bwd", 32768, 1024, "fp32", 32768 * 1024 * 12 + 1024 * 4 * 2 + 4 * 32768),
        # LayerNorm: weight and bias, rstd and mean
        ("ln", "fwd", 4096, 1024, "fp16", 4096 * 1024 * 4 + 1024 * 2 * 2 + 8 * 4096),
        ("ln", "bwd", 4096, 1024, "fp16", 4096 * 1024 * 6 + 1024 * 2 * 3 + 8 * 4096),
    ],
)
def test_traffic_bytes(compare, norm, direction, M, N, dtype, expected):
    assert compare.traffic_bytes(norm, direction, M, N, dtype) == expected


def test_traffic_bytes_numbers(compare):
    assert compare.traffic_bytes("rms", "fwd", 32768, 4096, "bf16") == 537010176
    assert compare.traffic_bytes("ln", "bwd", 4096, 1024, "fp16") == 25204736
    with pytest.raises(ValueError):
        compare.traffic_bytes("rms", "sideways", 1, 1, "bf16")
    assert compare.gbps(2000, 1.0) == 2.0 and compare.gbps(2000, None) is None


def test_draw_token_gives_shapes_no_issue_names(compare):
    got = compare.parse_shapes("draw:12:7")
    again = compare.parse_shapes(["draw:12:7"])
    assert got == again  # the same seed draws the same shapes
    assert 1 <= len(got) <= 12
    assert all(64 <= c.N <= 262144 and c.M >= 1 and c.M * c.N <= 1 << 26 for c in got)
    assert all(c.norm in ("rms", "ln") and c.dtype in ("fp32", "fp16", "bf16") for c in got)
    assert compare.parse_shapes("draw:12:8") != got
    for bad in ("draw:0:1", "draw:x:1", "draw:5"):
        with pytest.raises(ValueError, match="draw:COUNT:SEED"):
            compare.parse_shapes(bad)


ISSUE = ["rms:bf16:4096x16384", "rms:bf16:4096x32768", "rms:bf16:4096x65536", "rms:bf16:1024x131072",
         "ln:fp16:4096x16384", "ln:fp16:4096x32768", "rms:bf16:1x4096", "rms:bf16:32x8192"]


def test_default_suite(compare):
    cases = compare.parse_shapes("default")
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels)) >= len(ISSUE) + 34
    assert labels[: len(ISSUE)] == ISSUE  # first, so --max-seconds keeps them
    rms_bf16 = {c.N for c in cases if c.norm == "rms" and c.dtype == "bf16" and 16 * 2**20 <= c.M * c.N}
    for n in (1024, 1536, 1600, 2048, 2880, 4096, 5120, 6144, 7168, 8192, 12288, 16384, 20000, 32768, 65536,
              100003, 131072, 262144):
        assert n in rms_bf16, n
    for s in ("rms:bf16:32768x128", "ln:fp16:4096x768", "rms:bf16:1x2048", "rms:bf16:1x7168", "rms:bf16:1x8192",
              "rms:bf16:8x4096", "rms:bf16:32x4096", "rms:fp16:1x5120"):
        assert s in labels, s
    assert {"fp16", "fp32"} <= {c.dtype for c in cases if c.norm == "rms"}
    ln = [c for c in cases if c.norm == "ln"]
    assert {c.dtype for c in ln} == {"fp16", "bf16"}
    for dt in ("fp16", "bf16"):
        assert {1600, 2880, 5120, 20000} <= {c.N for c in ln if c.dtype == dt}
    assert all(c.M * c.N <= compare.MAX_ELEMENTS for c in cases)
    assert all(c.has_bias and c.eps == 1e-5 for c in ln)
    assert all(not c.has_bias and c.eps == 1e-6 for c in cases if c.norm == "rms")


def test_quick_suite_is_a_small_subset(compare):
    quick = compare.parse_shapes(["quick"])
    assert 2 <= len(quick) <= 10
    assert set(quick) <= set(compare.parse_shapes("default"))
    assert any(c.N > compare.LIGER_MAX_N for c in quick)  # Liger's skip is exercised


def test_explicit_shapes(compare):
    cases = compare.parse_shapes(["rms:bf16:8192x4096,LN:fp16:4096x1024", "rms:fp32:2x3", "rms:bf16:8192x4096"])
    assert [(c.norm, c.dtype, c.M, c.N) for c in cases] == [
        ("rms", "bf16", 8192, 4096), ("ln", "fp16", 4096, 1024), ("rms", "fp32", 2, 3)]
    mixed = compare.parse_shapes(["quick", "rms:bf16:7x9"])
    assert mixed[-1].label == "rms:bf16:7x9"


@pytest.mark.parametrize("bad", ["rms:bf16", "gn:bf16:1x2", "rms:int8:1x2", "rms:bf16:1y2", "rms:bf16:0x8", ""])
def test_bad_shapes(compare, bad):
    with pytest.raises(ValueError):
        compare.parse_shapes(bad)


def test_impl_subset(compare):
    assert compare.parse_impls(None) == IMPLS
    assert compare.parse_impls(["quack,liger,normjit"]) == ["normjit", "liger", "quack"]
    with pytest.raises(ValueError):
        compare.parse_impls(["cudnn"])


# ------------------------------------------------------------ compare.py: profiler events


def fake_profile(calls, flush="at::native::FillFunctor<unsigned char>", marker="spin_kernel(long)"):
    """Events of one session: per call a setup copy, the flush, a marker, the call's activities, a marker."""
    events, t = [], 0.0
    for acts in calls:
        for name, dur in [("Memcpy DtoD (Device -> Device)", 3.0), (flush, 40.0), (marker, 1.0)] + acts + \
                [(marker, 1.0)]:
            events.append((name, t, t + dur))
            t += dur + 0.5
    return events


def test_split_calls_sums_the_marked_activities(compare):
    calls = [[("normjit_rms_fwd", 10.0)], [("rms_bwd", 20.0), ("Memset (Device)", 1.0), ("reduce", 2.0)]]
    events = fake_profile(calls)
    got = compare.split_calls(list(reversed(events)))  # any order
    assert [round(s, 6) for s, _ in got] == [10.0, 23.0]
    assert got[1][1] == ["rms_bwd", "Memset (Device)", "reduce"]  # no flush, no setup copy


def test_split_calls_drops_annotation_spans(compare):
    events = fake_profile([[("k1", 5.0), ("k2", 5.0)]])
    k1 = next(e for e in events if e[0] == "k1")
    k2 = next(e for e in events if e[0] == "k2")
    events.append(("CompiledFunction", k1[1], k2[2]))  # a GPU-side annotation enclosing both
    assert compare.split_calls(events)[0][0] > 10.0  # counted when not dropped
    assert compare.split_calls(events, drop_enclosing=True) == [(10.0, ["k1", "k2"])]


def test_split_calls_odd_markers(compare):
    events = fake_profile([[("k", 1.0)]])[:-1]
    with pytest.raises(ValueError):
        compare.split_calls(events)
    assert compare.split_calls([("k", 0.0, 1.0)]) == []  # no markers: no calls


def test_interleaved_order_rotates(compare):
    names = ["normjit", "liger", "(copy)"]
    order = compare.interleaved_order(names, 3)
    assert len(order) == 9
    for r in range(3):  # each repetition runs every name once
        assert sorted(order[3 * r:3 * r + 3]) == sorted(names)
    for n in names:  # and each name takes every place once
        assert sorted(order.index(n, 3 * r, 3 * r + 3) - 3 * r for r in range(3)) == [0, 1, 2]


def test_calls_by_name_gives_each_call_back(compare):
    names = ["a", "b"]
    order = compare.interleaved_order(names, 2)  # a b, b a
    calls = [[(n, float(10 * (i + 1)))] for i, n in enumerate(order)]
    timed = compare.split_calls(fake_profile(calls))
    got = compare.calls_by_name(timed, order)
    assert [s for s, _ in got["a"]] == [10.0, 40.0]
    assert [s for s, _ in got["b"]] == [20.0, 30.0]
    assert got["b"][0][1] == ["b"]
    with pytest.raises(RuntimeError):  # a profile that lost a call
        compare.calls_by_name(timed[:-1], order)


class FakeRange:
    def __init__(self, start, end):
        self.start, self.end = start, end


class FakeEvent:
    def __init__(self, name, start, end, device="DeviceType.CUDA", annotation=None, activity=None):
        self.name, self.time_range, self.device_type = name, FakeRange(start, end), device
        if annotation is not None:
            self.is_user_annotation = annotation
        if activity is not None:
            self.activity_type = activity


def test_device_activities(compare):
    evs = [FakeEvent("aten::zero_", 0, 5, device="DeviceType.CPU", annotation=False),
           FakeEvent("kernel", 1, 2, annotation=False, activity="kernel"),
           FakeEvent("ProfilerStep#1", 0, 9, annotation=True),
           FakeEvent("span", 0, 9, annotation=False, activity="gpu_user_annotation")]
    assert compare.device_activities(evs) == ([("kernel", 1.0, 2.0)], True)
    old = [FakeEvent("kernel", 1, 2), FakeEvent("span", 0, 9)]  # a torch without the flag
    assert compare.device_activities(old) == ([("kernel", 1.0, 2.0), ("span", 0.0, 9.0)], False)


# ------------------------------------------------------------ compare_report.py


def entry(us, status="ok", **kw):
    return {"status": status, "us": us, "gbps": None if us is None else 1000.0 / us, "sol_pct": None, **kw}


def synthetic_rows(compare, report):
    rows = []
    for direction in ("fwd", "bwd"):
        for n, nj_us in ((1024, 10.0), (2048, 18.0), (4096, 35.0)):
            nbytes = compare.traffic_bytes("rms", direction, 32768, n, "bf16")
            impls = {
                "normjit": entry(nj_us, host_us=30.0),
                "eager": entry(nj_us * 2, host_us=12.0),
                "compile": entry(nj_us * 1.25, host_us=40.0),
                "liger": entry(nj_us * 0.9, status="failed_check", rel_err={"y": 0.5}),  # faster but wrong
                "quack": entry(nj_us * (0.8 if n == 4096 else 1.6), host_us=20.0),
            }
            for e in impls.values():
                e["gbps"] = compare.gbps(nbytes, e["us"])
                e["sol_pct"] = 0.9 * nj_us / e["us"] * 100
            rows.append(report.annotate({
                "label": f"rms:bf16:32768x{n}", "norm": "rms", "dtype": "bf16", "M": 32768, "N": n,
                "direction": direction, "bytes": nbytes, "tolerance": 0.03, "copy_us": 0.9 * nj_us,
                "copy_gbps": compare.gbps(nbytes, 0.9 * nj_us), "impls": impls}))
    # a decode shape where Liger is skipped and Quack raised
    for direction in ("fwd", "bwd"):
        rows.append(report.annotate({
            "label": "rms:bf16:1x4096", "norm": "rms", "dtype": "bf16", "M": 1, "N": 4096, "direction": direction,
            "bytes": 100, "tolerance": 0.03, "copy_us": 2.0, "copy_gbps": 0.05,
            "impls": {"normjit": entry(3.0, host_us=9.0), "eager": entry(6.0, host_us=8.0),
                      "compile": entry(None, status="unavailable", reason="RuntimeError: boom"),
                      "liger": entry(None, status="skipped", reason="N > 65536"),
                      "quack": entry(None, status="unavailable", reason="ModuleNotFoundError: quack")}}))
    return rows


def test_best_peer_and_ratio(compare, report):
    rows = synthetic_rows(compare, report)
    r = rows[0]  # 1024 fwd: compile 1.25x, liger faster but failed its check
    assert (r["best_peer"], r["best_peer_us"]) == ("compile", 12.5)
    assert r["ratio"] == pytest.approx(1.25)
    r = rows[2]  # 4096 fwd: quack 0.8x
    assert r["best_peer"] == "quack" and r["ratio"] == pytest.approx(0.8)
    assert rows[-1]["best_peer"] == "eager" and rows[-1]["ratio"] == pytest.approx(2.0)
    lone = {"impls": {"normjit": entry(None, status="unavailable"), "eager": entry(4.0)}}
    assert report.annotate(lone)["ratio"] is None and lone["best_peer"] == "eager"


def test_geomean_and_summary(compare, report):
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert report.geomean([]) is None
    s = report.summarize(synthetic_rows(compare, report))
    assert set(s) == {"fwd", "bwd"}
    fwd = s["fwd"]
    # ratios 1.25, 1.25, 0.8, 2.0
    assert fwd["vs_best"]["rows"] == 4
    assert fwd["vs_best"]["geomean"] == pytest.approx((1.25 * 1.25 * 0.8 * 2.0) ** 0.25)
    assert fwd["vs"]["eager"] == {"geomean": pytest.approx(2.0), "rows": 4}
    assert "liger" not in fwd["vs"]  # never passed its check
    assert fwd["below_1"] == [{"label": "rms:bf16:32768x4096", "ratio": pytest.approx(0.8), "peer": "quack"}]


def test_markdown_report(compare, report):
    rows = synthetic_rows(compare, report)
    doc = {"meta": {"gpu": "Test GPU", "compute_capability": "9.0", "sm_count": 132, "l2_bytes": 50 * 2**20,
                    "versions": {"torch": "2.11.0", "quack-kernels": "0.6.5", "liger-kernel": None},
                    "implementations": IMPLS, "tune_policy": "first", "timing": "Kernel time: test.",
                    "skipped_over_time": ["ln:fp16:4096x768"]},
           "rows": rows}
    text = report.markdown(doc)
    assert "GPU: Test GPU (sm_90, 132 SMs, L2 50 MiB)." in text
    assert "torch 2.11.0" in text and "liger-kernel None" not in text
    assert "## Forward (kernel time)" in text and "## Backward (kernel time)" in text
    assert "| shape | normjit us | SOL% | GB/s | best peer | peer us | ratio | torch eager | torch.compile | " \
           "Liger | Quack | copy us |" in text
    assert "| rms:bf16:32768x1024 | 10.0 | 90.0% |" in text
    assert "| torch.compile | 12.5 | 1.25x | 20.0 | 12.5 | 9.00* | 16.0 | 9.00 |" in text
    assert "Below 1.0x (1): rms:bf16:32768x4096 0.80x (Quack)." in text
    assert "best peer / normjit: **1.26x** over 4 shapes; against each peer: torch eager 2.00x (4)" in text
    assert "## Host time per call" in text
    assert "| rms:bf16:1x4096 | 9.00 / 9.00 | 8.00 / 8.00 | - | - | - |" in text
    assert "rms:bf16:1x4096 liger (fwd, bwd): skipped: N > 65536" in text
    assert "rms:bf16:32768x1024 liger (fwd, bwd): failed_check: relative error y=5.00e-01 over tolerance 0.03" in text
    assert "Not run (over --max-seconds): ln:fp16:4096x768." in text
    line = report.progress_line(rows[0], IMPLS)
    assert line.startswith("rms:bf16:32768x1024") and "normjit 10.0 (90% SOL)" in line
    assert "liger 9.00*" in line and line.endswith("best peer compile: 1.25x")
    assert report.fmt_us(1857.1) == "1857" and report.fmt_us(4.671) == "4.67"


def test_report_cli_renders_markdown(compare, report, tmp_path):
    src = tmp_path / "compare.json"
    rows = synthetic_rows(compare, report)
    for r in rows:
        r.pop("ratio")  # the CLI computes it again
    src.write_text(json.dumps({"meta": {"gpu": "Test GPU", "implementations": IMPLS}, "rows": rows}))
    md = tmp_path / "out" / "compare.md"
    out = subprocess.run([sys.executable, str(REPORT), str(src), "--markdown", str(md)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Below 1.0x (1)" in md.read_text()


# ------------------------------------------------------------ compare.py: command line


def test_compare_without_torch_exits_3(tmp_path):
    if torch_importable():
        pytest.skip("torch is importable here; the no-torch exit is checked where torch is absent")
    out = subprocess.run([sys.executable, str(COMPARE), "--quick", "--json", str(tmp_path / "c.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 3
    assert "torch" in out.stderr.lower()
    assert not (tmp_path / "c.json").exists()


def test_compare_bad_shape_exits_2():
    out = subprocess.run([sys.executable, str(COMPARE), "--shapes", "rms:bf16:axb"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "MxN" in out.stderr


def test_compare_help_lists_options():
    out = subprocess.run([sys.executable, str(COMPARE), "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for opt in ("--tune", "--max-seconds", "--markdown", "--reps", "--host-calls", "--quick", "--shapes"):
        assert opt in out.stdout


# ------------------------------------------------------------ plot.py


def test_plot_families(compare, report):
    plot = load(PLOT, "normjit_plot_under_test")
    rows = synthetic_rows(compare, report)
    extra = dict(rows[0], M=16384, label="rms:bf16:16384x1024")  # smaller M*N at an N already there
    fams = plot.families(rows + [extra])
    assert list(fams) == [("rms", "bf16")]
    assert [r["N"] for r in fams[("rms", "bf16")]["fwd"]] == [1024, 2048, 4096]  # decode M=1 left out
    assert fams[("rms", "bf16")]["fwd"][0]["M"] == 32768
    assert set(fams[("rms", "bf16")]) == {"fwd", "bwd"}


@pytest.mark.parametrize("metric", ["gbps", "sol"])
def test_plot_writes_png(compare, report, tmp_path, metric):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    src = tmp_path / "compare.json"
    src.write_text(json.dumps({"meta": {"gpu": "Test GPU", "implementations": IMPLS},
                               "rows": synthetic_rows(compare, report)}))
    png = tmp_path / "out" / "compare.png"
    out = subprocess.run([sys.executable, str(PLOT), str(src), "--out", str(png), "--metric", metric],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "1 families" in out.stdout
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
