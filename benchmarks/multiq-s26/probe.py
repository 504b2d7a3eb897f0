"""Two config probes of the decode split kernel for many query rows per kv head (G·n_q 16..128), CUDA-graph replays,
against bf16 SDPA with the GQA group folded into the query length (B, Hkv, G·n_q, D): what a decode kernel that reads
each bf16 page once per group (FlashAttention's kvcache path, FlashInfer) costs.

* ``transposed`` (run first, ``results/probe_cfg_h100.txt``): the transposed Triton tiles' configs, 32/64/128-key
  tiles on 4/8 warps, against the default config.
* ``rowm`` (``results/probe_rowm_h100.txt``): the rows along the MMA's M: configs (key tile, warps, programs per SM,
  row padding) against the transposed kernel (what ran before); and rowm vs transposed at equal tiles and splits.

(One file since the runs; each was its own script then, probe_cfg.py and probe_rowm.py, with the same code.)
Usage: OUT=out PYTHONPATH=src python benchmarks/multiq-s26/probe.py transposed|rowm"""
# ruff: noqa: B023
import os
import sys

import torch
import triton
from _common import cases, log
from _common import t as _t
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.decode import sdpa_fn
from fp4attn.kernels import decode as Dk

REP = float(os.environ.get("REP_MS", 40))


def t(fn):
    return _t(fn, REP)


def transposed(P):
    CASES = os.environ.get("CASES", "8,32,8,32768,128,4;8,32,8,32768,128,8;8,32,8,32768,128,16;"
                                "8,64,8,32768,128,16;8,64,8,32768,64,4;8,64,8,32768,64,8")
    CFGS = [(bn, nw, st) for bn in (32, 64, 128) for nw in (4, 8) for st in (2,)]
    for B, Hq, Hkv, N, D, nq, k, v, cache, q in cases(CASES):
        G = Hq // Hkv
        qf = q.view(B, Hkv, G * nq, D)  # the group folded into the query length (no mask: the probe's bf16 bound)
        cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v))
        fla = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v))
        exact = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        # (the exact reference has no causal mask among the new tokens; the last n_q keys' mask moves it little)
        sc = D ** -0.5
        P(f"\n(B,Hq,Hkv,N,D,nq)=({B},{Hq},{Hkv},{N},{D},{nq}) rows={G * nq}: bf16 folded cuDNN {cud:.1f} "
          f"flash {fla:.1f}")
        res = {}
        for cfg in [None] + CFGS:
            kwc = {} if cfg is None else dict(block_n=cfg[0], num_warps=cfg[1], num_stages=cfg[2])
            try:
                us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc))
                o = Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc)[0].float()
                err = ((o - exact).norm() / exact.norm()).item()
            except Exception as e:  # noqa: BLE001
                P(f"  cfg {cfg}: failed {type(e).__name__}: {str(e)[:150]}")
                continue
            res[cfg] = us
            P(f"  cfg {cfg or 'default'}: {us:8.1f} us  x cuDNN-folded {cud / us:.2f}  err vs exact {err:.4f}")
        best = min((c for c in res if c is not None), key=res.get)
        for per_sm in (1, 2, 4, 6):
            kwc = dict(block_n=best[0], num_warps=best[1], num_stages=best[2], per_sm=per_sm)
            us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc))
            P(f"  best {best} per_sm {per_sm}: {us:8.1f} us  x cuDNN-folded {cud / us:.2f}")
        for st in (3, 4):
            kwc = dict(block_n=best[0], num_warps=best[1], num_stages=st)
            us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, kernel="triton", **kwc))
            P(f"  best {best[:2]} stages {st}: {us:8.1f} us")


def rowm(P):
    CASES = os.environ.get("CASES", "8,32,8,32768,128,4;8,32,8,32768,128,8;8,32,8,32768,128,16;"
                                "8,64,8,32768,128,16;8,64,8,32768,64,4;8,64,8,32768,64,8;1,32,8,131072,128,8")
    for B, Hq, Hkv, N, D, nq, k, v, cache, q in cases(CASES):
        G = Hq // Hkv
        rows = G * nq
        qf = q.view(B, Hkv, rows, D)
        cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v))
        fla = t(sdpa_fn(SDPBackend.FLASH_ATTENTION, qf, k, v))
        sc = D ** -0.5
        P(f"\n(B,Hq,Hkv,N,D,nq)=({B},{Hq},{Hkv},{N},{D},{nq}) rows={rows}: bf16 folded cuDNN {cud:.1f} flash {fla:.1f}")
        o_m = Dk.decode_fwd(q, cache, scale=sc, kernel="triton", rowm=True, block_n=64, num_splits=16)
        o_t = Dk.decode_fwd(q, cache, scale=sc, kernel="triton", rowm=False, block_n=64, num_splits=16)
        rel = ((o_m[0].float() - o_t[0].float()).norm() / o_t[0].float().norm()).item()
        dl = (o_m[1] - o_t[1]).abs().max().item()
        P(f"  rowm vs transposed (64-key tiles, 16 splits): rel {rel:.2e} lse {dl:.1e}")
        old = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=False))
        op = t(lambda: fp4attn.decode(q, cache))
        P(f"  before (transposed / Gluon, default): {old:8.1f} us x cuDNN-folded {cud / old:.2f} | op now {op:8.1f} "
          f"x cuDNN-folded {cud / op:.2f} x flash-folded {fla / op:.2f}")
        res = {}
        for bn, nw in ((64, 4), (32, 4), (64, 8)):
            for per_sm in (1, 2, 4):
                kwc = dict(block_n=bn, num_warps=nw, per_sm=per_sm)
                us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, **kwc))
                res[(bn, nw, per_sm)] = us
                P(f"  rowm bn {bn} warps {nw} per_sm {per_sm}: {us:8.1f} us x cuDNN-folded {cud / us:.2f}")
        best = min(res, key=res.get)
        bn, nw, per_sm = best
        for st in (3,):
            us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, block_n=bn, num_warps=nw, per_sm=per_sm,
                                         num_stages=st))
            P(f"  best {best} stages {st}: {us:8.1f} us")
        if rows < 64:
            us = t(lambda: Dk.decode_fwd(q, cache, scale=sc, rowm=True, block_n=bn, num_warps=nw, per_sm=per_sm,
                                         block_m=64))
            P(f"  best {best} rows padded to 64: {us:8.1f} us")


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "rowm"
    P = log({"transposed": "probe_cfg.txt", "rowm": "probe_rowm.txt"}[which])
    P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    {"transposed": transposed, "rowm": rowm}[which](P)
