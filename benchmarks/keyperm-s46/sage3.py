"""sage3 against nvfp4 after the key order (forty-sixth session): sage3 on the Triton pass (auto at D = 64), on the
Gluon pass in key order, and on the Gluon pass in the Gluon passes' key order (forced; the op keeps key order for
two-level P), min of interleaved do_bench rounds.

    PYTHONPATH=src python benchmarks/keyperm-s46/sage3.py
"""
import os

import torch

import fp4attn
from fp4attn.bench.common import interleaved_min_ms
from fp4attn.kernels import attention as A

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,64,0;16,16,4096,64,1;16,16,4096,128,1;16,16,4096,128,0").split(";")]
_order = A.gluon_key_order
_cfg = A.attention_gluon.default_config


def use(v):
    os.environ.pop("FP4ATTN_ATTN_KERNEL", None)
    A.gluon_key_order = _order
    A.attention_gluon.default_config = _cfg
    if v.endswith("168"):  # 3 programs per SM at D = 64 too (the default caps it at 128 registers: 4 per SM)
        A.attention_gluon.default_config = lambda dp: A.attention_gluon.DEFAULT
    if v.startswith("gluon"):
        os.environ["FP4ATTN_ATTN_KERNEL"] = "gluon"
    if v.startswith("gluon-perm"):
        A.gluon_key_order = lambda does, *, online, smooth_q, dp: does and (online or _order(does, online=online,
                                                                                             smooth_q=smooth_q, dp=dp))


def run(B, H, N, D, causal):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns = {"nvfp4 auto": lambda: fp4attn.attention(q, k, v, causal=causal, recipe="nvfp4")}
    for var in ("auto", "gluon-nat", "gluon-perm", "gluon-perm168"):
        fns[f"sage3 {var}"] = lambda: fp4attn.attention(q, k, v, causal=causal, recipe="sage3")
    ref = None
    for n, f in fns.items():
        use(n.split()[1])
        o = f()
        if n.startswith("sage3"):
            ref = o if ref is None else ref
            print(n, "rel. L2 vs sage3 auto", ((o.float() - ref.float()).norm() / ref.float().norm()).item())
    t = interleaved_min_ms(fns, 3, prepare=lambda n: use(n.split()[1]))
    use("auto")
    print(f"({B},{H},{N},{D}){' causal' if causal else ''}: " + ", ".join(
        f"{n} {ms:.3f} ms ({ms / t['nvfp4 auto']:.3f}x nvfp4)" for n, ms in t.items()), flush=True)


for (B, H, N, D, c) in SHAPES:
    run(B, H, N, D, bool(c))
