"""Exhaustive float32 checks that rewritten in-register FP4 arithmetic gives the same bits as before.

NumPy emulation of the Triton helpers in ``fp4attn.formats.triton_helpers`` (float32 throughout; the
fmas used there have exact products, so an unfused multiply-add gives the same bits). Each check
compares the former formula with the current one over every float32 of a range and prints the number
of mismatches (expected: 0). Minutes per check on one CPU core.

    python tools/exactness_checks.py e2m1            # every float32 in [0, +inf]
    python tools/exactness_checks.py e4m3            # every float32 in [0, +inf]
    python tools/exactness_checks.py mxscale         # every float32 amax in [0, 1.5 * 2^127)
    python tools/exactness_checks.py mx [E ...]      # every float32 in [0, 16 * 2^E] for each E
    python tools/exactness_checks.py code            # every float32 bit pattern but NaN (E2M1 codes)
    python tools/exactness_checks.py sr              # SR codes from 16-bit uniforms: every float32
                                                     # |v| in [0, 6] at the decision step, both
                                                     # signs, and random (v, h) of every magnitude
    python tools/exactness_checks.py questexp        # every float32 a in [1e-8, +inf] and every NaN
    python tools/exactness_checks.py scaledcode [K ...]  # E2M1 code and trust bit of x * 2**K, every x
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


def e4m3_round_v1(x):
    """The former E4M3 helper: x * 2^(3-e) rounded with the 1.5 * 2^23 constant, times 2^(e-3)."""
    e = np.maximum(((x.view(np.int32) >> 23) & 0xFF) - 127, -6)
    q = ((e - 3 + 127) << 23).astype(np.int32).view(np.float32)
    inv_q = ((130 - e) << 23).astype(np.int32).view(np.float32)
    r = np.float32(12582912.0)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.minimum(((x * inv_q + r) - r) * q, np.float32(448.0))


def e4m3_round_v2(x):
    """The current helper: saturate, then one magic constant 1.5 * 2^20 * max(binade, 2^-6)."""
    x = np.minimum(x, np.float32(448.0))
    f = np.maximum((x.view(np.int32) & 0x7F800000).view(np.float32), np.float32(2.0 ** -6))
    m = f * np.float32(1572864.0)
    return (m + x) - m


def _exp2(e):
    return np.float32(np.ldexp(np.float32(1.0), e))


def e2m1_round_pow2_v1(x, e):
    """The former MXFP4 path of fake_quant_p: scale by 2^-e, round, scale back (both products exact)."""
    with np.errstate(over="ignore"):
        return e2m1_round_abs_v2(x * _exp2(-e)) * _exp2(e)


def e2m1_round_pow2_v2(x, e):
    """e2m1_round_pow2: the same rounding on the grid scaled by s = 2^e."""
    s = _exp2(e)
    x = np.minimum(x, np.float32(6.0) * s)
    f = np.maximum((x.view(np.int32) & 0x7F800000).view(np.float32), s)
    m = f * M22
    return (m + x) - m


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


def check_e4m3():
    return _sweep(0, 0x7F800000, e4m3_round_v1, e4m3_round_v2, "e4m3_round on [0, inf]")


def mx_scale_v1(amax):
    """exp2i(mx_exponent(amax, FLOOR=False)): the rceil E8M0 scale as before."""
    bits = amax.view(np.int32)
    e0 = ((bits >> 23) & 0xFF) - 127
    e = np.where((bits & 0x7FFFFF) <= 0x400000, e0 - 2, e0 - 1)
    e = np.minimum(np.maximum(np.where(amax > 0, e, -127), -127), 127)
    normal = ((e + 127) << 23).astype(np.int32).view(np.float32)
    sub = np.left_shift(1, np.minimum(np.maximum(e + 149, 0), 30)).astype(np.int32).view(np.float32)
    return np.where(e >= -126, normal, sub)


def mx_scale_v2(amax):
    """mx_scale_rceil."""
    b = ((amax.view(np.int32) + 0x3FFFFF) & 0x7F800000).view(np.float32)
    return np.maximum(b, np.float32(2.0 ** -125)) * np.float32(0.25)


def check_mxscale():
    return _sweep(0, 0x7F3FFFFF, mx_scale_v1, mx_scale_v2, "mx_scale_rceil on [0, 1.5 * 2^127)")


def check_mx(exps=(-127, -126, -125, -124, -100, -20, -3, -1, 0, 1, 60, 100)):
    bad = 0
    for e in exps:
        hi = int(np.float32(16.0 * 2.0 ** e).view(np.int32))
        bad += _sweep(0, hi, lambda x, e=e: e2m1_round_pow2_v1(x, e), lambda x, e=e: e2m1_round_pow2_v2(x, e),
                      f"e2m1_round_pow2, s = 2^{e}, x in [0, 16s]")
        x = np.array([3e38, np.inf, 1e30], dtype=np.float32)
        bad += int((e2m1_round_pow2_v1(x, e).view(np.int32) != e2m1_round_pow2_v2(x, e).view(np.int32)).sum())
    return bad


def e2m1_code_v1(v):
    """The former code helper: |v|'s float bits against the seven decision points, sign to bit 3."""
    b = v.view(np.int32)
    a = b & 0x7FFFFFFF
    g = [0x3E800000, 0x3F3FFFFF, 0x3FA00000, 0x3FDFFFFF, 0x40200000, 0x405FFFFF, 0x40A00000]
    b2 = a > g[3]
    b1 = a > np.where(b2, g[5], g[1])
    b0 = a > np.where(b2, np.where(b1, g[6], g[4]), np.where(b1, g[2], g[0]))
    return (b2.astype(np.int32) * 4 + b1 * 2 + b0) | ((b >> 28) & 8)


def e2m1_code_v2(v):
    """The current helper: three magic-constant roundings of the piecewise-linear code ramp, minimum."""
    a = np.abs(v)
    m = np.float32(12582912.0)
    with np.errstate(over="ignore", invalid="ignore"):
        r1 = (a * np.float32(2.0) + m).view(np.int32)
        r2 = (a + np.float32(12582914.0)).view(np.int32)
        r3 = (a * np.float32(0.5) + np.float32(12582916.0)).view(np.int32)
    r = np.minimum(np.minimum(r1, r2), np.minimum(r3, np.int32(0x4B400007)))
    return (r & 7) | ((v.view(np.int32) >> 28) & 8)


def check_code():
    bad = 0
    for lo, hi in ((0, 0x7F800000), (-2 ** 31, -2 ** 31 + 0x7F800000)):
        bad += _sweep(lo, hi, lambda x: e2m1_code_v1(x).astype(np.int32).view(np.float32),
                      lambda x: e2m1_code_v2(x).astype(np.int32).view(np.float32),
                      f"e2m1 code on bits [{lo:#x}, {hi:#x}]")
    return bad


def sr_code_v1(v, u):
    """e2m1_sr_code (triton_stochastic), float32 throughout: quanta of |v|'s binade, floor, fraction
    against the uniform u, code n + 2 * binade with the sign in bit 3."""
    a = np.minimum(np.abs(v), np.float32(6.0))
    b0, b1 = a < 2.0, a < 4.0
    t = a * np.where(b0, np.float32(2.0), np.where(b1, np.float32(1.0), np.float32(0.5)))
    lo = np.floor(t)
    n = (lo + (u < (t - lo)).astype(np.float32)).astype(np.int32)
    return (n + 2 * np.where(b0, 0, np.where(b1, 1, 2))) | ((v.view(np.int32) >> 28) & 8)


def sr_uniform_v1(h):
    """sr_uniform: (h + 0.5) / 2**16 built from bits (1 + h/2**16 + 2**-17, minus 1)."""
    return ((h.astype(np.int32) << 7) | 0x3F800040).view(np.float32) - np.float32(1.0)


def _rp32(x64, base, a):
    """float32 rounding toward +inf of the float64 x64 = base + (a scaled), exact in float64 except for
    tiny a (< 2**-26), where base + a lies strictly between base and the next float32 up."""
    r = x64.astype(np.float32)
    r = np.where(r.astype(np.float64) < x64, np.nextafter(r, np.float32(np.inf)), r)
    tiny = (a > 0) & (a < np.float32(2.0 ** -26))
    return np.where(tiny, np.nextafter(np.float32(base), np.float32(np.inf)), r)


def sr_code_v2(v, h):
    """e2m1_sr_code_u16's GPU form (inline PTX) emulated: B = min(rp(a + 2), rp(a/2 + 4)) with one
    rounding up each, c = B's bits + 2**21 - 17 - 32h, code = bits 21-23 of c, sign from v's bit 31."""
    a = np.minimum(np.abs(v), np.float32(6.0))
    a64 = a.astype(np.float64)
    b = np.minimum(_rp32(a64 + 2.0, 2.0, a), _rp32(a64 * 0.5 + 4.0, 4.0, a))
    c = b.view(np.int32) + (0x1FFFEF - (h.astype(np.int32) << 5))
    s = (v.view(np.uint32) >> 28).astype(np.int32)
    return ((c >> 21) & 7) | (s & 8)


def check_sr(step=1 << 23):
    """Both forms are (lower neighbour's code) + [u < fraction], a step function of h: equal for every h
    when equal on both sides of the new form's step, h = T - 1 and T with T = #{h : M > 32h + 16}
    (M: the low 21 bits of B), clamped to [0, 2**16) -- checked for every float32 |v| in [0, 6] and
    both signs; plus every 61st float32 above 6 at a few h, and random (v, h)."""
    bad, t0 = 0, time.time()
    hi_bits = int(np.float32(6.0).view(np.int32))
    for start in range(0, hi_bits + 1, step):
        a = np.arange(start, min(start + step, hi_bits + 1), dtype=np.int64).astype(np.int32).view(np.float32)
        a64 = a.astype(np.float64)
        b = np.minimum(_rp32(a64 + 2.0, 2.0, a), _rp32(a64 * 0.5 + 4.0, 4.0, a))
        m = b.view(np.int32) & 0x1FFFFF
        tt = np.where(m >= 17, (m - 17) // 32 + 1, 0)
        v = np.where(np.arange(a.size) % 2 == 0, a, -a)  # both signs
        for hh in (tt - 1, tt):
            h = np.clip(hh, 0, 65535).astype(np.int32)
            d = sr_code_v1(v, sr_uniform_v1(h)) != sr_code_v2(v, h)
            if d.any():
                bad += int(d.sum())
                print("  mismatch", v[d][:4], h[d][:4])
    print(f"sr code, every float32 |v| in [0, 6] at the step: {bad} mismatches ({time.time() - t0:.0f} s)",
          flush=True)
    for start in range(hi_bits + 1, 0x7F800001, step):  # saturated (both forms clamp to 6): every 61st
        v = np.arange(start, min(start + step, 0x7F800001), 61, dtype=np.int64).astype(np.int32).view(np.float32)
        for hv in (0, 1, 32767, 65535):
            h = np.full(v.shape, hv, np.int32)
            w = np.where(np.arange(v.size) % 2 == 0, v, -v)
            bad += int((sr_code_v1(w, sr_uniform_v1(h)) != sr_code_v2(w, h)).sum())
    rng = np.random.default_rng(0)
    for _ in range(64):
        v = (rng.standard_normal(1 << 20) * np.exp2(rng.integers(-30, 4, 1 << 20))).astype(np.float32)
        v[:4096] = rng.integers(0, 13, 4096).astype(np.float32) * np.float32(0.5)  # on and between the grid
        h = rng.integers(0, 65536, 1 << 20).astype(np.int32)
        bad += int((sr_code_v1(v, sr_uniform_v1(h)) != sr_code_v2(v, h)).sum())
    print(f"sr code, saturated and random (v, h): total {bad} mismatches ({time.time() - t0:.0f} s)", flush=True)
def _exp2i(e):
    """exp2i: 2**e for int32 e in [-149, 127], subnormals included."""
    normal = ((e + 127) << 23).astype(np.int32).view(np.float32)
    sub = np.left_shift(1, np.minimum(np.maximum(e + 149, 0), 30)).astype(np.int32).view(np.float32)
    return np.where(e >= -126, normal, sub)


def quest_exp_v1(a):
    """The former QuEST exponent and scale: min(mx_exponent(a, FLOOR) + 2, 127) and exp2i(-e)."""
    bits = a.view(np.int32)
    e = ((bits >> 23) & 0xFF) - 127 - 2
    e = np.minimum(np.maximum(np.where(a > 0, e, -127), -127), 127)
    e = np.minimum(e + 2, 127)
    return e, _exp2i(-e)


def quest_exp_v2(a):
    """quartet._quest_exp: the biased exponent minus 127 capped at 127, -125 for NaN; 2**-e from bits."""
    e = np.where(a > 0, np.minimum((a.view(np.int32) >> 23) - 127, 127), -125).astype(np.int32)
    return e, np.maximum((127 - e) << 23, 0x400000).astype(np.int32).view(np.float32)


def check_questexp():
    def pack(f):
        def g(a):
            with np.errstate(invalid="ignore"):
                e, s = f(a)
            return (e.astype(np.int64) << 32 | s.view(np.uint32).astype(np.int64)).view(np.float64)
        return g
    lo = int(np.float32(1e-8).view(np.int32))
    bad = _sweep(lo, 0x7F800000, pack(quest_exp_v1), pack(quest_exp_v2), "quest exponent on [1e-8, inf]")
    bad += _sweep(0x7F800001, 0x7FFFFFFF, pack(quest_exp_v1), pack(quest_exp_v2), "quest exponent on +NaN")
    bad += _sweep(-0x7FFFFF, -1,
                  pack(quest_exp_v1), pack(quest_exp_v2), "quest exponent on -NaN")
    return bad


def scaled_code_v1(x, k):
    """The former QuEST encoding: v = x * 2**k (rounded), e2m1_code_i32(v), trusted |v| < 6."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = x * _exp2(k)
    return e2m1_code_v2(v) & 15, np.abs(v) < np.float32(6.0)


def scaled_code_v2(x, k):
    """e2m1_code_raw(x, 2**k) & 15 (the scale in the magic-constant fmas; the products |x| * 2**k * m are
    exact or under/overflow, where an fma and numpy's rounded product then sum agree) and the trust bit
    |x| < 6 * 2**-k."""
    a = np.abs(x)
    s = _exp2(k)
    with np.errstate(over="ignore", invalid="ignore"):
        r1 = (a * (s * np.float32(2.0)) + np.float32(12582912.0)).view(np.int32)
        r2 = (a * s + np.float32(12582914.0)).view(np.int32)
        r3 = (a * (s * np.float32(0.5)) + np.float32(12582916.0)).view(np.int32)
        lim = _exp2(-k) * np.float32(6.0)
    r = np.minimum(np.minimum(r1, r2), np.minimum(r3, np.int32(0x4B400007)))
    return (r | ((x.view(np.uint32) >> 28).astype(np.int32) & 8)) & 15, a < lim


def check_scaledcode(ks=(-127, -126, -100, -27, -1, 0, 1, 60, 125)):
    bad = 0
    for k in ks:
        def pack(f, k=k):
            def g(x):
                c, t = f(x, k)
                return (c.astype(np.int32) | (t.astype(np.int32) << 4)).view(np.float32)
            return g
        # every non-negative float32 and NaN up to 64 / 2**k, then every 4099th pattern; the sign bit
        # (negative x) on a strided sweep
        top = min(int(np.float32(64.0 * 2.0 ** -k).view(np.int32)) if -k < 121 else 0x7FFFFFFF, 0x7FFFFFFF)
        bad += _sweep(0, top, pack(scaled_code_v1), pack(scaled_code_v2), f"scaled code, s = 2^{k}, dense")
        for lo, hi, step in ((top, 0x7FFFFFFF, 4099), (-2 ** 31, -1, 65537)):
            xs = np.arange(lo, hi + 1, step, dtype=np.int64).astype(np.int32).view(np.float32)
            d = pack(scaled_code_v1)(xs).view(np.int32) != pack(scaled_code_v2)(xs).view(np.int32)
            bad += int(d.sum())
        print(f"  strided rest and negative x, s = 2^{k}: total mismatches so far {bad}", flush=True)
    return bad


if __name__ == "__main__":
    args = sys.argv[1:] or ["e2m1", "e4m3", "mxscale", "mx"]
    if args[0] == "mx" and len(args) > 1:
        sys.exit(1 if check_mx([int(a) for a in args[1:]]) else 0)
    if args[0] == "scaledcode" and len(args) > 1:
        sys.exit(1 if check_scaledcode([int(a) for a in args[1:]]) else 0)
    checks = {"e2m1": check_e2m1, "e4m3": check_e4m3, "mxscale": check_mxscale, "mx": check_mx,
              "code": check_code, "sr": check_sr, "questexp": check_questexp,
              "scaledcode": check_scaledcode}
    sys.exit(1 if sum(checks[n]() for n in args) else 0)
