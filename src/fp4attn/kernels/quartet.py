"""Quartet on CUDA: fused Hadamard + QuEST / stochastic-rounding quantizers (Triton) and MXFP4 GEMMs
run exactly on FP8 tensor cores (``torch._scaled_mm``). Semantics: :mod:`fp4attn.reference.quartet`.

FP8 embedding of MXFP4 (how Hopper runs MXFP4 GEMMs without losing exactness)
  An MXFP4 value is ``c * 2**e`` with ``c`` in {0, 0.5, 1, 1.5, 2, 3, 4, 6} and one ``e`` per group of
  32. Per row r let ``E_r = max_g e_g`` and store ``c * 2**(e_g - E_r + 6)`` as FP8 E4M3 with the
  row scale ``2**(E_r - 6)`` (float32). The largest stored magnitude is ``6 * 2**6 = 384 <= 448``, and
  ``c`` has at most two significant bits (E4M3 has four), so a value is exact iff it is a multiple of
  E4M3's smallest subnormal 2**-9. **Exactness condition:** every group with ``e_g >= E_r - 14`` is
  represented exactly (its smallest non-zero value ``0.5 * 2**(e_g - E_r + 6) >= 2**-9``); all-zero
  groups are always exact. Values of groups more than 14 binades below their row's largest group are
  rounded to the E4M3 grid (to nearest, ties to even), i.e. underflow gradually. QuEST scales follow
  the group's standard deviation, so the condition is a group-to-group std ratio below 2**14 within
  one row of 32-groups (after the Hadamard rotation), which real activations and weights meet.
  ``fp8_embed`` / ``fp8_embedding_exact`` below state this in PyTorch and the tests check it at the
  boundary (14 exact, 15 not). The GEMM ``(A8 * ra) @ (B8 * rb)^T`` then equals the MXFP4 GEMM up to
  float32 accumulation (``use_fast_accum=False``), the row/column power-of-two scales are applied in
  float32 by ``_scaled_mm``'s row-wise scaling (or, where that is unavailable, after a float32 GEMM).

The forward (``QuartetLinearCUDA``) uses two variants of this embedding so that its GEMM is one
tensor-wise scaled ``_scaled_mm`` (cuBLAS's tensor-wise FP8 kernels ran 4-8% faster than its row-wise
ones on the H200) and the activation needs no second pass:
  * activation: **E5M2** (``quest_e5m2``). E5M2 holds ``c * 2**e`` exactly for e in [-15, 13] (its
    subnormals reach 2**-16, its largest value is 57344 >= 6 * 2**13), so values are written as they
    are (row scale 1) straight from the quantizer; rows with a non-zero group outside [-13, 13] are
    rewritten at offset E_r - 13 by a fix-up kernel (exact for groups with e >= E_r - 28).
  * weight: E4M3 at the **tensor offset** G (``quest_fp8(tensor_offset=True)``): rows whose non-zero
    groups all lie in [G - 14, G] use G, the others their own E_r (so the condition above is unchanged).
  * ``fp8_gemm_e5m2``: ``_scaled_mm(E5M2, E4M3, scale_a=1, scale_b=2**(G - 6))`` and a rescale of the
    output rows / columns of operands at their own offsets (powers of two: exact in the output dtype's
    normal range); it returns at once when there are none.
The backward's two GEMMs (E4M3 operands with row offsets) run unscaled and tensor-wise
(``fp8_gemm_raw``); ``_mask_ihadamard_kernel``, which reads every output element anyway, applies both
operands' power-of-two row scales (the same values as scaling inside the GEMM).

Kernels (all read and write uint8 for the E4M3 bytes; the GPU converts with the hardware E4M3
instructions, the interpreter with the bit-exact software forms). Each quantizer is two one-pass
kernels over independent (row, column) tiles: it first writes packed MXFP4 (E2M1 codes + E8M0 scale
bytes, also the Blackwell GEMM operand), then ``_mx_to_fp8_kernel`` turns them into the FP8 embedding
(every program reads its rows' scale bytes for the row maximum E_r, then converts its tile). The
input is read once and the Hadamard computed once (an earlier version made two passes over the input,
the first one only for E_r).
  * ``_quest_mxfp4_kernel``: per 32-group Hadamard as a 32x32 ``tl.dot``, QuEST scale, E2M1 codes,
    trust mask as one int32 word per group (bit i = element i).
  * ``_sr_mxfp4_kernel``: the backward operands. Reads any strided (R, L) view (dy, dy^T, or the saved
    FP8 operands transposed, scaled back by their row scales), random signs along L (Philox
    ``tl.randint(sign_seed, l)``, drawn once per step by ``backward_draws``), Hadamard, SR of 3/4 x with
    "floor" scales (16-bit uniforms, eight per Philox call: ``triton_stochastic.sr_uniform_bits``);
    L zero-padded to 32.
  * ``_mask_ihadamard_kernel``: the GEMM operands' row scales, ``16/9 *``, trust mask, inverse Hadamard,
    cast to the gradient dtype.
RNG: the per-backward seed of :class:`~fp4attn.reference.quartet.QuartetRNG` is split into six
sub-seeds (SplitMix64). Deterministic given the seed; a different stream from the CPU reference. The
seed, sub-seeds and sign vectors are computed on the device from the RNG's device state, which the same
kernel advances (``backward_draws``): a backward captured in a CUDA graph draws fresh noise per replay.
Both operands of a backward GEMM are quantized into one stacked buffer and converted in one launch
(``sr_fp8_pair``).

Native MXFP4 (Blackwell, compute capability >= 10; ``gemm_path``): ``_quest_mxfp4_kernel`` and
``_sr_mxfp4_kernel``'s packed E2M1 codes (element 2i in the low nibble, as ``FP4Tensor``) and E8M0
scale bytes are the operands as they are (no conversion), and ``_mxfp4_gemm_kernel`` multiplies them with
``tl.dot_scaled`` (lowered to ``tcgen05.mma ... kind::mxf4.block_scale`` on sm_100: compile-checked,
not run or timed here). The same signs and Philox draws as the FP8 path, so both paths agree up to
float32 accumulation order (tested on CPU with the GEMM emulated).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from ..formats.core import e2m1_decode as _e2m1_decode_torch
from ..formats.core import unpack_last
from ..formats.triton_helpers import (
    block_amax_bad,
    block_bad,
    e2m1_code_raw,
    e2m1_decode,
    e2m1_e5m2_byte,
    e2m1_words_e4m3,
    e4m3_decode_f16,
    e4m3_round,
    e4m3_to_bits,
    exp2i,
    mx_exponent,
    pack_nibbles,
    unpack_nibbles,
)
from ..formats.triton_stochastic import e2m1_sr_code, e2m1_sr_code_u16, sr_uniform_bits
from ..ops import _dispatch
from ..reference.quartet import QUEST_EPS, QUEST_STD_FACTOR, SR_RESCALE, _splitmix64, hadamard_matrix
from ._launch import cdiv, fast

__all__ = ["supported", "QuartetLinearCUDA", "quest_fp8", "sr_fp8", "mask_ihadamard", "fp8_gemm",
           "fp8_embed", "fp8_embedding_exact", "FP8_EXACT_RANGE", "quest_mxfp4", "sr_mxfp4", "mxfp4_gemm",
           "mxfp4_dequant", "gemm_path", "quantize_weight", "quest_e5m2", "fp8_gemm_e5m2", "e5m2_dequant",
           "e5m2_gemm_supported", "quartet_linear_cuda"]

FP8_EXACT_RANGE = 14  # groups with e >= rowmax(e) - 14 embed exactly in E4M3
_EXACT_RANGE = tl.constexpr(FP8_EXACT_RANGE)
_OFFSET = 6  # stored magnitudes <= 6 * 2**6 = 384
_INV_SQRT32 = 0.17677669529663687
_HDOT_F32, _HDOT_BF16, _HDOT_F16 = 0, 1, 2
# The interpreter (TRITON_INTERPRET=1) has no bf16/fp16 arithmetic for tl.dot: use the float32 dot there.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_QUEST_C = tl.constexpr(QUEST_STD_FACTOR)
_QUEST_EPS = tl.constexpr(QUEST_EPS)
_RSQRT32 = tl.constexpr(_INV_SQRT32)
# slots of the weight's tensor maximum (``_quest_mxfp4_kernel`` ROW_MAX 2): atomics spread over 64 lines
_TMAX_SLOTS = tl.constexpr(64)


# ----------------------------------------------------------------------------------------------
# PyTorch statement of the embedding (tests, CPU)
# ----------------------------------------------------------------------------------------------
def fp8_embed(values: torch.Tensor, exponents: torch.Tensor):
    """MXFP4 values (R, L) float32 with group exponents (R, L/32) -> (E4M3 tensor, float32 row scales).

    ``values ≈ fp8.float() * scale[:, None]``, exactly when :func:`fp8_embedding_exact` holds.
    """
    emax = exponents.amax(dim=1)
    rs = torch.ldexp(torch.ones(emax.shape, device=values.device), emax - _OFFSET)
    scaled = torch.ldexp(values.float(), (_OFFSET - emax).unsqueeze(1).expand(values.shape))
    return scaled.to(torch.float8_e4m3fn), rs


def fp8_embedding_exact(exponents: torch.Tensor, nonzero: torch.Tensor | None = None) -> torch.Tensor:
    """Per row: True when every (non-zero) group is within 14 binades of the row's largest exponent."""
    emax = exponents.amax(dim=1, keepdim=True)
    ok = exponents >= emax - FP8_EXACT_RANGE
    if nonzero is not None:
        ok = ok | ~nonzero
    return ok.all(dim=1)


# ----------------------------------------------------------------------------------------------
# Triton helpers
# ----------------------------------------------------------------------------------------------
@triton.jit
def _e4m3_bits(v):
    """float32 -> E4M3 bits (uint8): the shared ``e4m3_round`` (nearest, ties even, saturating at 448)
    and ``e4m3_to_bits`` on |v|, the sign bit copied; NaN -> 0x7F. The software form (interpreter,
    tests); GPUs use the hardware conversion (``_to_e4m3``)."""
    a = tl.abs(v)
    bits = tl.where(a != a, 0x7F, e4m3_to_bits(e4m3_round(a)))
    sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
    return (bits | (sign << 7)).to(tl.uint8)


@triton.jit
def _to_e4m3(v, HW: tl.constexpr):
    """``_e4m3_bits``; with HW the hardware conversion (sm_89+, ``cvt.rn.satfinite.e4m3x2.f32``: one
    instruction per two values, round to nearest even, NaN -> 0x7F/0xFF) -- the same bytes for the
    values the kernels produce (|v| <= 384), up to the sign bit of NaN."""
    if HW:
        return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        return _e4m3_bits(v)


@triton.jit
def _to_e5m2(v, HW: tl.constexpr):
    """float32 -> E5M2 bits (uint8), round to nearest even; finite |v| < 57344 (the fix-up kernel's
    values, at most 6 * 2**13). HW: the hardware conversion (``cvt.rn.satfinite.e5m2x2.f32``);
    otherwise through float16 (exact there for these values down to 2**-23, below which both give 0)
    and a round-to-nearest-even of its low byte."""
    if HW:
        return v.to(tl.float8e5).to(tl.uint8, bitcast=True)
    h = v.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    m = h & 0x7FFF
    r = (m + 0x7F + ((m >> 8) & 1)) >> 8
    return (r | ((h >> 8) & 0x80)).to(tl.uint8)


@triton.jit
def _e5m2_value(bits):
    """E5M2 bits (uint8) -> float32: the byte is the top half of a float16 (exact)."""
    return (bits.to(tl.int16) << 8).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_value(bits, HW: tl.constexpr):
    """E4M3 bits (uint8) -> float32 (HW: the hardware conversion, GPU only)."""
    if HW:
        return bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    mag = e4m3_decode_f16(bits).to(tl.float32)  # exact (E4M3 values fit float16), NaN byte -> NaN
    return tl.where((bits.to(tl.int32) & 0x80) != 0, -mag, mag)


@triton.jit
def _xor16(a, b, HW: tl.constexpr):
    """a ^ b for int16 tensors (b broadcast to a's shape). HW: inline PTX on two elements per 32-bit
    register (one LOP3 per pair; the plain XOR is compiled element by element, with a PRMT to unpack
    and one to repack each pair)."""
    if HW:
        return tl.inline_asm_elementwise("xor.b32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int16,
                                         is_pure=True, pack=2)
    else:
        return a ^ b


@triton.jit
def _hadamard(x, Hm, HDOT: tl.constexpr):
    """(BR, BL) tile -> (BR, BL // 32, 32) float32, times H per group of 32 along the last axis.

    HDOT 0: float32 IEEE dot with the normalized H; 1/2: bf16/fp16 dot with the +-1 matrix (exact
    products for values that are exact in that dtype), float32 accumulation, then 1/sqrt(32).
    """
    y = _hadamard_pm1(x, Hm, HDOT)
    if HDOT != 0:
        y = y * _RSQRT32
    return y


@triton.jit
def _hadamard_pm1(x, Hm, HDOT: tl.constexpr):
    """``_hadamard`` before its 1/sqrt(32) (HDOT 1/2: the +-1 dot; HDOT 0: the normalized one)."""
    BR: tl.constexpr = x.shape[0]
    BL: tl.constexpr = x.shape[1]
    xg = tl.reshape(x, (BR * (BL // 32), 32))
    if HDOT == 0:
        y = tl.dot(xg.to(tl.float32), Hm, input_precision="ieee")
    elif HDOT == 1:
        y = tl.dot(xg.to(tl.bfloat16), Hm)
    else:
        y = tl.dot(xg.to(tl.float16), Hm)
    return tl.reshape(y, (BR, BL // 32, 32))


@triton.jit
def _mean_step(s_a, y_a, s_b, y_b):
    """Running sum + the next element's c * y, the product contracted into the add (one fma)."""
    return tl.fma(y_b, _RSQRT32, s_a), y_b


@triton.jit
def _dot_step(s_a, u_a, w_a, f_a, s_b, u_b, w_b, f_b):
    """Running sum of u * w: the first step adds u0 * w0 to the rounded u1 * w1 (s_b), the next ones
    add u * w to the running sum, each product contracted into the add (f: steps taken, constants)."""
    s = tl.where(f_a == 0, tl.fma(u_a, w_a, s_b), tl.fma(u_b, w_b, s_a))
    return s, u_b, w_b, f_a + 1


@triton.jit
def _thread_sum(u, w):
    """Sum over the last axis (8 elements of one thread, in register order) of u * w in
    ``_dot_step``'s order."""
    f = tl.zeros(u.shape, tl.int32)
    return tl.reduce((u * w, u, w, f), 2, _dot_step)[0]


@triton.jit
def _quest_exp(xh, y, HDOT: tl.constexpr):
    """QuEST exponent e = floor(log2(c * std + 1e-8)) per group (last axis of a (.., 32) float32 tile),
    clamped to E8M0's [-127, 127], the group's inverse scale 2**-e (float32), its NaN/Inf flag and its
    zero flag (sum and variance both 0: every element 0, or all so small (|xh| < 2**-75) that their
    codes are 0 at any scale the group can get). Returns (e, 2**-e, bad, zero).

    HDOT 1/2 (tensor-core dot, xh = y * 2**-2.5 with y the +-1 dot): the statistics are spelled out
    operation by operation as the compiler emitted them from the former plain sums (``tl.sum`` of xh,
    of (xh - mean)**2 and of xh * 0, with the multiplies contracted into the adds by the NVPTX backend
    and ptxas at their own choice): a group lies on 4 lanes x 8 registers of the MMA accumulator (column
    8j + 2t + b on lane t, register (j, b)); each lane sums its 8 elements in register order, the lanes
    are combined by ``tl.sum`` (butterfly over lanes 2 then 1: (p0 + p2) + (p1 + p3)). Per lane: mean
    partial = c*y0 rounded, then fma(c, y_k, .); d_k = fma(c, y_k, -S/32) for k in {3, 5, 7}, else
    fma(-1/32, S, xh_k); squares: d1*d1 rounded, fma(d0, d0, .), then fma(d_k, d_k, .); var = S2/32;
    a = fma(sqrt_rn(var), c', 1e-8). Written out, no contraction choice is left to the compiler, so
    edits elsewhere in the kernel cannot change these roundings (they did: tools/sass_flow.py). HDOT 0
    (float32 dot: the interpreter, float32 inputs): the plain sums.

    a >= 1e-8 > 2**-27 (std >= 0), +inf, or NaN (a NaN/Inf group's variance): e is then a's unbiased
    float exponent capped at 127 (a = +inf gives 127), and -125 for NaN (what
    ``min(mx_exponent(a, True) + 2, 127)`` gives there, whose other clamps never bind on this range);
    2**-e is built from the exponent bits, with 2**-127 (e = 127, subnormal) from the max. 6
    instructions per group instead of 13 (mx_exponent + exp2i). Same e and 2**-e as those for every
    float32 a in [1e-8, +inf] and every NaN (``tools/exactness_checks.py questexp``)."""
    if HDOT == 0:
        mean = tl.sum(xh, axis=2) * 0.03125
        d = xh - tl.expand_dims(mean, 2)
        var = tl.sum(d * d, axis=2) * 0.03125
        a = tl.sqrt_rn(var) * _QUEST_C + _QUEST_EPS
        bad = block_bad(xh)
        zero = (var == 0) & (mean == 0)
    else:
        BR: tl.constexpr = xh.shape[0]
        NG: tl.constexpr = xh.shape[1]
        # (.., 32) -> (.., lane t, register k = 2j + b)
        x4 = tl.reshape(tl.permute(tl.reshape(xh, (BR, NG, 4, 4, 2)), (0, 1, 3, 2, 4)), (BR * NG, 4, 8))
        y4 = tl.reshape(tl.permute(tl.reshape(y, (BR, NG, 4, 4, 2)), (0, 1, 3, 2, 4)), (BR * NG, 4, 8))
        S = tl.sum(tl.reduce((x4, y4), 2, _mean_step)[0], axis=1)
        Se = S[:, None, None]
        k = tl.arange(0, 8)[None, None, :]
        d = tl.where((k >= 2) & (k % 2 == 1), tl.fma(y4, _RSQRT32, Se * -0.03125), tl.fma(Se, -0.03125, x4))
        var = tl.sum(_thread_sum(d, d), axis=1) * 0.03125
        a = tl.fma(tl.sqrt_rn(var), _QUEST_C, _QUEST_EPS)
        # NaN/Inf flag: var is NaN iff an element is NaN or +-Inf (then S is NaN or +-Inf, and that
        # element's deviation Inf - Inf); finite elements give a finite or +Inf var, never NaN (S may
        # overflow to +-Inf: deviations -+Inf, squares +Inf)
        bad = tl.reshape((var != var).to(tl.int32), (BR, NG))
        zero = tl.reshape((var == 0) & (S == 0), (BR, NG))
        a = tl.reshape(a, (BR, NG))
    e = tl.where(a > 0, tl.minimum((a.to(tl.int32, bitcast=True) >> 23) - 127, 127), -125)
    return e, tl.maximum((127 - e) << 23, 0x400000).to(tl.float32, bitcast=True), bad, zero


@triton.jit
def _signs(seed, cols):
    """Random +-1.0 per index along the reduction dim (the same for both operands of a GEMM)."""
    return 1.0 - 2.0 * (tl.randint(seed, cols) & 1).to(tl.float32)


@triton.jit
def _signs_kernel(OUT, seed, L, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + cols, _signs(seed, cols), mask=cols < L)


@triton.jit
def _splitmix64_tl(z):
    """``reference.quartet._splitmix64`` on uint64 (wrapping arithmetic)."""
    z = z + 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _sub_seed_tl(s, i):
    """``_sub_seeds(s, ·)[i]`` for a uint64 backward seed ``s`` (int32 in [0, 2**31))."""
    return (_splitmix64_tl(s * 8 + i.to(tl.uint64)) & 0x7FFFFFFF).to(tl.int32)


@triton.jit(do_not_specialize=["seed_x", "seed_w", "s1", "s2", "s4", "s5"])
def _backward_draws_kernel(STATE, OUT, N, M, seed_x, seed_w, s1, s2, s4, s5, FROM_STATE: tl.constexpr,
                           BLOCK: tl.constexpr):
    """One backward pass's randomness. FROM_STATE: from the RNG's device state STATE (int64: step,
    completion ticket, splitmix64(seed); ``QuartetRNG.device_state``), ``s = backward_seed(seed, step)``
    and its six sub-seeds (``_sub_seeds``) computed here; the last program to finish advances the step,
    so graph replays draw fresh noise. Otherwise from the given sub-seeds (0 and 3: seed_x, seed_w).

    OUT int32: [0:6] the sub-seeds (the SR kernels read their noise seeds 1, 2, 4, 5 there), [8:8+N]
    the float32 +-1 signs of dX's reduction dim (sub-seed 0), [8+N:8+N+M] those of dW's (sub-seed 3),
    each ``random_signs(sub-seed, ·)``. Programs: cdiv(N, BLOCK) for the first vector, then cdiv(M, BLOCK)."""
    pid = tl.program_id(0)
    nx = tl.cdiv(N, BLOCK)
    first = pid < nx
    if FROM_STATE:
        step = tl.load(STATE)
        s = _splitmix64_tl(tl.load(STATE + 2).to(tl.uint64, bitcast=True) + step.to(tl.uint64, bitcast=True)) >> 1
        sign_seed = _sub_seed_tl(s, tl.where(first, 0, 3))
    else:
        sign_seed = tl.where(first, seed_x, seed_w)
    c = tl.where(first, pid, pid - nx) * BLOCK + tl.arange(0, BLOCK)
    signs_out = (OUT + 8).to(tl.pointer_type(tl.float32), bitcast=True) + tl.where(first, 0, N)
    tl.store(signs_out + c, _signs(sign_seed, c), mask=c < tl.where(first, N, M))
    if pid == 0:
        i = tl.arange(0, 8)
        if FROM_STATE:
            subs = _sub_seed_tl(s, i)
        else:
            subs = tl.where(i == 0, seed_x, tl.where(i == 1, s1, tl.where(i == 2, s2, tl.where(
                i == 3, seed_w, tl.where(i == 4, s4, s5)))))
        tl.store(OUT + i, subs, mask=i < 6)
    if FROM_STATE:
        # every program has read the step before its ticket (acq_rel atomic): the last one advances it
        if tl.atomic_add(STATE + 1, 1) == tl.num_programs(0) - 1:
            tl.store(STATE, step + 1)
            tl.store(STATE + 1, 0)


@triton.jit
def _mask_ihadamard_kernel(D, MASK, OUT, RA, RB, R, K, scale, H, HDOT: tl.constexpr, SCALED: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """OUT = ((scale * D) * mask) H^T per 32-group. HDOT 1/2 (bf16/fp16 D): the masked 16-bit D goes
    into the +-1 dot unchanged (exact products, float32 sums; ``_hadamard`` applies 1/sqrt(32)) and
    ``scale`` multiplies the float32 result; HDOT 0 (float32 D): float32 dot with the normalized H.
    SCALED: D is a GEMM output without its power-of-two operand scales, applied here: RB[k] per
    column before the Hadamard (exact, in D's dtype), RA[r] per row with ``scale`` after it."""
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rows64 = rows.to(tl.int64)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    NG: tl.constexpr = BLOCK_K // 32
    KG = K // 32
    m2 = (rows < R)[:, None] & (cols < K)[None, :]
    d = tl.load(D + rows64[:, None] * K + cols[None, :], mask=m2, other=0.0)
    if HDOT == 0:
        d = d.to(tl.float32)
    if SCALED:
        rb = tl.load(RB + cols, mask=cols < K, other=1.0)
        d = (d.to(tl.float32) * rb[None, :]).to(d.dtype)
    gcols = pid_k * NG + tl.arange(0, NG)
    gm = (rows < R)[:, None] & (gcols < KG)[None, :]
    word = tl.load(MASK + rows64[:, None] * KG + gcols[None, :], mask=gm, other=0)
    lane = tl.arange(0, 32)
    keep = ((tl.expand_dims(word, 2) >> lane[None, None, :]) & 1) != 0
    d3 = tl.where(keep, tl.reshape(d, (BLOCK_R, NG, 32)), 0.0)
    hr = tl.arange(0, 32)
    Hm = tl.load(H + hr[:, None] * 32 + hr[None, :])
    if HDOT == 0:
        out = _hadamard(tl.reshape(d3, (BLOCK_R, BLOCK_K)) * scale, Hm, 0)
    else:
        out = _hadamard(tl.reshape(d3, (BLOCK_R, BLOCK_K)), Hm, HDOT) * scale
    if SCALED:
        out = out * tl.load(RA + rows64, mask=rows < R, other=1.0)[:, None, None]
    tl.store(OUT + rows64[:, None] * K + cols[None, :],
             tl.reshape(out, (BLOCK_R, BLOCK_K)).to(OUT.dtype.element_ty), mask=m2)


# ----------------------------------------------------------------------------------------------
# Native MXFP4 (Blackwell): packed quantizers (one pass, no row offset needed) and tl.dot_scaled
# ----------------------------------------------------------------------------------------------
@triton.jit
def _pack_store(P, S, EMAX, rows64, k0, R, KH, KG, codes, e, bad, ROW_MAX: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Store E2M1 codes (BR, NG, 32) as packed bytes (element 2i low nibble) and E8M0 scale bytes. Bits
    above 7 of the codes are ignored (``e2m1_code_raw``'s); bits 4-7 must be zero.
    ROW_MAX: also the tile's largest exponent over its non-NaN groups (-127 if none), for the FP8
    embedding's row offset: 2: stored into the int8 table EMAX[row, tile] (``tl.num_programs(1)``
    columns; no buffer to fill, no atomics; ``_mx_to_fp8_kernel`` ROWTAB reduces it), otherwise (True/1)
    folded into ``EMAX[row]`` by an atomic max (order-independent, so deterministic)."""
    NG: tl.constexpr = BLOCK_K // 32
    byte = pack_nibbles(tl.reshape(codes.to(tl.int32), (BLOCK_R, BLOCK_K))).to(tl.uint8)
    bcols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    rm = (rows64 < R)[:, None]
    tl.store(P + rows64[:, None] * KH + bcols[None, :], byte, mask=rm & (bcols < KH)[None, :])
    gcols = k0 // 32 + tl.arange(0, NG)
    gm = rm & (gcols < KG)[None, :]
    sb = tl.where(bad != 0, 255, e + 127).to(tl.uint8)
    tl.store(S + rows64[:, None] * KG + gcols[None, :], sb, mask=gm)
    if ROW_MAX:
        tile_max = tl.max(tl.where(gm & (bad == 0), e, -127), axis=1)
    if ROW_MAX == 2:
        tl.store(EMAX + rows64 * tl.num_programs(1) + tl.program_id(1), tile_max.to(tl.int8), mask=rows64 < R)
    elif ROW_MAX:
        tl.atomic_max(EMAX + rows64, tile_max, mask=rows64 < R, sem="relaxed")


@triton.jit
def _quest_tile(X, sxr, sxk, Hm, rows, rows64, cols, R, K, HDOT: tl.constexpr):
    """Load a (BR, BK) tile of X (zeros outside R x K), Hadamard per 32-group, QuEST statistics.
    Returns (xh (BR, BK/32, 32) float32, e, 2**-e, bad, zero) as ``_quest_exp``."""
    m2 = (rows < R)[:, None] & (cols < K)[None, :]
    x = tl.load(X + rows64[:, None] * sxr + cols[None, :] * sxk, mask=m2, other=0.0)
    y = _hadamard_pm1(x, Hm, HDOT)
    xh = y * _RSQRT32 if HDOT != 0 else y
    e, inv, bad, zero = _quest_exp(xh, y, HDOT)
    return xh, e, inv, bad, zero


@triton.jit
def _quest_mxfp4_kernel(X, sxr, sxk, H, P, S, MASK, EMAX, TAB, R, K,
                        ROW_MAX: tl.constexpr, OUT: tl.constexpr, WITH_MASK: tl.constexpr, HDOT: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Hadamard + QuEST of one (BLOCK_R, BLOCK_K) tile; the trust mask words into MASK (WITH_MASK).

    OUT 0: packed MXFP4 (E2M1 codes into P (R, K/2), E8M0 bytes into S (R, K/32)). ROW_MAX 1: the row
    maxima of the group exponents into EMAX[0:R]; 2: also, for the tensor offset of ``quest_fp8``,
    TAB[r, tile] (int8) = -(smallest exponent of row r's non-zero groups in this K tile), a plain store
    (a second atomic per row, for the row minimum, cost 0.164 vs 0.127 ms per 8192 x 8192 operand),
    and the tile's largest exponent into one of ``_TMAX_SLOTS`` slots after the row maxima (EMAX[R +
    32 j], a line each, j = program index mod the slot count), which ``_mx_to_fp8_kernel`` reduces:
    one atomic per program on a single address cost ~20 us, and a separate reduction kernel a launch.
    OUT 1 (``quest_e5m2``): the E5M2 bytes of the values at offset 0 into P (R, K), 1.0 into S[r] (the
    row scales) and the int8 flag EMAX[r, tile] = 1 if row r has a non-zero group outside [-13, 13] in
    this K tile (those rows are rewritten by ``_quest_e5m2_fix_kernel``); no atomics, no buffer to
    initialize. NaN/Inf groups: E8M0 byte 255 / E5M2 0x7F,
    left out of every maximum and minimum."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows64 = rows.to(tl.int64)
    k0 = tl.program_id(1) * BLOCK_K
    cols = k0 + tl.arange(0, BLOCK_K)
    NG: tl.constexpr = BLOCK_K // 32
    KG = K // 32
    hr = tl.arange(0, 32)
    Hm = tl.load(H + hr[:, None] * 32 + hr[None, :])
    xh, e, inv, bad, zero = _quest_tile(X, sxr, sxk, Hm, rows, rows64, cols, R, K, HDOT)
    gcols = k0 // 32 + tl.arange(0, NG)
    gm = (rows < R)[:, None] & (gcols < KG)[None, :]
    if OUT == 0:
        codes = e2m1_code_raw(xh, tl.expand_dims(inv, 2))  # the codes of xh * 2**-e
        _pack_store(P, S, EMAX, rows64, k0, R, K // 2, KG, codes, e, bad, ROW_MAX != 0, BLOCK_R, BLOCK_K)
        if ROW_MAX == 2:
            live = gm & (bad == 0) & (zero == 0)
            tl.store(TAB + rows64 * tl.num_programs(1) + tl.program_id(1),
                     tl.max(tl.where(live, -e, -127), axis=1).to(tl.int8), mask=rows < R)
            slot = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) % _TMAX_SLOTS
            tl.atomic_max(EMAX + R + slot * 32, tl.max(tl.max(tl.where(gm & (bad == 0), e, -127), axis=1), axis=0),
                          sem="relaxed")
    else:
        b = e2m1_e5m2_byte(xh, tl.expand_dims(inv, 2), tl.expand_dims(e, 2), tl.expand_dims(bad, 2))
        tl.store(P + rows64[:, None] * K + cols[None, :], tl.reshape(b, (BLOCK_R, BLOCK_K)).to(tl.uint8),
                 mask=(rows < R)[:, None] & (cols < K)[None, :])
        out = gm & (bad == 0) & (zero == 0) & ((e < -13) | (e > 13))
        flag = tl.max(out.to(tl.int32), axis=1)
        tl.store(EMAX + rows64 * tl.num_programs(1) + tl.program_id(1), flag.to(tl.int8), mask=rows < R)
        if tl.program_id(1) == 0:
            tl.store(S + rows, tl.full((BLOCK_R,), 1.0, tl.float32), mask=rows < R)
    if WITH_MASK:
        # trusted: |xh * 2**-e| < 6, i.e. |xh| < 6 * 2**e (exact, 6 * 2**127 = inf included:
        # tools/exactness_checks.py)
        lim = tl.expand_dims(((e + 127) << 23).to(tl.float32, bitcast=True) * 6.0, 2)
        lane = tl.arange(0, 32)
        word = tl.sum(tl.where(tl.abs(xh) < lim, 1 << lane[None, None, :], 0), axis=2)
        word = tl.where(bad == 0, word, 0)  # no element of a NaN/Inf group is trusted
        tl.store(MASK + rows64[:, None] * KG + gcols[None, :], word, mask=gm)


@triton.jit
def _quest_e5m2_fix_kernel(X, sxr, sxk, H, Q8, RS, FLAG, R, K, HW: tl.constexpr, HDOT: tl.constexpr,
                           BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """The rows ``_quest_mxfp4_kernel`` (OUT 1) flagged, at their own offset: E5M2 bytes of
    ``value * 2**(13 - E_r)`` (round to nearest even: groups more than 28 binades below E_r lose bits in
    E5M2's subnormals or flush to 0) and RS[r] = 2**(E_r - 13). One program per row block (the same
    tiles as that launch, so the same float32 sums and exponents): a first pass over K for the row
    maxima E_r of the non-NaN groups, a second one rewrites; a block without flagged rows reads its
    flags and stops."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows64 = rows.to(tl.int64)
    NKT = tl.cdiv(K, BLOCK_K)
    flagged = tl.zeros((BLOCK_R,), tl.int32)
    for t0 in range(0, NKT, 64):  # the row block's flags of every K tile
        t = t0 + tl.arange(0, 64)
        f = tl.load(FLAG + rows64[:, None] * NKT + t[None, :], mask=(rows < R)[:, None] & (t < NKT)[None, :], other=0)
        flagged = tl.maximum(flagged, tl.max(f.to(tl.int32), axis=1))
    flagged = flagged > 0
    if tl.max(flagged.to(tl.int32), axis=0) > 0:
        NG: tl.constexpr = BLOCK_K // 32
        KG = K // 32
        hr = tl.arange(0, 32)
        Hm = tl.load(H + hr[:, None] * 32 + hr[None, :])
        er = tl.full((BLOCK_R,), -127, tl.int32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            xh, e, inv, bad, zero = _quest_tile(X, sxr, sxk, Hm, rows, rows64, cols, R, K, HDOT)
            gok = ((k0 // 32 + tl.arange(0, NG)) < KG)[None, :] & (bad == 0)
            er = tl.maximum(er, tl.max(tl.where(gok, e, -127), axis=1))
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            xh, e, inv, bad, zero = _quest_tile(X, sxr, sxk, Hm, rows, rows64, cols, R, K, HDOT)
            codes = e2m1_code_raw(xh, tl.expand_dims(inv, 2))
            shift = tl.maximum(e - er[:, None] + 13, -149)
            b = _to_e5m2(e2m1_decode(codes) * tl.expand_dims(exp2i(shift), 2), HW)
            b = tl.where(tl.expand_dims(bad, 2) != 0, 0x7F, b.to(tl.int32))
            tl.store(Q8 + rows64[:, None] * K + cols[None, :], tl.reshape(b, (BLOCK_R, BLOCK_K)).to(tl.uint8),
                     mask=flagged[:, None] & (cols < K)[None, :])
        tl.store(RS + rows64, exp2i(er - 13), mask=flagged)


@triton.jit(do_not_specialize=["noise_seed"])
def _sr_mxfp4_kernel(A, sar, sal, ASCALE, H, NOISE, SIGNS, SEEDS, noise_seed, P, S, EMAX, R, L, LP,
                     ROW_MAX: tl.constexpr, A_FP8: tl.constexpr, HAS_NOISE: tl.constexpr, SEED_PTR: tl.constexpr,
                     HW: tl.constexpr, HDOT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr):
    """SEED_PTR: the noise seed is ``SEEDS[noise_seed]`` (the backward's device draws), else ``noise_seed``."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows64 = rows.to(tl.int64)
    l0 = tl.program_id(1) * BLOCK_L
    cols = l0 + tl.arange(0, BLOCK_L)
    NG: tl.constexpr = BLOCK_L // 32
    hr = tl.arange(0, 32)
    Hm = tl.load(H + hr[:, None] * 32 + hr[None, :])
    m2 = (rows < R)[:, None] & (cols < L)[None, :]
    a = tl.load(A + rows64[:, None] * sar + cols[None, :] * sal, mask=m2, other=0)
    signs = tl.load(SIGNS + cols, mask=cols < L, other=0.0)  # random_signs(sign_seed, L), shared by both operands
    if A_FP8 != 0:  # a saved forward operand: E4M3 (1) / E5M2 (2) bytes times its per-(original-)row scale,
        # signs folded in
        a = _e4m3_value(a, HW) if A_FP8 == 1 else _e5m2_value(a)
        a = a * (tl.load(ASCALE + cols, mask=cols < L, other=0.0) * signs)[None, :]
    elif HDOT == 0:
        a = a.to(tl.float32) * signs[None, :]
    else:  # 16-bit input: the sign flip is an XOR of the sign bit (exact, as the multiply by -1)
        flip = tl.where(signs < 0, -32768, 0).to(tl.int16)
        a = _xor16(a.to(tl.int16, bitcast=True), flip[None, :], HW).to(a.dtype, bitcast=True)
    ah = _hadamard(a, Hm, HDOT)
    amax, bad = block_amax_bad(ah)
    e = mx_exponent(amax, True)
    v = ah * tl.expand_dims(exp2i(-e) * 0.75, 2)
    if HAS_NOISE:
        u = tl.load(NOISE + rows64[:, None] * LP + cols[None, :], mask=(rows < R)[:, None] & (cols < LP)[None, :],
                    other=0.0)
        codes = e2m1_sr_code(v, tl.reshape(u, (BLOCK_R, NG, 32)))
    else:
        h = sr_uniform_bits(tl.load(SEEDS + noise_seed) if SEED_PTR else noise_seed, rows, l0, LP, BLOCK_L)
        codes = e2m1_sr_code_u16(v, tl.reshape(h, (BLOCK_R, NG, 32)))
    _pack_store(P, S, EMAX, rows64, l0, R, LP // 2, LP // 32, codes, e, bad, ROW_MAX, BLOCK_R, BLOCK_L)


@triton.jit
def _e4m3_mag_table(s, HW: tl.constexpr):
    """Per-group scales s (float32, any shape; NaN for NaN groups) -> (t_lo, t_hi) int32: the E4M3 bytes
    of the E2M1 magnitudes 0, 0.5, 1, 1.5 / 2, 3, 4, 6 times s, little-endian (the table of
    ``e2m1_words_e4m3``). Each byte is ``_to_e4m3`` of the same float32 product the value-wise
    conversion forms, so both give the same bytes; 0 * NaN keeps NaN groups all-NaN."""
    t_lo = _to_e4m3(s * 0.0, HW).to(tl.int32) | (_to_e4m3(s * 0.5, HW).to(tl.int32) << 8) \
        | (_to_e4m3(s, HW).to(tl.int32) << 16) | (_to_e4m3(s * 1.5, HW).to(tl.int32) << 24)
    t_hi = _to_e4m3(s * 2.0, HW).to(tl.int32) | (_to_e4m3(s * 3.0, HW).to(tl.int32) << 8) \
        | (_to_e4m3(s * 4.0, HW).to(tl.int32) << 16) | (_to_e4m3(s * 6.0, HW).to(tl.int32) << 24)
    return t_lo, t_hi


@triton.jit
def _table_row_max(TAB, rows64, rmask, NT, BLOCK_R: tl.constexpr):
    """Per row, the largest entry of an int8 (R, NT) table of per-tile values (-127 for none)."""
    m = tl.full((BLOCK_R,), -127, tl.int32)
    for t0 in range(0, NT, 32):
        t = t0 + tl.arange(0, 32)
        f = tl.load(TAB + rows64[:, None] * NT + t[None, :], mask=rmask[:, None] & (t < NT)[None, :], other=-127)
        m = tl.maximum(m, tl.max(f.to(tl.int32), axis=1))
    return m


@triton.jit
def _mx_to_fp8_kernel(P, S, EMAX, TAB, NT, Q8, RS, SB, R, L, HW: tl.constexpr, TABLE: tl.constexpr,
                      TENSOR: tl.constexpr, ROWTAB: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_L: tl.constexpr):
    """Packed MXFP4 rows (codes (R, L/2), E8M0 bytes (R, L/32), 255 = NaN group) and the row maxima
    E_r of the non-NaN group exponents (from the quantizer's ROW_MAX) -> the FP8 embedding: E4M3
    bytes of ``value * 2**(6 - E_r)`` (R, L) and row scales ``2**(E_r - 6)``. Every tile in parallel.

    TABLE (GPU): per group, the eight E4M3 magnitude bytes are converted once and every 32-bit word of
    codes becomes eight bytes by byte permutes (``e2m1_words_e4m3``, ~1.4 instructions per value, 16-byte
    loads and stores); otherwise each value is decoded, scaled and converted (~20 per value).

    TENSOR (``quest_fp8(tensor_offset=True)``, EMAX (with the tensor maximum's slots) and TAB (R, NT)
    as ``_quest_mxfp4_kernel``'s ROW_MAX 2): rows whose non-zero groups all lie within 14 binades of
    the tensor's largest exponent G use G as their offset (so one tensor-wide GEMM scale, SB =
    2**(G - 6), serves them all); the others keep their own E_r. Each program reduces the slots to G
    and its rows' NT table entries to the row minimum."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    rows64 = rows.to(tl.int64)
    LG = L // 32
    if ROWTAB:  # E_r from the quantizer's int8 table TAB (R, NT) of per-tile maxima (ROW_MAX 2)
        emax = _table_row_max(TAB, rows64, rmask, NT, BLOCK_R)
    else:
        emax = tl.load(EMAX + rows, mask=rmask, other=0)
    if TENSOR:
        g = tl.max(tl.load(EMAX + R + tl.arange(0, _TMAX_SLOTS) * 32), axis=0)
        emin = -_table_row_max(TAB, rows64, rmask, NT, BLOCK_R)  # 127: no non-zero group
        emax = tl.where(emin >= g - _EXACT_RANGE, g, emax)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(SB, exp2i(g - 6))
    NG: tl.constexpr = BLOCK_L // 32
    l0 = tl.program_id(1) * BLOCK_L
    gcols = l0 // 32 + tl.arange(0, NG)
    gm = rmask[:, None] & (gcols < LG)[None, :]
    sb = tl.load(S + rows64[:, None] * LG + gcols[None, :], mask=gm, other=255).to(tl.int32)
    s = tl.where(sb == 255, float("nan"), exp2i(sb - 127 - emax[:, None] + 6))
    if TABLE:
        wcols = l0 // 8 + tl.arange(0, BLOCK_L // 8)
        w = tl.load(P.to(tl.pointer_type(tl.int32)) + rows64[:, None] * (L // 8) + wcols[None, :],
                    mask=rmask[:, None] & (wcols < L // 8)[None, :], other=0)
        t_lo, t_hi = _e4m3_mag_table(s, HW)
        smask = tl.where(sb == 255, 0, -2139062144)  # 0x80808080: keep the sign bits
        shape: tl.constexpr = (BLOCK_R, NG, 4)  # four words per group
        lo, hi = e2m1_words_e4m3(tl.reshape(w, shape), tl.broadcast_to(tl.expand_dims(t_lo, 2), shape),
                                 tl.broadcast_to(tl.expand_dims(t_hi, 2), shape),
                                 tl.broadcast_to(tl.expand_dims(smask, 2), shape))
        ocols = l0 // 4 + tl.arange(0, BLOCK_L // 4)
        tl.store(Q8.to(tl.pointer_type(tl.int32)) + rows64[:, None] * (L // 4) + ocols[None, :],
                 tl.reshape(tl.join(lo, hi), (BLOCK_R, BLOCK_L // 4)),
                 mask=rmask[:, None] & (ocols < L // 4)[None, :])
    else:
        bcols = l0 // 2 + tl.arange(0, BLOCK_L // 2)
        byte = tl.load(P + rows64[:, None] * (L // 2) + bcols[None, :],
                       mask=rmask[:, None] & (bcols < L // 2)[None, :], other=0)
        v = tl.reshape(e2m1_decode(unpack_nibbles(byte)), (BLOCK_R, NG, 32)) * tl.expand_dims(s, 2)
        cols = l0 + tl.arange(0, BLOCK_L)
        tl.store(Q8 + rows64[:, None] * L + cols[None, :], _to_e4m3(tl.reshape(v, (BLOCK_R, BLOCK_L)), HW),
                 mask=rmask[:, None] & (cols < L)[None, :])
    if tl.program_id(1) == 0:
        tl.store(RS + rows, exp2i(emax - 6), mask=rmask)


@triton.jit
def _mxfp4_gemm_kernel(A, SA, B, SB, C, BIAS, M, N, K,
                       HAS_BIAS: tl.constexpr, FMT: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C (M, N) = A (M, K) @ B (N, K)^T with A, B packed E2M1 (K/2 bytes per row) and E8M0 scales
    (K/32 per row); float32 accumulation, tl.dot_scaled (native on Blackwell)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    kb = tl.arange(0, BLOCK_K // 2)
    ks = tl.arange(0, BLOCK_K // 32)
    KH = K // 2
    KG = K // 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # K is a multiple of 32, not necessarily of BLOCK_K: the tail codes load as 0 (value 0)
        kbm = (k0 // 2 + kb) < KH
        ksm = (k0 // 32 + ks) < KG
        a = tl.load(A + rm[:, None] * KH + (k0 // 2 + kb)[None, :], mask=(rm < M)[:, None] & kbm[None, :],
                    other=0)
        b = tl.load(B + rn[:, None] * KH + (k0 // 2 + kb)[None, :], mask=(rn < N)[:, None] & kbm[None, :],
                    other=0)
        sa = tl.load(SA + rm[:, None] * KG + (k0 // 32 + ks)[None, :], mask=(rm < M)[:, None] & ksm[None, :],
                     other=127)
        sb = tl.load(SB + rn[:, None] * KG + (k0 // 32 + ks)[None, :], mask=(rn < N)[:, None] & ksm[None, :],
                     other=127)
        acc = tl.dot_scaled(a, sa, FMT, b.T, sb, FMT, acc)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty),
             mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def _fp8_rescale_kernel(Y, RA, RB, SB, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUB_M: tl.constexpr):
    """Y (M, N) *= RA[m] * (RB[n] / SB[0]) in place, per (BLOCK_M, BLOCK_N) tile where a factor is not 1
    (in SUB_M-row steps); the other programs read their tile's row and column factors and stop (one wave
    of short programs: one program per row block reading every column factor in a loop took 6-20 us).
    The factors are powers of two, so the rescaled output equals the one a GEMM with those row/column
    scales would round (unless a value leaves the output dtype's normal range: a factor of 2**k on an
    output below 2**(k - 126) or above 2**(k + 127))."""
    r0 = tl.program_id(0) * BLOCK_M
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    sb = tl.load(SB)
    rb = tl.load(RB + cols, mask=cols < N, other=sb)
    rt = r0 + tl.arange(0, BLOCK_M)
    need = tl.max(tl.abs(tl.load(RA + rt, mask=rt < M, other=1.0) - 1.0), axis=0) + tl.max(tl.abs(rb - sb), axis=0)
    if need > 0:
        fb = tl.math.div_rn(rb, sb)  # exact: powers of two
        for m0 in range(0, BLOCK_M, SUB_M):
            rows = r0 + m0 + tl.arange(0, SUB_M)
            fa = tl.load(RA + rows, mask=rows < M, other=1.0)
            ptr = Y + rows.to(tl.int64)[:, None] * N + cols[None, :]
            m2 = (rows < M)[:, None] & (cols < N)[None, :]
            y = tl.load(ptr, mask=m2, other=0.0).to(tl.float32)
            tl.store(ptr, (y * fa[:, None] * fb[None, :]).to(Y.dtype.element_ty), mask=m2)


# ----------------------------------------------------------------------------------------------
# Python wrappers
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _hmat(device: str, kind: int) -> torch.Tensor:
    if kind == _HDOT_F32:
        return hadamard_matrix(32, torch.float32, device).contiguous()
    h = hadamard_matrix(32, torch.float64) * 32 ** 0.5  # +-1, exact in bf16/fp16
    return h.to(device=device, dtype=torch.bfloat16 if kind == _HDOT_BF16 else torch.float16).contiguous()




def _hdot_for(dtype: torch.dtype) -> int:
    if _INTERPRET:
        return _HDOT_F32
    return {torch.bfloat16: _HDOT_BF16, torch.float16: _HDOT_F16}.get(dtype, _HDOT_F32)


def _block_rows(R: int) -> int:
    """32 rows per program for tall operands; 16 for short ones so that every SM gets programs."""
    return 32 if R >= 8192 else 16


# QuEST tiles: 32 x 128 (16 x 128 for operands under 8192 rows), i.e. _block_rows(R) rows of four groups.
# A 128 x 32 tile (one group per tile row, block_k=32) compiles to fewer instructions (1032 vs 1080 SASS per
# 4096 values, 64 vs 79 registers: its Hadamard operand needs no LDSM round trip, its row maximum no
# shuffles) and gives the same bits for 16-bit inputs (test_gpu_quest_tile_shapes_agree_bitwise), but ran
# slower on the H200 (packed kernel 0.144 vs 0.104 ms per 8192 x 8192 bf16 operand, BENCHMARKS.md): kept as
# an option only. Float32 inputs must keep 32 x 128: their float32 FMA dot's output layout, and with it the
# order of the QuEST sums, depends on the tile shape.
_QUEST_BLOCK_K = 128
# Register cap of the QuEST launches (ptxas .maxnreg): 80 instead of the 87-108 ptxas picks lets six
# 4-warp programs share an SM instead of four or five (the E5M2 kernel then keeps 24 bytes of stack, no
# local-memory spills); the E5M2 activation quantizer ran 0.1075 -> 0.1028 ms per (16384, 4096) bf16
# operand and 0.357 -> 0.339 at (16384, 14336) on the H200; the packed kernel's time did not change.
_QUEST_MAXNREG = 80


# SR tiles: 32 x 128 with 4 warps. Sweep over 16-128 rows x 32-128 columns x 4/8 warps on the four backward
# operands of the (16384, 4096, 4096) layer (H200, benchmarks/quartet/linear-2026-11-22-s11/sr_sweep.txt;
# the same bits at every tile): the fastest for all four, 0.121 -> 0.118 ms for dy (16384, 4096), 0.151 ->
# 0.124 for dy^T (4096, 16384), 0.044 -> 0.039 for W8^T (4096, 4096), 0.151 -> 0.129 for X8^T (4096, 16384)
# against the former 64 x 64 (>= 8192 rows) / 32 x 64 tiles.
_SR_BLOCK_R = 32
_SR_BLOCK_L = 128


def _mx_to_fp8(p: torch.Tensor, sc: torch.Tensor, emax: torch.Tensor, block_r: int = 16, block_l: int = 1024,
               table: bool | None = None, tab: torch.Tensor | None = None):
    """Packed MXFP4 rows + their row maxima -> (E4M3 uint8 (R, L), float32 row scales (R,)), and with
    ``tab`` (the tensor offset: ``emax`` and ``tab`` from ROW_MAX 2) the tensor offset's GEMM scale
    (float32 (1,)) as a third item. ``emax``: int32 (R,) row maxima, or the int8 (R, tiles) table of
    per-tile maxima (``_pack_store`` ROW_MAX 2), reduced here.
    ``table``: the byte-permute conversion (default on GPU; the value-wise one otherwise)."""
    R, L = p.shape[0], p.shape[1] * 2
    q8 = torch.empty(R, L, dtype=torch.uint8, device=p.device)
    rs = torch.empty(R, dtype=torch.float32, device=p.device)
    tensor = tab is not None
    rowtab = emax.dim() == 2
    if rowtab:
        tab = emax
    sb = torch.empty(1, dtype=torch.float32, device=p.device) if tensor else rs
    grid = (cdiv(R, block_r), cdiv(L, block_l))
    table = not _INTERPRET if table is None else table
    fast(_mx_to_fp8_kernel)[grid](p, sc, emax, emax if tab is None else tab, 0 if tab is None else tab.shape[1],
                                  q8, rs, sb, R, L, HW=not _INTERPRET, TABLE=table, TENSOR=tensor, ROWTAB=rowtab,
                                  BLOCK_R=block_r, BLOCK_L=block_l, num_warps=4)
    return (q8, rs, sb) if tensor else (q8, rs)


def quest_fp8(a: torch.Tensor, block_r: int | None = None, block_k: int | None = None, tensor_offset: bool = False,
              with_mask: bool = True):
    """Hadamard + QuEST of a 2-D (R, K) tensor -> (E4M3 uint8 (R, K), mask words int32 (R, K/32) or None
    without ``with_mask``, row scales float32 (R,)). Dequantized value = e4m3(q8) * rs[:, None].

    Two kernels, each one pass in parallel over (row, column) tiles: the packed quantization (as
    ``quest_mxfp4``, plus the row maxima) and the conversion to the FP8 embedding.

    ``tensor_offset`` (the forward's weight): rows whose non-zero groups all lie within 14 binades of
    the tensor's largest group exponent G are embedded at G instead of their own maximum (the same
    values, exact either way), so that one tensor-wide GEMM scale serves them; a fourth item is that
    scale, ``2**(G - 6)`` (float32 (1,)). ``rs`` stays per row (``2**(G - 6)`` for those rows)."""
    p, sc, mask, emax, tab = _quest_mx(a, block_r, block_k, row_max=2 if tensor_offset else 1, with_mask=with_mask)
    if tensor_offset:
        q8, rs, sb = _mx_to_fp8(p, sc, emax, tab=tab)
        return q8, mask, rs, sb
    q8, rs = _mx_to_fp8(p, sc, emax)
    return q8, mask, rs


def quest_e5m2(a: torch.Tensor, with_mask: bool = True, block_r: int | None = None, block_k: int | None = None):
    """Hadamard + QuEST of a 2-D (R, K) tensor as FP8 **E5M2** in one pass (the forward's activation
    operand) -> (E5M2 uint8 (R, K), mask words int32 (R, K/32) or None without ``with_mask``, row
    scales float32 (R,)). Dequantized value = e5m2(q8) * rs[:, None].

    E5M2 holds every E2M1 value times 2**e exactly for e in [-15, 13] (29 binades, against E4M3's 15), so
    no row offset is needed in practice: values are written as they are (rs = 1) straight from the
    quantizer, with no packed intermediate and no conversion pass. Rows with a non-zero group outside
    [-13, 13] (group std outside ~[2.5e-4, 1.7e4] after the Hadamard) are rewritten by a second kernel
    at their own offset E_r - 13 (rs = 2**(E_r - 13)); that kernel's programs return at once when no
    row of theirs is flagged. **Exactness condition:** every non-zero group with e >= E_r - 28 is exact
    (all of them in rows that were not rewritten); groups further below their row's largest round to
    nearest even in E5M2's subnormals. NaN/Inf groups are NaN (0x7F)."""
    R, K, block_r, block_k, hd, grid = _quest_tiles(a, block_r, block_k)
    q8 = torch.empty(R, K, dtype=torch.uint8, device=a.device)
    rs = torch.empty(R, dtype=torch.float32, device=a.device)
    mask = torch.empty(R, K // 32, dtype=torch.int32, device=a.device) if with_mask else None
    flag = torch.empty(R, grid[1], dtype=torch.int8, device=a.device)  # every (row, K tile) written
    h = _hmat(str(a.device), hd)
    fast(_quest_mxfp4_kernel)[grid](a, a.stride(0), a.stride(1), h, q8, rs, mask if with_mask else rs, flag, flag, R, K,
                                    ROW_MAX=0, OUT=1, WITH_MASK=with_mask, HDOT=hd, BLOCK_R=block_r, BLOCK_K=block_k,
                                    num_warps=4, maxnreg=_QUEST_MAXNREG)
    fast(_quest_e5m2_fix_kernel)[(grid[0],)](a, a.stride(0), a.stride(1), h, q8, rs, flag, R, K, HW=not _INTERPRET,
                                             HDOT=hd, BLOCK_R=block_r, BLOCK_K=block_k, num_warps=4)
    return q8, mask, rs


def sr_fp8(a: torch.Tensor, *, sign_seed: int, noise_seed: int, scale: torch.Tensor | None = None,
           noise: torch.Tensor | None = None, signs: torch.Tensor | None = None, block_r: int | None = None,
           block_l: int = _SR_BLOCK_L, a_fmt: str = "e4m3", seeds: torch.Tensor | None = None):
    """Backward operand: random-sign Hadamard along the last dim of the 2-D view ``a`` (R, L), SR of
    3/4 x to MXFP4, FP8 embedding. ``a`` may be a strided view; uint8 ``a`` holds FP8 bytes (``a_fmt``
    "e4m3" or "e5m2": the forward's saved operands) to be multiplied by ``scale[l]``. Returns (E4M3
    uint8 (R, Lp), row scales (R,)), Lp = L rounded up to 32. ``noise``: optional (R, Lp) uniforms
    replacing the Philox draws (tests); ``signs``: optional ``random_signs(sign_seed, L)`` computed
    once for both operands of a GEMM; ``seeds``: the int32 draws of ``backward_draws``, ``noise_seed``
    then being the index of the noise seed there (read on the device)."""
    p, sc, emax = _sr_mx(a, sign_seed, noise_seed, scale, noise, signs, block_r, block_l, row_max=True,
                         a_fmt=a_fmt, seeds=seeds)
    return _mx_to_fp8(p, sc, emax)


def backward_draws(rng, device, N: int, M: int):
    """One backward pass's randomness on ``device`` -> (seeds, signs_x, signs_w): the int32 sub-seeds of
    ``backward_seed(rng.seed, rng.step)`` (``_sub_seeds`` order: sign x, g, w, sign w, gᵀ, x; the SR
    kernels read their noise seed there by index), ``random_signs(seeds[0], N)`` and
    ``random_signs(seeds[3], M)``, in one launch. The step is read and advanced on the device
    (``QuartetRNG.device_state``): a captured backward draws fresh noise at each replay. Without a
    device state (a graph capture that creates the RNG), the seeds come from the host as before."""
    out = torch.empty(8 + N + M, dtype=torch.int32, device=device)
    state = rng.device_state(device)
    grid = (cdiv(N, 128) + cdiv(M, 128),)
    if state is not None:
        fast(_backward_draws_kernel)[grid](state, out, N, M, 0, 0, 0, 0, 0, 0, FROM_STATE=True, BLOCK=128)
    else:
        s = _sub_seeds(rng.next_seed(), 6)
        fast(_backward_draws_kernel)[grid](out, out, N, M, s[0], s[3], s[1], s[2], s[4], s[5], FROM_STATE=False,
                                           BLOCK=128)
    signs = out[8:].view(torch.float32)
    return out, signs[:N], signs[N:]


def sr_fp8_pair(a: torch.Tensor, b: torch.Tensor, *, seeds: torch.Tensor, noise_a: int, noise_b: int,
                signs: torch.Tensor, scale_b: torch.Tensor | None = None, b_fmt: str = "e4m3"):
    """Both operands of one backward GEMM (the same reduction length L): ``sr_fp8(a, ...)`` and
    ``sr_fp8(b, scale=scale_b, a_fmt=b_fmt, ...)`` with the device draws ``seeds`` (noise seeds by index)
    and the shared ``signs``, quantized into one stacked buffer and converted to the FP8 embedding in one
    launch -> ((q8_a, rs_a), (q8_b, rs_b)), row blocks of one (Ra + Rb, Lp) tensor: the same values as two
    ``sr_fp8`` calls, with one conversion launch and five allocations fewer (host time per step)."""
    Ra, L = a.shape
    Rb = b.shape[0]
    if b.shape[1] != L:
        raise ValueError(f"b: expected {L} columns as a, got {b.shape[1]}")
    LP = (L + 31) // 32 * 32
    p = torch.empty(Ra + Rb, LP // 2, dtype=torch.uint8, device=a.device)
    sc = torch.empty(Ra + Rb, LP // 32, dtype=torch.uint8, device=a.device)
    emax = torch.empty(Ra + Rb, cdiv(LP, _SR_BLOCK_L), dtype=torch.int8, device=a.device)
    for src, r0, r1, noise, scale, fmt in ((a, 0, Ra, noise_a, None, "e4m3"),
                                           (b, Ra, Ra + Rb, noise_b, scale_b, b_fmt)):
        _sr_mx(src, 0, noise, scale, None, signs, None, _SR_BLOCK_L, row_max=True, a_fmt=fmt, seeds=seeds,
               out=(p[r0:r1], sc[r0:r1], emax[r0:r1]))
    q8, rs = _mx_to_fp8(p, sc, emax)
    return (q8[:Ra], rs[:Ra]), (q8[Ra:], rs[Ra:])


def random_signs(seed: int, n: int, device) -> torch.Tensor:
    """The +-1 signs (float32 (n,)) the SR quantizers apply along their reduction dim for
    ``sign_seed=seed``: element l is ``1 - 2 * (tl.randint(seed, l) & 1)``. One small kernel; the SR
    kernels read the vector (a Philox call per element in the SR kernel cost more than its rounding)."""
    out = torch.empty(n, dtype=torch.float32, device=device)
    fast(_signs_kernel)[(cdiv(n, 128),)](out, seed, n, BLOCK=128)
    return out


def mask_ihadamard(d: torch.Tensor, mask: torch.Tensor, out_dtype: torch.dtype, scale: float = SR_RESCALE,
                   block_r: int = 32, block_k: int = 128, row_scale: torch.Tensor | None = None,
                   col_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``((scale * d') ⊙ mask) H^T`` per 32-group along the last dim of a contiguous (R, K) tensor, with
    ``d' = row_scale[:, None] * d * col_scale[None, :]`` (power-of-two float32 scales: the operand
    scales of an unscaled ``fp8_gemm_raw``, exact to apply here) or ``d`` without them."""
    R, K = d.shape
    out = torch.empty(R, K, dtype=out_dtype, device=d.device)
    hd = _hdot_for(d.dtype)
    grid = (cdiv(R, block_r), cdiv(K, block_k))
    scaled = row_scale is not None
    if scaled != (col_scale is not None):
        raise ValueError("mask_ihadamard: give both row_scale and col_scale, or neither")
    fast(_mask_ihadamard_kernel)[grid](d, mask, out, row_scale if scaled else d, col_scale if scaled else d, R, K,
                                       scale, _hmat(str(d.device), hd), HDOT=hd, SCALED=scaled,
                                       BLOCK_R=block_r, BLOCK_K=block_k, num_warps=4)
    return out


_ROWWISE_OK: dict = {}


def fp8_gemm(a8: torch.Tensor, ra: torch.Tensor, b8: torch.Tensor, rb: torch.Tensor,
             out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``(e4m3(a8) * ra[:, None]) @ (e4m3(b8) * rb[:, None])^T`` (+ bias) on FP8 tensor cores.

    Row-wise power-of-two scales inside ``torch._scaled_mm`` when the build supports them for
    ``out_dtype``; otherwise a float32 GEMM with unit scales and the scales applied in float32.
    """
    A = a8.view(torch.float8_e4m3fn)
    B = b8.view(torch.float8_e4m3fn).t()
    key = (a8.device.type, out_dtype)
    if _ROWWISE_OK.get(key, True):
        try:
            y = torch._scaled_mm(A, B, scale_a=ra.reshape(-1, 1), scale_b=rb.reshape(1, -1),
                                 out_dtype=out_dtype, use_fast_accum=False)
            _ROWWISE_OK[key] = True
            return y if bias is None else y + bias.to(out_dtype)
        except (RuntimeError, NotImplementedError):
            _ROWWISE_OK[key] = False
    y = fp8_gemm_raw(a8, b8, torch.float32) * ra.reshape(-1, 1) * rb.reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


_E5M2_OK: dict = {}
_RAW_OK: dict = {}
_ONE: dict = {}


def _one(device) -> torch.Tensor:
    one = _ONE.get(device)
    if one is None:
        one = _ONE[device] = torch.ones((), dtype=torch.float32, device=device)
    return one


def fp8_gemm_raw(a8: torch.Tensor, b8: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``e4m3(a8) @ e4m3(b8)^T`` without the operands' row scales (unit tensor-wise scales: cuBLAS's
    tensor-wise kernel; H200: 0.435 -> 0.400 ms for dX at (16384, 4096, 4096), 1.51 -> 1.41 for dW at
    (16384, 4096, 14336) against the row-wise one). The backward's GEMMs: ``mask_ihadamard`` applies the
    power-of-two row scales of both operands, which gives the same values as scaling inside the GEMM (a
    power-of-two factor commutes with the rounding to ``out_dtype``, bfloat16 or float32 here
    (``_grad_gemm_dtype``), whose range holds the unscaled sums: at most 448**2 * K)."""
    one = _one(a8.device)
    A = a8.view(torch.float8_e4m3fn)
    B = b8.view(torch.float8_e4m3fn).t()
    key = (a8.device.type, out_dtype)
    if _RAW_OK.get(key, True):  # builds without a 16-bit output: float32, then rounded (the same values)
        try:
            y = torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=out_dtype, use_fast_accum=False)
            _RAW_OK[key] = True
            return y
        except (RuntimeError, NotImplementedError):
            _RAW_OK[key] = False
    return torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.float32,
                            use_fast_accum=False).to(out_dtype)


def fp8_gemm_e5m2(x8: torch.Tensor, rx: torch.Tensor, w8: torch.Tensor, rw: torch.Tensor, sw: torch.Tensor,
                  out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``(e5m2(x8) * rx[:, None]) @ (e4m3(w8) * rw[:, None])^T`` (+ bias): the forward GEMM of
    ``quest_e5m2`` activations and ``quest_fp8(tensor_offset=True)`` weights (``sw`` its tensor scale).

    One tensor-wise scaled FP8 GEMM (``torch._scaled_mm``, scale_a = 1, scale_b = sw: cuBLAS's
    tensor-wise kernels ran 4-8% faster than its row-wise ones on the H200) and ``_fp8_rescale_kernel``
    for the output tiles of rows (rx != 1) and columns (rw != sw) embedded at their own offsets, which
    usually returns at once. Equal to the row-wise scaled GEMM up to float32 accumulation order."""
    one = _one(x8.device)
    y = torch._scaled_mm(x8.view(torch.float8_e5m2), w8.view(torch.float8_e4m3fn).t(), scale_a=one, scale_b=sw,
                         out_dtype=out_dtype, use_fast_accum=False)
    M, N = y.shape
    grid = (cdiv(M, 128), cdiv(N, 1024))
    fast(_fp8_rescale_kernel)[grid](y, rx, rw, sw, M, N, BLOCK_M=128, BLOCK_N=1024, SUB_M=8, num_warps=4)
    return y if bias is None else y + bias.to(out_dtype)


def e5m2_gemm_supported(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` multiplies E5M2 by E4M3 here (tried once per device type)."""
    key = device.type
    if key not in _E5M2_OK:
        try:
            a = torch.zeros(16, 32, device=device, dtype=torch.float8_e5m2)
            b = torch.zeros(16, 32, device=device, dtype=torch.float8_e4m3fn)
            one = torch.ones((), dtype=torch.float32, device=device)
            torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            _E5M2_OK[key] = True
        except (RuntimeError, NotImplementedError, TypeError):
            _E5M2_OK[key] = False
    return _E5M2_OK[key]


def e5m2_dequant(q8: torch.Tensor, rs: torch.Tensor) -> torch.Tensor:
    """float32 values of an (R, L) E5M2 uint8 tensor with row scales."""
    return q8.view(torch.float8_e5m2).float() * rs.reshape(-1, 1)


def e4m3_dequant(q8: torch.Tensor, rs: torch.Tensor) -> torch.Tensor:
    """float32 values of an (R, L) E4M3 uint8 tensor with row scales."""
    return q8.view(torch.float8_e4m3fn).float() * rs.reshape(-1, 1)


def unpack_mask(words: torch.Tensor) -> torch.Tensor:
    """int32 mask words (R, L/32) -> bool (R, L)."""
    lane = torch.arange(32, device=words.device, dtype=torch.int32)
    return ((words.unsqueeze(-1) >> lane) & 1).bool().reshape(words.shape[0], -1)


def _row_max_buffer(R: int, device, row_max: int) -> torch.Tensor:
    """int32 -127s: ROW_MAX 0: a dummy; 1: the row maxima (R); 2: also the tensor maximum's slots
    (R + 32 * _TMAX_SLOTS)."""
    n = (0, R, R + 32 * _TMAX_SLOTS)[int(row_max)] or 1
    return torch.full((n,), -127, dtype=torch.int32, device=device)


def _quest_tiles(a, block_r, block_k):
    """(R, K, block_r, block_k, HDOT, grid) of a QuEST launch on the 2-D ``a`` (the default tiles above)."""
    R, K = a.shape
    hd = _hdot_for(a.dtype)
    block_k = block_k or _QUEST_BLOCK_K
    rows = _block_rows(R)
    if hd != _HDOT_F32 and cdiv(R, 32) * cdiv(K, block_k) >= 8192:
        # short but wide 16-bit operands (a (4096, 14336) weight) have programs enough for 32 rows too:
        # 0.1345 -> 0.1176 ms there (H200); 16-bit sums do not depend on the tile shape
        rows = 32
    block_r = block_r or rows * 128 // block_k
    return R, K, block_r, block_k, hd, (cdiv(R, block_r), cdiv(K, block_k))


def _quest_mx(a, block_r, block_k, row_max, with_mask=True):
    R, K, block_r, block_k, hd, grid = _quest_tiles(a, block_r, block_k)
    p = torch.empty(R, K // 2, dtype=torch.uint8, device=a.device)
    sc = torch.empty(R, K // 32, dtype=torch.uint8, device=a.device)
    mask = torch.empty(R, K // 32, dtype=torch.int32, device=a.device) if with_mask else None
    emax = _row_max_buffer(R, a.device, row_max)
    # ROW_MAX 2: every (row, K tile) entry of the row-minimum table is written
    tab = torch.empty(R, grid[1], dtype=torch.int8, device=a.device) if row_max == 2 else None
    fast(_quest_mxfp4_kernel)[grid](a, a.stride(0), a.stride(1), _hmat(str(a.device), hd), p, sc,
                                    sc if mask is None else mask, emax, emax if tab is None else tab, R, K,
                                    ROW_MAX=int(row_max), OUT=0, WITH_MASK=with_mask, HDOT=hd, BLOCK_R=block_r,
                                    BLOCK_K=block_k, num_warps=4, maxnreg=_QUEST_MAXNREG)
    return p, sc, mask, emax, tab


def quest_mxfp4(a: torch.Tensor, block_r: int | None = None, block_k: int | None = None):
    """Hadamard + QuEST of a 2-D (R, K) tensor as packed MXFP4: (codes uint8 (R, K/2), element 2i in the
    low nibble; E8M0 scale bytes uint8 (R, K/32), 255 = NaN group; mask words int32 (R, K/32)).

    ``FP4Tensor(codes, scales.view(torch.float8_e8m0fnu), None, "mxfp4", 1, a.shape, a.dtype)`` is
    the quantized operand (its ``dequantize()`` equals the reference QuEST values)."""
    return _quest_mx(a, block_r, block_k, row_max=False)[:3]


def _sr_mx(a, sign_seed, noise_seed, scale, noise, signs, block_r, block_l, row_max, hw=None, a_fmt="e4m3",
           seeds=None, out=None):
    """``hw``: the kernels' GPU-only forms (default: compiled, not interpreted; tests compare both).
    ``seeds``: int32 device draws (``backward_draws``); ``noise_seed`` is then an index into them.
    ``out``: the (codes, scale bytes, row-maximum table) to write (row blocks of larger buffers)."""
    if a_fmt not in ("e4m3", "e5m2"):
        raise ValueError(f"a_fmt: expected 'e4m3' or 'e5m2', got {a_fmt!r}")
    R, L = a.shape
    block_r = block_r or _SR_BLOCK_R
    if signs is None:
        signs = random_signs(sign_seed, L, a.device)
    LP = (L + 31) // 32 * 32
    a_fp8 = a.dtype == torch.uint8
    if a_fp8 and scale is None:
        raise ValueError("scale: required (float32, one per column) when a holds E4M3 bytes (uint8)")
    hd = _hdot_for(torch.bfloat16 if a_fp8 else a.dtype)  # E4M3/E5M2 * 2**k * (+-1) is exact in bf16
    grid = (cdiv(R, block_r), cdiv(LP, block_l))
    if out is not None:
        p, sc, emax = out
    else:
        p = torch.empty(R, LP // 2, dtype=torch.uint8, device=a.device)
        sc = torch.empty(R, LP // 32, dtype=torch.uint8, device=a.device)
        # row maxima as an int8 table of per-tile maxima (every entry written: no fill launch, no atomics)
        emax = torch.empty(R, grid[1], dtype=torch.int8, device=a.device) if row_max else sc
    fast(_sr_mxfp4_kernel)[grid](a, a.stride(0), a.stride(1), scale if a_fp8 else p, _hmat(str(a.device), hd),
                                 noise if noise is not None else p, signs, p if seeds is None else seeds, noise_seed, p,
                                 sc, emax, R, L, LP, ROW_MAX=2 if row_max else 0,
                                 A_FP8=(0 if not a_fp8 else 1 if a_fmt == "e4m3" else 2), HAS_NOISE=noise is not None,
                                 SEED_PTR=seeds is not None,
                                 HW=not _INTERPRET if hw is None else hw, HDOT=hd, BLOCK_R=block_r, BLOCK_L=block_l,
                                 num_warps=4)
    return p, sc, emax


def sr_mxfp4(a: torch.Tensor, *, sign_seed: int, noise_seed: int, scale: torch.Tensor | None = None,
             noise: torch.Tensor | None = None, signs: torch.Tensor | None = None, block_r: int | None = None,
             block_l: int = _SR_BLOCK_L, seeds: torch.Tensor | None = None):
    """The backward operand as packed MXFP4: (codes (R, Lp/2), scale bytes (R, Lp/32)) of
    SR(3/4 * (a diag(signs)) H) along the last dim, L padded to 32. ``a``, ``scale``, ``noise``,
    ``seeds`` as in :func:`sr_fp8` (which converts this result to the FP8 embedding)."""
    return _sr_mx(a, sign_seed, noise_seed, scale, noise, signs, block_r, block_l, row_max=False, seeds=seeds)[:2]


def mxfp4_dequant(p: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """float32 values of packed MXFP4 rows (codes (R, L/2), E8M0 scale bytes (R, L/32))."""
    codes = unpack_last(p)
    R, L = codes.shape
    s = torch.ldexp(torch.ones(sc.shape, device=p.device), sc.to(torch.int32) - 127)
    s = torch.where(sc == 255, torch.full_like(s, float("nan")), s)
    return (_e2m1_decode_torch(codes).reshape(R, L // 32, 32) * s.unsqueeze(-1)).reshape(R, L)


def mxfp4_gemm(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
               out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``A @ B^T`` (+ bias) for packed MXFP4 rows A (M, K/2) / B (N, K/2) with E8M0 scales.

    CUDA: the ``tl.dot_scaled`` kernel (native MXFP4 MMA on Blackwell; Triton emulates it elsewhere).
    CPU: a float32 emulation (tests of the plumbing; the interpreter has no ``dot_scaled``)."""
    M, N, K = a.shape[0], b.shape[0], a.shape[1] * 2
    if not a.is_cuda:
        y = mxfp4_dequant(a, sa) @ mxfp4_dequant(b, sb).t()
        return (y if bias is None else y + bias.float()).to(out_dtype)
    c = torch.empty(M, N, dtype=out_dtype, device=a.device)
    grid = (cdiv(M, 128), cdiv(N, 128))
    fast(_mxfp4_gemm_kernel)[grid](a, sa, b, sb, c, bias if bias is not None else c, M, N, K,
                                   HAS_BIAS=bias is not None, FMT="e2m1", BLOCK_M=128, BLOCK_N=128, BLOCK_K=128,
                                   num_warps=8, num_stages=3)
    return c


def gemm_path(device: torch.device) -> str:
    """"mxfp4" (native FP4 tensor cores, compute capability >= 10) or "fp8" (the exact FP8 embedding,
    Hopper/Ada). ``FP4ATTN_QUARTET_GEMM=fp8|mxfp4`` overrides."""
    env = os.environ.get("FP4ATTN_QUARTET_GEMM", "")
    if env in ("fp8", "mxfp4"):
        return env
    if device.type == "cuda" and _dispatch.capability(device)[0] >= 10:
        return "mxfp4"
    return "fp8"


# ----------------------------------------------------------------------------------------------
# Dispatch and autograd
# ----------------------------------------------------------------------------------------------
def supported(x: torch.Tensor, weight: torch.Tensor, hadamard_group: int) -> bool:
    """Whether the CUDA path handles this call (else the reference runs)."""
    if not (x.is_cuda and weight.is_cuda) or hadamard_group != 32:
        return False
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    N, K = weight.shape
    if K % 32 or N % 32 or not hasattr(torch, "_scaled_mm"):
        return False
    if _dispatch.capability(x.device) < (8, 9):  # FP8 tensor cores: Ada, Hopper, Blackwell
        return False
    M = x.numel() // K
    return max(M, 1) * max(K, N) < 2 ** 31 and (M + 31) * max(K, N) < 2 ** 31


def _sub_seeds(seed: int, n: int):
    return [_splitmix64(seed * 8 + i) & 0x7FFFFFFF for i in range(n)]


def _grad_gemm_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.float32 else torch.bfloat16


def quantize_weight(weight: torch.Tensor, path: str | None = None, with_mask: bool = True):
    """The forward's weight quantization for ``path`` (``gemm_path`` by default): ``(path, tensors)``.
    ``with_mask=False``: no trust mask (the "fp8" path's tensors[1] is then None), for forwards that no
    gradient of the weight follows."""
    path = path or gemm_path(weight.device)
    return path, (quest_mxfp4(weight) if path == "mxfp4"
                  else quest_fp8(weight, tensor_offset=True, with_mask=with_mask))


def _forward(x, weight, bias, w_quantized, mask_x: bool, mask_w: bool):
    """The forward's quantizers and GEMM -> (y, xq, wq, x_fmt, path): the output (x's shape, last dim
    N, x's dtype), the quantized operands as the backward reads them, the activation's FP8 format and
    the GEMM path. The trust masks (the "fp8" path) only where a gradient follows: ``mask_x`` for dX,
    ``mask_w`` for dW (each costs ~15% of its quantizer)."""
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    path = gemm_path(x.device)
    out_dtype = x.dtype if x.dtype != torch.float16 else torch.float32
    x_fmt = "e5m2" if path == "fp8" and e5m2_gemm_supported(x.device) else "e4m3"
    with torch.autocast(x.device.type, enabled=False):
        # the activation first: its long kernel hides the weight quantizer's short launches
        if path == "mxfp4":
            xq = quest_mxfp4(x2)
        elif x_fmt == "e5m2":
            # E5M2 straight from the quantizer (no row offsets in practice)
            xq = quest_e5m2(x2, with_mask=mask_x)
        else:
            xq = quest_fp8(x2, with_mask=mask_x)
        if (w_quantized is None or w_quantized[0] != path
                or (path == "fp8" and mask_w and w_quantized[1][1] is None)):
            w_quantized = quantize_weight(weight, path, with_mask=mask_w)
        wq = w_quantized[1]
        if path == "mxfp4":
            y = mxfp4_gemm(xq[0], xq[1], wq[0], wq[1], out_dtype, bias)
        elif x_fmt == "e5m2":  # the weight at its tensor offset: one tensor-wise scaled GEMM
            y = fp8_gemm_e5m2(xq[0], xq[2], wq[0], wq[2], wq[3], out_dtype, bias)
        else:
            y = fp8_gemm(xq[0], xq[2], wq[0], wq[2], out_dtype, bias)
    return y.to(x.dtype).reshape(*x.shape[:-1], N), xq, wq, x_fmt, path


def quartet_linear_cuda(x, weight, bias, rng, hadamard_group: int = 32, w_quantized=None):
    """``QuartetLinearCUDA.apply`` where a gradient can flow (grad mode on and an input that requires
    it); otherwise the forward alone: no trust masks, nothing saved, no autograd node (inference:
    ~10% less quantizer time and less host time per call)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return QuartetLinearCUDA.apply(x, weight, bias, rng, hadamard_group, w_quantized)
    return _forward(x, weight, bias, w_quantized, False, False)[0]


class QuartetLinearCUDA(torch.autograd.Function):
    """``apply(x, weight, bias, rng, hadamard_group, w_quantized=None)`` on CUDA (see module doc).

    The GEMMs run on FP8 tensor cores through the exact embedding (``gemm_path`` "fp8": Hopper, Ada)
    or natively in MXFP4 with ``tl.dot_scaled`` ("mxfp4": Blackwell). Both draw the same signs and
    noise, so they agree up to float32 accumulation order. ``w_quantized``: an earlier
    ``quantize_weight(weight)`` (QuartetLinear's weight cache); ignored if its path differs.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, rng, hadamard_group=32, w_quantized=None):
        y, xq, wq, ctx.x_fmt, ctx.path = _forward(x, weight, bias, w_quantized, ctx.needs_input_grad[0],
                                                  ctx.needs_input_grad[1])
        ctx.save_for_backward(*xq, *wq)
        ctx.K = x.shape[-1]
        ctx.rng = rng
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        needs = ctx.needs_input_grad[:3]
        if not any(needs):
            return None, None, None, None, None, None
        xd, wd, bd = ctx.dtypes
        if ctx.path == "mxfp4":
            xp, xs, mx, wp, ws, mw = ctx.saved_tensors
            M, N = xp.shape[0], wp.shape[0]
            # the saved operands as bf16 (E2M1 times a power of two: exact) for the SR quantizers
            xsrc = mxfp4_dequant(xp, xs).to(torch.bfloat16)
            wsrc = mxfp4_dequant(wp, ws).to(torch.bfloat16)

            def operands(a, b, signs, noise_a, noise_b, scale_b, b_fmt=None):
                return tuple(sr_mxfp4(t, sign_seed=0, noise_seed=n, signs=signs, seeds=seeds)
                             for t, n in ((a, noise_a), (b, noise_b)))

            def gemm(a, b, out_dtype):
                return mxfp4_gemm(a[0], a[1], b[0], b[1], out_dtype), None, None
        else:
            # (q8, mask, rs) of the activation (E5M2 or E4M3: ctx.x_fmt; mask None without dX), and
            # (q8, mask, rs, tensor scale) of the weight (mask None without dW)
            x8, mx, rsx, w8, mw, rsw = ctx.saved_tensors[:6]
            M, N = x8.shape[0], w8.shape[0]
            xsrc, wsrc = x8, w8

            def operands(a, b, signs, noise_a, noise_b, scale_b, b_fmt="e4m3"):
                return sr_fp8_pair(a, b, seeds=seeds, noise_a=noise_a, noise_b=noise_b, signs=signs,
                                   scale_b=scale_b, b_fmt=b_fmt)

            def gemm(a, b, out_dtype):  # unscaled; mask_ihadamard applies both operands' row scales
                return fp8_gemm_raw(a[0], b[0], out_dtype), a[1], b[1]

        K = ctx.K
        dy2 = dy.reshape(M, N)
        if not dy2.is_contiguous():
            dy2 = dy2.contiguous()
        dx = dw = db = None
        # the step's sub-seeds (sign x, g, w, sign w, gᵀ, x) and both sign vectors, drawn on the device
        seeds, signs_x, signs_w = backward_draws(ctx.rng, dy.device, N if needs[0] else 0, M if needs[1] else 0)
        if needs[0]:  # g (M, N), wᵀ (K, N); signs_x: the same for both operands of the GEMM
            g, wt = operands(dy2, wsrc.t(), signs_x, 1, 2, None if ctx.path == "mxfp4" else rsw)
            dxq, ra, rb = gemm(g, wt, _grad_gemm_dtype(xd))  # (M, K)
            dx = mask_ihadamard(dxq, mx, xd, row_scale=ra, col_scale=rb).reshape(*dy.shape[:-1], K)
        if needs[1]:
            # gᵀ (N, Mp), xᵀ (K, Mp)
            gt, xt = operands(dy2.t(), xsrc.t(), signs_w, 4, 5, None if ctx.path == "mxfp4" else rsx, ctx.x_fmt)
            dwq, ra, rb = gemm(gt, xt, _grad_gemm_dtype(wd))  # (N, K)
            dw = mask_ihadamard(dwq, mw, wd, row_scale=ra, col_scale=rb)
        if needs[2]:
            db = dy2.float().sum(0).to(bd)
        return dx, dw, db, None, None, None
