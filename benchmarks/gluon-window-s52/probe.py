"""Fifty-second session probe: the FP4 attention op with sliding windows and sinks on the Gluon passes (new) against
the Triton passes (``FP4ATTN_ATTN_KERNEL=triton``, what they ran before; ``FP4ATTN_THRIFT_KERNEL=triton`` for
Thrift's FP4 phase), a plain causal call the same two ways, side by side with SDPA (flash, cuDNN). gpt-oss-like
(GQA 64/8, D = 64, window 128, sinks) and Mistral-like (GQA 32/8, D = 128, window 4096) shapes. Eager calls
(GPU-paced at these sizes), min over interleaved rounds.

    PYTHONPATH=src python benchmarks/gluon-window-s52/probe.py [rounds]
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp4attn
from fp4attn.bench.common import device_name, interleaved_min_ms

SHAPES = [  # B, Hq, Hkv, N, D, window left (w - 1)
    (1, 64, 8, 16384, 64, 127),
    (4, 64, 8, 4096, 64, 127),
    (1, 32, 8, 16384, 128, 4095),
    (4, 32, 8, 8192, 128, 4095),
]


def causal_flops(B, Hq, N, D, w=None):
    pairs = N * (N + 1) / 2 if w is None else sum(min(i + 1, w + 1) for i in range(N))
    return 4 * B * Hq * pairs * D


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(f"device: {device_name()}, torch {torch.__version__}")
    for shape in SHAPES:
        run_shape(*shape, rounds)


def run_shape(B, Hq, Hkv, N, D, wl, rounds):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    sinks = torch.randn(Hq, device="cuda", generator=g)
    kr, vr = (x.repeat_interleave(Hq // Hkv, 1) for x in (k, v))
    att = fp4attn.attention
    fns = {
        "sdpa cudnn": lambda: _sdpa(SDPBackend.CUDNN_ATTENTION, q, kr, vr),
        "sdpa flash": lambda: _sdpa(SDPBackend.FLASH_ATTENTION, q, kr, vr),
    }
    for kern in ("gluon", "triton"):
        fns.update({
            f"nvfp4 causal ({kern})": lambda: att(q, k, v, causal=True),
            f"nvfp4 causal+sinks ({kern})": lambda: att(q, k, v, causal=True, sinks=sinks),
            f"nvfp4 window ({kern})": lambda: att(q, k, v, causal=True, window_size=(wl, 0)),
            f"nvfp4 window+sinks ({kern})": lambda: att(q, k, v, causal=True, window_size=(wl, 0), sinks=sinks),
            f"sage3 window+sinks ({kern})": lambda: att(q, k, v, causal=True, recipe="sage3", window_size=(wl, 0),
                                                        sinks=sinks),
            f"thrift5 window ({kern})": lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05,
                                                                         window_size=(wl, 0)),
        })

    def prepare(name):  # "(triton)": the Triton attention passes and Thrift's fused kernel for both phases
        kern = "triton" if "(triton)" in name else "auto"
        os.environ["FP4ATTN_ATTN_KERNEL"] = kern
        os.environ["FP4ATTN_THRIFT_KERNEL"] = kern

    t = interleaved_min_ms(fns, rounds, prepare=prepare, warmup_ms=25, rep_ms=100)
    prepare("")
    fl, flw = causal_flops(B, Hq, N, D), causal_flops(B, Hq, N, D, wl)
    print(f"\n({B},{Hq},{Hkv},{N},{D}) window {wl + 1}: causal {fl / 1e12:.2f} TFLOP, windowed {flw / 1e12:.3f}",
          flush=True)
    for n, ms in t.items():
        f = flw if "window" in n else fl
        gain = f"  triton/gluon {t[n.replace('(gluon)', '(triton)')] / ms:5.3f}" if "(gluon)" in n else ""
        print(f"  {n:28s} {ms:8.3f} ms  {f / ms / 1e9:7.1f} TF/s  x cudnn(causal) {t['sdpa cudnn'] / ms:5.2f}{gain}")


def _sdpa(backend, q, k, v):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


if __name__ == "__main__":
    main()
