"""The C ABI through ctypes, without torch: versions, status names, struct
layouts, argument errors, per-thread messages, engine settings."""

import ctypes
import re
import threading
from pathlib import Path

import pytest

import normjit
from normjit import _capi

from conftest import library_or_skip_reason

_ok, _why = library_or_skip_reason()
if not _ok:
    pytest.skip(_why, allow_module_level=True)

lib = _capi.load()


def _pyproject_version():
    text = (Path(__file__).resolve().parents[2] / "tools" / "python" / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def _desc(M=8, N=64):
    d = _capi.new_desc()
    d.M, d.N = M, N
    return d


def _expect_invalid(status, part):
    assert _capi.status_name(status) == "NORMJIT_INVALID_ARGUMENT", _capi.last_error_message()
    assert part in _capi.last_error_message()


def test_versions():
    assert normjit.api_version() == _capi.API_VERSION == 2
    assert normjit.engine_version() == normjit.__version__ == _pyproject_version()
    assert Path(normjit.library_path()).name.startswith("libnormjit_c")


def test_status_names_match_the_package_kinds():
    for status, kind in _capi._KIND_NAMES.items():
        assert _capi.status_name(status) == "NORMJIT_" + kind.upper()
        assert normjit.NormjitError(status, "m").kind == kind
    assert _capi.status_name(len(_capi._KIND_NAMES)) == "NORMJIT_UNKNOWN_STATUS"
    assert normjit.NormjitError(99, "m").kind == "unknown"
    assert issubclass(normjit.NormjitError, RuntimeError)


def test_struct_layouts_and_defaults():
    # The library writes struct_size = its sizeof, and the defaults at its
    # offsets: reading them back through ctypes checks both layouts agree.
    d = _capi.new_desc()
    assert d.struct_size == ctypes.sizeof(_capi.NormDesc)
    assert (d.norm, d.M, d.N, d.heads) == (_capi.NORM_RMS, 0, 0, 1)
    assert (d.x_dtype, d.y_dtype, d.weight_dtype) == (_capi.BF16,) * 3
    assert (d.residual_dtype, d.residual_out_dtype) == (_capi.BF16,) * 2
    assert d.eps == pytest.approx(1e-6)
    assert (d.has_weight, d.has_bias, d.weight_offset) == (1, 0, 0.0)
    assert (d.residual, d.store_residual_out, d.has_dresidual) == (0, 0, 0)
    assert (d.cast_mode, d.store_rstd, d.store_mean) == (_capi.CAST_DEFAULT, 1, 1)
    f = _capi.new_forward_tensors()
    assert f.struct_size == ctypes.sizeof(_capi.ForwardTensors)
    assert all(getattr(f, name) is None for name, _ in _capi.ForwardTensors._fields_[1:])
    b = _capi.new_backward_tensors()
    assert b.struct_size == ctypes.sizeof(_capi.BackwardTensors)
    assert b.workspace_bytes == 0 and b.dx is None


def test_bad_arguments_are_named(engine):
    d = _desc()
    t = _capi.new_forward_tensors()
    _expect_invalid(lib.normjit_forward(None, ctypes.byref(d), ctypes.byref(t), None), "engine = NULL")
    _expect_invalid(lib.normjit_forward(engine, None, ctypes.byref(t), None), "desc = NULL")
    d.N = 0
    _expect_invalid(lib.normjit_forward(engine, ctypes.byref(d), ctypes.byref(t), None), "N = 0")
    d = _desc(M=-3)
    n = ctypes.c_size_t(777)
    _expect_invalid(lib.normjit_backward_workspace_size(engine, ctypes.byref(d), ctypes.byref(n)), "M = -3")
    assert n.value == 777  # nothing written
    d = _desc()
    d.struct_size = 5
    _expect_invalid(lib.normjit_forward(engine, ctypes.byref(d), ctypes.byref(t), None), "desc->struct_size = 5")
    d = _desc()
    d.x_dtype = 9
    _expect_invalid(lib.normjit_forward(engine, ctypes.byref(d), ctypes.byref(t), None), "desc->x_dtype = 9")
    with pytest.raises(normjit.NormjitError) as e:
        _capi.check(lib.normjit_forward(None, None, None, None))
    assert e.value.kind == "invalid_argument" and e.value.status == _capi.INVALID_ARGUMENT
    assert "engine = NULL" in str(e.value)


def test_small_buffer_names_the_size(engine):
    full = _capi.read_string(lambda buf, n: lib.normjit_engine_cache_dir(engine, buf, n), 8)  # grows
    buf = ctypes.create_string_buffer(b"untouched", 10)
    _expect_invalid(lib.normjit_engine_cache_dir(engine, buf, 3), f"{len(full.encode()) + 1} bytes are needed")
    assert buf.value == b"untouched"


def test_error_message_is_per_thread_and_cleared_on_success():
    _capi.check(lib.normjit_norm_desc_init(ctypes.byref(_capi.NormDesc())))
    assert _capi.last_error_message() == ""
    assert lib.normjit_forward(None, None, None, None) == _capi.INVALID_ARGUMENT
    mine = _capi.last_error_message()
    seen = {}

    def other():
        seen["before"] = _capi.last_error_message()
        lib.normjit_norm_desc_init(None)
        seen["after"] = _capi.last_error_message()

    th = threading.Thread(target=other)
    th.start()
    th.join()
    assert seen["before"] == ""
    assert "desc = NULL" in seen["after"]
    assert _capi.last_error_message() == mine
    _capi.new_desc()
    assert _capi.last_error_message() == ""


def test_config_for_reports_a_missing_gpu_or_returns_a_config(engine):
    d = _desc(M=16, N=128)
    src = ctypes.c_int32(-1)
    buf = ctypes.create_string_buffer(64)
    status = lib.normjit_config_for(engine, _capi.OP_FORWARD, ctypes.byref(d), buf, 64, ctypes.byref(src))
    if status == _capi.SUCCESS:
        assert re.fullmatch(r"v\d+\.t\d+\.r\d+.*", buf.value.decode())
        assert lib.normjit_config_source_name(src.value).decode() != "unknown"
    else:
        assert status in (_capi.LIBRARY_NOT_FOUND, _capi.NO_DEVICE, _capi.DRIVER), _capi.last_error_message()
        assert _capi.last_error_message()
        assert src.value == -1 and buf.value == b""


def test_cache_dir_and_tune_policy_settings(tmp_path, restore_settings, monkeypatch):
    normjit.set_cache_dir(tmp_path / "c1")
    assert normjit.cache_dir() == str(tmp_path / "c1")
    normjit.set_cache_dir(str(tmp_path / "c2"))
    assert normjit.cache_dir() == str(tmp_path / "c2")  # a new engine took the setting
    for p in ("first", "always", "never"):
        normjit.set_tune_policy(p)
        assert normjit.tune_policy() == p
    with pytest.raises(ValueError, match="'sometimes'"):
        normjit.set_tune_policy("sometimes")
    with pytest.raises(TypeError, match="123"):
        normjit.set_cache_dir(123)
    with pytest.raises(ValueError, match="empty"):
        normjit.set_cache_dir("")
    normjit.set_tune_policy(None)
    monkeypatch.setenv("NORMJIT_TUNE", "always")
    assert normjit.tune_policy() == "always"
    monkeypatch.setenv("NORMJIT_TUNE", "bogus")
    with pytest.raises(normjit.NormjitError, match="NORMJIT_TUNE = 'bogus'") as e:
        normjit.tune_policy()
    assert e.value.kind == "invalid_argument"
    monkeypatch.delenv("NORMJIT_TUNE")
    monkeypatch.setenv("NORMJIT_CACHE_DIR", str(tmp_path / "env"))
    normjit.set_cache_dir(None)
    assert normjit.cache_dir() == str(tmp_path / "env")


def test_library_lookup_order_and_error(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMJIT_LIBRARY", str(tmp_path / "libnormjit_c.so"))
    paths = _capi.candidate_paths()
    assert [w for w, _ in paths][:3] == ["$NORMJIT_LIBRARY", "bundled", "repository build"]
    assert paths[0][1] == str(tmp_path / "libnormjit_c.so")
    assert paths[1][1] == str(Path(_capi.__file__).resolve().parent / "libnormjit_c.so")
    # With nothing loadable, the error lists every place tried.
    monkeypatch.setattr(_capi, "_lib", None)
    monkeypatch.setattr(_capi, "candidate_paths", lambda: [("$NORMJIT_LIBRARY", str(tmp_path / "none.so")),
                                                           ('find_library("normjit_c")', None)])
    with pytest.raises(normjit.NormjitError) as e:
        _capi.load()
    assert e.value.kind == "library_not_found"
    assert str(tmp_path / "none.so") in str(e.value) and "find_library" in str(e.value)
