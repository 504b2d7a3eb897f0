"""Twenty-seventh session: the decode split kernels' unmasked tile run (``_tiles.decode_tile_runs``: the Triton
kernel masked every tile before) and a register cap for the rows-along-M (ROWM) config, in one process against the
tree before (a copy importable as ``fp4attn_old``, see benchmarks/grid-s19/ab.py), CUDA-graph replays, rounds
alternating old/new, min per variant; outputs compared bit for bit.

    OLD_SRC=.ab_old/src OUT=out PYTHONPATH=src python benchmarks/rowm-s27/probe.py      # $OUT/probe.txt
"""
# ruff: noqa: B023
import os
import sys

import torch
import triton
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multiq-s26"))
from _common import cases, log, t  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.decode import sdpa_fn  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402
from fp4attn_old.kernels import decode as Dk_old  # noqa: E402

P = log(os.path.join(os.environ.get("OUT", "."), "probe.txt"))
REP = float(os.environ.get("REP_MS", 30))
ROUNDS = int(os.environ.get("ROUNDS", 2))
CASES = os.environ.get("CASES", "8,32,8,32768,128,8;8,32,8,32768,128,16;8,64,8,32768,128,16;8,64,8,32768,64,8;"
                                "8,64,8,32768,64,16;1,32,8,131072,128,16;8,32,8,32768,128,1;8,32,8,32768,128,4")


def ab(fns):
    """{name: fn} -> {name: min µs over ROUNDS alternating rounds}."""
    res = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            res[k].append(t(f, REP))
    return {k: min(v) for k, v in res.items()}


P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
last = None
for B, Hq, Hkv, N, D, nq, k, v, cache, q in cases(CASES):
    rows = Hq // Hkv * nq
    qf = q.view(B, Hkv, rows, D)
    sc = D ** -0.5
    cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v), REP)
    fla = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v), REP)
    P(f"\n(B,Hq,Hkv,N,D,nq)=({B},{Hq},{Hkv},{N},{D},{nq}) rows={rows}: bf16 folded cuDNN {cud:.1f} flash {fla:.1f} us")
    if cache is not last:  # a new (B, Hkv, N, D): the old package's cache of the same tokens
        cache_old, last = fp4attn_old.KVCache.from_dense(k, v), cache
    eq = torch.equal(fp4attn.decode(q, cache), fp4attn_old.decode(q, cache_old))
    fns = {"op old": lambda: fp4attn_old.decode(q, cache_old), "op new": lambda: fp4attn.decode(q, cache)}
    if rows <= 16:  # the transposed Triton kernel (the portable path; the op runs Gluon here)
        o_n = Dk.decode_fwd(q, cache, scale=sc, kernel="triton")
        o_o = Dk_old.decode_fwd(q, cache_old, scale=sc, kernel="triton")
        eq_t = torch.equal(o_n[0], o_o[0]) and torch.equal(o_n[1], o_o[1])
        fns["triton old"] = lambda: Dk_old.decode_fwd(q, cache_old, scale=sc, kernel="triton")
        fns["triton new"] = lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton")
        P(f"  op bit-equal {eq}; transposed Triton kernel bit-equal {eq_t}")
    else:
        P(f"  op bit-equal {eq}")
        for per_sm in (2, 3, 4):
            fns[f"rowm maxnreg 168 per_sm {per_sm}"] = (
                lambda per_sm=per_sm: Dk.decode_fwd(q, cache, scale=sc, rowm=True, maxnreg=168, per_sm=per_sm))
        fns["rowm per_sm 3"] = lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, per_sm=3)
        o = Dk.decode_fwd(q, cache, scale=sc, rowm=True, maxnreg=168)
        P(f"  rowm maxnreg 168 bit-equal to the op: {torch.equal(o[0], fp4attn.decode(q, cache))}")
    res = ab(fns)
    base = res["op old"]
    for name, us in res.items():
        P(f"  {name:32s} {us:8.1f} us  x old op {base / us:5.3f}  x cuDNN-folded {cud / us:5.2f}  "
          f"x flash-folded {fla / us:5.2f}")
