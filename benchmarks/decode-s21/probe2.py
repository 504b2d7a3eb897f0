"""Per-kernel device times (torch profiler) and CUDA-graph times of the decode op with packed / unpacked tiles."""
import os
import sys

import torch

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

P = logger(os.environ.get("PROBE_LOG", "probe2.txt"))


def kernel_times_us(fn, n=20):
    """{kernel name: mean device time (us) per call of fn}, from the torch profiler over n calls."""
    import collections

    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    agg = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:70]] += e.device_time / n
    return dict(sorted(agg.items(), key=lambda x: -x[1]))

for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    res = {}
    for _rep in range(3):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        for pk in (1, 2):
            res.setdefault(f"pack{pk}", []).append(graph_time_ms(
                lambda q=q, c=cache, d=D, p=pk: Dk.decode_fwd(q, c, scale=d ** -0.5, pack=p), 40))
    print_times(P, (B, Hq, Hkv, N, D), res, width=14)
    for pk in (1, 2):
        kt = kernel_times_us(lambda q=q, c=cache, d=D, p=pk: Dk.decode_fwd(q, c, scale=d ** -0.5, pack=p), 20)
        P(f"  kernels pack{pk}: " + ", ".join(f"{n[:40]} {t:.1f} us" for n, t in kt.items()))
    del k, v, cache
    torch.cuda.empty_cache()
