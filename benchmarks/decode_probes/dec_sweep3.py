"""Decode config sweep after the e4m3-cvt decode + deferred vg + conditional rescale (H200)."""
import itertools, sys, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from fp4attn.kvcache import KVCache
from fp4attn.kernels import decode as Dk
from fp4attn.bench.decode import graph_time_ms
torch.manual_seed(0)
for (B, Hq, Hkv, N, D) in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    tc = graph_time_ms(cud, 40)
    c = KVCache.from_dense(k, v); del k, v
    res = []
    for bn, nw, ns, per_sm in itertools.product((32, 64), (1, 2), (2, 3), (8, 10, 12, 13, 14, 16)):
        if nw == 2 and bn == 32: continue
        splits = Dk.default_splits(B, Hkv, N, bn, q.device, per_sm=per_sm)
        try:
            t = graph_time_ms(lambda: Dk.decode_fwd(q, c, scale=0.088, num_splits=splits, block_n=bn, num_warps=nw, num_stages=ns), 25)
        except Exception as e:
            t = None; print(type(e).__name__, str(e)[:100])
        res.append((t or 9e9, bn, nw, ns, per_sm, splits))
        print(f"({B},{N}) bn={bn} w={nw} s={ns} per_sm={per_sm} splits={splits}: {t and round(t,4)}  x cuDNN {t and round(tc/t,3)}", flush=True)
    print(f"cuDNN {tc:.4f} ms; BEST", [(round(r[0],4), round(tc/r[0],3)) + r[1:] for r in sorted(res)[:4]], flush=True)
    del c; torch.cuda.empty_cache()
