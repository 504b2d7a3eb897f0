"""Gluon decode kernel (src/fp4attn/kernels/decode_gluon.py): equality with the Triton kernel, then a
config sweep (tile, register prefetch, programs per SM) against cuDNN, CUDA-graph medians (H200)."""
import os, sys
import torch
import fp4attn
from fp4attn.kernels.decode import decode_fwd
from fp4attn.bench.common import graph_time_ms

out_dir = os.environ.get("OUT", "/tmp")
log = open(os.path.join(out_dir, "probe2.txt"), "w")
def P(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); log.write(s + "\n"); log.flush()

torch.manual_seed(0)
dev = "cuda"
worst = 0.0
for (B, Hq, Hkv, lens, D, NQ) in [(3, 8, 2, [300, 1000, 77], 128, 1), (3, 8, 2, [300, 1000, 77], 64, 2),
                                  (2, 32, 8, [4100, 2000], 128, 1), (2, 16, 4, [700, 1500], 128, 4),
                                  (2, 4, 4, [513, 64], 128, 1), (2, 8, 4, [4099, 31], 64, 3),
                                  (2, 16, 2, [1234, 2222], 128, 2)]:
    N = max(lens)
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    k[:, :, :, :8] *= 8
    cache = fp4attn.KVCache.from_dense(k, v, lengths=lens)
    q = torch.randn(B, Hq, NQ, D, device=dev, dtype=torch.bfloat16)
    sc = D ** -0.5
    for ns in (1, 3):
        for bn in (32, 64):
            o_ref, l_ref = decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn, kernel="triton")
            for pf in (False, True):
                o, l = decode_fwd(q, cache, scale=sc, num_splits=ns, block_n=bn, kernel="gluon", prefetch=pf)
                rel = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
                dl = (l - l_ref).abs().max().item()
                worst = max(worst, rel)
                if rel > 0 or dl > 1e-6:
                    P(f"B{B} Hq{Hq} Hkv{Hkv} lens{lens} D{D} NQ{NQ} ns{ns} bn{bn} pf{pf}: rel {rel:.2e} lse {dl:.2e}")
P("correctness: worst rel L2 gluon vs triton", worst)
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
        res.setdefault("triton", []).append(graph_time_ms(lambda: decode_fwd(q, cache, scale=D ** -0.5, kernel="triton"), 40))
        for bn, pf, sms in ((32, False, (12, 16)), (64, False, (8, 10, 12)), (32, True, (8, 9, 12)), (64, True, (6, 8))):
            for per_sm in sms:
                res.setdefault(f"gl bn{bn} pf{int(pf)} ps{per_sm}", []).append(graph_time_ms(
                    lambda: decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon", block_n=bn, per_sm=per_sm,
                                       prefetch=pf), 40))
    cu = min(res["cudnn"])
    P(f"shape {(B, Hq, Hkv, N, D)}")
    for name, ts in res.items():
        P(f"  {name:18s} {min(ts):.4f} ms  x cudnn {cu / min(ts):.2f}   ({', '.join(f'{t:.4f}' for t in ts)})")
    del k, v, cache
    torch.cuda.empty_cache()
