"""Forty-third session: does the FP4 cache's placement in memory bound the decode stream? The Gluon split kernel
reads four regions per tile (K codes, K scales, V codes, V scales: 2 KB, 256 B, 2 KB, 256 B at D = 128, four
allocations). Variant "pool": the same bytes regrouped as one block per (page, kv head),
[K codes | K scales | V codes | V scales] (the kernel's PB switch), so that a tile reads one 9 KB region. CUDA-graph
replays of the public op, rounds alternating, min per variant; outputs compared bit for bit.

    OUT=out PYTHONPATH=src python benchmarks/layout-s43/probe.py
"""
# ruff: noqa: B023
import os
import sys

import torch

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels import decode as kdec

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "decode-prologue-s42")]  # _log: the s42 scripts' log helper
from _log import logger  # noqa: E402

CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,32,8,32768,64,1")
REP = float(os.environ.get("REP_MS", 60))
ROUNDS = int(os.environ.get("ROUNDS", 4))
# separate: the cache as it is; pool: see above; loads-only: the kernel's PROBE_NC switch, the unmasked tiles' loads
# kept live (stores predicated off at run time) and no tile work: the stream's bound with this grid and access
# pattern; work-only: the kernel's PROBE_CO switch, every unmasked tile loads the run's first tile again (cached) and
# does the full tile work: the loop's bound without DRAM traffic; l2next: the next tile bulk-prefetched into L2 at
# every head dim (L2_PREFETCH, on at D <= 64 only); sleep<ns>: odd splits start <ns> ns late (PROBE_SLEEP);
# pipe<n>: the kernel's PIPE switch (D = 128: the next tile's words loaded before the tile's work and carried in
# registers) at n programs per SM (the register cap follows)
VARIANTS = os.environ.get("VARIANTS", "separate,pool,loads-only").split(",")
_launch = kdec.decode_gluon.launch
STATE = {"pool": None}


class _Pooled:
    def __init__(self, cache, pool):
        self._c, self.k_data, self.v_data = cache, pool, pool

    def __getattr__(self, n):
        return getattr(self._c, n)


def launch(q, cache, pt, ks, vs, *a, **kw):
    pool = STATE["pool"]
    if pool is None:
        return _launch(q, cache, pt, ks, vs, *a, **kw)
    return _launch(q, _Pooled(cache, pool), pt, pool, pool, *a, page_bytes=pool.shape[-1], **kw)


kdec.decode_gluon.launch = launch


def setv(n):
    """The probe switches of variant n (environment variables the kernel's launch reads, a decode module knob)."""
    os.environ["PROBE_NC"] = "1" if n == "loads-only" else "0"
    os.environ["PROBE_CO"] = "1" if n == "work-only" else "0"
    os.environ["PROBE_SLEEP"] = n[5:] if n.startswith("sleep") else "0"
    kdec._GLUON_L2_PREFETCH_MAX_D = 256 if n == "l2next" else L2_MAX_D
    os.environ["PROBE_PIPE"] = "1" if n.startswith("pipe") else "0"
    kdec._GLUON_CONFIG[False]["per_sm"] = int(n[4:]) if n.startswith("pipe") else PER_SM


L2_MAX_D = kdec._GLUON_L2_PREFETCH_MAX_D
PER_SM = kdec._GLUON_CONFIG[False]["per_sm"]


def make_pool(c):
    P_, H = c.k_data.shape[:2]
    parts = [c.k_data, c.k_scale.view(torch.uint8), c.v_data, c.v_scale.view(torch.uint8)]
    return torch.cat([x.reshape(P_, H, -1) for x in parts], 2).contiguous()


def main():
    P = logger("probe.txt")
    P(torch.cuda.get_device_name(), torch.__version__)
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D, nq = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        pool = make_pool(cache)
        cu = 1e3 * graph_time_ms(sdpa_fn(torch.nn.attention.SDPBackend.CUDNN_ATTENTION, q, k, v), REP)
        STATE["pool"] = None
        o0 = fp4attn.decode(q, cache)
        STATE["pool"] = pool
        o1 = fp4attn.decode(q, cache)
        for n in VARIANTS:
            if n.startswith("pipe"):  # the same splits without the switch: equal bits expected
                setv(n)
                a = fp4attn.decode(q, cache)
                os.environ["PROBE_PIPE"] = "0"
                P(f"  {spec}: {n} outputs equal to the kernel without PIPE at its splits: "
                  f"{torch.equal(a, fp4attn.decode(q, cache))}")
        setv("separate")
        P(f"  {spec}: pool block {pool.shape[-1]} B, outputs equal {torch.equal(o0, o1)}")
        res = {n: [] for n in VARIANTS}
        for _ in range(ROUNDS):
            for n in res:
                STATE["pool"] = pool if n == "pool" else None
                setv(n)
                res[n].append(1e3 * graph_time_ms(lambda: fp4attn.decode(q, cache), REP))
        setv("separate")
        nb = sum(x.numel() * x.element_size() for x in (cache.k_data, cache.k_scale, cache.v_data, cache.v_scale))
        P(f"\n({spec}) cuDNN {cu:.1f} us ({4 * B * Hkv * N * D / cu / 1e6:.2f} TB/s); FP4 cache {nb / 1e6:.1f} MB")
        base = min(res["separate"])
        for n, xs in res.items():
            P(f"  {n:10s} {min(xs):8.2f} us  x cuDNN {cu / min(xs):5.3f}  separate/this {base / min(xs):5.3f}  "
              f"{nb / min(xs) / 1e6:.2f} TB/s  "
              f"rounds {['%.1f' % x for x in xs]}")
        STATE["pool"] = cache = pool = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
