"""Tile / warp sweep of the backward's SR quantizer kernel (``_sr_mxfp4_kernel``, as ``sr_fp8`` launches it
in the backward: device seeds, table of per-tile row maxima) on the four operands of the (16384, 4096,
4096) layer (or another shape): dy (M, N) and dy^T (N, M) bf16, the saved weight W8^T (K, N) E4M3 and activation X8^T
(K, M) E5M2 with their column scales. Every config is checked to give the same codes, scales and row
maxima as the default; times are do_bench medians (ms), interleaved over two rounds.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python sr_sweep.py [MxKxN]"""
import itertools
import sys

import torch
import triton
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

M, K, N = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "16384x4096x4096").split("x"))
bf = torch.bfloat16
torch.manual_seed(0)
x = torch.randn(M, K, device="cuda", dtype=bf)
w = torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5
dy = torch.randn(M, N, device="cuda", dtype=bf)
x8, _, rsx = kq.quest_e5m2(x)
w8, _, rsw = kq.quest_fp8(w)
seeds, sx, sw = kq.backward_draws(QuartetRNG(1), "cuda", N, M)
ops = {"dy": (dy, sx, None, 0), "dyT": (dy.t(), sw, None, 0), "w8T": (w8.t(), sx, rsw, 1),
       "x8T": (x8.t(), sw, rsx, 2)}


def launch(name, block_r, block_l, warps, maxnreg):
    a, signs, scale, afp8 = ops[name]
    R, L = a.shape
    LP = (L + 31) // 32 * 32
    hd = kq._hdot_for(bf if afp8 else a.dtype)
    p = torch.empty(R, LP // 2, dtype=torch.uint8, device="cuda")
    sc = torch.empty(R, LP // 32, dtype=torch.uint8, device="cuda")
    grid = (triton.cdiv(R, block_r), triton.cdiv(LP, block_l))
    emax = torch.empty(R, grid[1], dtype=torch.int8, device="cuda")
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}

    def run():
        kq._sr_mxfp4_kernel[grid](a, a.stride(0), a.stride(1), scale if afp8 else p, kq._hmat("cuda", hd), p, signs,
                                  seeds, 1, p, sc, emax, R, L, LP, ROW_MAX=2, A_FP8=afp8, HAS_NOISE=False,
                                  SEED_PTR=True, HW=True, HDOT=hd, BLOCK_R=block_r, BLOCK_L=block_l,
                                  num_warps=warps, **extra)
    run()
    torch.cuda.synchronize()
    rowmax = emax.to(torch.int32).amax(1)
    return run, (p.clone(), sc.clone(), rowmax)


configs = [(br, bl, nw, mr) for br, bl, nw, mr in itertools.product((16, 32, 64, 128), (32, 64, 128), (4, 8),
                                                                     (None,))
           if br * bl >= 1024 and br * bl <= 16384]
for name in ops:
    base_run, base = launch(name, 64 if ops[name][0].shape[0] >= 8192 else 32, 64, 4, None)
    res = {}
    runs = {}
    for cfg in configs:
        try:
            run, out = launch(name, *cfg)
        except Exception as e:  # noqa: BLE001
            print(name, cfg, "failed:", type(e).__name__, str(e)[:80], flush=True)
            continue
        same = all(torch.equal(u, v) for u, v in zip(out, base))
        runs[cfg] = (run, same)
    for _round in range(2):
        for cfg, (run, _same) in runs.items():
            t = do_bench(run, warmup=10, rep=40)
            res[cfg] = min(res.get(cfg, 1e9), t)
    best = sorted(res, key=res.get)
    dflt = (64 if ops[name][0].shape[0] >= 8192 else 32, 64, 4, None)
    print(f"== {name} {tuple(ops[name][0].shape)}: default {dflt} {res.get(dflt, float('nan')):.4f} ms", flush=True)
    for cfg in best[:8]:
        print(f"   {cfg}: {res[cfg]:.4f} ms  same bits: {runs[cfg][1]}", flush=True)
