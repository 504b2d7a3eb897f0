"""Stochastic rounding to E2M1 / MXFP4 as ``@triton.jit`` helpers (the Triton copy of
:mod:`fp4attn.formats.stochastic`; the scale rule is ``triton_helpers.mx_exponent``, "floor").

Same element rule as the PyTorch version, bit for bit given the same uniform ``u``: quantum ``q`` of
the binade of ``|v|`` (0.5 below 2, 1 below 4, else 2), ``lo = floor(|v|/q)*q``, result ``lo + q`` when
``u < |v|/q - floor(|v|/q)``, else ``lo``; sign restored; magnitudes saturated at 6. ``|v|/q`` is a
multiplication by the exact reciprocal of a power of two, so it is exact here too.
"""

import triton
import triton.language as tl

from .triton_helpers import exp2i, mx_exponent


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


@triton.jit
def sr_uniforms(seed, rows, l0, LP, C: tl.constexpr):
    """Uniforms in (0, 1) for the SR of an (R, C) tile at columns ``l0 .. l0 + C`` of an (·, LP) grid
    (``l0``, ``C`` and ``LP`` multiples of 8; ``rows`` int32 or int64 with ``rows * LP < 2**31``).

    Eight 16-bit uniforms per Philox4x32-10 call: element (r, l) takes the low (l even) or high (l odd)
    half ``h`` of word ``(l % 8) // 2`` of ``tl.randint4x(seed, (r * LP + l) // 8)`` and
    ``u = (h + 0.5) / 2**16``. With 16-bit uniforms an SR step is taken with a probability within
    2**-17 of the exact one (the rounding stays unbiased to that resolution); one Philox call per
    element would cost ~8x more instructions for randomness the 3-bit grid cannot use.
    """
    R: tl.constexpr = rows.shape[0]
    ctr = rows[:, None] * (LP // 8) + (l0 // 8 + tl.arange(0, C // 8))[None, :]
    w0, w1, w2, w3 = tl.randint4x(seed, ctr.to(tl.int32))
    # join(join(w0, w2), join(w1, w3)) indexes [.., i, j] = w_{2i+j}: word k sits at position k
    w = tl.join(tl.join(w0, w2), tl.join(w1, w3)).to(tl.uint32, bitcast=True)
    # 1 + h/2**16 + 2**-17 built from bits (h into the top 16 mantissa bits; no int->float conversion)
    m = tl.join((w & 0xFFFF) << 7, (w >> 9) & 0x7FFF80) | 0x3F800040  # [.., k, half]
    u = m.to(tl.float32, bitcast=True) - 1.0
    return tl.reshape(u, (R, C))
