"""Shared pieces of this session's probe scripts (run from the repository root with PYTHONPATH=src)."""
import collections

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

SHAPES = ((16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False), (16, 16, 4096, 64, False))
RECIPES = dict(nvfp4=("nvfp4", False), mxfp4=("mxfp4", False), sage3=("nvfp4", True))  # (fmt, smoothing)


def sdpa_ms(q, k, v, causal):
    """(cuDNN ms, flash ms) of bf16 SDPA on the same tensors."""
    out = []
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel([backend]):
            out.append(do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                warmup=25, rep=100))
    return tuple(out)


def kernel_times_us(fn, n=10):
    """{kernel name: mean device time (us) per call of fn}, from the torch profiler over n calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    agg = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:70]] += e.device_time / n
    return dict(sorted(agg.items(), key=lambda x: -x[1]))
