"""Per-kernel device times (torch profiler) and CUDA-graph times of the decode op with packed / unpacked tiles."""
import importlib.util
import os
import sys

import torch

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

P = logger(os.environ.get("PROBE_LOG", "probe2.txt"))



def _load(path, name):
    """A helper module by path (session 6's probes and session 10's share the module name _util)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


kernel_times_us = _load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes",
                                     "_util.py"), "_util_s6").kernel_times_us

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
