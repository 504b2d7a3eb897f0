"""Decode at D = 256 (Gemma 2 / 3) on the Gluon split kernel (twenty-eighth session): CUDA-graph times per (key tile,
programs per SM; the register cap follows from the latter), beside the Triton split kernel's new default config,
cuDNN and flash. Run: PYTHONPATH=src python benchmarks/d256-s28/gluon_sweep.py [BxHqxHkvxCTXxD ...]"""
import sys

from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels.decode import decode_fwd

shapes = [tuple(int(x) for x in s.split("x"))
          for s in (sys.argv[1:] or ["8x8x4x32768x256", "1x8x4x131072x256", "8x16x8x32768x256", "8x16x8x32768x192"])]


def one_shape(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    t = {n: graph_time_ms(sdpa_fn(be, q, k, v), 40) for n, be in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                                                                   ("flash", SDPBackend.FLASH_ATTENTION))}
    t["op (default)"] = graph_time_ms(lambda: fp4attn.decode(q, cache), 40)
    t["triton (default config)"] = graph_time_ms(lambda: decode_fwd(q, cache, scale=D ** -0.5, kernel="triton")[0], 40)
    ref = decode_fwd(q, cache, scale=D ** -0.5, kernel="triton")[0].float()
    for bn in (32, 64):
        for per_sm in (8, 10, 12, 14, 16):
            kw = dict(kernel="gluon", block_n=bn, per_sm=per_sm)
            t[f"gluon bn={bn} per_sm={per_sm}"] = graph_time_ms(
                lambda kw=kw: decode_fwd(q, cache, scale=D ** -0.5, **kw)[0], 40)
    o = fp4attn.decode(q, cache).float()
    print(f"\n({B},{Hq},{Hkv},{N},{D}) op vs Triton kernel rel. L2 {((o - ref).norm() / ref.norm()).item():.2e}")
    for name, ms in t.items():
        print(f"  {name:28s} {ms:.4f} ms  {t['cudnn'] / ms:.2f}x cuDNN")


for shape in shapes:
    one_shape(*shape)
