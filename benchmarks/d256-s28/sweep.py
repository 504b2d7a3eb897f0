"""Decode at D = 256 (Gemma 2 / 3): the Triton split kernel's launch configs (twenty-eighth session). CUDA-graph
times of decode_fwd per (num_warps, block_n, num_stages, programs per SM, register cap), beside cuDNN.
Run: PYTHONPATH=src python benchmarks/d256-s28/sweep.py"""
import itertools
import sys

from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels.decode import decode_fwd

shapes = [tuple(int(x) for x in s.split("x")) for s in (sys.argv[1:] or ["8x8x4x32768x256", "1x8x4x131072x256"])]


def one_shape(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    t_cud = graph_time_ms(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 40)
    base = graph_time_ms(lambda: decode_fwd(q, cache, scale=D ** -0.5)[0], 40)
    ref = decode_fwd(q, cache, scale=D ** -0.5)[0].float()
    print(f"\n({B},{Hq},{Hkv},{N},{D}) cuDNN {t_cud:.4f} ms; default {base:.4f} ms ({t_cud / base:.2f}x)", flush=True)
    res = []
    for nw, bn, ns, per_sm, mr in itertools.product((1, 2, 4), (16, 32, 64), (2, 3), (2, 4, 8, 12), (None,)):
        if nw * per_sm > 32 or (mr and mr * 32 * nw * per_sm > 65536):
            continue
        kw = dict(num_warps=nw, block_n=bn, num_stages=ns, per_sm=per_sm, kernel="triton", maxnreg=mr)
        try:
            t = graph_time_ms(lambda kw=kw: decode_fwd(q, cache, scale=D ** -0.5, **kw)[0], 20)
            o = decode_fwd(q, cache, scale=D ** -0.5, **kw)[0].float()
            err = ((o - ref).norm() / ref.norm()).item()
        except Exception as e:
            print("  ", kw, type(e).__name__, str(e)[:100], flush=True)
            continue
        if t is None:
            continue
        res.append((t, kw, err))
    res.sort(key=lambda r: r[0])
    for t, kw, err in res[:12]:
        print(f"  {t:.4f} ms ({t_cud / t:.2f}x cuDNN) {kw} rel-diff vs default {err:.2e}", flush=True)


for shape in shapes:
    one_shape(*shape)
