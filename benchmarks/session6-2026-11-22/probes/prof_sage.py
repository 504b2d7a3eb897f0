import torch, collections
from torch.profiler import profile, ProfilerActivity
import fp4attn
torch.manual_seed(0)
for causal in (True, False):
    q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for r in ("nvfp4", "sage3"):
        f = lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r)
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                f()
            torch.cuda.synchronize()
        agg = collections.defaultdict(float)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                agg[e.name[:70]] += e.device_time / 10
        print(f"causal={causal} {r}: total {sum(agg.values()):.0f} us", flush=True)
        for n, t in sorted(agg.items(), key=lambda x: -x[1]):
            print(f"    {t:8.1f}  {n}")
