"""Where the Quartet forward's time goes, (M,K,N) shapes of issue 6: torch.profiler kernel list
(durations, gaps) of the composed forward vs do_bench of the forward and of its parts.

    PYTHONPATH=src FP4ATTN_AUTOTUNE=0 python prof.py"""
import sys
import torch
from torch.profiler import profile, ProfilerActivity
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG
import torch.nn.functional as F

bf = torch.bfloat16
shapes = [(16384, 14336, 4096), (16384, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 14336)]
rng = QuartetRNG(0)
for (M, K, N) in shapes:
    torch.manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=bf)
    w = torch.randn(N, K, device="cuda", dtype=bf) * K ** -0.5

    def fwd():
        with torch.no_grad():
            return kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)

    for _ in range(5):
        fwd()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(6):
            fwd()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    evs.sort(key=lambda e: e.time_range.start)
    # one forward ends with the rescale kernel after its GEMM
    iters, cur = [], []
    for e in evs:
        cur.append(e)
        if "_fp8_rescale" in e.name:
            iters.append(cur)
            cur = []
    print(f"\n=== ({M},{K},{N}) forward kernels, iteration 3 of {len(iters)} ===")
    it = iters[min(3, len(iters) - 1)]
    prev_end = None
    tot = 0.0
    for e in it:
        s, d = e.time_range.start, e.time_range.elapsed_us()
        gap = (s - prev_end) if prev_end is not None else 0
        prev_end = e.time_range.end
        tot += d
        print(f"  {d:8.1f} us  gap {gap:6.1f}  {e.name[:90]}")
    span = it[-1].time_range.end - it[0].time_range.start
    print(f"  kernel sum {tot:.1f} us, span {span:.1f} us")
    t = lambda fn: min(do_bench(fn, warmup=25, rep=150, return_mode="median") for _ in range(3))
    print(f"  do_bench: bf16 {t(lambda: F.linear(x, w)):.4f}  quartet fwd {t(fwd):.4f}  "
          f"x quant {t(lambda: kq.quest_e5m2(x, with_mask=False)):.4f}  "
          f"w quant {t(lambda: kq.quest_fp8(w, tensor_offset=True)):.4f}", flush=True)
    xq = kq.quest_e5m2(x, with_mask=False)
    wq = kq.quest_fp8(w, tensor_offset=True)
    one = torch.ones((), device="cuda")
    print(f"  gemm only {t(lambda: torch._scaled_mm(xq[0].view(torch.float8_e5m2), wq[0].view(torch.float8_e4m3fn).t(), scale_a=one, scale_b=wq[3], out_dtype=bf)):.4f}"
          f"  gemm+rescale {t(lambda: kq.fp8_gemm_e5m2(xq[0], xq[2], wq[0], wq[2], wq[3], bf)):.4f}", flush=True)
