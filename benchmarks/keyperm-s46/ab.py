"""In-process A/B of ``fp4attn.attention`` with the staged operands in the Gluon passes' key order (``perm``, the
default: ``quantize_qkv(key_perm=True)``, each 16-key block of P̃ in one thread) against key order (``nat``, the
forty-fifth session's kernels), forty-sixth session. Times: min of interleaved do_bench rounds, next to SDPA cuDNN /
flash (ORDER=rev times the variants in the other order). Accuracy: relative L2 of perm against nat, and each one's
error against exact attention (float32 SDPA) over nat's.

    RECIPES=nvfp4,sage3 PYTHONPATH=src python benchmarks/keyperm-s46/ab.py
"""
import os

import torch

import fp4attn
from fp4attn.bench.attention import _sdpa_fn
from fp4attn.bench.common import exact_attention, interleaved_min_ms
from fp4attn.kernels import attention as A
from fp4attn.metrics import rel_l2 as rl2

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0;16,16,4096,64,1").split(";")]
RECIPES = os.environ.get("RECIPES", "nvfp4,sage3").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
VARIANTS = ["perm", "nat"] if os.environ.get("ORDER", "") != "rev" else ["nat", "perm"]
_quantize_qkv = A.quantize_qkv
torch.manual_seed(0)


def use(v):
    """nat: every pre-pass writes key order (the op's attention_fwd and Thrift call the module's quantize_qkv)."""
    A.quantize_qkv = _quantize_qkv if v == "perm" else (lambda *a, **k: _quantize_qkv(*a, **{**k, "key_perm": False}))


def run(B, H, N, D, causal):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = {name: _sdpa_fn(q, k, v, causal, name) for name in ("cudnn", "flash")}
    for r in RECIPES:
        for vv in VARIANTS:
            fns[f"{r} {vv}"] = (lambda r=r: fp4attn.attention(q, k, v, causal=causal, recipe=r))
    sl = (slice(0, 1), slice(0, 2))
    exact = exact_attention(q[sl], k[sl], v[sl], causal)
    acc = {}
    for r in RECIPES:
        outs = {}
        for vv in VARIANTS:
            use(vv)
            outs[vv] = fns[f"{r} {vv}"]()
        torch.cuda.synchronize()
        e_nat = rl2(outs["nat"][sl], exact)
        acc[r] = (rl2(outs["perm"], outs["nat"]), rl2(outs["perm"][sl], exact) / e_nat, e_nat)
    t = interleaved_min_ms(fns, ROUNDS, prepare=lambda n: use(n.split()[-1] if " " in n else "perm"))
    use("perm")
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    print(f"\n## {sh}: cuDNN {t['cudnn']:.3f} ms, flash {t['flash']:.3f} ms", flush=True)
    print("| recipe | nat ms | perm ms | nat/perm | perm TF/s | perm x cuDNN | rel. L2 perm vs nat "
          "| perm error / nat's |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in RECIPES:
        tp, tn = t[f"{r} perm"], t[f"{r} nat"]
        print(f"| {r} | {tn:.3f} | {tp:.3f} | {tn / tp:.3f} | {fl / tp / 1e9:.0f} | {t['cudnn'] / tp:.3f} | "
              f"{acc[r][0]:.2e} | {acc[r][1]:.4f} |", flush=True)


for (B, H, N, D, c) in SHAPES:
    run(B, H, N, D, bool(c))
