"""The pre-pass (``quantize_qkv``) under register caps: each kernel's time (torch.profiler) per cap and the
outputs compared bit for bit with the uncapped run. CAPS: "q,k,v" register caps (0 = none), ';'-separated.

    PYTHONPATH=src python benchmarks/prepass-s34/prep_cap.py
"""
import os
import sys

import torch

from fp4attn.kernels import attention as ka

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "session6-2026-11-22", "probes"))
from _util import kernel_times_us  # noqa: E402  (the session-6 probes' profiler helper)

SHAPES = [tuple(int(x) for x in s.split(",")) for s in
          os.environ.get("SHAPES", "16,16,4096,128;16,16,4096,64").split(";")]
RECIPES = {"nvfp4": ("nvfp4", False), "mxfp4": ("mxfp4", False), "sage3": ("nvfp4", True)}
CAPS = os.environ.get("CAPS", "0,0,0;96,96,96;80,80,80;64,64,64;72,72,72").split(";")
_fast = ka.fast
CAP = {}


def capped_fast(fn):
    k = _fast(fn)
    name = fn.fn.__name__ if hasattr(fn, "fn") else fn.__name__

    class W:
        def __getitem__(self, grid):
            def call(*args, **meta):
                which = "v" if name == "_prep_v_kernel" else ("q" if meta.get("BAD_MODE") == 1 else "k")
                c = CAP.get(which, 0) if name.startswith("_prep") else 0
                if c:
                    meta = dict(meta, maxnreg=c)
                return k[grid](*args, **meta)
            return call
    return W()


ka.fast = capped_fast
torch.manual_seed(0)
for (B, H, N, D) in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for r, (fmt, sm) in RECIPES.items():
        ref = None
        print(f"\n## ({B},{H},{N},{D}) {r}")
        for caps in CAPS:
            CAP.clear()
            CAP.update(zip("qkv", (int(x) for x in caps.split(","))))
            def f(q=q, k=k, v=v, fmt=fmt, sm=sm):
                return ka.quantize_qkv(q, k, v, fmt=fmt, smooth_q=sm, smooth_k=sm)
            out = f()
            ts = [x for x in out if isinstance(x, torch.Tensor)]
            if ref is None:
                ref = ts
            same = all(torch.equal(a, b) for a, b in zip(ts, ref))
            per = kernel_times_us(f, n=20)
            per = {n: us for n, us in per.items() if n.startswith("_")}
            tot = sum(per.values())
            print(f"  caps {caps:12s} total {tot / 1e3:.3f} ms  " +
                  "  ".join(f"{n} {us / 1e3:.3f}" for n, us in sorted(per.items())) + f"  bit-equal {same}",
                  flush=True)
