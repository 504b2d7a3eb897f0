"""sage3's one-pass attention kernel under other tile configs / register caps (``attention_fwd(config=...)``),
outputs compared bit for bit with the default config; nvfp4's op in the same run for the ratio.

    PYTHONPATH=src python benchmarks/prepass-s34/sage3_cfg.py
"""
import os

import torch
from triton.testing import do_bench

import fp4attn
from fp4attn.kernels import attention as ka

SHAPES = [tuple(int(x) for x in s.split(",")) for s in
          os.environ.get("SHAPES", "16,16,4096,128,0;16,16,4096,128,1;4,16,16384,128,0").split(";")]
RECIPE = os.environ.get("RECIPE", "sage3")  # sage3 | mxfp4 | nvfp4 (config: the Triton pass, i.e. D != 128)
ONLY = os.environ.get("ONLY")
CFGS = {
    "default": None,
    "cap168": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "maxnreg": 168},
    "cap128": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "maxnreg": 128},
    "s2": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2},
    "s4": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4},
    "m128w8s2": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
    "m128w8s3": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
    "cap168s2": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "maxnreg": 168},
}
if ONLY:
    CFGS = {n: c for n, c in CFGS.items() if n in ONLY.split(",")}
FLAGS = {"sage3": dict(fmt="nvfp4", smooth_q=True, smooth_k=True, two_level_p=True),
         "mxfp4": dict(fmt="mxfp4"), "nvfp4": dict(fmt="nvfp4")}[RECIPE]
torch.manual_seed(0)
for (B, H, N, D, causal) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    c = bool(causal)

    def run(cfg, q=q, k=k, v=v, c=c):
        return ka.attention_fwd(q, k, v, causal=c, config=cfg, **FLAGS)

    ref = run(None)
    t = {n: float("inf") for n in CFGS}
    t["nvfp4"] = float("inf")
    same = {n: torch.equal(run(cfg)[0], ref[0]) for n, cfg in CFGS.items()}
    for _ in range(3):
        t["nvfp4"] = min(t["nvfp4"], do_bench(lambda q=q, k=k, v=v, c=c: fp4attn.attention(q, k, v, causal=c),
                                              warmup=3, rep=30))
        for n, cfg in CFGS.items():
            t[n] = min(t[n], do_bench(lambda cfg=cfg: run(cfg), warmup=3, rep=30))
    print(f"\n## ({B},{H},{N},{D}){' causal' if c else ''}: nvfp4 op {t['nvfp4']:.3f} ms")
    for n in CFGS:
        print(f"  {n:10s} {RECIPE} {t[n]:.3f} ms  / nvfp4 {t[n] / t['nvfp4']:.3f}  bit-equal {same[n]}", flush=True)
