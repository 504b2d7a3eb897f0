"""Stochastic rounding to E2M1 / MXFP4 as ``@triton.jit`` helpers (the Triton copy of
:mod:`fp4attn.formats.stochastic`; the scale rule is ``triton_helpers.mx_exponent``, "floor").

Same element rule as the PyTorch version, bit for bit given the same uniform ``u``: quantum ``q`` of
the binade of ``|v|`` (0.5 below 2, 1 below 4, else 2), ``lo = floor(|v|/q)*q``, result ``lo + q`` when
``u < |v|/q - floor(|v|/q)``, else ``lo``; sign restored; magnitudes saturated at 6. ``|v|/q`` is a
multiplication by the exact reciprocal of a power of two, so it is exact here too.
"""

import triton
import triton.language as tl

from .triton_helpers import _GPU_ASM, exp2i, mx_exponent


@triton.jit
def _sr_quanta(a, u):
    """|v| (float32, >= 0), u in [0, 1) -> (n, binade): the SR result is n quanta of the binade's
    quantum q (binade 0: |v| < 2, q = 0.5; 1: below 4, q = 1; 2: up to the saturation at 6, q = 2)."""
    a = tl.minimum(a, 6.0)
    b0 = a < 2.0
    b1 = a < 4.0
    t = a * tl.where(b0, 2.0, tl.where(b1, 1.0, 0.5))
    lo = tl.floor(t)
    n = lo + (u < (t - lo)).to(tl.float32)
    return n, tl.where(b0, 0, tl.where(b1, 1, 2))


@triton.jit
def e2m1_sr_abs(a, u):
    """|v| (float32, >= 0) and uniform u in [0, 1) -> an E2M1 magnitude, unbiased, saturating at 6."""
    n, binade = _sr_quanta(a, u)
    return n * tl.where(binade == 0, 0.5, tl.where(binade == 1, 1.0, 2.0))


@triton.jit
def e2m1_sr_code(v, u):
    """``e2m1_code(e2m1_sr(v, u))`` (int32, sign in bit 3) without a second rounding: the code is
    n + 2·binade (n quanta: codes 0-4 below 2 are 0..2 in steps of 0.5, 2/3/4 -> codes 4/5/6, 4/6 ->
    codes 6/7). For NaN v the code is unspecified (callers flag non-finite blocks through their scale)."""
    n, binade = _sr_quanta(tl.abs(v), u)
    return (n.to(tl.int32) + 2 * binade) | ((v.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def e2m1_sr(v, u):
    """float32 v (|v| <= 6) -> stochastically rounded E2M1 value (float32), sign kept; NaN -> NaN.

    The sign is copied as a bit (Triton's unary minus is 0 - x, which would turn -0.0 into +0.0), and
    NaN is masked explicitly (``tl.minimum`` drops NaN on GPU).
    """
    r = e2m1_sr_abs(tl.abs(v), u)
    sign = v.to(tl.int32, bitcast=True) & -2147483648
    r = (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(v == v, r, v)


@triton.jit
def mx_sr_blocks(xb, u, PRESCALE: tl.constexpr):
    """SR of ``PRESCALE * x / 2**e`` for a (..., 32) float32 tile of finite values, blocks last
    (callers flag blocks holding NaN/Inf themselves, as the kernels do with ``block_bad``).

    ``e = floor(log2(amax)) - 2`` per block. Returns (E2M1 values in units of 2**e, e (int32)).
    """
    amax = tl.max(tl.abs(xb), axis=-1)
    e = mx_exponent(amax, True)
    v = xb * tl.expand_dims(exp2i(-e), -1) * PRESCALE
    return e2m1_sr(v, u), e


# Philox4x32's two round multipliers, and one 32 x 32 -> 64-bit multiply by each in inline PTX (GPU
# only): mul.wide.u32 is one instruction (IMAD.WIDE.U32) where Triton's umulhi and low multiply are two.
_PHILOX_A = tl.constexpr(0xD2511F53)
_PHILOX_B = tl.constexpr(0xCD9E8D57)
_MULWIDE_A_PTX = tl.constexpr("{ .reg .b64 t; mul.wide.u32 t, $2, 0xD2511F53; mov.b64 {$0, $1}, t; }")
_MULWIDE_B_PTX = tl.constexpr("{ .reg .b64 t; mul.wide.u32 t, $2, 0xCD9E8D57; mov.b64 {$0, $1}, t; }")


@triton.jit
def _philox_mul(x, B: tl.constexpr):
    """(low, high) 32-bit halves of x * (Philox's round multiplier A, or B if B), x uint32."""
    if _GPU_ASM:
        return tl.inline_asm_elementwise(_MULWIDE_B_PTX if B else _MULWIDE_A_PTX, "=r,=r,r", [x],
                                         dtype=(tl.uint32, tl.uint32), is_pure=True, pack=1)
    else:
        m: tl.constexpr = _PHILOX_B if B else _PHILOX_A
        return x * m, tl.umulhi(x, m)


@triton.jit
def philox_randint4x(seed, offset):
    """``tl.randint4x(seed, offset)`` (Philox4x32-10, int32 offsets: counter (offset, 0, 0, 0), key =
    the 64-bit seed), the same four uint32 words, with its umulhi/multiply pairs as one wide multiply
    each on GPUs (``_philox_mul``): ~40 instructions per call instead of ~55. Equal to ``tl.randint4x``
    under the interpreter (the same operations) and compiled (``tests/test_quartet_kernels.py``)."""
    seed = tl.core.to_tensor(seed).to(tl.uint64)
    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c0 = offset.to(tl.uint32, bitcast=True)
    # round 1 on the counter (c0, 0, 0, 0): B * c2 = 0, so c0 <- k0 and c1 <- 0
    lo_a, hi_a = _philox_mul(c0, False)
    c2 = hi_a ^ k1
    c3 = lo_a
    c1 = c3 * 0
    c0 = c1 + k0
    k0 = k0 + 0x9E3779B9
    k1 = k1 + 0xBB67AE85
    for _ in tl.static_range(9):
        lo_b, hi_b = _philox_mul(c2, True)
        lo_a, hi_a = _philox_mul(c0, False)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@triton.jit
def sr_uniform_bits(seed, rows, l0, LP, C: tl.constexpr):
    """The 16-bit random integers ``h`` (int32 in [0, 2**16)) behind the SR uniforms of an (R, C) tile
    at columns ``l0 .. l0 + C`` of an (·, LP) grid (``l0``, ``C`` and ``LP`` multiples of 8; ``rows``
    int32 or int64 with ``rows * LP < 2**31``); the uniform is ``sr_uniform(h) = (h + 0.5) / 2**16``.

    Eight per Philox4x32-10 call: element (r, l) takes the low (l even) or high (l odd) half of word
    ``(l % 8) // 2`` of ``tl.randint4x(seed, (r * LP + l) // 8)`` (computed by ``philox_randint4x``).
    With 16-bit uniforms an SR step is taken with a probability within 2**-17 of the exact one (the
    rounding stays unbiased to that resolution); one Philox call per element would cost ~8x more
    instructions for randomness the 3-bit grid cannot use.
    """
    R: tl.constexpr = rows.shape[0]
    ctr = rows[:, None] * (LP // 8) + (l0 // 8 + tl.arange(0, C // 8))[None, :]
    w0, w1, w2, w3 = philox_randint4x(seed, ctr.to(tl.int32))
    # join(join(w0, w2), join(w1, w3)) indexes [.., i, j] = w_{2i+j}: word k sits at position k
    w = tl.join(tl.join(w0, w2), tl.join(w1, w3)).to(tl.uint32, bitcast=True)
    h = tl.join(w & 0xFFFF, w >> 16)  # [.., k, half]
    return tl.reshape(h, (R, C)).to(tl.int32, bitcast=True)


@triton.jit
def sr_uniform(h):
    """16-bit integer h (int32) -> the uniform (h + 0.5) / 2**16 in (0, 1), float32: 1 + h/2**16 + 2**-17
    built from bits (h into the top 16 mantissa bits; no int->float conversion), minus 1 (exact)."""
    return ((h << 7) | 0x3F800040).to(tl.float32, bitcast=True) - 1.0


# e2m1_sr_code_u16's GPU form: $1 = v (float32 bits), $2 = h; a = min(|v|, 6), B = min(rp(a + 2),
# rp(a/2 + 4)) (rp: one rounding toward +inf), c = B's bits + 2**21 - 17 - 32h, code = bits 21-23 of c
# with v's sign bit in bit 3 (lop3 0xE2 on (c >> 21, 7, v >> 28): the first operand's bits where the
# mask 7 is set, the third's elsewhere).
_SR_CODE_PTX = tl.constexpr("""{
.reg .b32 a, b, t, c, s;
abs.f32 a, $1;
min.f32 a, a, 0f40C00000;
add.rp.f32 b, a, 0f40000000;
fma.rp.f32 t, a, 0f3F000000, 0f40800000;
min.f32 b, b, t;
mad.lo.s32 c, $2, -32, 0x1FFFEF;
add.s32 c, c, b;
shr.u32 c, c, 21;
shr.u32 s, $1, 28;
lop3.b32 $0, c, 7, s, 0xE2;
}""")


@triton.jit
def e2m1_sr_code_u16(v, h):
    """``e2m1_sr_code(v, sr_uniform(h))`` for 16-bit integers h (int32 in [0, 2**16)): the SR code of v
    with the uniform u = (h + 0.5) / 2**16. The interpreter runs exactly that; GPUs (inline PTX) decide
    in the integer domain of float bits, ~10 instructions instead of ~20 (and no uniform in float):

    With a = min(|v|, 6), B = min(a + 2, a/2 + 4) is a + 2 in [2, 6) for a < 4 and a/2 + 4 in [6, 7]
    from 4 up. In each of B's binades [2, 4), [4, 8) the float grid of two mantissa bits (spacing 0.5,
    1) is the image of E2M1's grid of a (spacing 0.5 below 2, 1 below 4; 2 from 4 up, halved): the
    grid point below B is B's bits with the low 21 mantissa bits M cleared, its bits 21-23 are the code
    of a's lower neighbour lo (2.0, 3.0, ... 7.0 <-> 0, 0.5, ... 6), and M / 2**21 is SR's fraction
    (a - lo)/q.
    SR takes the upper neighbour when u < M / 2**21, i.e. M > 32h + 16, i.e. when adding 2**21 - 17 - 32h
    to the bits carries into bit 21. B is computed with one rounding *up* (add.rp / fma.rp): every
    decision threshold lo + u*q maps to a multiple of 2**-17 quanta, a float on B's grid, and rounding
    up never crosses a float, so rp(B) > threshold exactly when B > threshold (a value rounded up to
    the next grid point was above every threshold of its cell). Magnitudes above 6 saturate at 7.0 =
    code 7; the sign goes to bit 3 with one 3-input logic op. NaN gives an unspecified code, as in
    ``e2m1_sr_code``. Same codes as that helper on every float32 |v| in [0, 6] (threshold in h, both
    sides) and on dense random (v, h) (``tools/exactness_checks.py sr``); GPU: ``tests/test_quartet_kernels.py``
    compares both forms compiled."""
    if _GPU_ASM:
        return tl.inline_asm_elementwise(_SR_CODE_PTX, "=r,r,r", [v, h], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return e2m1_sr_code(v, sr_uniform(h))
