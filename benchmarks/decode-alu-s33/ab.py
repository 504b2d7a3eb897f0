"""The decode loop's integer-pipe work, side by side (thirty-third session): trees importable as packages
(``VARIANTS``: name=package pairs under OLD_SRC, copies of src/fp4attn renamed as in benchmarks/grid-s19/ab.py) and
the working tree ("new") at each value of its experiment knob ``FP4ATTN_GL_CVT`` in ``CVTS`` (0: byte permutes;
1 / 2 / 3: K / V / both through cvt.rn.f16x2.e4m3x2). CUDA-graph replays of ``decode_fwd`` (split kernel and reduce;
Thrift with its selection given), rounds alternating between variants, min per variant; outputs compared with the
first variant's (bits).

    OLD_SRC=.ab_old/src VARIANTS=old=fp4attn_old,mid=fp4attn_mid CVTS=0,1,2,3 OUT=out \\
        PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/decode-alu-s33/ab.py
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

P = logger("ab.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1;8,32,8,32768,64,1;8,16,8,32768,256,1;"
                                "4,32,32,16384,128,1;8,32,8,32768,128,2")
THRIFT = float(os.environ.get("THRIFT", 0.05))
CVTS = [int(x) for x in os.environ.get("CVTS", "0").split(",")]
PKGS = {}
for item in filter(None, os.environ.get("VARIANTS", "old=fp4attn_old").split(",")):
    name, pkg = item.split("=")
    PKGS[name] = (importlib.import_module(pkg), None)
    importlib.import_module(pkg + ".kernels.decode")
for c in CVTS:
    PKGS[f"new{c}"] = (fp4attn, c)


def call(Dm, cache, cvt, kw):
    if cvt is not None:
        os.environ["FP4ATTN_GL_CVT"] = str(cvt)  # read by the launch (at capture)
    return Dm.decode_fwd(q, cache, **kw)


for D, _nq, k, v, _cache, q, _cud in shapes(CASES, P):
    cu = t(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 30)
    P(f"  unfolded cuDNN {cu:.1f} us")
    caches = {n: m.KVCache.from_dense(k, v, keep_16bit=True) for n, (m, _) in PKGS.items()}
    sel = fp4attn.kernels.decode.select_pages(q, caches[next(iter(PKGS))], THRIFT)
    fns, outs = {}, {}
    for th in (False, True):
        for n, (m, cvt) in PKGS.items():
            kw = dict(scale=D ** -0.5, kernel="gluon", selection=sel if th else None)
            key = f"{'thrift' if th else 'nvfp4'} {n}"
            fns[key] = lambda Dm=m.kernels.decode, c=caches[n], cvt=cvt, kw=kw: call(Dm, c, cvt, kw)
            outs[key] = fns[key]()[0]
    best, res = rounds(fns)
    first = {}
    for key, us in best.items():
        kind = key.split()[0]
        first.setdefault(kind, key)
        eq = torch.equal(outs[key], outs[first[kind]])
        P(f"  {key:14s} {us:8.1f} us  x cuDNN {cu / us:5.2f}  vs {first[kind].split()[1]}: "
          f"{best[first[kind]] / us:5.3f}x  bits equal: {eq}  rounds {['%.1f' % x for x in res[key]]}")
