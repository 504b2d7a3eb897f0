"""One triton call and one gluon call of the nvfp4 attention passes at (16,16,4096,128) for ncu, after one
warm-up call of each (launch order: max pass, attention pass; profile with --launch-skip 4 --launch-count 4)."""
import math

import torch

from fp4attn.kernels import attention as A

B, H, N, D = 16, 16, 4096, 128
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
pk = A.quantize_qkv(q, k, v, fmt="nvfp4")
out = torch.empty_like(q)
for _ in range(2):
    for kern in ("triton", "gluon"):
        A.attention_packed(pk, causal=False, scale=1 / math.sqrt(D), two_level_p=False, B=B, Hq=H, Hkv=H, out=out,
                           kernel=kern)
torch.cuda.synchronize()
