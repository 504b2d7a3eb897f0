"""GROUP16's launch config: programs per SM (the register cap and the splits follow) against the Thrift config's 12.
decode_fwd with a 5% group selection, CUDA-graph replays, min over interleaved rounds; bit-equality of each variant
with the first (equal splits only). (results/tune_h200.txt also holds an "L2 prefetch" row, the next FP4 tile
prefetched into L2, run through an experiment switch of decode.py that was removed after it.)

    PYTHONPATH=src python benchmarks/group16-s51/tune.py
"""
import torch

import fp4attn
from fp4attn.bench.common import capture_graph, device_name, interleaved_min_ms
from fp4attn.bench.decode import decode_inputs
from fp4attn.kernels import decode as Dk


def run(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dk.select_pages(q, c16, 0.05, share="group")
    kw = dict(scale=D ** -0.5, selection=sel, group_sel=True)
    variants = {"default (12/SM)": dict(per_sm=12), "10/SM": dict(per_sm=10), "14/SM": dict(per_sm=14),
                "16/SM": dict(per_sm=16)}
    graphs, outs = {}, {}
    for n, v_ in variants.items():
        outs[n] = Dk.decode_fwd(q, c16, **kw, **v_)[0]
        graphs[n] = capture_graph(lambda v_=v_: Dk.decode_fwd(q, c16, **kw, **v_))
    t = interleaved_min_ms({n: g.replay for n, g in graphs.items()}, 3, warmup_ms=25, rep_ms=100)
    base = t["default (12/SM)"]
    print(f"\n({B},{Hq},{Hkv},{N},{D})")
    for n in variants:
        print(f"  {n:16s} {1000 * t[n]:7.1f} us  default/this {base / t[n]:.3f}  "
              f"bit-equal {torch.equal(outs[n], outs['default (12/SM)'])}", flush=True)


if __name__ == "__main__":
    print(device_name())
    for s in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128), (8, 32, 8, 32768, 64), (1, 32, 8, 131072, 64)):
        run(*s)
