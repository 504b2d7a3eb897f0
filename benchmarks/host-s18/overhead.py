"""Host time per call of the generation-step ops (eager): fp4attn.decode, KVCache.append of one token, SDPA for
scale; then cProfile of decode and append (where the host time goes). Writes $OUT/overhead.txt and
$OUT/profile_*.txt."""
import os
import sys

import torch

import fp4attn
from fp4attn.kvcache import KVCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _util import host_us, logger, profile_to  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
P = logger("overhead.txt")


def profile(name, fn, n=300):
    profile_to(os.path.join(OUT, f"profile_{name}.txt"), fn, n)


torch.manual_seed(0)
tag = sys.argv[1] if len(sys.argv) > 1 else "run"
P(f"== {tag}")
def case(B, Hq, Hkv, ctx, D):
    k = torch.randn(B, Hkv, ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    c = KVCache.from_dense(k, v)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    a = host_us(lambda: fp4attn.decode(q, c))
    P(f"({B},{Hq},{Hkv},{ctx},{D}) fp4attn.decode: {a:.1f} us/call")
    a = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    P(f"({B},{Hq},{Hkv},{ctx},{D}) SDPA enable_gqa: {a:.1f} us/call")
    kn = torch.randn(B, Hkv, 1, D, device="cuda", dtype=torch.bfloat16)
    c2 = KVCache.from_dense(k, v)
    a = host_us(lambda: c2.append(kn, kn), n=200)
    P(f"({B},{Hq},{Hkv},{ctx},{D}) KVCache.append(1 token): {a:.1f} us/call")
    if B == 1:
        profile(f"decode_{tag}", lambda: fp4attn.decode(q, c))
        c3 = KVCache.from_dense(k, v)
        profile(f"append_{tag}", lambda: c3.append(kn, kn), n=200)


for shape in ((1, 32, 8, 256, 128), (4, 32, 8, 8192, 64)):
    case(*shape)
