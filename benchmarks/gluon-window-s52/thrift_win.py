"""Fifty-second session probe: Thrift 5% with a sliding window, its FP4 phase on the Gluon attention pass (the extra
staged pre-pass, then the fused kernel's 16-bit phase) against both phases in the fused Triton kernel
(``FP4ATTN_THRIFT_KERNEL=triton``), over window widths: where the Gluon phase starts to pay. Eager calls, min over
interleaved rounds.

    PYTHONPATH=src python benchmarks/gluon-window-s52/thrift_win.py [rounds]
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import device_name, interleaved_min_ms

SHAPES = [(1, 64, 8, 16384, 64), (1, 32, 8, 16384, 128)]
WIDTHS = [128, 256, 512, 1024, 2048]


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"device: {device_name()}, torch {torch.__version__}")
    for B, Hq, Hkv, N, D in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        fns = {}
        for w in WIDTHS:
            for kern in ("auto", "triton"):
                fns[w, kern] = (lambda w=w, q=q, k=k, v=v: fp4attn.thrift_attention(
                    q, k, v, causal=True, budget=0.05, window_size=(w - 1, 0)))

        def prepare(name):
            os.environ["FP4ATTN_THRIFT_KERNEL"] = name[1]

        t = interleaved_min_ms(fns, rounds, prepare=prepare, warmup_ms=25, rep_ms=100)
        os.environ["FP4ATTN_THRIFT_KERNEL"] = "auto"
        print(f"\n({B},{Hq},{Hkv},{N},{D}) Thrift 5%, causal window w: gluon phase ms, fused triton ms, triton/gluon")
        for w in WIDTHS:
            print(f"  w={w:5d}  {t[w, 'auto']:7.3f}  {t[w, 'triton']:7.3f}  {t[w, 'triton'] / t[w, 'auto']:5.3f}",
                  flush=True)


if __name__ == "__main__":
    main()
