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

from fp4attn.kernels import attention as A

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "phi-words-s53"))
from probe import SHAPES, main, run_variants  # noqa: E402

MODES = ("high", "side", "serial")


def run_shape(B, H, N, D, causal, rounds):
    def prepare(name):
        A.V_OVERLAP = name.split()[-1] if name.startswith("nvfp4") else "high"

    run_variants((B, H, N, D, causal), rounds, MODES, prepare, "serial")


if __name__ == "__main__":
    main(SHAPES, run_shape)
