import torch, copy
from triton.testing import do_bench
import fp4attn
from fp4attn.kernels import attention as ka
from _util import RECIPES as R, SHAPES, sdpa_ms
torch.manual_seed(0)
new = copy.deepcopy(ka._PREP_CFG)
old = {False: dict(q=(64, 4), k=(64, 4), v=(64, 8), q_smooth_warps=8), True: dict(q=(64, 4), k=(64, 4), v=(64, 8), q_smooth_warps=8)}
sw16 = copy.deepcopy(new); sw16[False]["q_smooth_warps"] = 16
sw4 = copy.deepcopy(new); sw4[False]["q_smooth_warps"] = 4
for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    tc, tf = sdpa_ms(q, k, v, causal)
    print(f"({B},{H},{N},{D}) causal={causal}: cudnn {tc:.3f} ms ({fl/tc/1e9:.0f} TF/s), flash {tf:.3f} ({fl/tf/1e9:.0f})", flush=True)
    for cname, cfg in (("old", old), ("new", new), ("new+smoothq16w", sw16), ("new+smoothq4w", sw4)):
        ka._PREP_CFG = cfg
        for r, (fmt, sm) in R.items():
            if cname.startswith("new+") and r != "sage3":
                continue
            tq = do_bench(lambda: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm), warmup=10, rep=50)
            t = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r), warmup=25, rep=100)
            print(f"   {cname:15s} {r:6s} prepass {tq:.3f} ms  op {t:.3f} ms = {fl/t/1e9:.0f} TF/s = {tc/t:.3f}x cudnn {tf/t:.3f}x flash", flush=True)
    del q, k, v
ka._PREP_CFG = new
