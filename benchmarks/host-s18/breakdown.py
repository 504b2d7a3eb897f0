"""Host-time breakdown of one eager fp4attn.decode call (B=1, Hq=32, Hkv=8, D=128, 256-token cache): the op,
decode_fwd alone, each launch alone, and a cumulative cProfile. $OUT/breakdown.txt, $OUT/profile_cum.txt."""
import cProfile
import io
import os
import pstats
import time

import torch

import fp4attn
from fp4attn.kernels import decode as Dk
from fp4attn.kvcache import KVCache

OUT = os.environ.get("OUT", "/tmp")
log = open(os.path.join(OUT, "breakdown.txt"), "w")


def P(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    log.write(s + "\n")


def host_us(fn, n=400):
    for _ in range(30):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t) / n * 1e6, (time.perf_counter() - t) / n * 1e6


torch.manual_seed(0)
for D, ctx in ((128, 256), (64, 256), (128, 8192)):
    k = torch.randn(1, 8, ctx, D, device="cuda", dtype=torch.bfloat16)
    c = KVCache.from_dense(k, torch.randn_like(k))
    q = torch.randn(1, 32, 1, D, device="cuda", dtype=torch.bfloat16)
    sc = D ** -0.5
    P(f"D={D} ctx={ctx}")
    P("  fp4attn.decode           enqueue %.1f wall %.1f us" % host_us(lambda q=q, c=c: fp4attn.decode(q, c)))
    P("  decode_fwd               enqueue %.1f wall %.1f us" % host_us(
        lambda q=q, c=c, s=sc: Dk.decode_fwd(q, c, scale=s)))
    P("  decode_fwd triton kernel enqueue %.1f wall %.1f us" % host_us(
        lambda q=q, c=c, s=sc: Dk.decode_fwd(q, c, scale=s, kernel="triton")))
    P("  torch.empty x4           enqueue %.1f wall %.1f us" % host_us(
        lambda: [torch.empty(1024, device="cuda") for _ in range(4)]))
    P("  empty kernel launch      enqueue %.1f wall %.1f us" % host_us(lambda q=q: q.add_(0)))
    if D == 128 and ctx == 256:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            fp4attn.decode(q, c)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
        open(os.path.join(OUT, "profile_cum.txt"), "w").write(s.getvalue())
