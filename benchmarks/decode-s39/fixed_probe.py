"""Fixed and per-tile cost of the Gluon split kernel (thirty-ninth session): CUDA-graph time of ``decode_fwd`` at a
fixed grid (splits per head) while the tiles per program grow, for the issue's two grid geometries (64 heads x 32
splits; 8 heads x 264 splits). A straight-line fit T = a + b·tiles gives the per-program fixed cost a.

    PYTHONPATH=src python benchmarks/decode-s39/fixed_probe.py
"""
import os
import sys

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _case import case  # noqa: E402

REP = float(os.environ.get("REP_MS", "40"))
GEOMS = [(8, 32, 8, 32), (1, 32, 8, 264)]  # (B, Hq, Hkv, splits)

for (B, Hq, Hkv, ns) in GEOMS:
    pts = []
    for tiles in (1, 2, 4, 8, 16, 32):
        C = ns * tiles * 32
        q, cache, scale = case(B, Hq, Hkv, C, 128)
        t = graph_time_ms(lambda: Dk.decode_fwd(q, cache, scale=scale, num_splits=ns), REP) * 1e3
        pts.append((tiles, t))
        print(f"B={B} Hkv={Hkv} splits={ns} ({B * Hkv * ns} programs) tiles/program {tiles:3d} ctx {C}: {t:.1f} us",
              flush=True)
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    b = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    print(f"  fit: T = {my - b * mx:.1f} us + {b:.2f} us/tile", flush=True)
