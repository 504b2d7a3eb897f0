"""Unbiased stochastic rounding (SR) to E2M1 / MXFP4: the rule Quartet's backward pass uses.

The scale rule is not repeated here: MXFP4 block exponents come from
:func:`fp4attn.formats.core.mx_exponent` (``scale_mode="floor"``: ``e = floor(log2(amax)) - 2``), the
element grid from :data:`fp4attn.formats.core.E2M1_VALUES`. The Triton copy of the element rule is
``fp4attn.formats.triton_stochastic``; tests compare the two bit for bit on the same noise.

Element rule (``e2m1_stochastic_round``), for a float32 value ``v`` with ``|v| <= 6`` and a uniform
``u`` in [0, 1):

* the quantum of ``|v|``'s binade is ``q = 0.5`` below 2, 1 below 4, else 2 (the E2M1 grid spacing);
* ``lo = floor(|v|/q)*q`` and ``hi = lo + q`` are the two neighbouring E2M1 magnitudes (both exact);
* the result is ``hi`` when ``u < (|v| - lo)/q`` and ``lo`` otherwise, with ``v``'s sign.

So ``P(hi) = (|v|-lo)/q`` and ``E[result] = v`` (unbiased); a value already on the grid is returned
unchanged. ``|v|/q`` and the fraction are exact in float32; with ``u`` on the 2**-24 grid of
``torch.rand`` the probability is exact whenever the fraction is a multiple of 2**-24 (always for
``|v|/q >= 0.5``) and otherwise off by less than 2**-24. Magnitudes above 6 (outside the contract) are
saturated to 6.

MXFP4 rule (``sr_quantize_mxfp4``), per block of 32 along ``dim``, Quartet's backward quantizer:
``e = floor(log2(amax)) - 2`` of the *unscaled* block (``mx_exponent(amax, "floor")``), then
``SR(prescale * x / 2**e) * 2**e``. With ``prescale = 3/4`` the scaled magnitudes are
``< 0.75 * 8 = 6``: stochastic rounding never clips, so ``E[out] = prescale * x`` exactly and the caller
undoes the prescale (Quartet: ``16/9`` after a product of two such operands).
``x / 2**e`` is computed exactly (``torch.ldexp``), the prescale product is one float32 rounding.
Blocks holding NaN or +-Inf give NaN; an all-zero block gives zeros.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .core import E2M1_MAX, MXFP4_BLOCK, mx_exponent

SR_PRESCALE = 0.75


def e2m1_stochastic_round(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """float32 ``v`` (|v| <= 6), uniform ``u`` in [0, 1) -> E2M1 value (float32), unbiased.

    Picks one of the two neighbouring E2M1 values with probability by distance (see module doc).
    """
    v = v.float()
    a = torch.clamp(v.abs(), max=E2M1_MAX)
    q = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    t = a / q  # exact: q is a power of two
    lo = torch.floor(t)
    frac = t - lo  # exact
    r = (lo + (u < frac).to(t.dtype)) * q
    r = torch.where(torch.isnan(v), v, r)
    return torch.where(torch.signbit(v), -r, r)


class SRBlocks(NamedTuple):
    values: torch.Tensor  # float32, dequantized: SR(prescale * x / 2**e) * 2**e, x's shape
    exponents: torch.Tensor  # int32, one per block of 32 along dim (dim moved last)


def sr_quantize_mxfp4(x: torch.Tensor, dim: int = -1, *, generator: torch.Generator | None = None,
                      prescale: float = SR_PRESCALE, noise: torch.Tensor | None = None) -> SRBlocks:
    """Stochastically round ``prescale * x`` to MXFP4 (blocks of 32 along ``dim``, "floor" scales).

    ``noise``: optional uniform [0, 1) float32 tensor of x's shape (tests and kernels use it to
    reproduce a draw); by default ``torch.rand(x.shape, generator=generator)`` on x's device.
    Returns the dequantized values (float32) and the block exponents.
    """
    d = dim % x.dim()
    L = x.shape[d]
    if L % MXFP4_BLOCK:
        raise ValueError(f"x.shape[dim]={L} must be a multiple of {MXFP4_BLOCK}")
    if not 0.0 < prescale <= 0.75:
        raise ValueError(f"prescale must be in (0, 0.75] so that rounding never clips, got {prescale}")
    if noise is None:
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    xt = x.float().movedim(d, -1)
    ut = noise.float().movedim(d, -1)
    xb = xt.reshape(*xt.shape[:-1], L // MXFP4_BLOCK, MXFP4_BLOCK)
    ub = ut.reshape(xb.shape)
    finite = torch.isfinite(xb)
    amax = torch.where(finite, xb.abs(), torch.zeros_like(xb)).amax(dim=-1)
    e = mx_exponent(amax, "floor")
    v = torch.ldexp(xb, -e.unsqueeze(-1)) * prescale
    r = torch.ldexp(e2m1_stochastic_round(v, ub), e.unsqueeze(-1))
    bad = ~finite.all(dim=-1, keepdim=True)
    r = torch.where(bad, torch.full_like(r, float("nan")), r)
    out = r.reshape(xt.shape).movedim(-1, d)
    return SRBlocks(out, e)
