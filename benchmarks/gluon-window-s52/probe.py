"""Fifty-second session probe: what windows and sinks cost on the FP4 attention op today (they run the Triton
passes), against the Gluon passes of a plain causal call and the Triton passes forced (``FP4ATTN_ATTN_KERNEL``),
side by side with SDPA (flash, cuDNN). gpt-oss-like (GQA 64/8, D = 64, window 128, sinks) and Mistral-like
(GQA 32/8, D = 128, window 4096) shapes. Eager calls (GPU-paced at these sizes), min over interleaved rounds.

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
        "nvfp4 causal (gluon)": lambda: att(q, k, v, causal=True),
        "nvfp4 causal (triton)": lambda: att(q, k, v, causal=True),
        "nvfp4 causal+sinks": lambda: att(q, k, v, causal=True, sinks=sinks),
        "nvfp4 window": lambda: att(q, k, v, causal=True, window_size=(wl, 0)),
        "nvfp4 window+sinks": lambda: att(q, k, v, causal=True, window_size=(wl, 0), sinks=sinks),
        "sage3 causal (gluon)": lambda: att(q, k, v, causal=True, recipe="sage3"),
        "sage3 causal (triton)": lambda: att(q, k, v, causal=True, recipe="sage3"),
        "sage3 window+sinks": lambda: att(q, k, v, causal=True, recipe="sage3", window_size=(wl, 0), sinks=sinks),
    }

    def prepare(name):
        os.environ["FP4ATTN_ATTN_KERNEL"] = "triton" if "(triton)" in name else "auto"

    t = interleaved_min_ms(fns, rounds, prepare=prepare, warmup_ms=25, rep_ms=100)
    os.environ["FP4ATTN_ATTN_KERNEL"] = "auto"
    fl, flw = causal_flops(B, Hq, N, D), causal_flops(B, Hq, N, D, wl)
    print(f"\n({B},{Hq},{Hkv},{N},{D}) window {wl + 1}: causal {fl / 1e12:.2f} TFLOP, windowed {flw / 1e12:.3f}",
          flush=True)
    for n, ms in t.items():
        f = flw if "window" in n else fl
        print(f"  {n:26s} {ms:8.3f} ms  {f / ms / 1e9:7.1f} TF/s  x cudnn(causal) {t['sdpa cudnn'] / ms:5.2f}")


def _sdpa(backend, q, k, v):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


if __name__ == "__main__":
    main()
