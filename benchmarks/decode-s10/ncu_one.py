"""One Gluon decode launch at (8,32,8,32768,128) for ncu (warm-up first)."""
import sys
import torch
import fp4attn
from fp4attn.kernels.decode import decode_fwd
bn, ps = int(sys.argv[1]), int(sys.argv[2])
B, Hq, Hkv, N, D = 8, 32, 8, 32768, 128
k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
cache = fp4attn.KVCache.from_dense(k, torch.randn_like(k))
q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", block_n=bn, per_sm=ps)
torch.cuda.synchronize()
