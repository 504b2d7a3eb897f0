"""Decode at head dims that are not powers of two (twenty-eighth session): what ``fp4attn.decode`` did before on
CUDA (the PyTorch reference over the dequantized cache: ``decode_reference``, which the op dispatched to for
D = 80 / 96 / 112 / 192) against the kernels now, eager and from a CUDA graph, beside SDPA (cuDNN, flash) on a
bf16 cache of the same tokens. Run: PYTHONPATH=src python benchmarks/headdim-s28/before_after.py"""
import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import graph_time_ms, time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.ops.decode import decode_reference

print(torch.cuda.get_device_name(), torch.__version__)
print("| (B,Hq,Hkv,ctx,D) | reference path (before) ms | fp4attn.decode eager ms | graph ms | cuDNN bf16 ms | "
      "flash bf16 ms | graph × cuDNN |")
print("|---|---:|---:|---:|---:|---:|---:|")


def one_shape(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    t_ref = time_ms(lambda: decode_reference(q, cache, scale=D ** -0.5), warmup_ms=20, rep_ms=200)
    t_op = time_ms(lambda: fp4attn.decode(q, cache), warmup_ms=20, rep_ms=200)
    t_gr = graph_time_ms(lambda: fp4attn.decode(q, cache), 100) or float("nan")
    tb = {}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            tb[name] = graph_time_ms(sdpa_fn(be, q, k, v), 100) or float("nan")
        except Exception as e:  # a backend that refuses the shape
            print("  ", name, type(e).__name__, str(e)[:80])
            tb[name] = float("nan")
    print(f"| ({B},{Hq},{Hkv},{N},{D}) | {t_ref:.3f} | {t_op:.3f} | {t_gr:.4f} | {tb['cudnn']:.4f} | "
          f"{tb['flash']:.4f} | {tb['cudnn'] / t_gr:.2f} |")


for shape in ((1, 32, 32, 4096, 96), (8, 32, 32, 2048, 96), (1, 32, 8, 8192, 80)):
    one_shape(*shape)
