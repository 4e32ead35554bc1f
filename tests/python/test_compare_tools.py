"""Tests of tools/compare.py (without a GPU) and tools/plot.py."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPARE = ROOT / "tools" / "compare.py"
PLOT = ROOT / "tools" / "plot.py"


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def compare():
    return load(COMPARE, "normjit_compare_under_test")


def torch_importable():
    return importlib.util.find_spec("torch") is not None


# ------------------------------------------------------------ compare.py


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


def test_default_suite_is_the_issues(compare):
    cases = compare.parse_shapes("default")
    labels = [c.label for c in cases]
    assert len(labels) == len(set(labels)) == 22
    for dt in ("fp32", "bf16"):
        for n in (1024, 2048, 4096, 8192):
            assert f"rms:{dt}:32768x{n}" in labels
    for n in (256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
        assert f"ln:fp16:4096x{n}" in labels
    for s in ("rms:bf16:32768x128", "rms:bf16:8192x4096", "rms:bf16:4096x65536",
              "rms:bf16:1024x131072", "rms:bf16:1x4096", "rms:bf16:32x8192"):
        assert s in labels
    ln = [c for c in cases if c.norm == "ln"]
    assert all(c.has_bias and c.eps == 1e-5 for c in ln)
    assert all(not c.has_bias and c.eps == 1e-6 for c in cases if c.norm == "rms")


def test_quick_suite_is_a_small_subset(compare):
    quick = compare.parse_shapes(["quick"])
    assert 2 <= len(quick) <= 10
    assert set(quick) <= set(compare.parse_shapes("default"))


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
    assert compare.parse_impls(None) == ["normjit", "eager", "compile", "liger"]
    assert compare.parse_impls(["liger,normjit"]) == ["normjit", "liger"]
    with pytest.raises(ValueError):
        compare.parse_impls(["cudnn"])


def synthetic_rows(compare):
    rows = []
    for direction in ("fwd", "bwd"):
        for n, nj_us in ((1024, 10.0), (2048, 18.0), (4096, 35.0)):
            nbytes = compare.traffic_bytes("rms", direction, 32768, n, "bf16")
            impls = {
                "normjit": {"us": nj_us, "correct": True},
                "eager": {"us": nj_us * 2, "correct": True},
                "compile": {"us": nj_us * 1.2, "correct": True},
                "liger": {"us": nj_us * 0.9, "correct": False},  # faster but wrong
            }
            for e in impls.values():
                e["gbps"] = compare.gbps(nbytes, e["us"])
                e["sol_pct"] = 0.9 * nj_us / e["us"] * 100
            row = {"label": f"rms:bf16:32768x{n}", "norm": "rms", "dtype": "bf16", "M": 32768, "N": n,
                   "direction": direction, "bytes": nbytes, "copy_us": 0.9 * nj_us,
                   "copy_gbps": compare.gbps(nbytes, 0.9 * nj_us), "impls": impls}
            row["best_other"], row["speedup"] = compare.speedup_of(row, list(impls))
            rows.append(row)
    # a lone shape (no family) with an error
    rows.append({"label": "rms:bf16:1x4096", "norm": "rms", "dtype": "bf16", "M": 1, "N": 4096, "direction": "fwd",
                 "bytes": 100, "copy_us": 2.0, "copy_gbps": 0.05,
                 "impls": {"normjit": {"us": 3.0, "gbps": 0.03, "sol_pct": 66.0, "correct": True},
                           "liger": {"us": None, "error": "unavailable: ModuleNotFoundError", "unavailable": True}},
                 "best_other": None, "speedup": None})
    return rows


def test_speedup_skips_failing_others(compare):
    rows = synthetic_rows(compare)
    assert rows[0]["best_other"] == "compile"
    assert rows[0]["speedup"] == pytest.approx(1.2)
    g = compare.geomean_speedups(rows, ["normjit", "eager", "compile", "liger"])
    assert g["fwd"]["eager"]["geomean"] == pytest.approx(2.0)
    assert "liger" not in g["fwd"]


def test_table_and_failures_format(compare):
    rows = synthetic_rows(compare)
    impls = ["normjit", "eager", "compile", "liger"]
    text = compare.format_table(rows, impls)
    assert "torch.compile" in text and "1.20x" in text and "n/a" in text
    assert "*" in text  # liger flagged
    fails = compare.failure_lines(rows, impls)
    assert any("liger" in f and "unavailable" in f for f in fails)


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


# ------------------------------------------------------------ plot.py


def test_plot_writes_png(compare, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    src = tmp_path / "compare.json"
    src.write_text(json.dumps({"meta": {"gpu": "Test GPU", "implementations": ["normjit", "eager", "compile", "liger"]},
                               "rows": synthetic_rows(compare)}))
    png = tmp_path / "out" / "compare.png"
    out = subprocess.run([sys.executable, str(PLOT), str(src), "--out", str(png)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "2 panels" in out.stdout
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_families(tmp_path, compare):
    plot = load(PLOT, "normjit_plot_under_test")
    fams = plot.families(synthetic_rows(compare))
    assert list(fams) == [("rms", "bf16", "fwd", 32768), ("rms", "bf16", "bwd", 32768)]
    assert [r["N"] for r in fams[("rms", "bf16", "fwd", 32768)]] == [1024, 2048, 4096]
