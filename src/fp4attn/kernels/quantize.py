"""Triton kernels for NVFP4 / MXFP4 ``quantize``, ``fake_quantize`` and ``dequantize`` (SPEC §2).

Bit-exact with :func:`fp4attn.formats.core.quantize_reference` / ``fake_quantize_values``: same packed
bytes, same scale bytes, same global decode scale, same NaN / zero / subnormal / saturated blocks.
The public entry points are in :mod:`fp4attn.ops.quantize` (validation, dispatch, straight-through
gradient); the functions here take an already normalized, non-negative ``dim``.

Layouts. ``x`` is viewed as ``(P, L, Q)`` with ``L`` the quantized dim (``P`` = product of the dims
before it, ``Q`` of the dims after it).

* ``Q == 1`` (quantized dim last): the "rows" kernel reads each pair of neighbours as one machine word
  (two bf16/fp16 in an int32, two fp32 in an int64), so the even element (low nibble) and the odd
  element (high nibble) arrive in separate registers without any shuffle, and every program writes
  whole packed bytes and whole scale rows.
* ``Q > 1`` (e.g. V quantized along tokens, ``dim=-2``): the "cols" kernel reads strided tiles
  ``(blocks, Q-columns, pairs)`` in place, coalesced along the contiguous ``Q`` axis; no
  ``movedim().contiguous()`` copy of the input.

How the E2M1 code of ``x / s`` is computed (``FAST``, the default): MXFP4 scales are powers of two, so
``x * 2**-e`` is the exact quotient; an NVFP4 divisor (the E4M3 scale, or ``s / S_enc`` with a global scale)
gets one reciprocal per block and the IEEE quotient of each value from it
(``formats.triton_helpers.e2m1_code_div``: Markstein's correction -- checked against ``div_rn`` on every
E4M3 scale; for a general divisor it is ``div_rn``'s own fast path, used for divisors in [2^-96, 2^96]). With
``FAST=False``, and in a tile with a global-scale divisor outside that range, the kernels divide with
``tl.math.div_rn`` and round with the shared ``e2m1_code`` helper.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ..formats import core
from ..formats.core import FP4Tensor
from ..formats.triton_helpers import (
    block_amax,
    block_bad,
    e2m1_code,
    e2m1_code_div,
    e2m1_code_i32,
    e2m1_decode,
    e2m1_recip,
    e4m3_round,
    e4m3_to_bits,
    exp2i,
    finite_abs_bits,
    mx_exponent,
    nvfp4_scale,
)
from ._launch import cdiv, next_pow2
from ._launch import fast as fast_launch  # (this module's _launch takes a ``fast`` flag)

__all__ = ["quantize", "fake_quantize", "dequantize"]

# load modes of the rows kernel
_LOAD_ELEM = 0  # one element per load (any dtype, odd lengths)
_LOAD_BF16W = 1  # two bf16 per int32 word
_LOAD_F16W = 2  # two fp16 per int32 word
_LOAD_F32W = 3  # two fp32 per int64 word

_DT_F32 = 0
_DT_F16 = 1
_DT_BF16 = 2


# ------------------------------------------------------------------------------------------------
# Device helpers (bit plumbing only; all rounding comes from fp4attn.formats.triton_helpers)
# ------------------------------------------------------------------------------------------------
@triton.jit
def _e4m3_value(b):
    """float8_e4m3fn byte (int32) -> float32 value (0x7F / 0xFF -> NaN)."""
    e = (b >> 3) & 15
    m = b & 7
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, (m + 8).to(tl.float32) * exp2i(e - 10))
    mag = tl.where((b & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where((b & 0x80) != 0, -mag, mag)


@triton.jit
def _bf16_bits(v):
    """float32 -> bfloat16 bits (int32 in [0, 0xFFFF]), round to nearest even, NaN kept NaN.

    Done on the bits because the Triton interpreter truncates float32 -> bfloat16 casts.
    """
    b = v.to(tl.int32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where(v != v, 0x7FC0, r)
    return r & 0xFFFF


@triton.jit
def _out_bits16(v, OUT_DT: tl.constexpr):
    """float32 -> 16-bit pattern (int32, low half) of the output dtype (fp16 or bf16)."""
    if OUT_DT == 2:
        return _bf16_bits(v)
    else:
        return v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _block_scale(amax, senc, IS_MX: tl.constexpr, FLOOR: tl.constexpr, GLOBAL: tl.constexpr):
    """Finite block amax -> (s: float32 scale value, sbyte: int32 stored byte, inv: float32 2**-e
    for MXFP4 (a normal number, e <= 126 for finite amax), unused for NVFP4)."""
    if IS_MX:
        e = mx_exponent(amax, FLOOR)
        return exp2i(e), e + 127, exp2i(-e)
    else:
        if GLOBAL:
            s = e4m3_round(tl.math.div_rn(amax, 6.0) * senc)  # (a quotient below 2^-126 matters here)
        else:
            s = nvfp4_scale(amax)
        return s, e4m3_to_bits(s), s


# Global-scale divisors s_b / S_enc outside [2^-96, 2^96] (tensors of extreme magnitude) take the division
_DIV_LO = tl.constexpr(2.0 ** -96)
_DIV_HI = tl.constexpr(2.0 ** 96)


@triton.jit
def _recip(s, denom, IS_MX: tl.constexpr, GLOBAL: tl.constexpr, FAST: tl.constexpr):
    """(y, m8, slow) for NVFP4: ``e2m1_recip(denom)``, and whether the tile divides with ``div_rn`` instead
    (``slow``: FAST=False, or a block with a global-scale divisor outside ``div_rn_by``'s range). MXFP4: unused
    zeros."""
    if FAST and not IS_MX:
        y, m8 = e2m1_recip(denom)
        slow = False
        if GLOBAL:  # (s > 0: a divisor that underflows to 0 divides too, as the reference's x / 0)
            odd = (s > 0) & ((denom < _DIV_LO) | (denom > _DIV_HI))
            slow = tl.max(tl.ravel(odd.to(tl.int32)), axis=0) > 0
        return y, m8, slow
    else:
        return tl.zeros(s.shape, tl.float32), tl.zeros(s.shape, tl.int32), not IS_MX


@triton.jit
def _encode(x, s, inv, denom, y, m8, any_bad, slow, IS_MX: tl.constexpr, GLOBAL: tl.constexpr,
            FAST: tl.constexpr):
    """E2M1 code (int32, sign in bit 3; bits above the low nibble are not cleared) of x / scale, exactly as
    the reference; ``s``/``inv``/``denom``/``y``/``m8`` broadcast against x (see _block_scale, ``_recip``)."""
    xb = x.to(tl.int32, bitcast=True)
    a = xb & 0x7FFFFFFF
    if IS_MX:
        if FAST:
            # x * 2**-e is exact (= the reference's x / 2**e); compare with the constant points
            c = e2m1_code_i32(x * inv)
        else:
            c = e2m1_code(x * inv).to(tl.int32)
    else:
        if slow:  # a block whose scale rounds to 0 stores codes 0 (as the reference)
            c = tl.where(s > 0, e2m1_code(tl.math.div_rn(x, denom)).to(tl.int32), 0)
        else:
            c = e2m1_code_div(x, denom, y, m8)  # (scale 0: y = m8 = 0 give codes 0)
    if FAST:
        if any_bad:  # NaN encodes as +0 (Inf is +-6, code 7 with its sign, as in the reference, but 0 in a
            # block whose scale is 0, where e2m1_code_div gives inf * 0 = NaN a code of magnitude 7)
            c = tl.where((a <= 0x7F800000) & (s > 0), c, 0)
    return c


@triton.jit
def _quant_pair(lo, hi, senc, IS_MX: tl.constexpr, FLOOR: tl.constexpr, GLOBAL: tl.constexpr,
                FAST: tl.constexpr):
    """Quantize a 3-D float32 tile given as its even (``lo``) and odd (``hi``) elements, blocks along
    the last axis (each block = BS/2 pairs).

    Returns (code_lo, code_hi) int32 E2M1 codes with sign bit 3, ``s`` (float32 block scale value
    before the global decode factor; NaN for blocks holding NaN/Inf) and ``sbyte`` (int32 stored
    scale byte), both of the tile's shape without its last axis.
    """
    if FAST:
        # max of |bits|: NaN and Inf have the largest bit patterns, so one integer max finds both
        # the block amax and whether the block is bad; tiles without a bad block skip the rest.
        alo = lo.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        ahi = hi.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        amax_b = tl.max(tl.maximum(alo, ahi), axis=2)
        bad = amax_b >= 0x7F800000
        any_bad = tl.max(tl.max(bad.to(tl.int32), axis=1), axis=0) > 0
        if any_bad:
            amax_b = tl.max(tl.maximum(finite_abs_bits(alo), finite_abs_bits(ahi)), axis=2)
        amax = amax_b.to(tl.float32, bitcast=True)
    else:
        amax = tl.maximum(block_amax(lo), block_amax(hi))
        bad = tl.maximum(block_bad(lo), block_bad(hi)) != 0
        any_bad = False
    s, sbyte, inv = _block_scale(amax, senc, IS_MX, FLOOR, GLOBAL)
    s3 = s[:, :, None]
    inv3 = inv[:, :, None]
    denom3 = s3
    if GLOBAL:
        denom3 = tl.math.div_rn(s, senc)[:, :, None]
    y, m8, slow = _recip(s3, denom3, IS_MX, GLOBAL, FAST)
    clo = _encode(lo, s3, inv3, denom3, y, m8, any_bad, slow, IS_MX, GLOBAL, FAST)
    chi = _encode(hi, s3, inv3, denom3, y, m8, any_bad, slow, IS_MX, GLOBAL, FAST)
    if IS_MX:
        sbyte = tl.where(bad, 255, sbyte)
    else:
        sbyte = tl.where(bad, 0x7F, sbyte)
    s = tl.where(bad, float("nan"), s)
    return clo, chi, s, sbyte


@triton.jit
def _dequant_pair(clo, chi, s, gdec, GLOBAL: tl.constexpr):
    """Fake-quantized values of a (code_lo, code_hi) tile pair: (code · block scale) first — an exact
    product — then the global decode factor ``gdec``, as the reference does."""
    d3 = s[:, :, None]
    vlo = e2m1_decode(clo) * d3
    vhi = e2m1_decode(chi) * d3
    if GLOBAL:
        vlo = vlo * gdec
        vhi = vhi * gdec
    return vlo, vhi


@triton.jit
def _global_scales(amax_ptr, decg_ptr, GLOBAL: tl.constexpr):
    """(S_enc, 1/S_enc) from the tensor's finite amax (float32 bits at amax_ptr, by ``_amax_kernel``), the same
    IEEE operations as ``core.global_encode_scale``: 2688 / amax, 1 when amax is 0, at most the float32 max.
    Program 0 stores 1/S_enc at decg_ptr (the FP4Tensor's ``global_scale``): no PyTorch scalar ops between the
    amax pass and the quantize pass. (1, 1) without a global scale."""
    if GLOBAL:
        amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
        senc = tl.minimum(tl.where(amax > 0, tl.math.div_rn(2688.0, amax), 1.0), 3.4028234663852886e38)
        dec = tl.math.div_rn(1.0, senc)
        if tl.program_id(0) == 0:
            tl.store(decg_ptr, dec)
        return senc, dec
    else:
        return 1.0, 1.0


# ------------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------------
@triton.jit
def _rows_kernel(x_ptr, data_ptr, scale_ptr, out_ptr, amax_ptr, decg_ptr,
                 M, L, LP, NBLK, n_kt,
                 BS: tl.constexpr, BM: tl.constexpr, NB: tl.constexpr, LOAD: tl.constexpr,
                 IN_DT: tl.constexpr, OUT_DT: tl.constexpr, FAKE: tl.constexpr, IS_MX: tl.constexpr,
                 FLOOR: tl.constexpr, GLOBAL: tl.constexpr, FAST: tl.constexpr):
    """x: (M, L) contiguous, quantized along L (LP = ceil(L/2) pairs per row, passed separately so
    that its divisibility is known and the loads/stores vectorize). Program = BM rows x NB blocks."""
    H: tl.constexpr = BS // 2
    pid = tl.program_id(0)
    pid_m = pid // n_kt
    pid_k = pid % n_kt
    rows2 = pid_m * BM + tl.arange(0, BM)[:, None]  # (BM, 1)
    blks2 = pid_k * NB + tl.arange(0, NB)[None, :]  # (1, NB)
    rows = rows2[:, :, None].to(tl.int64)
    pair = blks2[:, :, None] * H + tl.arange(0, H)[None, None, :]  # pair index within the row
    mask = (rows < M) & (pair < LP)
    if LOAD == 1:
        w = tl.load(x_ptr + rows * LP + pair, mask=mask, other=0)
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    elif LOAD == 2:
        w = tl.load(x_ptr + rows * LP + pair, mask=mask, other=0)
        lo = (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    elif LOAD == 3:
        w = tl.load(x_ptr + rows * LP + pair, mask=mask, other=0)
        lo = w.to(tl.int32).to(tl.float32, bitcast=True)
        hi = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        e0 = 2 * pair
        m1 = mask & (e0 + 1 < L)
        if IN_DT == 2:  # bf16 read as int16 bits (exact widening)
            lo = (tl.load(x_ptr + rows * L + e0, mask=mask, other=0).to(tl.int32) << 16).to(
                tl.float32, bitcast=True)
            hi = (tl.load(x_ptr + rows * L + e0 + 1, mask=m1, other=0).to(tl.int32) << 16).to(
                tl.float32, bitcast=True)
        else:
            lo = tl.load(x_ptr + rows * L + e0, mask=mask, other=0).to(tl.float32)
            hi = tl.load(x_ptr + rows * L + e0 + 1, mask=m1, other=0).to(tl.float32)

    senc, gdec = _global_scales(amax_ptr, decg_ptr, GLOBAL)
    clo, chi, s, sbyte = _quant_pair(lo, hi, senc, IS_MX, FLOOR, GLOBAL, FAST)

    if FAKE:
        vlo, vhi = _dequant_pair(clo, chi, s, gdec, GLOBAL)
        if LOAD == 3:
            wlo = vlo.to(tl.uint32, bitcast=True).to(tl.int64)
            whi = vhi.to(tl.int32, bitcast=True).to(tl.int64) << 32
            tl.store(out_ptr + rows * LP + pair, wlo | whi, mask=mask)
        elif LOAD != 0:
            word = _out_bits16(vlo, OUT_DT) | (_out_bits16(vhi, OUT_DT) << 16)
            tl.store(out_ptr + rows * LP + pair, word, mask=mask)
        else:
            e0 = 2 * pair
            m1 = mask & (e0 + 1 < L)
            if OUT_DT == 0:
                tl.store(out_ptr + rows * L + e0, vlo, mask=mask)
                tl.store(out_ptr + rows * L + e0 + 1, vhi, mask=m1)
            else:
                tl.store(out_ptr + rows * L + e0, _out_bits16(vlo, OUT_DT).to(tl.int16), mask=mask)
                tl.store(out_ptr + rows * L + e0 + 1, _out_bits16(vhi, OUT_DT).to(tl.int16), mask=m1)
    else:
        byte = (clo | (chi << 4)).to(tl.uint8)
        tl.store(data_ptr + rows * LP + pair, byte, mask=mask)
        smask = (rows2 < M) & (blks2 < NBLK)
        tl.store(scale_ptr + rows2.to(tl.int64) * NBLK + blks2, sbyte.to(tl.uint8), mask=smask)


@triton.jit
def _cols_kernel(x_ptr, data_ptr, scale_ptr, out_ptr, amax_ptr, decg_ptr,
                 L, Q, NBLK, n_qt, n_bt,
                 BS: tl.constexpr, NB: tl.constexpr, BQ: tl.constexpr,
                 IN_DT: tl.constexpr, OUT_DT: tl.constexpr, FAKE: tl.constexpr, IS_MX: tl.constexpr,
                 FLOOR: tl.constexpr, GLOBAL: tl.constexpr, FAST: tl.constexpr):
    """x: (P, L, Q) contiguous, Q > 1, quantized along L. Program = one p, NB blocks x BQ columns;
    tiles are (NB, BQ, BS/2) so that the block axis is last and the loads run along Q."""
    H: tl.constexpr = BS // 2
    pid = tl.program_id(0)
    pid_q = pid % n_qt
    pid_b = (pid // n_qt) % n_bt
    p = (pid // (n_qt * n_bt)).to(tl.int64)
    blks2 = pid_b * NB + tl.arange(0, NB)[:, None]  # (NB, 1)
    qs2 = pid_q * BQ + tl.arange(0, BQ)[None, :]  # (1, BQ)
    blks = blks2[:, :, None]
    qs = qs2[:, :, None]
    hh = tl.arange(0, H)[None, None, :]
    l0 = blks * BS + 2 * hh  # even element along L
    base = p * L * Q
    qmask = (blks < NBLK) & (qs < Q)
    m0 = qmask & (l0 < L)
    m1 = qmask & (l0 + 1 < L)
    off0 = base + l0.to(tl.int64) * Q + qs
    if IN_DT == 2:
        lo = (tl.load(x_ptr + off0, mask=m0, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        hi = (tl.load(x_ptr + off0 + Q, mask=m1, other=0).to(tl.int32) << 16).to(tl.float32,
                                                                                 bitcast=True)
    else:
        lo = tl.load(x_ptr + off0, mask=m0, other=0).to(tl.float32)
        hi = tl.load(x_ptr + off0 + Q, mask=m1, other=0).to(tl.float32)

    senc, gdec = _global_scales(amax_ptr, decg_ptr, GLOBAL)
    clo, chi, s, sbyte = _quant_pair(lo, hi, senc, IS_MX, FLOOR, GLOBAL, FAST)

    if FAKE:
        vlo, vhi = _dequant_pair(clo, chi, s, gdec, GLOBAL)
        if OUT_DT == 0:
            tl.store(out_ptr + off0, vlo, mask=m0)
            tl.store(out_ptr + off0 + Q, vhi, mask=m1)
        else:
            tl.store(out_ptr + off0, _out_bits16(vlo, OUT_DT).to(tl.int16), mask=m0)
            tl.store(out_ptr + off0 + Q, _out_bits16(vhi, OUT_DT).to(tl.int16), mask=m1)
    else:
        byte = (clo | (chi << 4)).to(tl.uint8)
        doff = p * (L // 2) * Q + (blks * H + hh).to(tl.int64) * Q + qs
        tl.store(data_ptr + doff, byte, mask=m0)
        soff = p * NBLK * Q + blks2.to(tl.int64) * Q + qs2
        tl.store(scale_ptr + soff, sbyte.to(tl.uint8), mask=(blks2 < NBLK) & (qs2 < Q))


@triton.jit
def _load_f32(ptr, mask, IN_DT: tl.constexpr):
    if IN_DT == 2:  # bf16 stored as int16 bits: exact widening
        return (tl.load(ptr, mask=mask, other=0).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr, mask=mask, other=0).to(tl.float32)


@triton.jit
def _store_out(ptr, v, mask, OUT_DT: tl.constexpr):
    if OUT_DT == 0:
        tl.store(ptr, v, mask=mask)
    else:
        tl.store(ptr, _out_bits16(v, OUT_DT).to(tl.int16), mask=mask)


@triton.jit
def _cols_loop_kernel(x_ptr, data_ptr, scale_ptr, out_ptr, amax_ptr, decg_ptr,
                      L, Q, NBLK, n_qt, n_bt,
                      BS: tl.constexpr, NB: tl.constexpr, BQ: tl.constexpr,
                      IN_DT: tl.constexpr, OUT_DT: tl.constexpr, FAKE: tl.constexpr, IS_MX: tl.constexpr,
                      FLOOR: tl.constexpr, GLOBAL: tl.constexpr, FAST: tl.constexpr):
    """As _cols_kernel with 2-D (NB, BQ) tiles: the BS rows of each block are visited by an unrolled
    loop (amax = elementwise max, no cross-thread reduction), then read again (from cache) to encode."""
    H: tl.constexpr = BS // 2
    pid = tl.program_id(0)
    pid_q = pid % n_qt
    pid_b = (pid // n_qt) % n_bt
    p = (pid // (n_qt * n_bt)).to(tl.int64)
    blks = pid_b * NB + tl.arange(0, NB)[:, None]  # (NB, 1)
    qs = pid_q * BQ + tl.arange(0, BQ)[None, :]  # (1, BQ)
    qmask = (blks < NBLK) & (qs < Q)
    base = p * L * Q + qs  # element offsets
    amax_b = tl.zeros((NB, BQ), dtype=tl.int32)
    amax_f = tl.zeros((NB, BQ), dtype=tl.int32)
    for h in tl.static_range(BS):
        l = blks * BS + h
        a = _load_f32(x_ptr + base + l.to(tl.int64) * Q, qmask & (l < L), IN_DT).to(tl.int32, bitcast=True)
        a = a & 0x7FFFFFFF
        amax_b = tl.maximum(amax_b, a)
        if not FAST:
            amax_f = tl.maximum(amax_f, finite_abs_bits(a))
    bad = amax_b >= 0x7F800000
    any_bad = tl.max(tl.max(bad.to(tl.int32), axis=1), axis=0) > 0
    if FAST:
        amax_f = amax_b
        if any_bad:
            amax_f = tl.zeros((NB, BQ), dtype=tl.int32)
            for h in tl.static_range(BS):
                l = blks * BS + h
                a = _load_f32(x_ptr + base + l.to(tl.int64) * Q, qmask & (l < L), IN_DT).to(tl.int32, bitcast=True)
                amax_f = tl.maximum(amax_f, finite_abs_bits(a))
    amax = amax_f.to(tl.float32, bitcast=True)
    senc, gdec = _global_scales(amax_ptr, decg_ptr, GLOBAL)
    s, sbyte, inv = _block_scale(amax, senc, IS_MX, FLOOR, GLOBAL)
    denom = s
    if GLOBAL:
        denom = tl.math.div_rn(s, senc)
    y, m8, slow = _recip(s, denom, IS_MX, GLOBAL, FAST)
    snan = tl.where(bad, float("nan"), s)
    if FAKE:
        for h in tl.static_range(BS):
            l = blks * BS + h
            m = qmask & (l < L)
            off = base + l.to(tl.int64) * Q
            c = _encode(_load_f32(x_ptr + off, m, IN_DT), s, inv, denom, y, m8, any_bad,
                        slow, IS_MX, GLOBAL, FAST)
            v = e2m1_decode(c) * snan
            if GLOBAL:
                v = v * gdec
            _store_out(out_ptr + off, v, m, OUT_DT)
    else:
        for h in tl.static_range(H):
            l = blks * BS + 2 * h
            m = qmask & (l < L)
            off = base + l.to(tl.int64) * Q
            clo = _encode(_load_f32(x_ptr + off, m, IN_DT), s, inv, denom, y, m8, any_bad,
                          slow, IS_MX, GLOBAL, FAST)
            chi = _encode(_load_f32(x_ptr + off + Q, m, IN_DT), s, inv, denom, y, m8,
                          any_bad, slow, IS_MX, GLOBAL, FAST)
            doff = p * (L // 2) * Q + (blks * H + h).to(tl.int64) * Q + qs
            tl.store(data_ptr + doff, (clo | (chi << 4)).to(tl.uint8), mask=m)
        if IS_MX:
            sbyte = tl.where(bad, 255, sbyte)
        else:
            sbyte = tl.where(bad, 0x7F, sbyte)
        soff = p * NBLK * Q + blks.to(tl.int64) * Q + qs
        tl.store(scale_ptr + soff, sbyte.to(tl.uint8), mask=qmask)


@triton.jit
def _amax_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr, IN_DT: tl.constexpr):
    """Max |x| over the finite elements, as float32 bits, atomically max-ed into out_ptr[0] (int32)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    if IN_DT == 2:
        v = tl.load(x_ptr + offs, mask=m, other=0).to(tl.int32) << 16
    else:
        v = tl.load(x_ptr + offs, mask=m, other=0).to(tl.float32).to(tl.int32, bitcast=True)
    tl.atomic_max(out_ptr, tl.max(finite_abs_bits(v), axis=0))


@triton.jit
def _dequant_kernel(data_ptr, scale_ptr, decg_ptr, out_ptr, N, L, Q, NBLK,
                    BLOCK: tl.constexpr, BS: tl.constexpr, IS_MX: tl.constexpr, GLOBAL: tl.constexpr,
                    OUT_DT: tl.constexpr):
    """One program = BLOCK packed bytes (flat index over data (P, L/2, Q)); writes 2 elements each."""
    H: tl.constexpr = BS // 2
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    q = i % Q
    j = (i // Q) % (L // 2)
    p = i // (Q * (L // 2))
    byte = tl.load(data_ptr + i, mask=m, other=0).to(tl.int32)
    sb = tl.load(scale_ptr + (p * NBLK + j // H) * Q + q, mask=m, other=0).to(tl.int32)
    if IS_MX:
        s = tl.where(sb == 255, float("nan"), exp2i(sb - 127))
    else:
        s = _e4m3_value(sb)
    vlo = e2m1_decode(byte & 15) * s
    vhi = e2m1_decode(byte >> 4) * s
    if GLOBAL:  # after the exact code*scale product, as the reference
        g = tl.load(decg_ptr)
        vlo = vlo * g
        vhi = vhi * g
    o0 = (p * L + 2 * j) * Q + q
    if OUT_DT == 0:
        tl.store(out_ptr + o0, vlo, mask=m)
        tl.store(out_ptr + o0 + Q, vhi, mask=m)
    else:
        tl.store(out_ptr + o0, _out_bits16(vlo, OUT_DT).to(tl.int16), mask=m)
        tl.store(out_ptr + o0 + Q, _out_bits16(vhi, OUT_DT).to(tl.int16), mask=m)


# ------------------------------------------------------------------------------------------------
# Python wrappers
# ------------------------------------------------------------------------------------------------
_ROWS_CFG = {"BM": 2, "NB": 64, "num_warps": 4}  # best of the bench sweep on H200 (bf16, 1 GiB)
_COLS_CFG = {"NB": 2, "BQ": 256, "num_warps": 4, "loop": True}
_FAST = True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_device(x: torch.Tensor) -> None:
    if not x.is_cuda and not _interpreting():
        raise RuntimeError("fp4attn.kernels.quantize runs on CUDA tensors (or on CPU tensors under "
                           "TRITON_INTERPRET=1); use fp4attn.formats.core for the PyTorch path")


def _in_dt(dtype: torch.dtype) -> int:
    return {torch.float32: _DT_F32, torch.float16: _DT_F16, torch.bfloat16: _DT_BF16}[dtype]


def _prep(x: torch.Tensor) -> torch.Tensor:
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        x = x.float()  # float64 and others: the reference rounds them to float32 first
    return x.contiguous()


def _kernel_view(x: torch.Tensor) -> torch.Tensor:
    """x with bf16 reinterpreted as int16 (its bits are widened in the kernel)."""
    return x.view(torch.int16) if x.dtype == torch.bfloat16 else x


def _global_amax(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(amax, dec): x's largest finite |value| as float32 bits in an int32 (one Triton reduction), and the 0-d
    float32 tensor that the quantize kernel fills with the global decode scale 1/S_enc (``_global_scales``)."""
    amax = torch.zeros(1, dtype=torch.int32, device=x.device)
    n = x.numel()
    if n:
        BLOCK = 8192
        fast_launch(_amax_kernel)[(cdiv(n, BLOCK),)](_kernel_view(x).reshape(-1), amax, n, BLOCK=BLOCK,
                                                              IN_DT=_in_dt(x.dtype), num_warps=8)
    return amax, torch.empty((), dtype=torch.float32, device=x.device)


def _launch(x, fmt, dim, scale_mode, global_scale, fake, *, rows_cfg=None, cols_cfg=None, fast=None):
    """Run the quantize (fake=False) or fake-quantize (fake=True) kernel on a prepared x."""
    bs = core.block_size(fmt)
    is_mx = fmt == "mxfp4"
    floor = scale_mode == "floor"
    fast = _FAST if fast is None else fast
    shape = x.shape
    L = shape[dim]
    P = math.prod(shape[:dim])
    Q = math.prod(shape[dim + 1:])
    nblk = cdiv(L, bs)
    dev = x.device

    if fake:
        out = torch.empty(shape, dtype=x.dtype, device=dev)
        data = scales = None
    else:
        out = None
        dshape = list(shape)
        dshape[dim] = L // 2
        sshape = list(shape)
        sshape[dim] = L // bs
        data = torch.empty(dshape, dtype=torch.uint8, device=dev)
        scales = torch.empty(sshape, dtype=torch.uint8, device=dev)

    if global_scale:
        amax, dec_g = _global_amax(x)
    else:
        amax = dec_g = None
    if x.numel() == 0:
        return out, data, scales, None if dec_g is None else dec_g.fill_(1.0)  # (amax 0: S_enc = 1)

    in_dt = _in_dt(x.dtype)
    dummy = torch.empty(1, dtype=torch.uint8, device=dev)
    amax_arg = amax if global_scale else dummy
    decg_arg = dec_g if global_scale else dummy
    common = dict(BS=bs, IN_DT=in_dt, OUT_DT=in_dt, FAKE=fake, IS_MX=is_mx, FLOOR=floor,
                  GLOBAL=global_scale, FAST=fast)
    if Q == 1:
        cfg = dict(_ROWS_CFG, **(rows_cfg or {}))
        M = P
        words_ok = L % 2 == 0 and x.data_ptr() % (2 * x.element_size()) == 0
        if words_ok:
            load = {torch.bfloat16: _LOAD_BF16W, torch.float16: _LOAD_F16W,
                    torch.float32: _LOAD_F32W}[x.dtype]
            wdt = torch.int64 if x.dtype == torch.float32 else torch.int32
            # flat first: Tensor.view(dtype) needs an even last dim, and the row may run along a
            # leading dim (e.g. x of shape (L, 1) quantized along dim 0)
            xk = x.reshape(-1).view(wdt)
            ok = out.reshape(-1).view(wdt) if fake else dummy
        else:
            load = _LOAD_ELEM
            xk = _kernel_view(x)
            ok = (out.view(torch.int16) if x.dtype != torch.float32 else out) if fake else dummy
        # short rows (e.g. Q/K along a head dim of 64-128): fewer blocks per row, more rows per tile
        NB = min(cfg["NB"], next_pow2(nblk))
        BM = min(cfg["BM"] * (cfg["NB"] // NB), 64, max(1, next_pow2(M)))
        n_kt = cdiv(nblk, NB)
        grid = (cdiv(M, BM) * n_kt,)
        fast_launch(_rows_kernel)[grid](xk, data if data is not None else dummy,
                                        scales if scales is not None else dummy, ok, amax_arg, decg_arg,
                                        M, L, (L + 1) // 2, nblk, n_kt, BM=BM, NB=NB, LOAD=load,
                                        num_warps=cfg["num_warps"], **common)
    else:
        cfg = dict(_COLS_CFG, **(cols_cfg or {}))
        xk = _kernel_view(x)
        ok = (out.view(torch.int16) if x.dtype != torch.float32 else out) if fake else dummy
        # narrow Q (e.g. V along tokens with a head dim of 64-128): fewer columns, more blocks per tile
        BQ = min(cfg["BQ"], max(16, next_pow2(Q)))
        NB = min(cfg["NB"] * (cfg["BQ"] // BQ), 16, next_pow2(nblk))
        n_qt = cdiv(Q, BQ)
        n_bt = cdiv(nblk, NB)
        grid = (P * n_bt * n_qt,)
        kern = _cols_loop_kernel if cfg.get("loop", True) else _cols_kernel
        fast_launch(kern)[grid](xk, data if data is not None else dummy,
                                scales if scales is not None else dummy, ok, amax_arg, decg_arg,
                                L, Q, nblk, n_qt, n_bt, NB=NB, BQ=BQ, num_warps=cfg["num_warps"],
                                **common)
    return out, data, scales, dec_g


def quantize(x: torch.Tensor, fmt: str = "nvfp4", dim: int = -1, *, scale_mode: str = "rceil",
             global_scale: bool = False) -> FP4Tensor:
    """Triton :func:`fp4attn.quantize`: bit-exact with ``core.quantize_reference``."""
    core._check_x(x)
    core._check_fmt(fmt, scale_mode, global_scale)
    _check_device(x)
    d = core._norm_dim(dim, x.dim())
    bs = core.block_size(fmt)
    if x.shape[d] % bs:
        raise ValueError(f"x.shape[dim]={x.shape[d]} must be a multiple of the {fmt} block size {bs} "
                         "(fake_quantize pads; quantize does not)")
    xp = _prep(x.detach())
    _, data, scales, dec_g = _launch(xp, fmt, d, scale_mode, global_scale, fake=False)
    sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    return FP4Tensor(data, scales.view(sdt), dec_g, fmt, d, x.shape, x.dtype)


def fake_quantize(x: torch.Tensor, fmt: str = "nvfp4", dim: int = -1, *, scale_mode: str = "rceil",
                  global_scale: bool = False) -> torch.Tensor:
    """Triton ``quantize(x).dequantize()`` in x's shape and dtype (``dim`` zero-padded); no autograd.

    Bit-exact with ``core.fake_quantize_values(x, ...).to(x.dtype)``.
    """
    core._check_x(x)
    core._check_fmt(fmt, scale_mode, global_scale)
    _check_device(x)
    d = core._norm_dim(dim, x.dim())
    xp = _prep(x.detach())
    out, _, _, _ = _launch(xp, fmt, d, scale_mode, global_scale, fake=True)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def dequantize(t: FP4Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Triton ``FP4Tensor.dequantize``: ``(code * scale) (* global decode scale)`` cast to ``dtype``."""
    _check_device(t.data)
    out_dtype = dtype if dtype in (torch.float32, torch.float16, torch.bfloat16) else torch.float32
    shape = t.shape
    d = t.dim
    L = shape[d]
    Q = math.prod(shape[d + 1:])
    out = torch.empty(shape, dtype=out_dtype, device=t.data.device)
    n = t.data.numel()
    if n:
        data = t.data.contiguous()
        scales = t.scales.contiguous().view(torch.uint8)
        glob = t.global_scale is not None
        decg = t.global_scale.float().reshape(1) if glob else data
        ot = out if out_dtype == torch.float32 else out.view(torch.int16)
        BLOCK = 1024
        fast_launch(_dequant_kernel)[(cdiv(n, BLOCK),)](
            data, scales, decg, ot, n, L, Q, L // t.block_size, BLOCK=BLOCK, BS=t.block_size,
            IS_MX=t.fmt == "mxfp4", GLOBAL=glob, OUT_DT=_in_dt(out_dtype), num_warps=4)
    return out if out_dtype == dtype else out.to(dtype)
