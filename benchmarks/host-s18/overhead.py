"""Host time per call of the generation-step ops (eager): fp4attn.decode, KVCache.append of one token, SDPA for
scale; then cProfile of decode and append (where the host time goes). Writes $OUT/overhead.txt and
$OUT/profile_*.txt."""
import cProfile
import io
import os
import pstats
import sys
import time

import torch

import fp4attn
from fp4attn.kvcache import KVCache

OUT = os.environ.get("OUT", "/tmp")
log = open(os.path.join(OUT, "overhead.txt"), "w")


def P(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    log.write(s + "\n")


def host_us(fn, n=300):
    """(enqueue µs per call, wall µs per call): the host cost when the GPU keeps up."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t) / n * 1e6, (t2 - t) / n * 1e6


def profile(name, fn, n=300):
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    open(os.path.join(OUT, f"profile_{name}.txt"), "w").write(s.getvalue())


torch.manual_seed(0)
tag = sys.argv[1] if len(sys.argv) > 1 else "run"
P(f"== {tag}")
def case(B, Hq, Hkv, ctx, D):
    k = torch.randn(B, Hkv, ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    c = KVCache.from_dense(k, v)
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    a, b = host_us(lambda: fp4attn.decode(q, c))
    P(f"({B},{Hq},{Hkv},{ctx},{D}) fp4attn.decode: enqueue {a:.1f} us/call, wall {b:.1f}")
    a, b = host_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    P(f"({B},{Hq},{Hkv},{ctx},{D}) SDPA enable_gqa: enqueue {a:.1f} us/call, wall {b:.1f}")
    kn = torch.randn(B, Hkv, 1, D, device="cuda", dtype=torch.bfloat16)
    c2 = KVCache.from_dense(k, v)
    a, b = host_us(lambda: c2.append(kn, kn), n=200)
    P(f"({B},{Hq},{Hkv},{ctx},{D}) KVCache.append(1 token): enqueue {a:.1f} us/call, wall {b:.1f}")
    if B == 1:
        profile(f"decode_{tag}", lambda: fp4attn.decode(q, c))
        c3 = KVCache.from_dense(k, v)
        profile(f"append_{tag}", lambda: c3.append(kn, kn), n=200)


for shape in ((1, 32, 8, 256, 128), (4, 32, 8, 8192, 64)):
    case(*shape)
