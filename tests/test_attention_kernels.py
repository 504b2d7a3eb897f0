"""FP4 inference attention kernels (issue 4): nvfp4 / mxfp4 / sage3.

CPU: the Triton kernels under ``TRITON_INTERPRET=1`` at tiny sizes (the interpreter path: the same
decoded operand values through an fp32 ``tl.dot``), against the float64 reference of the same recipe
and bit for bit against ``fp4attn.quantize`` for the pre-pass; NaN/±Inf inputs give NaN exactly where
the reference's arithmetic does (``nan_reference``).
GPU (``-m gpu``, run with ``TRITON_INTERPRET=0``): the public op vs the reference with the SPEC §6
tolerances for every recipe and feature, the Blackwell ``dot_scaled`` logic (emulated by Triton on
Hopper for MXFP4), and the exactness condition of the MXFP4 -> FP8 embedding on FP8 tensor cores.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import math  # noqa: E402
import zlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import reference  # noqa: E402
from fp4attn.formats.core import quantize_reference  # noqa: E402
from fp4attn.kernels import attention as A  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available() and not INTERPRET
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")
cpu_interp = pytest.mark.skipif(not INTERPRET, reason="interpreter test (TRITON_INTERPRET=1)")
DEV = "cuda" if HAS_CUDA else "cpu"


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def make_qkv(B, hq, hkv, nq, nk, D, dtype=torch.float32, seed=0, device=DEV):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, hq, nq, D, generator=g)
    k = torch.randn(B, hkv, nk, D, generator=g)
    v = torch.randn(B, hkv, nk, D, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def spec_check(out, q, k, v, *, causal, recipe, flags=None, tight=None, window=None):
    """SPEC §6: vs the float64 reference of the same recipe cosine >= 0.998, rel L2 <= 0.05, and the
    kernel's error vs unquantized attention <= 1.05x the reference's. ``tight``: also rel L2 <= tight.
    ``window``: a sliding ``window_size`` (both references take it)."""
    flags = flags or {}
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = reference.attention(qd, kd, vd, causal=causal, recipe=recipe, window_size=window, **flags)
    exact = reference.attention(qd, kd, vd, causal=causal, recipe="bf16", window_size=window)
    cos, rel = cosine(out, ref), rel_l2(out, ref)
    own, ref_err = rel_l2(out, exact), rel_l2(ref, exact)
    msg = f"cos={cos:.5f} rel={rel:.4f} own_err={own:.4f} ref_err={ref_err:.4f}"
    assert cos >= 0.998, msg
    assert rel <= 0.05, msg
    assert own <= 1.05 * ref_err, msg
    if tight is not None:
        assert rel <= tight, msg
    return ref


# -------------------------------------------------------------------------------------------------
# pre-pass: bit-exact storage form
# -------------------------------------------------------------------------------------------------
def _u8(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


@cpu_interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("smooth", [False, True])
def test_prepass_matches_quantize_reference(fmt, smooth):
    B, H, nq, nk, D = 1, 2, 150, 90, 40
    q, k, v = make_qkv(B, H, H, nq, nk, D, seed=1)
    q = q * torch.logspace(-3, 3, D)  # blocks of very different magnitudes (MX exponents, E4M3 range)
    v[..., 3] *= 1e-4
    pk = A.quantize_qkv(q, k, v, fmt=fmt, smooth_q=smooth, smooth_k=smooth, path=A.PATH_INTERP, staged=False)
    qb = 32 if fmt == "mxfp4" else 16
    DP, NKP = pk.qc.shape[3] * 2, pk.kc.shape[2]

    def pad_d(x):
        return torch.nn.functional.pad(x, (0, DP - D))

    qx, kx = q, k
    if smooth:
        kx = k - k.mean(dim=2, keepdim=True)
        nb = -(-nq // 128)
        qp = torch.nn.functional.pad(q, (0, 0, 0, nb * 128 - nq)).view(B, H, nb, 128, D)
        cnt = torch.tensor([min(128, nq - 128 * i) for i in range(nb)], dtype=torch.float32)
        qbar = qp.sum(dim=3) / cnt.view(1, 1, nb, 1)
        torch.testing.assert_close(pk.qbar[..., :D], qbar, rtol=1e-5, atol=1e-5)  # summation order
        qx = q - pk.qbar[..., :D].repeat_interleave(128, dim=2)[:, :, :nq]
        qb64, kx64 = pk.qbar[..., :D].double(), kx.double().transpose(-1, -2)
        corr = A.smooth_q_corr(pk, 0, pk.qbar.shape[2])  # the correction table
        err = (corr[..., :nk].double() - qb64 @ kx64).abs()  # q̄ᵢ·γ(K)ᵀ; summation order (fp32 here):
        assert (err <= 2.0**-18 * (qb64.abs() @ kx64.abs())).all()  # well above 2^-24 · D of the sum of |terms|
        assert not corr[..., nk:].any()  # padded keys
    rq = quantize_reference(pad_d(qx), fmt, dim=-1)
    rk = quantize_reference(pad_d(kx), fmt, dim=-1)
    assert torch.equal(pk.qc[:, :, :nq], rq.data) and torch.equal(_u8(pk.qs[:, :, :nq]), _u8(rq.scales))
    assert torch.equal(pk.kc[:, :, :nk], rk.data) and torch.equal(_u8(pk.ks[:, :, :nk]), _u8(rk.scales))
    assert not pk.kc[:, :, nk:].any() and not pk.ks[:, :, nk:].any()  # padded keys: zero codes/scales
    vp = torch.nn.functional.pad(pad_d(v), (0, 0, 0, NKP - nk))
    rv = quantize_reference(vp, fmt, dim=-2)  # along tokens
    assert torch.equal(pk.vc, rv.data.transpose(-1, -2))  # stored channel-major (DP, NKP/2)
    assert torch.equal(_u8(pk.vs), _u8(rv.scales).transpose(-1, -2))
    assert pk.vs.shape[-1] == NKP // qb
    if fmt == "mxfp4":
        emax = _u8(rv.scales).to(torch.int32).amax(dim=-2) - 127
        assert torch.equal(pk.vexp, emax)


# -------------------------------------------------------------------------------------------------
# main kernel under the interpreter vs the float64 reference
# -------------------------------------------------------------------------------------------------
INTERP_CASES = [
    # recipe, causal, B, hq, hkv, nq, nk, D, flags
    ("nvfp4", False, 1, 2, 1, 70, 90, 40, {}),
    ("nvfp4", True, 1, 2, 1, 70, 90, 40, {}),
    ("mxfp4", False, 1, 2, 1, 70, 90, 40, {}),
    ("mxfp4", True, 2, 2, 2, 33, 130, 64, {}),
    ("sage3", False, 1, 2, 1, 70, 90, 40, {}),
    ("sage3", True, 1, 2, 2, 150, 150, 32, {}),  # two q̄ blocks, the second ragged
    ("nvfp4", True, 1, 1, 1, 100, 40, 16, {}),  # Nq > Nk: rows that see no key
    ("mxfp4", False, 1, 1, 1, 20, 70, 256, {}),  # largest head dim
    ("nvfp4", False, 1, 3, 1, 40, 64, 48, {"smooth_k": True}),  # MQA, ablation flags
    ("mxfp4", False, 1, 2, 1, 40, 100, 32, {"two_level_p": True}),
    ("nvfp4", True, 1, 2, 1, 130, 100, 32, {"smooth_q": True}),
    ("sage3", False, 1, 2, 1, 64, 64, 64, {"two_level_p": False}),
]


@cpu_interp
@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: f"{c[0]}-c{int(c[1])}-{c[2:8]}-{c[8]}")
def test_interpreter_vs_reference(case):
    recipe, causal, B, hq, hkv, nq, nk, D, flags = case
    # a fixed seed per case (Python's hash() of a tuple of strings changes with PYTHONHASHSEED, so CI drew
    # new inputs on every run)
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, seed=zlib.crc32(repr(case[:8]).encode()) % 1000)
    fmt, _, sq, sk, tlp = reference.recipe_flags(recipe, **flags)
    out, lse = A.attention_fwd(q, k, v, causal=causal, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp,
                               path=A.PATH_INTERP)
    # with the exact row max (one-shot P̃, two passes) or two-level P (max-invariant), the kernel makes
    # the reference's quantization decisions: only FP32-vs-float64 rounding remains. That rounding can
    # still flip a decision where a value sits within ~1e-7 of an FP4 rounding boundary (one flipped P̂
    # element moves these tiny outputs by ~3e-3): seen for 1 of ~120 input seeds of the 64x64 sage3 case,
    # whose smooth_q correction (~7e-7 off float64) changed with the table kernel's tile shape. The seeds
    # are fixed, so the check is deterministic; a real error in the quantization path is far above 1e-3.
    spec_check(out, q, k, v, causal=causal, recipe=recipe, flags=flags, tight=1e-3)
    _, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe=recipe,
                                     return_lse=True, **flags)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=1e-4)
    if causal and nq > nk:
        assert (~fin).any() and (out[~fin] == 0).all()


@cpu_interp
@pytest.mark.parametrize("case", [("sage3", False, 1, 2, 1, 400, 90, 40), ("sage3", True, 1, 2, 2, 300, 300, 64),
                                  ("nvfp4", False, 1, 2, 1, 260, 100, 32)], ids=str)
def test_interpreter_smooth_q_table_chunks(case, monkeypatch):
    """smooth_q with the correction table limited to one query block at a time (the main kernel runs in
    chunks of 128 queries) gives bit-identical outputs and LSE to the whole table at once."""
    recipe, causal, B, hq, hkv, nq, nk, D = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, seed=nq + D)
    fmt, _, _, sk, tlp = reference.recipe_flags(recipe, smooth_q=True)
    res = []
    for limit in (str(1 << 30), "1"):  # one chunk; 1 byte: one query block per chunk
        monkeypatch.setenv("FP4ATTN_SMOOTHQ_TABLE_BYTES", limit)
        res.append(A.attention_fwd(q, k, v, causal=causal, fmt=fmt, smooth_q=True, smooth_k=sk, two_level_p=tlp,
                                   path=A.PATH_INTERP))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    spec_check(res[1][0], q, k, v, causal=causal, recipe=recipe, flags={"smooth_q": True}, tight=1e-3)


@cpu_interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_interpreter_two_level_wide_score_range(fmt):
    """Two-level P keeps its accumulator in units of the last key tile's s1 (``two_level_step``). Key
    tiles whose maxima jump by up to ~200 binades (log2) around the running max: the first tile, one
    30 below, one 80 below (more than 64 below the running max: the clamped unit), a new max 10 above
    the first, one 200 below, then a visible tile near the max again. The kernel must stay finite and
    match the reference as in the plain cases (the clamp only overweights weights below 2^-64)."""
    B, hq, nq, D, nk = 1, 2, 20, 32, 6 * 64
    q, k, v = make_qkv(B, hq, hq, nq, nk, D, seed=5)
    q[..., 0] = 1.0
    k[..., 1:] *= 0.05  # scores dominated by channel 0 (scale = 1): S·log2(e) ≈ offset of the tile
    offs = torch.tensor([0.0, -30.0, -80.0, 10.0, -200.0, 5.0]).repeat_interleave(64)
    k[..., 0] = (offs + torch.randn(nk, generator=torch.Generator().manual_seed(5))) / math.log2(math.e)  # (seeded)
    for tl2 in (True,):
        out, lse = A.attention_fwd(q, k, v, scale=1.0, fmt=fmt, two_level_p=tl2, path=A.PATH_INTERP)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), scale=1.0, recipe=fmt,
                                           two_level_p=tl2, return_lse=True)
        assert rel_l2(out, ref) <= 1e-3, rel_l2(out, ref)  # FP32 vs float64 rounding only, as above
        torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-4)


@cpu_interp
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3"])
def test_interpreter_staged_operands_equal_packed(recipe):
    """Staged K̂/V̂ (dequantized once per tensor into the tensor-core dtype) give the same result as the
    in-register dequantization, bit for bit; the staged buffers hold exactly the FP4 values."""
    q, k, v = make_qkv(1, 2, 1, 70, 150, 48, seed=4)
    fmt, _, sq, sk, tlp = reference.recipe_flags(recipe)
    kw = dict(causal=True, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp, path=A.PATH_INTERP)
    o1, l1 = A.attention_fwd(q, k, v, staged=False, **kw)
    o2, l2 = A.attention_fwd(q, k, v, staged=True, **kw)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    pk = A.quantize_qkv(q, k, v, fmt=fmt, staged=True, path=A.PATH_INTERP)
    vq = quantize_reference(torch.nn.functional.pad(v, (0, 16, 0, 256 - 150)), fmt, dim=-2).dequantize()
    kq = quantize_reference(torch.nn.functional.pad(k, (0, 16, 0, 256 - 150)), fmt, dim=-1).dequantize()
    if fmt == "mxfp4":  # the FP8 embedding: c·2^(e − E + 6) with E per key row / per V channel
        ek = pk.ks.view(torch.uint8).to(torch.int32).amax(dim=-1, keepdim=True) - 127
        kq = kq.double() * torch.exp2(6.0 - ek.double())  # (float64: padded rows have E = -127)
        vq = vq.double() * torch.exp2(6.0 - pk.vexp[:, :, None, :].double())
    assert torch.equal(pk.kh.double(), kq.double())
    assert torch.equal(pk.vh.double(), vq.double().transpose(-1, -2))


@cpu_interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_interpreter_online_softmax(fmt):
    """One-pass online softmax (running max): P̃ of early tiles is quantized against a smaller max,
    so it is not bit-compatible with the one-shot reference; its own FP4 error stays the reference's."""
    q, k, v = make_qkv(1, 2, 2, 64, 200, 64, seed=7)
    out, _ = A.attention_fwd(q, k, v, fmt=fmt, online=True, path=A.PATH_INTERP)
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = reference.attention(qd, kd, vd, recipe=fmt)
    exact = reference.attention(qd, kd, vd, recipe="bf16")
    assert cosine(out, ref) >= 0.99
    assert rel_l2(out, exact) <= 1.05 * rel_l2(ref, exact)
    exact_max, _ = A.attention_fwd(q, k, v, fmt=fmt, online=False, path=A.PATH_INTERP)
    assert rel_l2(exact_max, ref) < 1e-3 < rel_l2(out, ref)


@cpu_interp
def test_interpreter_strided_output_and_fp16():
    """bshd views in and out (the op's layout path), fp16 inputs, output in q's dtype."""
    q, k, v = make_qkv(1, 2, 1, 50, 70, 32, dtype=torch.float16, seed=3)
    qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    out = torch.empty(1, 50, 2, 32, dtype=torch.float16).transpose(1, 2)
    o1, _ = A.attention_fwd(qs, ks, vs, causal=True, fmt="nvfp4", out=out, path=A.PATH_INTERP)
    o2, _ = A.attention_fwd(q, k, v, causal=True, fmt="nvfp4", path=A.PATH_INTERP)
    assert o1.dtype == torch.float16 and o1.data_ptr() == out.data_ptr()
    assert torch.equal(o1, o2)
    spec_check(o2.float(), q.float(), k.float(), v.float(), causal=True, recipe="nvfp4")


# -------------------------------------------------------------------------------------------------
# non-finite inputs (SPEC §2: a block holding NaN/±Inf dequantizes to NaN, never silently finite)
# -------------------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")


def nan_reference(q, k, v, **kw):
    """float64 reference (out, lse): NaN goes where the FP4 arithmetic puts it (ϕ(NaN block) = NaN,
    S = Q̂K̂ᵀ, P̃, l, ϕ(P̃)·V̂, 1/l and the LSE in IEEE arithmetic)."""
    return reference.attention(q.double(), k.double(), v.double(), return_lse=True, **kw)


def poison(q, k, v, bad):
    """Put NaN / ±Inf into copies of q, k, v: ``bad`` is a string of 'q', 'k', 'v' (several at once:
    different heads / values). Positions are inside the tensors whatever the sizes (Nq > Nk too)."""
    q, k, v = q.clone(), k.clone(), v.clone()
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    if "q" in bad:
        q[0, hq - 1, min(37, nq - 1), D // 3] = NAN  # causal with Nq > Nk: a row that sees no key
        q[B - 1, 0, nq - 1, 0] = -INF  # the last row sees every key
    if "k" in bad:
        k[B - 1, hkv - 1, nk // 2, D - 1] = INF  # causal: rows i >= nk/2 - (nk - nq) see it
    if "v" in bad:
        v[0, 0, min(20, nk - 1), 5] = -INF
    if bad == "qkv":
        k[0, 0, nk - 1, 0] = NAN  # the last key: causal rows with i >= nq - 1 only
    return q, k, v


def check_nan_pattern(out, lse, ref, ref_lse, tol, lse_atol):
    """NaN exactly where the reference has NaN (output and LSE), ±Inf LSE where it has them, and the
    finite values within ``tol`` relative L2 (or all zero where the reference's are)."""
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(out), nan), (torch.isnan(out).sum().item(), nan.sum().item())
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    assert torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse))
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    fin = ~nan
    assert torch.isfinite(out[fin]).all()
    o, r = out[fin].double(), ref[fin]
    if r.norm() > 0:
        assert rel_l2(o, r) <= tol, rel_l2(o, r)
    else:
        assert (o == 0).all()
    fl = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fl].double(), ref_lse[fl], rtol=0, atol=lse_atol)


NAN_INTERP_CASES = [
    # recipe, flags, causal, B, hq, hkv, nq, nk, D, kernel options
    ("nvfp4", {}, False, 1, 2, 1, 70, 90, 40, {}),
    ("nvfp4", {}, True, 2, 4, 2, 100, 40, 16, {"staged": False}),  # Nq > Nk: rows that see no key
    ("mxfp4", {}, True, 1, 2, 1, 70, 90, 40, {}),
    ("mxfp4", {"two_level_p": True}, False, 1, 2, 1, 40, 100, 32, {"staged": False}),
    ("sage3", {}, True, 1, 2, 1, 150, 90, 32, {}),  # two q̄ blocks, the second ragged
    ("sage3", {}, False, 1, 2, 2, 150, 70, 32, {"staged": False}),
    ("nvfp4", {"smooth_k": True}, True, 1, 3, 1, 60, 80, 48, {}),  # MQA
    ("nvfp4", {"smooth_q": True}, False, 1, 2, 1, 130, 150, 32, {"online": True}),  # 3 key tiles: a running max
]


@cpu_interp
@pytest.mark.parametrize("bad", ["q", "k", "v", "qkv"])
@pytest.mark.parametrize("case", NAN_INTERP_CASES, ids=lambda c: f"{c[0]}-c{int(c[2])}-{c[3:9]}-{c[1]}-{c[9]}")
def test_interpreter_nan_pattern_matches_reference(case, bad):
    """NaN/±Inf in q, k or v: the kernels' output and LSE are NaN exactly where the reference's are
    (a bad query row: its row, with smooth_q its whole 128-row q̄ block; a bad key row: every row that
    sees it, with smooth_k every row; a bad V element: its channel in every row that sees any key),
    and everything else is what it is without them."""
    recipe, flags, causal, B, hq, hkv, nq, nk, D, opts = case
    q, k, v = poison(*make_qkv(B, hq, hkv, nq, nk, D, seed=nq + nk), bad)
    fmt, _, sq, sk, tlp = reference.recipe_flags(recipe, **flags)
    out, lse = A.attention_fwd(q, k, v, causal=causal, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp,
                               path=A.PATH_INTERP, **opts)
    ref, ref_lse = nan_reference(q, k, v, causal=causal, recipe=recipe, **flags)
    assert torch.isnan(ref).any()
    # online: P̃ of early key tiles quantized against a running max, not the reference's one-shot max: its finite
    # values within SPEC §6's 0.05 (0.037-0.039 measured), the NaN pattern and LSE exact as the others'
    check_nan_pattern(out, lse, ref, ref_lse, tol=0.05 if opts.get("online") else 1e-3, lse_atol=1e-4)


@cpu_interp
def test_interpreter_nan_rows_and_channels():
    """The pattern spelled out (nvfp4, causal, GQA, Nq < Nk): a NaN query row -> that row; a +Inf key
    j of kv head 1 -> rows i >= j - (Nk - Nq) of query heads 2, 3; a -Inf V element of kv head 0 in
    channel 5 -> channel 5 of every row of query heads 0, 1. The reference gives the same pattern."""
    B, hq, hkv, nq, nk, D = 1, 4, 2, 50, 80, 32
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, seed=8)
    q[0, 0, 10, 3] = NAN
    k[0, 1, 60, 7] = INF
    v[0, 0, 33, 5] = -INF
    out, lse = A.attention_fwd(q, k, v, causal=True, fmt="nvfp4", path=A.PATH_INTERP)
    rows = torch.zeros(B, hq, nq, dtype=torch.bool)
    rows[0, 0, 10] = True
    rows[0, 2:, 60 - (nk - nq):] = True
    expect = rows[..., None].expand(B, hq, nq, D).clone()
    expect[0, :2, :, 5] = True
    assert torch.equal(torch.isnan(out), expect)
    assert torch.equal(torch.isnan(lse), rows)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=True, recipe="nvfp4",
                                       return_lse=True)
    assert torch.equal(torch.isnan(ref), expect) and torch.equal(torch.isnan(ref_lse), rows)


@cpu_interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_prepass_nonfinite_flags_and_finite_operands(fmt):
    """The pre-pass flags the non-finite rows / channels (per query head under GQA) and hands the main
    kernel finite operands only: the scales of the input with its non-finite elements set to 0 (the
    block amax ignores them), the same codes everywhere else, finite staged K̂/V̂ and q̄."""
    B, hq, hkv, nq, nk, D = 2, 4, 2, 70, 90, 40
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, seed=12)
    q[1, 3, 17, 6] = NAN
    k[0, 1, 60, 0] = NAN
    k[0, 1, 33, 39] = -INF
    v[1, 0, 5, 12] = INF
    pk = A.quantize_qkv(q, k, v, fmt=fmt, smooth_q=True, staged=True, path=A.PATH_INTERP)
    pkp = A.quantize_qkv(q, k, v, fmt=fmt, smooth_q=True, staged=False, path=A.PATH_INTERP)  # packed codes
    for name in ("qc", "qs", "ks", "qbad", "kvbad", "qbar", "vexp"):
        assert torch.equal(getattr(pk, name), getattr(pkp, name)), name  # the same in both modes
    DP = pk.qc.shape[3] * 2
    qbad = torch.zeros(B, hq, pk.qc.shape[2], dtype=torch.uint8)
    qbad[1, 3, :128] = 1  # smooth_q: the NaN reaches q̄ of its 128-row block, hence every row of it
    qbad[1, 3, nq:] = 0  # (padding rows are zeros)
    assert torch.equal(pk.qbad, qbad)
    kv = torch.zeros(B, hq, 2 + DP, dtype=torch.int32)
    kv[0, 2:, 0] = 2**31 - 1 - 33  # kv head 1 -> query heads 2, 3; the first bad key
    kv[1, :2, 1] = 1
    kv[1, :2, 2 + 12] = 1
    assert torch.equal(pk.kvbad, kv)
    assert torch.isfinite(pk.qbar).all() and torch.isfinite(pk.kh).all() and torch.isfinite(pk.vh).all()

    def zeroed(x):
        return torch.nn.functional.pad(torch.where(torch.isfinite(x), x, 0.0), (0, DP - D))

    def codes(packed):
        return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)

    rk = quantize_reference(zeroed(k), fmt, dim=-1)
    assert torch.equal(_u8(pk.ks[:, :, :nk]), _u8(rk.scales))
    fin_k = torch.nn.functional.pad(torch.isfinite(k), (0, DP - D), value=True)
    assert torch.equal(codes(pkp.kc[:, :, :nk])[fin_k], codes(rk.data)[fin_k])
    NKP = pkp.kc.shape[2]
    rv = quantize_reference(torch.nn.functional.pad(zeroed(v), (0, 0, 0, NKP - nk)), fmt, dim=-2)
    assert torch.equal(_u8(pkp.vs), _u8(rv.scales).transpose(-1, -2))
    fin_v = torch.nn.functional.pad(torch.isfinite(v), (0, DP - D, 0, NKP - nk), value=True).transpose(-1, -2)
    assert torch.equal(codes(pkp.vc)[fin_v], codes(rv.data.transpose(-1, -2))[fin_v])


# -------------------------------------------------------------------------------------------------
# MXFP4 -> FP8 embedding: exactness condition
# -------------------------------------------------------------------------------------------------
def _mx_rows(n, D, span, seed, device):
    """MXFP4-representable rows (rceil scales reproduce them exactly). Per row a reference exponent E:
    "big" blocks hold c·2^E with c in {0, ±2} and one pinned 4 (block exponent E); with ``span`` set,
    every odd block is "small": c·2^(E - span), any E2M1 code c, one pinned 6 (block exponent
    E - span). The restricted big codes keep every S below exact in FP32 whatever the summation order
    (all terms on a 2^(E_q + E_k - span - 1) grid, |S| < 2^23 grid steps; asserted below)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    big = torch.tensor([0.0, 2.0, -2.0])
    small = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    x = torch.empty(n, D)
    erow = torch.randint(-3, 4, (n, 1), generator=g).float()
    for b in range(D // 32):
        is_small = span is not None and b % 2 == 1
        tab = small if is_small else big
        codes = tab[torch.randint(0, len(tab), (n, 32), generator=g)]
        codes[:, 0] = 6.0 if is_small else 4.0
        x[:, b * 32:(b + 1) * 32] = codes * torch.exp2(erow - (span if is_small else 0))
    return x.to(device)


def _probe_s(span, seed, device, spanning="q"):
    D, n = 64, 64
    q = _mx_rows(n, D, span if spanning == "q" else None, seed, device)[None, None]
    k = _mx_rows(n, D, span if spanning == "k" else None, seed + 1, device)[None, None]
    path = A.PATH_INTERP if INTERPRET else A.PATH_HOPPER
    pk = A.quantize_qkv(q, k, k, fmt="mxfp4", path=path, staged=False)  # mx_qk_probe reads the packed codes
    for x in (q, k):
        assert torch.equal(quantize_reference(x, "mxfp4").dequantize(), x)  # inputs are MXFP4 values
    s = A.mx_qk_probe(pk, 64, 64)
    s64 = q[0, 0].double() @ k[0, 0].double().T
    assert torch.equal(s64.float().double(), s64)  # the emulation is exact in FP32
    return s, s64.float()


@pytest.mark.parametrize("spanning", ["q", "k"])
@pytest.mark.parametrize("span", [0, 7, 14])
@pytest.mark.parametrize("where", [pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="interpreter")),
                                   pytest.param("gpu", marks=(gpu, pytest.mark.gpu))])
def test_mx_fp8_embedding_exact_inside_condition(span, spanning, where):
    """Blocks up to 14 binades below their row's largest block: S from the FP8 embedding (FP8 tensor
    cores on GPU; the same decoded values through fp32 in the interpreter) equals the FP32 emulation
    bit for bit. (The GPU case carries the ``gpu`` mark, so ``pytest -m gpu`` runs it on the FP8 tensor cores.)"""
    s, s_emul = _probe_s(span, 11 + span, DEV, spanning)
    assert torch.equal(s, s_emul)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("spanning", ["q", "k"])
def test_mx_fp8_embedding_condition_is_tight(spanning):
    """15 binades below: the smallest codes (0.5 -> 2^-10) fall below E4M3's subnormal step 2^-9 and
    S is no longer exact on FP8 tensor cores."""
    s, s_emul = _probe_s(15, 5, DEV, spanning)
    assert not torch.equal(s, s_emul)


# -------------------------------------------------------------------------------------------------
# GPU: the public op vs the reference, every recipe and feature
# -------------------------------------------------------------------------------------------------
GPU_CASES = [
    # recipe, causal, B, hq, hkv, nq, nk, D, dtype, layout, flags
    ("nvfp4", False, 2, 4, 4, 1024, 1024, 128, torch.bfloat16, "bhsd", {}),
    ("nvfp4", True, 2, 4, 2, 1000, 1100, 64, torch.float16, "bshd", {}),
    ("mxfp4", False, 2, 4, 4, 1024, 1024, 128, torch.bfloat16, "bhsd", {}),
    ("mxfp4", True, 1, 8, 2, 777, 1024, 80, torch.bfloat16, "bhsd", {}),
    ("sage3", False, 2, 4, 4, 1024, 1024, 128, torch.bfloat16, "bhsd", {}),
    ("sage3", True, 1, 4, 1, 900, 900, 64, torch.float32, "bshd", {}),
    ("nvfp4", False, 1, 2, 2, 300, 500, 256, torch.bfloat16, "bhsd", {}),
    ("mxfp4", True, 1, 2, 2, 500, 300, 256, torch.bfloat16, "bhsd", {}),  # Nq > Nk: empty rows
    ("nvfp4", False, 1, 4, 2, 512, 512, 128, torch.bfloat16, "bhsd", {"smooth_k": True, "two_level_p": True}),
    ("mxfp4", False, 1, 4, 2, 512, 512, 128, torch.bfloat16, "bhsd", {"smooth_q": True}),
    ("sage3", True, 1, 4, 4, 512, 512, 128, torch.bfloat16, "bhsd", {"smooth_q": False}),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("operands", ["packed", "staged"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}-c{int(c[1])}-{c[2:8]}-{c[9]}-{c[10]}")
def test_gpu_op_vs_reference(case, operands, monkeypatch):
    import fp4attn

    monkeypatch.setenv("FP4ATTN_ATTN_OPERANDS", operands)  # read by the op at call time
    recipe, causal, B, hq, hkv, nq, nk, D, dtype, layout, flags = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=dtype, seed=nq + D)
    args = [t.transpose(1, 2).contiguous() if layout == "bshd" else t for t in (q, k, v)]
    out, lse = fp4attn.attention(*args, causal=causal, recipe=recipe, layout=layout, return_lse=True, **flags)
    assert out.dtype == dtype and out.shape == args[0].shape
    if layout == "bshd":
        out = out.transpose(1, 2)
    spec_check(out.float(), q.float(), k.float(), v.float(), causal=causal, recipe=recipe, flags=flags)
    _, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe=recipe,
                                     return_lse=True, **flags)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=2e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_row_max_pass_tiles(fmt):
    """The Triton row-max pass runs its own tiles (``default_max_config``): the row maxima, hence the outputs,
    are bit-identical to running it with the attention pass's tiles. (On sm_90 the op's nvfp4 passes are the Gluon
    kernels, which take no ``max_config``: the Triton passes are asked for, ``kernel="triton"``.)"""
    q, k, v = make_qkv(2, 4, 2, 1000, 1100, 128, dtype=torch.bfloat16, seed=11)
    pk = A.quantize_qkv(q, k, v, fmt=fmt)
    outs = []
    for mc in (None, A.default_config(128, A.PATH_HOPPER)):
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=True, scale=0.1, two_level_p=False, B=2, Hq=4, Hkv=2, out=out,
                                 online=False, max_config=mc, kernel="triton")
        outs.append((out, lse))
    # the two runs differ: the row-max pass's own tiles are not the attention pass's
    assert A.default_max_config(128, A.PATH_HOPPER, is_mx=fmt == "mxfp4") not in (None, A.default_config(
        128, A.PATH_HOPPER))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_smooth_q_table_chunks(causal, monkeypatch):
    """sage3 with the smooth_q correction table over its size limit (here one query block per chunk):
    bit-identical to the whole table, and SPEC §6 against the reference."""
    import fp4attn

    q, k, v = make_qkv(1, 4, 2, 1000, 1100, 128, dtype=torch.bfloat16, seed=3)
    whole = fp4attn.attention(q, k, v, causal=causal, recipe="sage3", return_lse=True)
    monkeypatch.setenv("FP4ATTN_SMOOTHQ_TABLE_BYTES", "1")
    chunks = fp4attn.attention(q, k, v, causal=causal, recipe="sage3", return_lse=True)
    assert torch.equal(whole[0], chunks[0]) and torch.equal(whole[1], chunks[1])
    spec_check(chunks[0].float(), q.float(), k.float(), v.float(), causal=causal, recipe="sage3")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3"])
def test_gpu_staged_operands(recipe, monkeypatch):
    """Staged K̂/V̂ (tensor-core dtype in global memory) vs the in-register dequantization: same FP4
    values, so the same result up to accumulation order; and the SPEC §6 check. Both through the Triton
    pass (the Gluon pass runs staged operands only, and rounds P̃ at float16 precision: its own test below)."""
    monkeypatch.setenv("FP4ATTN_ATTN_KERNEL", "triton")
    fmt, _, sq, sk, tlp = reference.recipe_flags(recipe)
    q, k, v = make_qkv(2, 4, 2, 1000, 1000, 128, dtype=torch.bfloat16, seed=6)
    kw = dict(causal=True, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp)
    o1, l1 = A.attention_fwd(q, k, v, staged=False, **kw)
    o2, l2 = A.attention_fwd(q, k, v, staged=True, **kw)
    assert rel_l2(o2.float(), o1.float()) < 1e-3
    fin = torch.isfinite(l1)
    assert torch.equal(fin, torch.isfinite(l2))
    torch.testing.assert_close(l2[fin], l1[fin], rtol=0, atol=1e-4)  # the same maxima and sums, summed in other orders
    spec_check(o2.float(), q.float(), k.float(), v.float(), causal=True, recipe=recipe)


GLUON_CASES = [
    # B, hq, hkv, nq, nk, D, causal
    (2, 4, 2, 1000, 1000, 128, False),
    (2, 4, 2, 1000, 1000, 128, True),
    (1, 2, 2, 517, 333, 128, True),  # Nq > Nk: rows that see no key
    (1, 4, 1, 333, 517, 64, True),
    (1, 4, 4, 128, 4096, 128, False),  # many key tiles per program: every ring slot reused
    (1, 2, 2, 70, 70, 128, False),  # fewer key tiles than ring slots
]


def gluon_p16_model(q, k, v, causal, scale):
    """The Gluon pass's numerics in PyTorch (float64 where the kernel's rounding does not matter): the
    pre-pass's NVFP4 Q̂, K̂ (along D) and V̂ (along keys), S = Q̂K̂ᵀ rounded to float32, the row max m of
    S·c (c = scale·log2 e, float32) as the row-max pass forms it, x = S·c − m with one rounding (the fma),
    P̃ = exp2(x) in float32, l = rowsum(P̃), ϕ(P̃) by ``fake_quant_p_f16``'s model in 16-key blocks, O = ϕ(P̃)V̂ / l.
    Rows that see no key: 0 (and NaN-free)."""
    from fp4attn.formats.core import fake_quantize_values
    from p16_model import fake_quant_p_f16_model
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    qf = fake_quantize_values(q.float(), "nvfp4", dim=-1).double()
    kf = fake_quantize_values(k.float(), "nvfp4", dim=-1).double().repeat_interleave(hq // hkv, 1)
    vf = fake_quantize_values(v.float(), "nvfp4", dim=-2).double().repeat_interleave(hq // hkv, 1)
    s32 = (qf @ kf.transpose(-1, -2)).float()
    c = torch.tensor(scale * math.log2(math.e), dtype=torch.float32)
    keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    if causal:
        keep = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] + nk - nq
    m = torch.where(keep, s32 * c, float("-inf")).amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, 0.0)
    x = (s32.double() * c.double() - m.double()).float()
    p = torch.where(keep, torch.exp2(x), 0.0)
    pad = (-nk) % 16
    pq = fake_quant_p_f16_model(torch.nn.functional.pad(p, (0, pad)).cpu()).to(q.device)[..., :nk]
    l_ = p.double().sum(-1, keepdim=True)
    return torch.where(l_ > 0, (pq.double() @ vf) / l_.clamp_min(1e-300), 0.0)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", GLUON_CASES, ids=str)
def test_gpu_gluon_attention_pass(case):
    """The Gluon attention pass (``attention_gluon``: asynchronous wgmma, TMA ring) on the same quantized
    operands and row maxima as the Triton pass.

    - With the float32 P̃ rounding (``P16=False``) against the Triton pass. Not bit-identical: the Gluon
      pass forms S·scale − m with one fma where the Triton pass rounds S·scale first, so a P̃ value on an
      E4M3/E2M1 rounding boundary can take the neighbouring code (measured on the H200: ~1e-5 relative L2,
      0 on most small shapes). The bound 2e-4 is 20x that and ~1000x below the FP4 error itself.
    - The default, float16 P̃ rounding (``fake_quant_p_f16``), against its PyTorch model (``gluon_p16_model``).
      The model and the kernel differ where exp2 (MUFU.EX2 vs PyTorch's, ~2 float32 ulps), the order of the
      QKᵀ sums or a float16 rounding of P̃ moves a value across an E2M1/E4M3 boundary. The float32 rounding
      is ~1e-2 from the model (the float16 steps flip codes); the bound 2e-3 separates the two.
    - ``kernel="auto"`` (what ``fp4attn.attention`` runs) takes the Gluon pass with its defaults."""
    from fp4attn.kernels import attention_gluon as AG
    B, hq, hkv, nq, nk, D, causal = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=torch.bfloat16, seed=nq + nk + D)
    if not A.attention_gluon.supported(is_mx=False, two_level=False, smooth_q=False, staged=True, dp=D,
                                       device=q.device):
        pytest.skip("the Gluon attention pass needs an sm_90 GPU and Triton's Gluon")
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True)
    res = {}
    runs = {"triton": ("triton", None), "gluon": ("gluon", {**AG.DEFAULT, "P16": False}),
            "gluon16": ("gluon", None), "auto": ("auto", None)}
    for name, (kern, cfg) in runs.items():
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=False, B=B, Hq=hq, Hkv=hkv,
                                 out=out, kernel=kern, gluon_config=cfg)
        res[name] = out, lse[:, :, :nq]
    (o_t, l_t), (o_g, l_g), (o_h, l_h) = res["triton"], res["gluon"], res["gluon16"]
    fin = torch.isfinite(l_t)
    assert torch.equal(fin, torch.isfinite(l_g)) and torch.equal(fin, torch.isfinite(l_h))
    assert (~fin).any() == (causal and nq > nk)
    torch.testing.assert_close(l_g[fin], l_t[fin], rtol=0, atol=1e-5)
    torch.testing.assert_close(l_h[fin], l_t[fin], rtol=0, atol=1e-5)  # l sums the unrounded P̃ in both
    assert rel_l2(o_g.float(), o_t.float()) < 2e-4
    assert torch.equal(o_g[~fin], o_t[~fin]) and torch.equal(o_h[~fin], o_t[~fin])  # rows without a key: 0
    model = gluon_p16_model(q, k, v, causal, D ** -0.5)
    e16, e32 = rel_l2(o_h.double(), model), rel_l2(o_g.double(), model)
    assert e16 < 2e-3 and e32 > 2e-3, (e16, e32)
    assert A.attention_gluon.preferred(D)
    assert torch.equal(res["auto"][0], o_h) and torch.equal(res["auto"][1], l_h)

GLUON_FLAGS = {"sage3": (True, True, True), "two_level": (False, False, True), "smooth_q": (True, False, False)}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("flags", list(GLUON_FLAGS), ids=str)
@pytest.mark.parametrize("case", GLUON_CASES, ids=str)
def test_gpu_gluon_two_level_and_smooth_q(case, flags, monkeypatch):
    """The Gluon attention pass with two-level P (sage3: one pass, ``_tiles.two_level_step``, the accumulator
    rescaled before every P·V wgmma) and / or the smooth_q correction (one FP32 table value per key added to
    S·scale in the fma), against the Triton pass on the same quantized operands and correction table.

    Both passes round P̃/s1 at float16 precision for two-level P; for single-level smooth_q (row max from the
    Triton row-max pass) the Gluon pass runs its float32 rounding (``P16=False``), as the Triton pass. They
    differ where a value sits on an E2M1/E4M3 rounding boundary: the Gluon pass adds scale·c to S in one fma
    where the Triton pass rounds S·scale and scale·c first (the single-level test's bound, 2e-4, ~1000x
    below the FP4 error). The LSE sums the unrounded P̃ in both (1e-5). Then SPEC §6 against the reference.
    sage3 also with the correction table one query block at a time (the chunked launches): bit-identical."""
    from fp4attn.kernels import attention_gluon as AG
    B, hq, hkv, nq, nk, D, causal = case
    sq, sk, tlp = GLUON_FLAGS[flags]
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=torch.bfloat16, seed=nq + 3 * nk + D)
    if not A.attention_gluon.supported(is_mx=False, two_level=tlp, smooth_q=sq, staged=True, dp=D, device=q.device):
        pytest.skip("the Gluon attention pass needs an sm_90 GPU and Triton's Gluon")
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, smooth_q=sq, smooth_k=sk)
    res = {}
    for kern, cfg in (("triton", None), ("gluon", None if tlp else {**AG.DEFAULT, "P16": False}), ("auto", None)):
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=tlp, B=B, Hq=hq, Hkv=hkv,
                                 out=out, kernel=kern, gluon_config=cfg)
        res[kern] = out, lse[:, :, :nq]
    (o_t, l_t), (o_g, l_g) = res["triton"], res["gluon"]
    fin = torch.isfinite(l_t)
    assert torch.equal(fin, torch.isfinite(l_g))
    assert (~fin).any() == (causal and nq > nk)
    torch.testing.assert_close(l_g[fin], l_t[fin], rtol=0, atol=1e-5)
    assert rel_l2(o_g.float(), o_t.float()) < 2e-4
    assert torch.equal(o_g[~fin], o_t[~fin])  # rows without a key: 0
    if tlp:  # auto takes the Gluon pass for two-level P (D = 64 and 128)
        assert AG.preferred(D)
        assert torch.equal(res["auto"][0], o_g) and torch.equal(res["auto"][1], l_g)
    if flags == "sage3" and nq > 128:
        monkeypatch.setenv("FP4ATTN_SMOOTHQ_TABLE_BYTES", "1")
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=tlp, B=B, Hq=hq, Hkv=hkv,
                                 out=out, kernel="gluon")
        assert torch.equal(out, o_g) and torch.equal(lse[:, :, :nq], l_g)
    kw = {"smooth_q": sq, "smooth_k": sk, "two_level_p": tlp}
    spec_check(o_g.float(), q.float(), k.float(), v.float(), causal=causal, recipe="nvfp4", flags=kw)


@gpu
@pytest.mark.gpu
def test_gpu_gluon_two_level_wide_score_range():
    """The Gluon two-level pass on key tiles whose maxima jump by up to ~200 binades around the running max
    (the interpreter test's inputs, here with D = 64 and 64-key tiles, the Gluon tiles): finite, and the same as
    the Triton pass (the unit of the accumulator is clamped 64 binades below the running max in both; the
    interpreter test checks that kernel against the reference).

    The jitter of the tile maxima is seeded: it was drawn from the global generator, so the inputs depended on the
    tests run before in the same process. Over 150 draws (H200, fifty-third session) two put the two passes
    9.7e-4 and 1.7e-3 apart (a P̃ code of the dominant tile flipping: the Gluon pass forms S·scale − m in one fma),
    the others below 2e-4; the bound is unchanged."""
    B, hq, nq, D, nk = 1, 2, 100, 64, 6 * 64
    q, k, v = make_qkv(B, hq, hq, nq, nk, D, dtype=torch.float32, seed=5)
    q[..., 0] = 1.0
    k[..., 1:] *= 0.05
    offs = torch.tensor([0.0, -30.0, -80.0, 10.0, -200.0, 5.0], device=q.device).repeat_interleave(64)
    jitter = torch.randn(nk, generator=torch.Generator().manual_seed(5)).to(q.device)
    k[..., 0] = (offs + jitter) / math.log2(math.e)
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
    if not A.attention_gluon.supported(is_mx=False, two_level=True, smooth_q=False, staged=True, dp=D,
                                       device=q.device):
        pytest.skip("the Gluon attention pass needs an sm_90 GPU and Triton's Gluon")
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True)
    res = []
    for kern in ("triton", "gluon"):
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=False, scale=1.0, two_level_p=True, B=B, Hq=hq, Hkv=hq, out=out,
                                 kernel=kern)
        res.append((out, lse[:, :, :nq]))
    assert torch.isfinite(res[1][0]).all() and torch.isfinite(res[1][1]).all()
    assert rel_l2(res[1][0].float(), res[0][0].float()) < 2e-4
    torch.testing.assert_close(res[1][1], res[0][1], rtol=0, atol=1e-5)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [None, {"BLOCK_M": 256, "BLOCK_N": 64, "NS": 3, "Q_REG": False, "num_warps": 8}],
                         ids=["default", "256rows"])
@pytest.mark.parametrize("case", GLUON_CASES, ids=str)
def test_gpu_gluon_row_max_pass(case, cfg, monkeypatch):
    """The row-max pass on the Gluon kernel (``attention_gluon._rowmax_kernel_gl``: asynchronous wgmma, the maxima
    of S scaled once per row) gives the Triton pass's row maxima bit for bit: equal LSEs (m + log l) and outputs,
    with the attention pass on the Gluon kernel in both runs. Also with 256-row programs (Q̂ in shared memory), whose
    last program overhangs the padded query rows; at D = 64 and 128, causal with Nq > Nk, GQA, a single key tile."""
    B, hq, hkv, nq, nk, D, causal = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=torch.bfloat16, seed=nq * 7 + nk + D)
    if not A.attention_gluon.supported(is_mx=False, two_level=False, smooth_q=False, staged=True, dp=D,
                                       device=q.device):
        pytest.skip("the Gluon kernels need an sm_90 GPU and Triton's Gluon")
    pk = A.quantize_qkv(q, k * 2.0, v, fmt="nvfp4", staged=True)  # (scores over a wider range)
    res = []
    for choice in ("triton", "gluon"):
        monkeypatch.setenv("FP4ATTN_ROWMAX_KERNEL", choice)
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=False, B=B, Hq=hq, Hkv=hkv,
                                 out=out, kernel="gluon", gluon_max_config=cfg)
        res.append((out, lse[:, :, :nq]))
    assert torch.equal(res[1][0], res[0][0])
    assert torch.equal(res[1][1], res[0][1])
    assert torch.isfinite(res[0][1]).any()


@gpu
@pytest.mark.gpu
# (not single-level smooth_q: its row max is the Triton pass's, which reads key order only)
@pytest.mark.parametrize("flags", ["nvfp4", "sage3", "two_level"], ids=str)
@pytest.mark.parametrize("case", GLUON_CASES, ids=str)
def test_gpu_gluon_key_order(case, flags):
    """The Gluon passes on operands in their key order (``quantize_qkv(key_perm=True)``: each 16-key block of P̃
    held by one thread) against the same passes on operands in key order. S of every key, its P̃ and the blocks of
    ϕ(P̃) are the same; only the order in which the P·V wgmma and the row sums add the keys differs, so the float32
    outputs agree to float32 rounding (1e-5 relative L2; a wrong key order is O(1) off) and the LSEs to 1e-5.
    Single-level P with its row-max pass and two-level P (sage3: its smooth_q table in that order too); where the op
    runs these passes so (``op_key_perm``), the same bits as the op."""
    B, hq, hkv, nq, nk, D, causal = case
    sq, sk, tlp = GLUON_FLAGS.get(flags, (False, False, False))
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=torch.bfloat16, seed=nq + 5 * nk + D)
    if not A.attention_gluon.supported(is_mx=False, two_level=tlp, smooth_q=sq, staged=True, dp=D, device=q.device):
        pytest.skip("the Gluon attention pass needs an sm_90 GPU and Triton's Gluon")
    assert A.gluon_key_order(True, online=tlp, smooth_q=sq, dp=D) == (flags == "nvfp4" or tlp)
    default = A.op_key_perm(D, fmt="nvfp4", two_level_p=tlp, online=None, smooth_q=sq, staged=True,
                            path=A.PATH_HOPPER, device=q.device)
    assert default == (flags == "nvfp4" or tlp)
    res = []
    for key_perm in (False, True):
        pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, smooth_q=sq, smooth_k=sk, key_perm=key_perm)
        out = torch.empty_like(q, dtype=torch.float32)  # (bf16 outputs would round the float32 differences up)
        lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=tlp, B=B, Hq=hq, Hkv=hkv,
                                 out=out, kernel="gluon")
        res.append((out, lse[:, :, :nq]))
    (o_n, l_n), (o_p, l_p) = res
    fin = torch.isfinite(l_n)
    assert torch.equal(fin, torch.isfinite(l_p))
    torch.testing.assert_close(l_p[fin], l_n[fin], rtol=0, atol=1e-5)
    err = rel_l2(o_p, o_n)
    assert err < 1e-5, err
    assert torch.equal(o_p[~fin], o_n[~fin])
    # in key order ϕ(P̃) is rounded on f16x2 words (``fake_quant_p_words``, the default): the same bits as the float16
    # rounding of the other order (P16=True)
    from fp4attn.kernels import attention_gluon as AG
    o_s = torch.empty_like(out)
    lse_s = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=tlp, B=B, Hq=hq, Hkv=hkv, out=o_s,
                               kernel="gluon", gluon_config={**AG.default_config(A.head_dim_padded(D)), "P16": True})
    assert torch.equal(o_s, o_p) and torch.equal(lse_s[:, :, :nq], l_p)
    if default:  # the op's own run: the same (its LSE refers to the unsmoothed K: + scale·q·k̄, as attention_fwd)
        o, lse = fp4attn.attention(q, k, v, causal=causal, scale=D ** -0.5, recipe="nvfp4", smooth_q=sq,
                                   smooth_k=sk, two_level_p=tlp, return_lse=True)
        assert torch.equal(o, o_p.to(o.dtype))
        assert torch.equal(lse, l_p + D ** -0.5 * pk.qkb[:, :, :nq] if sk else l_p)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["plain", "nonfinite", "strided", "fp32", "fp16", "window_sinks"])
@pytest.mark.parametrize("case", GLUON_CASES + [(1, 8, 2, 300, 777, 96, False), (3, 4, 2, 77, 200, 40, True)],
                         ids=str)  # (head dims padded to 128 / 64)
def test_gpu_gluon_row_max_pass_quantizes_q(case, variant):
    """``quantize_qkv(q_fused=True, v_fused=True)`` (``fp4attn.attention`` for single-level nvfp4 in key order with
    ``attention.Q_FUSED`` / ``V_FUSED``): the Gluon row-max pass runs Q's and V's pre-passes itself
    (``attention_gluon._quantize_q`` / ``_quantize_v``, the shared ``quant_rows`` encoder), each alone and both. After
    the passes, Q's packed codes, scale bytes and per-row non-finite flags, the staged V̂ᵀ (in key order) and the K / V
    flags are those of the separate pre-passes bit for bit (those are checked field by field against the PyTorch
    statement in ``test_attention_prepass.py``), and so are the outputs and LSEs; both fused, also with the pass's first
    K̂ loads issued before Q is quantized (``K_FIRST``). Variants: NaN / ±Inf / all-zero Q rows and NaN / Inf in V, Q
    and V rows with a stride (bshd tensors seen as bhsd), float32 and float16 inputs, a sliding window with sinks (its
    per-key flags); head dims 64 and 128 and padded ones (96, 40)."""
    B, hq, hkv, nq, nk, D, causal = case
    dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(variant, torch.bfloat16)
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=dtype, seed=nq + 11 * nk + D)
    dp = A.head_dim_padded(D)
    if not A.attention_gluon.supported(is_mx=False, two_level=False, smooth_q=False, staged=True, dp=dp,
                                       device=q.device):
        pytest.skip("the Gluon kernels need an sm_90 GPU and Triton's Gluon")
    q = q * 3.0
    if variant == "nonfinite":
        q[0, hq - 1, nq // 2, D // 3] = float("nan")
        q[B - 1, 0, nq - 1, 0] = float("-inf")
        q[0, 0, 3:9, :] = 0.0
        v[0, hkv - 1, nk // 3, 5] = float("nan")
        v[B - 1, 0, nk - 1, D - 1] = float("inf")
    if variant == "strided":
        q, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, v))
        assert not q.is_contiguous() and not v.is_contiguous()
    window = sinks = None
    if variant == "window_sinks":
        window = (100, 0) if causal else (100, 37)
        sinks = torch.randn(hq, device=q.device)
    res = []
    for q_fused, v_fused, k_first in ((False, False, False), (True, False, False), (False, True, False),
                                      (True, True, False), (True, True, True)):
        pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, key_perm=True, key_rows=window is not None,
                            q_fused=q_fused, v_fused=v_fused)
        assert (pk.q_in is not None) == q_fused and (pk.v_in is not None) == v_fused
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, causal=causal, scale=D ** -0.5, two_level_p=False, B=B, Hq=hq, Hkv=hkv, out=out,
                                 kernel="gluon", window=window, sinks=sinks,
                                 gluon_max_config={**A.attention_gluon.ROWMAX_CONFIGS[dp], "K_FIRST": k_first})
        res.append((pk.qc, pk.qs.view(torch.uint8), pk.qbad, pk.vh, pk.kvbad, out, lse))
    for fused in res[1:]:
        for name, a, b in zip(("qc", "qs", "qbad", "vh", "kvbad", "out", "lse"), res[0], fused):
            assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                         and torch.equal(a.nan_to_num(), b.nan_to_num())), name
    assert res[0][2].any() == (variant == "nonfinite") and res[0][4].any() == (variant == "nonfinite")
    if variant == "plain":  # the op's own run, whichever way its defaults run the pre-passes
        o = fp4attn.attention(q, k, v, causal=causal, scale=D ** -0.5, recipe="nvfp4")
        assert torch.equal(o, res[0][5])


def test_fused_prepasses_need_key_order_without_smoothing():
    """``quantize_qkv(q_fused=True)`` / ``v_fused`` leave Q / V to the Gluon row-max pass, which runs on NVFP4 operands
    in its key order without smoothing: other requests are refused."""
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, device="cpu")
    for kw in ({}, {"key_perm": True, "smooth_k": True}, {"key_perm": True, "smooth_q": True, "smooth_k": True}):
        for flag in ("q_fused", "v_fused"):
            with pytest.raises(ValueError, match=flag):
                A.quantize_qkv(q, k, v, fmt="nvfp4", path=A.PATH_INTERP, staged=True, **{flag: True}, **kw)


def test_key_order_operands_only_on_the_gluon_passes():
    """Operands in the Gluon passes' key order are refused by the Triton passes (their masks and P̃ blocks take
    keys in order), and only staged NVFP4 operands can be written so."""
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, device="cpu")
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", path=A.PATH_INTERP, staged=True, key_perm=True)
    kw = dict(causal=False, scale=0.125, two_level_p=False, B=1, Hq=2, Hkv=2, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="key_perm"):
        A.attention_packed(pk, **kw)
    with pytest.raises(ValueError, match="key_perm"):
        A.quantize_qkv(q, k, v, fmt="mxfp4", path=A.PATH_INTERP, staged=True, key_perm=True)
    with pytest.raises(ValueError, match="key_perm"):
        A.quantize_qkv(q, k, v, fmt="nvfp4", path=A.PATH_INTERP, staged=False, key_perm=True)


def test_rowmax_kernel_choice(monkeypatch):
    """``FP4ATTN_ROWMAX_KERNEL`` picks the row-max pass's kernel where the attention pass is the Gluon one (auto: the
    Gluon kernel at D = 64 and 128) and is validated."""
    ag = A.attention_gluon
    monkeypatch.delenv("FP4ATTN_ROWMAX_KERNEL", raising=False)
    assert ag.rowmax_preferred(128) and ag.rowmax_preferred(64) and not ag.rowmax_preferred(256)
    monkeypatch.setenv("FP4ATTN_ROWMAX_KERNEL", "triton")
    assert not ag.rowmax_preferred(128)
    monkeypatch.setenv("FP4ATTN_ROWMAX_KERNEL", "gluon")
    assert ag.rowmax_preferred(128)
    monkeypatch.setenv("FP4ATTN_ROWMAX_KERNEL", "cuda")
    with pytest.raises(ValueError, match="FP4ATTN_ROWMAX_KERNEL"):
        ag.rowmax_preferred(128)


def test_bench_reports_gluon_passes(monkeypatch):
    """``fp4attn bench attention`` times the recipes that run on the Gluon kernels once, as "gluon", instead of
    sweeping Triton configs those kernels do not use: staged nvfp4 and sage3 (D = 64, 128) on an sm_90
    device, not the packed, online or mxfp4 rows, nor with FP4ATTN_ATTN_KERNEL=triton, nor on sm_100."""
    from fp4attn.bench.attention import runs_gluon
    from fp4attn.ops import _dispatch
    if not A.attention_gluon.HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    monkeypatch.delenv("FP4ATTN_ATTN_KERNEL", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_dispatch, "capability", lambda device=None: (9, 0))
    monkeypatch.setattr(A, "_interpret", lambda: False)  # (the bench's path is the GPU's)
    assert all(runs_gluon(r, d) for r in ("nvfp4-staged", "sage3-staged") for d in (64, 128))
    assert not any(runs_gluon(r, 128) for r in ("nvfp4", "sage3", "mxfp4-staged", "nvfp4-online-staged"))
    assert not runs_gluon("sage3-staged", 256) and not runs_gluon("nvfp4-staged", 256)
    monkeypatch.setenv("FP4ATTN_ATTN_KERNEL", "triton")
    assert not runs_gluon("nvfp4-staged", 128)
    monkeypatch.setattr(_dispatch, "capability", lambda device=None: (10, 0))
    monkeypatch.delenv("FP4ATTN_ATTN_KERNEL")
    assert not runs_gluon("nvfp4-staged", 128)


def test_gluon_attention_kernel_choice_errors(monkeypatch):
    """``kernel`` is validated; "gluon" where the Gluon pass cannot run (CPU tensors, mxfp4 / two-level /
    smooth_q, online softmax) raises instead of silently running the Triton pass."""
    q, k, v = make_qkv(1, 2, 2, 64, 64, 64, device="cpu")
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", path=A.PATH_INTERP)
    kw = dict(causal=False, scale=0.125, two_level_p=False, B=1, Hq=2, Hkv=2, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="kernel: expected"):
        A.attention_packed(pk, kernel="cuda", **kw)
    with pytest.raises(ValueError, match="kernel='gluon'"):
        A.attention_packed(pk, kernel="gluon", **kw)
    # what the Gluon pass takes on an sm_90 GPU (its capability as if the device were one): NVFP4 on staged operands
    # at padded head dims 64 and 128, not MXFP4, not packed operands, not other head dims
    from fp4attn.ops import _dispatch

    monkeypatch.setattr(_dispatch, "capability", lambda device: (9, 0))
    cuda = torch.device("cuda", 0)
    ok = dict(is_mx=False, two_level=False, smooth_q=False, staged=True, dp=128, device=cuda)
    if A.attention_gluon.HAVE_GLUON:
        assert A.attention_gluon.supported(**ok) and A.attention_gluon.supported(**{**ok, "dp": 64})
        assert A.attention_gluon.supported(**{**ok, "two_level": True, "smooth_q": True})
    for bad in ({"is_mx": True}, {"staged": False}, {"dp": 256}, {"dp": 32}, {"device": torch.device("cpu")}):
        assert not A.attention_gluon.supported(**{**ok, **bad}), bad


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["mxfp4", "sage3"])
def test_gpu_blackwell_path_logic(recipe):
    """The ``tl.dot_scaled`` path (packed codes + scale bytes, P̃ re-quantized to codes in registers).
    On Hopper Triton emulates MXFP4 dot_scaled (bf16 upcast), so the path's logic runs for mxfp4;
    NVFP4 (E4M3 scales) has no emulation on sm_90 and is covered by the PTX test only."""
    if torch.cuda.get_device_capability()[0] >= 10:
        pytest.skip("native Blackwell: covered by test_gpu_op_vs_reference")
    flags = {"two_level_p": True, "smooth_q": True, "smooth_k": True} if recipe == "sage3" else {}
    q, k, v = make_qkv(1, 4, 2, 700, 900, 128, dtype=torch.bfloat16, seed=5)
    out, _ = A.attention_fwd(q, k, v, causal=True, fmt="mxfp4", path=A.PATH_BLACKWELL, **flags)
    spec_check(out.float(), q.float(), k.float(), v.float(), causal=True, recipe="mxfp4", flags=flags)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_online_softmax_error(fmt):
    """One-pass online softmax (the faster variant): its FP4 error vs exact attention stays within
    1.05x the reference's even though it is not bit-compatible with the one-shot P̃."""
    q, k, v = make_qkv(2, 4, 4, 2048, 2048, 128, dtype=torch.bfloat16, seed=9)
    out, _ = A.attention_fwd(q, k, v, fmt=fmt, online=True)
    qd, kd, vd = q.double(), k.double(), v.double()
    ref = reference.attention(qd, kd, vd, recipe=fmt)
    exact = reference.attention(qd, kd, vd, recipe="bf16")
    assert rel_l2(out.float(), exact) <= 1.05 * rel_l2(ref, exact)
    assert cosine(out.float(), ref) >= 0.99


@gpu
@pytest.mark.gpu
def test_gpu_bf16_recipe_and_determinism():
    import fp4attn

    q, k, v = make_qkv(2, 4, 2, 512, 512, 64, dtype=torch.bfloat16, seed=2)
    out = fp4attn.attention(q, k, v, causal=True, recipe="bf16")
    ref = reference.attention(q.double(), k.double(), v.double(), causal=True, recipe="bf16")
    assert rel_l2(out.float(), ref) < 0.01
    a = fp4attn.attention(q, k, v, recipe="nvfp4")
    b = fp4attn.attention(q, k, v, recipe="nvfp4")
    assert torch.equal(a, b)
    assert math.isfinite(a.float().sum().item())


NAN_GPU_CASES = [
    # recipe, causal, B, hq, hkv, nq, nk, D, dtype, layout, flags
    ("nvfp4", False, 2, 4, 2, 700, 900, 128, torch.bfloat16, "bhsd", {}),
    ("nvfp4", True, 2, 4, 2, 900, 700, 64, torch.float16, "bshd", {}),  # Nq > Nk: rows that see no key
    ("mxfp4", True, 1, 8, 2, 777, 1024, 80, torch.bfloat16, "bhsd", {}),
    ("sage3", True, 2, 4, 2, 700, 700, 128, torch.bfloat16, "bhsd", {}),
    ("sage3", False, 1, 4, 1, 300, 500, 256, torch.bfloat16, "bshd", {}),
    ("nvfp4", False, 1, 4, 2, 512, 512, 128, torch.bfloat16, "bhsd", {"smooth_k": True, "two_level_p": True}),
    ("mxfp4", False, 1, 4, 2, 512, 640, 128, torch.float32, "bhsd", {"smooth_q": True}),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("bad", ["q", "k", "v", "qkv"])
@pytest.mark.parametrize("operands", ["packed", "staged"])
@pytest.mark.parametrize("case", NAN_GPU_CASES, ids=lambda c: f"{c[0]}-c{int(c[1])}-{c[2:8]}-{c[9]}-{c[10]}")
def test_gpu_nan_pattern_matches_reference(case, operands, bad, monkeypatch):
    """The public op on CUDA with NaN/±Inf in q, k or v: NaN exactly where the (NaN-propagating)
    reference has NaN, in the output and the LSE; the finite part within SPEC §6."""
    import fp4attn

    monkeypatch.setenv("FP4ATTN_ATTN_OPERANDS", operands)
    recipe, causal, B, hq, hkv, nq, nk, D, dtype, layout, flags = case
    q, k, v = poison(*make_qkv(B, hq, hkv, nq, nk, D, dtype=dtype, seed=nq + D), bad)
    args = [t.transpose(1, 2).contiguous() if layout == "bshd" else t for t in (q, k, v)]
    out, lse = fp4attn.attention(*args, causal=causal, recipe=recipe, layout=layout, return_lse=True, **flags)
    if layout == "bshd":
        out = out.transpose(1, 2)
    ref, ref_lse = nan_reference(q.cpu(), k.cpu(), v.cpu(), causal=causal, recipe=recipe, **flags)
    assert torch.isnan(ref).any()
    check_nan_pattern(out.float().cpu(), lse.cpu(), ref, ref_lse, tol=0.05, lse_atol=2e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["online-nvfp4", "online-mxfp4", "blackwell-mxfp4", "blackwell-sage3"])
@pytest.mark.parametrize("bad", ["q", "k", "v", "qkv"])
def test_gpu_nan_pattern_other_paths(variant, bad):
    """The same on the one-pass online softmax and on the ``tl.dot_scaled`` path (emulated by Triton
    on Hopper for MXFP4): the flags are applied in the shared epilogue. (Online softmax is not
    bit-compatible with the one-shot reference: ~0.05 / ~0.12 relative L2 for nvfp4 / mxfp4, see
    ``test_gpu_online_softmax_error``; only its NaN pattern is checked tightly.)"""
    kind, recipe = variant.split("-")
    flags = {"two_level_p": True, "smooth_q": True, "smooth_k": True} if recipe == "sage3" else {}
    fmt = "nvfp4" if recipe == "nvfp4" else "mxfp4"
    if kind == "blackwell" and torch.cuda.get_device_capability()[0] >= 10:
        pytest.skip("native Blackwell: covered by test_gpu_nan_pattern_matches_reference")
    kw = {"online": True} if kind == "online" else {"path": A.PATH_BLACKWELL}
    q, k, v = poison(*make_qkv(1, 4, 2, 700, 900, 128, dtype=torch.bfloat16, seed=5), bad)
    out, lse = A.attention_fwd(q, k, v, causal=True, fmt=fmt, smooth_q=flags.get("smooth_q", False),
                               smooth_k=flags.get("smooth_k", False), two_level_p=flags.get("two_level_p", False),
                               **kw)
    ref, ref_lse = nan_reference(q.cpu(), k.cpu(), v.cpu(), causal=True, recipe=fmt, **flags)
    check_nan_pattern(out.float().cpu(), lse.cpu(), ref, ref_lse, tol=0.25 if kind == "online" else 0.05,
                      lse_atol=2e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3", "bf16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gpu_unaligned_strided_views_equal_contiguous(recipe, layout):
    """Inputs as callers slice them from a packed or padded projection: last dim contiguous, data
    pointer 8 bytes off a 16-byte boundary, row stride D + 8. Every recipe must give the bits it gives
    on contiguous copies. (The bf16 recipe passed such views to SDPA, which does not check the pointer:
    NaN from its default dispatch and "misaligned address" faults from its fused kernels, found by the
    fourteenth session's fuzz.)"""
    import fp4attn

    B, H, N, D = 2, 4, 129, 64
    g = torch.Generator(device="cuda").manual_seed(3)

    def view():
        full = torch.full((B, N, H, D + 8), float("nan"), device="cuda", dtype=torch.bfloat16)
        full[..., 4:4 + D] = torch.randn(B, N, H, D, device="cuda", generator=g).bfloat16()
        x = full[..., 4:4 + D]  # (B, N, H, D)
        return x if layout == "bshd" else x.transpose(1, 2)

    q, k, v = view(), view(), view()
    assert q.data_ptr() % 16 == 8
    for causal in (False, True):
        got = fp4attn.attention(q, k, v, causal=causal, recipe=recipe, layout=layout)
        want = fp4attn.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, recipe=recipe,
                                 layout=layout)
        assert not got.isnan().any()
        assert torch.equal(got, want)
