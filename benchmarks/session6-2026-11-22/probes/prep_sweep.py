import torch, copy
from triton.testing import do_bench
from fp4attn.kernels import attention as ka
torch.manual_seed(0)
base = copy.deepcopy(ka._PREP_CFG)
QK = [(64, 4), (32, 4), (32, 2), (64, 8), (16, 4), (16, 2), (32, 1), (16, 1)]
V = [(64, 8), (64, 4), (32, 4), (128, 4), (32, 8), (128, 8), (16, 4)]
for D in (128, 64):
    B, H, N = 16, 16, 4096
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, fmt, sm in (("nvfp4", "nvfp4", False), ("mxfp4", "mxfp4", False), ("sage3", "nvfp4", True)):
        is_mx = fmt == "mxfp4"
        f = lambda: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm)
        ka._PREP_CFG = copy.deepcopy(base)
        t0 = do_bench(f, warmup=10, rep=40)
        print(f"D={D} {name} default total {t0*1e3:.1f} us", flush=True)
        if sm:
            res = []
            for w in (2, 4, 8, 16):
                ka._PREP_CFG = copy.deepcopy(base)
                ka._PREP_CFG[is_mx]["q_smooth_warps"] = w
                t = do_bench(f, warmup=10, rep=40)
                res.append(f"{w}:{(t - t0)*1e3:+.0f}")
            print("   q_smooth_warps: " + "  ".join(res), flush=True)
        for key, cands in (("q", QK), ("k", QK), ("v", V)):
            if key == "q" and sm:
                continue
            res = []
            for c in cands:
                ka._PREP_CFG = copy.deepcopy(base)
                ka._PREP_CFG[is_mx][key] = c
                try:
                    t = do_bench(f, warmup=10, rep=40)
                except Exception:
                    res.append(f"{c}:ERR")
                    continue
                res.append(f"{c}:{(t - t0)*1e3:+.0f}")
            print(f"   {key}: " + "  ".join(res), flush=True)
ka._PREP_CFG = base
