"""In-process A/B of ``fp4attn.attention``: the tree under OLD_SRC (package ``fp4attn_old``) against this one,
each recipe and shape: outputs and LSE compared bit for bit, times min of interleaved do_bench rounds, next to
SDPA cuDNN / flash. VARIANTS: extra new-tree Gluon configs ("fm": the fused row max, which needs
``fused_max.patch`` applied; the final tree has no FUSED_MAX).

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/prepass-s34/ab.py
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.common import interleaved_min_ms  # noqa: E402
from fp4attn.kernels import attention_gluon as ag  # noqa: E402

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0").split(";")]
RECIPES = os.environ.get("RECIPES", "nvfp4,mxfp4,sage3").split(",")
VARIANTS = [v for v in os.environ.get("VARIANTS", "").split(";") if v]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
GL = dict(ag.DEFAULT)
torch.manual_seed(0)


def gl_cfg(v):
    ag.DEFAULT.clear()
    ag.DEFAULT.update(GL)
    if v == "fm":
        ag.DEFAULT["FUSED_MAX"] = True


def run_all(B, H, N, D, causal):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def f(backend=backend, q=q, k=k, v=v, causal=causal):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns[name] = (None, f)
    for r in RECIPES:
        fns[f"{r} old"] = (None, lambda r=r: fp4attn_old.attention(q, k, v, causal=causal, recipe=r, return_lse=True))
        for vv in [""] + VARIANTS:
            fns[f"{r} new{vv and ' ' + vv}"] = (vv, lambda r=r: fp4attn.attention(q, k, v, causal=causal, recipe=r,
                                                                                   return_lse=True))
    same = {}
    for n, (vv, f) in fns.items():
        if " new" in n:
            gl_cfg(vv)
            o, lse = f()
            o0, lse0 = fns[n.split()[0] + " old"][1]()
            torch.cuda.synchronize()
            same[n] = (torch.equal(o, o0) and torch.equal(lse, lse0),
                       ((o.float() - o0.float()).norm() / o0.float().norm()).item())
    t = interleaved_min_ms({n: f for n, (_, f) in fns.items()}, ROUNDS, prepare=lambda n: gl_cfg(fns[n][0] or ""))
    gl_cfg("")
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    print(f"\n## {sh}: cuDNN {t['cudnn']:.3f} ms, flash {t['flash']:.3f} ms")
    print("| variant | ms | TF/s | x cuDNN | x flash | old/new | bit-equal to old (rel. L2) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for n in fns:
        if n in ("cudnn", "flash"):
            continue
        old = t[n.split()[0] + " old"]
        eq = same.get(n)
        eqs = "" if eq is None else ("yes" if eq[0] else f"no ({eq[1]:.1e})")
        print(f"| {n} | {t[n]:.3f} | {fl / t[n] / 1e9:.0f} | {t['cudnn'] / t[n]:.3f} | {t['flash'] / t[n]:.3f} | "
              f"{old / t[n]:.3f} | {eqs} |", flush=True)


for s in SHAPES:
    run_all(*s[:4], bool(s[4]))
