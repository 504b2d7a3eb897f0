import time, torch, fp4attn
from fp4attn.kvcache import KVCache
torch.manual_seed(0)
def cpu_us(fn, n=300):
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
for keep in (False, True):
    k = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
    c = KVCache.from_dense(k, torch.randn_like(k), keep_16bit=keep)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    a, b = cpu_us(lambda: fp4attn.decode(q, c))
    print(f"keep16={keep} decode B=1 ctx=256 eager: enqueue {a:.1f} us/call, wall {b:.1f} us/call", flush=True)
    if keep:
        a, b = cpu_us(lambda: fp4attn.decode(q, c, thrift_budget=0.05))
        print(f"keep16={keep} thrift decode eager: enqueue {a:.1f} us/call, wall {b:.1f}", flush=True)
    kn = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16)
    c2 = KVCache.from_dense(k, torch.randn_like(k), keep_16bit=keep)
    a, b = cpu_us(lambda: c2.append(kn, kn), n=160)
    print(f"keep16={keep} append 1 token eager: enqueue {a:.1f} us/call, wall {b:.1f}", flush=True)
    a, b = cpu_us(lambda: torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), k.repeat_interleave(4, 1)))
    print(f"sdpa (with repeat_interleave) eager: enqueue {a:.1f} us, wall {b:.1f}", flush=True)
