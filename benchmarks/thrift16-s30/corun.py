"""Thrift decode's two streams side by side: the 16-bit stream as a persistent grid of a few programs per SM, the FP4
split kernel sized for fewer programs per SM under a register cap that leaves those programs room, so that both run
at once (the FP4 loop is bound by its instruction issue, the 16-bit stream by memory). ``decode_fwd`` with a fixed
selection, CUDA-graph replays (µs), bits against the default launch.

    OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/thrift16-s30/corun.py      # $OUT/corun.txt
"""
# ruff: noqa: B023
import os

import torch
from _ab import REP, logger, shapes
from _common import t
from torch.nn.attention import SDPBackend

import fp4attn
import fp4attn.kernels.decode as Dn
from fp4attn.bench.decode import sdpa_fn

P = logger("corun.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))
# (16-bit programs per SM (0: one per work item), FP4 programs per SM, FP4 register cap (0: the config's))
CFGS = [(0, 12, 0), (1, 12, 0), (1, 8, 168), (1, 9, 168), (2, 6, 168), (1, 8, 160), (2, 5, 200), (1, 7, 200)]

for _D, _nq, k, v, _cache, q, _cud in shapes(CASES, P):
    cu = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 30)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dn.select_pages(q, c16, THRIFT)
    D = q.shape[-1]
    P(f"  unfolded cuDNN {cu:.1f} us, selection {t(lambda: Dn.select_pages(q, c16, THRIFT), REP):.1f} us")
    ref = {}
    for p16, psm, cap in CFGS:
        Dn._PERSIST_16BIT = p16
        f = lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel, per_sm=psm, maxnreg=cap or None)
        o = f()[0]
        ref.setdefault(psm, o)
        us = t(f, REP)
        Dn._THRIFT_STREAMS = "serial"
        us_ser = t(f, REP)
        Dn._THRIFT_STREAMS = "side"
        P(f"  16-bit {p16}/SM, FP4 {psm:2d}/SM cap {cap or 'cfg'}: side {us:7.1f} us, serial {us_ser:7.1f} us, "
          f"bits equal to the first launch of {psm}/SM: {torch.equal(o, ref[psm])}")
    Dn._PERSIST_16BIT = 0
