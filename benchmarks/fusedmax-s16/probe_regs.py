"""Attention-pass configs with more programs per SM: register caps (maxnreg) and fewer stages, on the
pre-pass buffers (two launches; the row-max pass keeps its default tiles). Same run: SDPA cuDNN.
Usage: PYTHONPATH=src python benchmarks/fusedmax-s16/probe_regs.py"""
import multiprocessing as mp

import torch
from triton.testing import do_bench

SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (16, 16, 4096, 64, False)]
FMTS = ["nvfp4", "mxfp4"]
B64 = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4)
VARIANTS = {
    "s3": dict(B64, num_stages=3),
    "s2": dict(B64, num_stages=2),
    "s2r168": dict(B64, num_stages=2, maxnreg=168),
    "s2r128": dict(B64, num_stages=2, maxnreg=128),
    "s3r168": dict(B64, num_stages=3, maxnreg=168),
    "n32s3": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
    "n32s3r168": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3, maxnreg=168),
}


def inputs(B, H, N, D):
    g = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]


def fn(pk, shape, cfg):
    """A variant's call; ``cfg`` is a tile config, plus ``fused_max`` for probe_fused.py (needs the patch)."""
    from fp4attn.kernels import attention as A
    B, H, N, D, causal = shape
    cfg = dict(cfg)
    extra = {"fused_max": cfg.pop("fused_max")} if "fused_max" in cfg else {}
    out = torch.empty(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    return (lambda: A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=False, B=B, Hq=H, Hkv=H,
                                       out=out, online=False, config=cfg, **extra)), out


def warm(job):
    shape, fmt, name = job
    from fp4attn.kernels import attention as A
    B, H, N, D, causal = shape
    q, k, v = inputs(B, H, 512, D)
    pk = A.quantize_qkv(q, k, v, fmt=fmt)
    try:
        fn(pk, (B, H, 512, D, causal), VARIANTS[name])[0]()
        torch.cuda.synchronize()
        return job, "ok"
    except Exception as e:  # noqa: BLE001
        return job, f"FAIL {type(e).__name__}: {str(e)[:200]}"


def main():
    from fp4attn.kernels import attention as A
    jobs = [(s, f, n) for s in SHAPES for f in FMTS for n in VARIANTS]
    bad = set()
    with mp.get_context("spawn").Pool(14) as pool:
        for job, st in pool.imap_unordered(warm, jobs):
            if st != "ok":
                print("warm", job, st, flush=True)
                bad.add(job)
    print("| shape | fmt | cuDNN ms | " + " | ".join(VARIANTS) + " |", flush=True)
    print("|---|---|---:|" + "---:|" * len(VARIANTS), flush=True)
    for shape in SHAPES:
        B, H, N, D, causal = shape
        q, k, v = inputs(B, H, N, D)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            tc = do_bench(lambda q=q, k=k, v=v, c=causal: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=c), warmup=25, rep=100)
        for fmt in FMTS:
            pk = A.quantize_qkv(q, k, v, fmt=fmt)
            fns, ref = {}, None
            for n, c in VARIANTS.items():
                if (shape, fmt, n) in bad:
                    continue
                f, out = fn(pk, shape, c)
                lse = f()
                if ref is None:
                    ref = (out.clone(), lse.clone())
                elif not (torch.equal(out, ref[0]) and torch.equal(lse, ref[1])):
                    print(f"differs from {next(iter(VARIANTS))}: {shape} {fmt} {n} max|d|="
                          f"{(out.float() - ref[0].float()).abs().max().item():.3g}", flush=True)
                fns[n] = f
            t = {n: [] for n in fns}
            for _ in range(3):
                for n, f in fns.items():
                    t[n].append(do_bench(f, warmup=10, rep=60))
            cells = " | ".join(f"{min(t[n]):.3f}" if n in t else "–" for n in VARIANTS)
            print(f"| {shape} | {fmt} | {tc:.3f} | {cells} |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
