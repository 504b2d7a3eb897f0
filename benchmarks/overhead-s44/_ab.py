"""The A/B helpers of this folder's scripts: settings from the environment, the log, timers of a function replayed
from a CUDA graph of one call and of REPS calls back to back, and the min over alternating rounds."""
import os
import sys

import torch

from fp4attn.bench.common import capture_graph, time_ms
from fp4attn.bench.decode import decode_inputs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-prologue-s42"))
from _log import logger  # noqa: E402,F401  (re-exported)

REP = float(os.environ.get("REP_MS", 60))
REPS = int(os.environ.get("REPS", 10))
ROUNDS = int(os.environ.get("ROUNDS", 3))


def timed(fn, reps):
    """A timer (µs per call) of ``fn`` captured ``reps`` times in one CUDA graph."""
    g = capture_graph(fn, reps=reps)
    return lambda: time_ms(g.replay, warmup_ms=REP / 4, rep_ms=REP) * 1e3 / reps


def timers(fn):
    """(one call per replay, REPS calls per replay) timers of ``fn``."""
    return timed(fn, 1), timed(fn, REPS)


def rounds_min(fns, prepare=None):
    """{name: (timer, timer)} -> {name: [min µs, min µs]} over ROUNDS rounds, each timing every entry in order
    (``prepare(name)`` first)."""
    t = {n: [float("inf")] * 2 for n in fns}
    for _ in range(ROUNDS):
        for n, (f1, fb) in fns.items():
            if prepare is not None:
                prepare(n)
            t[n] = [min(t[n][0], f1()), min(t[n][1], fb())]
    return t


def cases(default):
    """The (B, Hq, Hkv, N, D) shapes of $CASES (';'-separated, default ``default``) and their inputs: yields
    (shape, q, k, v, the FP4 cache of k, v)."""
    import fp4attn

    for spec in os.environ.get("CASES", default).split(";"):
        shape = tuple(map(int, spec.split(",")))
        q, k, v = decode_inputs(*shape)
        yield shape, q, k, v, fp4attn.KVCache.from_dense(k, v)


def header(P):
    P(torch.cuda.get_device_name(), torch.__version__, f"REPS={REPS} ROUNDS={ROUNDS}")
