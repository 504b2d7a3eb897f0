import torch
import fp4attn
from _util import kernel_times_us
torch.manual_seed(0)
for causal in (True, False):
    q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for r in ("nvfp4", "sage3"):
        agg = kernel_times_us(lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r))
        print(f"causal={causal} {r}: total {sum(agg.values()):.0f} us", flush=True)
        for n, t in agg.items():
            print(f"    {t:8.1f}  {n}")
