"""``fp4attn bench decode``: NVFP4 KV-cache decode (``fp4attn.decode``) vs BF16 SDPA decode (issue 5).

For each shape (B, Hq, Hkv, context, D) with ``--nq`` new query tokens per sequence (default 1; more: a
speculative-decoding verify step, causal among the new tokens): times

* ``cudnn`` / ``flash``: ``scaled_dot_product_attention`` on a dense bf16 cache (GQA via
  ``enable_gqa=True``, as a transformers model calls it; a backend that refuses the shape leaves its row empty).
  With ``--nq`` > 1 also ``(folded GQA)``: q viewed as (B, Hkv, G·n_q, D), each bf16 page read once per
  group, the bound of a bf16 decode kernel. The bf16 rows take no mask among the new tokens (the bottom-right
  causal mask only changes the last n_q keys' work; it makes them no slower),
* ``nvfp4``: ``fp4attn.decode`` on a :class:`fp4attn.KVCache` of the same tokens (its split kernel as
  ``kernel="auto"`` picks it: the Gluon kernel on Hopper), and the portable Triton split kernel beside it,
* ``thrift5``: ``fp4attn.decode(..., thrift_budget=0.05)`` (page selection included) on a cache with
  the 16-bit copy,

each eagerly, replayed from a CUDA graph of one call, and as one of ``--b2b`` calls captured back to back in one
graph (a model's decode step: its layers' kernels run back to back, and the graph's launch and the GPU's ramp into
its first kernel, ~5 µs on an H100, are paid once per step, not per layer). Eager times of ~50 µs ops measure Python
launch overhead as much as the GPU. Reports median ms, the bytes each op
must read (the dense bf16 K/V; the FP4 codes + E4M3 scales (+ the selected 16-bit pages)),
achieved bandwidth against a measured device-to-device copy, and the speedup over the best BF16
baseline and over cuDNN. ``--sweep`` also times kernel configs (warps, stages, splits) and uses the best.
A quality table (``--quality``) reports the error of FP4 / Thrift decode on structured inputs
(attention sinks, local peaks, retrieval needles) against exact attention, with BF16 SDPA's error and
the recovered share of the FP4→BF16 gap, for growing context.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys

import torch

from .common import device_name, graph_time_ms, markdown_table, now_utc, time_ms

DEFAULT_SHAPES = "8x32x8x32768x128,1x32x8x131072x128"


def parse_shapes(text: str):
    out = []
    for tok in text.split(","):
        B, Hq, Hkv, N, D = (int(x) for x in tok.strip().split("x"))
        out.append((B, Hq, Hkv, N, D))
    return out


def copy_bandwidth(nbytes: int = 1 << 31) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = time_ms(lambda: dst.copy_(src), warmup_ms=50, rep_ms=300)
    return 2 * nbytes / (t * 1e-3)


def sdpa_fn(backend, q, k, v):
    from torch.nn.attention import sdpa_kernel

    def f():
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return f


def decode_inputs(B: int, Hq: int, Hkv: int, N: int, D: int, nq: int = 1, seed: int = 0):
    """The benchmark's inputs: bf16 K, V (B, Hkv, N, D) and q (B, Hq, nq, D), N(0, 1), on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(B, Hq, nq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def fp4_bytes(B, Hkv, N, D) -> int:
    return 2 * B * Hkv * N * (D // 2 + D // 16)


def sweep(q, cache, sel, rep_ms: float):
    """Time kernel configs; returns (best_cfg, best_ms, rows)."""
    from ..kernels.decode import decode_fwd, default_splits

    B, Hq, _, D = q.shape
    rows = []
    best = (None, float("inf"))
    for nw, ns, bn, mult in itertools.product((1, 2), (2, 3), (32, 64), (0.5, 1, 2)):
        if sel is not None and bn != 64:
            continue  # Thrift needs 64-key tiles
        base = default_splits(B, cache.num_kv_heads, max(cache.committed_lengths()), bn, q.device)
        splits = max(1, int(base * mult))
        cfg = dict(num_warps=nw, num_stages=ns, block_n=bn, num_splits=splits)
        try:
            t = time_ms(lambda cfg=cfg: decode_fwd(q, cache, scale=D ** -0.5, selection=sel, **cfg),
                        warmup_ms=rep_ms / 4, rep_ms=rep_ms)
        except Exception as e:  # a config that does not compile (resources)
            rows.append((nw, ns, bn, splits, None, f"{type(e).__name__}"))
            continue
        rows.append((nw, ns, bn, splits, round(t, 4), ""))
        if t < best[1]:
            best = (cfg, t)
    return best[0], best[1], rows


def bench_shape(shape, args, bw):
    from torch.nn.attention import SDPBackend

    import fp4attn
    from fp4attn.kernels.decode import decode_fwd
    from fp4attn.ops.decode import decode_reference, thrift_select

    B, Hq, Hkv, N, D = shape
    nq = args.nq
    q, k, v = decode_inputs(B, Hq, Hkv, N, D, nq)
    cache = fp4attn.KVCache.from_dense(k, v)
    cache16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True) if args.thrift else None
    bf16_bytes = 2 * B * Hkv * N * D * 2

    def times(f, nbytes, graph=True):
        """(eager ms, graph ms, back-to-back graph ms per call, bytes read)."""
        return (time_ms(f, warmup_ms=args.rep_ms / 4, rep_ms=args.rep_ms),
                graph_time_ms(f, args.rep_ms) if graph else None,
                graph_time_ms(f, args.rep_ms, args.b2b) if graph and args.b2b > 1 else None, nbytes)

    res = {}
    notes = []
    baselines = [("cudnn", SDPBackend.CUDNN_ATTENTION, q), ("flash", SDPBackend.FLASH_ATTENTION, q)]
    if nq > 1:  # each bf16 page once per GQA group (the new tokens' causal mask left out, see the docstring)
        qf = q.view(B, Hkv, Hq // Hkv * nq, D)
        baselines += [("cudnn (folded GQA)", SDPBackend.CUDNN_ATTENTION, qf),
                      ("flash (folded GQA)", SDPBackend.FLASH_ATTENTION, qf)]
    for name, be, qq in baselines:
        f = sdpa_fn(be, qq, k, v)
        try:
            f()
            torch.cuda.synchronize()
            res[name] = times(f, bf16_bytes)
        except Exception as e:
            notes.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}")
    cfg = {}
    if args.sweep:
        cfg, t_best, rows = sweep(q, cache, None, args.rep_ms / 3)
        print(f"\nsweep {shape} nvfp4 (num_warps, num_stages, block_n, num_splits, ms):")
        for r in rows:
            print("  ", r)
        cfg = cfg or {}
    kw = dict(cfg)
    nsplit = kw.pop("num_splits", None)

    def ours():
        return decode_fwd(q, cache, scale=D ** -0.5, num_splits=nsplit, **kw)[0]

    def ours_op():
        return fp4attn.decode(q, cache, num_splits=nsplit)

    res["nvfp4 (kernel)"] = times(ours, fp4_bytes(B, Hkv, N, D))
    if not kw:  # the portable Triton split kernel beside the one "auto" picks (Gluon on Hopper)
        def ours_triton():
            return decode_fwd(q, cache, scale=D ** -0.5, num_splits=nsplit, kernel="triton")[0]
        res["nvfp4 (Triton kernel)"] = times(ours_triton, fp4_bytes(B, Hkv, N, D))
    res["nvfp4 (op)"] = times(ours_op, fp4_bytes(B, Hkv, N, D), graph=False)
    # accuracy at the benchmark shape: kernel vs the reference over the dequantized cache, and both vs
    # exact (float32) attention on the bf16 cache
    acc = {}
    with torch.no_grad():
        o = ours().float()
        bb = min(B, 2)
        sub = fp4attn.KVCache.from_dense(k[:bb], v[:bb])
        o_sub = decode_fwd(q[:bb], sub, scale=D ** -0.5)[0].float()
        ref, _ = decode_reference(q[:bb], sub, scale=D ** -0.5)
        kx = k[:bb].float().repeat_interleave(Hq // Hkv, 1)
        vx = v[:bb].float().repeat_interleave(Hq // Hkv, 1)
        # bottom-right causal among the new tokens: query i sees keys <= N - nq + i
        hide = torch.arange(N, device="cuda")[None, :] > (N - nq + torch.arange(nq, device="cuda"))[:, None]
        sx = (q[:bb].float() @ kx.transpose(-1, -2) * D ** -0.5).masked_fill(hide, float("-inf"))
        ex = torch.softmax(sx, -1) @ vx
        rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
        cos = lambda a, b: torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0).item()  # noqa: E731
        acc = {"kernel vs ref rel L2": rel(o_sub, ref), "kernel vs ref cos": cos(o_sub, ref),
               "kernel vs exact": rel(o_sub, ex), "ref vs exact": rel(ref, ex),
               "full-batch output finite": bool(torch.isfinite(o).all())}
        del kx, vx, sx, ex, ref, sub
    if cache16 is not None:
        sel = thrift_select(q, cache16, 0.05, share="group")  # the op's default thrift_share
        nsel = thrift_select(q, cache16, 0.05, share="head").sum().item()

        def thrift_kernel():
            kw64 = {n: x for n, x in kw.items() if n != "block_n"}
            return decode_fwd(q, cache16, scale=D ** -0.5, selection=sel, num_splits=nsplit, group_sel=True,
                              **kw64)[0]

        def thrift_op():
            return fp4attn.decode(q, cache16, thrift_budget=0.05, num_splits=nsplit)

        def thrift_op_head():
            return fp4attn.decode(q, cache16, thrift_budget=0.05, num_splits=nsplit, thrift_share="head")

        # bytes: the 16-bit pages some head of a group selected (read once per group) + the FP4 pages, of which
        # the group rule (GROUP16 tiles) reads only the others
        grp = sel.view(B, Hkv, Hq // Hkv, -1).any(dim=2)
        n16 = int(grp.sum().item())
        t16 = n16 * cache16.page_size * D * 2 * 2
        t4 = fp4_bytes(B, Hkv, N, D)
        t4g = t4 - fp4_bytes(n16, 1, cache16.page_size, D)
        res["thrift5 (kernel)"] = times(thrift_kernel, t4g + t16)
        res["thrift5 (op, selection incl.)"] = times(thrift_op, t4g + t16)
        if Hq > Hkv:  # the per-head rule: the same 16-bit pages read, fewer of them used
            res["thrift5 (op, thrift_share=head)"] = times(thrift_op_head, t4 + t16)
        with torch.no_grad():
            bb = min(B, 2)
            sub = fp4attn.KVCache.from_dense(k[:bb], v[:bb], keep_16bit=True)
            s2 = thrift_select(q[:bb], sub, 0.05, share="group")
            o_t = decode_fwd(q[:bb], sub, scale=D ** -0.5, selection=s2, group_sel=True)[0].float()
            ref_t, _ = decode_reference(q[:bb], sub, scale=D ** -0.5, selection=s2)
            acc["thrift kernel vs ref rel L2"] = ((o_t - ref_t).norm() / ref_t.norm()).item()
            acc["thrift selected page share"] = nsel / (B * Hq * -(-N // cache16.page_size))
            acc["thrift 16-bit page share (kv group union)"] = (int(grp.sum().item())
                                                                / (B * Hkv * -(-N // cache16.page_size)))
        mem = dict(nvfp4=cache.nbytes / cache.bf16_nbytes(),
                   thrift=(cache16.nbytes + cache16.nbytes_16bit) / cache16.bf16_nbytes())
    else:
        mem = dict(nvfp4=cache.nbytes / cache.bf16_nbytes())
    return res, notes, cfg, acc, mem


def quality(args):
    """Decode error on structured long inputs (sinks + local peaks + retrieval needles)."""
    import fp4attn
    from fp4attn.synthetic import make_inputs

    rows = []
    D, H = 128, 4
    for N in (8192, 16384, 32768, 65536):
        q, k, v = make_inputs("sinks", 1, H, N, D, seed=1, device="cuda", dtype=torch.float32)
        qn = q[:, :, -1:].clone()
        g = torch.Generator(device="cpu").manual_seed(N)
        for h in range(H):  # retrieval needles: 8 random keys aligned with the last query (logit ~ +6)
            pos = torch.randint(64, N - 64, (8,), generator=g).to("cuda")
            u = qn[0, h, 0] / qn[0, h, 0].norm()
            k[0, h, pos] += (6.0 * math.sqrt(D) / qn[0, h, 0].norm()) * u
        kb, vb, qb = k.bfloat16(), v.bfloat16(), qn.bfloat16()
        ex = torch.softmax(qb.double() @ kb.double().transpose(-1, -2) * D ** -0.5, -1) @ vb.double()
        bf = torch.nn.functional.scaled_dot_product_attention(qb, kb, vb).double()
        rel = lambda a, ex=ex: ((a.double() - ex).norm() / ex.norm()).item()  # noqa: E731
        c = fp4attn.KVCache.from_dense(kb, vb, keep_16bit=True)
        e_fp4 = rel(fp4attn.decode(qb, c))
        e_bf = rel(bf)
        row = [N, e_bf, e_fp4]
        for f in (0.05, 0.10, 0.25):
            e = rel(fp4attn.decode(qb, c, thrift_budget=f))
            row += [e, 100.0 * (e_fp4 - e) / max(e_fp4 - e_bf, 1e-12)]
        rows.append(row)
        del q, k, v, kb, vb, c
        torch.cuda.empty_cache()
    headers = ["context", "bf16 SDPA err", "FP4 err", "thrift5 err", "recov %", "thrift10 err", "recov %",
               "thrift25 err", "recov %"]
    return markdown_table(headers, rows, digits=4)


def prefill(args):
    """Thrift prefill (fused kernel, 5%) vs the plain nvfp4 attention op and BF16 SDPA, causal."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fp4attn
    from fp4attn import reference
    from fp4attn.kernels.thrift import select, thrift_fwd
    from fp4attn.synthetic import make_inputs

    B, H, N, D = args.prefill_shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    sc = D ** -0.5
    rows = []
    nq = -(-N // 64)
    empty = (torch.full((B, H, nq, 1), -1, dtype=torch.int32, device="cuda"),
             torch.zeros(B, H, nq, nq, dtype=torch.bool, device="cuda"), 1)
    sel5 = select(q, k, causal=True, budget=0.05)

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    provs = {
        "bf16 SDPA flash": flash,
        "fp4attn.attention nvfp4": lambda: fp4attn.attention(q, k, v, causal=True, recipe="nvfp4"),
        "thrift kernel, nothing selected (FP4 two-level)":
            lambda: thrift_fwd(q, k, v, causal=True, scale=sc, budget=0.05, selection=empty),
        "thrift 5% fused kernel (selection precomputed)":
            lambda: thrift_fwd(q, k, v, causal=True, scale=sc, budget=0.05, selection=sel5),
        "thrift 5% op (selection incl.)": lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.05),
        "thrift selection only": lambda: select(q, k, causal=True, budget=0.05),
    }
    res = {}
    for name, f in provs.items():
        try:
            res[name] = time_ms(f, warmup_ms=args.rep_ms / 4, rep_ms=args.rep_ms)
        except Exception as e:
            res[name] = None
            print(f"  prefill {name}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
    base = res.get("fp4attn.attention nvfp4")
    for name, t in res.items():
        rows.append([name, t, (t / base) if (t and base) else None])
    out = [f"Prefill (B,H,N,D)=({B},{H},{N},{D}) causal, bf16:", "",
           markdown_table(["provider", "ms", "x nvfp4 op time"], rows, digits=3)]
    # prefill quality on structured inputs
    qrows = []
    for n in (8192, 16384):
        qq, kk_, vv = make_inputs("sinks", 1, 4, n, 128, seed=2, device="cuda", dtype=torch.bfloat16)
        ex = reference.attention(qq, kk_, vv, causal=True, recipe="bf16")
        rel = lambda a, ex=ex: ((a.float() - ex).norm() / ex.norm()).item()  # noqa: E731
        e_bf = rel(torch.nn.functional.scaled_dot_product_attention(qq, kk_, vv, is_causal=True))
        e_fp4 = rel(fp4attn.attention(qq, kk_, vv, causal=True, recipe="nvfp4"))
        row = [n, e_bf, e_fp4]
        for f in (0.05, 0.10, 0.25):
            e = rel(fp4attn.thrift_attention(qq, kk_, vv, causal=True, budget=f))
            row += [e, 100.0 * (e_fp4 - e) / max(e_fp4 - e_bf, 1e-12)]
        qrows.append(row)
    out += ["", "Prefill quality (sinks inputs, B=1, H=4, D=128, causal; rel L2 vs FP32 exact):", "",
            markdown_table(["N", "bf16 SDPA", "nvfp4", "thrift5", "recov %", "thrift10", "recov %", "thrift25",
                            "recov %"], qrows, digits=4)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fp4attn bench decode", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma list of BxHqxHkvxCONTEXTxD")
    ap.add_argument("--nq", type=int, default=1, help="new query tokens per sequence (1..16; > 1: a "
                    "speculative-decoding verify step, causal among them)")
    ap.add_argument("--rep-ms", type=float, default=200.0)
    ap.add_argument("--b2b", type=int, default=10, help="calls per CUDA graph for the back-to-back column (1: off)")
    ap.add_argument("--sweep", action="store_true", help="time kernel configs and use the best")
    ap.add_argument("--no-thrift", dest="thrift", action="store_false")
    ap.add_argument("--quality", action="store_true", help="also print the structured-input quality table")
    ap.add_argument("--md", default=None, help="also write the markdown report to this file")
    ap.add_argument("--prefill", action="store_true", help="also time the Thrift prefill kernel")
    ap.add_argument("--prefill-shape", default="4x16x16384x128", type=lambda t: tuple(int(x) for x in t.split("x")))
    ap.add_argument("--only-prefill", action="store_true")
    args = ap.parse_args(argv)
    if not 1 <= args.nq <= 16:
        ap.error(f"--nq: expected 1..16 new query tokens per sequence, got {args.nq}")
    if args.b2b < 1:
        ap.error(f"--b2b: expected at least 1 call per CUDA graph (1: no back-to-back column), got {args.b2b}")
    if not torch.cuda.is_available():
        print("fp4attn bench decode needs a CUDA GPU", file=sys.stderr)
        return 2
    bw = copy_bandwidth()
    lines = [f"device: {device_name()}, {now_utc()}, torch {torch.__version__}",
             f"measured copy bandwidth (read+write): {bw / 1e12:.2f} TB/s",
             f"new query tokens per sequence: {args.nq}", ""]
    headers = ["shape (B,Hq,Hkv,ctx,D)", "provider", "eager ms", "graph ms", f"b2b ms (x{args.b2b})", "MB read",
               "TB/s (graph|eager)", "% of copy bw", "x best bf16", "x cudnn", "x cudnn b2b"]
    rows = []
    extra = []
    print("\n".join(lines), flush=True)
    for shape in ([] if args.only_prefill else parse_shapes(args.shapes)):
        res, notes, cfg, acc, mem = bench_shape(shape, args, bw)
        torch.cuda.empty_cache()
        best_t = lambda r: min(x for x in r[:2] if x is not None)  # noqa: E731
        base = [best_t(r) for n, r in res.items() if n.startswith(("cudnn", "flash"))]
        bf_best = min(base) if base else None
        cud = best_t(res["cudnn"]) if "cudnn" in res else None
        cud_b = res["cudnn"][2] if "cudnn" in res else None
        shape_rows = []
        for name, (te, tg, tb, nb) in res.items():
            t = best_t((te, tg))
            shape_rows.append([str(shape), name, te, tg, tb, nb / 1e6, nb / (t * 1e-3) / 1e12,
                               100.0 * nb / (t * 1e-3) / bw, bf_best / t if bf_best else None,
                               cud / t if cud else None, cud_b / tb if (cud_b and tb) else None])
        rows += shape_rows
        ex = (f"{shape}: config {cfg or 'heuristic'}; accuracy {acc}; memory vs bf16 {mem}; "
              f"notes {notes}")
        extra.append(ex)
        print(markdown_table(headers, shape_rows, digits=3) + "\n" + ex + "\n", flush=True)
    lines.append(markdown_table(headers, rows, digits=3))
    lines.append("")
    lines += extra
    if args.quality:
        qt = quality(args)
        print(qt, flush=True)
        lines += ["", "Quality (decode of the last token, sinks + local + 8 needles, B=1, H=4, D=128; rel L2 "
                      "vs float64 exact on the bf16 inputs; recov = share of the FP4→BF16 gap closed):", "",
                  qt]
    if args.prefill or args.only_prefill:
        pt = prefill(args)
        print(pt, flush=True)
        lines += ["", pt]
    text = "\n".join(lines)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
