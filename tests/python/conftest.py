"""Shared setup of the Python suites: the package is imported from
tools/python (as PYTHONPATH=tools/python would), or, with
NORMJIT_TEST_INSTALLED=1, the installed one (the wheel, tools/test.sh), and the
process-wide engine settings are restored after each test that changes them."""

import os
import sys
from pathlib import Path

import pytest

_PACKAGE_DIR = Path(__file__).resolve().parents[2] / "tools" / "python"
INSTALLED = os.environ.get("NORMJIT_TEST_INSTALLED") == "1"
if not INSTALLED and str(_PACKAGE_DIR) not in sys.path:
    sys.path.insert(0, str(_PACKAGE_DIR))

import normjit  # noqa: E402

if INSTALLED and Path(normjit.__file__).resolve().parent.parent == _PACKAGE_DIR:
    raise RuntimeError(f"NORMJIT_TEST_INSTALLED=1 but normjit was imported from the checkout ({normjit.__file__}); "
                       "take tools/python off PYTHONPATH")


def library_or_skip_reason():
    """(True, path) when libnormjit_c.so loads, else (False, why)."""
    try:
        return True, normjit.library_path()
    except normjit.NormjitError as e:
        return False, f"libnormjit_c.so cannot be loaded (build it and set NORMJIT_LIBRARY): {e}"


def gpu_torch_or_skip(fp8=False):
    """torch, for a module of GPU tests; else skips the whole module, saying
    why: no torch, no CUDA device, (fp8) no float8 dtypes, or no library.
    Call it at module level."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("GPU test: CUDA is not available (torch.cuda.is_available() is False)", allow_module_level=True)
    if fp8 and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8 dtypes", allow_module_level=True)
    ok, why = library_or_skip_reason()
    if not ok:
        pytest.skip(f"GPU test: {why}", allow_module_level=True)
    return torch


@pytest.fixture
def restore_settings():
    """Returns the process-wide engine to its environment defaults afterwards."""
    yield
    normjit.set_cache_dir(None)
    normjit.set_tune_policy(None)


@pytest.fixture
def engine(tmp_path):
    """A C-ABI engine handle (ctypes) with its user cache in tmp_path, destroyed afterwards."""
    import ctypes

    from normjit import _capi

    lib = _capi.load()
    opts = _capi.EngineOptions()
    _capi.check(lib.normjit_engine_options_init(ctypes.byref(opts)))
    keep = str(tmp_path).encode()
    opts.cache_dir = keep
    handle = ctypes.c_void_p()
    _capi.check(lib.normjit_engine_create(ctypes.byref(opts), ctypes.byref(handle)))
    assert handle.value
    yield handle
    lib.normjit_engine_destroy(handle)
