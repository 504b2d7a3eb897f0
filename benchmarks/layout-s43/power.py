"""Forty-third session: SM clock and board power while one step replays back to back (CUDA graph, ~4 s per
variant), sampled by nvidia-smi every 100 ms. MODE=decode (default): the cuDNN bf16 decode and the FP4 kernel at
(8,32,8,32k,128), plain and under the probe switches of probe.py (loads-only, work-only, pipe12: apply
probe_switches.patch first, or they run the plain kernel). MODE=attention: SDPA cuDNN / flash and
``fp4attn.attention`` nvfp4 / mxfp4 at (16,16,4096,128), quantization included. Is the FP4 decode's SM clock
(1.77 GHz in ncu, against 1.97 for the loads alone) held down by the power limit?

    OUT=out PYTHONPATH=src python benchmarks/layout-s43/power.py
    MODE=attention OUT=out PYTHONPATH=src python benchmarks/layout-s43/power.py
"""
# ruff: noqa: B023
import os
import subprocess
import sys
import time

import torch

import fp4attn
from fp4attn.bench.common import capture_graph
from fp4attn.bench.decode import decode_inputs, sdpa_fn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "decode-prologue-s42")]  # _log: the s42 scripts' log helper
from _log import logger  # noqa: E402
from probe import setv  # noqa: E402

P = logger("power.txt")
FIELDS = "clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active"


def sample(name, g, steps_per_replay):
    """Replay g for ~4 s under nvidia-smi; log the last samples."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={FIELDS}", "--format=csv,noheader", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    t0 = time.time()
    n = 0
    while time.time() - t0 < 4.0:
        g.replay()
        n += steps_per_replay
        if n % (100 * steps_per_replay) == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    smi.terminate()
    lines = smi.communicate()[0].strip().splitlines()
    P(f"\n{name}: {n} steps in {time.time() - t0:.2f} s; last samples:")
    for ln in lines[-8:]:
        P("  " + ln)


P(torch.cuda.get_device_name(), FIELDS)
if os.environ.get("MODE", "decode") == "decode":
    B, Hq, Hkv, N, D = 8, 32, 8, 32768, 128
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    cu = sdpa_fn(torch.nn.attention.SDPBackend.CUDNN_ATTENTION, q, k, v)
    for name in ("cudnn", "separate", "loads-only", "work-only", "pipe12"):
        setv("separate" if name == "cudnn" else name)
        sample(name, capture_graph(cu if name == "cudnn" else (lambda: fp4attn.decode(q, cache)), 20, 1), 20)
    setv("separate")
else:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g0 = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g0) for _ in range(3))
    for name in ("cudnn", "flash", "nvfp4", "mxfp4"):
        if name in ("cudnn", "flash"):
            be = SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION

            def fn():
                with sdpa_kernel([be]):
                    torch.nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            def fn():
                fp4attn.attention(q, k, v, recipe=name)
        sample(name, capture_graph(fn, 2, 1), 2)
