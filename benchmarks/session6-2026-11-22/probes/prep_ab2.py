import sys, torch
from triton.testing import do_bench
import fp4attn
from fp4attn.kernels import attention as ka
tag = sys.argv[1]
torch.manual_seed(0)
R = dict(nvfp4=("nvfp4", False), mxfp4=("mxfp4", False), sage3=("nvfp4", True))
for (B, H, N, D, causal) in ((16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False), (16, 16, 4096, 64, False)):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    for r, (fmt, sm) in R.items():
        tq = do_bench(lambda: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm), warmup=10, rep=50)
        line = f"{tag} ({B},{H},{N},{D}) causal={causal} {r:6s} prepass {tq:.3f} ms"
        if not causal and N == 4096 and D == 128 or True:
            t = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r), warmup=25, rep=100)
            line += f"  op {t:.3f} ms = {fl/t/1e9:.0f} TF/s"
        print(line, flush=True)
    del q, k, v
