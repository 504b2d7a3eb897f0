"""Host-time breakdown of one eager fp4attn.decode call (B=1, Hq=32, Hkv=8, D=128, 256-token cache): the op,
decode_fwd alone, each launch alone, and a cumulative cProfile. $OUT/breakdown.txt, $OUT/profile_cum.txt."""
import os
import sys

import torch

import fp4attn
from fp4attn.kernels import decode as Dk
from fp4attn.kvcache import KVCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _util import host_us as _host_us  # noqa: E402
from _util import logger, profile_to  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
P = logger("breakdown.txt")


def host_us(fn):
    return _host_us(fn, 400, 30)


torch.manual_seed(0)
for D, ctx in ((128, 256), (64, 256), (128, 8192)):
    k = torch.randn(1, 8, ctx, D, device="cuda", dtype=torch.bfloat16)
    c = KVCache.from_dense(k, torch.randn_like(k))
    q = torch.randn(1, 32, 1, D, device="cuda", dtype=torch.bfloat16)
    sc = D ** -0.5
    P(f"D={D} ctx={ctx}")
    P("  fp4attn.decode           %.1f us" % host_us(lambda q=q, c=c: fp4attn.decode(q, c)))
    P("  decode_fwd               %.1f us" % host_us(
        lambda q=q, c=c, s=sc: Dk.decode_fwd(q, c, scale=s)))
    P("  decode_fwd triton kernel %.1f us" % host_us(
        lambda q=q, c=c, s=sc: Dk.decode_fwd(q, c, scale=s, kernel="triton")))
    P("  torch.empty x4           %.1f us" % host_us(
        lambda: [torch.empty(1024, device="cuda") for _ in range(4)]))
    P("  empty kernel launch      %.1f us" % host_us(lambda q=q: q.add_(0)))
    if D == 128 and ctx == 256:
        profile_to(os.path.join(OUT, "profile_cum.txt"), lambda q=q, c=c: fp4attn.decode(q, c), 300, "cumulative", 40)
