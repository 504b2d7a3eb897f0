"""``fp4attn bench linear``: QuartetLinear (MXFP4 via exact FP8 embedding) vs BF16 and FP8 GEMMs.

For each shape (M, K, N) — x (M, K), W (N, K), bf16 — times, in one run on one GPU:
* ``bf16``: ``F.linear`` forward; forward+backward (dX and dW, autograd);
* ``fp8``: the speed-of-light reference, ``torch._scaled_mm`` on already-quantized E4M3 operands
  (forward: one GEMM; forward+backward: the three GEMMs of a linear layer, operands pre-transposed);
* ``quartet``: forward without grad (``quartet_linear_cuda`` under ``no_grad``: inference, no trust masks;
  Hadamard+QuEST quantizers + FP8 GEMM: the activation as E5M2 in one pass, the weight as E4M3 at its
  tensor offset, one tensor-wise scaled GEMM), the training forward (``QuartetLinearCUDA``: the masks
  of x and W computed, operands saved) and forward+backward (plus the SR quantizers, two GEMMs, mask +
  inverse Hadamard); also the forward with the weight quantized once ("cached W":
  ``QuartetLinear.cache_weight``, i.e. evaluation or gradient-accumulation micro-batches after the first),
  and forward+backward of both layers replayed from CUDA graphs (the GPU's time, no host launch work);
* the quantization overhead apart: the forward's two quantizer calls, and the backward's four SR
  quantizers + two epilogues.
Prints a markdown table (ms, TFLOP/s with 2·M·K·N per GEMM, speedups vs bf16 and vs fp8) and writes
``linear.csv`` to ``--out``.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from .common import device_name, graph_time_ms, markdown_table, now_utc, time_ms, write_csv

DEFAULT_SHAPES = "8192x8192x8192,16384x4096x4096,16384x4096x14336,16384x14336x4096"


def parse_shapes(text: str):
    return [tuple(int(v) for v in tok.strip().split("x")) for tok in text.split(",") if tok.strip()]


def _measure(fn, rep_ms, grad_to_none=None):
    try:
        return time_ms(fn, warmup_ms=rep_ms / 4, rep_ms=rep_ms, grad_to_none=grad_to_none), None
    except Exception as e:  # a provider that cannot run leaves its cells empty
        return None, f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"


def bench_shape(M, K, N, rep_ms=200.0, dev="cuda"):
    from ..kernels import quartet as kq
    from ..reference.quartet import QuartetRNG

    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, K, device=dev, dtype=torch.bfloat16) * K ** -0.5).requires_grad_()
    dy = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    res, notes = {}, {}

    def put(key, fn, gtn=None):
        t, err = _measure(fn, rep_ms, gtn)
        res[key] = t
        if err:
            notes[key] = err

    put("bf16 fwd", lambda: F.linear(x, w))
    put("bf16 fwd+bwd", lambda: F.linear(x, w).backward(dy), [x, w])

    f8 = torch.float8_e4m3fn
    one = torch.ones((), device=dev)
    a8, b8 = x.detach().to(f8), w.detach().to(f8)
    g8, g8t = dy.to(f8), dy.t().contiguous().to(f8)
    b8t, a8t = w.detach().t().contiguous().to(f8), x.detach().t().contiguous().to(f8)

    def mm(a, b):
        return torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                use_fast_accum=False)

    put("fp8 fwd", lambda: mm(a8, b8))
    put("fp8 fwd+bwd", lambda: (mm(a8, b8), mm(g8, b8t), mm(g8t, a8t)))

    rng = QuartetRNG(0)

    def q_fwd():  # inference: no gradient follows, so no trust masks and no autograd node
        with torch.no_grad():
            return kq.quartet_linear_cuda(x, w, None, rng, 32)

    put("quartet fwd", q_fwd)
    # the training forward: the trust masks of x and W computed, the operands saved for the backward
    put("quartet fwd train", lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32))
    wq = kq.quantize_weight(w.detach())

    def q_fwd_cached():  # the weight quantized once (QuartetLinear.cache_weight: evaluation, grad accumulation)
        with torch.no_grad():
            return kq.quartet_linear_cuda(x, w, None, rng, 32, wq)

    put("quartet fwd cached W", q_fwd_cached)
    put("quartet fwd+bwd", lambda: kq.QuartetLinearCUDA.apply(x, w, None, rng, 32).backward(dy), [x, w])
    # forward+backward replayed from CUDA graphs: the GPU's time without the host's launch work (the
    # layer's ~16 Triton launches and ~30 allocations per step can take longer on a slow host than the
    # GPU's work at the smaller shapes). autograd.grad: nothing accumulates between replays; each replay
    # of the captured backward draws fresh noise (the RNG's step advances on the device)
    for key, fn in (("bf16 f+b graph", lambda: torch.autograd.grad(F.linear(x, w), (x, w), dy)),
                    ("quartet f+b graph",
                     lambda: torch.autograd.grad(kq.QuartetLinearCUDA.apply(x, w, None, rng, 32), (x, w), dy))):
        res[key] = graph_time_ms(fn, rep_ms)
        if res[key] is None:
            notes[key] = "CUDA graph capture failed"
    # the forward's two quantizer calls (without grad: no trust mask for x) and its GEMM
    if kq.e5m2_gemm_supported(x.device):
        def fwd_quant():
            return kq.quest_e5m2(x.detach(), with_mask=False), kq.quest_fp8(w.detach(), tensor_offset=True)

        def fwd_gemm(xq, wq):
            return kq.fp8_gemm_e5m2(xq[0], xq[2], wq[0], wq[2], wq[3], torch.bfloat16)
    else:
        def fwd_quant():
            return kq.quest_fp8(x.detach()), kq.quest_fp8(w.detach())

        def fwd_gemm(xq, wq):
            return kq.fp8_gemm(xq[0], xq[2], wq[0], wq[2], torch.bfloat16)
    put("quartet fwd quant", fwd_quant)
    fq = fwd_quant()
    put("quartet fwd gemm", lambda: fwd_gemm(*fq))
    # the backward's quantizers on the operands the forward saves (E5M2 activation where supported)
    x_fmt = "e5m2" if kq.e5m2_gemm_supported(x.device) else "e4m3"
    x8, mx, rsx = kq.quest_e5m2(x.detach()) if x_fmt == "e5m2" else kq.quest_fp8(x.detach())
    w8, mw, rsw = kq.quest_fp8(w.detach())
    dxq = torch.empty(M, K, device=dev, dtype=torch.bfloat16)
    dwq = torch.empty(N, K, device=dev, dtype=torch.bfloat16)
    ones = torch.ones(max(M, N, K), device=dev)  # the GEMMs' operand row scales (fp8_gemm_raw)

    def bwd_quant():
        kq.sr_fp8(dy, sign_seed=1, noise_seed=2)
        kq.sr_fp8(w8.t(), sign_seed=1, noise_seed=3, scale=rsw)
        kq.sr_fp8(dy.t(), sign_seed=4, noise_seed=5)
        kq.sr_fp8(x8.t(), sign_seed=4, noise_seed=6, scale=rsx, a_fmt=x_fmt)
        kq.mask_ihadamard(dxq, mx, torch.bfloat16, row_scale=ones[:M], col_scale=ones[:K])
        kq.mask_ihadamard(dwq, mw, torch.bfloat16, row_scale=ones[:N], col_scale=ones[:K])

    put("quartet bwd quant", bwd_quant)
    return res, notes


def kernel_breakdown(M: int, K: int, rep_ms: float = 100.0, dev: str = "cuda"):
    """Per-kernel times (ms) of the Quartet quantizers on one (M, K) bf16 operand, next to a copy of it."""
    from ..kernels import quartet as kq

    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    x8, mx, rsx = kq.quest_fp8(x)
    p, sc, _, emax, _ = kq._quest_mx(x, None, None, True)
    d = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    cases = [("copy of the bf16 operand", lambda: x.clone()),
             ("QuEST to E5M2 in one pass, no mask (quest_e5m2: the forward's activation)",
              lambda: kq.quest_e5m2(x, with_mask=False)),
             ("QuEST to E5M2 in one pass, with the trust mask", lambda: kq.quest_e5m2(x)),
             ("QuEST quantizer (quest_fp8)", lambda: kq.quest_fp8(x)),
             ("QuEST quantizer, tensor offset (quest_fp8: the forward's weight)",
              lambda: kq.quest_fp8(x, tensor_offset=True)),
             ("  packed MXFP4 kernel + row max", lambda: kq._quest_mx(x, None, None, True)),
             ("  conversion to the FP8 embedding", lambda: kq._mx_to_fp8(p, sc, emax)),
             ("SR quantizer of a bf16 operand (sr_fp8)", lambda: kq.sr_fp8(x, sign_seed=1, noise_seed=2)),
             ("SR quantizer of a saved FP8 operand, transposed",
              lambda: kq.sr_fp8(x8.t(), sign_seed=1, noise_seed=2, scale=rsx)),
             ("mask + inverse Hadamard", lambda: kq.mask_ihadamard(d, mx, torch.bfloat16))]
    return [(name, _measure(fn, rep_ms)[0]) for name, fn in cases]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fp4attn bench linear", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="./fp4attn-out", help="folder for linear.csv")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of MxKxN (default: the issue's four)")
    ap.add_argument("--rep-ms", type=float, default=200.0, help="timing budget per measurement (ms)")
    ap.add_argument("--kernels", action="store_true",
                    help="also time each quantizer kernel on the first shape's (M, K) operand")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp4attn bench linear needs a CUDA GPU", file=sys.stderr)
        return 2
    from ..kernels import quartet as kq

    shapes = parse_shapes(args.shapes)
    headers = ["shape (M,K,N)", "bf16 fwd ms", "fp8 fwd ms", "quartet fwd ms", "fwd x bf16", "fwd x fp8",
               "quartet fwd train ms", "fwd train x bf16", "quartet fwd cached W ms", "fwd cached W x bf16",
               "bf16 f+b ms", "fp8 f+b ms", "quartet f+b ms", "f+b x bf16", "f+b x fp8",
               "bf16 f+b graph ms", "quartet f+b graph ms", "f+b graph x bf16",
               "fwd quant ms", "bwd quant ms", "quartet fwd GEMM ms", "fwd TF/s", "f+b TF/s"]
    rows, all_notes = [], {}
    for M, K, N in shapes:
        r, notes = bench_shape(M, K, N, args.rep_ms)
        for k, v in notes.items():
            all_notes[f"{k} ({M},{K},{N})"] = v

        def ratio(a, b, r=r):
            return r[a] / r[b] if r.get(a) and r.get(b) else None

        fl = 2.0 * M * K * N
        rows.append([f"({M},{K},{N})", r["bf16 fwd"], r["fp8 fwd"], r["quartet fwd"],
                     ratio("bf16 fwd", "quartet fwd"), ratio("fp8 fwd", "quartet fwd"),
                     r["quartet fwd train"], ratio("bf16 fwd", "quartet fwd train"),
                     r["quartet fwd cached W"], ratio("bf16 fwd", "quartet fwd cached W"),
                     r["bf16 fwd+bwd"], r["fp8 fwd+bwd"], r["quartet fwd+bwd"],
                     ratio("bf16 fwd+bwd", "quartet fwd+bwd"), ratio("fp8 fwd+bwd", "quartet fwd+bwd"),
                     r["bf16 f+b graph"], r["quartet f+b graph"], ratio("bf16 f+b graph", "quartet f+b graph"),
                     r["quartet fwd quant"], r["quartet bwd quant"], r["quartet fwd gemm"],
                     fl / r["quartet fwd"] / 1e9 if r["quartet fwd"] else None,
                     3 * fl / r["quartet fwd+bwd"] / 1e9 if r["quartet fwd+bwd"] else None])
        torch.cuda.empty_cache()
    print(f"# fp4attn bench linear — {device_name()}, torch {torch.__version__}, {now_utc()}")
    print(f"(row-wise scaled _scaled_mm used: {dict(kq._ROWWISE_OK)})\n")
    print(markdown_table(headers, rows, digits=3))
    for k, v in all_notes.items():
        print(f"- {k}: {v}")
    if args.kernels:
        M, K, _ = shapes[0]
        print(f"\nQuartet kernels on one ({M}, {K}) bf16 operand:\n")
        print(markdown_table(["kernel", "ms"], kernel_breakdown(M, K, args.rep_ms / 2), digits=3))
    path = write_csv(f"{args.out}/linear.csv", headers, rows)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
