"""The smooth_q correction table kernel (``attention.smooth_q_corr``) alone: key order against the Gluon passes' key
order, over a few tile configs (``attention._CORR_CFG``), next to a plain fill of the same bytes (the bandwidth bound
of its stores). Forty-seventh session.

    PYTHONPATH=src python benchmarks/sage3-keyperm-s47/bench_table.py
"""
import itertools
import os

import torch
import triton.testing

from fp4attn.kernels import attention as A

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0").split(";")]
# results/table_sweep2_h200.txt also has "trans" (keys along M) and "split" (the keys' TF32 split hoisted out of the
# loop) variants: constexpr options of an interim kernel; the split one is the kernel now, trans was not kept
CFGS = [dict(block_t=bt, cqb=cq, num_warps=nw) for bt, cq, nw in itertools.product((64, 128), (16, 32), (4, 8))]
ORDERS = [bool(int(x)) for x in os.environ.get("KEY_PERM", "0,1").split(",")]


def shape(B, H, N, D, c):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    pks = {kp: A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, smooth_q=True, smooth_k=True, key_perm=kp)
           for kp in ORDERS}
    nqb = pks[ORDERS[0]].qbar.shape[2]
    out = A.smooth_q_corr(pks[ORDERS[0]], 0, nqb)
    fill = triton.testing.do_bench(lambda: out.fill_(1.0), warmup=10, rep=100)
    mb = out.numel() * 4 / 1e6
    print(f"\n## ({B},{H},{N},{D}){' causal' if c else ''}: table {mb:.0f} MB, fill {fill * 1e3:.0f} us "
          f"({mb / fill / 1e3:.2f} TB/s)", flush=True)
    ref = {kp: None for kp in pks}
    for cfg in CFGS:
        A._CORR_CFG.clear()
        A._CORR_CFG.update(cfg)
        row = []
        for kp, pk in pks.items():
            o = A.smooth_q_corr(pk, 0, nqb, causal=bool(c))
            if ref[kp] is None:
                ref[kp] = o.clone()
            same = torch.equal(o, ref[kp]) if not c else True
            t = triton.testing.do_bench(lambda: A.smooth_q_corr(pk, 0, nqb, out=out, causal=bool(c)),  # noqa: B023
                                        warmup=10, rep=100)
            row.append(f"{'perm' if kp else 'nat'} {t * 1e3:6.0f} us{'' if same else ' (DIFFERENT)'}")
        print(f"{cfg}: " + " | ".join(row), flush=True)


base = dict(A._CORR_CFG)
for s in SHAPES:
    shape(*s)
    A._CORR_CFG.clear()
    A._CORR_CFG.update(base)
