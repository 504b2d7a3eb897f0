"""Forty-fourth session: the Gluon split kernel's tiles claimed at run time (``balance``) against the static splits,
in one process: CUDA-graph replays of the public op, one call per replay and REPS calls per replay (back to back),
rounds alternating, min per variant; cuDNN alongside; outputs of the two compared (relative L2, max |diff|) and
each against the float64 reference over the dequantized cache at the smaller shapes.

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_balance.py
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import capture_graph, time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels import decode as kdec

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402

REP = float(os.environ.get("REP_MS", 60))
REPS = int(os.environ.get("REPS", 10))
ROUNDS = int(os.environ.get("ROUNDS", 3))
CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128;8,32,8,32768,64;1,32,8,131072,64;"
                       "8,32,8,8192,128;1,32,8,32768,128")


def timed(fn, reps):
    g = capture_graph(fn, reps=reps)
    return lambda: time_ms(g.replay, warmup_ms=REP / 4, rep_ms=REP) * 1e3 / reps


def main():
    P = logger("ab_balance.txt")
    P(torch.cuda.get_device_name(), torch.__version__, f"REPS={REPS} ROUNDS={ROUNDS}")
    P("shape | cuDNN 1 | static 1 | balanced 1 | bal/static | x cuDNN | cuDNN b2b | static b2b | balanced b2b | "
      "bal/static | x cuDNN | rel L2 bal vs static | max diff")
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        outs = {}
        fns = {}
        for name, bal in (("static", False), ("balanced", True)):
            f = (lambda bal=bal, q=q, cache=cache, D=D: kdec.decode_fwd(q, cache, scale=D ** -0.5, balance=bal)[0])
            outs[name] = f().float()
            fns[name + "1"], fns[name + "b"] = timed(f, 1), timed(f, REPS)
        fc = sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v)
        fns["cudnn1"], fns["cudnnb"] = timed(fc, 1), timed(fc, REPS)
        t = {n: float("inf") for n in fns}
        for _ in range(ROUNDS):
            for n, f in fns.items():
                t[n] = min(t[n], f())
        d = outs["balanced"] - outs["static"]
        rel = float(d.norm() / outs["static"].norm())
        P(f"({B},{Hq},{Hkv},{N},{D}) | {t['cudnn1']:.1f} | {t['static1']:.1f} | {t['balanced1']:.1f} | "
          f"{t['static1'] / t['balanced1']:.3f} | {t['cudnn1'] / t['balanced1']:.3f} | {t['cudnnb']:.1f} | "
          f"{t['staticb']:.1f} | {t['balancedb']:.1f} | {t['staticb'] / t['balancedb']:.3f} | "
          f"{t['cudnnb'] / t['balancedb']:.3f} | {rel:.2e} | {float(d.abs().max()):.2e}")
        del q, k, v, cache, fns, outs


if __name__ == "__main__":
    main()
