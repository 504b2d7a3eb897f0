"""Quartet forward parts at the issue's shapes: GEMM variants and quantizer kernels (ms, H200)."""
import sys
import torch
from triton.testing import do_bench
sys.path.insert(0, "benchmarks/session6-2026-11-22/probes")
from _util import kernel_times_us
import fp4attn.kernels.quartet as kq
from fp4attn.reference.quartet import QuartetRNG

def b(fn):
    return do_bench(fn, warmup=25, rep=100)

torch.manual_seed(0)
dev = "cuda"
f8 = torch.float8_e4m3fn
for (M, K, N) in ((8192, 8192, 8192), (16384, 4096, 4096), (16384, 4096, 14336), (16384, 14336, 4096)):
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
    x8, mx, rsx = kq.quest_fp8(x)
    w8, mw, rsw = kq.quest_fp8(w)
    A, B = x8.view(f8), w8.view(f8).t()
    one = torch.ones((), device=dev)
    r = {}
    r["bf16"] = b(lambda: torch.nn.functional.linear(x, w))
    r["rowwise"] = b(lambda: torch._scaled_mm(A, B, scale_a=rsx.reshape(-1, 1), scale_b=rsw.reshape(1, -1), out_dtype=torch.bfloat16))
    r["tensorwise"] = b(lambda: torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    r["tensorwise_fast"] = b(lambda: torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True))
    r["quest_x"] = b(lambda: kq.quest_fp8(x))
    r["quest_w"] = b(lambda: kq.quest_fp8(w))
    rng = QuartetRNG(0)
    def fwd():
        with torch.no_grad():
            return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
    r["fwd"] = b(fwd)
    print((M, K, N), " ".join(f"{k}={v:.3f}" for k, v in r.items()), f"fwd_x={r['bf16']/r['fwd']:.3f}", flush=True)
    kt = kernel_times_us(fwd)
    print("   ", {k: round(v, 1) for k, v in kt.items()}, flush=True)
