#!/usr/bin/env python3
"""Times normjit's tensor-parallel norms (normjit.sharded) on TP ranks of one host.

For each shape M x N (N the whole hidden size) and each rank holding N / TP
columns of every row, three ways to get this rank's columns of the norm:
  sharded    normjit: stats kernel, all_reduce of [M, 2] float64, normalize kernel
  gather     all_gather the rows' column slices, normjit's norm of the whole
             rows on each rank, this rank's columns taken (what a TP model
             without a sharded norm does)
  unsharded  normjit's norm of the whole rows on one GPU, no communication
             (the bound: the same bytes on one GPU)
forward, and forward + backward (sharded: both all-reduces; gather: the
forward's all_gather and the whole rows' backward, whose dx slice is this
rank's). Time: each rank captures --reps calls, each after an L2 flush (a
128 MB write), in one CUDA graph (NCCL's collectives included) and replays
it; the graph of the flushes alone is timed too and taken off; median of
--rounds replays, CUDA events on rank 0. Replays run the ranks in lockstep
on the GPUs with no host work between calls, so the time is the step's
kernels and collectives, not Python's or ctypes' host time (reported apart:
host_us, the wall time of one eager call on rank 0).

  torchrun-free: python3 tools/bench_tp.py --tp 2 --shapes 4096x4096,16384x5120 \\
      --json tp.json --markdown tp.md
Needs torch with NCCL and TP GPUs; keeps NCCL_NVLS_ENABLE=0 (no multicast).
"""

import argparse
import json
import os
import socket
import statistics
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graph_time(torch, fn, flush, reps, rounds, dist):
    """us per call of fn (after an L2 flush each) from graph replays, flushes taken off."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture: compiles, allocates, autograd state
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def capture(body):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                flush.fill_(1)
                body()
        return g

    work, flushes = capture(fn), capture(lambda: None)

    def replay(g):
        times = []
        for _ in range(rounds):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        return statistics.median(times)

    us = (replay(work) - replay(flushes)) / reps
    del work, flushes
    return us


def _host_time(torch, fn, dist, reps=20):
    """Wall us of one eager call on the host (launches and Python, the GPU not waited for)."""
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def _rank(rank, tp, port, args, out):
    import torch
    import torch.distributed as dist

    import normjit.torch as njt
    from normjit.sharded import sharded_layer_norm, sharded_rms_norm

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=tp, device_id=torch.device("cuda", rank))
    dtype = getattr(torch, args.dtype)
    flush = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    try:
        for spec in args.shapes.split(","):
            M, N = (int(v) for v in spec.split("x"))
            n = N // tp
            g = torch.Generator(device="cuda").manual_seed(7)
            x_full = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
            w_full = torch.randn(N, device="cuda", dtype=dtype, generator=g)
            b_full = torch.randn(N, device="cuda", dtype=dtype, generator=g) if args.norm == "ln" else None
            dy_full = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
            cols = slice(rank * n, (rank + 1) * n)
            xs, ws = x_full[:, cols].contiguous(), w_full[cols].contiguous()
            bs = b_full[cols].contiguous() if b_full is not None else None
            dys = dy_full[:, cols].contiguous()

            def sharded(x, w, b):
                if args.norm == "ln":
                    return sharded_layer_norm(x, w, b, 1e-5)
                return sharded_rms_norm(x, w, 1e-5)

            def whole(x, w, b):
                if args.norm == "ln":
                    return njt.layer_norm(x, (x.shape[-1],), w, b, 1e-5)
                return njt.rms_norm(x, (x.shape[-1],), w, 1e-5)

            def gathered(x, w, b):
                parts = torch.empty(tp, *x.shape, dtype=x.dtype, device=x.device)
                dist.all_gather_into_tensor(parts, x.contiguous())
                rows_ = parts.permute(1, 0, 2).reshape(x.shape[0], tp * x.shape[1])
                return whole(rows_, w, b)[:, cols]

            def fwd_bwd(f, x, w, b, dy):
                x = x.detach().requires_grad_()
                w = w.detach().requires_grad_()
                y = f(x, w, b)
                y.backward(dy)

            row = {"shape": f"{M}x{N}", "tp": tp, "norm": args.norm, "dtype": args.dtype}
            t = lambda fn: _graph_time(torch, fn, flush, args.reps, args.rounds, dist)  # noqa: E731
            with torch.no_grad():
                row["sharded_fwd_us"] = t(lambda: sharded(xs, ws, bs))
                row["gather_fwd_us"] = t(lambda: gathered(xs, w_full, b_full))
                row["unsharded_fwd_us"] = t(lambda: whole(x_full, w_full, b_full))
                row["sharded_fwd_host_us"] = _host_time(torch, lambda: sharded(xs, ws, bs), dist)
            row["sharded_fwdbwd_us"] = t(lambda: fwd_bwd(sharded, xs, ws, bs, dys))
            row["gather_fwdbwd_us"] = t(lambda: fwd_bwd(gathered, xs, w_full, b_full, dys))
            row["unsharded_fwdbwd_us"] = t(lambda: fwd_bwd(whole, x_full, w_full, b_full, dy_full))
            rows.append(row)
        if rank == 0:
            out.extend(rows)
    finally:
        dist.destroy_process_group()


def _markdown(rows, gpu):
    lines = [f"Tensor-parallel norms, {gpu}: CUDA graph replays on rank 0 (kernels and collectives, every rank in "
             "lockstep), L2 flushed before each call, median; us per call. host: wall us of one eager sharded "
             "forward call on the host.", "",
             "| shape | TP | norm | sharded fwd | gather fwd | unsharded fwd | sharded fwd+bwd | gather fwd+bwd "
             "| unsharded fwd+bwd | gather / sharded fwd | host fwd |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['tp']} | {r['norm']} {r['dtype']} | {r['sharded_fwd_us']:.2f} | "
                     f"{r['gather_fwd_us']:.2f} | {r['unsharded_fwd_us']:.2f} | {r['sharded_fwdbwd_us']:.2f} | "
                     f"{r['gather_fwdbwd_us']:.2f} | {r['unsharded_fwdbwd_us']:.2f} | "
                     f"{r['gather_fwd_us'] / r['sharded_fwd_us']:.2f}x | {r['sharded_fwd_host_us']:.0f} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2, help="ranks (GPUs), each holding N / TP columns")
    ap.add_argument("--shapes", default="1x4096,32x8192,4096x4096,16384x5120,8192x16384",
                    help="M x N (N the whole hidden size, divisible by --tp), comma-separated")
    ap.add_argument("--norm", choices=["rms", "ln"], default="rms")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--reps", type=int, default=20, help="calls captured in one graph")
    ap.add_argument("--rounds", type=int, default=15, help="graph replays timed (the median is reported)")
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < args.tp:
        raise SystemExit(f"bench_tp: --tp {args.tp} needs {args.tp} GPUs; this machine has "
                         f"{torch.cuda.device_count()}")
    for spec in args.shapes.split(","):
        if int(spec.split("x")[1]) % args.tp:
            raise SystemExit(f"bench_tp: --shapes {spec}: N is not divisible by --tp {args.tp}")
    with mp.Manager() as m:
        out = m.list()
        mp.start_processes(_rank, args=(args.tp, _free_port(), args, out), nprocs=args.tp, join=True,
                           start_method="spawn")
        rows = list(out)
    gpu = torch.cuda.get_device_name(0)
    text = _markdown(rows, gpu)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": gpu, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
