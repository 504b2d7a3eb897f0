"""Fifty-third session A/B (issue 4): the Gluon attention pass with the row sums carried per lane of the quad
(``_lane_reduce``, the four lanes combined once after the loop) against the tree under OLD_SRC (package
``fp4attn_old``, the commit before). ``rm0`` (first run only, ``results/ab_lanes_rowmax_h200.txt``): the row-max pass
without its per-lane maxima, then a switch of that tree. nvfp4 op calls, eager, quantization included; min over
interleaved rounds, the order reversed every other round; then each kernel's device time (torch.profiler, 10 calls).
Outputs: the row sums add the keys in another order (float32 rounding).

Needs ``lane_sums.patch`` applied to this tree (``git apply``; not kept) and the commit before under OLD_SRC:

    mkdir -p out/ab_old && git archive HEAD src/fp4attn | tar -x -C out/ab_old
    mv out/ab_old/src/fp4attn out/ab_old/src/fp4attn_old && git apply benchmarks/phi-words-s53/lane_sums.patch
    OLD_SRC=out/ab_old/src PYTHONPATH=src python benchmarks/phi-words-s53/ab_lanes.py [rounds]
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.environ.get("OLD_SRC", "out/ab_old/src"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
import fp4attn_old  # noqa: E402
from _util import kernel_times_us  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import device_name, interleaved_min_ms  # noqa: E402

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (16, 16, 4096, 64, False), (16, 16, 4096, 64, True),
          (2, 32, 8192, 128, True)]


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    print(f"device: {device_name()}, torch {torch.__version__}", flush=True)
    for shape in SHAPES:
        run_shape(*shape, rounds)


def run_shape(B, H, N, D, causal, rounds):
    g = torch.Generator(device="cuda").manual_seed(N + D)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    fns = {
        "sdpa cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "old": lambda: fp4attn_old.attention(q, k, v, causal=causal, return_lse=True),
        "new": lambda: fp4attn.attention(q, k, v, causal=causal, return_lse=True),
    }
    prepare = None
    (o_old, l_old), (o_new, l_new) = fns["old"](), fns["new"]()
    d_o = ((o_new.float() - o_old.float()).norm() / o_old.float().norm()).item()
    d_l = (l_new - l_old).abs().max().item()
    t = interleaved_min_ms(fns, (rounds + 1) // 2, prepare=prepare, warmup_ms=25, rep_ms=100)
    t2 = interleaved_min_ms(dict(reversed(list(fns.items()))), rounds // 2, prepare=prepare, warmup_ms=25,
                            rep_ms=100)
    t = {n: min(t[n], t2[n]) for n in t}
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


def _sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


if __name__ == "__main__":
    main()
