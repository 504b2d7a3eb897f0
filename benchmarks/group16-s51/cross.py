"""Where Thrift decode's Gluon path (GROUP16 tiles, a kv group's selection) overtakes the fused Triton split kernel:
``decode._THRIFT_GLUON_MIN_WORK`` was measured for the two-kernel path. decode_fwd with a given 5% group selection,
CUDA-graph replays, min over interleaved rounds; work = B·Hkv·tokens.

    PYTHONPATH=src python benchmarks/group16-s51/cross.py
"""
import torch

import fp4attn
from fp4attn.bench.common import capture_graph, device_name, interleaved_min_ms
from fp4attn.bench.decode import decode_inputs
from fp4attn.kernels import decode as Dk

SHAPES = [(1, 32, 8, 2048), (1, 32, 8, 4096), (2, 32, 8, 4096), (4, 32, 8, 4096), (8, 32, 8, 4096), (4, 32, 8, 8192)]


def run(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dk.select_pages(q, c16, 0.05, share="group")
    kw = dict(scale=D ** -0.5, selection=sel, group_sel=True)
    fns = {kern: (lambda kern=kern: Dk.decode_fwd(q, c16, kernel=kern, **kw)) for kern in ("triton", "gluon")}
    same = torch.equal(fns["triton"]()[0], fns["gluon"]()[0])
    t = interleaved_min_ms({n: capture_graph(f).replay for n, f in fns.items()}, 3, warmup_ms=10, rep_ms=50)
    print(f"({B},{Hq},{Hkv},{N},{D}) work 2^{(B * Hkv * N).bit_length() - 1}: triton {1000 * t['triton']:6.1f} us, "
          f"gluon {1000 * t['gluon']:6.1f} us, triton/gluon {t['triton'] / t['gluon']:.2f}; bit-equal {same}",
          flush=True)


if __name__ == "__main__":
    print(device_name())
    for D in (128, 64):
        for s in SHAPES:
            run(*s, D)
