"""Thirty-first session: Thrift decode on Hopper with the selected pages computed inside the Gluon FP4 split kernel
(one grid, one online softmax; the 16-bit K/V of a tile loaded only when some head of the kv group selected it),
which `fp4attn` now runs at tiles of <= 64 channels and <= 8 query rows (``decode_gluon.fused16_fits``), against the
tree before (the Gluon FP4 kernel plus the separate 16-bit stream kernel; a copy importable as ``fp4attn_old``, see
benchmarks/grid-s19/ab.py). CUDA-graph replays, rounds alternating old/new, min per variant. Also: the agreement
with the fused Triton split kernel and the old path, and Gluon against Triton at small work
(``_THRIFT_GLUON_MIN_WORK``). ``PER_SM``: programs per SM (register caps) to sweep. The probes in
results/probe*.txt ran this script's first version, with the fused tile at every shape (and, in probe 2, an L2
prefetch of the next selected pages' 16-bit rows, since removed); see README.md.

    OLD_SRC=.ab_old/src OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/thrift-fused-s31/ab.py
"""
# ruff: noqa: B023
import os

import torch
from _ab import REP, fp4attn_old, logger, rounds, shapes
from _common import cases, t
from torch.nn.attention import SDPBackend

import fp4attn
import fp4attn.kernels.decode as Dn
from fp4attn.bench.decode import sdpa_fn

P = logger("ab.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,64,1;1,32,8,131072,64,1;8,32,8,32768,48,1;8,32,8,32768,64,2;"
                                "8,32,8,32768,128,1;1,32,8,131072,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))
PER_SM = [int(x) for x in os.environ.get("PER_SM", "").split(",") if x]
SMALL = os.environ.get("SMALL", "1,32,8,2048,64,1;1,32,8,8192,64,1;1,32,8,16384,64,1;4,32,8,4096,64,1;"
                                "8,32,8,4096,64,1;2,32,8,32768,64,1")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


for D, _nq, k, v, cache, q, _cud in shapes(CASES, P):
    cu = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 30)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    c16_old = fp4attn_old.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dn.select_pages(q, c16, THRIFT)
    o_new = Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel, kernel="gluon")[0]
    o_tri = Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel, kernel="triton")[0]
    o_old = fp4attn_old.kernels.decode.decode_fwd(q, c16_old, scale=D ** -0.5, selection=sel, kernel="gluon")[0]
    P(f"  unfolded cuDNN {cu:.1f} us; rel L2 fused Gluon vs fused Triton {rel(o_new, o_tri):.2e}, vs old Gluon + "
      f"16-bit stream {rel(o_new, o_old):.2e}; old vs Triton {rel(o_old, o_tri):.2e}")
    fns = {"thrift old": lambda: fp4attn_old.decode(q, c16_old, thrift_budget=THRIFT),
           "thrift new": lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT),
           "sel given old": lambda: fp4attn_old.kernels.decode.decode_fwd(q, c16_old, scale=D ** -0.5, selection=sel),
           "sel given new": lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel),
           "nvfp4 new": lambda: fp4attn.decode(q, cache),
           "select old": lambda: fp4attn_old.kernels.decode.select_pages(q, c16_old, THRIFT),
           "select new": lambda: Dn.select_pages(q, c16, THRIFT)}
    best, res = rounds(fns)
    for n_, us in best.items():
        P(f"  {n_:13s} {us:8.1f} us  x unfolded cuDNN {cu / us:5.2f}  rounds {['%.1f' % x for x in res[n_]]}")
    same = torch.equal(sel, fp4attn_old.kernels.decode.select_pages(q, c16_old, THRIFT))
    P(f"  old/new: thrift op {best['thrift old'] / best['thrift new']:.3f}, with the selection given "
      f"{best['sel given old'] / best['sel given new']:.3f}, the selection "
      f"{best['select old'] / best['select new']:.3f}; selections equal {same}")
    psm0 = Dn._GLUON_CONFIG[True]["per_sm"]
    for psm in PER_SM:  # (the probes: the fused tile at every shape, under other register caps)
        Dn._GLUON_CONFIG[True]["per_sm"] = psm
        o = Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel)[0]
        us = t(lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT), REP)
        us2 = t(lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel), REP)
        P(f"  programs/SM {psm:2d} (cap {Dn.gluon_maxnreg(True, psm)}): thrift op {us:7.1f} us (x unfolded cuDNN "
          f"{cu / us:4.2f}), selection given {us2:7.1f} us; rel L2 vs Triton {rel(o, o_tri):.2e}")
    Dn._GLUON_CONFIG[True]["per_sm"] = psm0

P("\nGluon against Triton at small work (the selection given), new tree")
for B, Hq, Hkv, N, D, nq, k, v, _cache, q in cases(SMALL):
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dn.select_pages(q, c16, THRIFT)
    ug = t(lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel, kernel="gluon"), REP)
    ut = t(lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel, kernel="triton"), REP)
    c16o = fp4attn_old.KVCache.from_dense(k, v, keep_16bit=True)
    uo = t(lambda: fp4attn_old.kernels.decode.decode_fwd(q, c16o, scale=D ** -0.5, selection=sel, kernel="gluon"), REP)
    P(f"  ({B},{Hq},{Hkv},{N},{D},{nq}) work {B * Hkv * N:>9d}: gluon fused {ug:7.1f} us, triton {ut:7.1f} us, "
      f"old gluon + stream {uo:7.1f} us; triton/gluon {ut / ug:.2f}")
