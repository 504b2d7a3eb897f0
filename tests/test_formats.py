"""The FP4 formats (SPEC §2) against independent, slow, exact implementations and the spec's numbers."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fp4attn
from fp4attn.formats import core

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# ---------------------------------------------------------------- independent slow implementations
def slow_e2m1_code(x: float) -> int:
    """Nearest E2M1 magnitude by exhaustive search; ties to the even code; sign in bit 3."""
    if math.isnan(x):
        return 0
    a = min(abs(Fraction(x)), Fraction(6)) if math.isfinite(x) else Fraction(6)
    best = min(range(8), key=lambda c: (abs(Fraction(E2M1[c]) - a), c % 2))
    neg = math.copysign(1.0, x) < 0
    return best | (8 if neg else 0)


def _e4m3_values():
    vals = []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN
            v = Fraction(m, 8) * Fraction(2) ** -6 if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
            vals.append((v, m))
    return vals


E4M3_VALUES = _e4m3_values()


def slow_e4m3(x: float) -> float:
    """Nearest E4M3 (ties to even mantissa), saturating at 448, by exhaustive search."""
    fx = Fraction(x)
    if fx >= 448:
        return 448.0
    v, _ = min(E4M3_VALUES, key=lambda vm: (abs(vm[0] - fx), vm[1] % 2))
    return float(v)


def slow_mx_exp(amax: float, mode: str) -> int:
    if amax == 0:
        return -127
    fa = Fraction(amax)
    if mode == "floor":
        e = math.floor(math.log2(amax))
        while Fraction(2) ** e > fa:
            e -= 1
        while Fraction(2) ** (e + 1) <= fa:
            e += 1
        e -= 2
    else:
        e = -200
        while 6 * Fraction(2) ** e < fa:
            e += 1
    return max(-127, min(127, e))


def slow_quantize_block(block, fmt, mode="rceil", s_enc=None):
    """Dequantized values of one block, from the spec's formulas, in exact/float64 arithmetic."""
    if any(not math.isfinite(x) for x in block):
        return [float("nan")] * len(block)
    amax = max(abs(x) for x in block)
    if fmt == "nvfp4":
        enc = 1.0 if s_enc is None else s_enc
        sb = slow_e4m3(float(torch.tensor(amax / 6, dtype=torch.float32)) * enc if s_enc is None else
                       float(torch.tensor(amax, dtype=torch.float32) / 6 * torch.tensor(enc, dtype=torch.float32)))
        if sb == 0:
            return [0.0] * len(block)
        denom = float(torch.tensor(sb, dtype=torch.float32) / torch.tensor(enc, dtype=torch.float32))
        codes = [slow_e2m1_code(float(torch.tensor(x, dtype=torch.float32) / torch.tensor(denom))) for x in block]
        g = 1.0 if s_enc is None else float(torch.tensor(1.0) / torch.tensor(enc, dtype=torch.float32))
        out = []
        for c in codes:
            val = E2M1[c & 7] * (-1 if c & 8 else 1)
            out.append(float(torch.tensor(val * sb, dtype=torch.float32) * torch.tensor(g, dtype=torch.float32)))
        return out
    e = slow_mx_exp(amax, mode)
    out = []
    for x in block:
        c = slow_e2m1_code(float(Fraction(x) / Fraction(2) ** e))
        out.append(float(E2M1[c & 7] * (-1 if c & 8 else 1) * Fraction(2) ** e))
    return out


# ---------------------------------------------------------------- the spec's numbers
def test_e2m1_ties_to_even_code():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert core.e2m1_round(x).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert core.e2m1_round(-x).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]


def test_e2m1_codes_and_saturation():
    x = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 6.5, 7.0, 100.0, float("inf")])
    assert core.e2m1_encode(x).tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 7, 7, 7, 7]
    assert core.e2m1_encode(torch.tensor([-0.0, -6.0, -1e9, -0.1])).tolist() == [8, 15, 15, 8]


def test_e2m1_exhaustive_against_slow():
    # every float32 neighbourhood of every threshold and value
    pts = []
    for t in [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + E2M1:
        base = torch.tensor(t, dtype=torch.float32)
        pts += [torch.nextafter(base, torch.tensor(-1.0)).item(), t, torch.nextafter(base, torch.tensor(9.0)).item()]
    pts += torch.linspace(-7, 7, 2001).tolist()
    x = torch.tensor(pts, dtype=torch.float32)
    assert core.e2m1_encode(x).tolist() == [slow_e2m1_code(v) for v in x.tolist()]


def test_e4m3_rounding_exhaustive():
    vals = [float(v) for v, _ in E4M3_VALUES]
    mids = [(a + b) / 2 for a, b in zip(sorted(vals)[:-1], sorted(vals)[1:])]
    pts = vals + mids + [449.0, 463.9, 464.0, 465.0, 1e6, 2.0 ** -10, 2.0 ** -9 * 0.75, 1e-30]
    x = torch.tensor(pts, dtype=torch.float32)
    got = core.e4m3_round(x).float().tolist()
    assert got == [slow_e4m3(v) for v in x.tolist()]
    assert core.e4m3_round(torch.tensor([1e30])).float().item() == 448.0  # saturating, not NaN


@pytest.mark.parametrize("mode", ["rceil", "floor"])
def test_mx_exponent_exact(mode):
    vals = [0.0, 6.0, 6.000001, 5.999999, 1.5, 3.0, 3.0000002, 12.0, 1e-38, 1e-45, 3.4e38, 1.0, 0.75, 1e-30]
    for k in range(-20, 20):
        vals += [6 * 2.0 ** k, torch.nextafter(torch.tensor(6 * 2.0 ** k), torch.tensor(1e30)).item()]
    x = torch.tensor(vals, dtype=torch.float32)
    got = core.mx_exponent(x, mode).tolist()
    assert got == [slow_mx_exp(v, mode) for v in x.tolist()]


def test_mx_rceil_never_clips():
    torch.manual_seed(0)
    x = torch.randn(64, 32) * torch.logspace(-20, 20, 64).unsqueeze(1)
    y = fp4attn.fake_quantize(x, "mxfp4")
    amax = x.abs().amax(1)
    assert torch.all(y.abs().amax(1) <= amax * 1.5)  # rceil: nothing clipped to 6*2^e < amax
    b = core.quantize_blocks(x.view(64, 1, 32), "mxfp4")
    assert torch.all(6 * b.scale.squeeze(1) >= amax)


def test_mx_floor_clips_large_values():
    x = torch.zeros(32)
    x[0] = 7.0  # floor: e = floor(log2 7) - 2 = 0 -> 7 clips to 6
    assert fp4attn.fake_quantize(x, "mxfp4", scale_mode="floor")[0].item() == 6.0
    assert fp4attn.fake_quantize(x, "mxfp4")[0].item() == 8.0  # rceil: e = 1, 7/2 = 3.5 -> 4 -> 8


def test_nvfp4_scale_numbers():
    # amax 6 -> scale 1; element ties land on the even code
    x = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0] + [0.0] * 8)
    t = fp4attn.quantize(x)
    assert t.scales.float().tolist() == [1.0]
    assert t.dequantize().tolist()[:8] == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    # saturated scale: amax/6 > 448 -> scale 448, values above 6*448 clip
    big = torch.full((16,), 1e6)
    t = fp4attn.quantize(big)
    assert t.scales.float().item() == 448.0 and t.dequantize()[0].item() == 6 * 448.0
    # subnormal E4M3 scale (2^-9 is the smallest) and a scale that rounds to zero
    tiny = torch.zeros(16)
    tiny[0] = 6 * 2.0 ** -9
    t = fp4attn.quantize(tiny)
    assert t.scales.float().item() == 2.0 ** -9 and t.dequantize()[0].item() == 6 * 2.0 ** -9
    zero = torch.zeros(16)
    zero[0] = 1e-5
    t = fp4attn.quantize(zero)
    assert t.scales.float().item() == 0.0 and torch.all(t.dequantize() == 0)
    assert torch.all(t.data == 0)


def test_packing_order_and_dtype_views():
    x = torch.tensor([0.5, 6.0] + [0.0] * 14)  # codes 1 and 7 (scale 1)
    t = fp4attn.quantize(x)
    assert t.data.dtype == torch.uint8 and t.data.shape == (8,)
    assert t.data[0].item() == 0x71  # element 0 in the low nibble
    assert t.fp4_view().dtype == torch.float4_e2m1fn_x2
    assert t.scales.dtype == torch.float8_e4m3fn
    tm = fp4attn.quantize(torch.randn(4, 64), "mxfp4")
    assert tm.scales.dtype == torch.float8_e8m0fnu and tm.scales.shape == (4, 2)


def test_nonfinite_blocks_are_nan():
    x = torch.randn(3, 32)
    x[0, 3] = float("nan")
    x[1, 20] = float("inf")
    for fmt in ("nvfp4", "mxfp4"):
        y = fp4attn.fake_quantize(x, fmt)
        bs = core.block_size(fmt)
        assert torch.isnan(y[0, :bs]).all() and torch.isnan(y[1, 16 if fmt == "nvfp4" else 0:32]).all()
        assert torch.isfinite(y[2]).all()
        if fmt == "nvfp4":
            assert torch.isfinite(y[0, 16:]).all() and torch.isfinite(y[1, :16]).all()
        t = fp4attn.quantize(x, fmt)
        assert torch.isnan(t.scale_values()[0, 0])
    # global scale ignores the NaN when taking the tensor amax
    y = fp4attn.fake_quantize(x, "nvfp4", global_scale=True)
    assert torch.isfinite(y[2]).all()


def test_zero_blocks():
    for fmt in ("nvfp4", "mxfp4"):
        t = fp4attn.quantize(torch.zeros(2, 64), fmt)
        assert torch.all(t.dequantize() == 0) and torch.all(t.data == 0)
    t = fp4attn.quantize(torch.zeros(2, 64), "nvfp4", global_scale=True)
    assert t.global_scale.item() == 1.0 and torch.all(t.dequantize() == 0)


def test_global_scale_formula():
    torch.manual_seed(1)
    x = torch.randn(8, 64) * 1e4
    t = fp4attn.quantize(x, global_scale=True)
    s_enc = torch.tensor(448.0 * 6.0) / x.abs().max()
    assert t.global_scale.item() == (1.0 / s_enc).item()
    # the block scales use the E4M3 range: the block with the tensor amax gets scale 448
    assert t.scales.float().max().item() == 448.0
    ref = torch.tensor([slow_quantize_block(r, "nvfp4", s_enc=s_enc.item()) for r in x.view(-1, 16).tolist()])
    assert torch.equal(t.dequantize().view(-1, 16), ref)


@pytest.mark.parametrize("fmt,mode", [("nvfp4", "rceil"), ("mxfp4", "rceil"), ("mxfp4", "floor")])
def test_blocks_against_slow_reference(fmt, mode):
    torch.manual_seed(2)
    bs = core.block_size(fmt)
    x = torch.randn(24, bs) * torch.logspace(-6, 6, 24).unsqueeze(1)
    x[0] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * (bs // 8))  # ties
    got = fp4attn.fake_quantize(x, fmt, scale_mode=mode)
    ref = torch.tensor([slow_quantize_block(r, fmt, mode) for r in x.tolist()])
    assert torch.equal(got, ref)


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
def test_any_dim_and_roundtrip(dim):
    torch.manual_seed(3)
    x = torch.randn(32, 64, 32)
    t = fp4attn.quantize(x, "nvfp4", dim=dim)
    moved = x.movedim(dim, -1)
    ref = fp4attn.quantize(moved.contiguous(), "nvfp4", dim=-1).dequantize().movedim(-1, dim)
    assert torch.equal(t.dequantize(), ref)
    assert t.data.shape[dim % 3] == x.shape[dim % 3] // 2
    assert t.scales.shape[dim % 3] == x.shape[dim % 3] // 16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fake_quantize_dtype_padding_and_ste(dtype):
    x = torch.randn(5, 40, dtype=dtype, requires_grad=True)  # 40 is not a block multiple: padded
    y = fp4attn.fake_quantize(x)
    assert y.dtype == dtype and y.shape == x.shape
    xp = torch.nn.functional.pad(x.detach().float(), (0, 8))
    ref = fp4attn.quantize(xp).dequantize()[:, :40].to(dtype)
    assert torch.equal(y.detach(), ref)
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_quantize_requires_block_multiple_and_validates():
    with pytest.raises(ValueError, match="multiple"):
        fp4attn.quantize(torch.randn(4, 40))
    with pytest.raises(ValueError, match="fmt"):
        fp4attn.quantize(torch.randn(4, 32), fmt="fp4")
    with pytest.raises(ValueError, match="scale_mode"):
        fp4attn.quantize(torch.randn(4, 32), fmt="mxfp4", scale_mode="ceil")
    with pytest.raises(ValueError, match="scale_mode"):
        fp4attn.quantize(torch.randn(4, 32), fmt="nvfp4", scale_mode="floor")
    with pytest.raises(ValueError, match="global_scale"):
        fp4attn.quantize(torch.randn(4, 32), fmt="mxfp4", global_scale=True)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        fp4attn.quantize(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="dim"):
        fp4attn.quantize(torch.randn(4, 32), dim=2)


# ---------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 4),
    nblk=st.integers(1, 3),
    exp=st.integers(-30, 30),
    fmt=st.sampled_from(["nvfp4", "mxfp4"]),
    seed=st.integers(0, 2**16),
    special=st.sampled_from(["none", "zero_block", "nan", "inf", "tie"]),
)
def test_property_matches_slow(rows, nblk, exp, fmt, seed, special):
    g = torch.Generator().manual_seed(seed)
    bs = core.block_size(fmt)
    x = torch.randn(rows, nblk * bs, generator=g) * (10.0 ** exp)
    if special == "zero_block":
        x[0, :bs] = 0
    elif special == "nan":
        x[-1, 0] = float("nan")
    elif special == "inf":
        x[0, -1] = float("-inf")
    elif special == "tie":
        x[0, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]) * (2.0 ** exp)
    got = fp4attn.fake_quantize(x, fmt)
    ref = torch.tensor([slow_quantize_block(b, fmt) for b in x.view(-1, bs).tolist()]).view_as(x)
    assert torch.equal(torch.nan_to_num(got, nan=7.0), torch.nan_to_num(ref, nan=7.0))
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    t = fp4attn.quantize(x, fmt)
    assert torch.equal(torch.nan_to_num(t.dequantize(), nan=7.0), torch.nan_to_num(got, nan=7.0))


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), dim=st.integers(-4, 3),
       fmt=st.sampled_from(["nvfp4", "mxfp4"]), gs=st.booleans())
def test_property_shapes_dims(shape, dim, fmt, gs):
    shape = list(shape) + [32]
    nd = len(shape)
    if not -nd <= dim < nd:
        return
    shape[dim] = 32 if shape[dim] < 32 else 32 * (shape[dim] // 32 + 1)
    gs = gs and fmt == "nvfp4"
    x = torch.randn(shape)
    t = fp4attn.quantize(x, fmt, dim=dim, global_scale=gs)
    y = fp4attn.fake_quantize(x, fmt, dim=dim, global_scale=gs)
    assert torch.equal(t.dequantize(), y)
    # error bound per block: at most half the largest E2M1 step (2, between 4 and 6) times the block's scale (and
    # the global decode scale); x / s <= 6 (MXFP4 rceil) or <= 6.375 (the E4M3 scale rounded down: clipped to 6, an
    # error of 0.375·s): the N(0, 1) blocks here have normal E4M3 scales
    err = (y - x).abs()
    bs = 16 if fmt == "nvfp4" else 32
    scale = t.scale_values().repeat_interleave(bs, dim=dim) * (t.global_scale if t.global_scale is not None else 1.0)
    assert scale.shape == x.shape
    assert torch.all(err <= scale * 1.0)


# ----------------------------------------------------------------------------------------------
# The Gluon decode kernel's E2M1 -> fp16 PTX (fp16 high bytes), run on the CPU by a small evaluator of the
# instructions it uses: every code in every nibble position, E4M3 scales from subnormal to 448.
# ----------------------------------------------------------------------------------------------
def _run_ptx(src: str, args: dict) -> dict:
    """Evaluate the straight-line PTX ``src`` (the subset the decode strings use: mov, shl, shr, and, lop3, prmt,
    mul.rn.f16x2) on int64 numpy arrays of 32-bit values (.b16 registers hold 16-bit values); ``args``: {"$4": ...}.
    Returns the registers."""
    import re

    import numpy as np

    r = dict(args)
    M = 0xFFFFFFFF

    def val(x):
        x = x.strip()
        if x in r:
            return r[x]
        return np.int64(int(x, 16) if x.lower().startswith("0x") else int(x))

    def f16x2_mul(a, b):
        h = lambda x: np.stack([(x & 0xFFFF), (x >> 16) & 0xFFFF]).astype(np.uint16).view(np.float16)  # noqa: E731
        p = (h(a).astype(np.float64) * h(b).astype(np.float64)).astype(np.float16)  # exact products round once
        u = p.view(np.uint16).astype(np.int64)
        return u[0] | (u[1] << 16)

    for line in (x.strip() for ln in src.split("\n") for x in ln.split(";")):
        if line in ("", "{", "}") or line.startswith(".reg"):
            continue
        op, _, rest = line.partition(" ")
        ops = [o.strip() for o in re.split(r",(?![^{]*})", rest)]
        d = ops[0]
        if op == "mov.b32" and d.startswith("{"):  # split a 32-bit register into two halves
            lo, hi = (x.strip() for x in d.strip("{}").split(","))
            v = val(ops[1])
            r[lo], r[hi] = v & 0xFFFF, (v >> 16) & 0xFFFF
        elif op == "mov.b32" and ops[1].startswith("{"):  # pack two halves
            lo, hi = (val(x) for x in ops[1].strip("{}").split(","))
            r[d] = (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)
        elif op == "mov.b32":
            r[d] = val(ops[1]) & M
        elif op == "shl.b32":
            r[d] = (val(ops[1]) << val(ops[2])) & M
        elif op == "shr.b32":
            r[d] = (val(ops[1]) & M) >> val(ops[2])
        elif op == "and.b32":
            r[d] = val(ops[1]) & val(ops[2])
        elif op == "lop3.b32":
            a, b, c, lut = (val(x) for x in ops[1:5])
            out = np.zeros_like(a + b + c)
            for bit in range(8):  # bit (a_i, b_i, c_i) of the table: index 4a + 2b + c
                if (int(lut) >> bit) & 1:
                    ta = a if bit & 4 else ~a
                    tb = b if bit & 2 else ~b
                    tc = c if bit & 1 else ~c
                    out = out | (ta & tb & tc)
            r[d] = out & M
        elif op == "prmt.b32":
            a, b, sel = val(ops[1]), val(ops[2]), int(val(ops[3]))
            src8 = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
            out = 0
            for i in range(4):
                s_ = (sel >> (4 * i)) & 0xF
                assert s_ < 8, "sign-replicate selectors are not used by these strings"
                out = out | (src8[s_] << (8 * i))
            r[d] = out & M
        elif op == "mul.rn.f16x2":
            r[d] = f16x2_mul(val(ops[1]), val(ops[2]))
        else:
            raise AssertionError(f"unexpected PTX instruction {op!r}")
    return r


def _e2m1_value(c):
    """The reference decode (``formats.core.e2m1_decode``) of int64 numpy codes, as float64."""
    return core.e2m1_decode(torch.from_numpy(c).to(torch.uint8)).double().numpy()


def _e4m3_scales():
    import numpy as np

    b = np.arange(0, 0x7F, dtype=np.uint8)  # every finite non-negative E4M3 byte (0x7F is NaN)
    return torch.from_numpy(b).view(torch.float8_e4m3fn).float().numpy()


def _f16_bits(x):
    import numpy as np

    return np.asarray(x, dtype=np.float16).view(np.uint16).astype(np.int64)


def test_e2m1_halfwords_f16hi_ptx_exact():
    """E2M1_HALFWORDS_F16HI_PTX: output k = codes (k%2, k%2 + 2) of half-word k//2, times the scale pair, times
    2^-14, exact, for every 32-bit pattern of nibbles (16-bit halves from all 65536 values) and every E4M3 scale."""
    import numpy as np

    from fp4attn.formats.triton_helpers import _e2m1_halfwords_f16hi_ptx

    lo = np.arange(65536, dtype=np.int64)
    w = lo | ((lo * 40503 + 12345) % 65536) << 16  # every half-word in both halves
    code = lambda j: (w >> (4 * j)) & 0xF  # noqa: E731
    val = _e2m1_value
    for s in _e4m3_scales()[::3]:
        sp = _f16_bits(s) | (_f16_bits(s) << 16)
        r = _run_ptx(_e2m1_halfwords_f16hi_ptx(), {"$4": w, "$5": np.full_like(w, sp)})
        for k in range(4):
            h = k // 2
            lo_c, hi_c = code(4 * h + k % 2), code(4 * h + k % 2 + 2)
            exp_lo = val(lo_c) * float(s) * 2.0 ** -14  # exact in fp16 (module comment): the bits below must agree
            exp_hi = val(hi_c) * float(s) * 2.0 ** -14
            assert np.all(np.asarray(exp_lo, np.float16).astype(np.float64) == exp_lo)
            got = r[f"${k}"]
            assert np.array_equal(got & 0xFFFF, _f16_bits(exp_lo)), (k, s)
            assert np.array_equal((got >> 16) & 0xFFFF, _f16_bits(exp_hi)), (k, s)


def test_e2m1_byte_pairs_f16hi_ptx_exact():
    """E2M1_BYTE_PAIRS_F16HI_PTX: output i = (low code, high code) of byte i times scale s_i times 2^-14, exact,
    for every byte value in every position and every E4M3 scale."""
    import numpy as np

    from fp4attn.formats.triton_helpers import _e2m1_byte_pairs_f16hi_ptx

    b = np.arange(65536, dtype=np.int64)
    w = b | ((b * 40503 + 12345) % 65536) << 16
    val = _e2m1_value
    sc = _e4m3_scales()
    for j in range(0, len(sc), 4):
        s = [sc[(j + i) % len(sc)] for i in range(4)]
        s01 = _f16_bits(s[0]) | (_f16_bits(s[1]) << 16)
        s23 = _f16_bits(s[2]) | (_f16_bits(s[3]) << 16)
        r = _run_ptx(_e2m1_byte_pairs_f16hi_ptx(), {"$4": w, "$5": np.full_like(w, s01), "$6": np.full_like(w, s23)})
        for i in range(4):
            byte = (w >> (8 * i)) & 0xFF
            exp_lo = val(byte & 0xF) * float(s[i]) * 2.0 ** -14
            exp_hi = val(byte >> 4) * float(s[i]) * 2.0 ** -14
            got = r[f"${i}"]
            assert np.array_equal(got & 0xFFFF, _f16_bits(exp_lo)), (i, s[i])
            assert np.array_equal((got >> 16) & 0xFFFF, _f16_bits(exp_hi)), (i, s[i])
