"""ctypes declarations of the normjit C ABI (engine/include/normjit/normjit.h).

Every struct and function here mirrors the header exactly; the header is the
reference. This module needs nothing but the standard library.
"""

import ctypes
import ctypes.util
import os
import threading
from pathlib import Path

#: The C ABI version these declarations follow (NORMJIT_C_API_VERSION).
API_VERSION = 2

# enum normjit_status
SUCCESS = 0
INVALID_ARGUMENT = 1
LIBRARY_NOT_FOUND = 2
NO_DEVICE = 3
DRIVER = 4
COMPILE = 5
CACHE = 6
TUNING = 7
INTERNAL = 8

# enum normjit_norm_kind, normjit_dtype, normjit_cast_mode, normjit_residual_rounding
NORM_RMS = 0
NORM_LAYER = 1
FP32 = 0
FP16 = 1
BF16 = 2
E4M3 = 3
E5M2 = 4
# enum normjit_quant
QUANT_NONE = 0
QUANT_TENSOR_STATIC = 1
QUANT_TENSOR = 2
QUANT_TOKEN = 3
QUANT_GROUP = 4
QUANT_MX = 5
CAST_DEFAULT = 0
CAST_LLAMA = 1
CAST_GEMMA = 2
RESIDUAL_ROUND_RESIDUAL_DTYPE = 0
RESIDUAL_ROUND_FP32 = 1

# enum normjit_op, normjit_tune_policy, normjit_config_source
OP_FORWARD = 0
OP_BACKWARD = 1
TUNE_NEVER = 0
TUNE_FIRST = 1
TUNE_ALWAYS = 2
TUNE_POLICIES = {"never": TUNE_NEVER, "first": TUNE_FIRST, "always": TUNE_ALWAYS}


class NormjitError(RuntimeError):
    """A failing normjit call.

    Attributes:
        status: the normjit_status code (int), e.g. 1 for NORMJIT_INVALID_ARGUMENT.
        kind: the status as a short name, e.g. "invalid_argument", "no_device".
    The message is the library's full message (normjit_last_error_message).
    """

    def __init__(self, status, message):
        super().__init__(message)
        self.status = int(status)
        self.kind = _KIND_NAMES.get(self.status, "unknown")


_KIND_NAMES = {
    SUCCESS: "success",
    INVALID_ARGUMENT: "invalid_argument",
    LIBRARY_NOT_FOUND: "library_not_found",
    NO_DEVICE: "no_device",
    DRIVER: "driver",
    COMPILE: "compile",
    CACHE: "cache",
    TUNING: "tuning",
    INTERNAL: "internal",
}


class EngineOptions(ctypes.Structure):
    """struct normjit_engine_options"""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("tune_policy", ctypes.c_int32),
        ("cache_dir", ctypes.c_char_p),
        ("shipped_cache_path", ctypes.c_char_p),
        ("disk_kernel_cache", ctypes.c_int32),
        ("verbose", ctypes.c_int32),
    ]


class NormDesc(ctypes.Structure):
    """struct normjit_norm_desc"""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("norm", ctypes.c_int32),
        ("M", ctypes.c_int64),
        ("N", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("x_stride", ctypes.c_int64),
        ("y_stride", ctypes.c_int64),
        ("dy_stride", ctypes.c_int64),
        ("dx_stride", ctypes.c_int64),
        ("x_head_stride", ctypes.c_int64),
        ("y_head_stride", ctypes.c_int64),
        ("dy_head_stride", ctypes.c_int64),
        ("dx_head_stride", ctypes.c_int64),
        ("residual_stride", ctypes.c_int64),
        ("residual_out_stride", ctypes.c_int64),
        ("dresidual_stride", ctypes.c_int64),
        ("x_dtype", ctypes.c_int32),
        ("y_dtype", ctypes.c_int32),
        ("weight_dtype", ctypes.c_int32),
        ("residual_dtype", ctypes.c_int32),
        ("residual_out_dtype", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("has_weight", ctypes.c_int32),
        ("has_bias", ctypes.c_int32),
        ("weight_offset", ctypes.c_float),
        ("residual", ctypes.c_int32),
        ("store_residual_out", ctypes.c_int32),
        ("residual_rounding", ctypes.c_int32),
        ("has_dresidual", ctypes.c_int32),
        ("cast_mode", ctypes.c_int32),
        ("store_rstd", ctypes.c_int32),
        ("store_mean", ctypes.c_int32),
        ("quant", ctypes.c_int32),
        ("quant_group", ctypes.c_int32),
        ("scale_ue8m0", ctypes.c_int32),
        ("scale_col_major", ctypes.c_int32),
        ("scale_stride", ctypes.c_int64),
        ("scale_ub", ctypes.c_float),
        ("store_y_hp", ctypes.c_int32),
        ("y_hp_dtype", ctypes.c_int32),
        ("store_y_t", ctypes.c_int32),
        ("x_group", ctypes.c_int32),
        ("grad_dtype", ctypes.c_int32),
        ("scale_min", ctypes.c_float),
        ("store_amax", ctypes.c_int32),
    ]


class ForwardTensors(ctypes.Structure):
    """struct normjit_forward_tensors"""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("x", ctypes.c_void_p),
        ("residual", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("residual_out", ctypes.c_void_p),
        ("mean", ctypes.c_void_p),
        ("rstd", ctypes.c_void_p),
        ("x_scale", ctypes.c_void_p),
        ("y_scale", ctypes.c_void_p),
        ("amax", ctypes.c_void_p),
        ("y_hp", ctypes.c_void_p),
        ("y_t", ctypes.c_void_p),
    ]


class BackwardTensors(ctypes.Structure):
    """struct normjit_backward_tensors"""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("dy", ctypes.c_void_p),
        ("x", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("mean", ctypes.c_void_p),
        ("rstd", ctypes.c_void_p),
        ("dresidual", ctypes.c_void_p),
        ("dx", ctypes.c_void_p),
        ("dweight", ctypes.c_void_p),
        ("dbias", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("x_scale", ctypes.c_void_p),
    ]


class ShardedDesc(ctypes.Structure):
    """normjit_sharded_desc: a norm over a hidden dimension sharded across ranks."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("norm", ctypes.c_int32),
        ("M", ctypes.c_int64),
        ("N", ctypes.c_int64),
        ("N_total", ctypes.c_int64),
        ("x_dtype", ctypes.c_int32),
        ("y_dtype", ctypes.c_int32),
        ("weight_dtype", ctypes.c_int32),
        ("has_weight", ctypes.c_int32),
        ("has_bias", ctypes.c_int32),
        ("eps", ctypes.c_float),
        ("weight_offset", ctypes.c_float),
    ]


_P = ctypes.POINTER
_c_int = ctypes.c_int
# name: (restype, argtypes)
_FUNCTIONS = {
    "normjit_api_version": (ctypes.c_uint32, []),
    "normjit_version_string": (ctypes.c_char_p, []),
    "normjit_status_name": (ctypes.c_char_p, [_c_int]),
    "normjit_config_source_name": (ctypes.c_char_p, [_c_int]),
    "normjit_last_error_message": (ctypes.c_char_p, []),
    "normjit_engine_options_init": (_c_int, [_P(EngineOptions)]),
    "normjit_norm_desc_init": (_c_int, [_P(NormDesc)]),
    "normjit_forward_tensors_init": (_c_int, [_P(ForwardTensors)]),
    "normjit_backward_tensors_init": (_c_int, [_P(BackwardTensors)]),
    "normjit_engine_create": (_c_int, [_P(EngineOptions), _P(ctypes.c_void_p)]),
    "normjit_engine_destroy": (None, [ctypes.c_void_p]),
    "normjit_forward": (_c_int, [ctypes.c_void_p, _P(NormDesc), _P(ForwardTensors), ctypes.c_void_p]),
    "normjit_backward_workspace_size": (_c_int, [ctypes.c_void_p, _P(NormDesc), _P(ctypes.c_size_t)]),
    "normjit_backward": (_c_int, [ctypes.c_void_p, _P(NormDesc), _P(BackwardTensors), ctypes.c_void_p]),
    "normjit_config_for": (
        _c_int,
        [ctypes.c_void_p, ctypes.c_int32, _P(NormDesc), ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_int32)],
    ),
    "normjit_tune": (
        _c_int,
        [ctypes.c_void_p, ctypes.c_int32, _P(NormDesc), ctypes.c_char_p, ctypes.c_size_t, _P(ctypes.c_double)],
    ),
    "normjit_engine_cache_dir": (_c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]),
    "normjit_sharded_desc_init": (_c_int, [_P(ShardedDesc)]),
    "normjit_sharded_stats": (
        _c_int, [ctypes.c_void_p, _P(ShardedDesc), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]),
    "normjit_sharded_apply": (
        _c_int,
        [ctypes.c_void_p, _P(ShardedDesc)] + [ctypes.c_void_p] * 8,
    ),
    "normjit_sharded_backward_stats": (
        _c_int,
        [ctypes.c_void_p, _P(ShardedDesc)] + [ctypes.c_void_p] * 7,
    ),
    "normjit_sharded_backward_workspace_size": (
        _c_int, [ctypes.c_void_p, _P(ShardedDesc), _P(ctypes.c_size_t)]),
    "normjit_sharded_backward_apply": (
        _c_int,
        [ctypes.c_void_p, _P(ShardedDesc)] + [ctypes.c_void_p] * 10 + [ctypes.c_size_t, ctypes.c_void_p],
    ),
}

_LIB_NAME = "libnormjit_c.so"
_lock = threading.Lock()
_lib = None
_lib_path = None


def candidate_paths():
    """Where the library is looked for, in order, as (what, path) pairs.

    1. $NORMJIT_LIBRARY; 2. libnormjit_c.so bundled in this package's folder;
    3. <repo>/build/libnormjit_c.so, the repository this package file lies in;
    4. ctypes.util.find_library("normjit_c") (the system's search path).
    """
    here = Path(__file__).resolve().parent
    out = []
    env = os.environ.get("NORMJIT_LIBRARY")
    if env:
        out.append(("$NORMJIT_LIBRARY", env))
    out.append(("bundled", str(here / _LIB_NAME)))
    if len(here.parents) >= 2:  # <repo>/tools/python/normjit
        out.append(("repository build", str(here.parents[2] / "build" / _LIB_NAME)))
    found = ctypes.util.find_library("normjit_c")
    out.append(('find_library("normjit_c")', found))
    return out


def _declare(lib):
    for name, (restype, argtypes) in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _check_abi(lib, path):
    version = lib.normjit_api_version()
    if version != API_VERSION:
        raise NormjitError(
            LIBRARY_NOT_FOUND,
            f"normjit: {path} implements C API version {version}, this package needs version {API_VERSION}",
        )
    # The library fills struct_size with its sizeof: a layout mismatch shows here.
    for cls, init in ((EngineOptions, "normjit_engine_options_init"), (NormDesc, "normjit_norm_desc_init"),
                      (ForwardTensors, "normjit_forward_tensors_init"),
                      (BackwardTensors, "normjit_backward_tensors_init")):
        s = cls()
        getattr(lib, init)(ctypes.byref(s))  # options_init may report a bad $NORMJIT_TUNE; the size is set anyway
        if s.struct_size != ctypes.sizeof(cls):
            raise NormjitError(
                LIBRARY_NOT_FOUND,
                f"normjit: {path}: {cls.__name__} is {s.struct_size} bytes in the library, "
                f"{ctypes.sizeof(cls)} in this package",
            )


def load():
    """The loaded library (ctypes.CDLL), loading it at the first call.

    Raises NormjitError (kind "library_not_found") listing every place tried.
    """
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for what, path in candidate_paths():
            if not path:
                tried.append(f"{what}: not found")
                continue
            if os.sep in path and not os.path.exists(path):
                tried.append(f"{what}: {path}: no such file")
                continue
            try:
                lib = ctypes.CDLL(path)
                _declare(lib)
            except (OSError, AttributeError) as e:
                tried.append(f"{what}: {path}: {e}")
                continue
            _check_abi(lib, path)
            _lib, _lib_path = lib, path
            return lib
        raise NormjitError(
            LIBRARY_NOT_FOUND,
            "normjit: libnormjit_c.so could not be loaded; build it (cmake --build build) and set "
            "NORMJIT_LIBRARY=/path/to/libnormjit_c.so. Tried:\n  " + "\n  ".join(tried),
        )


def library_path():
    """The path of the loaded library (loading it if needed)."""
    load()
    return _lib_path


def last_error_message():
    return load().normjit_last_error_message().decode("utf-8", "replace")


def check(status):
    """Raises NormjitError with the thread's last message when status != SUCCESS."""
    if status != SUCCESS:
        raise NormjitError(status, last_error_message())


def status_name(status):
    return load().normjit_status_name(int(status)).decode()


def new_desc():
    d = NormDesc()
    check(load().normjit_norm_desc_init(ctypes.byref(d)))
    return d


def new_sharded_desc():
    d = ShardedDesc()
    check(load().normjit_sharded_desc_init(ctypes.byref(d)))
    return d


def new_forward_tensors():
    t = ForwardTensors()
    check(load().normjit_forward_tensors_init(ctypes.byref(t)))
    return t


def new_backward_tensors():
    t = BackwardTensors()
    check(load().normjit_backward_tensors_init(ctypes.byref(t)))
    return t


def copy_desc(d):
    return NormDesc.from_buffer_copy(d)


def read_string(call, size=256):
    """Runs call(buf, len) for a char buffer, growing it while the library
    says the buffer is too small; returns the text."""
    while True:
        buf = ctypes.create_string_buffer(size)
        status = call(buf, size)
        if status == INVALID_ARGUMENT and "bytes are needed" in last_error_message() and size < (1 << 20):
            size *= 4
            continue
        check(status)
        return buf.value.decode("utf-8", "surrogateescape")
