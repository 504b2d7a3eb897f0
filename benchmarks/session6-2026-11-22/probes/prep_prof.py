import torch
from triton.testing import do_bench
from fp4attn.kernels import attention as ka
from _util import kernel_times_us
torch.manual_seed(0)
for D in (128, 64):
    B, H, N = 16, 16, 4096
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    nbytes = q.numel() * 2
    tc = do_bench(lambda: q.clone(), warmup=25, rep=100)
    print(f"D={D} copy of one tensor {tc*1e3:.1f} us = {2*nbytes/tc/1e6:.0f} GB/s", flush=True)
    for fmt, sq, sk in (("nvfp4", False, False), ("mxfp4", False, False), ("nvfp4", True, True)):
        f = lambda: ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sq, smooth_k=sk)
        ms = do_bench(f, warmup=25, rep=100)
        print(f"D={D} {fmt} smooth={sq} prepass {ms*1e3:.1f} us; per kernel (us):", flush=True)
        for n, t in kernel_times_us(f).items():
            print(f"    {t:8.1f}  {n}")
