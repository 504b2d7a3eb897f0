"""The Thrift selection's top-k kernel, old tree (OLD_SRC) against this one in the same process, on the scores of
the issue's decode shapes; selections compared bit for bit. CUDA-graph replays of ``page_topk`` alone, min over
interleaved rounds. (Run once with this tree's kernel searching 16 thresholds per step in 8 steps instead of the
32-step bisection: results/topk_search16_h200.txt; not kept.)

    git archive <old commit> src | tar -x -C out/base_src
    OLD_SRC=out/base_src/src PYTHONPATH=src python benchmarks/group16-s51/topk.py
"""
import importlib

import torch
from _old import old_package  # (this directory: run as a script)

import fp4attn
from fp4attn.bench.common import capture_graph, device_name, interleaved_min_ms
from fp4attn.bench.decode import decode_inputs
from fp4attn.kernels import decode as Dk


def run(old, B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    scores = Dk.page_scores(q, c16)
    width = c16.page_table.shape[1]
    fns = {}
    for name, mod in (("old", old), ("new", Dk)):
        for share, g in (("head", 1), ("group", Hq // Hkv)):
            fns[f"{name} top-k {share}"] = (lambda mod=mod, g=g: mod.page_topk(scores, c16.seq_lens, c16.page_size,
                                                                              0.05, width, group=g))
    same = all(torch.equal(fns[f"old top-k {s}"](), fns[f"new top-k {s}"]()) for s in ("head", "group"))
    t = interleaved_min_ms({n: capture_graph(f).replay for n, f in fns.items()}, 3, warmup_ms=10, rep_ms=50)
    print(f"({B},{Hq},{Hkv},{N},{D}) selections bit-equal: {same}")
    for share in ("head", "group"):
        o, n = t[f"old top-k {share}"], t[f"new top-k {share}"]
        print(f"  top-k ({share}): old {1000 * o:6.1f} us, new {1000 * n:6.1f} us, old/new {o / n:.2f}", flush=True)


if __name__ == "__main__":
    print(device_name())
    old_package()
    old = importlib.import_module("fp4attn_old.kernels.decode")
    for s in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128), (8, 32, 8, 4096, 128), (1, 32, 8, 524288, 128)):
        run(old, *s)
