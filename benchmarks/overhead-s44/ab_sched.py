"""Forty-fourth session: the Gluon split kernel's schedule. The programs dispatched later onto an SM run slower (the
warp scheduler favours older warps: `times.py`), and the split kernel ends with its slowest program. Variants (module
knobs of fp4attn.kernels.decode, set before each graph is captured):
  static     the splits as on main (grid (splits, heads): a head's splits are dispatched together);
  hf         grid (heads, splits): a head's splits spread over the dispatch order;
  w<beta>    hf, and split s covers a share of the keys falling linearly with s, 1 - beta·s/NS (deterministic);
  dyn        hf, and the head's unmasked tiles claimed at run time from a counter (not deterministic: the tiles'
             grouping into partials changes the P̃ rounding).
CUDA-graph replays of the op (one call per replay, and REPS back to back), rounds alternating, min per variant;
cuDNN alongside; each variant's output against static's (rel. L2) and against itself on a second call (bits).

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_sched.py
"""
# ruff: noqa: B023
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
CASES = os.environ.get("CASES", "8,32,8,32768,128;1,32,8,131072,128;8,32,8,32768,64;1,32,8,131072,64")
VARIANTS = os.environ.get("VARIANTS", "static,hf,w0.08,w0.12,dyn").split(",")


def setv(n):
    kdec._BALANCE = n == "dyn"
    kdec._HEAD_FAST = n != "static"
    kdec._BETA = float(n[1:]) if n.startswith("w") else 0.0


def timed(fn, reps):
    g = capture_graph(fn, reps=reps)
    return lambda: time_ms(g.replay, warmup_ms=REP / 4, rep_ms=REP) * 1e3 / reps


def main():
    P = logger("ab_sched.txt")
    P(torch.cuda.get_device_name(), torch.__version__, f"REPS={REPS} ROUNDS={ROUNDS}")
    for spec in CASES.split(";"):
        B, Hq, Hkv, N, D = map(int, spec.split(","))
        q, k, v = decode_inputs(B, Hq, Hkv, N, D)
        cache = fp4attn.KVCache.from_dense(k, v)
        fc = sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v)
        fns = {"cudnn": (timed(fc, 1), timed(fc, REPS))}
        outs, same = {}, {}
        for n in VARIANTS:
            setv(n)
            f = (lambda q=q, cache=cache: fp4attn.decode(q, cache))
            outs[n] = f().float()
            same[n] = bool(torch.equal(outs[n], f().float()))
            fns[n] = (timed(f, 1), timed(f, REPS))
        setv("static")
        t = {n: [float("inf")] * 2 for n in fns}
        for _ in range(ROUNDS):
            for n, (f1, fb) in fns.items():
                t[n] = [min(t[n][0], f1()), min(t[n][1], fb())]
        P(f"\n== ({B},{Hq},{Hkv},{N},{D}): cuDNN {t['cudnn'][0]:.1f} us (b2b {t['cudnn'][1]:.1f})")
        P("variant | 1/replay us | vs static | x cuDNN | b2b us | vs static | x cuDNN | rel L2 vs static | "
          "same bits twice")
        for n in VARIANTS:
            rel = float((outs[n] - outs["static"]).norm() / outs["static"].norm()) if "static" in outs else float("nan")
            s1, sb = t.get("static", t[n])
            P(f"{n} | {t[n][0]:.1f} | {s1 / t[n][0]:.3f} | {t['cudnn'][0] / t[n][0]:.3f} | {t[n][1]:.1f} | "
              f"{sb / t[n][1]:.3f} | {t['cudnn'][1] / t[n][1]:.3f} | {rel:.2e} | {same[n]}")
        del q, k, v, cache, fns, outs


if __name__ == "__main__":
    main()
