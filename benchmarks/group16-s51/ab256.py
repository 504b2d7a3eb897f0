"""GROUP16 at 256 channels (Gemma 2 / 3's head dim), where ``group16_fits`` does not take it: 255 registers with 68
bytes of spill stores under the Thrift config's cap of 8 programs per SM (ptxas, sm_90; the two-kernel path's FP4
kernel: 255, no spill). decode_fwd with a 5% group selection, GROUP16 (the fit check widened here) against the
two-kernel path, CUDA-graph replays, min over interleaved rounds, with cuDNN and the nvfp4 op.

    PYTHONPATH=src python benchmarks/group16-s51/ab256.py
"""
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import capture_graph, device_name, interleaved_min_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels import decode as Dk
from fp4attn.kernels import decode_gluon as G

_fits = G.group16_fits


def wide_fits(D, rows, dtype):
    return _fits(min(D, 128), rows, dtype)


def run(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c = fp4attn.KVCache.from_dense(k, v)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dk.select_pages(q, c16, 0.05, share="group")
    kw = dict(scale=D ** -0.5, selection=sel, group_sel=True)
    G.group16_fits = wide_fits
    new = Dk.decode_fwd(q, c16, **kw)[0]
    g_new = capture_graph(lambda: Dk.decode_fwd(q, c16, **kw))
    G.group16_fits = _fits
    old = Dk.decode_fwd(q, c16, **kw)[0]
    fns = {"cudnn": capture_graph(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v)).replay,
           "nvfp4 op": capture_graph(lambda: fp4attn.decode(q, c)).replay,
           "thrift fwd old": capture_graph(lambda: Dk.decode_fwd(q, c16, **kw)).replay,
           "thrift fwd group16": g_new.replay}
    t = interleaved_min_ms(fns, 3, warmup_ms=25, rep_ms=100)
    rel = ((new.float() - old.float()).norm() / old.float().norm()).item()
    print(f"\n({B},{Hq},{Hkv},{N},{D}) group16 vs old rel L2 {rel:.2e}")
    for n, ms in t.items():
        print(f"  {n:20s} {1000 * ms:7.1f} us  x cuDNN {t['cudnn'] / ms:5.2f}")
    print(f"  group16 / old: {t['thrift fwd old'] / t['thrift fwd group16']:.3f}x faster", flush=True)


if __name__ == "__main__":
    print(device_name())
    for s in ((8, 16, 8, 32768, 256), (1, 16, 8, 131072, 256), (8, 32, 8, 16384, 256)):
        run(*s)
