"""In-process A/B of sage3's two-level Gluon pass (and Thrift's FP4 phase, the same pass) on staged operands in the
Gluon passes' key order (``perm``: ``quantize_qkv(key_perm=True)``, the default after this session) against key order
(``nat``), forty-seventh session. nvfp4 (key order since the forty-sixth session) is timed in the same rounds for
the sage3 / nvfp4 ratio of issue 4. At D = 64 sage3 ran on the Triton pass (``auto``); there the Gluon pass in both
orders is timed too (``FP4ATTN_ATTN_KERNEL=gluon``). Times: min of interleaved do_bench rounds (quantization
included), next to SDPA cuDNN / flash. Accuracy: relative L2 of perm against nat, each one's error against exact
attention (float32 SDPA on the first two heads).

    PYTHONPATH=src python benchmarks/sage3-keyperm-s47/ab.py
"""
import os

import torch

import fp4attn
from fp4attn.bench.attention import _sdpa_fn
from fp4attn.bench.common import exact_attention, interleaved_min_ms
from fp4attn.kernels import attention as A
from fp4attn.metrics import rel_l2 as rl2

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0;16,16,4096,64,0;16,16,4096,64,1;"
    "4,16,16384,128,2").split(";")]  # last field: 0 / 1 causal; 2: causal with Thrift 5% (instead of sage3)
ROUNDS = int(os.environ.get("ROUNDS", "3"))
REV = os.environ.get("ORDER", "") == "rev"
_quantize_qkv = A.quantize_qkv
torch.manual_seed(0)


def use(name):
    """name "<recipe> <order> [<kernel>]": nat makes every pre-pass write key order (the op's attention_fwd and
    Thrift call the module's quantize_qkv); kernel sets FP4ATTN_ATTN_KERNEL (default auto)."""
    parts = name.split()
    nat = len(parts) > 1 and parts[1] == "nat"
    A.quantize_qkv = _quantize_qkv if not nat else (lambda *a, **k: _quantize_qkv(*a, **{**k, "key_perm": False}))
    os.environ["FP4ATTN_ATTN_KERNEL"] = parts[2] if len(parts) > 2 else "auto"


def run(B, H, N, D, mode):
    causal = mode > 0
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    fns = {name: _sdpa_fn(q, k, v, causal, name) for name in ("cudnn", "flash")}
    fns["nvfp4"] = lambda: fp4attn.attention(q, k, v, causal=causal, recipe="nvfp4")
    if mode == 2:
        pairs = [("thrift5 perm", "thrift5 nat")]
        f = lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05)  # noqa: E731
        names = pairs[0]
    else:
        pairs = [("sage3 perm", "sage3 nat")] if D == 128 else [("sage3 perm gluon", "sage3 nat gluon")]
        names = pairs[0] + (("sage3 nat auto",) if D != 128 else ())
        f = lambda: fp4attn.attention(q, k, v, causal=causal, recipe="sage3")  # noqa: E731
    for n in (reversed(names) if REV else names):
        fns[n] = f
    sl = (slice(0, 1), slice(0, 2))
    exact = exact_attention(q[sl], k[sl], v[sl], causal)
    outs = {}
    for n in names:
        use(n)
        outs[n] = f()
    torch.cuda.synchronize()
    use("nvfp4")
    t = interleaved_min_ms(fns, ROUNDS, prepare=use)
    use("nvfp4")
    sh = f"({B},{H},{N},{D}){' causal' if causal else ''}"
    print(f"\n## {sh}: cuDNN {t['cudnn']:.3f} ms, flash {t['flash']:.3f} ms, nvfp4 {t['nvfp4']:.3f} ms "
          f"({fl / t['nvfp4'] / 1e9:.0f} TF/s, {t['cudnn'] / t['nvfp4']:.3f}x cuDNN)", flush=True)
    print("| variant | ms | / nvfp4 | TF/s | x cuDNN | rel. L2 vs nat | error / nat's |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    nat = names[1]
    e_nat = rl2(outs[nat][sl], exact)
    for n in names:
        print(f"| {n} | {t[n]:.3f} | {t[n] / t['nvfp4']:.3f} | {fl / t[n] / 1e9:.0f} | {t['cudnn'] / t[n]:.3f} | "
              f"{rl2(outs[n], outs[nat]):.2e} | {rl2(outs[n][sl], exact) / e_nat:.4f} |", flush=True)


for (B, H, N, D, m) in SHAPES:
    run(B, H, N, D, m)
