"""Where GROUP16's time goes: decode_fwd with a kv group's selection of no page (every tile FP4, two-level P), the
5% selection, and every page (every tile from the 16-bit copy), against cuDNN's bf16 decode and the nvfp4 kernel;
bytes read per step and the rate. CUDA-graph replays, min over interleaved rounds.

    PYTHONPATH=src python benchmarks/group16-s51/parts.py
"""
import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import capture_graph, device_name, interleaved_min_ms
from fp4attn.bench.decode import decode_inputs, fp4_bytes, sdpa_fn
from fp4attn.kernels import decode as Dk


def run(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c = fp4attn.KVCache.from_dense(k, v)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel5 = Dk.select_pages(q, c16, 0.05, share="group")
    pages = B * Hkv * (N // c16.page_size)
    share = sel5.view(B, Hkv, Hq // Hkv, -1)[:, :, 0].float().sum().item() / pages
    kw = dict(scale=D ** -0.5, group_sel=True)
    b4, b16 = fp4_bytes(B, Hkv, N, D), 2 * B * Hkv * N * D * 2
    fns = {"cudnn": (sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), b16),
           "nvfp4 kernel": (lambda: Dk.decode_fwd(q, c, scale=D ** -0.5), b4),
           "group16, no page": (lambda: Dk.decode_fwd(q, c16, selection=torch.zeros_like(sel5), **kw), b4),
           "group16, 5%": (lambda: Dk.decode_fwd(q, c16, selection=sel5, **kw), (1 - share) * b4 + share * b16),
           "group16, every page": (lambda: Dk.decode_fwd(q, c16, selection=torch.ones_like(sel5), **kw), b16)}
    t = interleaved_min_ms({n: capture_graph(f).replay for n, (f, _) in fns.items()}, 3, warmup_ms=25, rep_ms=100)
    print(f"\n({B},{Hq},{Hkv},{N},{D}); the 5% selection's union: {100 * share:.1f}% of the pages")
    for n, (_, nb) in fns.items():
        print(f"  {n:20s} {1000 * t[n]:7.1f} us  x cuDNN {t['cudnn'] / t[n]:5.2f}  {nb / 1e6:7.1f} MB  "
              f"{nb / t[n] / 1e9:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    print(device_name())
    for s in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
        run(*s)
