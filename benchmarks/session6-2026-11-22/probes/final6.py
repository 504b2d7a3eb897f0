import torch
from triton.testing import do_bench
import fp4attn
from fp4attn.kernels import attention as ka
from torch.nn.attention import sdpa_kernel, SDPBackend
torch.manual_seed(0)
R = dict(nvfp4=("nvfp4", False), mxfp4=("mxfp4", False), sage3=("nvfp4", True))
print("| shape | cuDNN ms | flash ms | recipe | pre-pass ms | op ms | TF/s | x cuDNN | x flash |")
print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
for (B, H, N, D, causal) in ((16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False), (16, 16, 4096, 64, False)):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        tc = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=100)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        tf = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=100)
    t = {}
    for r, (fmt, sm) in R.items():
        tq = do_bench(lambda: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm), warmup=10, rep=50)
        t[r] = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r), warmup=25, rep=100)
        sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
        print(f"| {sh} | {tc:.3f} | {tf:.3f} | {r} | {tq:.3f} | {t[r]:.3f} | {fl/t[r]/1e9:.0f} | {tc/t[r]:.3f} | {tf/t[r]:.3f} |", flush=True)
    print(f"<!-- sage3/nvfp4 {t['sage3']/t['nvfp4']:.3f} -->", flush=True)
    del q, k, v
