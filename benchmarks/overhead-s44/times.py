"""Forty-fourth session: where a decode step's split kernel spends its time, per program. With the probe switch
PROBE_T (`probe_times.patch`), every program of the Gluon split kernel stores %globaltimer at its start, after its
prologue (q loaded and quantized, first page-table entries), after its key loop and at its end, with its SM. Three
eager calls back to back; the stamps of the last.

    git apply benchmarks/overhead-s44/probe_times.patch
    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/times.py
"""
import os
import sys

import torch

import fp4attn
from fp4attn.bench.decode import decode_inputs
from fp4attn.kernels import decode_gluon

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402

TAG = os.environ.get("TAG", "balanced" if os.environ.get("FP4ATTN_DECODE_BALANCE", "1") != "0" else "static")
CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128;8,32,8,32768,64")


def q(x, p):
    return float(torch.quantile(x.double(), p))


def main():
    P = logger("times.txt")
    P(torch.cuda.get_device_name(), torch.__version__)
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        qq, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        del k, v
        decode_gluon.PROBE_TT = torch.zeros(1 << 16, 8, dtype=torch.int64, device="cuda")
        for _ in range(3):
            fp4attn.decode(qq, cache)
        torch.cuda.synchronize()
        decode_gluon.PROBE_TT.zero_()
        for _ in range(3):
            fp4attn.decode(qq, cache)
        torch.cuda.synchronize()
        T = decode_gluon.PROBE_TT
        torch.save(T.cpu(), os.path.join(os.environ.get("OUT", "."), f"times_{B}_{N}_{D}_{TAG}.pt"))
        T = T[T[:, 0] != 0].double()
        t0 = T[:, 0].min()
        s, a, b, e = (T[:, i] - t0 for i in range(4))
        tiles = T[:, 5]
        P(f"\n== ({B},{Hq},{Hkv},{N},{D}): {len(T)} programs, tiles per program {int(tiles.min())}-{int(tiles.max())},"
          f" SMs {len(torch.unique(T[:, 4]))}")
        P(f"kernel span (first start -> last end): {float(e.max()) / 1e3:.2f} us")
        for name, x in (("start", s), ("prologue (start -> loop)", a - s), ("loop", b - a),
                        ("loop per tile", (b - a) / tiles.clamp(min=1)), ("epilogue (loop -> end)", e - b),
                        ("end", e)):
            P(f"{name:28s} min {float(x.min()) / 1e3:7.2f}  p10 {q(x, .1) / 1e3:7.2f}  median {q(x, .5) / 1e3:7.2f}"
              f"  p90 {q(x, .9) / 1e3:7.2f}  max {float(x.max()) / 1e3:7.2f} us")
        # the last-finishing programs: what made them late
        order = torch.argsort(e, descending=True)[:8]
        for i in order.tolist():
            P(f"  late: sm {int(T[i, 4])} start {float(s[i]) / 1e3:.2f} prologue {float(a[i] - s[i]) / 1e3:.2f} "
              f"loop {float(b[i] - a[i]) / 1e3:.2f} epi {float(e[i] - b[i]) / 1e3:.2f} end {float(e[i]) / 1e3:.2f}")
        # per-SM busy time: sum of program loop times / programs on the SM
        sm = T[:, 4].long()
        ends = torch.zeros(int(sm.max()) + 1, dtype=torch.float64, device=T.device).scatter_reduce(
            0, sm, e, "amax", include_self=False)
        P(f"per-SM last end: min {float(ends.min()) / 1e3:.2f} median {q(ends, .5) / 1e3:.2f} "
          f"max {float(ends.max()) / 1e3:.2f} us")
        decode_gluon.PROBE_TT = None
        del qq, cache


if __name__ == "__main__":
    main()
