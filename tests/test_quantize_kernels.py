"""Triton quantize / fake_quantize / dequantize kernels vs the PyTorch reference, bit for bit.

CPU tests run the kernels in the Triton interpreter (TRITON_INTERPRET=1, set below before triton is
imported when there is no GPU; if another module imported the kernels first without it, the CPU tests
skip; on a GPU machine set TRITON_INTERPRET=1 yourself to run them). GPU tests
(``-m gpu``) run the compiled kernels at larger sizes. Inputs are random plus adversarial blocks:
E2M1 ties scaled by exact E4M3 / power-of-two block scales, powers of two, zeros and -0, NaN/Inf,
magnitudes 1e-30..1e30, float32 subnormals, values near the float32 max.
"""

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():  # CPU machine: run the kernels in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fp4attn.formats import core  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from fp4attn.formats.triton_helpers import (  # noqa: E402
    div_rn_by,
    e2m1_code,
    e2m1_code_div,
    e2m1_code_i32,
    e2m1_recip,
    e2m1_round_abs,
    e2m1_round_abs_f16,
    e2m1_round_pow2,
    e4m3_round,
    exp2i,
    fake_quant_p,
    fake_quant_p_f16,
    fake_quant_p_words,
    mx_exponent,
    mx_scale_rceil,
    nvfp4_scale,
)
from fp4attn.kernels import quantize as kq  # noqa: E402
from p16_model import fake_quant_p_f16_model  # noqa: E402

_INTERPRETED = type(kq._rows_kernel).__name__ == "InterpretedFunction"
# numpy inside the interpreter warns about x / 0 in blocks whose scale is 0; those lanes are masked
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
cpu_only = pytest.mark.skipif(
    not _INTERPRETED,
    reason="kernels were imported without TRITON_INTERPRET=1 (run this module alone for the CPU tests)")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or _INTERPRETED,
                                reason="needs CUDA and compiled (non-interpreted) Triton kernels")

CONFIGS = [  # (fmt, kwargs)
    ("nvfp4", {}),
    ("nvfp4", {"global_scale": True}),
    ("mxfp4", {}),
    ("mxfp4", {"scale_mode": "floor"}),
]
CFG_IDS = ["nvfp4", "nvfp4-global", "mxfp4-rceil", "mxfp4-floor"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 7.0]
E4M3_POS = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # all > 0


# ------------------------------------------------------------------------------------------ inputs
def adversarial(shape, dim, dtype, seed, device="cpu"):
    """float32 data built in segments of 16 along ``dim`` (one pattern per segment), cast to dtype."""
    g = torch.Generator().manual_seed(seed)
    d = dim % len(shape)
    moved = list(shape)
    L = moved.pop(d)
    moved.append(L)
    rows = 1
    for n in moved[:-1]:
        rows *= n
    S = rows * (-(-L // 16))  # segments
    rn = lambda: torch.randn(S, 16, generator=g)
    ri = lambda lo, hi, shp: torch.randint(lo, hi, shp, generator=g)
    sgn = torch.where(torch.rand(S, 16, generator=g) < 0.5, -1.0, 1.0)
    pos = ri(0, 16, (S, 1))
    ties = torch.tensor(TIES)[ri(0, len(TIES) - 1, (S, 16))]
    pats = []
    # 0: random magnitudes 1e-30..1e30
    pats.append(rn() * 10.0 ** (torch.rand(S, 1, generator=g) * 60 - 30))
    # 1: E2M1 ties on an exact E4M3 block scale s (one element is 6 s, so the scale is exactly s)
    s = E4M3_POS[ri(0, 126, (S, 1))]
    pats.append((ties * s * sgn).scatter(1, pos, 6 * s * sgn[:, :1]))
    # 2: powers of two, float32 subnormals included
    pats.append(torch.exp2(ri(-148, 127, (S, 16)).float()) * sgn)
    # 3: zeros, some -0
    pats.append(torch.zeros(S, 16) * sgn)
    # 4: one NaN / +Inf / -Inf in a random block
    special = torch.tensor([float("nan"), float("inf"), -float("inf")])[ri(0, 3, (S, 1))]
    pats.append(rn().scatter(1, pos, special))
    # 5: float32 subnormals
    pats.append(rn() * 1e-40)
    # 6: E2M1 ties on a power-of-two block scale 2**e (amax = 6 * 2**e)
    p2 = torch.exp2(ri(-126, 120, (S, 1)).float())
    pats.append((ties * p2 * sgn).scatter(1, pos, 6 * p2))
    # 7: near the float32 max
    pats.append(rn() * 1e38)
    # 8: one huge element, the rest tiny (codes underflow to +-0)
    pats.append((rn() * 1e-30).scatter(1, pos, torch.full((S, 1), 1e30)))
    # 9: N(0, 1)
    pats.append(rn())
    kind = ri(0, len(pats), (1, S, 1)).expand(1, S, 16)
    x = torch.stack(pats).gather(0, kind)[0]
    x = x.reshape(rows, -1)[:, :L].reshape(moved).movedim(-1, d).contiguous()
    return x.to(dtype).to(device)


def threshold_sweep(device="cpu"):
    """Blocks whose NVFP4 scale is exactly each positive E4M3 value s (amax = 6 s) and whose other
    elements sit on and within 7 ulps of every E2M1 decision point t*s, both signs: this pins down
    the kernels' quotient from a per-block reciprocal against the reference's IEEE division."""
    vals = []
    for s in E4M3_POS.tolist():
        for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
            b = torch.tensor(t * s, dtype=torch.float32).view(torch.int32)
            vals.append((b + torch.arange(-7, 8, dtype=torch.int32)).view(torch.float32))
    v = torch.cat(vals)
    v = torch.cat([v, -v])
    n = v.numel()
    per = 15
    nb = -(-n // per)
    v = torch.cat([v, torch.zeros(nb * per - n)]).reshape(nb, per)
    # a per-row scale: amax element 6*s with the s the row's points were built for
    s_of = torch.repeat_interleave(E4M3_POS, 7 * 15)
    s_of = torch.cat([s_of, s_of, torch.zeros(nb * per - n)]).reshape(nb, per).abs().amax(dim=1)
    x = torch.cat([v, (6 * s_of)[:, None]], dim=1)  # (nb, 16): the rows mix only one s each
    return x.to(device)


def threshold_sweep_global(gamax, device="cpu"):
    """As ``threshold_sweep`` for NVFP4 with a global scale: the tensor's amax is ``gamax`` (so S_enc =
    2688 / gamax), each row's block divisor d = s / S_enc is that of one positive E4M3 s (amax = 6 d), and the
    other elements sit on and within 7 ulps of every decision point t·d, both signs. With gamax = 2^k the
    divisors span [2^(k-20.4), 2^(k-2.6)]: k = 100 or -90 puts some rows' divisors outside [2^-96, 2^96],
    where the kernels fall back to ``div_rn`` for the whole tile."""
    senc = core.global_encode_scale(torch.tensor([gamax], dtype=torch.float32))
    rows = []
    for s in E4M3_POS:
        d = (s / senc).float()  # the reference's divisor s / S_enc
        b = (torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]) * d).view(torch.int32)
        v = (b[:, None] + torch.arange(-7, 8, dtype=torch.int32)).flatten().view(torch.float32)
        v = torch.cat([v, -v, torch.zeros(-2 * v.numel() % 15)]).reshape(-1, 15)
        rows.append(torch.cat([v, (6 * d).expand(v.shape[0], 1)], dim=1))
    x = torch.cat(rows)
    x[0, 0] = gamax  # (row 0's block then has amax gamax: its codes are checked all the same)
    return x.to(device)


# ------------------------------------------------------------------------------------ comparisons
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def assert_same_values(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
    gn, wn = torch.isnan(got), torch.isnan(want)
    assert torch.equal(gn, wn), f"NaN positions differ ({(gn != wn).sum().item()} elements)"
    bits = _BITS[got.dtype]
    gb = got.masked_fill(gn, 0).view(bits)
    wb = want.masked_fill(wn, 0).view(bits)
    bad = gb != wb
    assert not bad.any(), (f"{bad.sum().item()} of {bad.numel()} values differ, e.g. "
                           f"got {got[bad][:4].tolist()} want {want[bad][:4].tolist()}")


def assert_same_fp4(got: core.FP4Tensor, want: core.FP4Tensor):
    assert (got.fmt, got.dim, got.shape, got.dtype) == (want.fmt, want.dim, want.shape, want.dtype)
    assert got.data.dtype == torch.uint8 and got.data.shape == want.data.shape
    assert got.scales.dtype == want.scales.dtype and got.scales.shape == want.scales.shape
    bad = got.data != want.data
    assert not bad.any(), f"{bad.sum().item()} of {bad.numel()} packed bytes differ"
    gs, ws = got.scales.view(torch.uint8), want.scales.view(torch.uint8)
    bad = gs != ws
    assert not bad.any(), (f"{bad.sum().item()} of {bad.numel()} scale bytes differ: "
                           f"got {gs[bad][:4].tolist()} want {ws[bad][:4].tolist()}")
    if want.global_scale is None:
        assert got.global_scale is None
    else:
        assert got.global_scale.dtype == torch.float32 and got.global_scale.shape == ()
        assert torch.equal(got.global_scale.view(torch.int32), want.global_scale.view(torch.int32))


def check_all(x, fmt, dim, kw, *, fast=True, dequant=True):
    d = dim % x.dim()
    old = kq._FAST
    kq._FAST = fast
    try:
        if x.shape[d] % core.block_size(fmt) == 0:
            want = core.quantize_reference(x, fmt, d, **kw)
            got = kq.quantize(x, fmt, d, **kw)
            assert_same_fp4(got, want)
            if dequant:
                for dt in (torch.float32, x.dtype):
                    assert_same_values(kq.dequantize(got, dt), want.dequantize(dt))
        want_f = core.fake_quantize_values(x, fmt, d, **kw).to(x.dtype)
        assert_same_values(kq.fake_quantize(x, fmt, d, **kw), want_f)
    finally:
        kq._FAST = old


# ------------------------------------------------------------------------------- CPU (interpreter)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
CPU_CASES = [  # (shape, dim, dtype): every load mode of the rows kernel, both cols kernels' dtypes
    ((3, 64), -1, F32), ((3, 64), -1, BF16), ((3, 64), -1, F16), ((5, 3, 32), -1, BF16),
    ((2, 64, 3), -2, F32), ((2, 64, 3), -2, BF16), ((2, 64, 3), -2, F16), ((64, 5), 0, BF16),
    ((3, 32, 2, 5), 1, F16),
    # quantized dim followed by singleton dims only: the rows kernel, whose word view of x failed on a
    # last dim of size 1 (found by the fourteenth session's GPU fuzz)
    ((64, 1), 0, F16), ((2, 64, 1, 1), 1, F32), ((64, 1), 0, BF16),
]


@cpu_only
@pytest.mark.parametrize("fmt,kw", CONFIGS, ids=CFG_IDS)
@pytest.mark.parametrize("shape,dim,dtype", CPU_CASES,
                         ids=[f"{s}@{d}-{str(t)[6:]}" for s, d, t in CPU_CASES])
def test_cpu_bit_exact(fmt, kw, dtype, shape, dim):
    x = adversarial(shape, dim, dtype, seed=zlib.crc32(f"{fmt}{kw}{dtype}{shape}".encode()))
    check_all(x, fmt, dim, kw)


@cpu_only
@pytest.mark.parametrize("fmt,kw", CONFIGS, ids=CFG_IDS)
def test_cpu_helper_path_bit_exact(fmt, kw):
    """The div_rn + shared e2m1_code path (FAST=False) gives the same bits."""
    x = adversarial((4, 64), -1, torch.float32, seed=7)
    check_all(x, fmt, -1, kw, fast=False, dequant=False)
    x = adversarial((2, 64, 3), -2, torch.bfloat16, seed=8)
    check_all(x, fmt, -2, kw, fast=False, dequant=False)


@cpu_only
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "div_rn"])
def test_cpu_threshold_sweep_every_e4m3_scale(fast):
    x = threshold_sweep()
    check_all(x, "nvfp4", -1, {}, fast=fast, dequant=False)


@cpu_only
@pytest.mark.parametrize("fmt,kw", CONFIGS, ids=CFG_IDS)
@pytest.mark.parametrize("shape,dim", [((3, 37), -1), ((2, 21, 3), 1), ((5,), 0), ((45, 2), 0)])
def test_cpu_fake_quantize_pads(fmt, kw, shape, dim):
    x = adversarial(shape, dim, torch.bfloat16, seed=11)
    check_all(x, fmt, dim, kw)


@cpu_only
@pytest.mark.parametrize("fmt,kw", CONFIGS, ids=CFG_IDS)
def test_cpu_cols_3d_tile_variant(fmt, kw, monkeypatch):
    """The (blocks, Q, pairs) tile kernel for dim != last (the default is the looped 2-D one)."""
    monkeypatch.setattr(kq, "_COLS_CFG", dict(kq._COLS_CFG, loop=False, BQ=64))
    x = adversarial((2, 64, 5), -2, torch.bfloat16, seed=31)
    check_all(x, fmt, -2, kw)
    check_all(x, fmt, -2, kw, fast=False, dequant=False)
    x = adversarial((3, 40, 2), 1, torch.float32, seed=32)  # padded fake_quantize
    check_all(x, fmt, 1, kw)


@cpu_only
def test_cpu_special_blocks():
    nan, inf = float("nan"), float("inf")
    rows = [
        [0.0] * 16,
        [-0.0] * 16,
        [nan] + [1.0] * 15,
        [nan] + [0.0] * 15,  # NaN with zero finite amax: NVFP4 codes zeroed, scale NaN
        [inf, -inf] + [3.0] * 14,
        [-inf] + [-0.0] * 15,
        [1e-45] * 16,  # smallest subnormal: NVFP4 scale rounds to 0
        [3e38, -3e38] + [1.0] * 14,  # E4M3 scale saturates at 448
        [6 * 2.0 ** -9] + [2.0 ** -11] * 15,  # smallest E4M3 subnormal scale, tie at 0.25
        [6 * 2.0 ** -126] + [2.0 ** -128, 3 * 2.0 ** -130] * 7 + [0.0],  # MX e = -126/-127
    ]
    x = torch.tensor(rows, dtype=torch.float32).reshape(5, 32)
    for fmt, kw in CONFIGS:
        check_all(x, fmt, -1, kw)
        check_all(x.t().contiguous(), fmt, 0, kw)


@cpu_only
def test_cpu_global_scale_edge_cases():
    # all zero (S_enc = 1), all non-finite, subnormal amax (S_enc clamped to the float32 max)
    for x in (torch.zeros(2, 32), torch.full((2, 32), float("nan")), torch.full((1, 16), 1e-45),
              torch.tensor([[float("inf")] + [2.0] * 15])):
        check_all(x, "nvfp4", -1, {"global_scale": True})


@cpu_only
def test_cpu_threshold_sweep_with_global_scale():
    check_all(threshold_sweep_global(2.0 ** 100), "nvfp4", -1, {"global_scale": True}, dequant=False)
    check_all(threshold_sweep_global(3.0), "nvfp4", -1, {"global_scale": True}, dequant=False)


@cpu_only
def test_cpu_non_contiguous_and_float64_inputs():
    x = adversarial((64, 6), 0, torch.float32, seed=3)
    check_all(x.t(), "nvfp4", -1, {})  # non-contiguous view
    check_all(x[:, ::2], "mxfp4", 0, {})
    check_all(x.double(), "nvfp4", 0, {"global_scale": True})


@cpu_only
def test_cpu_empty_and_errors():
    x = torch.empty(0, 32)
    for fmt, kw in CONFIGS:
        check_all(x, fmt, -1, kw)
    with pytest.raises(ValueError, match="multiple of the nvfp4 block size 16"):
        kq.quantize(torch.zeros(2, 24), "nvfp4", 1)


def test_device_guard_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="CUDA"):
        kq.quantize(torch.zeros(2, 32), "nvfp4", 1)


# ------------------------------------------------------------------------------------------- GPU
GPU_LAYOUTS = [((257, 1024), -1), ((2, 4, 300, 64), -2), ((3, 5, 7, 96), -1), ((4, 64, 3, 33), 1)]


@gpu
@needs_cuda
@pytest.mark.parametrize("fmt,kw", CONFIGS, ids=CFG_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape,dim", GPU_LAYOUTS, ids=[f"{s}@{d}" for s, d in GPU_LAYOUTS])
def test_gpu_bit_exact_adversarial(fmt, kw, dtype, shape, dim):
    x = adversarial(shape, dim, dtype, seed=sum(shape), device="cuda")
    check_all(x, fmt, dim, kw)
    if dtype == torch.bfloat16 and shape[0] == 257:  # the div_rn + e2m1_code path, compiled
        check_all(x, fmt, dim, kw, fast=False, dequant=False)


@gpu
@needs_cuda
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "div_rn"])
def test_gpu_threshold_sweep_every_e4m3_scale(fast):
    check_all(threshold_sweep("cuda"), "nvfp4", -1, {}, fast=fast, dequant=False)


@gpu
@needs_cuda
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "div_rn"])
def test_gpu_threshold_sweep_with_global_scale(fast):
    """Divisors s / S_enc over [2^-110, 2^98] (both sides of the fast path's [2^-96, 2^96]), every E4M3 s,
    values around every decision point: codes equal the reference's, through the rows and the cols kernel."""
    for k in (-90, -60, -17, 0, 1.58, 23, 60, 100):
        x = threshold_sweep_global(2.0 ** k, "cuda")
        check_all(x, "nvfp4", -1, {"global_scale": True}, fast=fast, dequant=False)
        check_all(x.t().contiguous(), "nvfp4", 0, {"global_scale": True}, fast=fast, dequant=False)


@gpu
@needs_cuda
@pytest.mark.parametrize("fmt,kw", CONFIGS, ids=CFG_IDS)
def test_gpu_matches_cpu_reference_and_public_ops(fmt, kw):
    """Kernel on CUDA == reference on CPU (not only the reference on CUDA), through fp4attn.*."""
    import fp4attn

    x = adversarial((16, 256), -1, torch.bfloat16, seed=21)
    want = core.quantize_reference(x, fmt, -1, **kw)
    got = fp4attn.quantize(x.cuda(), fmt, -1, **kw)
    assert got.data.is_cuda
    assert_same_fp4(core.FP4Tensor(got.data.cpu(), got.scales.cpu(),
                                   None if got.global_scale is None else got.global_scale.cpu(),
                                   got.fmt, got.dim, got.shape, got.dtype), want)
    xf = adversarial((3, 250, 7), 1, torch.float16, seed=22)
    want_f = core.fake_quantize_values(xf, fmt, 1, **kw).to(xf.dtype)
    got_f = fp4attn.fake_quantize(xf.cuda(), fmt, 1, **kw)
    assert_same_values(got_f.cpu(), want_f)


@gpu
@needs_cuda
def test_gpu_large_random_all_configs():
    x = (torch.randn(1024, 4096, device="cuda") * 3).to(torch.bfloat16)
    for fmt, kw in CONFIGS:
        for dim in (-1, 0):
            check_all(x, fmt, dim, kw)


@triton.jit
def _rounding_kernel(X, Y, N, E4M3: tl.constexpr, BLOCK: tl.constexpr):
    """Y = e4m3_round(X) (E4M3) or e2m1_round_abs(X): the shared rounding helpers, elementwise."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    if E4M3:
        y = e4m3_round(x)
    else:
        y = e2m1_round_abs(x)
    tl.store(Y + o, y, mask=o < N)


@cpu_only
def test_cpu_e2m1_round_abs_every_neighbourhood_of_the_grid():
    """The shared E2M1 rounding helper (one magic-constant rounding whose constant follows the binade)
    against the PyTorch format on every float within 4 ulps of each grid value and decision point
    (ties included), every 251st float32 of [0, 8], random values over [0, 10], tiny, huge and
    infinite inputs."""
    pts = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0])
    bits = pts.view(torch.int32)
    near = (bits[:, None] + torch.arange(-4, 5, dtype=torch.int32)[None, :]).flatten()
    near = near[near >= 0].view(torch.float32)
    rnd = torch.rand(100_000, generator=torch.Generator().manual_seed(3)) * 10
    dense = torch.arange(0, 0x41000001, 251, dtype=torch.int32).view(torch.float32)
    x = torch.cat([near, dense, rnd, torch.tensor([1e-30, 1e-7, 3e38, 1e30, float("inf")])]).contiguous()
    y = torch.empty_like(x)
    _rounding_kernel[(triton.cdiv(x.numel(), 1 << 16),)](x, y, x.numel(), E4M3=False, BLOCK=1 << 16)
    want = core.e2m1_round(x)
    assert torch.equal(y, want), (x[y != want][:8], y[y != want][:8], want[y != want][:8])


@triton.jit
def _e2m1_codes_kernel(X, C1, C2, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    tl.store(C1 + o, e2m1_code_i32(x).to(tl.uint8), mask=o < N)
    tl.store(C2 + o, e2m1_code(x), mask=o < N)


@cpu_only
def test_cpu_e2m1_code_helpers_equal_the_reference_encoder():
    """The Triton code helpers (``e2m1_code_i32``: three magic-constant roundings and a minimum;
    ``e2m1_code``: the same with NaN masked) against ``core.e2m1_encode`` (the spec's threshold
    encoder) on every float within 4 ulps of each grid value and decision point, both signs (ties,
    -0.0 included), random values, tiny, huge, infinite and NaN inputs. (``tools/exactness_checks.py
    code`` compares the formula with the former decision-point helper on every float32.)"""
    pts = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0])
    bits = pts.view(torch.int32)
    near = (bits[:, None] + torch.arange(-4, 5, dtype=torch.int32)[None, :]).flatten()
    near = near[near >= 0].view(torch.float32)
    rnd = (torch.rand(50_000, generator=torch.Generator().manual_seed(4)) - 0.5) * 20
    x = torch.cat([near, -near, rnd, torch.tensor([1e-30, -1e-7, 3e38, -1e30, float("inf"), float("-inf"),
                                                   float("nan")])])
    x = x.contiguous()
    c1, c2 = (torch.empty(x.numel(), dtype=torch.uint8) for _ in range(2))
    _e2m1_codes_kernel[(triton.cdiv(x.numel(), 1024),)](x, c1, c2, x.numel(), BLOCK=1024)
    want = core.e2m1_encode(x)
    fin = ~x.isnan()
    assert torch.equal(c1[fin], want[fin]), (x[fin][c1[fin] != want[fin]][:8], c1[fin][c1[fin] != want[fin]][:8])
    assert torch.equal(c2, want), (x[c2 != want][:8], c2[c2 != want][:8], want[c2 != want][:8])


@triton.jit
def _e2m1_round_pow2_kernel(X, Y, Z, N, E, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    tl.store(Y + o, e2m1_round_pow2(x, exp2i(E)), mask=o < N)
    tl.store(Z + o, e2m1_round_abs(x * exp2i(-E)) * exp2i(E), mask=o < N)


@cpu_only
@pytest.mark.parametrize("e", [-127, -126, -125, -9, -1, 0, 3])
def test_cpu_e2m1_round_pow2_is_the_scaled_rounding(e):
    """MXFP4's fake_quant_p rounds on the grid scaled by s = 2^e; same bits as scaling by 2^-e, rounding
    and scaling back: every float within 4 ulps of each scaled grid value and decision point, every
    509th float32 of [0, 16s], subnormals, huge and infinite values (tools/exactness_checks.py mx
    sweeps every float32 of [0, 16s])."""
    pts = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0],
                       dtype=torch.float64) * 2.0 ** e
    bits = pts.float().view(torch.int32)
    near = (bits[:, None] + torch.arange(-4, 5, dtype=torch.int32)[None, :]).flatten()
    near = near[near >= 0]
    top = int(torch.tensor(16.0 * 2.0 ** e, dtype=torch.float32).view(torch.int32))
    dense = torch.arange(0, top + 1, 509, dtype=torch.int32)
    sub = torch.arange(0, 1 << 23, 4099, dtype=torch.int32)
    x = torch.cat([near, dense, sub]).view(torch.float32)
    x = torch.cat([x, torch.tensor([3e38, 1e30, float("inf")])]).contiguous()
    y, z = torch.empty_like(x), torch.empty_like(x)
    _e2m1_round_pow2_kernel[(triton.cdiv(x.numel(), 1 << 16),)](x, y, z, x.numel(), e, BLOCK=1 << 16)
    assert torch.equal(y.view(torch.int32), z.view(torch.int32)), (x[y != z][:8], y[y != z][:8], z[y != z][:8])


@cpu_only
def test_cpu_e4m3_round_helper_against_the_format():
    """The shared E4M3 rounding helper (one magic constant per binade) against the PyTorch format:
    every float within 4 ulps of each E4M3 value and midpoint, every 1021st float32 of [0, 2^10],
    subnormal, huge and infinite inputs (tools/exactness_checks.py e4m3 sweeps every float32)."""
    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    pts = torch.cat([grid, (grid[1:] + grid[:-1]) / 2, torch.tensor([464.0, 480.0, 512.0])]).float()
    near = (pts.view(torch.int32)[:, None] + torch.arange(-4, 5, dtype=torch.int32)[None, :]).flatten()
    near = near[near >= 0]
    dense = torch.arange(0, 0x44800001, 1021, dtype=torch.int32)
    x = torch.cat([near, dense]).view(torch.float32)
    x = torch.cat([x, torch.tensor([1e-40, 1e-30, 3e38, 1e30, float("inf")])]).contiguous()
    y = torch.empty_like(x)
    _rounding_kernel[(triton.cdiv(x.numel(), 1 << 16),)](x, y, x.numel(), E4M3=True, BLOCK=1 << 16)
    want = core.e4m3_round(x).float()
    assert torch.equal(y, want), (x[y != want][:8], y[y != want][:8], want[y != want][:8])


def _device_or_skip(device):
    if device == "cpu" and not _INTERPRETED:
        pytest.skip("kernels were imported without TRITON_INTERPRET=1")
    if device == "cuda" and (not torch.cuda.is_available() or _INTERPRETED):
        pytest.skip("needs CUDA and compiled (non-interpreted) Triton kernels")


@triton.jit
def _fake_quant_p_f16_kernel(P, Y, Z, R: tl.constexpr, C: tl.constexpr):
    o = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    p = tl.load(P + o)
    tl.store(Y + o, fake_quant_p(p, 16, False, True))
    tl.store(Z + o, fake_quant_p(p, 16, False).to(tl.float16))


def _p_tiles(seed):
    """(256, 64) P̃-like tiles: per 16-key block an amax from 0 and 2^-14 (E4M3 scales of 0 and in the
    subnormal range) up to 2688 (two-level P̃/s1), values uniform below it, some at amax/6 times each E2M1
    decision point (ties of the code rounding)."""
    g = torch.Generator().manual_seed(seed)
    amax = torch.exp2(torch.rand(256, 4, 1, generator=g) * 25.4 - 14.0)
    amax[::17] = 0.0
    p = torch.rand(256, 4, 16, generator=g) * amax
    ties = torch.tensor(TIES)[torch.randint(0, len(TIES), (256, 4, 4), generator=g)]
    p[:, :, :4] = torch.minimum(ties * amax / 6.0, amax)
    p[:, :, 15] = amax[:, :, 0]
    return p.reshape(256, 64).contiguous()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_fake_quant_p_f16_output_is_the_float32_rounding(device):
    """``fake_quant_p(..., F16=True)`` (E2M1 values to fp16, then one fp16 multiply by the scale: what the
    attention passes feed their fp16 P·V MMA) gives the bits of the float32 path converted to fp16: the
    product is exact in fp16 for every scale (0, subnormal E4M3 up to 448)."""
    _device_or_skip(device)
    for seed in range(3):
        p = _p_tiles(seed).to(device)
        y, z = (torch.empty(p.shape, dtype=torch.float16, device=device) for _ in range(2))
        _fake_quant_p_f16_kernel[(1,)](p, y, z, R=256, C=64)
        assert torch.equal(y.view(torch.int16), z.view(torch.int16)), (p[y != z][:8], y[y != z][:8], z[y != z][:8])
        assert (z != 0).float().mean() > 0.5  # the tiles are not mostly zeros


@triton.jit
def _round_f16_kernel(X, Y, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + o, e2m1_round_abs_f16(tl.load(X + o, mask=o < N, other=0.0)), mask=o < N)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_e2m1_round_abs_f16_every_float16(device):
    """The float16 E2M1 rounding (two values per instruction in the Gluon attention pass) is the reference's
    rounding of every float16 in [0, +inf]: ties to the even code, saturation at 6, subnormals to 0."""
    _device_or_skip(device)
    x = torch.arange(0, 0x7C01, dtype=torch.int16).view(torch.float16).to(device)
    y = torch.empty_like(x)
    _round_f16_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, x.numel(), BLOCK=4096)
    want = core.e2m1_round(x.float()).half()
    assert torch.equal(y.view(torch.int16), want.view(torch.int16)), (x[y != want][:8], y[y != want][:8])


@triton.jit
def _fake_quant_p16_kernel(P, Y, R: tl.constexpr, C: tl.constexpr):
    o = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(Y + o, fake_quant_p_f16(tl.load(P + o), 16))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_fake_quant_p_f16_is_its_model(device):
    """``fake_quant_p_f16`` bit for bit against its PyTorch model on P̃-like tiles: block maxima from 0 and 2^-14
    up to 1 (single-level P̃) and up to 2688 (sage3's two-level P̃/s1), values at the E2M1 decision points. On the
    GPU the reciprocal is rcp.approx (within 1 ulp) where the model divides exactly: the two agree once rounded
    to float16 because no E4M3 reciprocal lies within a float32 ulp of a float16 rounding boundary (checked here
    for every scale). Also: the model is not the float32 rounding on these tiles."""
    _device_or_skip(device)
    s = core.e4m3_round(torch.arange(0, 2 ** 16, dtype=torch.float32) * 2.0 ** -9).float().unique()
    s = s[(s > 0) & (s <= 448)]
    r = 1.0 / s
    for ulps in (-1, 1):
        near = (r.view(torch.int32) + ulps).view(torch.float32)
        assert torch.equal(near.half(), r.half())
    for seed, pmax in ((0, 1.0), (1, 1.0), (2, 2688.0)):
        p = _p_tiles(seed).clamp_max(pmax).to(device)
        y = torch.empty(p.shape, dtype=torch.float16, device=device)
        _fake_quant_p16_kernel[(1,)](p, y, R=256, C=64)
        want = fake_quant_p_f16_model(p.cpu()).to(device)
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), (p[y != want][:8], y[y != want][:8])
        f32 = core.fake_quantize_values(p.cpu(), "nvfp4", dim=-1).half().to(device)
        assert (f32 != want).any()  # the float16 steps change some codes on these tiles
        assert (want != 0).float().mean() > 0.3


@triton.jit
def _fake_quant_p_words_kernel(P, Y, R: tl.constexpr, C: tl.constexpr):
    o = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    tl.store(Y + o, fake_quant_p_words(tl.load(P + o)))


@gpu
@needs_cuda
def test_fake_quant_p_words_is_fake_quant_p_f16():
    """``fake_quant_p_words`` (f16x2 words, the Gluon attention pass's P̃ rounding in the key order of
    ``_tiles.key_position``) bit for bit against ``fake_quant_p_f16`` on the same blocks in key order, on the P̃-like
    tiles (single-level P̃ <= 1 and two-level P̃/s1 <= 2688; E2M1 ties, zero blocks, subnormal E4M3 scales), and
    against the PyTorch model. GPU only: the words are PTX."""
    k = torch.arange(64)
    pos = 8 * ((k % 16) // 2) + 2 * (k // 16) + k % 2  # key 16q + 2j + e at column 8j + 2q + e
    for seed, pmax in ((0, 1.0), (1, 1.0), (2, 2688.0)):
        p = _p_tiles(seed).clamp_max(pmax).cuda()
        p_kp = torch.empty_like(p)
        p_kp[:, pos] = p
        y, want = (torch.empty(p.shape, dtype=torch.float16, device="cuda") for _ in range(2))
        _fake_quant_p_words_kernel[(1,)](p_kp, y, R=256, C=64)
        _fake_quant_p16_kernel[(1,)](p, want, R=256, C=64)
        y = y[:, pos]
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), (p[y != want][:8], y[y != want][:8])
        assert torch.equal(want.cpu(), fake_quant_p_f16_model(p.cpu()))
        assert (want != 0).float().mean() > 0.3


@triton.jit
def _mx_scale_kernel(X, Y, Z, N, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    tl.store(Y + o, mx_scale_rceil(x), mask=o < N)
    tl.store(Z + o, exp2i(mx_exponent(x, False)), mask=o < N)


@cpu_only
def test_cpu_mx_scale_rceil_is_exp2_of_the_rceil_exponent():
    """The 4-instruction MXFP4 scale of fake_quant_p against exp2i(mx_exponent(amax)): every 4093rd
    float32 in [0, 1.5 * 2^127), every float within 4 ulps of each 1.5 * 2^k (the rceil boundary) and
    of each power of two (tools/exactness_checks.py mxscale sweeps every float32)."""
    k = torch.arange(-149, 128, dtype=torch.float64)
    pts = torch.cat([2.0 ** k, 1.5 * 2.0 ** k[k < 127]]).float().view(torch.int32)
    near = (pts[:, None] + torch.arange(-4, 5, dtype=torch.int32)[None, :]).flatten()
    near = near[(near >= 0) & (near < 0x7F400000)]
    x = torch.cat([near, torch.arange(0, 0x7F400000, 4093, dtype=torch.int32)]).view(torch.float32).contiguous()
    y, z = torch.empty_like(x), torch.empty_like(x)
    _mx_scale_kernel[(triton.cdiv(x.numel(), 1 << 16),)](x, y, z, x.numel(), BLOCK=1 << 16)
    assert torch.equal(y.view(torch.int32), z.view(torch.int32)), (x[y != z][:8], y[y != z][:8], z[y != z][:8])


def _fma32(a, b, c):
    """RN32(a·b + c) for float32 tensors, exactly (what the GPU's fused multiply-add returns): a·b is exact
    in float64 (48 bits); the float64 sum is taken to round-to-odd (its TwoSum error decides the last bit),
    and rounding a round-to-odd value of >= 24 + 2 bits to float32 is the correct rounding of the sum."""
    p, c = a.double() * b.double(), c.double()
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    even = (s.view(torch.int64) & 1) == 0
    s = torch.where((err != 0) & even, torch.nextafter(s, torch.where(err > 0, torch.inf, -torch.inf).double()), s)
    return s.float()


def test_markstein_quotient_is_the_ieee_quotient_for_every_e4m3_scale():
    """The arithmetic of ``div_rn_by`` (q0 = RN(x·y) with y = RN(1/s), then RN(q0 + RN(x − s·q0)·y) by two
    fmas, emulated exactly) equals the IEEE quotient x / s for every positive E4M3 s on every float within 64
    ulps of each E2M1 decision point, grid value and power of two times s (both signs) and on random x/s over
    [2^-4, 16]. (The GPU test below runs the compiled helper on every float32 of [2^-20·s, 2^20·s).)"""
    g = torch.Generator().manual_seed(11)
    pts = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.5, 3.0, 6.0, 7.0]
                       + [2.0 ** k for k in range(-4, 5)], dtype=torch.float64)
    near = torch.arange(-64, 65, dtype=torch.int32)
    xs, ss = [], []
    for sv in E4M3_POS.tolist():
        b = (pts * sv).float().view(torch.int32)
        x = torch.cat([(b[:, None] + near).flatten().view(torch.float32),
                       (torch.exp2(torch.rand(4000, generator=g) * 8 - 4) * sv).float()])
        xs.append(torch.cat([x, -x]))
        ss.append(torch.full((2 * x.numel(),), sv))
    x, s = torch.cat(xs), torch.cat(ss)
    _assert_markstein_is_ieee(x, s)
    assert x.numel() > 1_500_000


def _assert_markstein_is_ieee(x, s):
    """``div_rn_by``'s arithmetic with y = RN(1/s), emulated exactly: q0 = RN(x·y), RN(q0 − RN(q0·s − x)·y),
    equals the IEEE quotient x / s bit for bit (the sign of zero included)."""
    y = 1.0 / s  # float32 division: RN(1/s)
    q0 = x * y
    q = _fma32(-_fma32(q0, s, -x), y, q0)
    want = x / s
    bad = q.view(torch.int32) != want.view(torch.int32)
    assert not bad.any(), (x[bad][:4], s[bad][:4], q[bad][:4], want[bad][:4])


def test_markstein_quotient_is_the_ieee_quotient_for_general_divisors():
    """The same arithmetic for 2000 random float32 divisors over [2^-96, 2^96] (the global-scale divisors
    s / S_enc): every float within 100 ulps of each E2M1 decision point times the divisor, and ±0. (The
    reciprocal on the GPU is ``recip_nr``, div_rn's own; the GPU test compares with div_rn directly.) Fails
    without the correction (half of the quotients differ), with y one ulp above RN(1/s) (4 differ), or with the
    residual written x − s·q0 (x = −0 gives +0)."""
    g = torch.Generator().manual_seed(12)
    n = 2000
    d = ((torch.rand(n, generator=g, dtype=torch.float64) + 1)
         * torch.exp2(torch.randint(-96, 96, (n,), generator=g).double())).float()
    pts = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
    b = (pts[None, :] * d[:, None].double()).float().view(torch.int32)
    x = (b[:, :, None] + torch.arange(-100, 101, dtype=torch.int32)).view(torch.float32)
    x = torch.cat([x.flatten(), -x.flatten(), torch.tensor([0.0, -0.0])])
    s = torch.cat([d[:, None].expand(n, 7 * 201).flatten()] * 2 + [d[:2]])
    _assert_markstein_is_ieee(x, s)


@triton.jit
def _div_rn_by_check_kernel(S, LO, N, BAD, BLOCK: tl.constexpr, ITERS: tl.constexpr,
                            RECIP_RN: tl.constexpr = True):
    """BAD += the number of x = LO[j] + i (float bits, i < N[j]) and -x whose ``div_rn_by`` quotient by S[j]
    (with the kernels' reciprocal ``e2m1_recip``) differs from ``div_rn``'s (bit patterns), + 2**20 if that
    reciprocal is not ``div_rn(1, S[j])``."""
    j = tl.program_id(1)
    s = tl.load(S + j)
    y = e2m1_recip(s)[0]
    if RECIP_RN and tl.program_id(0) == 0:
        tl.atomic_add(BAD, tl.where(y == tl.math.div_rn(1.0, s), 0, 1 << 20))
    lo = tl.load(LO + j)
    n = tl.load(N + j)
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    for it in range(ITERS):
        offs = (tl.program_id(0) * ITERS + it).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = (lo + offs).to(tl.int32).to(tl.float32, bitcast=True)
        for sign in tl.static_range(2):
            xs = x if sign == 0 else -x
            q1 = div_rn_by(xs, s, y).to(tl.int32, bitcast=True)
            q2 = tl.math.div_rn(xs, s).to(tl.int32, bitcast=True)
            bad += ((offs < n) & (q1 != q2)).to(tl.int32)
    tl.atomic_add(BAD, tl.sum(bad, 0))


@gpu
@needs_cuda
def test_gpu_div_rn_by_every_e4m3_scale_exhaustive():
    """The compiled ``div_rn_by`` (Markstein's correction) and the reciprocal ``e2m1_recip`` feeds it (``recip_nr``:
    the hardware approximation and one Newton step) against ``div_rn``: every positive E4M3 scale s,
    every float32 x with |x|/s in [2^-20, 2^20), both signs: 8.5e10 quotients, bit for bit (~2.5 s on an
    H100)."""
    s = E4M3_POS.cuda()
    lo = (s * 2.0 ** -20).view(torch.int32).long()
    n = (s * 2.0 ** 20).view(torch.int32).long() - lo
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    BLOCK, ITERS = 1024, 64
    _div_rn_by_check_kernel[(triton.cdiv(int(n.max()), BLOCK * ITERS), s.numel())](s, lo, n, bad, BLOCK=BLOCK,
                                                                                   ITERS=ITERS)
    assert int(n.sum()) > 4e10 and bad.item() == 0, f"{bad.item()} quotients differ from div_rn"


@gpu
@needs_cuda
def test_gpu_div_rn_by_general_divisors():
    """``div_rn_by`` with ``recip_nr`` (the global-scale path) against ``div_rn`` for 1024 divisors over
    [2^-96, 2^96] (random significands, the range's ends, all-ones significands): every float32 x with |x|/s
    in [2^-3, 2^4) (every quotient that can change an E2M1 code), both signs, 1.2e11 quotients, bit for bit."""
    g = torch.Generator().manual_seed(5)
    m = torch.rand(1016, generator=g, dtype=torch.float64) + 1
    e = torch.randint(-96, 96, (1016,), generator=g).double()
    ends = torch.tensor([1.0, 2.0 - 2.0 ** -23, 1.5, 1.0 + 2.0 ** -23], dtype=torch.float64)
    s = torch.cat([m * torch.exp2(e), ends * 2.0 ** -96, ends * 2.0 ** 95]).float().cuda()
    lo = (s * 2.0 ** -3).view(torch.int32).long()
    n = (s * 2.0 ** 4).view(torch.int32).long() - lo
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    BLOCK, ITERS = 1024, 64
    _div_rn_by_check_kernel[(triton.cdiv(int(n.max()), BLOCK * ITERS), s.numel())](
        s, lo, n, bad, BLOCK=BLOCK, ITERS=ITERS, RECIP_RN=False)
    assert int(n.sum()) > 5e10 and bad.item() == 0, f"{bad.item()} quotients differ from div_rn"


@triton.jit
def _code_div_check_kernel(S, BAD, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """BAD += the number of finite float32 x >= 0 (bit patterns, and -x) whose ``e2m1_code_div`` code (low
    nibble) by S[j] differs from ``e2m1_code(div_rn(x, S[j]))``."""
    s = tl.load(S + tl.program_id(1))
    y, m8 = e2m1_recip(s)
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    for it in range(ITERS):
        offs = (tl.program_id(0) * ITERS + it).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = offs.to(tl.int32).to(tl.float32, bitcast=True)
        for sign in tl.static_range(2):
            xs = x if sign == 0 else -x
            c1 = e2m1_code_div(xs, s, y, m8) & 15
            c2 = e2m1_code(tl.math.div_rn(xs, s)).to(tl.int32)
            bad += ((offs < 0x7F800000) & (c1 != c2)).to(tl.int32)
    tl.atomic_add(BAD, tl.sum(bad, 0))


@gpu
@needs_cuda
def test_gpu_e2m1_code_div_every_float32_at_the_range_ends():
    """The E2M1 code of the global-scale path (``e2m1_code_div``, ``recip_nr``) against ``e2m1_code(div_rn)`` for
    every finite float32 x (both signs: subnormals, quotients that underflow or overflow, ±0) at divisors at the
    ends of the fast path's range [2^-96, 2^96] and inside it (8.6e9 values each)."""
    s = torch.tensor([2.0 ** -96, 1.9999999 * 2.0 ** -96, 1.3 * 2.0 ** -60, 0.7, 3.0, 1.7 * 2.0 ** 50,
                      2.0 ** 95, 2.0 ** 96], dtype=torch.float32, device="cuda")
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    _code_div_check_kernel[(triton.cdiv(0x7F800000, 1024 * 64), s.numel())](s, bad, BLOCK=1024, ITERS=64)
    assert bad.item() == 0, f"{bad.item()} codes differ"


@triton.jit
def _nvfp4_scale_check_kernel(BAD, N, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    """BAD += the number of float32 a (bit patterns 0 .. N - 1) whose ``nvfp4_scale`` differs from
    ``e4m3_round(div_rn(a, 6))``."""
    bad = tl.zeros((BLOCK,), dtype=tl.int32)
    for it in range(ITERS):
        offs = (tl.program_id(0) * ITERS + it).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        a = offs.to(tl.int32).to(tl.float32, bitcast=True)
        got = nvfp4_scale(a).to(tl.int32, bitcast=True)
        want = e4m3_round(tl.math.div_rn(a, 6.0)).to(tl.int32, bitcast=True)
        bad += ((offs < N) & (got != want)).to(tl.int32)
    tl.atomic_add(BAD, tl.sum(bad, 0))


@gpu
@needs_cuda
def test_gpu_nvfp4_scale_every_float32_amax():
    """``nvfp4_scale`` (amax / 6 by ``div_rn_by``) against ``e4m3_round(div_rn(amax, 6))`` on every finite float32
    amax >= 0 (2.1e9 values, subnormal quotients included)."""
    n = 0x7F800000
    bad = torch.zeros(1, dtype=torch.int32, device="cuda")
    _nvfp4_scale_check_kernel[(triton.cdiv(n, 1024 * 64),)](bad, n, BLOCK=1024, ITERS=64)
    assert bad.item() == 0, f"{bad.item()} scales differ"
