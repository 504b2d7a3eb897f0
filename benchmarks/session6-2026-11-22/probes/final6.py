import torch
from triton.testing import do_bench
import fp4attn
from fp4attn.kernels import attention as ka
from _util import RECIPES as R, SHAPES, sdpa_ms
torch.manual_seed(0)
print("| shape | cuDNN ms | flash ms | recipe | pre-pass ms | op ms | TF/s | x cuDNN | x flash |")
print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    tc, tf = sdpa_ms(q, k, v, causal)
    t = {}
    for r, (fmt, sm) in R.items():
        tq = do_bench(lambda: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm), warmup=10, rep=50)
        t[r] = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r), warmup=25, rep=100)
        sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
        print(f"| {sh} | {tc:.3f} | {tf:.3f} | {r} | {tq:.3f} | {t[r]:.3f} | {fl/t[r]/1e9:.0f} | {tc/t[r]:.3f} | {tf/t[r]:.3f} |", flush=True)
    print(f"<!-- sage3/nvfp4 {t['sage3']/t['nvfp4']:.3f} -->", flush=True)
    del q, k, v
