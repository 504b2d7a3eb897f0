"""Per-kernel CUDA time of a callable (torch.profiler), shared by this folder's scripts."""
import collections

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_times(f, reps=10, warmup=3):
    """({kernel name: µs per call}, {kernel name: launches per call}) over ``reps`` calls of ``f``."""
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
    per = collections.defaultdict(float)
    cnt = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.device_time / reps
            cnt[e.name] += 1
    return per, {n: c // reps for n, c in cnt.items()}
