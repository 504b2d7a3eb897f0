"""Gluon decode kernel: register cap (maxnreg) x programs per SM at 32-key tiles, CUDA-graph medians (H200)."""
import os
import torch
import fp4attn
from fp4attn.kernels import decode as Dk
from fp4attn.bench.common import graph_time_ms

log = open(os.path.join(os.environ.get("OUT", "/tmp"), "probe3.txt"), "w")
def P(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

dev = "cuda"
torch.manual_seed(0)
for (B, Hq, Hkv, N, D) in [(8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)]:
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    cache = fp4attn.KVCache.from_dense(k, v)
    from torch.nn.attention import sdpa_kernel, SDPBackend
    def cud():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    res = {}
    for rep in range(2):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        for mr in (None, 112, 104, 96, 88):
            Dk._GLUON_CONFIG["maxnreg"] = mr
            for ps in (16, 18, 20, 24, 28):
                f = lambda: Dk.decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", per_sm=ps)
                res.setdefault(f"maxnreg {mr} ps{ps}", []).append(graph_time_ms(f, 40))
    Dk._GLUON_CONFIG["maxnreg"] = None
    cu = min(res["cudnn"])
    P(f"shape {(B, Hq, Hkv, N, D)}")
    for name, ts in res.items():
        P(f"  {name:18s} {min(ts):.4f} ms  x cudnn {cu / min(ts):.2f}   ({', '.join(f'{t:.4f}' for t in ts)})")
    del k, v, cache
    torch.cuda.empty_cache()
