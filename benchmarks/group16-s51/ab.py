"""Thrift decode with the kv group's selection: GROUP16 tiles (a selected page from the 16-bit copy only, in the split
kernel) against the paths they replace (D > 64: the FP4 kernel masking the selected pages + the 16-bit stream kernel;
D <= 64: FUSED16), side by side with cuDNN's bf16 decode and the nvfp4 op. CUDA-graph replays (one call per graph),
min over interleaved rounds (``interleaved_min_ms``), 5% budget, N(0,1) bf16 K/V; then the Thrift op's kernels
(torch.profiler). (The results' "group16+pf" rows timed an L2-prefetch switch of the kernel that was removed after
them; in results/ab_final_h200.txt that switch was already gone: those rows repeat the plain kernel.)

    PYTHONPATH=src python benchmarks/group16-s51/ab.py [rounds]
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import capture_graph, device_name, interleaved_min_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
from _util import kernel_times_us  # noqa: E402

SHAPES = [(8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128), (8, 32, 8, 32768, 64), (1, 32, 8, 131072, 64)]


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def profile_op(fn, calls=20):
    """Kernel times of ``fn`` (torch.profiler, eager calls; ``session6-2026-11-22/probes/_util.kernel_times_us``):
    where the Thrift op's time goes."""
    for name, us in kernel_times_us(fn, calls).items():
        print(f"    kernel {us:7.1f} us  {name}")


def run_shape(B, Hq, Hkv, N, D, rounds):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c = fp4attn.KVCache.from_dense(k, v)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dk.select_pages(q, c16, 0.05, share="group")
    sc = D ** -0.5
    union = sel.view(B, Hkv, Hq // Hkv, -1)[:, :, 0].float().sum().item() / (B * Hkv * (N // c16.page_size))
    fns = {
        "cudnn": sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v),
        "nvfp4 op": lambda: fp4attn.decode(q, c),
        "thrift fwd old": lambda: Dk.decode_fwd(q, c16, scale=sc, selection=sel, group_sel=True, group16=False),
        "thrift fwd group16": lambda: Dk.decode_fwd(q, c16, scale=sc, selection=sel, group_sel=True),
        "thrift op (group16)": lambda: fp4attn.decode(q, c16, thrift_budget=0.05),
        "thrift op head": lambda: fp4attn.decode(q, c16, thrift_budget=0.05, thrift_share="head"),
    }
    new = fns["thrift fwd group16"]()[0]
    old = fns["thrift fwd old"]()[0]
    graphs = {n: capture_graph(f) for n, f in fns.items()}
    t = interleaved_min_ms({n: g.replay for n, g in graphs.items()}, rounds, warmup_ms=25, rep_ms=100)
    cd = t["cudnn"]
    print(f"\n({B},{Hq},{Hkv},{N},{D}) union of the group's 5% selections: {100 * union:.1f}% of the pages; "
          f"group16 vs old rel L2 {rel(new, old):.2e} (bit-equal: {torch.equal(new, old)})")
    for n, ms in t.items():
        print(f"  {n:22s} {1000 * ms:8.1f} us  x cuDNN {cd / ms:5.2f}")
    print(f"  group16 / old (fwd): {t['thrift fwd old'] / t['thrift fwd group16']:.3f}x faster", flush=True)
    profile_op(lambda: fp4attn.decode(q, c16, thrift_budget=0.05))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(device_name(), flush=True)
    for shape in SHAPES:
        run_shape(*shape, rounds)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
