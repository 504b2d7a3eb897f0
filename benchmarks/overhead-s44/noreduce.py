"""Forty-fourth session: the bound of any fusion of the split reduce into the split kernel. The decode step timed
back to back with the reduce launch skipped (the split kernel alone: wrong output, timing only) against the full step,
in one process (graphs of one call and of REPS calls, alternating rounds).

    OUT=out PYTHONPATH=src python benchmarks/overhead-s44/noreduce.py
"""
from _ab import cases, header, logger, rounds_min, timers

from fp4attn.kernels import decode as kdec


class _Skip:
    """``fast(kernel)[grid](...)`` that launches nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


def main():
    P = logger("noreduce.txt")
    header(P)
    fast = kdec.fast
    state = {"skip": False}
    kdec.fast = lambda fn: _Skip() if (state["skip"] and fn is kdec._decode_reduce_kernel) else fast(fn)
    for (B, Hq, Hkv, N, D), q, k, v, cache in cases("1,32,8,131072,128;8,32,8,32768,128;1,32,8,131072,64"):
        del k, v
        fns = {}
        for n in ("full", "split kernel only"):
            state["skip"] = n != "full"
            fns[n] = timers(lambda q=q, cache=cache, D=D: kdec.decode_fwd(q, cache, scale=D ** -0.5))
        state["skip"] = False
        t = rounds_min(fns)
        P(f"({B},{Hq},{Hkv},{N},{D}): full {t['full'][0]:.1f} / b2b {t['full'][1]:.1f} us; split kernel only "
          f"{t['split kernel only'][0]:.1f} / b2b {t['split kernel only'][1]:.1f} us")
        del q, cache, fns


if __name__ == "__main__":
    main()
