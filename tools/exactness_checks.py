"""Exhaustive float32 checks that rewritten in-register FP4 arithmetic gives the same bits as before.

NumPy emulation of the Triton helpers in ``fp4attn.formats.triton_helpers`` (float32 throughout; the
fmas used there have exact products, so an unfused multiply-add gives the same bits). Each check
compares the former formula with the current one over every float32 of a range and prints the number
of mismatches (expected: 0). Minutes per check on one CPU core.

    python tools/exactness_checks.py e2m1            # every float32 in [0, +inf]
"""

import sys
import time

import numpy as np

M22 = np.float32(6291456.0)  # 1.5 * 2**22


def e2m1_round_abs_v1(a):
    """The former helper: magic-constant rounding below 2, bit rounding of the mantissa from 2 up."""
    lo = (a + M22) - M22
    b = a.view(np.int32)
    hi = ((b + 0x1FFFFF + ((b >> 22) & 1)) & -4194304).view(np.float32)
    return np.minimum(np.where(a < 2.0, lo, hi), np.float32(6.0))


def e2m1_round_abs_v2(a):
    """The current helper: saturate, then one magic constant that follows the binade of a."""
    a = np.minimum(a, np.float32(6.0))
    f = np.maximum((a.view(np.int32) & 0x7F800000).view(np.float32), np.float32(1.0))
    m = f * M22
    return (m + a) - m


def _sweep(lo_bits, hi_bits, old, new, label):
    bad, t = 0, time.time()
    step = 1 << 26
    for start in range(lo_bits, hi_bits + 1, step):
        x = np.arange(start, min(start + step, hi_bits + 1), dtype=np.int64).astype(np.int32).view(np.float32)
        o, n = old(x), new(x)
        d = o.view(np.int32) != n.view(np.int32)
        if d.any():
            bad += int(d.sum())
            print("  mismatch", label, x[d][:4], o[d][:4], n[d][:4])
    print(f"{label}: {hi_bits - lo_bits + 1} values, {bad} mismatches ({time.time() - t:.0f} s)", flush=True)
    return bad


def check_e2m1():
    return _sweep(0, 0x7F800000, e2m1_round_abs_v1, e2m1_round_abs_v2, "e2m1_round_abs on [0, inf]")


CHECKS = {"e2m1": check_e2m1}

if __name__ == "__main__":
    names = sys.argv[1:] or list(CHECKS)
    sys.exit(1 if sum(CHECKS[n]() for n in names) else 0)
