"""What the Gluon split kernel's fixed cost is made of (thirty-ninth session): CUDA-graph times at one and at 32 tiles
per program (64 heads x 32 splits) of the step, the split kernel alone, the reduce alone, the split kernel without
the q quantization (FP4ATTN_PROBE=1) and without its tile loop (FP4ATTN_PROBE=2; 3: nor the store of its partial
outputs; probe knobs in decode_gluon.py that were never committed), and empty kernels on the same grid (the floor of
a graph replay).

    PYTHONPATH=src python benchmarks/decode-s39/fixed_probe2.py
"""
import os
import sys

import torch
import triton
import triton.language as tl

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _case import case  # noqa: E402
from reduce_probe import captured, patched, real_fast  # noqa: E402

REP = float(os.environ.get("REP_MS", "40"))


@triton.jit
def _empty(X):
    if tl.program_id(0) == 100000:
        tl.store(X, 1.0)


x = torch.zeros(1, device="cuda")
e1 = graph_time_ms(lambda: _empty[(32, 64)](x, num_warps=1), REP) * 1e3
e2 = graph_time_ms(lambda: (_empty[(32, 64)](x, num_warps=1), _empty[(256, 4)](x, num_warps=4)), REP) * 1e3
print(f"empty kernel (32, 64) x 1 warp: {e1:.1f} us; it and an empty (256, 4) x 4 warps: {e2:.1f} us")
for tiles in (1, 32):
    C = 32 * tiles * 32
    q, cache, _ = case(8, 32, 8, C, 128)

    def step():
        return Dk.decode_fwd(q, cache, scale=128 ** -0.5, num_splits=32)
    res = {"step": graph_time_ms(step, REP)}
    Dk.fast = patched(True)
    res["split only"] = graph_time_ms(step, REP)
    for probe in ("1", "2", "3"):
        os.environ["FP4ATTN_PROBE"] = probe
        res[f"split only, probe {probe}"] = graph_time_ms(step, REP)
        del os.environ["FP4ATTN_PROBE"]
    Dk.fast = patched(False)
    step()
    grid, a, kwr = captured["reduce"]
    kwr.pop("launch_pdl", None)
    kwr["PDL"] = False
    res["reduce only"] = graph_time_ms(lambda: real_fast(Dk._decode_reduce_kernel)[grid](*a, **kwr), REP)
    Dk.fast = real_fast
    print(f"{tiles} tiles/program: " + ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in res.items()), flush=True)
