"""normjit: run-time compiled RMSNorm and LayerNorm CUDA kernels, from Python.

A pure-Python package over the C ABI (libnormjit_c.so, loaded with ctypes).
RMSNorm: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization".
LayerNorm: Ba et al. 2016, "Layer Normalization".

This module needs only the standard library. The PyTorch functions, autograd
functions and nn.Modules live in ``normjit.torch`` (which imports torch).

One engine (compiled kernels, tuned configs, caches) serves the process. It
is created at first use from the environment (NORMJIT_CACHE_DIR, NORMJIT_TUNE,
NORMJIT_SHIPPED_CACHE_PATH) and created anew when set_cache_dir() or
set_tune_policy() change a setting.

The library is looked for in this order: $NORMJIT_LIBRARY; libnormjit_c.so
inside this package's folder (installed from the wheel: `pip install .` at the
repository root); <repository>/build/libnormjit_c.so when the package is used
from a checkout (PYTHONPATH=tools/python); ctypes.util.find_library("normjit_c").

Shipped tuned caches: the wheel bundles autotune_cache/ inside this package's
folder (bundled_cache_dir()); the engine searches it after the directories of
$NORMJIT_SHIPPED_CACHE_PATH, where it searches the library's built-in shipped
caches, unless NORMJIT_BUILTIN_CACHES=0.
"""

import ctypes
import os
import threading

from . import _capi
from ._capi import NormjitError

__version__ = "0.1.0"

__all__ = [
    "NormjitError",
    "__version__",
    "api_version",
    "bundled_cache_dir",
    "cache_dir",
    "engine_version",
    "library_path",
    "set_cache_dir",
    "set_tune_policy",
    "tune_policy",
]

_lock = threading.Lock()
_settings = {"cache_dir": None, "tune_policy": None}  # None: from the environment
_engine = None
# Engines replaced by a settings change. Kernels they launched may still be
# running on some stream, so they are kept alive rather than destroyed.
_retired = []
# Called (no arguments) after a settings change drops the engine: holders of
# its handle (normjit.torch's C++ operators) take the new one.
_engine_listeners = []


def library_path():
    """Path of the loaded libnormjit_c.so (str). Loads it at the first call.

    Raises NormjitError (kind "library_not_found") listing the places tried.
    """
    return _capi.library_path()


def api_version():
    """The C API version of the loaded library (int; this package needs 1)."""
    return int(_capi.load().normjit_api_version())


def engine_version():
    """The engine's version string, "MAJOR.MINOR.PATCH"."""
    return _capi.load().normjit_version_string().decode()


def bundled_cache_dir():
    """The shipped caches bundled in this package's folder (str): tuned
    configs per GPU (<device>.json), models/ and grid/; None when there are
    none (the package used from a checkout or installed without the library).
    """
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autotune_cache")
    return d if os.path.isdir(d) else None


def _shipped_cache_path():
    """The shipped_cache_path given to normjit_engine_create (str), or None to
    leave it NULL (the engine then reads $NORMJIT_SHIPPED_CACHE_PATH itself).

    The C option replaces the environment variable, so its directories come
    first, then bundled_cache_dir(): searched after them, as the library's
    built-in shipped caches are, and left out with NORMJIT_BUILTIN_CACHES=0.
    """
    bundled = bundled_cache_dir()
    if bundled is None or os.environ.get("NORMJIT_BUILTIN_CACHES") == "0":
        return None
    dirs = [d for d in os.environ.get("NORMJIT_SHIPPED_CACHE_PATH", "").split(":") if d]
    return ":".join(dirs + [bundled])


def _engine_handle():
    """The process-wide engine (a C handle as int), created at first use."""
    global _engine
    with _lock:
        if _engine is None:
            lib = _capi.load()
            opts = _capi.EngineOptions()
            status = lib.normjit_engine_options_init(ctypes.byref(opts))
            if _settings["tune_policy"] is None:
                _capi.check(status)  # a bad $NORMJIT_TUNE matters only when it is used
            else:
                opts.tune_policy = _capi.TUNE_POLICIES[_settings["tune_policy"]]
            cache = _settings["cache_dir"]
            keep = cache.encode() if cache is not None else None  # alive during the call
            if keep is not None:
                opts.cache_dir = keep
            shipped = _shipped_cache_path()
            keep_shipped = shipped.encode() if shipped is not None else None
            if keep_shipped is not None:
                opts.shipped_cache_path = keep_shipped
            handle = ctypes.c_void_p()
            _capi.check(lib.normjit_engine_create(ctypes.byref(opts), ctypes.byref(handle)))
            _engine = handle.value
        return _engine


def _reconfigure(key, value):
    global _engine
    with _lock:
        if _settings[key] == value:
            return
        _settings[key] = value
        if _engine is not None:
            _retired.append(_engine)
            _engine = None
    for listener in _engine_listeners:
        listener()


def set_cache_dir(path):
    """Sets the user cache directory (tuned configs in tuned/, compiled kernels
    in kernels/) of the process-wide engine.

    path: a str or os.PathLike; None returns to the default
    ($NORMJIT_CACHE_DIR, else $XDG_CACHE_HOME/normjit, else ~/.cache/normjit).
    Raises TypeError for another type, ValueError for an empty path.
    """
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str, os.PathLike or None, got {type(path).__name__}: {path!r}")
        path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError(f"path must be a text path, got {path!r}")
        if not path:
            raise ValueError("path = '' is empty; pass None for the default cache directory")
    _reconfigure("cache_dir", path)


def cache_dir():
    """The user cache directory the engine uses (str)."""
    handle = _engine_handle()
    lib = _capi.load()
    return _capi.read_string(lambda buf, n: lib.normjit_engine_cache_dir(handle, buf, n), 4096)


def set_tune_policy(policy):
    """Sets when the process-wide engine autotunes a shape without a tuned config.

    policy: "never" (use the caches, else the config model's config from the device's facts; never tune),
    "first" (tune a shape missing from every cache at its first call and store
    the result), "always" (tune every shape once per engine), or None for the
    default ($NORMJIT_TUNE, else "never"). Raises ValueError for another value.
    """
    if policy is not None and policy not in _capi.TUNE_POLICIES:
        raise ValueError(f"policy = {policy!r} is not one of 'never', 'first', 'always' (or None)")
    _reconfigure("tune_policy", policy)


def tune_policy():
    """The tune policy in effect: "never", "first" or "always".

    Raises NormjitError when it comes from a $NORMJIT_TUNE that is not a policy.
    """
    with _lock:
        if _settings["tune_policy"] is not None:
            return _settings["tune_policy"]
    lib = _capi.load()
    opts = _capi.EngineOptions()
    _capi.check(lib.normjit_engine_options_init(ctypes.byref(opts)))
    return {v: k for k, v in _capi.TUNE_POLICIES.items()}[opts.tune_policy]
