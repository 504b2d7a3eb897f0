"""Thrift 5% decode on Hopper (Gluon FP4 stream + 16-bit stream): pages per 16-bit program x FP4 programs
per SM, CUDA-graph medians (H200), selection given (kernel time)."""
import os
import torch
import fp4attn
from fp4attn.kernels import decode as Dk
from fp4attn.bench.common import graph_time_ms

log = open(os.path.join(os.environ.get("OUT", "/tmp"), "probe7.txt"), "w")
def P(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

dev = "cuda"
for (B, Hq, Hkv, N, D) in [(8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)]:
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16, generator=g)
    c = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dk.select_pages(q, c, 0.05)
    res = {}
    for rep in range(2):
        res.setdefault("triton fused", []).append(graph_time_ms(
            lambda: Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sel, kernel="triton"), 40))
        for pages in (8, 16, 32, 64):
            Dk._PAGES_16BIT = pages
            for ps in (8, 12, 16):
                res.setdefault(f"pages {pages} ps{ps}", []).append(graph_time_ms(
                    lambda: Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sel, kernel="gluon", per_sm=ps), 40))
    Dk._PAGES_16BIT = 32
    P(f"shape {(B, Hq, Hkv, N, D)}")
    for name, ts in res.items():
        P(f"  {name:18s} {min(ts):.4f} ms   ({', '.join(f'{t:.4f}' for t in ts)})")
    del k, v, c
    torch.cuda.empty_cache()
