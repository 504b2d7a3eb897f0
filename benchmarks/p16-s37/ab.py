"""In-process A/B of ``fp4attn.attention`` nvfp4: the tree under OLD_SRC (package ``fp4attn_old``) against this one.
Variants of the new tree: "" (defaults), "f32" (Gluon pass with the float32 P̃ rounding, ``P16=False``), "gl"
(the Gluon pass forced, ``FP4ATTN_ATTN_KERNEL=gluon``), "tr" (the Triton pass forced). Times: min of interleaved
do_bench rounds, next to SDPA cuDNN / flash. Accuracy: relative L2 against the old tree, and each variant's error
against exact attention (float32 SDPA on the bf16 inputs) over the old tree's.

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/p16-s37/ab.py
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
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0;16,16,4096,64,1").split(";")]
VARIANTS = os.environ.get("VARIANTS", ";f32;gl;tr").split(";")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
RECIPE = os.environ.get("RECIPE", "nvfp4")
GL = dict(ag.DEFAULT)
torch.manual_seed(0)


def use(v):
    ag.DEFAULT.clear()
    ag.DEFAULT.update(GL)
    os.environ.pop("FP4ATTN_ATTN_KERNEL", None)
    if v == "f32":
        ag.DEFAULT["P16"] = False
    elif v == "gl":
        os.environ["FP4ATTN_ATTN_KERNEL"] = "gluon"
    elif v == "tr":
        os.environ["FP4ATTN_ATTN_KERNEL"] = "triton"


def rl2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_all(B, H, N, D, causal):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        def f(backend=backend):
            with sdpa_kernel([backend]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns[name] = ("", f)
    fns["old"] = ("", lambda: fp4attn_old.attention(q, k, v, causal=causal, recipe=RECIPE, return_lse=True))
    for vv in VARIANTS:
        fns[f"new{vv and ' ' + vv}"] = (vv, lambda: fp4attn.attention(q, k, v, causal=causal, recipe=RECIPE,
                                                                      return_lse=True))
    # accuracy on the first 2 heads of the first batch (exact attention in float32)
    sl = (slice(0, 1), slice(0, 2))
    with sdpa_kernel([SDPBackend.MATH]):
        exact = torch.nn.functional.scaled_dot_product_attention(q[sl].float(), k[sl].float(), v[sl].float(),
                                                                 is_causal=causal)
    o_old = fns["old"][1]()[0]
    e_old = rl2(o_old[sl], exact)
    acc = {}
    for n, (vv, f) in fns.items():
        if n.startswith("new"):
            use(vv)
            o = f()[0]
            torch.cuda.synchronize()
            acc[n] = (rl2(o, o_old), rl2(o[sl], exact) / e_old)
    t = interleaved_min_ms({n: f for n, (_, f) in fns.items()}, ROUNDS, prepare=lambda n: use(fns[n][0]))
    use("")
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    print(f"\n## {RECIPE} {sh}: cuDNN {t['cudnn']:.3f} ms, flash {t['flash']:.3f} ms; old error vs exact {e_old:.4f}")
    print("| variant | ms | TF/s | x cuDNN | x flash | old/new | rel. L2 vs old | error / old's error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in fns:
        if n in ("cudnn", "flash"):
            continue
        a = acc.get(n)
        extra = "| | " if a is None else f"| {a[0]:.2e} | {a[1]:.4f} "
        print(f"| {n} | {t[n]:.3f} | {fl / t[n] / 1e9:.0f} | {t['cudnn'] / t[n]:.3f} | {t['flash'] / t[n]:.3f} | "
              f"{t['old'] / t[n]:.3f} {extra}|", flush=True)


for s in SHAPES:
    run_all(*s[:4], bool(s[4]))
