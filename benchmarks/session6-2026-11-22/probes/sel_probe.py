"""GPU probe: Thrift decode page selection, torch ``thrift_select`` (old) vs the Triton ``select_pages`` (new).

    PYTHONPATH=src python peers/sel_probe.py [--shapes 8x32x8x32768x128,1x32x8x131072x128] [--rep-ms 300]
                                             [--no-sweep]

For each shape (B, Hq, Hkv, context, D), bf16, ``KVCache.from_dense(k, v, keep_16bit=True)``, one new query:

1. checks: ``select_pages`` == ``thrift_select`` (budgets 0.05 / 0.25 / 1.0, n_q = 1 and 4, plus a ragged
   batch with partial pages and tails); mismatching rows are reported with the float64 score gap at the
   k-th place (a gap of ~1e-6 is a float32 near-tie, anything larger a bug); the new op's output ==
   the old op's bit for bit;
2. times (ms, median): eager ``triton.testing.do_bench`` and replayed from a CUDA graph
   (``fp4attn.bench.decode.graph_time_ms``, L2 flushed per replay, graph launch included), plus
   ``do_bench_cudagraph`` (20 back-to-back calls in one graph, no flush) for the selection alone:
   old selection, new selection, the two new kernels alone, ``fp4attn.decode(..., thrift_budget=0.05)``
   old (thrift_select + decode_fwd, what decode ran before) vs new, and decode_fwd with a precomputed
   selection (the floor);
3. ``--sweep`` (default on): the two kernels' launch parameters (scores: pages per program x warps; top-k:
   warps), do_bench_cudagraph ms each.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

_SRC = Path(__file__).resolve().parents[1] / "src"
if (_SRC / "fp4attn").is_dir():
    sys.path.insert(0, str(_SRC))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.bench.decode import graph_time_ms  # noqa: E402
from fp4attn.kernels.decode import decode_fwd, page_scores, page_topk, select_pages  # noqa: E402
from fp4attn.ops.decode import thrift_select  # noqa: E402
from fp4attn.reference.common import expand_kv  # noqa: E402


def eager_ms(fn, rep_ms):
    return float(triton.testing.do_bench(fn, warmup=rep_ms / 4, rep=rep_ms, return_mode="median"))


def graph_batch_ms(fn, rep_ms, n=20):
    """Per-call ms of ``fn`` captured n times back to back in one graph (no L2 flush, no launch gaps)."""
    def many():
        for _ in range(n):
            fn()
    try:
        return float(triton.testing.do_bench_cudagraph(many, rep=rep_ms, return_mode="median")) / n
    except Exception as e:  # pragma: no cover
        print(f"  (do_bench_cudagraph failed: {type(e).__name__}: {str(e)[:120]})")
        return float("nan")


def fmt(x):
    return "   n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:8.4f}"


def compare(q, cache, budget, label):
    """select_pages vs thrift_select; prints mismatches with their float64 boundary gaps. Returns ok."""
    new = select_pages(q, cache, budget)
    old = thrift_select(q, cache, budget)
    W = new.shape[-1]
    eq = torch.equal(new.bool(), old[..., :W])
    rows_bad = (new.bool() != old[..., :W]).any(-1)
    msg = f"  [{label}] budget {budget}: select_pages == thrift_select: {eq}"
    if not eq:
        ps = cache.page_size
        means = expand_kv(cache.block_means(), q.shape[1]).double()
        s64 = torch.einsum("bhd,bhpd->bhp", q.double().mean(2), means)
        gaps = []
        for b, h in rows_bad.nonzero().tolist()[:10]:
            n = -(-cache.lengths[b] // ps)
            kk = min(max(round(budget * n), 1), n)
            top = torch.sort(s64[b, h, :n], descending=True).values
            gaps.append(f"(b={b}, h={h}, k={kk}/{n}, gap {top[kk - 1] - top[kk] if kk < n else float('inf'):.3g})")
        msg += f"; {int(rows_bad.sum())} rows differ: " + " ".join(gaps)
    print(msg)
    return eq


def sweep(q, cache, budget, rep_ms):
    B, Hq = q.shape[:2]
    W = max(cache.page_table.shape[1], 1)
    print("  sweep, do_bench_cudagraph ms per call:")
    for chunk in (8, 16, 32, 64):
        row = []
        for nw in (1, 2, 4, 8):
            row.append(graph_batch_ms(lambda c=chunk, w=nw: page_scores(q, cache, chunk=c, num_warps=w), rep_ms / 3))
        print(f"    scores chunk={chunk:3d} warps 1/2/4/8: " + " ".join(fmt(x) for x in row))
    sc = page_scores(q, cache)
    row = []
    for nw in (1, 2, 4, 8, 16):
        row.append(graph_batch_ms(lambda w=nw: page_topk(sc, cache.seq_lens, cache.page_size, budget, W,
                                                         num_warps=w), rep_ms / 3))
    print("    top-k warps 1/2/4/8/16:         " + " ".join(fmt(x) for x in row))


def run_shape(B, Hq, Hkv, N, D, args):
    dev = "cuda"
    torch.manual_seed(0)
    print(f"\n== (B={B}, Hq={Hq}, Hkv={Hkv}, ctx={N}, D={D}) bf16, budget {args.budget}")
    k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cache = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
    scale = 1.0 / math.sqrt(D)
    print(f"  pages per sequence {-(-N // cache.page_size)}, page table width {cache.page_table.shape[1]}")
    ok = True
    for f in (args.budget, 0.25, 1.0):
        ok &= compare(q, cache, f, "n_q=1")
    q4 = torch.randn(B, Hq, 4, D, device=dev, dtype=torch.bfloat16)
    ok &= compare(q4, cache, args.budget, "n_q=4")
    # ragged: partial pages with committed tokens and tails
    lens = [max(17, N - 1000 * b - 37 * b) for b in range(B)]
    rag = fp4attn.KVCache.from_dense(k, v, lengths=lens, keep_16bit=True)
    ok &= compare(q, rag, args.budget, f"ragged {lens[:4]}...")
    del rag

    def old_sel():
        return thrift_select(q, cache, args.budget)

    def new_sel():
        return select_pages(q, cache, args.budget)

    W = max(cache.page_table.shape[1], 1)
    sc = page_scores(q, cache)

    def scores_only():
        return page_scores(q, cache)

    def topk_only():
        return page_topk(sc, cache.seq_lens, cache.page_size, args.budget, W)

    def old_op():
        return decode_fwd(q, cache, scale=scale, selection=thrift_select(q, cache, args.budget))[0]

    def new_op():
        return fp4attn.decode(q, cache, thrift_budget=args.budget)

    sel_fixed = select_pages(q, cache, args.budget)

    def kernel_only():
        return decode_fwd(q, cache, scale=scale, selection=sel_fixed)[0]

    o_old, o_new = old_op(), new_op()
    same = torch.equal(o_old, o_new)
    ok &= same
    print(f"  decode new == old bit for bit: {same}")
    rep = args.rep_ms
    print(f"  {'':34s} {'eager':>8s} {'graph':>8s} {'graph x20':>9s}  (ms, median)")
    rows = [("selection old (thrift_select)", old_sel, True), ("selection new (select_pages)", new_sel, True),
            ("  new: scores kernel", scores_only, True), ("  new: top-k kernel", topk_only, True),
            ("decode old (thrift_select + fwd)", old_op, False), ("decode new (fp4attn.decode)", new_op, False),
            ("decode_fwd, selection given", kernel_only, False)]
    for name, fn, batch in rows:
        torch.cuda.synchronize()
        te, tg = eager_ms(fn, rep), graph_time_ms(fn, rep)
        tb = graph_batch_ms(fn, rep / 2) if batch else None
        print(f"  {name:34s} {fmt(te)} {fmt(tg)} {fmt(tb)}")
    if args.sweep:
        sweep(q, cache, args.budget, rep)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8x32x8x32768x128,1x32x8x131072x128")
    ap.add_argument("--budget", type=float, default=0.05)
    ap.add_argument("--rep-ms", type=float, default=300.0)
    ap.add_argument("--no-sweep", dest="sweep", action="store_false")
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    ok = True
    for tok in args.shapes.split(","):
        ok &= run_shape(*(int(x) for x in tok.split("x")), args)
        torch.cuda.empty_cache()
    print("\nALL CHECKS PASSED" if ok else "\nSOME CHECKS FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
