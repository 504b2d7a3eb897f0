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
def e2m1_sr_abs(a, u):
    """|v| (float32, >= 0) and uniform u in [0, 1) -> an E2M1 magnitude, unbiased, saturating at 6."""
    a = tl.minimum(a, 6.0)
    q = tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))
    inv_q = tl.where(a < 2.0, 2.0, tl.where(a < 4.0, 1.0, 0.5))
    t = a * inv_q
    lo = tl.floor(t)
    up = (u < (t - lo)).to(tl.float32)
    return (lo + up) * q


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
