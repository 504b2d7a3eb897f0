"""Thirtieth session: Thrift decode's 16-bit stream (``decode._decode_16bit_kernel``) lists the pages its kv group
selected and loops over that list, pipelined (cp.async of the next pages' K and V), against the tree before (a copy
importable as ``fp4attn_old``, see benchmarks/grid-s19/ab.py). CUDA-graph replays, rounds alternating old/new, min
per variant; outputs compared bit for bit. Also the 16-bit stream alone (its launcher on a fixed selection) under a
few (pages per program, pipeline stages) settings, and the union share of the selected pages.

    OLD_SRC=.ab_old/src OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/thrift16-s30/ab16.py
"""
# ruff: noqa: B023
import os

import torch
from _ab import REP, fp4attn_old, logger, rounds, shapes
from _common import t
from torch.nn.attention import SDPBackend

import fp4attn
import fp4attn.kernels.decode as Dn
from fp4attn.bench.decode import sdpa_fn

Do = fp4attn_old.kernels.decode
P = logger("ab16.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))
# pages per program x pipeline stages x warps of the 16-bit kernel
SWEEP = [tuple(int(x) for x in s.split("x"))
         for s in os.environ.get("SWEEP", "32x3x4,16x3x4,32x3x8,16x3x8,32x2x8,32x4x4").split(",")]


def stream16(mod, q, c, sel, pps=None, stages=None):
    """The 16-bit stream's launch alone (partials into fresh buffers) for module ``mod``'s kernel."""
    B, Hq, NQ, D = q.shape
    Hkv = c.num_kv_heads
    G = Hq // Hkv
    maxp = c.page_table.shape[1]
    if pps is not None:
        mod._PAGES_16BIT, mod._STAGES_16BIT = pps, stages
    n16 = -(-maxp // mod._PAGES_16BIT)
    BM = 8
    OP = torch.zeros(B * Hkv * n16 * BM, D, device="cuda")  # zeros: rows the kernels do not write compare equal
    MP = torch.zeros(B * Hkv * n16 * BM, device="cuda")
    LP = torch.zeros_like(MP)
    pp, st = mod._PAGES_16BIT, getattr(mod, "_STAGES_16BIT", None)

    def f():
        if st is not None:
            mod._PAGES_16BIT, mod._STAGES_16BIT = pp, st
        mod._launch_16bit(q, c.k16, c.v16, c.page_table, c.seq_lens, sel, OP, MP, LP, D ** -0.5, Hkv, NQ, G, maxp,
                          n16, 0, n16, B, D, c.page_size, BM, False)
        return OP, MP, LP
    return f


for D, _nq, k, v, cache, q, _cud in shapes(CASES, P):
    cu = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 30)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    c16_old = fp4attn_old.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dn.select_pages(q, c16, THRIFT)
    B, Hq = q.shape[:2]
    Hkv = c16.num_kv_heads
    npg = -(-k.shape[2] // c16.page_size)
    u = sel[..., :npg].view(B, Hkv, Hq // Hkv, npg).amax(2).float().mean().item()
    P(f"  unfolded cuDNN {cu:.1f} us; selected share per head {sel[..., :npg].float().mean().item():.4f}, "
      f"union per kv group {u:.4f}")
    eq = torch.equal(fp4attn.decode(q, c16, thrift_budget=THRIFT), fp4attn_old.decode(q, c16_old, thrift_budget=THRIFT))
    f_old, f_new = stream16(Do, q, c16, sel), stream16(Dn, q, c16, sel)
    po, pn = f_old(), f_new()
    eqs = all(torch.equal(a, b) for a, b in zip(po, pn))
    P(f"  bits equal: thrift op {eq}, 16-bit stream partials {eqs}")
    fns = {"thrift old": lambda: fp4attn_old.decode(q, c16_old, thrift_budget=THRIFT),
           "thrift new": lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT),
           "nvfp4 new": lambda: fp4attn.decode(q, cache),
           "16bit old": f_old, "16bit new": f_new}
    best, res = rounds(fns)
    for n_, us in best.items():
        P(f"  {n_:11s} {us:8.1f} us  x unfolded cuDNN {cu / us:5.2f}  rounds {['%.1f' % x for x in res[n_]]}")
    P(f"  old/new: thrift {best['thrift old'] / best['thrift new']:.3f}, 16-bit stream "
      f"{best['16bit old'] / best['16bit new']:.3f}")
    byt16 = u * 2 * B * Hkv * npg * c16.page_size * D * 2
    P(f"  16-bit stream bytes {byt16 / 1e6:.1f} MB: old {byt16 / best['16bit old'] / 1e6:.2f} TB/s, "
      f"new {byt16 / best['16bit new'] / 1e6:.2f} TB/s")
    for pps, st, nw in SWEEP:
        Dn._WARPS_16BIT = nw
        f = stream16(Dn, q, c16, sel, pps, st)
        ok = all(torch.equal(a, b) for a, b in zip(f(), f())) if pps == 32 else "-"
        us16 = t(f, REP)
        g = lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT)
        Dn._PAGES_16BIT, Dn._STAGES_16BIT = pps, st
        uso = t(g, REP)
        P(f"  sweep pages/program {pps:3d} stages {st} warps {nw}: 16-bit {us16:7.1f} us, thrift op {uso:7.1f} us"
          f" (x unfolded cuDNN {cu / uso:4.2f}) {ok}")
    Dn._PAGES_16BIT, Dn._STAGES_16BIT, Dn._WARPS_16BIT = 32, 3, 4
    # the two streams side by side or serial, FP4 programs per SM
    th = lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT)
    us_sel = t(lambda: Dn.select_pages(q, c16, THRIFT), REP)
    P(f"  selection alone {us_sel:.1f} us")
    ref = th()
    for streams in ("side", "serial"):
        for psm in (8, 10, 12):
            Dn._THRIFT_STREAMS = streams
            Dn._GLUON_CONFIG[True]["per_sm"] = psm
            o = th()
            us = t(th, REP)
            P(f"  {streams:6s} FP4 programs/SM {psm:2d}: thrift op {us:7.1f} us "
              f"(x unfolded cuDNN {cu / us:4.2f}) bits equal {torch.equal(o, ref)}")
    Dn._THRIFT_STREAMS = "side"
    Dn._GLUON_CONFIG[True]["per_sm"] = 12
