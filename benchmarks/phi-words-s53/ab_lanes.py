"""Fifty-third session A/B (issue 4): the Gluon attention pass with the row sums carried per lane of the quad
(``lane_sums.patch``'s ``_lane_sums``: the four lanes combined once, after the loop) against the tree under OLD_SRC
(package ``fp4attn_old``, the commit before). nvfp4 op calls, eager, quantization included; min over interleaved
rounds, the order reversed every other round; then each kernel's device time (torch.profiler, 10 calls). Outputs:
the row sums add the keys in another order (float32 rounding). A first run (``results/ab_lanes_rowmax_h200.txt``)
also had the row-max pass's maxima per lane, and a switch ``rm0`` without them. After the runs the timing loop moved
into ``probe.py``'s helpers, which both scripts now share: the same method.

Needs ``lane_sums.patch`` applied to this tree (``git apply``; not kept) and the commit before under OLD_SRC:

    mkdir -p out/ab_old && git archive HEAD src/fp4attn | tar -x -C out/ab_old
    mv out/ab_old/src/fp4attn out/ab_old/src/fp4attn_old && git apply benchmarks/phi-words-s53/lane_sums.patch
    OLD_SRC=out/ab_old/src PYTHONPATH=src python benchmarks/phi-words-s53/ab_lanes.py [rounds]
"""
import os
import sys

from torch.nn.attention import SDPBackend

sys.path.insert(0, os.environ.get("OLD_SRC", "out/ab_old/src"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
import fp4attn_old  # noqa: E402
from _util import kernel_times_us  # noqa: E402
from probe import both_orders_min_ms, main, qkv, sdpa  # noqa: E402  (this directory's probe.py)

import fp4attn  # noqa: E402

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (16, 16, 4096, 64, False), (16, 16, 4096, 64, True),
          (2, 32, 8192, 128, True)]


def run_shape(B, H, N, D, causal, rounds):
    q, k, v = qkv(B, H, N, D)
    fns = {
        "sdpa cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "old": lambda: fp4attn_old.attention(q, k, v, causal=causal, return_lse=True),
        "new": lambda: fp4attn.attention(q, k, v, causal=causal, return_lse=True),
    }
    (o_old, l_old), (o_new, l_new) = fns["old"](), fns["new"]()
    d_o = ((o_new.float() - o_old.float()).norm() / o_old.float().norm()).item()
    d_l = (l_new - l_old).abs().max().item()
    t = both_orders_min_ms(fns, rounds)
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    print(f"\n({B},{H},{N},{D}){' causal' if causal else ''}: new vs old: "
          f"{d_o:.2e} relative L2 (bf16 outputs), LSE max |diff| {d_l:.2e}", flush=True)
    for n, ms in t.items():
        print(f"  {n:12s} {ms:8.3f} ms  {fl / ms / 1e9:7.1f} TF/s  x cudnn {t['sdpa cudnn'] / ms:5.3f}  "
              f"old/this {t['old'] / ms:5.3f}", flush=True)
    for n in ("old", "new"):
        per = kernel_times_us(fns[n])
        print(f"  {n} kernels (us): " + ", ".join(f"{k.split('(')[0][:28]} {us:.0f}" for k, us in per.items()
                                                  if us > 5), flush=True)


if __name__ == "__main__":
    main(SHAPES, run_shape)
