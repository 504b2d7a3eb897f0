"""sage3's Q pre-pass (128-row smooth_q tiles) at 4 / 8 / 16 warps per program (``_PREP_CFG``'s q_smooth_warps):
the whole ``quantize_qkv`` of sage3 timed, nvfp4's beside it. Forty-eighth session.

    PYTHONPATH=src python benchmarks/corr-s48/prep_warps.py
"""
import torch
import triton.testing

from fp4attn.kernels import attention as A

base = A._PREP_CFG[False]["q_smooth_warps"]
for (B, H, N, D) in [(16, 16, 4096, 128), (4, 16, 16384, 128), (16, 16, 4096, 64)]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    row = []
    ref = None
    for w in (4, 8, 16, 4):
        A._PREP_CFG[False]["q_smooth_warps"] = w

        def f(q=q, k=k, v=v):
            return A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, smooth_q=True, smooth_k=True, key_perm=True)

        pk = f()
        same = ref is None or all(torch.equal(getattr(pk, n), getattr(ref, n)) for n in ("qc", "qs", "qkb", "qbar"))
        ref = ref or pk
        row.append(f"w{w} {triton.testing.do_bench(f, warmup=10, rep=200) * 1e3:.0f} us{'' if same else ' DIFF'}")
    t_nv = triton.testing.do_bench(lambda: A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, key_perm=True),  # noqa: B023
                                   warmup=10, rep=200)
    print(f"({B},{H},{N},{D}) sage3 pre-pass: " + " | ".join(row) + f" | nvfp4 {t_nv * 1e3:.0f} us", flush=True)
A._PREP_CFG[False]["q_smooth_warps"] = base
