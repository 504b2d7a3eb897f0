import sys
import torch
sys.path.insert(0, "benchmarks/session6-2026-11-22/probes")
from _util import kernel_times_us
import fp4attn.kernels.quartet as kq
from fp4attn.reference.quartet import QuartetRNG
for (M, K, N) in ((16384, 4096, 4096), (16384, 14336, 4096)):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    rng = QuartetRNG(0)
    def fwd():
        with torch.no_grad():
            return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
    kt = kernel_times_us(fwd)
    print((M, K, N), "total", round(sum(kt.values()), 1), {k: round(v, 1) for k, v in kt.items()}, flush=True)
