"""Thrift decode with one selection per kv group (every query head of a group computes the same pages in 16 bits)
against the per-head selection, CUDA-graph replays (µs), 5% budget, N(0,1) bf16 K/V.

Rows: the op with thrift_share="group" (each head computes its kv group's union of selections, the default) and
"head"; the selection kernels both ways; decode_fwd with each selection. Exploration (not an op option): a top-k of
the group's mean query (one selection per kv group: 16-bit pages = the budget, not up to G times it).

    OUT=out PYTHONPATH=src python benchmarks/thrift-group-s41/probe.py      # prints; $OUT/probe.txt
"""
import os

import torch

import fp4attn
import fp4attn.kernels.decode as Dn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn

CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128")
F = float(os.environ.get("THRIFT", 0.05))
REP = float(os.environ.get("REP_MS", 100))
ROUNDS = int(os.environ.get("ROUNDS", 2))
out = open(os.path.join(os.environ.get("OUT", "."), "probe.txt"), "w")


def P(*a):
    print(*a, flush=True)
    print(*a, file=out, flush=True)


P(torch.cuda.get_device_name(), torch.__version__)
def run(spec):
    B, Hq, Hkv, N, D = map(int, spec.split(","))
    G = Hq // Hkv
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    cache = fp4attn.KVCache.from_dense(k, v)
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel_h = Dn.select_pages(q, c16, F)
    qg = q.float().view(B, Hkv, G, 1, D).mean(2).to(q.dtype).contiguous()

    def sel_group():
        s = Dn.select_pages(qg, c16, F)  # (B, Hkv, W)
        return s.repeat_interleave(G, dim=1)

    sel_g = sel_group().contiguous()

    def sel_union():  # every head computes the pages some head of its group selected
        s = Dn.select_pages(q, c16, F)
        return s.view(B, Hkv, G, -1).amax(2, keepdim=True).expand(B, Hkv, G, s.shape[-1]).reshape(B, Hq, -1)

    sel_u = sel_union().contiguous()
    assert torch.equal(Dn.select_pages(q, c16, F, share="group"), sel_u)
    share = lambda s: s.view(B, Hkv, G, -1).any(2).float().sum().item() / (B * Hkv * -(-N // c16.page_size))  # noqa
    fns = {
        "cudnn": sdpa_fn(torch.nn.attention.SDPBackend.CUDNN_ATTENTION, q, k, v),
        "nvfp4 op": lambda: fp4attn.decode(q, cache),
        "thrift op (share=group)": lambda: fp4attn.decode(q, c16, thrift_budget=F),
        "thrift op (share=head)": lambda: fp4attn.decode(q, c16, thrift_budget=F, thrift_share="head"),
        "select_pages (head)": lambda: Dn.select_pages(q, c16, F),
        "select_pages (group)": lambda: Dn.select_pages(q, c16, F, share="group"),
        "decode_fwd(sel per head)": lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel_h),
        "decode_fwd(sel union)": lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel_u),
        "select_pages + torch union": sel_union,
        "select (top-k of mean q)": sel_group,
        "decode_fwd(sel mean q)": lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel_g),
    }
    res = {n: float("inf") for n in fns}
    for _ in range(ROUNDS):
        for n, f in fns.items():
            res[n] = min(res[n], 1e3 * graph_time_ms(f, REP))
    P(f"\n(B,Hq,Hkv,N,D)=({B},{Hq},{Hkv},{N},{D}); 16-bit page union share: per head {share(sel_h):.3f}, "
      f"group {share(sel_g):.3f}")
    for n, x in res.items():
        P(f"  {n:28s} {x:8.1f} us   x cuDNN {res['cudnn'] / x:5.2f}")


for spec in CASES.split(";"):
    run(spec)
    torch.cuda.empty_cache()
