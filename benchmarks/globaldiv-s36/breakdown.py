"""Where the time of the global-scale paths goes: torch.profiler kernel table of ``fp4attn.quantize(x, "nvfp4",
global_scale=True)`` and of ``KVCache.from_dense`` (CUDA time per kernel, summed over 5 calls).

    PYTHONPATH=src python benchmarks/globaldiv-s36/breakdown.py
"""
import torch
from torch.profiler import ProfilerActivity, profile

import fp4attn

torch.manual_seed(0)
print(f"device: {torch.cuda.get_device_name()}", flush=True)


def table(name, f, n=5):
    f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as p:
        for _ in range(n):
            f()
        torch.cuda.synchronize()
    print(f"## {name} ({n} calls)")
    print(p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
table("quantize (8192, 8192) nvfp4 global", lambda: fp4attn.quantize(x, "nvfp4", global_scale=True))
table("quantize (8192, 8192) nvfp4", lambda: fp4attn.quantize(x, "nvfp4"))
k, v = (torch.randn(8, 8, 32768, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
table("KVCache.from_dense (8,8,32768,128)", lambda: fp4attn.KVCache.from_dense(k, v), n=2)
