"""Where the FP4 decode step's time goes at the issue's two shapes (thirty-ninth session): CUDA-graph time of
``decode_fwd`` against the number of splits (a fixed cost plus a cost per tile of a split), and the per-kernel times
(torch.profiler) of the default step.

    PYTHONPATH=src python benchmarks/decode-s39/splits_probe.py
"""
import os
import sys

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "session6-2026-11-22", "probes")]
from _case import case  # noqa: E402
from _util import kernel_times_us  # noqa: E402  (the session-6 probes' profiler helper)

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "8,32,8,32768,128;1,32,8,131072,128").split(";")]
SPLITS = {32768: [8, 16, 24, 32, 40, 48, 64], 131072: [66, 132, 198, 264, 330, 396, 528]}
REP = float(os.environ.get("REP_MS", "60"))


for (B, Hq, Hkv, C, D) in SHAPES:
    q, cache, scale = case(B, Hq, Hkv, C, D)
    print(f"## ({B},{Hq},{Hkv},{C},{D})", flush=True)
    per = kernel_times_us(lambda: Dk.decode_fwd(q, cache, scale=scale), n=20)
    print("default step, per kernel (us):", {k: round(v, 1) for k, v in per.items()})
    t0 = graph_time_ms(lambda: Dk.decode_fwd(q, cache, scale=scale), REP)
    print(f"default graph: {t0 * 1e3:.1f} us")
    for ns in SPLITS.get(C, []):
        t = graph_time_ms(lambda ns=ns: Dk.decode_fwd(q, cache, scale=scale, num_splits=ns), REP)
        tiles = -(-C // ns // 32)
        print(f"splits {ns:4d} ({B * Hkv * ns} programs, {tiles} tiles each): {t * 1e3:.1f} us", flush=True)
    for per_sm in (12, 14, 16):
        t = graph_time_ms(lambda p=per_sm: Dk.decode_fwd(q, cache, scale=scale, per_sm=p), REP)
        print(f"per_sm {per_sm}: {t * 1e3:.1f} us", flush=True)
