"""sage3's smooth_q correction table (``smooth_q_corr``) per kernel config: time (do_bench, min of rounds) and
the table's error against a float64 one (max |diff| / max |c|), and the sage3 op per config.

    PYTHONPATH=src python benchmarks/prepass-s34/corr.py

The precision ("ieee") and "T" (keys along M) variants ran on a probe version of ``_smooth_q_corr_kernel`` with
``PREC`` / ``TRANS`` constexprs passed from ``_CORR_CFG`` (not kept: every variant was slower, results/corr*.txt);
the final tree takes only the tf32x3 rows.
"""
import os

import torch
from triton.testing import do_bench

import fp4attn
from fp4attn.kernels import attention as ka

SHAPES = [tuple(int(x) for x in s.split(",")) for s in
          os.environ.get("SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0").split(";")]
CFGS = os.environ.get("CFGS", "64,16,4,tf32x3;64,16,4,ieee;64,32,4,ieee;128,32,8,ieee;32,16,4,ieee;"
                      "64,16,8,ieee;128,16,4,ieee;64,32,8,ieee").split(";")
DEFAULT = dict(ka._CORR_CFG)
torch.manual_seed(0)


def setc(c):
    """'keys,query blocks,warps,precision[,T (keys along M)]'"""
    bt, cqb, nw, prec, *rest = c.split(",")
    ka._CORR_CFG.clear()
    ka._CORR_CFG.update(block_t=int(bt), cqb=int(cqb), num_warps=int(nw), PREC=prec, TRANS="T" in rest)


for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    pk = ka.quantize_qkv(q, k, v, fmt="nvfp4", smooth_q=True, smooth_k=True)
    nqb = pk.qbar.shape[2]
    # float64 table: qbar (B,H,NQB,DP) · (k - kbar) (B,H,N,D)
    ks = (k.double() - pk.kbar.double()[:, :, None, :])
    want = torch.einsum("bhcd,bhnd->bhcn", pk.qbar[..., :D].double(), ks)
    print(f"\n## ({B},{H},{N},{D}){' causal' if causal else ''}")
    res = {}
    nv = min(do_bench(lambda q=q, k=k, v=v, c=bool(causal): fp4attn.attention(q, k, v, causal=c, recipe="nvfp4"),
                      warmup=3, rep=30) for _ in range(3))
    print(f"  nvfp4 op {nv:.3f} ms")
    for _ in range(3):
        for c in CFGS:
            setc(c)
            out = torch.empty((B, H, nqb, pk.ks.shape[2]), device="cuda", dtype=torch.float32)
            t = do_bench(lambda pk=pk, out=out, c=bool(causal), n=nqb: ka.smooth_q_corr(pk, 0, n, out=out, causal=c),
                         warmup=5, rep=40)
            op = do_bench(lambda q=q, k=k, v=v, c=bool(causal): fp4attn.attention(q, k, v, causal=c, recipe="sage3"),
                          warmup=3, rep=30)
            prev = res.get(c, (1e9, 1e9, 0))
            res[c] = (min(prev[0], t), min(prev[1], op), 0)
            if not causal:
                err = ((out[..., :N].double() - want).abs().max() / want.abs().max()).item()
                res[c] = (res[c][0], res[c][1], err)
    for c, (t, op, err) in res.items():
        print(f"  {c:18s} table {t * 1e3:7.1f} us   sage3 op {op:.3f} ms (/ nvfp4 {op / nv:.3f})   "
              f"max err {err:.1e}", flush=True)
    ka._CORR_CFG.clear()
    ka._CORR_CFG.update(DEFAULT)
