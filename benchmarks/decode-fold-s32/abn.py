"""Variants of the Gluon decode kernel side by side: trees importable as packages (``VARIANTS``: name=package pairs;
copies of src/fp4attn renamed as in benchmarks/grid-s19/ab.py, under OLD_SRC) and the working tree ("new"), each at
the programs per SM in ``PER_SM`` (empty: the config's). CUDA-graph replays of ``decode_fwd`` (split kernel and
reduce; Thrift with its selection given), rounds alternating between variants, min per variant; outputs compared
with the first variant's (bits).

    OLD_SRC=.ab_old/src VARIANTS=old=fp4attn_old OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 \\
        python benchmarks/decode-fold-s32/abn.py
"""
# ruff: noqa: B023
import importlib
import os

import torch
from _ab import logger, rounds, shapes
from _common import t
from torch.nn.attention import SDPBackend

import fp4attn
import fp4attn.kernels.decode  # noqa: F401  (as the variants', below)
from fp4attn.bench.decode import sdpa_fn

P = logger("abn.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,32,8,32768,64,1;4,32,32,16384,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))
PER_SM = [int(x) or None for x in os.environ.get("PER_SM", "").split(",") if x] or [None]  # (0: the config's)
PKGS = {"new": fp4attn}
for item in filter(None, os.environ.get("VARIANTS", "old=fp4attn_old").split(",")):
    name, pkg = item.split("=")
    PKGS[name] = importlib.import_module(pkg)
    importlib.import_module(pkg + ".kernels.decode")

for D, _nq, k, v, _cache, q, _cud in shapes(CASES, P):
    cu = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 30)
    P(f"  unfolded cuDNN {cu:.1f} us")
    caches = {n: m.KVCache.from_dense(k, v, keep_16bit=True) for n, m in PKGS.items()}
    sel = fp4attn.kernels.decode.select_pages(q, caches["new"], THRIFT)
    fns, outs = {}, {}
    for n, m in PKGS.items():
        Dm = m.kernels.decode
        for ps in PER_SM:
            for th in (False, True):
                kw = dict(scale=D ** -0.5, kernel="gluon", per_sm=ps, selection=sel if th else None)
                key = f"{'thrift' if th else 'nvfp4'} {n} per_sm={ps}"
                fns[key] = lambda Dm=Dm, c=caches[n], kw=kw: Dm.decode_fwd(q, c, **kw)
                outs[key] = fns[key]()[0]
    best, res = rounds(fns)
    first = {}
    for key, us in best.items():
        kind = key.split()[0] + key.split()[2]
        first.setdefault(kind, key)
        eq = torch.equal(outs[key], outs[first[kind]])
        P(f"  {key:28s} {us:8.1f} us  x cuDNN {cu / us:5.2f}  bits = {first[kind].split()[1]}: {eq}  "
          f"rounds {['%.1f' % x for x in res[key]]}")
