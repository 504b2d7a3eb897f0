"""The FP4 formats once more, as ``@triton.jit`` helpers that every kernel imports.

Same rules as ``fp4attn.formats.core`` (the PyTorch source of truth), written with float arithmetic
and integer bit tricks only, no per-bit branching, so that they are cheap in registers:

* ``rint``: round to nearest even with the 1.5*2**23 magic constant (valid for |x| < 2**22).
* E2M1: below 2 round to a multiple of 0.5 with a magic constant; from 2 up round the float32 bits to
  one mantissa bit (nearest even, an integer add and mask); saturate at 6. Ties go to the even code.
* E4M3: the same with a 3-bit mantissa, the binade read from the float32 exponent bits, subnormal
  quantum 2**-9, saturating at 448.
* E8M0: the exponent of the block max read from its bits (exact, no log2).

They run in the Triton interpreter too (TRITON_INTERPRET=1), where tests compare them bit for bit
with the PyTorch formats.
"""

import triton
import triton.language as tl

_RINT_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23 (a constexpr: jit code may only read those)
_HALF_MAGIC = tl.constexpr(6291456.0)  # 1.5 * 2**22: float32 spacing 0.5
# compiled for a GPU (inline PTX allowed) rather than run by the interpreter; fixed at import, like the
# kernels themselves (TRITON_INTERPRET decides at decoration time which kind of function they are)
_GPU_ASM = tl.constexpr(__import__("os").environ.get("TRITON_INTERPRET", "0") in ("", "0"))


@triton.jit
def rint(x):
    """Round float32 to the nearest integer, ties to even; |x| < 2**22."""
    return (x + _RINT_MAGIC) - _RINT_MAGIC


@triton.jit
def exp2i(e):
    """2**e as float32 for an int32 e in [-149, 127] (subnormal results included)."""
    normal = ((e + 127) << 23).to(tl.float32, bitcast=True)
    sub = (1 << tl.minimum(tl.maximum(e + 149, 0), 30)).to(tl.float32, bitcast=True)
    return tl.where(e >= -126, normal, sub)


@triton.jit
def e2m1_round_abs(a):
    """|v| (float32, >= 0) -> nearest E2M1 magnitude, ties to even code, saturating at 6.

    Saturate first (rounding is monotone and 6 is on the grid, so min(round(a), 6) == round(min(a, 6))).
    Then one magic-constant rounding for every binade: the E2M1 grid has spacing 0.5 below 2 and one
    mantissa bit (spacing 2^(k-1) in [2^k, 2^(k+1))) from 1 up. With f = max(2^k, 1) (the float
    exponent bits of a, then max with 1.0), the constant M = f * 1.5 * 2^22 lies in [2^(k+22),
    2^(k+23)), whose float32 spacing is exactly the grid spacing: M + a is rounded to the grid (ties
    to even: M is an even number of spacings, so even sums = even codes) and subtracting M again is
    exact. f * 1.5 * 2^22 is exact, so each fma is a plain add of +-M (the interpreter's unfused fma
    gives the same bits). 5 instructions (was 9: two rounding paths and a select). Equal to the former
    two-path version on every float32 in [0, +inf] (checked exhaustively; tests/test_formats.py checks
    a dense subset against the reference)."""
    a = tl.minimum(a, 6.0)
    f = tl.maximum((a.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True), 1.0)
    r = tl.fma(f, _HALF_MAGIC, a)
    return tl.fma(f, -_HALF_MAGIC, r)


@triton.jit
def e2m1_round(v):
    """float32 -> nearest E2M1 value (float32), sign kept."""
    # The sign is copied as a bit: Triton's unary minus is 0 - x, which turns -0.0 into +0.0, and
    # the reference keeps the sign of values that round to zero (-0.1 -> -0.0). NaN -> +0 as there.
    r = tl.where(v == v, e2m1_round_abs(tl.abs(v)), 0.0)
    sign = tl.where(v == v, v.to(tl.int32, bitcast=True) & -2147483648, 0)
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_code(v):
    """float32 -> E2M1 code (uint8, sign in bit 3), round to nearest, ties to even; NaN -> 0.

    ``e2m1_code_i32`` with NaN masked (that helper leaves NaN's code unspecified)."""
    return tl.where(v == v, e2m1_code_i32(v), 0).to(tl.uint8)


@triton.jit
def e2m1_decode(code):
    """E2M1 code (integer, low 4 bits) -> float32 value."""
    c = code.to(tl.int32)
    m = c & 7
    mf = m.to(tl.float32)
    mag = tl.where(m < 4, mf * 0.5, tl.where(m < 6, mf - 2.0, mf * 2.0 - 8.0))
    # sign as a bit (code 0x8 is -0.0): Triton's unary minus is 0 - x and would give +0.0
    return (mag.to(tl.int32, bitcast=True) | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_round(x):
    """float32 x >= 0 -> nearest E4M3 value (float32), ties to even, saturating at 448.

    ``e2m1_round_abs``'s method with a 3-bit mantissa: saturate first (448 is on the grid), then add
    and subtract M = 1.5 * 2^20 * max(2^k, 2^-6) for x in [2^k, 2^(k+1)): M's float32 spacing is
    2^(k-3), the E4M3 spacing of that binade (2^-9 in the subnormal range below 2^-6). 5 instructions
    (was 9 with two exponent-built factors). Same bits as the former version on every float32 in
    [0, +inf] (checked exhaustively)."""
    x = tl.minimum(x, 448.0)
    f = tl.maximum((x.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True), 0.015625)
    r = tl.fma(f, 1572864.0, x)
    return tl.fma(f, -1572864.0, r)


@triton.jit
def mx_exponent(amax, FLOOR: tl.constexpr):
    """Block amax (float32 >= 0, finite) -> E8M0 exponent (int32, clamped to [-127, 127])."""
    bits = amax.to(tl.int32, bitcast=True)
    e0 = ((bits >> 23) & 0xFF) - 127
    if FLOOR:
        e = e0 - 2
    else:
        e = tl.where((bits & 0x7FFFFF) <= 0x400000, e0 - 2, e0 - 1)
    e = tl.where(amax > 0, e, -127)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def block_amax(xb):
    """Max |x| over the last axis of a (..., BLOCK) tile; NaN/Inf are ignored (flag them apart)."""
    a = tl.abs(xb)
    a = tl.where(a < float("inf"), a, 0.0)
    return tl.max(a, axis=-1)


@triton.jit
def block_amax_bad(xb):
    """(``block_amax``, ``block_bad``) of a (..., BLOCK) float32 tile with one reduction: the integer
    max of the |x| bit patterns (NaN and Inf patterns lie above every finite one). amax is 0 for a
    block flagged bad (callers replace such blocks)."""
    m = tl.max(xb.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=-1)
    bad = (m >= 0x7F800000).to(tl.int32)
    return tl.where(bad != 0, 0, m).to(tl.float32, bitcast=True), bad


@triton.jit
def finite_abs_bits(v):
    """|x| as int32 float32 bits for the float32 bit patterns v (int32, the sign bit set or cleared),
    0 for NaN and ±Inf: their integer max is the bits of the largest finite |x| (a block amax that ignores
    non-finite values, or the tensor amax of an NVFP4 global scale)."""
    a = v & 0x7FFFFFFF
    return tl.where(a < 0x7F800000, a, 0)


@triton.jit
def block_bad(xb):
    """1 where the last axis of a (..., BLOCK) float32 tile holds NaN or ±Inf, else 0 (int32), from the
    sum of x·0: each term is ±0 for a finite x and NaN for NaN or ±Inf, a sum of zeros is a zero (never
    NaN) and a NaN term makes the sum NaN. Products and reduction contract to one FFMA per element on
    the GPU (a compare, a select and an integer max before)."""
    z = tl.sum(xb * 0.0, axis=-1)
    return (z != z).to(tl.int32)


@triton.jit
def fake_quant_blocks(xb, IS_MX: tl.constexpr, EXACT_DIV: tl.constexpr):
    """Fake-quantize a (R, NB, BLOCK) float32 tile with blocks along the last axis (no global scale).

    Returns float32 values ``code * scale`` (NaN for blocks holding NaN/Inf). With EXACT_DIV the
    NVFP4 quotient ``x / s`` is IEEE-rounded as in the reference (``div_rn_by``: one reciprocal per
    block); otherwise it multiplies by the reciprocal (SPEC §2 allows that: >= 99.99%
    equal codes, never more than one step apart).
    """
    amax = block_amax(xb)
    if IS_MX:
        e = mx_exponent(amax, False)
        s = exp2i(e)
        v = xb * exp2i(-e)[:, :, None]
    else:
        s = nvfp4_scale(amax)
        if EXACT_DIV:
            y, m8 = e2m1_recip(s)
            v = div_rn_by(xb, s[:, :, None], y[:, :, None])
        else:
            v = xb * (1.0 / s)[:, :, None]
        v = tl.where(s[:, :, None] > 0, v, 0.0)
    bad = block_bad(xb)
    s = tl.where(bad != 0, float("nan"), s)
    return e2m1_round(v) * s[:, :, None]


@triton.jit
def fake_quant_rows(x, BLOCK: tl.constexpr, IS_MX: tl.constexpr, EXACT_DIV: tl.constexpr):
    """Fake-quantize an (R, C) float32 tile in blocks of BLOCK along its last axis."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    xb = tl.reshape(x, (R, C // BLOCK, BLOCK))
    return tl.reshape(fake_quant_blocks(xb, IS_MX, EXACT_DIV), (R, C))


@triton.jit
def fake_quant_p(p, BLOCK: tl.constexpr, IS_MX: tl.constexpr, F16: tl.constexpr = False):
    """Fake-quantize a tile of P~ = exp(S - m) (finite, >= 0) in blocks of BLOCK along keys.

    The cheap path for attention inner loops: no NaN handling (P~ is finite by construction) and a
    reciprocal instead of a division. MXFP4 rounds directly on the scaled grid (``e2m1_round_pow2``:
    the same bits as rounding p * 2^-e and scaling back, without the two multiplies); P~ must stay
    below 2^100 there (P~ <= 1 in attention, <= 448 * 6 after a two-level scale).

    ``F16`` (NVFP4): return the values in float16, for an fp16 MMA operand. The E2M1 values are
    converted first (two per instruction) and multiplied by the scale in fp16, two per HMUL2: half the
    instructions of a float32 multiply and a conversion after it, and the same bits, since an E2M1 value
    times an E4M3 scale (<= 6 * 448, >= 2^-10 or 0, at most 5 significant bits) is exact in float16.
    """
    R: tl.constexpr = p.shape[0]
    C: tl.constexpr = p.shape[1]
    pb = tl.reshape(p, (R, C // BLOCK, BLOCK))
    amax = tl.max(pb, axis=2)
    if IS_MX:
        q = e2m1_round_pow2(pb, mx_scale_rceil(amax)[:, :, None])
    else:
        # s is 0 or in [2^-9, 448]. For s == 0 the old inv = 0 gave q = 0; 1/max(s, 2^-9) = 512 keeps
        # p * inv finite (s == 0 means amax <= 6 * 2^-10 (1 + 2^-23), so p * 512 <= 3.01) and q =
        # round(.) * 0 = +0 all the same, one max instead of a compare and a select.
        s, inv = p_block_scale(amax)
        if F16:
            q = e2m1_round_abs(pb * inv[:, :, None]).to(tl.float16) * s.to(tl.float16)[:, :, None]
        else:
            q = e2m1_round_abs(pb * inv[:, :, None]) * s[:, :, None]
    return tl.reshape(q, (R, C))


@triton.jit
def e2m1_round_abs_f16(a):
    """``e2m1_round_abs`` for float16 |v| (>= 0): the same magic-constant rounding at float16 precision,
    two values per instruction (HMNMX2 / LOP3 / HFMA2). For a in [2^k, 2^(k+1)), f = max(2^k, 1) and M =
    768 f lies in [2^(k+9), 2^(k+10)), whose float16 spacing 2^(k-1) is the E2M1 spacing of that binade (0.5
    below 2); M is an even number of spacings, so M + a rounds to the grid with ties to the even code, and
    subtracting M is exact. Exactly the E2M1 rounding of the float16 input (every float16 in [0, +inf]:
    tests/test_quantize_kernels.py)."""
    h = tl.float16  # (python floats would promote the operations to float32)
    a = tl.minimum(a, tl.cast(6.0, h))
    f = tl.maximum((a.to(tl.int16, bitcast=True) & 0x7C00).to(h, bitcast=True), tl.cast(1.0, h))
    r = tl.fma(f, tl.cast(768.0, h), a)
    return tl.fma(f, tl.cast(-768.0, h), r)


@triton.jit
def fake_quant_p_f16(p, BLOCK: tl.constexpr):
    """NVFP4 ϕ(P̃) of a (rows, keys) tile in float16 arithmetic: P̃ (float32, finite, >= 0) is rounded to
    float16 first, its block maxima give the E4M3 scales (float32, as ``fake_quant_p``), and P̃₁₆ · (1/s)₁₆
    is rounded to float16 before the E2M1 rounding (``e2m1_round_abs_f16``) -- half the instructions of
    the float32 rounding. Returns ϕ(P̃) in float16 (exact: an E2M1 value times an E4M3 scale).

    Not the reference's bits: P̃ and the quotient carry float16's 11 significant bits instead of 24, so a
    code flips where a value lies within ~2^-11 (relative) of an E2M1 rounding boundary. Measured against
    the float32 rounding on N(0,1) attention (N = 1024-4096, D = 64/128): ~1.3e-2 relative L2 of the
    output, and the same error against exact attention (1.0000x); SPEC §6 allows 0.05. Used by the Gluon attention
    pass (single-level, P̃ <= 1) and the Triton pass's two-level P (sage3, P̃/s1 <= 2688: inside float16's range)."""
    R: tl.constexpr = p.shape[0]
    C: tl.constexpr = p.shape[1]
    pb = tl.reshape(p, (R, C // BLOCK, BLOCK)).to(tl.float16)
    return tl.reshape(phi_blocks_f16(pb, tl.max(pb, axis=2, keep_dims=True)), (R, C))


@triton.jit
def p_block_scale(m):
    """ϕ(P̃)'s E4M3 block scale s of a block maximum m (float32 >= 0) and the reciprocal 1/s (float32) the
    values are multiplied by (for s == 0, a block of zeros or one that underflows, 1/2^-9: see fake_quant_p)."""
    s = e4m3_round(m * (1.0 / 6.0))
    return s, rcp_approx(tl.maximum(s, 0.001953125))


@triton.jit
def phi_blocks_f16(pb, m):
    """``fake_quant_p_f16``'s rounding of float16 P̃ values ``pb`` whose blocks have the maxima ``m`` (float16, the
    block dims kept, broadcast against pb): for callers that group a tile's blocks their own way (the Gluon
    attention pass holds each block in one thread)."""
    s, inv = p_block_scale(m.to(tl.float32))
    return e2m1_round_abs_f16(pb * inv.to(tl.float16)) * s.to(tl.float16)


# ``phi_blocks_f16``'s rounding on f16x2 words (GPU only): $0 = E2M1(min(P̃ · (1/s), 6)) · s on both halves of
# the word $1 = P̃ (two float16), $2 = 1/s and $3 = s (float16, in both halves): the products, ``e2m1_round_abs_f16``'s
# magic-constant steps (6 = 0x4600, exponent mask 0x7C00, 1 = 0x3C00, ±768 = 0x6200 / 0xE200) and the multiply by
# s, each one f16x2 instruction, rounded to nearest as the float16 operations of ``phi_blocks_f16`` are (``.rn``:
# no contraction of a multiply into a following add).
PHI_F16X2_PTX = tl.constexpr(" ".join([
    "{ .reg .b32 a, f, c;",
    "mul.rn.f16x2 a, $1, $2;", "mov.b32 c, 0x46004600;", "min.f16x2 a, a, c;",
    "and.b32 f, a, 0x7C007C00;", "mov.b32 c, 0x3C003C00;", "max.f16x2 f, f, c;",
    "mov.b32 c, 0x62006200;", "fma.rn.f16x2 a, f, c, a;", "mov.b32 c, 0xE200E200;", "fma.rn.f16x2 a, f, c, a;",
    "mul.rn.f16x2 $0, a, $3; }"]))


@triton.jit
def f16x2_pack(lo, hi):
    """Two float32 tensors -> int32 words holding float16(lo) in the low and float16(hi) in the high half (round to
    nearest; GPU only)."""
    return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def f16x2_max(a, b):
    """Halfwise maximum of two f16x2 words (int32; GPU only)."""
    return tl.inline_asm_elementwise("max.f16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def f16x2_hmax_f32(w):
    """The larger half of an f16x2 word (int32) as float32 (GPU only)."""
    return tl.inline_asm_elementwise("{ .reg .b16 l, h; mov.b32 {l, h}, $1; max.f16 l, l, h; cvt.f32.f16 $0, l; }",
                                     "=r,r", [w], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def fake_quant_p_words(p):
    """``fake_quant_p_f16`` (the same bits; GPU only) of a (rows, keys) float32 tile whose 16-key blocks are the
    columns 64g + 8j + 2q + e (j = 0..7, e = 0, 1) of each g and q: the key order of the Gluon attention pass
    (``_tiles.key_position``), where a thread holds a whole block of its row. Computed on f16x2 words that pair
    columns 2i and 2i + 1, i.e. the two values of one register pair of a wgmma accumulator fragment, which is
    also the pairing of a register A operand: the block maxima by ``max.f16x2`` over the block's 8 words, then
    the larger half; the rounding by ``PHI_F16X2_PTX``. Left to the compiler, the float16 values of the Gluon pass
    were paired across rows for the maxima and re-paired by byte permutes for the rest (~34 PRMT per 64x64 tile)."""
    R: tl.constexpr = p.shape[0]
    C: tl.constexpr = p.shape[1]
    pe, po = tl.split(tl.reshape(p, [R, C // 2, 2]))
    w = tl.reshape(f16x2_pack(pe, po), [R, C // 64, 8, 4])  # word [., g, j, q]: columns 64g + 8j + 2q + {0, 1}
    s, inv = p_block_scale(f16x2_hmax_f32(tl.reduce(w, 2, f16x2_max, keep_dims=True)))
    q = tl.inline_asm_elementwise(PHI_F16X2_PTX, "=r,r,r,r", [w, f16x2_pack(inv, inv), f16x2_pack(s, s)],
                                  dtype=tl.int32, is_pure=True, pack=1)
    return tl.reshape(f16x2_halves(tl.reshape(q, [R, C // 2]), tl.float16), [R, C])


@triton.jit
def f16x2_halves(w, DT: tl.constexpr):
    """int32 words -> (..., 2) of the 16-bit dtype DT: [..., e] = half e of the word (a register split)."""
    lo, hi = tl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r", [w], dtype=(DT.value, DT.value),
                                       is_pure=True, pack=1)
    return tl.join(lo, hi)


@triton.jit
def rcp_approx(x):
    """The float32 reciprocal that Triton's ``1.0 / x`` gives on the GPU, for x = 0 or 2^-126 <= |x| <=
    2^126, without its range scaling.

    ``1.0 / x`` lowers to PTX div.full.f32, which ptxas expands into: scale x (and the numerator) by
    1/4 if |x| > 2^126, by 2^24 if |x| < 2^-126, then MUFU.RCP and one multiply by the numerator
    factor -- 1.0 inside that range, so the result is MUFU.RCP(x), exactly what rcp.approx.ftz.f32
    compiles to (ftz only matters for subnormal x or results, none here; x = 0 gives +inf in both).
    7 instructions less per value. The interpreter computes 1.0 / x as before."""
    if _GPU_ASM:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x


@triton.jit
def mx_scale_rceil(amax):
    """``exp2i(mx_exponent(amax, False))`` (the rceil E8M0 scale 2^e as float32) for finite amax in
    [0, 1.5 * 2^127), in 4 instructions instead of ~15.

    rceil takes e = e0 - 2, or e0 - 1 when the mantissa field exceeds 0x400000: adding 0x3FFFFF to the
    bits carries into the exponent exactly then, and the masked exponent bits times 1/4 are 2^e (a
    power-of-two product, exact also when it lands on the subnormal 2^-127); the max with 2^-125
    before the 1/4 is mx_exponent's lower clamp at 2^-127, and covers amax = 0 and subnormal amax
    (their masked bits read 0 or 2^-126). Same bits as before for every float32 amax in [0, 1.5 * 2^127) (checked
    exhaustively)."""
    b = ((amax.to(tl.int32, bitcast=True) + 0x3FFFFF) & 0x7F800000).to(tl.float32, bitcast=True)
    return tl.maximum(b, 2.350988701644575e-38) * 0.25  # max(b, 2^-125) / 4 = max(b / 4, 2^-127)


@triton.jit
def e2m1_round_pow2(x, s):
    """``e2m1_round_abs(x * (1/s)) * s`` for x >= 0 and a power of two s = 2^e, e in [-127, 100]
    (MXFP4 block scales; x < 2^100), in 5 instructions instead of 7.

    Scaling by a power of two commutes with every step of ``e2m1_round_abs`` as long as nothing
    underflows or overflows: saturate at 6s; the binade floor of x/s maxed with 1 becomes the binade
    floor of x maxed with s (for a subnormal x the exponent bits read 0 and the max gives s, which is
    right: x < 2^-126 <= 2s, and below 2s the spacing is s/2 whatever the binade); the magic constant
    1.5 * 2^22 * f >= 1.5 * 2^-105 is a normal float, so M + x rounds to the spacing of M's binade, s
    times the spacing of the unscaled sum, and the subtraction is exact. The old path's products
    x * 2^-e and r * 2^e were exact too (r * 2^e >= 2^-128 is a representable subnormal at worst).
    Same bits as the two-multiply version on every float32 x in [0, 16s] for e in {-127, -126, -125,
    -124, -100, -20, -3, -1, 0, 1, 60, 100} (tools/exactness_checks.py mx)."""
    x = tl.minimum(x, 6.0 * s)
    f = tl.maximum((x.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True), s)
    r = tl.fma(f, _HALF_MAGIC, x)
    return tl.fma(f, -_HALF_MAGIC, r)


@triton.jit
def fake_quant_p_two_level(p, BLOCK: tl.constexpr):
    """SageAttention3's two-level NVFP4 rounding of a (rows, keys) tile of P̃ (>= 0, finite): s1 =
    rowmax(P̃)/(448·6) per row, P̂ = ϕ(P̃/s1) in blocks of BLOCK keys. Returns (P̂, s1); the caller scales
    its product P̂·V by s1 (rows with s1 = 0 get P̂ = 0)."""
    s1 = tl.max(p, 1) * (1.0 / 2688.0)
    inv1 = tl.where(s1 > 0, 1.0 / s1, 0.0)
    return fake_quant_p(p * inv1[:, None], BLOCK, False), s1


@triton.jit
def p_block_scales(amax, IS_MX: tl.constexpr):
    """Block scales of P~ (amax >= 0, finite) -> (scale s, reciprocal 1/s; 0 where s == 0).

    MXFP4: s = 2**e, rceil e (exact reciprocal). NVFP4: s = E4M3(amax * (1/6)), a reciprocal product
    instead of the reference's division (SPEC §2 allows it for kernels).
    """
    if IS_MX:
        e = mx_exponent(amax, False)
        s = exp2i(e)
        inv = exp2i(-e)
    else:
        s = e4m3_round(amax * (1.0 / 6.0))
        inv = tl.where(s > 0, rcp_approx(s), 0.0)  # s = 0 or in [2^-9, 448]: the bits of 1.0 / s
    return s, inv


# ----------------------------------------------------------------------------------------------
# Packed nibbles and exact 16-bit decodes (added for the FP4 attention kernels, issue 4)
#
# Bit plumbing only, no rounding: these move already-quantized FP4 data between its packed storage
# form (SPEC §2: two codes per byte, element 2i in the low nibble) and registers.
# ----------------------------------------------------------------------------------------------
@triton.jit
def unpack_nibbles(b):
    """(..., C) packed uint8 bytes -> (..., 2C) uint8 codes along the last axis (element 2i = low
    nibble of byte i)."""
    return tl.interleave(b & 0xF, (b >> 4) & 0xF)


@triton.jit
def pack_nibbles(codes):
    """(R, C) codes (integers in 0..15, as every E2M1 encoder here returns; C even) -> (R, C/2) bytes in
    the codes' dtype, element 2i in the low nibble."""
    R: tl.constexpr = codes.shape[0]
    C: tl.constexpr = codes.shape[1]
    lo, hi = tl.split(tl.reshape(codes, (R, C // 2, 2)))
    if codes.dtype == tl.int32:
        # the same bits (disjoint), as one multiply-add where LLVM cannot prove the bits disjoint (the
        # Quartet codes come from inline PTX): 16 instructions less per 4096 values there
        return lo + (hi << 4)
    else:
        return lo | (hi << 4)


@triton.jit
def e2m1_decode_f16(code):
    """E2M1 code (integer, low 4 bits) -> its exact float16 value.

    The three magnitude bits (2 exponent, 1 mantissa) are placed at the bottom of the fp16 exponent
    field and the top of its mantissa, which gives the value times 2**-14 (code 1 lands on the
    subnormal 2**-15); one exact fp16 multiply by 2**14 restores it. No float conversion, no select.
    """
    c = code.to(tl.int16)
    bits = ((c & 7) << 9) | ((c & 8) << 12)
    return bits.to(tl.float16, bitcast=True) * 16384.0


@triton.jit
def e4m3_decode_f16(b):
    """float8_e4m3fn byte (integer, sign bit ignored: block scales are >= 0) -> exact float16 value.

    E4M3's 4 exponent / 3 mantissa bits shifted into fp16's exponent / mantissa give the value times
    2**-8 (E4M3 subnormals land on fp16 subnormals); one exact multiply by 2**8 restores it. The NaN
    byte 0x7F decodes to NaN.
    """
    m = b.to(tl.int16) & 0x7F
    v = (m << 7).to(tl.float16, bitcast=True) * 256.0
    return tl.where(m == 0x7F, float("nan"), v)


@triton.jit
def e4m3_to_bits(s):
    """An E4M3-representable float32 s >= 0 (e.g. from ``e4m3_round``) -> its float8_e4m3fn byte
    (int32). No rounding happens here: the value is already on the E4M3 grid."""
    bits = s.to(tl.int32, bitcast=True)
    e = (bits >> 23) & 0xFF
    normal = ((e - 120) << 3) | ((bits >> 20) & 7)
    sub = (s * 512.0).to(tl.int32)  # subnormal E4M3: j * 2**-9, j in 0..7
    return tl.where(e >= 121, normal, sub)


@triton.jit
def unpack_nibbles_words(w):
    """(R, C) int32 words (4 packed bytes each, little-endian) -> (R, 8C) uint8 codes along the last
    axis: code 8j+i is nibble i of word j (the byte order of SPEC §2 packing). Loading packed FP4 as
    32-bit words keeps global loads vectorized."""
    R: tl.constexpr = w.shape[0]
    C: tl.constexpr = w.shape[1]
    sh = tl.arange(0, 8) * 4
    c = (w[:, :, None] >> sh[None, None, :]) & 0xF
    return tl.reshape(c, (R, C * 8)).to(tl.uint8)


# Four codes per 16-bit half-word -> scaled float16, two values per 32-bit register (GPU only: inline
# PTX). An E2M1 code c = (s, e1, e0, m) placed into an E4M3 byte as s<<7 | (e1 e0 m)<<2 is exactly the
# E2M1 value times 2^-6 (exponent field e1e0 = the E2M1 exponent, mantissa m<<2; e = 0 lands on the
# E4M3 subnormals with the same 2^-6 factor), and the hardware converts E4M3 pairs to fp16 pairs exactly
# (cvt.rn.f16x2.e4m3x2). For a 32-bit word w of two half-words (8 nibbles, nibble i at bits
# 4i..4i+3), one byte permute puts the two half-words' bytes side by side ([n0n1, n4n5, n2n3, n6n7]),
# then one mask of the eight sign bits, the low nibbles of all four bytes become E4M3 bytes [n0, n4, n2, n6]
# with two shifts and a logic op, the high nibbles [n1, n5, n3, n7] with one shift and one: each 16-bit
# half is one register pair (code k of half-word j, code k of half-word j + 1). Per 8 codes: 7 integer
# ops, 4 conversions, 4 fp16x2 multiplies by the block scales (two hardware conversions of the E4M3
# scale bytes, inside the same asm), 18 instructions instead of 23 for the former shift-into-fp16 form.
def _nibble_byte_lines(w: str, fp16_high: bool = False) -> list:
    """PTX lines turning the 8 nibbles of the 32-bit register ``w`` into bytes, four per register: ``ev`` = those
    of the low nibbles of its four bytes, ``od`` = of the high nibbles (byte i of ev / od from byte i of w). E4M3
    bytes (value·2^-6, exact: magnitude bits at 2-4) or, with ``fp16_high``, fp16 high bytes (value·2^-14 with a zero
    low byte: magnitude bits at 1-3); the sign goes to bit 7 either way. Needs the scratch registers s, t, u, ev, od
    (.b32).

    Six instructions: the sign bits of all eight nibbles (bits 3 and 7 of each byte) are masked once, and each
    ``lop3`` takes the magnitude field from the shifted word and every other bit from the (shifted) sign mask,
    ``(a & mag) | (b & ~mag)`` (LUT 0xE4). The stray sign bit that the mask carries along (a high nibble's sign
    shifted to bit 3 of the next byte for ``ev``; a low nibble's sign at bit 3 for ``od``) lies inside ``mag`` and
    is dropped."""
    lo, hi, mag = (1, 3, "0x0E0E0E0E") if fp16_high else (2, 2, "0x1C1C1C1C")
    return [
        f"and.b32 s, {w}, 0x88888888;",
        # low nibbles: magnitude bits 0-2 -> lo.., sign bit 3 -> 7
        f"shl.b32 t, {w}, {lo};", "shl.b32 u, s, 4;", f"lop3.b32 ev, t, u, {mag}, 0xE4;",
        # high nibbles: magnitude bits 4-6 -> (4 - hi).., sign bit 7 stays
        f"shr.b32 t, {w}, {hi};", f"lop3.b32 od, t, s, {mag}, 0xE4;"]


def _e2m1_halfwords_ptx() -> str:
    """Output register k (0..3) = (code k of half-word j, code k of half-word j + 1) as fp16 values
    code·scale·2^-6. Scales: E4M3 bytes in $5, pair (byte 0, byte 2) for k < 2, (1, 3) else."""
    return "\n".join([
        "{", ".reg .b32 w, s, t, u, ev, od, sa, sb;", ".reg .b16 ta, tb, e0, e1, o0, o1;",
        "prmt.b32 t, $5, 0, 0x3120;", "mov.b32 {ta, tb}, t;",
        "cvt.rn.f16x2.e4m3x2 sa, ta;", "cvt.rn.f16x2.e4m3x2 sb, tb;",
        "prmt.b32 w, $4, 0, 0x3120;",  # bytes [n0n1, n4n5, n2n3, n6n7]
        *_nibble_byte_lines("w"),
        "mov.b32 {e0, e1}, ev;", "mov.b32 {o0, o1}, od;",
        "cvt.rn.f16x2.e4m3x2 $0, e0;", "cvt.rn.f16x2.e4m3x2 $1, o0;",
        "cvt.rn.f16x2.e4m3x2 $2, e1;", "cvt.rn.f16x2.e4m3x2 $3, o1;",
        "mul.rn.f16x2 $0, $0, sa;", "mul.rn.f16x2 $1, $1, sa;",
        "mul.rn.f16x2 $2, $2, sb;", "mul.rn.f16x2 $3, $3, sb;",
        "}"])


# Two decodes without the E4M3→fp16 conversions (F2FP), for the Gluon decode kernel. The bits of an E2M1
# code c = (s, e1, e0, m) placed as an fp16 high byte s<<7 | (e1 e0 m)<<1 (low byte zero) are exactly the E2M1
# value times 2^-14: exponent field e1e0 = the E2M1 exponent, mantissa m<<9; e = 0 lands on the fp16 subnormals
# with the same 2^-14 factor (0.5 -> 2^-15). Its product with an E4M3 scale s (as fp16) is exact in fp16: the
# lowest set bit of value·s is >= 2^-1 · 2^-9 (E4M3's subnormal step), i.e. >= 2^-24 (fp16's subnormal step)
# after the 2^-14, and the magnitude is <= 6·448·2^-14 = 0.16. The high bytes are built four at a time as the
# E4M3 bytes above (other shift and mask constants, same instruction count), then a byte permute with a zero
# register puts two of them into the high bytes of an fp16 pair: ``prmt`` on the integer pipe where the former
# form spent an ``F2FP.F16.E4M3.UNPACK_B``.
def _e2m1_halfwords_f16hi_ptx() -> str:
    """Two half-words of packed FP4 in $4 (8 codes) -> output register k holds codes k%2 and k%2 + 2 of half-word
    k//2 (an order for a kernel that sums its channels in an order of its choice), times the fp16x2 scale pair $5
    (one scale for all four outputs), times 2^-14."""
    return "\n".join([
        "{", ".reg .b32 s, t, u, ev, od, z;", "mov.b32 z, 0;",
        *_nibble_byte_lines("$4", fp16_high=True),
        # [0, byte 0, 0, byte 1] and [0, byte 2, 0, byte 3] of ev / od
        "prmt.b32 $0, ev, z, 0x1404;", "prmt.b32 $1, od, z, 0x1404;",
        "prmt.b32 $2, ev, z, 0x3424;", "prmt.b32 $3, od, z, 0x3424;",
        "mul.rn.f16x2 $0, $0, $5;", "mul.rn.f16x2 $1, $1, $5;",
        "mul.rn.f16x2 $2, $2, $5;", "mul.rn.f16x2 $3, $3, $5;",
        "}"])


def _e2m1_byte_pairs_f16hi_ptx() -> str:
    """Four packed bytes in $4 (two codes each) and their four fp16 scales in $5 = (s0, s1), $6 = (s2, s3) -> output
    register i (0..3) = (low code, high code) of byte i as fp16 values code·s_i·2^-14."""
    return "\n".join([
        "{", ".reg .b32 s, t, u, ev, od, z, p01, p23, f0, f1, f2, f3;", ".reg .b16 h0, h1, h2, h3;", "mov.b32 z, 0;",
        *_nibble_byte_lines("$4", fp16_high=True),
        "prmt.b32 p01, ev, od, 0x5140;", "prmt.b32 p23, ev, od, 0x7362;",  # [lo0, hi0, lo1, hi1], [lo2, ...]
        "prmt.b32 $0, p01, z, 0x1404;", "prmt.b32 $1, p01, z, 0x3424;",  # [0, lo_i, 0, hi_i]
        "prmt.b32 $2, p23, z, 0x1404;", "prmt.b32 $3, p23, z, 0x3424;",
        "mov.b32 {h0, h1}, $5;", "mov.b32 {h2, h3}, $6;",
        "mov.b32 f0, {h0, h0};", "mov.b32 f1, {h1, h1};", "mov.b32 f2, {h2, h2};", "mov.b32 f3, {h3, h3};",
        "mul.rn.f16x2 $0, $0, f0;", "mul.rn.f16x2 $1, $1, f1;",
        "mul.rn.f16x2 $2, $2, f2;", "mul.rn.f16x2 $3, $3, f3;",
        "}"])


_E2M1_HALFWORDS_F16_PTX = tl.constexpr(_e2m1_halfwords_ptx())
E2M1_HALFWORDS_F16HI_PTX = tl.constexpr(_e2m1_halfwords_f16hi_ptx())
E2M1_BYTE_PAIRS_F16HI_PTX = tl.constexpr(_e2m1_byte_pairs_f16hi_ptx())


@triton.jit
def e2m1_halfwords_f16(h, sc):
    """int16 half-words of packed FP4 and, per half-word, an int16 of two E4M3 scale bytes (low byte:
    codes 0-1, high byte: codes 2-3; non-negative scales) -> four float16 tensors of h's shape: o_k[j] =
    code k of half-word j times its scale times 2^-6 (exact). Inline PTX, GPU only (sm_89+)."""
    return tl.inline_asm_elementwise(_E2M1_HALFWORDS_F16_PTX, "=r,=r,=r,=r,r,r", [h, sc],
                                     dtype=(tl.float16, tl.float16, tl.float16, tl.float16),
                                     is_pure=True, pack=2)


@triton.jit
def unpack_e2m1_f16_scaled(h, sc):
    """(R, C) int16 half-words of packed FP4 (4 codes each, SPEC §2 order) and their scale bytes as in
    ``e2m1_halfwords_f16`` -> (R, 4C) float16 holding value·scale·2^-6 exactly (the caller folds 2^6
    into a later FP32 factor). Inline PTX: GPU only; the interpreter paths use ``unpack_nibbles`` +
    ``e2m1_decode_f16`` and a separate multiply.

    value·2^-6 times any E4M3 scale stays exact in float16: its lowest set bit is >= 2^-16 (fp16's
    subnormal step is 2^-24) and its magnitude <= 6·448·2^-6 = 42."""
    R: tl.constexpr = h.shape[0]
    C: tl.constexpr = h.shape[1]
    o0, o1, o2, o3 = e2m1_halfwords_f16(h, sc)
    # element 4j+k of the output is o_k[j]: join((o0, o2), (o1, o3)) indexes [j, b, a] = o_{a+2b}
    return tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), (R, 4 * C))


# Eight codes per 32-bit word -> eight E4M3 bytes through a per-group byte table (GPU only: inline PTX).
# ``prmt`` picks bytes from an 8-byte table by 3-bit selectors, four per instruction: with the table
# t[c] = E4M3 byte of (E2M1 magnitude c) * s for one MXFP4 group (s its scale times any power of
# two), the magnitudes of four codes are one ``prmt`` with selectors ``w & 0x7777``; a second ``prmt``
# with the codes themselves as selectors on a table of 0x80 bytes gives 0xFF for a negative code (bit
# 3 = sign-replicate mode) and 0x80 otherwise, whose bit 0 shifted to bit 7 is the sign. 11 ops per 8
# values, no float arithmetic and no rounding (the table holds the rounded bytes).
_E2M1_WORD_E4M3_PTX = tl.constexpr("""{
.reg .b32 sel, sg, hw, k80;
mov.b32 k80, 0x80808080;
and.b32 sel, $2, 0x7777;
prmt.b32 $0, $3, $4, sel;
prmt.b32 sg, k80, k80, $2;
shl.b32 sg, sg, 7;
lop3.b32 $0, $0, sg, $5, 0xF8;
shr.b32 hw, $2, 16;
and.b32 sel, hw, 0x7777;
prmt.b32 $1, $3, $4, sel;
prmt.b32 sg, k80, k80, hw;
shl.b32 sg, sg, 7;
lop3.b32 $1, $1, sg, $5, 0xF8;
}""")


@triton.jit
def e2m1_words_e4m3(w, t_lo, t_hi, smask):
    """int32 words of packed FP4 (8 codes, SPEC §2 order) -> two int32 words of E4M3 bytes (codes 0-3,
    codes 4-7, byte j = code j): ``t_lo`` / ``t_hi`` hold the E4M3 bytes of magnitudes 0-3 / 4-7
    (little-endian), ``smask`` is 0x80808080 (sign bits kept) or 0 (dropped, e.g. NaN tables).
    All four arguments broadcast to one shape. Inline PTX, GPU only."""
    return tl.inline_asm_elementwise(_E2M1_WORD_E4M3_PTX, "=r,=r,r,r,r,r", [w, t_lo, t_hi, smask],
                                     dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


# ----------------------------------------------------------------------------------------------
# Interpreter compatibility (added with the FP4 attention kernels, issue 4)
# ----------------------------------------------------------------------------------------------
def _interpreter_numpy_compat() -> None:
    """Triton 3.6's interpreter keeps a scalar as a 1-element numpy array and implements
    ``tensor.__index__`` as ``int(array)``, which NumPy >= 2.4 rejects for arrays with ndim > 0: every
    ``range(lo, hi)`` over runtime bounds in a kernel then fails under TRITON_INTERPRET=1. Re-register
    ``__index__`` on the array's single element (same value; interpreter only, idempotent)."""
    try:
        from triton.runtime import interpreter as _itp
    except Exception:  # pragma: no cover
        return
    orig = getattr(_itp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_fp4attn_compat", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._fp4attn_compat = True
    _itp._patch_lang_tensor = patched


if __import__("os").environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    _interpreter_numpy_compat()


# ----------------------------------------------------------------------------------------------
# E2M1 codes: the rounded ramp, and the NVFP4 quotient x / s without a division per element
# ----------------------------------------------------------------------------------------------
@triton.jit
def e2m1_code_i32(v):
    """float32 v -> E2M1 code (int32, sign in bit 3), round to nearest, ties to the even code, saturating
    at 6 (``fp4attn.formats.core.e2m1_encode``'s code for every non-NaN v). NaN gives a code of
    magnitude 7 (callers flag non-finite blocks through their scale; ``e2m1_code`` masks it to 0).

    The code of |v| is the ramp 2|v| on [0, 2], |v| + 2 on [2, 4], |v|/2 + 4 on [4, 6] (E2M1's grid
    spacing 0.5, 1, 2), rounded to an integer (ties to even: code parity is mantissa parity) and capped
    at 7. The ramp is the minimum of its three lines and rounding is monotone, so the code is the
    minimum of the three lines each rounded by one magic-constant add (1.5·2^23 + 0 / 2 / 4: a single
    rounding of an exact sum, also in fma form) and of 7; the minimum is taken on the float bits (all
    positive, same binade, so integer order; NaN's bits are above 7's on every backend). 8 instructions
    (the former comparison with seven decision points compiled to ~14); equal to it on every float32
    (``tools/exactness_checks.py code``)."""
    r = _e2m1_ramp(tl.abs(v), 2.0, 1.0, 0.5)
    s = (v.to(tl.uint32, bitcast=True) >> 28).to(tl.int32, bitcast=True)  # sign in bit 3, nothing above
    return ((r ^ s) & 7) ^ s  # bits 0-2 from r, bit 3 from s: one 3-input logic op


@triton.jit
def _e2m1_ramp(a, m1, m2, m3):
    """``e2m1_code_i32``'s rounded ramp for |v| = a * (m1 / 2) (the slopes m1 = 2s, m2 = s, m3 = s/2 of a
    power-of-two scale s; 2, 1, 1/2 unscaled) as float32 bits 0x4B400000 + magnitude code (0..7)."""
    r1 = tl.fma(a, m1, _RINT_MAGIC).to(tl.int32, bitcast=True)
    r2 = tl.fma(a, m2, 12582914.0).to(tl.int32, bitcast=True)
    r3 = tl.fma(a, m3, 12582916.0).to(tl.int32, bitcast=True)
    return tl.minimum(tl.minimum(r1, r2), tl.minimum(r3, 0x4B400007))


@triton.jit
def e2m1_code_raw(x, s):
    """``e2m1_code_i32(x * s)`` for a power of two s (float32, broadcast against x; 2**-127 <= s <=
    2**125) in bits 0-3 of the result; bits 4-21 are zero, bits 22-30 those of the magic constant
    1.5*2**23 (callers that keep the low byte, e.g. packing two codes per byte, need no mask).

    The scale goes into the three magic-constant fmas: (|x| * s) * m = |x| * (s * m) is exact for the
    slopes m = 2, 1, 1/2 unless it underflows below 2**-126 (then both sides round to the constant: code
    0) or overflows (both saturate at code 7), so the caller's x * s multiply goes away; the sign is x's
    (that of x * s; NaN codes follow the NaN's sign bit either way, and the GPU's NaNs here come out of a
    multiply, canonical). The sign is OR-ed in without the & 7 of the clean code, with one shift and one
    3-input logic op (GPU: inline PTX, as LLVM splits ``r | ((x >> 28) & 8)`` into three ops). 7
    instructions per value instead of 9 (the multiply and 8). Low 4 bits equal to ``e2m1_code_i32(x *
    s)`` for every float32 x and s = 2**k, k in {-127, -126, -100, -27, -1, 0, 1, 60, 125}
    (``tools/exactness_checks.py scaledcode``)."""
    r = _e2m1_ramp(tl.abs(x), s * 2.0, s, s * 0.5)
    if _GPU_ASM:
        return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $2, 28; lop3.b32 $0, t, 8, $1, 0xEA;}",
                                         "=r,r,r", [r, x], dtype=tl.int32, is_pure=True, pack=1)
    else:
        return r | ((x.to(tl.uint32, bitcast=True) >> 28).to(tl.int32, bitcast=True) & 8)


@triton.jit
def e2m1_e5m2_byte(x, s, e, nan):
    """The FP8 E5M2 byte (int32, bits 0-7; bits 8-31 zero, except in NaN groups on the GPU, whose
    bits 8-31 are 0x7F7F7F: callers keep the low byte) of ``E2M1(x * s) * 2**e``: the E2M1 code of
    ``e2m1_code_raw`` (power-of-two s, same rounding) and the group exponent e (int32, broadcast against
    x) in [-13, 13], where every E2M1 magnitude times 2**e is a normal E5M2 value (0.5 * 2**-13 =
    2**-14 is E5M2's smallest normal, 6 * 2**13 = 49152 <= 57344 its largest) and so exact. Where
    ``nan`` (a per-group flag broadcast against x, as e) is non-zero: 0x7F (NaN) for every element.

    E5M2 bytes of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 are 0x00 0x38 0x3C 0x3E 0x40 0x42 0x44 0x46;
    times 2**e adds e to the 5-bit exponent field (4e to each non-zero byte: no byte carries for e in
    [-13, 13]). GPU: one byte permute selects the magnitude byte of the code from the two table words,
    and one 3-input logic op adds x's sign bit (3 instructions per value after the rounding, as
    ``e2m1_code_raw`` + packing); a NaN group's tables hold 0x7F in every byte and its sign mask is 0, so
    the flag costs nothing per value. Interpreter: the same table by shifts. Codes of x with |x * s| in
    every E2M1 interval, s = 2**k and e over [-13, 13] against the float path: tests (``test_e2m1_e5m2_byte``)."""
    r = _e2m1_ramp(tl.abs(x), s * 2.0, s, s * 0.5)  # 0x4B400000 + magnitude code: low 16 bits = code
    e4 = e * 4
    t_lo = tl.where(nan != 0, 0x7F7F7F7F, 0x3E3C3800 + e4 * 0x01010100)
    t_hi = tl.where(nan != 0, 0x7F7F7F7F, 0x46444240 + e4 * 0x01010101)
    sm = tl.where(nan != 0, 0, 0x80)
    if _GPU_ASM:
        return tl.inline_asm_elementwise(
            "{.reg .b32 t, s; prmt.b32 t, $1, $2, $3; shr.b32 s, $4, 24; lop3.b32 $0, t, s, $5, 0xF8;}",
            "=r,r,r,r,r,r", [t_lo, t_hi, r, x.to(tl.int32, bitcast=True), sm], dtype=tl.int32, is_pure=True,
            pack=1)
    else:
        c = r & 7
        word = tl.where(c < 4, t_lo, t_hi)
        mag = (word >> ((c & 3) * 8)) & 0xFF
        return mag | ((x.to(tl.int32, bitcast=True) >> 24) & sm)


@triton.jit
def div_rn_by(x, s, y):
    """``tl.math.div_rn(x, s)`` (the IEEE quotient, round to nearest even) for float32 x and a divisor s > 0
    (float32, broadcast against x) given its reciprocal y = ``recip_nr(s)`` -- one reciprocal per block scale
    instead of a division per element (~9 instructions and a slow-path check each on the GPU): q0 = RN(x·y),
    the residual r = x − s·q0 (exact in one fma), then RN(q0 + r·y) (Markstein's correction).

    * E4M3 s (NVFP4 without global scale), y = RN(1/s): q0 lies within 1.5 ulps of x/s (y's relative error is
      at most 2^-24); q0 + r·y = x/s + (x/s − q0)(s·y − 1) is within 2 ulps·2^-24 of x/s. The exact quotient is
      never a midpoint of two floats and, s having at most 4 significant bits, lies at least 2^-6 ulps from
      every midpoint (x − s·m, for a midpoint m, is a non-zero multiple of 2^(e_s + e_q − 28)), so
      RN(q0 + r·y) = RN(x/s). Quotients that underflow are far below E2M1's first decision point (0.25). x·y
      does not overflow for a block's own scale (s = E4M3(amax/6), or 448: |x|/s < 2^119). Checked against
      ``div_rn`` for every E4M3 s and every float32 x with |x|/s in [2^-20, 2^20) on the GPU, and on a dense
      sample around every decision point with exact fma arithmetic on the CPU (``tests/test_quantize_kernels.py``).
    * A general s (the global-scale divisor s_b / S_enc): these are the instructions of ``div_rn``'s own fast
      path (SASS: MUFU.RCP, the Newton step, q0, the residual, the correction), taken by ``div_rn`` unless its
      range check (FCHK: zero, subnormal or huge operands, a quotient near underflow or overflow) sends it to
      the slow path. Callers keep s in [2^-96, 2^96]. There the GPU tests find the quotient equal to
      ``div_rn``'s for every x that can change an E2M1 code (|x|/s in [2^-3, 2^4), 1024 divisors), and the
      code equal for every float32 x at divisors at both ends of the range.

    The residual is written as −(q0·s − x), so x = ±0 gives ±0 as ``div_rn`` does (x − s·q0 would give +0 for
    x = −0). ±Inf x, or a quotient that overflows, gives NaN (an E2M1 code of magnitude 7, as Inf's). The
    interpreter, whose fma is an unfused float32 multiply-add, divides."""
    if _GPU_ASM:  # (* -1.0: a true negation, folded into the fmas; Triton's unary minus is 0 - v)
        q0 = x * y
        return tl.fma(tl.fma(q0, s, x * -1.0), y * -1.0, q0)
    else:
        return tl.math.div_rn(x, s)


@triton.jit
def nvfp4_scale(amax):
    """The NVFP4 block scale without global scale, ``e4m3_round(div_rn(amax, 6))`` (float32 amax >= 0, finite),
    with the quotient by ``div_rn_by`` (6 is an E4M3 value; RN(1/6) a constant) instead of ``div_rn`` and its
    slow-path call: the same quotient wherever it is a normal float, and below 2^-126 both round to the E4M3
    scale 0. Equal for every finite float32 amax >= 0 (GPU test)."""
    return e4m3_round(div_rn_by(amax, 6.0, 0.1666666716337204))


@triton.jit
def recip_nr(d):
    """The reciprocal of ``div_rn``'s fast path for a float32 divisor d with 2^-126 <= |d| <= 2^126: the hardware
    approximation y and one Newton step y + y(1 − d·y) in two fmas (3 instructions instead of ``div_rn``'s ~9 and
    its slow-path check). For an E4M3 value d > 0 it is RN(1/d): the step lands within ~2^-22 ulps of 1/d, and
    1/d = 2^-e/B (B = 1 ... 15, d's significand) is a power of two or has a periodic expansion (period <= 12
    bits), never that close to a midpoint. Equal to ``div_rn(1, d)`` for every E4M3 d > 0 (GPU test). The
    interpreter divides."""
    if _GPU_ASM:
        y = rcp_approx(d)
        return tl.fma(y, tl.fma(d * -1.0, y, 1.0), y)
    else:
        return tl.math.div_rn(1.0, d)


@triton.jit
def e2m1_recip(s):
    """Per-block inputs of ``e2m1_code_div`` for block divisors s: 0, or in [2^-126, 2^126] (E4M3 scales, or
    the global-scale divisors in ``div_rn_by``'s range): (y, m8) = (``recip_nr(s)``, 8) where s > 0 and (0, 0)
    where s == 0, whose codes are then +0 (the reference's)."""
    pos = s > 0
    return tl.where(pos, recip_nr(tl.maximum(s, 1.1754943508222875e-38)), 0.0), tl.where(pos, 8, 0)


@triton.jit
def e2m1_code_div(x, s, y, m8):
    """E2M1 code (int32, sign in bit 3) of the IEEE quotient ``x / s`` rounded to nearest even -- the
    reference's NVFP4 encoding -- for float32 x and block divisors s (broadcast against x: E4M3 scales or,
    with a global scale, s_b / S_enc in ``div_rn_by``'s range), given ``e2m1_recip(s)``: the quotient by
    ``div_rn_by``, its code by ``e2m1_code_i32``'s rounded ramp, the sign bit x's (the quotient's; also for
    x = −0), masked by m8. 2 multiply-adds and a multiply for the quotient (the division, or the seven
    decision points compared before, ~13 integer-pipe instructions per value), 3 for the ramp. A block with
    s == 0 (y = 0, m8 = 0) gives +0. NaN x, ±Inf x and quotients that overflow give a code of magnitude 7
    (callers mask NaN; ±7 is the reference's ±6 for the others). Bits 4-21 of the result are 0 and bits 22-30
    those of the ramp's magic constant on the GPU: callers keep the low nibble or byte. (±Inf in a block with
    s == 0 gives a code of magnitude 7 as well: ∞·0 is NaN; callers mask it.)"""
    if _GPU_ASM:
        q = div_rn_by(x, s, y)  # s == 0, y == 0: ±0
        r = _e2m1_ramp(tl.abs(q), 2.0, 1.0, 0.5)  # 0x4B400000 + magnitude code
        # (x >> 28) & m8 | r: one shift and one 3-input logic op (LLVM splits it into three)
        return tl.inline_asm_elementwise("{.reg .b32 t; shr.b32 t, $2, 28; lop3.b32 $0, t, $3, $1, 0xEA;}",
                                         "=r,r,r,r", [r, x.to(tl.int32, bitcast=True), m8], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        q = tl.where(y == 0, 0.0, div_rn_by(x, tl.where(y == 0, 1.0, s), y))
        r = _e2m1_ramp(tl.abs(q), 2.0, 1.0, 0.5)
        return (r & 7) | ((x.to(tl.uint32, bitcast=True) >> 28).to(tl.int32, bitcast=True) & m8)


@triton.jit
def e2m1_codes_div(xb, s, FINITE: tl.constexpr = False):
    """``e2m1_code_div`` of a (..., QB) float32 tile in blocks along its last axis, s (...) their E4M3 scales.
    NaN elements give code 0, as ``e2m1_code(x / s)`` does, and so do ±Inf in a block whose scale is 0 (its
    finite elements are all ±0); ``FINITE``: the caller knows xb holds no NaN or Inf and skips that
    per-element select."""
    y, m8 = e2m1_recip(tl.expand_dims(s, -1))
    c = e2m1_code_div(xb, tl.expand_dims(s, -1), y, m8)
    if FINITE:
        return c
    else:
        return tl.where((xb == xb) & (m8 != 0), c, 0)


@triton.jit
def quant_rows(x, anybad, QB: tl.constexpr, IS_MX: tl.constexpr):
    """(R, C) float32 tile, blocks of QB along the last axis -> (codes (R, C) uint8 with sign bit 3,
    scale bytes (R, C/QB) uint8): the attention pre-pass's encoding (Q, K, V; and Q in the Gluon row-max pass).
    Same rounding as ``fp4attn.formats.core.quantize_blocks``.

    ``anybad`` (scalar): nonzero when the tile holds a NaN or ±Inf. NVFP4: only then do the block maxima
    leave those elements out and NaN elements get code 0; a finite tile skips those two selects per
    element (pre-pass 9% faster on the H200; MXFP4 was not faster with both branches compiled in: more
    registers)."""
    R: tl.constexpr = x.shape[0]
    C: tl.constexpr = x.shape[1]
    xb = tl.reshape(x, (R, C // QB, QB))
    if IS_MX:
        e = mx_exponent(block_amax(xb), False)
        v = xb * exp2i(-e)[:, :, None]  # exact: x / 2**e
        codes = e2m1_code(v)  # NaN -> 0 (the block is flagged through the pre-pass flags)
        sb = (e + 127).to(tl.uint8)
    else:
        # codes = e2m1_code(x / s) with IEEE division: the quotient from one reciprocal per block (e2m1_codes_div)
        if anybad != 0:
            s = nvfp4_scale(block_amax(xb))
            codes = e2m1_codes_div(xb, s)
        else:
            s = nvfp4_scale(tl.max(tl.abs(xb), axis=-1))
            codes = e2m1_codes_div(xb, s, FINITE=True)
        sb = e4m3_to_bits(s).to(tl.uint8)
    return tl.reshape(codes.to(tl.uint8), (R, C)), sb


@triton.jit
def fp4_tile_f16(codes, sbytes, eref, QB: tl.constexpr, IS_MX: tl.constexpr):
    """E2M1 codes (R, C) + scale bytes (R, C/QB) -> (R, C) float16.

    NVFP4: the exact value code·scale. MXFP4: code·2^(e − eref + 6) with eref (R,) the row's
    reference exponent (exact inside the FP8 condition, ``fp4attn.kernels.attention``'s docstring).
    """
    R: tl.constexpr = codes.shape[0]
    C: tl.constexpr = codes.shape[1]
    cv = tl.reshape(e2m1_decode_f16(codes), (R, C // QB, QB))
    if IS_MX:
        k = sbytes.to(tl.int32) - 127 - eref[:, None] + 6
        f = exp2i(tl.maximum(k, -149)).to(tl.float16)
    else:
        f = e4m3_decode_f16(sbytes)
    return tl.reshape(cv * f[:, :, None], (R, C))
