"""Gluon decode split kernel prototype: correctness vs the Triton kernel, then timing vs cuDNN (H200)."""
import os, sys, time, json
sys.path.insert(0, os.path.dirname(__file__))
import torch
import fp4attn
from fp4attn.kernels.decode import decode_fwd, default_splits
from fp4attn.bench.common import graph_time_ms
import dgl

out_dir = os.environ.get("OUT", "/tmp")
log = open(os.path.join(out_dir, "probe1.txt"), "w")
def P(*a):
    s = " ".join(str(x) for x in a); print(s); log.write(s + "\n"); log.flush()

torch.manual_seed(0)
dev = "cuda"
# ---- correctness
for (B, Hq, Hkv, lens, D, NQ, bn) in [(3, 8, 2, [300, 1000, 77], 128, 1, 32), (3, 8, 2, [300, 1000, 77], 64, 2, 32),
                                      (2, 32, 8, [4100, 2000], 128, 1, 32), (2, 16, 4, [700, 1500], 128, 4, 32),
                                      (2, 4, 4, [513, 64], 128, 1, 32), (2, 32, 8, [4100, 2000], 128, 1, 64)]:
    N = max(lens)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    k[:, :, :, :8] *= 8
    cache = fp4attn.KVCache.from_dense(k, v, lengths=lens)
    q = torch.randn(B, Hq, NQ, D, device=dev, dtype=torch.bfloat16)
    sc = D ** -0.5
    for ns in (1, 3):
        o_ref, l_ref = decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn)
        try:
            o, l = dgl.decode_fwd_gl(q, cache, scale=sc, num_splits=ns, block_n=bn)
            torch.cuda.synchronize()
            rel = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
            P(f"B{B} Hq{Hq} Hkv{Hkv} lens{lens} D{D} NQ{NQ} bn{bn} ns{ns}: rel {rel:.2e} maxabs "
              f"{(o.float()-o_ref.float()).abs().max().item():.2e} lse {(l-l_ref).abs().max().item():.2e}")
        except Exception as e:
            P("FAIL", B, Hq, NQ, D, repr(e)[:2000])
# ---- timing
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
        res.setdefault("triton", []).append(graph_time_ms(lambda: decode_fwd(q, cache, scale=D ** -0.5), 40))
        for bn in (32, 64):
            for per_sm in (8, 12, 16, 20, 24, 32):
                res.setdefault(f"gl bn{bn} ps{per_sm}", []).append(
                    graph_time_ms(lambda: dgl.decode_fwd_gl(q, cache, scale=D ** -0.5, block_n=bn, per_sm=per_sm), 40))
    cu = min(res["cudnn"])
    P(f"shape {(B, Hq, Hkv, N, D)}")
    for name, ts in res.items():
        P(f"  {name:16s} {min(ts):.4f} ms  x cudnn {cu / min(ts):.2f}   ({', '.join(f'{t:.4f}' for t in ts)})")
    del k, v, cache
    torch.cuda.empty_cache()
