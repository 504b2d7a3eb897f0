"""Forty-fourth session: the Gluon split kernel's schedule (`sched_switches.patch`). The programs dispatched later
onto an SM run slower (the warp scheduler favours older warps: `times.py`), and the split kernel ends with its
slowest program. Variants (module knobs of fp4attn.kernels.decode, set before each graph is captured):
  static     the splits as on main (grid (splits, heads): a head's splits are dispatched together);
  hf         grid (heads, splits): a head's splits spread over the dispatch order;
  w<beta>    hf, and split s covers a share of the keys falling linearly with s, 1 - beta·s/NS (deterministic);
  dyn        hf, and the head's unmasked tiles claimed at run time from a counter (not deterministic: the tiles'
             grouping into partials changes the P̃ rounding).
CUDA-graph replays of the op (one call per replay, and REPS back to back), rounds alternating, min per variant;
cuDNN alongside; each variant's output against static's (rel. L2) and against itself on a second call (bits).

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_sched.py
"""
import os

import torch
from _ab import cases, header, logger, rounds_min, timers
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.decode import sdpa_fn
from fp4attn.kernels import decode as kdec

VARIANTS = os.environ.get("VARIANTS", "static,hf,w0.08,w0.12,dyn").split(",")


def setv(n):
    kdec._BALANCE = n == "dyn"
    kdec._HEAD_FAST = n != "static"
    kdec._BETA = float(n[1:]) if n.startswith("w") else 0.0


def main():
    P = logger("ab_sched.txt")
    header(P)
    for (B, Hq, Hkv, N, D), q, k, v, cache in cases("8,32,8,32768,128;1,32,8,131072,128;8,32,8,32768,64;"
                                            "1,32,8,131072,64"):
        fns = {"cudnn": timers(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v))}
        outs, same = {}, {}
        for n in VARIANTS:
            setv(n)
            f = (lambda q=q, cache=cache: fp4attn.decode(q, cache))
            outs[n] = f().float()
            same[n] = bool(torch.equal(outs[n], f().float()))
            fns[n] = timers(f)
        setv("static")
        t = rounds_min(fns)
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
