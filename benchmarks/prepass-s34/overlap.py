"""Row-max pass of batch chunk c + 1 on a side stream while the attention pass of chunk c runs: op time
for FP4ATTN_OVERLAP = chunks (0 = the two passes in sequence), side-stream priority, and row-max /
Gluon configs; every output checked bit-equal to the sequential run. Min of interleaved do_bench rounds.

    PYTHONPATH=src python benchmarks/prepass-s34/overlap.py
"""
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import fp4attn
from fp4attn.kernels import attention as ka
from fp4attn.kernels import attention_gluon as ag

SHAPES = [tuple(int(x) for x in s.split(",")) for s in
          os.environ.get("SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0").split(";")]
RECIPES = os.environ.get("RECIPES", "nvfp4,mxfp4").split(",")
VARIANTS = os.environ.get("VARIANTS", "0:0;2:0;4:0;8:0;4:-1;8:-1").split(";")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
torch.manual_seed(0)
default_max = ka.default_max_config
GL_DEFAULT = dict(ag.DEFAULT)


def setv(v):
    """v = 'chunks:prio[:max=BMxBNxW][:gl=maxnreg][:fm=0|1][:ns=slots]'"""
    parts = v.split(":")
    os.environ["FP4ATTN_OVERLAP"] = parts[0]
    if os.environ.get("FP4ATTN_OVERLAP_PRIO") != parts[1]:
        os.environ["FP4ATTN_OVERLAP_PRIO"] = parts[1]
        ka._SIDE.clear()
    ka.default_max_config = default_max
    ag.DEFAULT.clear()
    ag.DEFAULT.update(GL_DEFAULT)
    for p in parts[2:]:
        k, val = p.split("=")
        if k == "max":
            bm, bn, w = (int(x) for x in val.split("x"))
            ka.default_max_config = lambda dp, path, is_mx=False, c={"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                                                                     "num_stages": 3}: c
        elif k == "gl":
            ag.DEFAULT["maxnreg"] = int(val)
        elif k == "fm":
            ag.DEFAULT["FUSED_MAX"] = bool(int(val))
        elif k == "ns":
            ag.DEFAULT["NS"] = int(val)


for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def f(backend=backend, q=q, k=k, v=v, causal=bool(causal)):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns[name] = (None, f)
    ref = {}
    for r in RECIPES:
        setv("0:0")
        ref[r] = fp4attn.attention(q, k, v, causal=bool(causal), recipe=r, return_lse=True)
        for vv in VARIANTS:
            fns[f"{r} {vv}"] = (vv, lambda r=r, q=q, k=k, v=v, c=bool(causal):
                                fp4attn.attention(q, k, v, causal=c, recipe=r))
    bad = []
    for n, (vv, _f) in fns.items():
        if vv is not None:
            setv(vv)
            r = n.split()[0]
            o, l = fp4attn.attention(q, k, v, causal=bool(causal), recipe=r, return_lse=True)
            torch.cuda.synchronize()
            if not (torch.equal(o, ref[r][0]) and torch.equal(l, ref[r][1])):
                bad.append(n)
    t = {n: float("inf") for n in fns}
    for _ in range(ROUNDS):
        for n, (vv, f) in fns.items():
            if vv is not None:
                setv(vv)
            t[n] = min(t[n], do_bench(f, warmup=10, rep=60))
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    print(f"\n## {sh}: cuDNN {t['cudnn']:.3f} ms, flash {t['flash']:.3f} ms; not bit-equal: {bad or 'none'}")
    for n in fns:
        if n in ("cudnn", "flash"):
            continue
        r = n.split()[0]
        base = t[f"{r} {VARIANTS[0]}"]
        print(f"  {n:28s} {t[n]:7.3f} ms  {fl / t[n] / 1e9:5.0f} TF/s  x cuDNN {t['cudnn'] / t[n]:.3f}  "
              f"vs seq {base / t[n]:.3f}", flush=True)
setv("0:0")
