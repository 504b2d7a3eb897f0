"""Many query rows per kv head at D = 256 (Gemma speculative-decoding steps: G = 2, 16 draft tokens = 32 rows): the
Triton split kernel's launch configs, rows along M (ROWM) and transposed, CUDA-graph ms beside folded-GQA flash.
Run: PYTHONPATH=src python benchmarks/d256-s28/rowm_sweep.py"""
import itertools

from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels.decode import decode_fwd


def one_shape(B, Hq, Hkv, N, D, nq):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D, nq)
    cache = fp4attn.KVCache.from_dense(k, v)
    qf = q.view(B, Hkv, Hq // Hkv * nq, D)
    t_fl = graph_time_ms(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v), 40)
    print(f"({B},{Hq},{Hkv},{N},{D}) nq={nq}: flash (folded GQA) {t_fl:.4f} ms", flush=True)
    res = []
    for rowm, nw, bn, mr, per_sm in itertools.product((True, False), (4, 8), (32, 64), (168, 255), (1, 2, 3)):
        kw = dict(rowm=rowm, num_warps=nw, block_n=bn, maxnreg=mr, per_sm=per_sm, kernel="triton")
        try:
            t = graph_time_ms(lambda kw=kw: decode_fwd(q, cache, scale=D ** -0.5, **kw)[0], 20)
        except Exception as e:
            print("  ", kw, type(e).__name__, str(e)[:80], flush=True)
            continue
        if t is not None:
            res.append((t, kw))
    res.sort(key=lambda r: r[0])
    for t, kw in res[:10]:
        print(f"  {t:.4f} ms ({t_fl / t:.2f}x folded flash) {kw}", flush=True)


one_shape(8, 8, 4, 32768, 256, 16)
