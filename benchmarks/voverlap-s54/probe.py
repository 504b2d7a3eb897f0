"""Fifty-fourth session probe (issue 4; needs ``v_overlap.patch`` applied): the V pre-pass launched beside the
row-max pass (``attention.V_OVERLAP``):
"high" (the row-max pass on a high-priority side stream, the V pre-pass on the current stream), "side" (the V
pre-pass on a normal-priority side stream) against "serial" (before: V pre-pass, then the row-max pass), side by
side with SDPA (flash, cuDNN). nvfp4 (single-level P: the row-max pass runs); outputs must be bit-equal. Eager op
calls, quantization included, min over interleaved rounds (the order reversed every other round).

    PYTHONPATH=src python benchmarks/voverlap-s54/probe.py [rounds]
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.kernels import attention as A

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "phi-words-s53"))
from probe import SHAPES, both_orders_min_ms, main, print_table, qkv, sdpa  # noqa: E402

MODES = ("high", "side", "serial")


def run_shape(B, H, N, D, causal, rounds):
    q, k, v = qkv(B, H, N, D)
    fns = {
        "sdpa cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "sdpa flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
    }
    for m in MODES:
        fns[f"nvfp4 {m}"] = lambda: fp4attn.attention(q, k, v, causal=causal)

    def prepare(name):
        A.V_OVERLAP = name.split()[-1] if name.startswith("nvfp4") else "high"

    outs = {}
    for n, f in fns.items():
        if n.startswith("nvfp4"):
            prepare(n)
            outs[n] = f()
            torch.cuda.synchronize()
    same = all(torch.equal(outs[n], outs["nvfp4 serial"]) for n in outs)
    t = both_orders_min_ms(fns, rounds, prepare)
    print_table((B, H, N, D, causal), t, f"bit-equal to serial: {same}",
                lambda n, ms: f"  serial/this {t['nvfp4 serial'] / ms:5.3f}" if n.startswith("nvfp4") else "")
    prepare("")


if __name__ == "__main__":
    main(SHAPES, run_shape)
