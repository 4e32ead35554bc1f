"""Norms sharded across ranks (normjit.sharded, tensor parallelism).

Without a GPU: the C ABI's sharded descriptor through ctypes (layout,
defaults, errors naming the field) and the Python argument checks. With two
GPUs: two NCCL ranks, each holding half of every row's columns, forward and
backward against the float64 unsharded norm, every element; skipped, saying
why, with fewer GPUs."""

import ctypes
import os
import socket

import pytest

from normjit import _capi

from conftest import library_or_skip_reason

_ok, _why = library_or_skip_reason()
if not _ok:
    pytest.skip(_why, allow_module_level=True)

lib = _capi.load()


def test_sharded_desc_layout_and_defaults():
    d = _capi.new_sharded_desc()
    assert d.struct_size == ctypes.sizeof(_capi.ShardedDesc)
    assert (d.norm, d.has_weight, d.has_bias) == (_capi.NORM_RMS, 1, 0)
    assert d.x_dtype == d.y_dtype == d.weight_dtype == _capi.BF16
    assert d.eps == pytest.approx(1e-6)


def _expect_invalid(status, *parts):
    assert status == _capi.INVALID_ARGUMENT
    msg = _capi.last_error_message()
    for p in parts:
        assert p in msg, msg


def test_sharded_errors_name_the_field_before_any_gpu_work(engine):
    d = _capi.new_sharded_desc()
    d.M, d.N, d.N_total = 4, 64, 32
    buf = ctypes.create_string_buffer(64)
    _expect_invalid(lib.normjit_sharded_stats(engine, ctypes.byref(d), buf, buf, None), "N_total = 32", "N = 64")
    d.N_total = 128
    d.norm = 5
    _expect_invalid(lib.normjit_sharded_stats(engine, ctypes.byref(d), buf, buf, None), "desc->norm = 5")
    d.norm = _capi.NORM_LAYER
    d.has_bias = 1
    _expect_invalid(lib.normjit_sharded_apply(engine, ctypes.byref(d), buf, buf, None, buf, buf, buf, buf, None),
                    "bias = null", "ln_shard_fwd")
    d.struct_size = 7
    _expect_invalid(lib.normjit_sharded_stats(engine, ctypes.byref(d), buf, buf, None), "struct_size = 7")


def test_python_arguments_are_checked_before_any_gpu_work(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    import torch.distributed as dist

    from normjit.sharded import sharded_layer_norm, sharded_rms_norm

    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    x = torch.randn(4, 64)
    w = torch.randn(64)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="torch.distributed is not initialised"):
            sharded_rms_norm(x, w)
    # One rank over gloo: enough for the checks, which all come before any GPU work.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match=r"weight has shape \(63,\): expected \(64,\)"):
            sharded_rms_norm(x, torch.randn(63))
        with pytest.raises(ValueError, match=r"bias has shape \(2, 32\)"):
            sharded_layer_norm(x, w, torch.randn(2, 32))
        with pytest.raises(TypeError, match="float64"):
            sharded_rms_norm(x.double(), w)
        with pytest.raises(ValueError, match="eps = -1"):
            sharded_rms_norm(x, w, -1.0)
        with pytest.raises(ValueError, match="hidden_size = 32 must be an integer >= N = 64"):
            sharded_rms_norm(x, w, hidden_size=32)
        with pytest.raises(ValueError, match="CUDA tensors only"):
            sharded_rms_norm(x, w)
    finally:
        dist.destroy_process_group()


# ---- two GPUs, two NCCL ranks ----------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(torch, norm, x, w, b, eps, dy):
    """The unsharded norm and its gradients in float64 (autograd over the full rows)."""
    x = x.double().requires_grad_()
    w = w.double().requires_grad_() if w is not None else None
    b = b.double().requires_grad_() if b is not None else None
    if norm == "ln":
        y = torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)
    else:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if w is not None:
            y = y * w
    y.backward(dy.double())
    return y.detach(), x.grad, w.grad if w is not None else None, b.grad if b is not None else None


def _rank(rank, world, port, cases, errors):
    import torch
    import torch.distributed as dist

    from normjit.sharded import sharded_layer_norm, sharded_rms_norm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        for norm, M, N_total, dtype, mean in cases:
            g = torch.Generator().manual_seed(1234 + M)  # every rank draws the same full rows
            x = torch.empty(M, N_total).uniform_(-3, 3, generator=g) + mean
            w = torch.empty(N_total).uniform_(-2, 2, generator=g)
            b = torch.empty(N_total).uniform_(-1, 1, generator=g)
            dy = torch.empty(M, N_total).uniform_(-1, 1, generator=g)
            x, w, b, dy = (t.to(dtype) for t in (x, w, b, dy))
            n = N_total // world
            cols = slice(rank * n, (rank + 1) * n)
            xs = x[:, cols].cuda().requires_grad_()
            ws = w[cols].cuda().requires_grad_()
            bs = b[cols].cuda().requires_grad_() if norm == "ln" else None
            if norm == "ln":
                y = sharded_layer_norm(xs, ws, bs, 1e-5)
            else:
                y = sharded_rms_norm(xs, ws, 1e-5)
            y.backward(dy[:, cols].cuda())
            ry, rdx, rdw, rdb = _reference(torch, norm, x, w, b if norm == "ln" else None, 1e-5, dy)
            # Bounds: a few roundings of the output dtype on the norm of each result (the engine's
            # tolerance(dtype): 4 unit roundoffs, 1e-4 for float32).
            tol = 1e-4 if dtype == torch.float32 else 4 * (2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11)

            def rel(got, ref):
                ref = ref[..., cols].double()
                return float((got.double().cpu() - ref).norm() / ref.norm())

            for name, got, ref in (("y", y.detach(), ry), ("dx", xs.grad, rdx), ("dweight", ws.grad, rdw)) + (
                    (("dbias", bs.grad, rdb),) if norm == "ln" else ()):
                if not torch.isfinite(got).all() or rel(got, ref) > tol:
                    errors.append(f"rank {rank} {norm} {M}x{N_total} {dtype} mean {mean}: {name} off by "
                                  f"{rel(got, ref):.3g} (bound {tol:.3g})")
    except Exception as e:  # reported by the parent
        errors.append(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


def test_two_ranks_match_the_unsharded_float64_norm():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        pytest.skip(f"needs 2 GPUs for two NCCL ranks; this machine has {n}")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL backend")
    import torch.multiprocessing as mp
    cases = [("rms", 333, 4096, torch.bfloat16, 0.0), ("rms", 7, 8192, torch.float16, 0.0),
             ("ln", 64, 4096, torch.bfloat16, 0.0), ("ln", 5, 2048, torch.float32, 1000.0)]
    with mp.Manager() as m:
        errors = m.list()
        mp.start_processes(_rank, args=(2, _free_port(), cases, errors), nprocs=2, join=True, start_method="spawn")
        assert list(errors) == []
