"""Forty-fourth session: the first form of run-time tile claims (`sched_switches.patch`'s DYN, without HEAD_FAST:
each head's tiles claimed by its own splits, which are dispatched together) against the static splits, in one
process: CUDA-graph replays of `decode_fwd` (one call per replay and REPS per replay), rounds alternating, min per
variant; cuDNN alongside; outputs of the two compared (relative L2, max |diff|).

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/ab_balance.py
"""
from _ab import cases, header, logger, rounds_min, timers
from torch.nn.attention import SDPBackend

from fp4attn.bench.decode import sdpa_fn
from fp4attn.kernels import decode as kdec


def main():
    P = logger("ab_balance.txt")
    header(P)
    P("shape | cuDNN 1 | static 1 | balanced 1 | bal/static | x cuDNN | cuDNN b2b | static b2b | balanced b2b | "
      "bal/static | x cuDNN | rel L2 bal vs static | max diff")
    for (B, Hq, Hkv, N, D), q, k, v, cache in cases("8,32,8,32768,128;1,32,8,131072,128;8,32,8,32768,64;"
                                            "1,32,8,131072,64;8,32,8,8192,128;1,32,8,32768,128"):
        outs, fns = {}, {}
        for name, bal in (("static", False), ("balanced", True)):
            f = (lambda bal=bal, q=q, cache=cache, D=D: kdec.decode_fwd(q, cache, scale=D ** -0.5, balance=bal)[0])
            outs[name] = f().float()
            fns[name] = timers(f)
        fns["cudnn"] = timers(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v))
        t = rounds_min(fns)
        d = outs["balanced"] - outs["static"]
        rel = float(d.norm() / outs["static"].norm())
        (c1, cb), (s1, sb), (b1, bb) = t["cudnn"], t["static"], t["balanced"]
        P(f"({B},{Hq},{Hkv},{N},{D}) | {c1:.1f} | {s1:.1f} | {b1:.1f} | {s1 / b1:.3f} | {c1 / b1:.3f} | {cb:.1f} | "
          f"{sb:.1f} | {bb:.1f} | {sb / bb:.3f} | {cb / bb:.3f} | {rel:.2e} | {float(d.abs().max()):.2e}")
        del q, k, v, cache, fns, outs


if __name__ == "__main__":
    main()
