"""One decode_fwd call at (8,32,8,32k,128) for ncu (twenty-ninth session): the Gluon split kernel's stall reasons.

    ncu --clock-control none -k regex:_decode_split_kernel_gl -c 1 --section WarpStateStats ... \
        python benchmarks/f2fp-s29/ncu_one.py
"""
import torch

import fp4attn
from fp4attn.kernels import decode as Dk

g = torch.Generator(device="cuda").manual_seed(0)
kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(8, 8, 32768, 128, **kw)
cache = fp4attn.KVCache.from_dense(k, torch.randn(8, 8, 32768, 128, **kw))
q = torch.randn(8, 32, 1, 128, **kw)
for _ in range(3):
    Dk.decode_fwd(q, cache, scale=128 ** -0.5)
torch.cuda.synchronize()
