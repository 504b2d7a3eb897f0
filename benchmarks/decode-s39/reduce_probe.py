"""The cost of decode's reduce kernel (thirty-ninth session): CUDA-graph time of the step (split + reduce as a
programmatic dependent launch), of the split kernel alone (reduce replaced by nothing), of the reduce alone on the
same partials, and of the step without PDL.

    PYTHONPATH=src python benchmarks/decode-s39/reduce_probe.py
"""
import os
import sys

from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import _launch
from fp4attn.kernels import decode as Dk

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _case import case  # noqa: E402

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "8,32,8,32768,128;1,32,8,131072,128").split(";")]
REP = float(os.environ.get("REP_MS", "60"))

real_fast = _launch.fast
captured = {}


class _Rec:
    """fast(kernel)[grid](*args, **kw): records the reduce launch, runs it unless skipped."""

    def __init__(self, fn, skip):
        self.fn, self.skip = fn, skip

    def __getitem__(self, grid):
        def go(*a, **kw):
            captured["reduce"] = (grid, a, dict(kw))
            if not self.skip:
                real_fast(self.fn)[grid](*a, **kw)
        return go


def patched(skip):
    def f(fn):
        return _Rec(fn, skip) if fn is Dk._decode_reduce_kernel else real_fast(fn)
    return f


def main():
    for (B, Hq, Hkv, C, D) in SHAPES:
        q, cache, scale = case(B, Hq, Hkv, C, D)
        step = lambda: Dk.decode_fwd(q, cache, scale=scale)  # noqa: E731
        res = {"step": graph_time_ms(step, REP)}
        Dk.fast = patched(True)
        res["split only"] = graph_time_ms(step, REP)
        Dk.fast = patched(False)
        step()
        grid, a, kwr = captured["reduce"]
        kwr.pop("launch_pdl", None)
        kwr["PDL"] = False
        red = lambda: real_fast(Dk._decode_reduce_kernel)[grid](*a, **kwr)  # noqa: E731
        res["reduce only"] = graph_time_ms(red, REP)
        Dk.fast = real_fast
        Dk._PDL = False
        res["step, no PDL"] = graph_time_ms(step, REP)
        Dk._PDL = True
        print(f"({B},{Hq},{Hkv},{C},{D}) grid {grid}: " + ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in res.items()),
              flush=True)


if __name__ == "__main__":
    main()
