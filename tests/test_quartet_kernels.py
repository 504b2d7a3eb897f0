"""Quartet CUDA path (fp4attn.kernels.quartet) vs the reference, and the FP8 embedding of MXFP4.

CPU: the Triton kernels run in the interpreter (TRITON_INTERPRET=1, set below before triton is
imported; the interpreter's dot has no bf16, so the float32 Hadamard dot is what runs there), and
``torch._scaled_mm`` runs on CPU, so the whole autograd Function runs end to end. The Philox draws are
reproduced by a tiny kernel, so the backward is checked exactly against the reference primitives fed
the same signs and noise. GPU tests (``-m gpu``, TRITON_INTERPRET unset): compiled kernels, bf16
Hadamard dots, forward agreement, backward unbiasedness over many seeds, determinism, dispatch.
"""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from fp4attn.formats.stochastic import e2m1_stochastic_round, sr_quantize_mxfp4  # noqa: E402
from fp4attn.formats.triton_helpers import e2m1_code, e2m1_code_raw, exp2i  # noqa: E402
from fp4attn.formats.triton_stochastic import (  # noqa: E402
    e2m1_sr,
    e2m1_sr_code,
    e2m1_sr_code_u16,
    mx_sr_blocks,
    philox_randint4x,
    sr_uniform,
)
from fp4attn.kernels import quartet as kq  # noqa: E402
from fp4attn.reference.quartet import (  # noqa: E402
    QuartetRNG,
    backward_seed,
    hadamard_groups,
    masked_ste_gradients,
    quartet_forward,
    quest_quantize,
)

# (the interpreter's NumPy >= 2.4 index fix is applied by fp4attn.formats.triton_helpers on import)
_INTERPRETED = type(kq._quest_mxfp4_kernel).__name__ == "InterpretedFunction"
cpu_only = pytest.mark.skipif(not _INTERPRETED, reason="needs TRITON_INTERPRET=1 at import (run this module alone)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or _INTERPRETED,
                                reason="needs CUDA and compiled (non-interpreted) Triton kernels")
gpu = pytest.mark.gpu


@triton.jit
def _philox_words_kernel(OUT, seed, NC, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    w0, w1, w2, w3 = tl.randint4x(seed, c)
    tl.store(OUT + c * 4, w0.to(tl.int32, bitcast=True), mask=c < NC)
    tl.store(OUT + c * 4 + 1, w1.to(tl.int32, bitcast=True), mask=c < NC)
    tl.store(OUT + c * 4 + 2, w2.to(tl.int32, bitcast=True), mask=c < NC)
    tl.store(OUT + c * 4 + 3, w3.to(tl.int32, bitcast=True), mask=c < NC)


def philox_uniforms(seed: int, R: int, LP: int, device="cpu") -> torch.Tensor:
    """The uniforms the SR kernel draws, written independently of ``sr_uniform_bits`` from its documented
    rule: element (r, l) is half (l % 2) of Philox word (l % 8) // 2 of counter (r * LP + l) // 8,
    u = (h + 0.5) / 2**16."""
    nc = R * LP // 8
    words = torch.empty(nc * 4, dtype=torch.int32, device=device)
    _philox_words_kernel[(triton.cdiv(nc, 64),)](words, seed, nc, BLOCK=64)
    w = words.to(torch.int64) & 0xFFFFFFFF
    halves = torch.stack([w & 0xFFFF, w >> 16], dim=1).reshape(R, LP)
    return ((halves.double() + 0.5) / 65536).float()


def sr_expected(a: torch.Tensor, signs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Reference backward operand: pad to Lp, random-sign Hadamard, SR of 3/4 x with ``noise``."""
    R, L = a.shape
    LP = noise.shape[1]
    ap = torch.nn.functional.pad(a.float(), (0, LP - L))
    ah = hadamard_groups(ap, 32, -1, signs=signs)
    return sr_quantize_mxfp4(ah, -1, noise=noise).values


def _inputs(R, K, dtype, seed, outliers=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, K, generator=g) * 2
    if outliers:
        x[:, 3] *= 50  # saturated, untrusted entries
        x[1] = 0.0  # an all-zero row
    return x.to(dtype)


# ----------------------------------------------------------------------------------------------
# FP8 embedding (pure PyTorch; torch._scaled_mm on CPU)
# ----------------------------------------------------------------------------------------------
def test_fp8_embedding_exactness_condition():
    torch.manual_seed(0)
    x, w = torch.randn(48, 128), torch.randn(64, 128)
    for a in (x, w):
        v, m, e = quest_quantize(hadamard_groups(a, 32), return_exponents=True)
        assert kq.fp8_embedding_exact(e).all()
        q8, rs = kq.fp8_embed(v, e)
        assert torch.equal(q8.float() * rs[:, None], v)
        assert q8.float().abs().max() <= 384
    # the boundary: a group 14 binades below the row's largest is exact, 15 is not
    c = torch.tensor([0.5, 1.5, 3.0, 6.0, 1.0, 2.0, 4.0, 0.0] * 4)
    for d, exact in ((14, True), (15, False)):
        e = torch.tensor([[3, 3 - d]], dtype=torch.int32)
        vals = torch.cat([c * 2.0 ** 3, c * 2.0 ** (3 - d)])[None]
        q8, rs = kq.fp8_embed(vals, e)
        assert bool(kq.fp8_embedding_exact(e)) is exact
        assert torch.equal(q8.float() * rs[:, None], vals) is exact
    # an all-zero group never breaks exactness, whatever its exponent
    e = torch.tensor([[3, -100]], dtype=torch.int32)
    vals = torch.cat([c * 8.0, torch.zeros(32)])[None]
    assert kq.fp8_embedding_exact(e, nonzero=torch.tensor([[True, False]])).all()
    q8, rs = kq.fp8_embed(vals, e)
    assert torch.equal(q8.float() * rs[:, None], vals)


def test_fp8_gemm_equals_mxfp4_gemm_on_cpu():
    torch.manual_seed(1)
    x, w = torch.randn(40, 256) * 3, torch.randn(96, 256) * 0.02
    y, ctx = quartet_forward(x, w)
    _, _, ex = quest_quantize(hadamard_groups(x, 32), return_exponents=True)
    _, _, ew = quest_quantize(hadamard_groups(w, 32), return_exponents=True)
    a8, ra = kq.fp8_embed(ctx.x_q, ex)
    b8, rb = kq.fp8_embed(ctx.w_q, ew)
    out = kq.fp8_gemm(a8.view(torch.uint8), ra, b8.view(torch.uint8), rb, torch.float32)
    exact = ctx.x_q.double() @ ctx.w_q.double().T
    bound = 256 * 2.0 ** -24 * (ctx.x_q.double().abs() @ ctx.w_q.double().abs().T)
    assert ((out.double() - exact).abs() <= bound).all()


# ----------------------------------------------------------------------------------------------
# Interpreter tests of the kernels
# ----------------------------------------------------------------------------------------------
@cpu_only
def test_e4m3_bits_helper_matches_torch_cast():
    @triton.jit
    def k(X, OUT, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(OUT + offs, kq._e4m3_bits(tl.load(X + offs, mask=offs < n, other=0.0)), mask=offs < n)

    allv = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    allv = allv[allv.abs() <= 448]
    small = torch.empty(300).uniform_(-2 ** -6, 2 ** -6)
    anyv = torch.empty(500).uniform_(-448, 448)  # not on the grid: rounded to nearest, ties even
    for x in (allv, small, anyv):
        out = torch.empty(x.numel(), dtype=torch.uint8)
        k[(1,)](x.contiguous(), out, x.numel(), BLOCK=512)
        ref = x.to(torch.float8_e4m3fn)
        assert torch.equal(out.view(torch.float8_e4m3fn).float(), ref.float())


@triton.jit
def _sr_helpers_kernel(X, U, OUT, OUTB, E, CODE, CODE2, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    u = tl.load(U + offs)
    tl.store(OUT + offs, e2m1_sr(x, u))
    tl.store(CODE + offs, e2m1_sr_code(x, u).to(tl.uint8))
    tl.store(CODE2 + offs, e2m1_code(e2m1_sr(x, u)))
    r, e = mx_sr_blocks(tl.reshape(x, (BLOCK // 32, 32)), tl.reshape(u, (BLOCK // 32, 32)), 0.75)
    tl.store(OUTB + offs, tl.reshape(r * tl.expand_dims(exp2i(e), 1), (BLOCK,)))
    tl.store(E + tl.arange(0, BLOCK // 32), e)


@cpu_only
def test_triton_sr_helpers_match_pytorch_bit_for_bit():
    k = _sr_helpers_kernel
    g = torch.Generator().manual_seed(9)
    x = torch.empty(1024).uniform_(-6, 6, generator=g)
    x[:16] = torch.tensor([0.0, -0.0, -0.1, 0.1, 6.0, -6.0, 0.5, -1.5, 2.0, 3.0, -4.0, 5.99, 1.75, 2.5,
                           -0.2, float("nan")])
    u = torch.rand(1024, generator=g)
    out, outb, e = torch.empty(1024), torch.empty(1024), torch.empty(32, dtype=torch.int32)
    code, code2 = torch.empty(1024, dtype=torch.uint8), torch.empty(1024, dtype=torch.uint8)
    k[(1,)](x, u, out, outb, e, code, code2, BLOCK=1024)
    # the direct SR code equals encoding the SR value (finite inputs; index 15 is the NaN)
    fin = x.isfinite()
    assert torch.equal(code[fin], code2[fin])
    ref = e2m1_stochastic_round(x, u)
    assert torch.equal(out[:15].view(torch.int32),
                       ref[:15].view(torch.int32))  # bit for bit, -0.0 included
    assert out[15].isnan() and torch.equal(out[16:].view(torch.int32), ref[16:].view(torch.int32))
    xb = x.clone()
    xb[15] = 0.3  # finite blocks only (the kernels flag NaN blocks themselves)
    k[(1,)](xb, u, out, outb, e, code, code2, BLOCK=1024)
    refb = sr_quantize_mxfp4(xb, noise=u)
    assert torch.equal(outb, refb.values) and torch.equal(e, refb.exponents)


@triton.jit
def _sr_u16_forms_kernel(V, H, FAST, REF, W, seed, N, BLOCK: tl.constexpr):
    """e2m1_sr_code_u16 (inline PTX when compiled) beside e2m1_sr_code on sr_uniform(h), and
    philox_randint4x beside tl.randint4x (XOR of the words: 0 when equal)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    v = tl.load(V + offs, mask=m, other=0.0)
    h = tl.load(H + offs, mask=m, other=0)
    tl.store(FAST + offs, e2m1_sr_code_u16(v, h), mask=m)
    tl.store(REF + offs, e2m1_sr_code(v, sr_uniform(h)), mask=m)
    a0, a1, a2, a3 = philox_randint4x(seed, offs)
    b0, b1, b2, b3 = tl.randint4x(seed, offs)
    d = (a0 ^ b0) | (a1 ^ b1) | (a2 ^ b2) | (a3 ^ b3)
    tl.store(W + offs, d.to(tl.int32, bitcast=True), mask=m)


def _sr_u16_cases(n_random, device):
    """(v, h): every value on or next to a decision threshold lo + u*q of the SR (for a spread of h,
    both signs), the E2M1 grid, zeros, values above 6, subnormals, and random values of every scale."""
    g = torch.Generator().manual_seed(21)
    hs = torch.cat([torch.tensor([0, 1, 2, 32767, 32768, 65534, 65535]), torch.randint(0, 65536, (57,), generator=g)])
    lo = torch.arange(0, 6.0, 0.5)
    q = torch.where(lo < 2, 0.5, torch.where(lo < 4, 1.0, 2.0))
    thr = (lo[:, None] + (hs[None, :].double() + 0.5) / 65536 * q[:, None]).float()  # exact in float32
    near = torch.stack([thr, torch.nextafter(thr, torch.tensor(0.0)), torch.nextafter(thr, torch.tensor(9.0))])
    hv = hs[None, None, :].expand_as(near)
    special = torch.tensor([0.0, 1e-45, 1e-39, 2.0 ** -18, 2.0 ** -17, 3 * 2.0 ** -18, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0,
                            5.0, 6.0, 6.5, 7.0, 1e30, float("inf")])
    v = torch.cat([near.flatten(), special.repeat(hs.numel()),
                   torch.randn(n_random, generator=g) * torch.exp2(torch.randint(-20, 4, (n_random,), generator=g))])
    h = torch.cat([hv.flatten(), hs.repeat_interleave(special.numel()),
                   torch.randint(0, 65536, (n_random,), generator=g)])
    v = torch.cat([v, -v])
    h = torch.cat([h, h]).to(torch.int32)
    return v.contiguous().to(device), h.contiguous().to(device)


def _check_sr_u16_forms(device, n_random):
    v, h = _sr_u16_cases(n_random, device)
    n = v.numel()
    fast, ref, w = (torch.empty(n, dtype=torch.int32, device=device) for _ in range(3))
    for seed in (0, 1, 12345, 2 ** 31 - 1, 2 ** 40 + 5):
        _sr_u16_forms_kernel[(triton.cdiv(n, 1024),)](v, h, fast, ref, w, seed, n, BLOCK=1024)
        fin = v.isfinite() | v.isinf()  # NaN codes are unspecified
        assert torch.equal(fast[fin], ref[fin])
        assert (w == 0).all()


@cpu_only
def test_sr_code_u16_and_philox_forms_agree():
    """Interpreter: the u16 SR code is e2m1_sr_code on sr_uniform(h), and philox_randint4x is
    tl.randint4x (the GPU forms are checked on the GPU and, for the SR code, exhaustively by
    ``tools/exactness_checks.py sr``)."""
    _check_sr_u16_forms("cpu", 2048)


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quest_fp8_kernel_matches_reference(dtype):
    x = _inputs(70, 160, dtype, 2)  # 70 rows: partial row tile; K = 160: partial K tile of 128
    x[5, 40] = float("nan")
    q8, mw, rs = kq.quest_fp8(x)
    v = kq.e4m3_dequant(q8, rs)
    m = kq.unpack_mask(mw)
    rv, rm, re = quest_quantize(hadamard_groups(x.float(), 32), return_exponents=True)
    same = (v == rv) | (v.isnan() & rv.isnan())
    assert same.all()  # the interpreter's float32 dot reproduces the reference Hadamard here
    assert torch.equal(m, rm) and not m.all()
    fin = rv[torch.arange(70) != 5]
    assert rs.shape == (70,) and (rs > 0).all() and fin.isfinite().all()
    # the bytes are the FP8 embedding of the reference values
    ok = torch.arange(70) != 5
    q8r, rsr = kq.fp8_embed(rv[ok], re[ok])
    assert torch.equal(q8[ok], q8r.view(torch.uint8)) and torch.equal(rs[ok], rsr)
    # strided input (a transposed view) gives the same result
    q8t, mwt, rst = kq.quest_fp8(x.T.contiguous().T)
    assert torch.equal(q8t, q8) and torch.equal(mwt, mw) and torch.equal(rst, rs)


@cpu_only
def test_sr_fp8_kernel_matches_reference_with_same_randomness():
    g = torch.Generator().manual_seed(3)
    dy = torch.randn(45, 72, generator=g)  # L = 72 -> padded to 96
    signs = kq.random_signs(11, 96, "cpu")
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    # injected noise, and the Philox noise reproduced: both bit-exact vs the reference
    u = torch.rand(45, 96, generator=g)
    for noise, seed in ((u, 0), (None, 12345)):
        q8, rs = kq.sr_fp8(dy, sign_seed=11, noise_seed=seed, noise=noise)
        nz = noise if noise is not None else philox_uniforms(seed, 45, 96)
        assert torch.equal(kq.e4m3_dequant(q8, rs), sr_expected(dy, signs, nz))
    # transposed views and the saved FP8 operands (E4M3 bytes times row scales) as sources
    x = _inputs(40, 64, torch.float32, 4)
    x8, mx, rsx = kq.quest_fp8(x)
    src = kq.e4m3_dequant(x8, rsx)  # (M, K); backward reads it as (K, M)
    q8, rs = kq.sr_fp8(x8.t(), sign_seed=5, noise_seed=6, scale=rsx)
    expect = sr_expected(src.t(), kq.random_signs(5, 64, "cpu"), philox_uniforms(6, 64, 64))
    assert torch.equal(kq.e4m3_dequant(q8, rs), expect)
    q8, rs = kq.sr_fp8(dy.t(), sign_seed=7, noise_seed=8)
    expect = sr_expected(dy.t(), kq.random_signs(7, 64, "cpu"), philox_uniforms(8, 72, 64))
    assert torch.equal(kq.e4m3_dequant(q8, rs), expect)
    # a non-finite value poisons its group (NaN), not its neighbours
    bad = dy.clone()
    bad[3, 40] = float("inf")
    q8, rs = kq.sr_fp8(bad, sign_seed=11, noise_seed=0, noise=u)
    v = kq.e4m3_dequant(q8, rs)
    assert v[3, 32:64].isnan().all() and v[3, :32].isfinite().all() and v[3, 64:].isfinite().all()
    assert torch.equal(v[4:], sr_expected(dy, signs, u)[4:])


@cpu_only
def test_sr_fp8_row_maximum_over_tiles():
    """The SR operand's row offset is the largest group exponent over all of a row's L tiles (a per-tile
    int8 table, reduced by the conversion kernel): rows whose largest groups lie in a later tile, 8 and
    12 binades above the first tile's, embed exactly."""
    g = torch.Generator().manual_seed(21)
    R, L = 24, 200  # four 64-wide tiles (Lp = 224), the last one partial
    a = torch.randn(R, L, generator=g)
    a[:, 64:128] *= 2.0 ** 8
    a[5, 192:] *= 2.0 ** 12  # row 5's largest groups in the last tile
    out, ors = kq.sr_fp8(a, sign_seed=3, noise_seed=4, block_l=64)
    expect = sr_expected(a, kq.random_signs(3, 224, "cpu"), philox_uniforms(4, R, 224))
    assert torch.equal(kq.e4m3_dequant(out, ors), expect)
    assert ors[5] > ors[4] and ors.min() >= 1.0  # the later tiles set the offsets (the first alone: ~2**-7)


@cpu_only
def test_sr_fp8_pair_equals_two_sr_fp8_calls():
    """The backward's stacked quantization of a GEMM's two operands (one buffer, one conversion launch)
    gives the codes and row scales of two separate sr_fp8 calls, with the device draws' noise seeds read
    by index, for a 16-bit operand and a transposed saved E4M3 / E5M2 operand of another row count."""
    g = torch.Generator().manual_seed(31)
    M, K, L = 40, 72, 100  # L padded to 128
    a = torch.randn(M, L, generator=g).to(torch.bfloat16)
    a[3] *= 2.0 ** 20  # a row at its own offset
    x = torch.randn(L, K, generator=g)
    seeds, signs, _ = kq.backward_draws(QuartetRNG(5), "cpu", L, 0)
    n_a, n_b = int(seeds[1]), int(seeds[2])
    for fmt in ("e4m3", "e5m2"):
        b8, _, rs = kq.quest_e5m2(x) if fmt == "e5m2" else kq.quest_fp8(x)
        (qa, ra), (qb, rb) = kq.sr_fp8_pair(a, b8.t(), seeds=seeds, noise_a=1, noise_b=2, signs=signs, scale_b=rs,
                                            b_fmt=fmt)
        ea, era = kq.sr_fp8(a, sign_seed=0, noise_seed=n_a, signs=signs)
        eb, erb = kq.sr_fp8(b8.t(), sign_seed=0, noise_seed=n_b, signs=signs, scale=rs, a_fmt=fmt)
        assert qa.shape == (M, 128) and qb.shape == (K, 128)
        assert torch.equal(qa, ea) and torch.equal(ra, era) and torch.equal(qb, eb) and torch.equal(rb, erb)
        assert ra[3] > 2.0 ** 15 * ra[4]
    with pytest.raises(ValueError, match="b: expected 100 columns"):
        kq.sr_fp8_pair(a, b8, seeds=seeds, noise_a=1, noise_b=2, signs=signs, scale_b=rs)


@cpu_only
def test_sr_fp8_kernel_unbiased_over_rows():
    # 512 identical rows: each is an independent draw (noise depends on the row), signs are shared
    row = torch.randn(1, 128, generator=torch.Generator().manual_seed(10)) * 3
    a = row.expand(512, 128).contiguous()
    q8, rs = kq.sr_fp8(a, sign_seed=1, noise_seed=2)
    vals = kq.e4m3_dequant(q8, rs).double()
    target = 0.75 * hadamard_groups(row, 32, -1, signs=kq.random_signs(1, 128, "cpu")).double()[0]
    se = vals.std(0) / math.sqrt(512)
    z = ((vals.mean(0) - target) / se)[se > 0]
    assert z.abs().max() < 5.0  # 128 statistics: P(max |z| > 5) ~ 1e-4
    assert 0.6 < (z ** 2).mean() < 1.5  # mean of 128 z**2 has sd ~0.125
    # power: a 3% bias is visible to the same statistic
    assert (((vals.mean(0) * 1.03 - target) / se)[se > 0] ** 2).mean() > 2.0


@cpu_only
def test_mask_ihadamard_kernel():
    g = torch.Generator().manual_seed(5)
    d = torch.randn(33, 96, generator=g)
    mask = torch.rand(33, 96, generator=g) < 0.8
    lane = torch.arange(32, dtype=torch.int64)
    words = ((mask.reshape(33, 3, 32).long() << lane).sum(-1)).to(torch.int64)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    assert torch.equal(kq.unpack_mask(words), mask)
    out = kq.mask_ihadamard(d, words, torch.float32)
    ref = hadamard_groups(d * (16 / 9) * mask, 32, -1)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-5)


@cpu_only
def test_mask_ihadamard_applies_the_gemm_row_scales():
    """The backward's unscaled GEMM output with both operands' power-of-two row scales applied in the
    epilogue: the same bits as the epilogue of the pre-scaled output (float32 and the 16-bit values
    the GPU's +-1 dot takes)."""
    g = torch.Generator().manual_seed(8)
    d = torch.randn(33, 96, generator=g)
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (33, 3), generator=g, dtype=torch.int64).to(torch.int32)
    ra = torch.exp2(torch.randint(-20, 20, (33,), generator=g).float())
    rb = torch.exp2(torch.randint(-20, 20, (96,), generator=g).float())
    for dt in (torch.float32, torch.bfloat16):
        dd = d.to(dt)
        pre = (dd.float() * ra[:, None] * rb[None, :]).to(dt)  # exact: powers of two
        out = kq.mask_ihadamard(dd, words, torch.float32, row_scale=ra, col_scale=rb)
        assert torch.equal(out, kq.mask_ihadamard(pre, words, torch.float32))
    with pytest.raises(ValueError, match="row_scale"):
        kq.mask_ihadamard(d, words, torch.float32, row_scale=ra)


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_function_end_to_end_on_cpu(dtype):
    """The autograd Function on CPU tensors: forward = reference; backward = the reference
    primitives fed the kernel's own signs and Philox noise."""
    M, K, N = 40, 64, 96
    x = _inputs(M, K, torch.float32, 6).to(dtype).requires_grad_()
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(7)) * 0.1).to(dtype).requires_grad_()
    b = torch.randn(N).to(dtype).requires_grad_()
    rng = QuartetRNG(99)
    y = kq.QuartetLinearCUDA.apply(x, w, b, rng, 32)
    yr, ctx = quartet_forward(x.detach(), w.detach(), b.detach())
    assert y.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2 ** -8
    assert torch.allclose(y.float(), yr, rtol=tol, atol=tol * yr.abs().max())
    dy = torch.randn(M, N).to(dtype)
    y.backward(dy)
    assert x.grad.dtype == dtype and w.grad.dtype == dtype and rng.step == 1
    assert torch.allclose(b.grad.float(), dy.float().sum(0), rtol=1e-2 if dtype != torch.float32 else 1e-6)
    ssx, sg, sw, ssw, sgt, sx = kq._sub_seeds(QuartetRNG(99).next_seed(), 6)
    dyf = dy.float()
    MP = 64
    gq = sr_expected(dyf, kq.random_signs(ssx, N, "cpu"), philox_uniforms(sg, M, N))
    wq = sr_expected(ctx.w_q.t(), kq.random_signs(ssx, N, "cpu"), philox_uniforms(sw, K, N))
    dx = hadamard_groups((gq @ wq.T) * (16 / 9) * ctx.m_x, 32, -1)
    gtq = sr_expected(dyf.t(), kq.random_signs(ssw, MP, "cpu"), philox_uniforms(sgt, N, MP))
    xq = sr_expected(ctx.x_q.t(), kq.random_signs(ssw, MP, "cpu"), philox_uniforms(sx, K, MP))
    dw = hadamard_groups((gtq @ xq.T) * (16 / 9) * ctx.m_w, 32, -1)
    gtol = 1e-5 if dtype == torch.float32 else 2 ** -7
    assert torch.allclose(x.grad.float(), dx, rtol=gtol, atol=gtol * dx.abs().max())
    assert torch.allclose(w.grad.float(), dw, rtol=gtol, atol=gtol * dw.abs().max())
    # a precomputed weight quantization (QuartetLinear's cache) gives the identical forward (and the
    # backward only reads the saved operands)
    with torch.no_grad():
        y2 = kq.QuartetLinearCUDA.apply(x, w, b, QuartetRNG(99), 32, kq.quantize_weight(w.detach()))
    assert torch.equal(y2, y)
    # and it estimates the masked straight-through gradient (one draw: a loose sanity bound)
    tdx, tdw = masked_ste_gradients(dyf, ctx)
    cos = torch.nn.functional.cosine_similarity(x.grad.float().flatten(), tdx.flatten(), 0)
    assert cos > 0.9


@cpu_only
def test_backward_draws_on_the_device_equal_the_host_derivation():
    """The backward's seeds and sign vectors come from the RNG's device state: equal to the host's
    _sub_seeds(backward_seed(seed, step)) and random_signs, over several programs; the last program
    advances the step and resets the ticket; the host-seed form (a graph capture that creates the RNG)
    writes the same draws."""
    rng = QuartetRNG(2 ** 61 + 12345, step=5)  # splitmix64(seed) >= 2**63: the signed storage of the mix
    N, M = 300, 200  # 3 + 2 programs of 128

    def expect(step):
        subs = kq._sub_seeds(backward_seed(rng.seed, step), 6)
        return subs, kq.random_signs(subs[0], N, "cpu"), kq.random_signs(subs[3], M, "cpu")

    for step in (5, 6, 7):
        seeds, sx, sw = kq.backward_draws(rng, "cpu", N, M)
        subs, ex, ew = expect(step)
        assert seeds[:6].tolist() == subs
        assert torch.equal(sx, ex) and torch.equal(sw, ew)
        assert rng.step == step + 1 and rng.device_state("cpu")[1].item() == 0
    assert len({tuple(kq.backward_draws(rng, "cpu", N, 0)[0][:6].tolist()) for _ in range(3)}) == 3
    rng.step = 6  # writes the device state
    assert kq.backward_draws(rng, "cpu", 0, M)[0][:6].tolist() == expect(6)[0]
    host = QuartetRNG(rng.seed, step=6)
    host.device_state = lambda device: None  # no device state: the seeds come from the host
    seeds, sx, sw = kq.backward_draws(host, "cpu", N, M)
    subs, ex, ew = expect(6)
    assert seeds[:6].tolist() == subs and torch.equal(sx, ex) and torch.equal(sw, ew) and host.step == 7


@cpu_only
def test_forward_without_gradient_skips_masks_and_autograd():
    """``quartet_linear_cuda``: without a gradient to follow (no_grad, or no input requiring one) the
    forward runs alone (no autograd node, no trust masks) with the same output bits; a frozen weight
    gets no mask (nothing computes dW) and the same dX as a trained one."""
    M, K, N = 40, 64, 96
    x = _inputs(M, K, torch.float32, 6).requires_grad_()
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(7)) * 0.1).requires_grad_()
    y = kq.QuartetLinearCUDA.apply(x, w, None, QuartetRNG(5), 32)
    with torch.no_grad():
        y0 = kq.quartet_linear_cuda(x, w, None, QuartetRNG(5), 32)
    assert y0.grad_fn is None and torch.equal(y0, y)
    y1 = kq.quartet_linear_cuda(x.detach(), w.detach(), None, QuartetRNG(5), 32)
    assert y1.grad_fn is None and torch.equal(y1, y)
    saved = y.grad_fn.saved_tensors
    assert saved[1] is not None and saved[4] is not None  # x's and W's mask words
    dy = torch.randn(M, N, generator=torch.Generator().manual_seed(8))
    y.backward(dy)
    xf = x.detach().clone().requires_grad_()
    yf = kq.quartet_linear_cuda(xf, w.detach(), None, QuartetRNG(5), 32)
    assert yf.grad_fn.saved_tensors[4] is None and torch.equal(yf, y)
    yf.backward(dy)
    assert torch.equal(xf.grad, x.grad)
    # quest_fp8 without the mask: the same bytes and scales
    q8, m, rs, sb = kq.quest_fp8(w.detach(), tensor_offset=True)
    q8n, mn, rsn, sbn = kq.quest_fp8(w.detach(), tensor_offset=True, with_mask=False)
    assert mn is None and torch.equal(q8n, q8) and torch.equal(rsn, rs) and torch.equal(sbn, sb)


@cpu_only
def test_quest_fp8_tensor_maximum_over_many_programs():
    """The weight's tensor maximum G is reduced through slots shared by the quantizer's programs
    (program index mod the slot count): with more programs than slots, a largest group in a late
    program still sets G (sb = 2**(G - 6)) and every row within 14 binades takes it."""
    R, K = 16 * 34, 256  # 34 x 2 programs of 16 x 128 > 64 slots
    g = torch.Generator().manual_seed(11)
    w = torch.randn(R, K, generator=g) * 0.02
    w[R - 1, 160:192] *= 2.0 ** 6  # the largest group, in the last program (index 67: slot 3)
    q8, _, rs, sb = kq.quest_fp8(w, tensor_offset=True, with_mask=False)
    rv, _, re = quest_quantize(hadamard_groups(w, 32), return_exponents=True)
    G = re.max().item()
    assert re[R - 1, 5].item() == G and (re[:R - 1] < G).all()
    assert sb.item() == 2.0 ** (G - 6) and (rs == sb).all()
    assert torch.equal(kq.e4m3_dequant(q8, rs), rv)


@cpu_only
def test_fp8_rescale_kernel_over_many_tiles():
    """The GEMM's rescale pass over a grid of (128, 1024) tiles: rows (rx != 1) and columns (rw != sw)
    at their own offsets in different tiles, rescaled exactly (powers of two); other tiles untouched."""
    M, K, N = 300, 32, 2100
    g = torch.Generator().manual_seed(12)
    x8 = torch.randn(M, K, generator=g).to(torch.float8_e5m2).view(torch.uint8)
    w8 = torch.randn(N, K, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    rx = torch.ones(M)
    rx[[5, 260]] = torch.tensor([2.0 ** 9, 2.0 ** -7])
    sw = torch.tensor([2.0 ** -3])
    rw = sw.repeat(N)
    rw[[40, 2099]] = torch.tensor([2.0 ** -20, 2.0 ** 4])
    y = kq.fp8_gemm_e5m2(x8, rx, w8, rw, sw, torch.float32)
    ref = kq.e5m2_dequant(x8, rx).double() @ kq.e4m3_dequant(w8, rw).double().t()
    err = (y.double() - ref).abs() / ref.abs().amax(1, keepdim=True)
    assert err.max() < 1e-6
    assert ref[5].abs().max() > 1e2 and ref[:, 40].abs().max() < 1e-3 and ref[:, 2099].abs().max() > 1.0


# ----------------------------------------------------------------------------------------------
# Native MXFP4 path (Blackwell): packed quantizers, tl.dot_scaled GEMM, dispatch
# ----------------------------------------------------------------------------------------------
@cpu_only
def test_quest_mxfp4_kernel_packs_the_reference_quest():
    from fp4attn.formats.core import FP4Tensor

    x = _inputs(37, 160, torch.float32, 11)
    x[4, 70] = float("nan")
    p, sc, mw = kq.quest_mxfp4(x)
    t = FP4Tensor(p, sc.view(torch.float8_e8m0fnu), None, "mxfp4", 1, x.shape, x.dtype)
    rv, rm = quest_quantize(hadamard_groups(x, 32))
    v = t.dequantize()
    assert torch.equal(v.isnan(), rv.isnan()) and v.isnan().sum() == 32
    assert torch.equal(torch.nan_to_num(v), torch.nan_to_num(rv))
    assert torch.equal(kq.unpack_mask(mw), rm)
    assert torch.equal(kq.mxfp4_dequant(p, sc).nan_to_num(), v.nan_to_num())
    # same quantization as the FP8 path's bytes
    q8, _, rs = kq.quest_fp8(x)
    ok = torch.arange(37) != 4
    assert torch.equal(kq.e4m3_dequant(q8, rs)[ok], v[ok])


@cpu_only
def test_sr_mxfp4_draws_equal_sr_fp8_draws():
    g = torch.Generator().manual_seed(12)
    dy = torch.randn(45, 72, generator=g)
    for a in (dy, dy.t()):
        p, sc = kq.sr_mxfp4(a, sign_seed=3, noise_seed=4)
        q8, rs = kq.sr_fp8(a, sign_seed=3, noise_seed=4)
        assert p.shape == (a.shape[0], q8.shape[1] // 2)
        assert torch.equal(kq.mxfp4_dequant(p, sc), kq.e4m3_dequant(q8, rs))


@cpu_only
def test_native_mxfp4_path_matches_fp8_path(monkeypatch):
    """Forced to "mxfp4" on CPU (quantizers interpreted, GEMM emulated in float32): same results."""
    M, K, N = 40, 64, 64
    x0 = _inputs(M, K, torch.float32, 13)
    w0 = torch.randn(N, K, generator=torch.Generator().manual_seed(14)) * 0.1
    dy = torch.randn(M, N, generator=torch.Generator().manual_seed(15))
    outs = {}
    for path in ("fp8", "mxfp4"):
        monkeypatch.setenv("FP4ATTN_QUARTET_GEMM", path)
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = kq.QuartetLinearCUDA.apply(x, w, None, QuartetRNG(5), 32)
        y.backward(dy)
        outs[path] = (y, x.grad, w.grad)
    for a, b in zip(outs["fp8"], outs["mxfp4"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def test_gemm_path_dispatch(monkeypatch):
    from fp4attn.ops import _dispatch
    monkeypatch.delenv("FP4ATTN_QUARTET_GEMM", raising=False)
    assert kq.gemm_path(torch.device("cpu")) == "fp8"
    for cap, path in (((9, 0), "fp8"), ((8, 9), "fp8"), ((10, 0), "mxfp4"), ((12, 0), "mxfp4")):
        monkeypatch.setattr(_dispatch, "capability", lambda d=None, c=cap: c)
        assert kq.gemm_path(torch.device("cuda")) == path
    monkeypatch.setenv("FP4ATTN_QUARTET_GEMM", "fp8")
    assert kq.gemm_path(torch.device("cuda")) == "fp8"


_COMPILE_SCRIPT = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fp4attn.kernels import quartet as kq
sig = {"A": "*u8", "SA": "*u8", "B": "*u8", "SB": "*u8", "C": "*bf16", "BIAS": "*bf16", "M": "i32",
       "N": "i32", "K": "i32", "HAS_BIAS": "constexpr", "FMT": "constexpr", "BLOCK_M": "constexpr",
       "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
consts = {"HAS_BIAS": True, "FMT": "e2m1", "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128}
k = triton.compile(ASTSource(fn=kq._mxfp4_gemm_kernel, signature=sig, constexprs=consts),
                   target=GPUTarget("cuda", 100, 32), options={"num_warps": 8, "num_stages": 3})
ptx = k.asm["ptx"]
print("MMA", "tcgen05.mma" in ptx, "kind::mxf4.block_scale" in ptx)
"""


def test_mxfp4_gemm_kernel_compiles_to_blackwell_mxf4_mma():
    """Compile check, no GPU needed: the tl.dot_scaled GEMM lowers to tcgen05 MXFP4 block-scaled MMAs
    on sm_100 (run in a fresh process: the interpreter patches triton.language in this one)."""
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0")
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0 and "ptxas" in r.stderr.lower() and "not found" in r.stderr.lower():
        pytest.skip("no ptxas for sm_100 in this Triton install")  # pragma: no cover
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MMA True True" in r.stdout


# ----------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------
@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_forward_matches_reference(dtype):
    torch.manual_seed(0)
    M, K, N = 1000, 1024, 768
    x = (torch.randn(M, K, device="cuda") * 2).to(dtype)
    x[:, 3] *= 40
    w = (torch.randn(N, K, device="cuda") * 0.05).to(dtype)
    b = torch.randn(N, device="cuda").to(dtype)
    x8, mx, rsx = kq.quest_fp8(x)
    rv, rm = quest_quantize(hadamard_groups(x.float(), 32))
    v = kq.e4m3_dequant(x8, rsx)
    differ = (v != rv) | (kq.unpack_mask(mx) != rm)
    # SPEC §2 kernel rule: the bf16 Hadamard dot rounds differently from the float32 reference only
    # at decision boundaries
    assert differ.float().mean() < 1e-4
    y = kq.QuartetLinearCUDA.apply(x, w, b, QuartetRNG(0), 32)
    yr, _ = quartet_forward(x, w, b)
    rel = ((y.float() - yr).norm() / yr.norm()).item()
    assert rel < (1e-3 if dtype == torch.float32 else 6e-3)


@gpu
@needs_cuda
def test_gpu_backward_unbiased_and_deterministic():
    torch.manual_seed(1)
    M, K, N, S = 96, 128, 160, 400
    x = torch.randn(M, K, device="cuda") * 2
    x[:, 5] *= 30
    w = torch.randn(N, K, device="cuda") * 0.1
    dy = torch.randn(M, N, device="cuda")
    _, ctx = quartet_forward(x, w)
    tdx, tdw = masked_ste_gradients(dy, ctx)
    dxs, dws = [], []
    for s in range(S):
        xx = x.clone().requires_grad_()
        ww = w.clone().requires_grad_()
        kq.QuartetLinearCUDA.apply(xx, ww, None, QuartetRNG(s), 32).backward(dy)
        dxs.append(xx.grad)
        dws.append(ww.grad)
    for est, target in ((torch.stack(dxs).double(), tdx.double()), (torch.stack(dws).double(), tdw.double())):
        se = est.std(0) / math.sqrt(S)
        z = (est.mean(0) - target) / se
        assert z.abs().max() < 6.5  # ~2e4 statistics, CLT over 400 draws
        assert 0.8 < (z ** 2).mean() < 1.25
        assert ((est.mean(0) * 1.02 - target) / se).square().mean() > 1.5  # the test has power
    # determinism: same seed -> bit-identical
    g = []
    for _ in range(2):
        xx = x.clone().requires_grad_()
        kq.QuartetLinearCUDA.apply(xx, w, None, QuartetRNG(7), 32).backward(dy)
        g.append(xx.grad)
    assert torch.equal(g[0], g[1])


@gpu
@needs_cuda
def test_gpu_cuda_graph_replays_draw_fresh_noise():
    """A forward+backward captured in a CUDA graph: each replay advances the step on the device and
    gives the gradients of an eager step at that step, bit for bit (fresh signs and noise per replay)."""
    torch.manual_seed(3)
    M, K, N = 256, 256, 128
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    rng = QuartetRNG(11)

    def step():
        return torch.autograd.grad(kq.QuartetLinearCUDA.apply(x, w, None, rng, 32), (x, w), dy)

    eager = {}
    for k in range(5):
        rng.step = k
        eager[k] = step()
    rng.step = 0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up (step 0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    assert rng.step == 1  # capturing runs nothing
    for k in (1, 2, 3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], eager[k][0]) and torch.equal(out[1], eager[k][1]), k
    assert rng.step == 4
    assert not torch.equal(eager[1][0], eager[2][0])


@gpu
@needs_cuda
def test_gpu_make_graphed_callables_trains_like_eager():
    """QuartetLinear through torch.cuda.make_graphed_callables (separately captured forward and backward
    graphs, the usual way to take a layer's host work out of a training step): each graphed step gives
    the gradients of the eager step at the same RNG step, and advances the step."""
    from fp4attn.nn import QuartetLinear
    torch.manual_seed(4)
    m = QuartetLinear(256, 128, bias=True, device="cuda", dtype=torch.bfloat16, seed=21)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)

    def grads(fn):
        x.grad = None
        m.zero_grad(set_to_none=True)
        fn(x).backward(dy)
        return x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone()

    eager = []
    for k in (10, 11):
        m.rng.step = k
        eager.append(grads(m))
    graphed = torch.cuda.make_graphed_callables(m, (x,))
    m.rng.step = 10
    for k, ref in zip((10, 11), eager):
        got = grads(graphed)
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), k
    assert m.rng.step == 12
    assert not torch.equal(eager[0][0], eager[1][0])


@gpu
@needs_cuda
def test_gpu_module_dispatches_to_kernels():
    from fp4attn.nn import QuartetLinear
    m = QuartetLinear(256, 128, device="cuda", dtype=torch.bfloat16, seed=0)
    x = torch.randn(4, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = m(x)
    assert y.grad_fn is not None and "QuartetLinearCUDA" in type(y.grad_fn).__name__
    y.float().square().sum().backward()
    assert x.grad.shape == x.shape and m.weight.grad.dtype == torch.bfloat16


@triton.jit
def _quest_exp_kernel(Y, E, INV, BAD, ZERO, HDOT: tl.constexpr, BR: tl.constexpr, NG: tl.constexpr):
    r = tl.arange(0, BR)[:, None, None]
    g = tl.arange(0, NG)[None, :, None]
    c = tl.arange(0, 32)[None, None, :]
    y = tl.load(Y + (r * NG + g) * 32 + c)
    xh = y * 0.17677669529663687 if HDOT != 0 else y
    e, inv, bad, zero = kq._quest_exp(xh, y, HDOT)
    o = tl.arange(0, BR)[:, None] * NG + tl.arange(0, NG)[None, :]
    tl.store(E + o, e)
    tl.store(INV + o, inv)
    tl.store(BAD + o, bad)
    tl.store(ZERO + o, zero.to(tl.int32))


@cpu_only
def test_quest_statistics_written_out_agree_with_plain_sums():
    """_quest_exp's spelled-out statistics (HDOT 1/2, the form compiled for tensor-core dots) run in the
    interpreter here: same exponents, scales, NaN/Inf and zero-group flags as the plain sums on
    16-bit-like data (their roundings differ, the binades practically never), NaN/Inf/zero/constant/huge
    groups included."""
    g = torch.Generator().manual_seed(4)
    y = (torch.randn(32, 4, 32, generator=g) * torch.exp2(torch.randint(-30, 30, (32, 4, 1), generator=g).float()))
    y = y.to(torch.bfloat16).float() * 32 ** 0.5
    y[0, 0] = 0.0
    y[1, 1, 3] = float("nan")
    y[2, 2, 5] = float("inf")
    y[3, 3] = 3e38
    y[4, 0] = 0.5  # constant, not zero: std 0, e = -27, codes saturate
    outs = []
    for hdot in (0, 1):
        e, inv, bad, zero = (torch.empty(32, 4, dtype=torch.int32), torch.empty(32, 4),
                             torch.empty(32, 4, dtype=torch.int32), torch.empty(32, 4, dtype=torch.int32))
        yy = y * 0.17677669529663687 if hdot == 0 else y  # HDOT 0 gets the scaled values (its y is xh)
        _quest_exp_kernel[(1,)](yy.contiguous(), e, inv, bad, zero, HDOT=hdot, BR=32, NG=4)
        outs.append((e, inv, bad, zero))
    (e0, i0, b0, z0), (e1, i1, b1, z1) = outs
    assert torch.equal(z0, z1) and z1[0, 0] == 1 and z1.sum() == 1 and e1[4, 0] == -27
    assert torch.equal(b0, b1) and b1[1, 1] == 1 and b1[2, 2] == 1 and b1.sum() == 2
    ok = b0 == 0
    assert torch.equal(e0[ok], e1[ok]) and torch.equal(i0[ok], i1[ok])
    assert e1[0, 0] == -27 and (i1 == torch.ldexp(torch.ones(()), -e1)).all()


@triton.jit
def _scaled_code_kernel(X, K, RAW, REF, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    s = exp2i(tl.load(K + offs, mask=m, other=0))
    tl.store(RAW + offs, e2m1_code_raw(x, s) & 15, mask=m)
    tl.store(REF + offs, e2m1_code(x * s).to(tl.int32), mask=m)


def _check_scaled_code(device):
    """``e2m1_code_raw(x, 2**k)`` (the QuEST encoder: the scale inside the rounding fmas, the sign OR-ed
    in; inline PTX on the GPU) has the low 4 bits of ``e2m1_code(x * 2**k)`` (NaN aside: e2m1_code maps
    it to 0): dense values around every decision point, ties, +-0, subnormal products, overflow."""
    g = torch.Generator().manual_seed(5)
    pts = torch.tensor([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 12.0])
    ulp = torch.arange(-40, 41, dtype=torch.float32)
    base = torch.cat([(pts[:, None] * (1 + ulp[None, :] * 2.0 ** -23)).flatten(), torch.rand(4000, generator=g) * 8,
                      torch.tensor([1e-45, 1e-38, 3e38, float("inf")])])
    ks = torch.tensor([-127, -126, -100, -27, -1, 0, 1, 60, 125], dtype=torch.int32)
    x = (torch.cat([base, -base])[None, :] * torch.exp2(-ks.float())[:, None]).flatten()
    k = ks[:, None].expand(-1, 2 * base.numel()).flatten().contiguous()
    x, k = x.to(device), k.to(device)
    raw, ref = (torch.empty(x.numel(), dtype=torch.int32, device=device) for _ in range(2))
    _scaled_code_kernel[(triton.cdiv(x.numel(), 1024),)](x, k, raw, ref, x.numel(), BLOCK=1024)
    assert torch.equal(raw, ref)


@cpu_only
def test_scaled_e2m1_code_matches_code_of_product():
    _check_scaled_code("cpu")


@gpu
@needs_cuda
def test_gpu_scaled_e2m1_code_matches_code_of_product():
    _check_scaled_code("cuda")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_quest_tile_shapes_agree_bitwise(dtype):
    """The 128 x 32 QuEST tile (the ``block_k=32`` option) and the default 32 x 128 one give the same bits:
    a group's place in the MMA accumulator, and so every rounding of its statistics, does not depend on
    the tile (tools/sass_flow.py --any-tile shows it on the SASS; this on the hardware)."""
    torch.manual_seed(1)
    x = torch.randn(1024, 512, device="cuda") * 3
    x[:, 7] *= 50
    x[3, :32] = 0.0
    x[4, 32:64] = 1.0
    x[5, :32] = float("nan")
    x[6, 100] = float("inf")
    x[7, :64] *= 1e30
    x[8, :32] *= 1e-30
    x = x.to(dtype)
    for f in (kq.quest_fp8, kq.quest_mxfp4):
        a, b = f(x), f(x, block_k=32)
        for u, v in zip(a, b):
            assert torch.equal(u.view(torch.uint8) if u.is_floating_point() else u,
                               v.view(torch.uint8) if v.is_floating_point() else v)


@triton.jit
def _e4m3_hw_sw_kernel(X, B, OUT_HW, OUT_SW, VAL_HW, VAL_SW, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    tl.store(OUT_HW + offs, kq._to_e4m3(x, True), mask=m)
    tl.store(OUT_SW + offs, kq._to_e4m3(x, False), mask=m)
    b = tl.load(B + offs, mask=offs < 256, other=0)
    tl.store(VAL_HW + offs, kq._e4m3_value(b, True), mask=offs < 256)
    tl.store(VAL_SW + offs, kq._e4m3_value(b, False), mask=offs < 256)


@gpu
@needs_cuda
def test_gpu_hardware_e4m3_conversions_equal_the_software_forms():
    """The kernels use the hardware E4M3 conversions on GPU; the interpreter tests check the software
    forms against the reference, so the two must give the same bytes / values on every input the
    kernels produce: E2M1 values times 2**k, k <= 6 (exact in E4M3 down to 2**-9, rounded below; the
    software form truncates other normal values, which never reach it), and NaN."""
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device="cuda")
    k = torch.arange(-24, 7, device="cuda", dtype=torch.float32)
    vals = (e2m1[:, None] * torch.exp2(k)[None, :]).flatten()
    x = torch.cat([vals, -vals, torch.tensor([float("nan")], device="cuda")]).contiguous()
    n = x.numel()
    hw, sw = (torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2))
    b = torch.arange(256, dtype=torch.uint8, device="cuda")
    vhw, vsw = (torch.empty(256, device="cuda") for _ in range(2))
    _e4m3_hw_sw_kernel[(triton.cdiv(n, 1024),)](x, b, hw, sw, vhw, vsw, n, BLOCK=1024)
    fin = x.isfinite()
    assert torch.equal(hw[fin], sw[fin])
    assert ((hw[~fin] & 0x7F) == 0x7F).all() and ((sw[~fin] & 0x7F) == 0x7F).all()  # NaN, either sign
    same = (vhw == vsw) | (vhw.isnan() & vsw.isnan())
    assert same.all() and torch.equal(vsw.isnan(), (b & 0x7F) == 0x7F)


@gpu
@needs_cuda
def test_gpu_sr_code_u16_and_philox_forms_bitwise():
    """The compiled inline-PTX forms (SR code from 16-bit uniforms by rounding up and integer carry;
    Philox with wide multiplies) against the plain compiled Triton forms, bit for bit: every SR
    decision threshold and its float neighbours for 64 uniforms, specials, 4M random values."""
    _check_sr_u16_forms("cuda", 1 << 22)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_sr_kernel_hw_forms_bitwise(dtype):
    """The SR kernel with its GPU-only forms (HW: the sign flip as a 32-bit XOR of two 16-bit values)
    and without them: the same codes, scale bytes and row maxima, bit for bit."""
    torch.manual_seed(5)
    a = torch.randn(300, 520, device="cuda").to(dtype)
    a[7, 100] = float("inf")
    for src in (a, a.t()):
        hw = kq._sr_mx(src, 11, 12345, None, None, None, None, 64, True, hw=True)
        sw = kq._sr_mx(src, 11, 12345, None, None, None, None, 64, True, hw=False)
        for x, y in zip(hw, sw):
            assert torch.equal(x, y)


@gpu
@needs_cuda
def test_gpu_sr_operand_matches_reference_primitives():
    """The compiled SR kernel (16-bit Philox uniforms, hardware E4M3) vs the reference fed the same
    signs and uniforms. float32 input: the Hadamard is a float32 dot, whose summation order differs
    from the reference matmul, so a value may land on the other side of an SR decision point (rare)."""
    torch.manual_seed(3)
    dy = torch.randn(300, 520, device="cuda")  # L = 520 -> padded to 544
    q8, rs = kq.sr_fp8(dy, sign_seed=11, noise_seed=12345)
    expect = sr_expected(dy, kq.random_signs(11, 544, "cuda"), philox_uniforms(12345, 300, 544, "cuda"))
    got = kq.e4m3_dequant(q8, rs)
    assert got.shape == expect.shape
    assert (got != expect).float().mean() < 1e-3
    # bf16 input: the random signs are applied as an XOR of the sign bit before the +-1 bf16 dot
    dyb = dy.to(torch.bfloat16)
    q8, rs = kq.sr_fp8(dyb, sign_seed=11, noise_seed=12345)
    expect = sr_expected(dyb.float(), kq.random_signs(11, 544, "cuda"), philox_uniforms(12345, 300, 544, "cuda"))
    assert (kq.e4m3_dequant(q8, rs) != expect).float().mean() < 1e-3
    x8, _, rsx = kq.quest_fp8(torch.randn(200, 256, device="cuda"))
    q8, rs = kq.sr_fp8(x8.t(), sign_seed=5, noise_seed=6, scale=rsx)
    src = kq.e4m3_dequant(x8, rsx).t()
    expect = sr_expected(src, kq.random_signs(5, 224, "cuda"), philox_uniforms(6, 256, 224, "cuda"))
    assert (kq.e4m3_dequant(q8, rs) != expect).float().mean() < 1e-3


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_mask_ihadamard_every_dtype(dtype):
    """The compiled epilogue in each gradient dtype (16-bit: the +-1 dot, then 16/9 and 1/sqrt(32) in
    float32; float32: the normalized H) against the float32 reference. The interpreter runs only the
    float32 form, so this is the only check of the 16-bit scaling (a double 1/sqrt(32) once slipped
    through and shrank every Quartet gradient 5.7x in bf16 training)."""
    torch.manual_seed(0)
    d = torch.randn(96, 256, device="cuda").to(dtype)
    mask = torch.rand(96, 256, device="cuda") < 0.8
    lane = torch.arange(32, device="cuda", dtype=torch.int64)
    words = (mask.reshape(96, 8, 32).long() << lane).sum(-1)
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    out = kq.mask_ihadamard(d, words, torch.float32)
    ref = hadamard_groups(d.float() * (16 / 9) * mask, 32, -1)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5


@gpu
@needs_cuda
def test_gpu_table_fp8_conversion_equals_value_wise():
    """The byte-permute conversion of packed MXFP4 to the FP8 embedding (GPU default, inline PTX: the
    interpreter cannot run it) against the value-wise one, byte for byte, on every code in every
    position, group exponents from the row maximum down to 30 binades below it (exact, rounded and
    flushed E4M3), NaN groups (scale byte 255), a tail tile (L not a multiple of the tile) and rows
    past the last tile."""
    torch.manual_seed(0)
    R, L = 67, 32 * 37
    codes = torch.randint(0, 16, (R, L), device="cuda", dtype=torch.uint8)
    codes[0, :16] = torch.arange(16, device="cuda", dtype=torch.uint8)
    p = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    e = torch.randint(-30, 1, (R, L // 32), device="cuda", dtype=torch.int32) + 100
    e[:, 0] = 100  # the row maximum
    sc = (e + 127).to(torch.uint8)
    sc[3, 5] = 255
    sc[7, :] = 255
    emax = torch.full((R,), 100, dtype=torch.int32, device="cuda")
    emax[7] = -127  # an all-NaN row (no finite group)
    q_tab, rs_tab = kq._mx_to_fp8(p, sc, emax, table=True)
    q_val, rs_val = kq._mx_to_fp8(p, sc, emax, table=False)
    assert torch.equal(q_tab, q_val) and torch.equal(rs_tab, rs_val)
    # and the bytes are the E4M3 values the embedding promises (exact within 14 binades of the max)
    v = kq.mxfp4_dequant(p, sc)
    got = kq.e4m3_dequant(q_tab, rs_tab)
    ok = (e >= 100 - kq.FP8_EXACT_RANGE).repeat_interleave(32, dim=1) & (sc != 255).repeat_interleave(32, dim=1)
    assert torch.equal(got[ok], v[ok])
    assert got[~(sc != 255).repeat_interleave(32, dim=1)].isnan().all()


# ----------------------------------------------------------------------------------------------
# The forward's operands: activation as E5M2 in one pass, weight at its tensor offset, tensor-wise GEMM
# ----------------------------------------------------------------------------------------------
@triton.jit
def _e5m2_byte_kernel(X, K, E, NAN, BYTE, VAL, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0)
    s = exp2i(tl.load(K + offs, mask=m, other=0))
    e = tl.load(E + offs, mask=m, other=0)
    tl.store(BYTE + offs, kq.e2m1_e5m2_byte(x, s, e, tl.load(NAN + offs, mask=m, other=0)), mask=m)
    tl.store(VAL + offs, kq.e2m1_decode(e2m1_code_raw(x, s)) * exp2i(e), mask=m)


def _check_e5m2_byte(device):
    """``e2m1_e5m2_byte(x, 2**k, e)`` is the E5M2 byte of the E2M1 value of ``x * 2**k`` (the code
    ``e2m1_code_raw`` gives) times 2**e, for every e in [-13, 13]: values around every decision point,
    ties, +-0, tiny and huge products, inf."""
    g = torch.Generator().manual_seed(9)
    pts = torch.tensor([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 12.0])
    ulp = torch.arange(-3, 4, dtype=torch.float32)
    base = torch.cat([(pts[:, None] * (1 + ulp[None, :] * 2.0 ** -23)).flatten(), torch.rand(200, generator=g) * 8,
                      torch.tensor([1e-45, 3e38, float("inf")])])
    base = torch.cat([base, -base])
    ks = torch.tensor([-127, -27, -1, 0, 3, 125], dtype=torch.int32)
    es = torch.arange(-13, 14, dtype=torch.int32)
    grid = torch.cartesian_prod(torch.arange(base.numel()), torch.arange(ks.numel()), torch.arange(es.numel()))
    k = ks[grid[:, 1]]
    x = (base[grid[:, 0]] * torch.exp2(-k.float())).contiguous()
    e = es[grid[:, 2]].contiguous()
    x, k, e = x.to(device), k.contiguous().to(device), e.to(device)
    n = x.numel()
    byte = torch.empty(n, dtype=torch.int32, device=device)
    val = torch.empty(n, dtype=torch.float32, device=device)
    nan = (torch.rand(n, generator=g) < 0.1).to(torch.int32)  # the NaN-group flag: 0x7F, either sign
    _e5m2_byte_kernel[(triton.cdiv(n, 1024),)](x, k, e, nan.to(device), byte, val, n, BLOCK=1024)
    ref = val.cpu().to(torch.float8_e5m2).view(torch.uint8).to(torch.int32)
    got = byte.cpu()
    assert torch.equal(got[nan == 0], ref[nan == 0])  # bits 8-31 zero
    assert torch.equal(got[nan != 0] & 0xFF, torch.full_like(got[nan != 0], 0x7F))  # the low byte NaN


@cpu_only
def test_e2m1_e5m2_byte_matches_the_float_path():
    _check_e5m2_byte("cpu")


@gpu
@needs_cuda
def test_gpu_e2m1_e5m2_byte_matches_the_float_path():
    _check_e5m2_byte("cuda")


def _window_inputs(dtype):
    x = _inputs(70, 160, torch.float32, 2)
    x[5, 40] = float("nan")
    x[7] *= 2.0 ** 20  # every group above the E5M2 window (e > 13): rewritten at its own offset
    x[9, 64:96] *= 2.0 ** -20  # one group below it (e < -13), 21 binades under the row's largest: exact
    # one group more than 28 binades under its row's largest (QuEST's 1e-8 floors a group's scale at
    # 2**-27, so the row is raised): E5M2 subnormals
    x[11] *= 2.0 ** 8
    x[11, 0:32] *= 2.0 ** -33
    return x.to(dtype)


def _check_quest_e5m2(x, exact_ok):
    """quest_e5m2 of x vs the reference QuEST: equal values where ``exact_ok`` (rows), the rows in the
    window at rs = 1, the others at 2**(E_r - 13), row 11's tiny group rounded as E5M2 rounds it."""
    q8, m, rs = kq.quest_e5m2(x)
    rv, rm, re = quest_quantize(hadamard_groups(x.float().cpu(), 32), return_exponents=True)
    v = kq.e5m2_dequant(q8, rs).cpu()
    same = (v == rv) | (v.isnan() & rv.isnan())
    assert same[exact_ok].all()
    assert torch.equal(kq.unpack_mask(m).cpu(), rm)
    emax = torch.where(rv.reshape(70, 5, 32).isnan().any(-1), -127, re).amax(1)
    rewritten = torch.zeros(70, dtype=torch.bool)
    rewritten[[7, 9, 11]] = True
    assert torch.equal(rs.cpu()[~rewritten], torch.ones(67))
    assert torch.equal(rs.cpu()[rewritten], torch.exp2(emax[rewritten].float() - 13))
    er = emax[11].item()
    assert torch.equal(v[11], (rv[11] * 2.0 ** (13 - er)).to(torch.float8_e5m2).float() * 2.0 ** (er - 13))
    assert not torch.equal(v[11, :32], rv[11, :32])  # the test reaches the rounding
    assert v[5, 32:64].isnan().all() and v[5, 64:].isfinite().all()
    # without the trust mask: the same bytes and scales
    q8b, mb, rsb = kq.quest_e5m2(x, with_mask=False)
    assert mb is None and torch.equal(q8b, q8) and torch.equal(rsb, rs)
    return q8, rs


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quest_e5m2_kernel_matches_reference(dtype):
    """The interpreter's float32 Hadamard dot reproduces the reference: every value exact except the
    group of row 11 that lies over 28 binades under its row (the documented E5M2 condition: e >= E_r - 28)."""
    x = _window_inputs(dtype)
    ok = torch.ones(70, 160, dtype=torch.bool)
    ok[11, :32] = False
    _check_quest_e5m2(x, ok)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # (float16 overflows the 2**20 row)
def test_gpu_quest_e5m2_matches_quest_fp8(dtype):
    """Compiled: the E5M2 operand holds the values of the E4M3 one (``quest_fp8``, same bf16/fp16
    Hadamard dot) wherever both are exact, with the hardware E5M2 conversion in the rewrite kernel."""
    x = _window_inputs(dtype).cuda()
    q8, rs = kq.quest_e5m2(x)[0::2]
    x8, _, rsx = kq.quest_fp8(x)
    v, v4 = kq.e5m2_dequant(q8, rs), kq.e4m3_dequant(x8, rsx)
    rows = torch.ones(70, dtype=torch.bool)
    rows[[5, 9, 11]] = False  # NaN group; groups > 14 binades under the row (E4M3 rounds them)
    assert torch.equal(v[rows], v4[rows])
    assert torch.equal(v[9, :64], v4[9, :64]) and torch.equal(v[11, 32:], v4[11, 32:])
    # and the reference, up to the bf16/fp16 Hadamard dot's decision-boundary differences
    rv = quest_quantize(hadamard_groups(x.float().cpu(), 32))[0]
    fin = rv.isfinite()
    ok = torch.ones(70, 160, dtype=torch.bool)
    ok[11, :32] = False
    assert ((v.cpu() != rv) & fin & ok).float().mean() < 1e-3


@cpu_only
def test_quest_fp8_tensor_offset():
    """quest_fp8(tensor_offset=True): the reference values; rows within 14 binades of the tensor's
    largest group at its offset (rs = the GEMM scale 2**(G - 6)), the others at their own."""
    g = torch.Generator().manual_seed(4)
    w = torch.randn(64, 160, generator=g) * 0.02
    w[3] *= 2.0 ** -20  # the whole row far below: own offset
    w[4, :32] *= 2.0 ** -30  # one group far below its row and the tensor: the row keeps its own offset
    w[6] = 0.0  # all-zero row: at the tensor offset
    q8, m, rs, sb = kq.quest_fp8(w, tensor_offset=True)
    rv, rm, re = quest_quantize(hadamard_groups(w, 32), return_exponents=True)
    assert torch.equal(kq.e4m3_dequant(q8, rs), rv) and torch.equal(kq.unpack_mask(m), rm)
    G = re.max().item()
    assert sb.shape == (1,) and sb.item() == 2.0 ** (G - 6)
    own = torch.zeros(64, dtype=torch.bool)
    own[[3, 4]] = True
    assert (rs[~own] == sb).all()
    assert torch.equal(rs[own], torch.exp2(re[own].amax(1).float() - 6)) and rs[3] < sb
    # the same values as the per-row embedding
    x8, _, rsx = kq.quest_fp8(w)
    assert torch.equal(kq.e4m3_dequant(x8, rsx), rv)


@cpu_only
def test_fp8_gemm_e5m2_rescales_rows_and_columns():
    """Tensor-wise GEMM + rescale of the rows (rx != 1) and columns (rw != sw) at their own offsets:
    equal to the float64 product of the dequantized operands up to float32 accumulation."""
    x = _window_inputs(torch.float32)
    x[5, 40] = 1.0
    w = torch.randn(96, 160, generator=torch.Generator().manual_seed(3)) * 0.02
    w[10] *= 2.0 ** -20
    q8, _, rs = kq.quest_e5m2(x, with_mask=False)
    w8, _, rw, sw = kq.quest_fp8(w, tensor_offset=True)
    assert (rs != 1).sum() == 3 and (rw != sw).sum() == 1
    bias = torch.randn(96)
    y = kq.fp8_gemm_e5m2(q8, rs, w8, rw, sw, torch.float32, bias)
    ref = kq.e5m2_dequant(q8, rs).double() @ kq.e4m3_dequant(w8, rw).double().t() + bias.double()
    err = (y.double() - ref).abs() / ref.abs().amax(1, keepdim=True)
    assert err.max() < 1e-6
    assert ref[7].abs().max() > 1e3 and (ref[:7, 10] - bias[10]).abs().max() < 1e-3  # rescaled row / column


@cpu_only
def test_sr_fp8_of_a_saved_e5m2_operand():
    """The backward's SR quantizer reads the saved E5M2 activation (bytes times row scales) exactly.
    (Row 9 is rewritten at its own offset; rows 7 and 11 of ``_window_inputs`` are left out: 2**20 apart
    within one reduction group, the SR operand's own E4M3 embedding would round its small groups.)"""
    x = _inputs(70, 160, torch.float32, 2)
    x[9, 64:96] *= 2.0 ** -20
    q8, _, rs = kq.quest_e5m2(x, with_mask=False)
    assert (rs != 1).nonzero().flatten().tolist() == [9]
    src = kq.e5m2_dequant(q8, rs)
    out, ors = kq.sr_fp8(q8.t(), sign_seed=5, noise_seed=6, scale=rs, a_fmt="e5m2")
    expect = sr_expected(src.t(), kq.random_signs(5, 96, "cpu"), philox_uniforms(6, 160, 96))
    assert torch.equal(kq.e4m3_dequant(out, ors), expect)
    with pytest.raises(ValueError, match="a_fmt"):
        kq.sr_fp8(q8.t(), sign_seed=5, noise_seed=6, scale=rs, a_fmt="e3m4")


@gpu
@needs_cuda
def test_gpu_fp8_gemm_e5m2_equals_the_rowwise_gemm():
    """The forward GEMM (tensor-wise cuBLAS + rescale) against the row-wise scaled GEMM of the same
    values: equal up to float32 accumulation order, rescaled rows and columns included."""
    x = _window_inputs(torch.bfloat16).cuda()
    x[5, 40] = 1.0
    w = (torch.randn(96, 160, device="cuda") * 0.02).to(torch.bfloat16)
    w[10] *= 2.0 ** -20
    q8, _, rs = kq.quest_e5m2(x, with_mask=False)
    w8, _, rw, sw = kq.quest_fp8(w, tensor_offset=True)
    x8, _, rsx = kq.quest_fp8(x)
    y = kq.fp8_gemm_e5m2(q8, rs, w8, rw, sw, torch.float32)
    y4 = kq.fp8_gemm(x8, rsx, w8, rw, torch.float32)
    ok = torch.ones(70, dtype=torch.bool, device="cuda")
    ok[[9, 11]] = False  # E4M3 rounds their far groups
    err = (y - y4).abs() / y4.abs().amax(1, keepdim=True).clamp_min(1e-30)  # (row 1 is all zero)
    assert err[ok].max() < 1e-5 and torch.equal(y[1], y4[1])
