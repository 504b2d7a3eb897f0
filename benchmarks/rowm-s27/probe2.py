"""32 query rows per kv head: ROWM's default row block (32 rows: mma.sync tiles, 1406 SASS per 64-key tile) against
rows padded to 64 (wgmma, 1184), and 2 warps per program; CUDA-graph replays, min of 2 alternating rounds.
$OUT/probe2.txt.

    OUT=out PYTHONPATH=src python benchmarks/rowm-s27/probe2.py
"""
# ruff: noqa: B023
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multiq-s26"))
from _common import cases, log, t  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402

P = log(os.path.join(os.environ.get("OUT", "."), "probe2.txt"))
for B, Hq, Hkv, N, D, nq, _k, _v, cache, q in cases("8,32,8,32768,128,8;8,64,8,32768,128,4;1,32,8,131072,128,8"):
    sc = D ** -0.5
    fns = {"op": lambda: fp4attn.decode(q, cache),
           "rows padded to 64": lambda: Dk.decode_fwd(q, cache, scale=sc, block_m=64),
           "2 warps (per_sm 6)": lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, num_warps=2)}
    o = fp4attn.decode(q, cache)
    rel = ((Dk.decode_fwd(q, cache, scale=sc, block_m=64)[0].float() - o.float()).norm() / o.float().norm()).item()
    res = {n: min(t(f, 30) for _ in range(2)) for n, f in fns.items()}
    P(f"({B},{Hq},{Hkv},{N},{D}) nq={nq} rows={Hq // Hkv * nq}: " +
      "  ".join(f"{n} {us:.1f} us" for n, us in res.items()) + f"  (padded vs op rel {rel:.1e})")
