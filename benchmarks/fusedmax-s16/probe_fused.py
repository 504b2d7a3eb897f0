"""Fused row-max + attention (PMAX=3) vs the two launches (PMAX 1 then 2), attention pass only, on the
pre-pass buffers, next to SDPA cuDNN in the same run. Outputs must be bit-identical.
Usage: PYTHONPATH=src python benchmarks/fusedmax-s16/probe_fused.py [--quick]"""
import multiprocessing as mp
import sys

import torch
from triton.testing import do_bench

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False), (16, 16, 4096, 64, False)]
FMTS = ["nvfp4", "mxfp4"]
C64 = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
C128 = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
C128b = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2)
VARIANTS = {  # name: (fused, config or None = default)
    "two": (False, None),
    "f64": (True, C64),
    "f64m128": (True, dict(C64, MAX_BN=128)),
    "f128": (True, C128),
    "f128m128": (True, dict(C128, MAX_BN=128)),
    "f128x128": (True, C128b),
}


def inputs(B, H, N, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]


def run_variant(pk, shape, name):
    from fp4attn.kernels import attention as A
    B, H, N, D, causal = shape
    fused, cfg = VARIANTS[name]
    out = torch.empty(B, H, N, D, device="cuda", dtype=torch.bfloat16)

    def f():
        return A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=False, B=B, Hq=H, Hkv=H,
                                  out=out, online=False, config=cfg, fused_max=fused)
    return f, out


def warm(job):
    shape, fmt, name = job
    from fp4attn.kernels import attention as A
    B, H, N, D, causal = shape
    q, k, v = inputs(B, H, min(N, 1024), D)
    pk = A.quantize_qkv(q, k, v, fmt=fmt)
    f, _ = run_variant(pk, (B, H, min(N, 1024), D, causal), name)
    try:
        f()
        torch.cuda.synchronize()
        return job, "ok"
    except Exception as e:  # noqa: BLE001
        return job, f"FAIL {type(e).__name__}: {str(e)[:200]}"


def main():
    from fp4attn.kernels import attention as A
    jobs = [(s, f, n) for s in SHAPES for f in FMTS for n in VARIANTS]
    ctx = mp.get_context("spawn")
    with ctx.Pool(12) as pool:
        bad = set()
        for job, st in pool.imap_unordered(warm, jobs):
            if st != "ok":
                print("warm", job, st, flush=True)
                bad.add(job)
    print("| shape | fmt | cuDNN ms | " + " | ".join(VARIANTS) + " | best × two |", flush=True)
    print("|---|---|---:|" + "---:|" * len(VARIANTS) + "---:|", flush=True)
    for shape in SHAPES:
        B, H, N, D, causal = shape
        q, k, v = inputs(B, H, N, D)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            tc = do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
                          warmup=25, rep=100)
        for fmt in FMTS:
            pk = A.quantize_qkv(q, k, v, fmt=fmt)
            fns = {}
            ref = None
            for name in VARIANTS:
                if (shape, fmt, name) in bad:
                    continue
                f, out = run_variant(pk, shape, name)
                lse = f()
                torch.cuda.synchronize()
                if ref is None:
                    ref = (out.clone(), lse.clone())
                elif not (torch.equal(ref[0], out) and torch.equal(ref[1], lse)):
                    print(f"MISMATCH {shape} {fmt} {name}", flush=True)
                fns[name] = f
            t = {n: [] for n in fns}
            for _ in range(3):  # interleaved rounds, min taken
                for n, f in fns.items():
                    t[n].append(do_bench(f, warmup=10, rep=60))
            t = {n: min(v) for n, v in t.items()}
            best = min(t.values())
            cells = " | ".join(f"{t[n]:.3f}" if n in t else "–" for n in VARIANTS)
            print(f"| {shape} | {fmt} | {tc:.3f} | {cells} | {t['two'] / best:.3f} |", flush=True)
            del pk
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
