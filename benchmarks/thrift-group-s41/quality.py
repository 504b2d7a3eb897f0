"""Thrift decode under GQA: how the rule that picks a kv group's 16-bit pages changes the output error, on structured
inputs (``inputs``: KIND=topics, keys in topic spans that each query head attends a few of; KIND=sinks, the 'sinks'
generator plus per-query-head needles).

Rules (each query head computes the pages of its group's selection in 16 bits, except "head"):
- head:    each query head its own top-k of q̄_h·K̄_p (``decode(..., thrift_share="head")``; the group's 16-bit pages
           are the union, up to G times the budget);
- union:   every head of a group computes the union of the group's "head" selections (the same 16-bit pages read;
           ``thrift_share="group"``, the default);
- mean-q:  top-k of q̄_g·K̄_p, q̄_g the mean of the group's query heads;
- max:     top-k of max_h (s·q̄_h·K̄_p − max_p' s·q̄_h·K̄_p');
- mass:    top-k of Σ_h softmax_p(s·q̄_h·K̄_p) (each head's estimated attention mass per page, summed).

    PYTHONPATH=src python benchmarks/thrift-group-s41/quality.py      # CPU, a few minutes; $OUT/quality.txt
"""
import math
import os

import torch

import fp4attn
from fp4attn.ops.decode import decode_reference, expand_kv, thrift_select, top_pages
from fp4attn.synthetic import make_inputs

OUT = os.environ.get("OUT", ".")
NS = [int(x) for x in os.environ.get("NS", "8192,16384,32768,65536").split(",")]
HKV, G, D = int(os.environ.get("HKV", 2)), int(os.environ.get("G", 4)), 128
NEEDLES = int(os.environ.get("NEEDLES", 4))
HEAD_NOISE = float(os.environ.get("HEAD_NOISE", 1.0))
KIND = os.environ.get("KIND", "topics")
RULES = ("head", "union", "mean-q", "max", "mass")


def inputs(N, seed):
    """K, V (1, HKV, N, D), the last token's query per query head (1, HKV·G, 1, D), bf16.

    KIND=topics (default): the keys are spans of 64-1024 tokens, each around its own random topic vector (|t| ~ 8,
    plus N(0, 1) noise); each query head attends to 3 topics of its kv head's keys (logit ~ +5 over the rest), one
    shared by the heads of its group and two of its own; the first 4 keys are sinks (logit ~ +6 for every head).
    KIND=sinks: the 'sinks' generator's keys, its last query plus per-head N(0, HEAD_NOISE²) noise, and NEEDLES keys
    per query head aligned with that head's query (logit ~ +6)."""
    g = torch.Generator().manual_seed(seed)
    if KIND == "topics":
        k = torch.randn(1, HKV, N, D, generator=g)
        v = torch.randn(1, HKV, N, D, generator=g)
        q = torch.randn(1, HKV * G, 1, D, generator=g)
        for h in range(HKV):
            cuts = [0]
            while cuts[-1] < N:
                cuts.append(cuts[-1] + int(torch.randint(64, 1025, (1,), generator=g)))
            spans = [(a, min(b, N)) for a, b in zip(cuts[:-1], cuts[1:])]
            topics = torch.randn(len(spans), D, generator=g) * 0.7
            for (a, b), t in zip(spans, topics):
                k[0, h, a:b] += t
            sink = torch.randn(D, generator=g)
            sink /= sink.norm()
            k[0, h, :4] += 10.0 * sink
            shared = int(torch.randint(len(spans), (1,), generator=g))
            for j in range(G):
                own = torch.randint(len(spans), (2,), generator=g).tolist()
                dirs = topics[[shared] + own]
                qq = dirs.sum(0)
                # logit ~ +5 on each chosen topic: s·(c·t_j)·t_j ≈ 5 with |t_j|² ≈ 0.49·D
                q[0, h * G + j, 0] = 0.3 * q[0, h * G + j, 0] + qq * (5.0 * math.sqrt(D) / (0.49 * D))
                q[0, h * G + j, 0] += 2.0 * sink * math.sqrt(D) ** 0.5
        return q.bfloat16(), k.bfloat16(), v.bfloat16()
    q, k, v = make_inputs("sinks", 1, HKV, N, D, seed=seed)
    qn = q[:, :, -1:].repeat_interleave(G, 1)
    qn = qn + HEAD_NOISE * torch.randn(qn.shape, generator=g)
    for hq in range(HKV * G):
        u = qn[0, hq, 0] / qn[0, hq, 0].norm()
        pos = torch.randint(64, N - 64, (NEEDLES,), generator=g)
        k[0, hq // G, pos] += (6.0 * math.sqrt(D) / qn[0, hq, 0].norm()) * u
    return qn.bfloat16(), k.bfloat16(), v.bfloat16()


def selections(q, cache, f):
    B, hq, _, _ = q.shape
    s = D ** -0.5
    means = cache.block_means()  # (B, Hkv, npg, D)
    npg = means.shape[2]
    n_b = (cache.seq_lens.long() + cache.page_size - 1) // cache.page_size
    width = max(cache.page_table.shape[1], npg)
    qbar = q.float().mean(2)  # (B, Hq, D)
    sh = torch.einsum("bhd,bhpd->bhp", qbar, expand_kv(means, hq))  # (B, Hq, npg)
    grp = lambda x: x.view(B, HKV, G, npg)  # noqa: E731
    rules = {
        "head": None,
        "mean-q": torch.einsum("bgd,bgpd->bgp", qbar.view(B, HKV, G, D).mean(2), means),
        "max": (s * grp(sh) - (s * grp(sh)).amax(-1, keepdim=True)).amax(2),
        "mass": torch.softmax(s * grp(sh), -1).sum(2),
        "union": "union",
    }
    out = {}
    for name, sc in rules.items():
        if sc is None:  # fp4attn's thrift_share="head"
            out[name] = thrift_select(q, cache, f, share="head")
        elif isinstance(sc, str):  # every head of a group computes the union of its heads' own selections
            out[name] = thrift_select(q, cache, f, share="group")
        else:
            out[name] = top_pages(sc, n_b, f, width).repeat_interleave(G, 1)
    return out


def main():
    lines = []

    def P(x=""):
        print(x, flush=True)
        lines.append(x)

    P(f"inputs {KIND}; B=1, Hkv={HKV}, G={G}, D={D}, needles per query head {NEEDLES}, head noise {HEAD_NOISE}")
    P("rel L2 vs float64 exact attention on the bf16 inputs; recov = share of the FP4 -> BF16 gap closed; "
      "16b = the group's 16-bit page share (union)")
    for f in (0.05, 0.10, 0.25):
        P(f"\nbudget {f}:")
        P("| N | bf16 | FP4 | " + " | ".join(f"{r} err (recov, 16b)" for r in RULES) + " |")
        P("|---|---|---|" + "---|" * len(RULES))
        for N in NS:
            acc = {}
            for seed in range(2):
                q, k, v = inputs(N, seed)
                cache = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
                kx, vx = (expand_kv(x.double(), HKV * G) for x in (k, v))
                ex = torch.softmax(q.double() @ kx.transpose(-1, -2) * D ** -0.5, -1) @ vx
                rel = lambda a: ((a.double() - ex).norm() / ex.norm()).item()  # noqa: B023, E731
                bf = torch.nn.functional.scaled_dot_product_attention(q.float(), kx.float(), vx.float())
                acc.setdefault("bf16", []).append(rel(bf.bfloat16()))
                acc.setdefault("fp4", []).append(rel(decode_reference(q, cache, scale=D ** -0.5)[0]))
                for name, sel in selections(q, cache, f).items():
                    o = decode_reference(q, cache, scale=D ** -0.5, selection=sel)[0]
                    share = sel.view(1, HKV, G, -1).any(2).float().mean().item()
                    acc.setdefault(name, []).append(rel(o))
                    acc.setdefault(name + "16", []).append(share)
            m = {n: sum(x) / len(x) for n, x in acc.items()}
            rec = lambda e: 100 * (m["fp4"] - e) / max(m["fp4"] - m["bf16"], 1e-12)  # noqa: B023, E731
            P(f"| {N} | {m['bf16']:.4f} | {m['fp4']:.4f} | " + " | ".join(
                f"{m[r]:.4f} ({rec(m[r]):.0f}%, {m[r + '16']:.3f})" for r in RULES) + " |")
    with open(os.path.join(OUT, "quality.txt"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
