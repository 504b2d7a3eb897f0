"""Shared setup of this folder's A/B scripts: the tree before the change importable as ``fp4attn_old`` (OLD_SRC, see
benchmarks/grid-s19/ab.py), the log, and the cases with their folded-GQA cuDNN time and rounds of CUDA-graph
timings alternating between variants (min per variant)."""
import os
import sys

import torch
import triton
from torch.nn.attention import SDPBackend

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multiq-s26"))
from _common import cases, log, t  # noqa: E402

from fp4attn.bench.decode import sdpa_fn  # noqa: E402

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
import fp4attn_old  # noqa: E402
import fp4attn_old.kernels.decode  # noqa: E402, F401  (ab2.py reads fp4attn_old.kernels.decode)

REP = float(os.environ.get("REP_MS", 30))
ROUNDS = int(os.environ.get("ROUNDS", 3))


def logger(name: str):
    P = log(os.path.join(os.environ.get("OUT", "."), name))
    P(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    return P


def shapes(spec: str, P):
    """``cases(spec)`` with the folded-GQA cuDNN time of each (logged): yields (D, nq, k, v, cache, q, cud µs)."""
    for B, Hq, Hkv, N, D, nq, k, v, cache, q in cases(spec):
        qf = q.view(B, Hkv, Hq // Hkv * nq, D)
        cud = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, qf, k, v), REP)
        P(f"\n(B,Hq,Hkv,N,D,nq)=({B},{Hq},{Hkv},{N},{D},{nq}): bf16 folded cuDNN {cud:.1f} us")
        yield D, nq, k, v, cache, q, cud


def rounds(fns: dict):
    """{name: fn} -> ({name: min µs}, {name: [µs per round]}), ROUNDS rounds alternating between the variants."""
    res = {n: [] for n in fns}
    for _ in range(ROUNDS):
        for n, f in fns.items():
            res[n].append(t(f, REP))
    return {n: min(v) for n, v in res.items()}, res
