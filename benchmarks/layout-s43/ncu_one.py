"""One decode call at (8,32,8,32k,128) for ncu (forty-third session), under a probe variant of probe.py
(VARIANT = separate | l2next | loads-only | work-only):

    VARIANT=l2next ncu --clock-control none -k regex:_decode_split_kernel_gl -c 1 --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
        --metrics dram__bytes_read.sum python benchmarks/layout-s43/ncu_one.py
"""
import os

import torch

import fp4attn
from fp4attn.kernels import decode as kdec

n = os.environ.get("VARIANT", "separate")
os.environ["PROBE_NC"] = "1" if n == "loads-only" else "0"
os.environ["PROBE_CO"] = "1" if n == "work-only" else "0"
if n == "l2next":
    kdec._GLUON_L2_PREFETCH_MAX_D = 256
g = torch.Generator(device="cuda").manual_seed(0)
kw = dict(device="cuda", dtype=torch.bfloat16, generator=g)
cache = fp4attn.KVCache.from_dense(torch.randn(8, 8, 32768, 128, **kw), torch.randn(8, 8, 32768, 128, **kw))
q = torch.randn(8, 32, 1, 128, **kw)
for _ in range(3):
    fp4attn.decode(q, cache)
torch.cuda.synchronize()
