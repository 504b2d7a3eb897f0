"""Forward probes at (16384,4096,4096) and (16384,14336,4096), interleaved A/B in one process:
(1) quest_e5m2 (with mask) at register caps (maxnreg), (2) the weight quantizer on a side stream
concurrent with the activation's, (3) in-situ kernel times of the forward.

    PYTHONPATH=src python fwd_probe.py"""
import torch
import triton
from triton.testing import do_bench

from fp4attn.kernels import quartet as kq
from fp4attn.reference.quartet import QuartetRNG

torch.manual_seed(0)
bf = torch.bfloat16


def t(fn):
    return do_bench(fn, warmup=25, rep=150, return_mode="median")


def quest_e5m2_cap(a, maxnreg, with_mask=True):
    R, K, block_r, block_k, hd, grid = kq._quest_tiles(a, None, None)
    q8 = torch.empty(R, K, dtype=torch.uint8, device=a.device)
    rs = torch.empty(R, dtype=torch.float32, device=a.device)
    mask = torch.empty(R, K // 32, dtype=torch.int32, device=a.device)
    flag = torch.empty(R, grid[1], dtype=torch.int8, device=a.device)
    h = kq._hmat(str(a.device), hd)
    kw = {} if maxnreg is None else {"maxnreg": maxnreg}
    kq._quest_mxfp4_kernel[grid](a, a.stride(0), a.stride(1), h, q8, rs, mask if with_mask else rs, flag, flag, R, K,
                                 ROW_MAX=0, OUT=1, WITH_MASK=with_mask, HDOT=hd, BLOCK_R=block_r, BLOCK_K=block_k,
                                 num_warps=4, **kw)
    return q8, mask, rs


def interleave(cases, rounds=3):
    best = {k: float("inf") for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            best[k] = min(best[k], t(fn))
    return best


for (R, K) in ((16384, 4096), (16384, 14336)):
    x = torch.randn(R, K, device="cuda", dtype=bf)
    ref = kq.quest_e5m2(x)
    for cap in (96, 80, 72):
        got = quest_e5m2_cap(x, cap)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1]), cap
    res = interleave({f"maxnreg {c}": (lambda c=c: quest_e5m2_cap(x, c)) for c in (None, 96, 80, 72)})
    for k, v in res.items():
        print(f"quest_e5m2 mask ({R},{K}) {k}: {v:.4f} ms", flush=True)

side = torch.cuda.Stream()
for (M, K, N) in ((16384, 4096, 4096), (16384, 14336, 4096)):
    x = torch.randn(M, K, device="cuda", dtype=bf)
    w = torch.randn(N, K, device="cuda", dtype=bf) * 0.02

    def plain():
        xq = kq.quest_e5m2(x, with_mask=True)
        wq = kq.quest_fp8(w, tensor_offset=True)
        return kq.fp8_gemm_e5m2(xq[0], xq[2], wq[0], wq[2], wq[3], bf)

    def streams(w_first):
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        if not w_first:
            xq = kq.quest_e5m2(x, with_mask=True)
        with torch.cuda.stream(side):
            wq = kq.quest_fp8(w, tensor_offset=True)
        if w_first:
            xq = kq.quest_e5m2(x, with_mask=True)
        cur.wait_stream(side)
        for tt in wq:
            tt.record_stream(cur)
        return kq.fp8_gemm_e5m2(xq[0], xq[2], wq[0], wq[2], wq[3], bf)

    wq0 = kq.quest_fp8(w, tensor_offset=True)
    xq0 = kq.quest_e5m2(x, with_mask=True)
    assert torch.equal(plain(), streams(True)) and torch.equal(plain(), streams(False))
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    rng = QuartetRNG(0)
    res = interleave({
        "bf16 linear": lambda: torch.nn.functional.linear(x, w),
        "layer fwd (autograd Function, x needs grad)": lambda: kq.QuartetLinearCUDA.apply(xr, wr, None, rng, 32),
        "plain sequence": plain,
        "W on side stream, launched first": lambda: streams(True),
        "W on side stream, launched after X": lambda: streams(False),
        "X quant only": lambda: kq.quest_e5m2(x, with_mask=True),
        "W quant only": lambda: kq.quest_fp8(w, tensor_offset=True),
        "GEMM only": lambda: kq.fp8_gemm_e5m2(xq0[0], xq0[2], wq0[0], wq0[2], wq0[3], bf),
    })
    for k, v in res.items():
        print(f"({M},{K},{N}) {k}: {v:.4f} ms  (bf16 / this = {res['bf16 linear'] / v:.3f})", flush=True)
