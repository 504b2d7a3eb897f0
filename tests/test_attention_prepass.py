"""The attention pre-pass (``fp4attn.kernels.attention.quantize_qkv``) field by field, bit for bit.

Every buffer the main kernel reads (Q codes and scale bytes, K scale bytes, K/V packed codes or the
staged K̂ / V̂ᵀ, V scale bytes, the MXFP4 channel exponents, q̄, the smoothed K copy, the non-finite
flags) is compared with ``torch.equal`` against a plain PyTorch statement of it built from
``fp4attn.formats.core.quantize_reference``: every recipe (nvfp4, mxfp4, sage3 = nvfp4 + smoothing),
both operand modes (staged / packed), D = 64 and 128, ragged token counts, GQA, and NaN/±Inf
inputs. The only value not stated independently is q̄ (its FP32 summation order is the kernel's): it
is checked to 1e-5 against the torch mean and then used as given, as the reference would use it.
Guards the pre-pass against any change of the numbers it hands to the main kernel.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from fp4attn.formats.core import e2m1_decode, quantize_reference  # noqa: E402
from fp4attn.kernels import attention as A  # noqa: E402
from fp4attn.kernels._tiles import key_position, key_positions, position_key  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available() and not INTERPRET
# the interpreter on CPU; on a GPU (TRITON_INTERPRET=0) the compiled Hopper path, fp16 / FP8 staged
pytestmark = [pytest.mark.skipif(not (INTERPRET or HAS_CUDA), reason="needs the interpreter or CUDA")]
if HAS_CUDA:
    pytestmark.append(pytest.mark.gpu)  # selected by ``-m gpu`` with the other GPU tests
DEV = "cuda" if HAS_CUDA else "cpu"
PATH = A.PATH_INTERP if INTERPRET else A.PATH_HOPPER

NAN, INF = float("nan"), float("inf")


def _u8(t):
    return t.contiguous().view(torch.uint8) if t.dtype != torch.uint8 else t


def _pad(x, n_tok, dp):
    """(B, H, N, D) -> (B, H, n_tok, dp) zero-padded."""
    return torch.nn.functional.pad(x, (0, dp - x.shape[-1], 0, n_tok - x.shape[-2]))


def _quantize(x, fmt):
    """x (..., C) along its last axis -> (packed codes, scale bytes, values code·scale as float64):
    quantize_reference of x with its non-finite elements zeroed (the block scales ignore them), then
    the kernel's codes for those elements: NaN -> 0, ±Inf -> ±6 (code 7 with the sign bit; 0 in an
    NVFP4 block whose scale is 0, whose codes are all 0)."""
    fin = torch.isfinite(x)
    r = quantize_reference(torch.where(fin, x, 0.0), fmt, dim=-1)
    qb = x.shape[-1] // r.scales.shape[-1]
    scale = r.scale_values().double().repeat_interleave(qb, dim=-1)
    codes = r.codes()
    inf_code = torch.where(x > 0, 7, 15).to(torch.uint8)
    inf_code = torch.where(scale > 0, inf_code, 0).to(torch.uint8)
    codes = torch.where(fin, codes, torch.where(torch.isinf(x), inf_code, 0).to(torch.uint8))
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    values = e2m1_decode(codes).double() * scale
    return packed, r.scales, values


def prepass_statement(q, k, v, *, fmt, smooth_q, smooth_k, qbar_kernel, path):
    """The pre-pass outputs in plain PyTorch (see the module docstring); padded like the kernel's."""
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    DP = A.head_dim_padded(D, path)
    NQP, NKP = A.pad_tokens(nq), A.pad_tokens(nk)
    exp = {}
    # ---- Q (smooth_q: minus the per-128-row mean q̄, the kernel's FP32 sum checked to 1e-5) ----
    qx = q
    if smooth_q:
        nb = NQP // 128
        qp = torch.nn.functional.pad(q, (0, 0, 0, NQP - nq)).view(B, hq, nb, 128, D)
        cnt = torch.tensor([min(128, nq - 128 * i) for i in range(nb)], dtype=torch.float32, device=q.device)
        mean = qp.sum(dim=3) / cnt.view(1, 1, nb, 1)
        fin = torch.isfinite(mean)
        torch.testing.assert_close(qbar_kernel[..., :D][fin], mean[fin], rtol=1e-5, atol=1e-5)
        exp["qbar"] = _pad(torch.where(fin, qbar_kernel[..., :D], 0.0), nb, DP)
        used = torch.where(fin, qbar_kernel[..., :D], mean)  # a non-finite mean poisons its block
        qx = q - used.repeat_interleave(128, dim=2)[:, :, :nq]
    qpad = _pad(qx, NQP, DP)
    exp["qc"], exp["qs"], _ = _quantize(qpad, fmt)
    exp["qbad"] = (~torch.isfinite(qpad)).any(dim=-1).to(torch.uint8)
    # ---- K (smooth_k: minus the per-head token mean k̄) ------------------------------------------
    kx = k
    if smooth_k:
        kx = k - k.mean(dim=2, keepdim=True, dtype=torch.float32)
    kpad = _pad(kx, NKP, DP)
    exp["kc"], exp["ks"], kq = _quantize(kpad, fmt)
    if smooth_q:
        # the correction q̄ᵢ·γ(K)ᵀ per (query head, query block, key), from the finite part of the
        # smoothed K, in float64 (the kernel's is a tf32x3 dot: compared with a tolerance, see below)
        kfin = torch.where(torch.isfinite(kpad), kpad, 0.0).double().repeat_interleave(g, dim=1)
        exp["qcorr"] = exp["qbar"].double() @ kfin.transpose(-1, -2)  # (B, hq, NQP/128, NKP)
        exp["qcorr_mag"] = exp["qbar"].double().abs() @ kfin.abs().transpose(-1, -2)
    # ---- V (blocks and packing along tokens, stored channel-major) ---------------------------------
    vpad = _pad(v, NKP, DP)
    exp["vc"], exp["vs"], vq = _quantize(vpad.transpose(-1, -2), fmt)  # (B, hkv, DP, NKP)
    if fmt == "mxfp4":
        exp["vexp"] = _u8(exp["vs"]).to(torch.int32).amax(dim=-1) - 127
    # ---- flags, per query head ------------------------------------------------------------------
    kbad_row = (~torch.isfinite(kpad)).any(dim=-1)  # (B, hkv, NKP)
    first = torch.where(kbad_row, torch.arange(NKP, device=kpad.device).expand_as(kbad_row), NKP).amin(dim=-1)
    kv = torch.zeros(B, hkv, 2 + DP, dtype=torch.int64, device=k.device)
    kv[..., 0] = torch.where(first < NKP, 2**31 - 1 - first, 0)
    vbad = (~torch.isfinite(vpad)).any(dim=-2)  # (B, hkv, DP)
    kv[..., 1] = vbad.any(dim=-1).long()
    kv[..., 2:] = vbad.long()
    exp["kvbad"] = kv.repeat_interleave(g, dim=1).to(torch.int32)
    # ---- staged operands: the FP4 values (NVFP4, exact in fp16) / the FP8 embedding (MXFP4) -------
    if fmt == "mxfp4":
        ek = _u8(exp["ks"]).to(torch.int32).amax(dim=-1, keepdim=True) - 127
        kq = kq * torch.exp2(6.0 - ek.double())
        vq = vq * torch.exp2(6.0 - exp["vexp"][..., None].double())
    exp["kh"], exp["vh"] = kq, vq
    return exp


def _poison(q, k, v):
    q, k, v = q.clone(), k.clone(), v.clone()
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    q[0, hq - 1, 37, D // 3] = NAN
    q[B - 1, 0, nq - 1, 0] = -INF
    k[0, hkv - 1, nk // 2, D - 1] = INF
    k[0, hkv - 1, nk // 2 + 3, 1] = NAN
    v[0, 0, 20, 5] = -INF
    v[0, hkv - 1, nk - 1, D - 2] = NAN
    return q, k, v


CASES = [
    # fmt, smooth_q, smooth_k, D, nq, nk, poison
    ("nvfp4", False, False, 64, 150, 90, False),
    ("nvfp4", False, False, 128, 70, 200, True),
    ("mxfp4", False, False, 64, 150, 90, True),
    ("mxfp4", False, False, 128, 70, 200, False),
    ("nvfp4", True, True, 64, 150, 90, False),  # sage3: two q̄ blocks, the second ragged
    ("nvfp4", True, True, 128, 150, 200, True),
    ("nvfp4", True, False, 40, 130, 70, False),  # smooth_q alone, D padded to 64
    ("mxfp4", False, True, 48, 60, 130, True),  # smooth_k alone, D padded to 64
]


@pytest.mark.parametrize("staged", [True, False, "key_perm"], ids=["staged", "packed", "keyperm"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-sq{int(c[1])}-sk{int(c[2])}-D{c[3]}-{c[4]}x{c[5]}"
                         + ("-nonfinite" if c[6] else ""))
def test_prepass_fields_bit_exact(case, staged):
    """Every field against ``prepass_statement``; with key_perm (staged NVFP4 for the Gluon passes) K̂'s rows and
    V̂ᵀ's columns are those of the staged run at ``_tiles.key_positions``."""
    fmt, smooth_q, smooth_k, D, nq, nk, bad = case
    key_perm = staged == "key_perm"
    if key_perm and fmt != "nvfp4":
        pytest.skip("key_perm: NVFP4 only (the Gluon passes)")
    B, hq, hkv = 2, 4, 2
    g = torch.Generator().manual_seed(D + nq + nk)
    q = torch.randn(B, hq, nq, D, generator=g) * torch.logspace(-3, 3, D)  # very different block magnitudes
    k = torch.randn(B, hkv, nk, D, generator=g) + 0.5
    v = torch.randn(B, hkv, nk, D, generator=g)
    v[:, :, :, 3] *= 1e-4
    if bad:
        q, k, v = _poison(q, k, v)
    q, k, v = (t.to(DEV) for t in (q, k, v))
    path = PATH
    pk = A.quantize_qkv(q, k, v, fmt=fmt, smooth_q=smooth_q, smooth_k=smooth_k, path=path, staged=bool(staged),
                        key_perm=key_perm)
    assert pk.key_perm == key_perm
    exp = prepass_statement(q, k, v, fmt=fmt, smooth_q=smooth_q, smooth_k=smooth_k, qbar_kernel=pk.qbar,
                            path=path)

    def eq(name, got, want):
        """Bit for bit (float values: -0.0 and +0.0 differ) in the kernel's dtype."""
        assert got is not None and got.numel() > 0, name
        assert got.shape == want.shape, (name, got.shape, want.shape)
        if got.dtype.is_floating_point:
            w = want.to(got.dtype)
            assert torch.equal(w.to(want.dtype), want), name  # the expected values exist in that dtype
            assert torch.equal(_u8(got), _u8(w)), name
        else:  # integers; scale bytes against the reference's float8 scales
            w = want if want.dtype.is_floating_point else want.to(got.dtype)
            assert torch.equal(_u8(got), _u8(w)), name

    for name in ("qc", "qs", "ks", "qbad", "kvbad"):
        eq(name, getattr(pk, name), exp[name])
    if fmt == "mxfp4":
        eq("vexp", pk.vexp, exp["vexp"])
    if smooth_q:
        eq("qbar", pk.qbar, exp["qbar"])
        # Not bit for bit: the dot's summation order (and tf32x3's three-term split, ~2^-21 relative to the
        # sum of |products| on GPU) are the kernel's. 2^-18 of that sum: 8x the split's error bound.
        corr = A.smooth_q_corr(pk, 0, pk.qbar.shape[2])  # the correction table of the main kernel
        part = A.smooth_q_corr(pk, 1, 1)  # one query block: the same values
        assert torch.equal(part, corr[:, :, 1:2])
        if key_perm:  # key j's entry at column key_position(j), as K̂'s row
            cpos = key_positions(corr.shape[-1], device=corr.device)
            assert not torch.equal(corr[..., cpos], corr)
            corr = corr[..., cpos]
        err = (corr.double() - exp["qcorr"]).abs()
        assert corr.shape == exp["qcorr"].shape
        assert (err <= 2.0**-18 * exp["qcorr_mag"] + 1e-30).all(), err.max()
    if smooth_k:
        torch.testing.assert_close(pk.kbar, k.mean(dim=2, dtype=torch.float32), rtol=0, atol=0, equal_nan=True)
        # q·k̄ per query row (the LSE shift), from the unsmoothed q: the kernel's FP32 sum vs float64
        kb = pk.kbar.double().repeat_interleave(hq // hkv, dim=1)
        want = torch.einsum("bhnd,bhd->bhn", q.double(), kb)
        mag = torch.einsum("bhnd,bhd->bhn", q.double().abs(), kb.abs())
        got = pk.qkb[:, :, :nq].double()
        fin = torch.isfinite(want)
        assert torch.equal(fin, torch.isfinite(got))
        assert ((got - want).abs()[fin] <= 2.0**-20 * mag[fin] + 1e-30).all()
    if key_perm:  # stored at position key_positions(key): the staged values, permuted
        pos = key_positions(pk.kh.shape[2], device=pk.kh.device)
        assert not torch.equal(pos, torch.arange(pos.numel(), device=pos.device))
        eq("kh (key order)", pk.kh[:, :, pos, :], exp["kh"])
        eq("vh (key order)", pk.vh[..., pos], exp["vh"])
    elif staged:
        eq("kh", pk.kh, exp["kh"])
        eq("vh", pk.vh, exp["vh"])
    else:
        assert pk.kh is None and pk.vh is None
        for name in ("kc", "vc", "vs"):
            eq(name, getattr(pk, name), exp[name])
        kh, vh = A.stage_operands(pk)  # staging the packed form gives the staged run's operands
        eq("kh (stage_operands)", kh, exp["kh"])
        eq("vh (stage_operands)", vh, exp["vh"])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("poison", [False, True], ids=["finite", "nonfinite"])
@pytest.mark.parametrize("nq,nk", [(300, 333), (4200, 4200)], ids=["ragged", "two-chunks"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_corr_table_16bit(dtype, nq, nk, causal, poison):
    """sage3's smooth_q table from 16-bit K (``_smooth_q_corr_kernel``'s K_EXACT paths: q̄·k − q̄·k̄ with the keys
    exact as an operand, against q̄'s three bf16 parts (bf16 K, compiled) or its TF32 hi / lo parts (fp16 K; bf16 K
    under the interpreter)) against float64 q̄·(k − k̄): every entry a query block reads (causal, bottom-right: the
    keys its last row sees; GQA; 4200 queries, GPU only: 33 blocks, two 32-block chunks of the kernel).
    Tolerance 2^-20 of |q̄|·(|k| + |k̄|), the magnitude its error is relative to (2^-23 measured on an H200): ~8x the
    parts' error, far below the FP4 error the table feeds. Keys whose smoothed row is non-finite (flagged by the
    K pre-pass: every row that sees one is NaN) are not compared; padded keys are 0."""
    if INTERPRET and nq > 1000:
        pytest.skip("interpreter: the ragged shape only")
    B, hq, hkv, D = 2, 4, 2, 128
    g = torch.Generator().manual_seed(nq + nk + poison)
    q = torch.randn(B, hq, nq, D, generator=g) + 0.3
    k = torch.randn(B, hkv, nk, D, generator=g) * 2.0 + 0.5
    v = torch.randn(B, hkv, nk, D, generator=g)
    if poison:
        k[0, 1, nk // 2, 5] = INF
        k[1, 0, 17, 7] = NAN
    q, k, v = (t.to(DEV, dtype) for t in (q, k, v))
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", smooth_q=True, smooth_k=True, path=PATH, staged=True, key_perm=True)
    nqb, NKP = pk.qbar.shape[2], pk.ks.shape[2]
    corr = A.smooth_q_corr(pk, 0, nqb, causal=causal)[..., key_positions(NKP, device=DEV)]  # key order
    kb = pk.kbar.double()[:, :, None, :]
    kd = k.double()
    qb = pk.qbar[..., :D].double()
    rep = hq // hkv
    want = qb @ (kd - kb).repeat_interleave(rep, dim=1).transpose(-1, -2)
    mag = qb.abs() @ (kd.abs() + kb.abs()).repeat_interleave(rep, dim=1).transpose(-1, -2)
    keys = torch.arange(nk, device=DEV)
    read = torch.ones(nqb, nk, dtype=torch.bool, device=DEV)
    if causal:  # block i's last row sees keys up to min(128(i + 1), nq) - 1 + nk - nq
        last = torch.clamp(128 * torch.arange(1, nqb + 1, device=DEV), max=nq) - 1 + nk - nq
        read = keys[None, :] <= last[:, None]
    fin = torch.isfinite(kd - kb).all(dim=-1).repeat_interleave(rep, dim=1)  # (B, hq, nk)
    check = read[None, None] & fin[:, :, None, :]
    assert check.float().mean() > 0.2  # (a non-finite key makes its whole head's smoothed K non-finite, via k̄)
    got = corr[..., :nk].double()
    assert ((got - want).abs() <= 2.0**-20 * mag)[check].all(), ((got - want).abs() / mag)[check].max()
    if not causal:
        assert not corr[..., nk:].any()  # padded keys


def test_key_positions_put_each_block_in_one_lane():
    """The Gluon passes' key order: a permutation within every 64 keys, ``position_key`` its inverse, and the 16
    columns 8j + 2q + e (j < 8, e < 2) that lane q of a quad holds in a wgmma accumulator fragment are the 16 keys of
    block q (``attention_gluon._phi``). The jit helpers' bodies run on tensors here."""
    n = 256
    pos = key_positions(n)
    keys = torch.arange(n)
    assert torch.equal(pos, key_position.fn(keys))
    assert torch.equal(torch.sort(pos).values, keys)
    assert torch.equal((pos // 64), keys // 64)
    assert torch.equal(position_key.fn(pos), keys)
    for g in range(n // 64):
        for q in range(4):
            cols = torch.tensor([64 * g + 8 * j + 2 * q + e for j in range(8) for e in range(2)])
            assert torch.equal(position_key.fn(cols), 64 * g + 16 * q + torch.arange(16))
