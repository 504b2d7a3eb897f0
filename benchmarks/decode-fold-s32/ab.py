"""Thirty-second session: the Gluon decode kernel with 1, 2 or 4 query rows per kv head puts 8 / rows channel parts
of each row in the score MMA's 8 columns (``decode_gluon.default_fold``), so that the online softmax and the P̃
rounding run on 4 values per lane instead of 8 (half of them padding), against the tree before (a copy importable
as ``fp4attn_old``, see benchmarks/grid-s19/ab.py). CUDA-graph replays of the public op, rounds alternating old/new,
min per variant; nvfp4 and Thrift (5%) decode. Also: new against old outputs at equal splits (bits and relative L2).

    OLD_SRC=.ab_old/src OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/decode-fold-s32/ab.py
"""
# ruff: noqa: B023
import os

import torch
from _ab import fp4attn_old, logger, rounds, shapes
from _common import t
from torch.nn.attention import SDPBackend

import fp4attn
import fp4attn.kernels.decode as Dn
from fp4attn.bench.decode import sdpa_fn
from fp4attn.kernels import decode_gluon

P = logger("ab.txt")
# G·n_q = 4 (fold 2), 2 (fold 4), 1 (fold 8) and 8 (fold 1: unchanged, a control)
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,32,8,32768,64,1;8,16,8,32768,256,1;"
                                "8,16,8,32768,128,1;4,32,32,16384,128,1;8,32,8,32768,128,2")
THRIFT = float(os.environ.get("THRIFT", 0.05))


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


for D, nq, k, v, _cache, q, _cud in shapes(CASES, P):
    G = q.shape[1] // k.shape[1]
    cu = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 30)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    c_old = fp4attn_old.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dn.select_pages(q, c16, THRIFT)
    kw = dict(scale=D ** -0.5, num_splits=16, kernel="gluon")
    o_new, l_new = Dn.decode_fwd(q, c16, **kw)
    o_old, l_old = fp4attn_old.kernels.decode.decode_fwd(q, c_old, **kw)
    o_tri = Dn.decode_fwd(q, c16, scale=D ** -0.5, num_splits=16, kernel="triton")[0]
    t_new = Dn.decode_fwd(q, c16, selection=sel, **kw)[0]
    t_old = fp4attn_old.kernels.decode.decode_fwd(q, c_old, selection=sel, **kw)[0]
    P(f"  fold {decode_gluon.default_fold(G * nq, 8)}; unfolded cuDNN {cu:.1f} us; nvfp4 new vs old: equal "
      f"{torch.equal(o_new, o_old)}, rel L2 {rel(o_new, o_old):.2e}, LSE max diff "
      f"{(l_new - l_old).abs().max().item():.2e}; new vs Triton {rel(o_new, o_tri):.2e}; old vs Triton "
      f"{rel(o_old, o_tri):.2e}; Thrift new vs old: equal {torch.equal(t_new, t_old)}, rel L2 {rel(t_new, t_old):.2e}")
    fns = {"nvfp4 old": lambda: fp4attn_old.decode(q, c_old),
           "nvfp4 new": lambda: fp4attn.decode(q, c16),
           "thrift old": lambda: fp4attn_old.decode(q, c_old, thrift_budget=THRIFT),
           "thrift new": lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT)}
    best, res = rounds(fns)
    for n_, us in best.items():
        P(f"  {n_:11s} {us:8.1f} us  x unfolded cuDNN {cu / us:5.2f}  rounds {['%.1f' % x for x in res[n_]]}")
    P(f"  old/new: nvfp4 {best['nvfp4 old'] / best['nvfp4 new']:.3f}, "
      f"thrift {best['thrift old'] / best['thrift new']:.3f}")
