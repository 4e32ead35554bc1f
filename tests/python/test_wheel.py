"""The installed wheel (pyproject.toml): the library and the shipped caches lie
inside the package folder, the library needs nothing beyond libc/libstdc++,
the caches reach the engine, and normjit.torch imports. Runs against the
installed package only (NORMJIT_TEST_INSTALLED=1, as tools/test.sh does)."""

import ctypes
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import normjit
from normjit import _capi

from conftest import INSTALLED

if not INSTALLED:
    pytest.skip("checks the installed wheel (NORMJIT_TEST_INSTALLED=1, tools/test.sh)", allow_module_level=True)

PACKAGE = Path(normjit.__file__).resolve().parent
# Shared libraries every Linux has; the dynamic loader is named by code that uses TLS.
SYSTEM_LIBS = re.compile(r"^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.so(\.[0-9]+)*$|^ld-linux.*\.so")
TORCH_LIBS = re.compile(r"^(libtorch|libc10)[A-Za-z0-9_]*\.so(\.[0-9]+)*$")


def clean_env():
    env = dict(os.environ)
    for k in ("NORMJIT_LIBRARY", "PYTHONPATH", "NORMJIT_SHIPPED_CACHE_PATH", "NORMJIT_BUILTIN_CACHES"):
        env.pop(k, None)
    return env


def run_python(code, tmp_path):
    """Runs code in a new interpreter outside the checkout; returns its stdout."""
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean_env(), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def dynamic_section(path):
    """(NEEDED names, RPATH/RUNPATH entries) of an ELF file, from readelf -d."""
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    text = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)
    paths = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[([^\]]+)\]", text)
    return needed, [p for entry in paths for p in entry.split(":")]


def test_package_is_installed_not_the_checkout():
    assert (PACKAGE / "__init__.py").is_file()
    assert "tools/python" not in PACKAGE.as_posix()
    assert importlib.metadata.version("normjit") == normjit.__version__


def test_library_is_loaded_from_the_package(tmp_path):
    path = run_python("import normjit; print(normjit.library_path())", tmp_path).strip()
    assert Path(path).resolve() == PACKAGE / "libnormjit_c.so"
    assert ("bundled", str(PACKAGE / "libnormjit_c.so")) in _capi.candidate_paths()
    assert normjit.engine_version() == normjit.__version__


def test_bundled_library_needs_only_system_libraries():
    needed, _ = dynamic_section(PACKAGE / "libnormjit_c.so")
    assert needed and all(SYSTEM_LIBS.match(n) for n in needed), needed


def test_bundled_torch_extension_needs_only_torch_and_normjit():
    ext = PACKAGE / "libnormjit_torch.so"
    if not ext.exists():
        pytest.skip("the wheel was built without libnormjit_torch.so (no torch at build time)")
    needed, rpath = dynamic_section(ext)
    bad = [n for n in needed if not (SYSTEM_LIBS.match(n) or TORCH_LIBS.match(n) or n == "libnormjit_c.so")]
    assert not bad, needed
    if "libnormjit_c.so" in needed:
        assert "$ORIGIN" in rpath, f"libnormjit_c.so is found next to it only with RPATH $ORIGIN: {rpath}"


def test_shipped_caches_are_bundled():
    d = normjit.bundled_cache_dir()
    assert d is not None and Path(d) == PACKAGE / "autotune_cache"
    tuned = [p.name for p in Path(d).glob("*.json")]
    assert any(re.match(r".*\.cc[0-9]+\.[0-9]+sm\.[0-9]+mib\.json$", n) for n in tuned), tuned
    assert list(Path(d, "models").glob("*.config.json"))
    assert not list(Path(d).rglob("*.lock"))
    # The same files as the checkout's autotune_cache/, when the tests run from one.
    source = Path(__file__).resolve().parents[2] / "autotune_cache"
    if source.is_dir():
        for f in source.glob("*.json"):
            assert (Path(d) / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("env,expected", [
    ({}, "{bundled}"),
    ({"NORMJIT_SHIPPED_CACHE_PATH": "/a:/b"}, "/a:/b:{bundled}"),
    ({"NORMJIT_BUILTIN_CACHES": "0"}, None),
])
def test_bundled_caches_are_passed_to_the_engine(monkeypatch, env, expected):
    for k in ("NORMJIT_SHIPPED_CACHE_PATH", "NORMJIT_BUILTIN_CACHES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    lib = _capi.load()
    create = lib.normjit_engine_create
    seen = []

    def spy(options, out):
        seen.append(options._obj.shipped_cache_path)  # options: byref(EngineOptions)
        return create(options, out)

    monkeypatch.setattr(lib, "normjit_engine_create", spy)
    monkeypatch.setattr(normjit, "_engine", None)  # a new engine for this test; the old one comes back after
    handle = normjit._engine_handle()
    try:
        want = None if expected is None else expected.format(bundled=normjit.bundled_cache_dir()).encode()
        assert seen == [want]
    finally:
        lib.normjit_engine_destroy(ctypes.c_void_p(handle))


def torch_or_skip():
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


def test_import_normjit_torch(tmp_path):
    torch_or_skip()
    code = ("import normjit.torch, normjit\n"
            "from normjit import _ops\n"
            "print(normjit.torch.__file__); print(normjit.library_path())\n"
            "print(_ops.load() is not None)\n"
            "maps = open('/proc/self/maps').read()\n"
            "print(sorted({l.split()[-1] for l in maps.splitlines() if 'libnormjit' in l}))\n")
    module, library, has_ops, mapped = run_python(code, tmp_path).splitlines()
    assert Path(module).resolve().parent == PACKAGE
    assert Path(library).resolve() == PACKAGE / "libnormjit_c.so"
    ext = PACKAGE / "libnormjit_torch.so"
    if ext.exists():  # the C++ operators, from the package folder
        assert has_ops == "True" and str(ext) in mapped, mapped
    else:
        assert has_ops == "False"


def test_ctypes_fallback_without_the_torch_extension(tmp_path):
    torch_or_skip()
    code = ("import os, warnings\n"
            "os.environ['NORMJIT_TORCH_LIBRARY'] = os.path.join(os.getcwd(), 'none.so')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    import normjit.torch as njt\n"
            "from normjit import _ops\n"
            "print(_ops.load() is None, any('ctypes path' in str(x.message) for x in w))\n"
            "print(callable(njt.rms_norm), isinstance(njt.RMSNorm(8), object))\n")
    assert run_python(code, tmp_path).split() == ["True", "True", "True", "True"]
