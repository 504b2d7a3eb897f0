"""sage3 on the Gluon attention pass against the Triton pass, in one process, with nvfp4 for the sage3 / nvfp4
ratio (issue 4: sage3 within 1.15x of nvfp4) and SDPA cuDNN / flash. Variants ``RUNS`` (";"-separated
``recipe:kernel[:k=v,...]``; kernel "auto" / "gluon" / "triton", k=v overrides ``attention_gluon.DEFAULT``;
a recipe ``old-<recipe>`` runs the tree under ``OLD_SRC``, package ``fp4attn_old``, with its defaults).
Times: min of ``ROUNDS`` interleaved ``do_bench`` rounds. Accuracy: each run's relative L2 against the first
run of its recipe, and its error against exact attention (float32 SDPA on the bf16 inputs, 2 heads).

    PYTHONPATH=src python benchmarks/sage3-gluon-s38/ab.py
    RUNS="old-nvfp4:auto;nvfp4:auto;old-sage3:auto;sage3:auto" OLD_SRC=.ab_old/src PYTHONPATH=src python ...
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fp4attn
from fp4attn.bench.attention import _sdpa_fn
from fp4attn.bench.common import interleaved_min_ms
from fp4attn.kernels import attention_gluon as ag

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0;16,16,4096,64,1").split(";")]
RUNS = os.environ.get("RUNS", "nvfp4:auto;sage3:triton;sage3:gluon").split(";")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
GL = dict(ag.DEFAULT)


def parse(r):
    recipe, kern, *rest = r.split(":")
    cfg = dict(GL)
    for kv in (rest[0].split(",") if rest else []):
        k, v = kv.split("=")
        cfg[k] = int(v)
    return recipe, kern, cfg


def use(kern, cfg):
    ag.DEFAULT.clear()
    ag.DEFAULT.update(cfg)
    os.environ["FP4ATTN_ATTN_KERNEL"] = kern


def rl2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_all(B, H, N, D, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = {name: (None, _sdpa_fn(q, k, v, causal, name)) for name in ("cudnn", "flash")}
    for r in RUNS:
        recipe, kern, cfg = parse(r)
        mod = fp4attn
        if recipe.startswith("old-"):
            sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
            import fp4attn_old as mod
            recipe = recipe[4:]
        fns[r] = ((kern, cfg), lambda recipe=recipe, mod=mod: mod.attention(q, k, v, causal=causal, recipe=recipe,
                                                                              return_lse=True)[0])
    sl = (slice(0, 1), slice(0, 2))
    with sdpa_kernel([SDPBackend.MATH]):
        exact = torch.nn.functional.scaled_dot_product_attention(q[sl].float(), k[sl].float(), v[sl].float(),
                                                                 is_causal=causal)
    acc, first = {}, {}
    for n, (kc, f) in fns.items():
        if kc is None:
            continue
        use(*kc)
        o = f()
        torch.cuda.synchronize()
        rec = n.split(":")[0].removeprefix("old-")
        first.setdefault(rec, o)
        acc[n] = (rl2(o, first[rec]), rl2(o[sl], exact))
    t = interleaved_min_ms({n: f for n, (_, f) in fns.items()}, ROUNDS,
                           prepare=lambda n: fns[n][0] is not None and use(*fns[n][0]))
    base = t[RUNS[0]]
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    print(f"\n## {sh}: cuDNN {t['cudnn']:.3f} ms, flash {t['flash']:.3f} ms")
    print(f"| run | ms | TF/s | x cuDNN | x flash | time / {RUNS[0]} | rel. L2 vs first of recipe | error vs exact |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in RUNS:
        a = acc[n]
        print(f"| {n} | {t[n]:.3f} | {fl / t[n] / 1e9:.0f} | {t['cudnn'] / t[n]:.3f} | {t['flash'] / t[n]:.3f} | "
              f"{t[n] / base:.3f} | {a[0]:.2e} | {a[1]:.4f} |", flush=True)


for s in SHAPES:
    run_all(*s[:4], bool(s[4]))
