"""Launches of normjit's rms bf16 decode row (cubin) and Liger's, for ncu:
ncu -k regex:'normjit_norm_fwd|_rms_norm_forward' python3 ncu_pair.py CUBIN_DIR M N CFG"""
import glob, os, sys
sys.path.insert(0, os.path.join(os.getcwd(), "tools"))
import torch
from cubin_probe import launch, load, rms_args
from liger_kernel.ops.rms_norm import LigerRMSNormFunction

kdir, M, N, cfg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
w = (1 + 0.1 * torch.randn(N, device="cuda")).to(torch.bfloat16)
y = torch.empty_like(x); rstd = torch.empty(M, device="cuda")
a, q = rms_args(x, w, y, rstd)
fn = load(glob.glob(os.path.join(kdir, f"rms_fwd.x=bf16*N{N}.{cfg}.i32.cubin"))[0])
threads = int(cfg.split(".")[1][1:])
for _ in range(4):
    launch(fn, M, threads, [a, q])
    LigerRMSNormFunction.apply(x, w, 1e-6)
torch.cuda.synchronize()
