import torch
from fp4attn.kvcache import KVCache
from fp4attn.kernels import decode as Kd
B, Hq, Hkv, N, D = 8, 32, 8, 32768, 128
k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
c = KVCache.from_dense(k, torch.randn_like(k)); del k
q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    Kd.decode_fwd(q, c, scale=0.088)
torch.cuda.synchronize()
