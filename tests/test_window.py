"""Sliding-window attention: ``fp4attn.attention(..., window_size=(left, right))``.

FlashAttention's convention: query i, at position p = i + Nk − Nq (bottom-right aligned, as ``causal``),
sees key j iff p − left <= j <= p + right (-1 / None: that side unbounded; ``causal`` bounds the right side
at p). Quantization is unchanged by the window: V and P̃ are quantized in blocks along all Nk keys (masked
P̃ entries are 0).

CPU: the reference's mask and semantics against independent float64 computations, argument validation,
and the Triton kernel under ``TRITON_INTERPRET=1`` (tiles skipped / masked by the window's edges) against
the float64 reference, NaN/±Inf patterns included (a non-finite key row reaches exactly the rows whose
window holds it). GPU (``-m gpu``, ``TRITON_INTERPRET=0``): the public op vs the reference, the NaN pattern
on the compiled kernel, and ``opcheck`` of the custom op's window arguments.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import zlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import reference  # noqa: E402
from fp4attn.kernels import attention as A  # noqa: E402
from fp4attn.ops._validate import check_window  # noqa: E402
from fp4attn.reference.common import normalize_window, window_keep  # noqa: E402

# helpers of the kernel tests (tests/ is on sys.path under pytest's default rootdir import mode)
from test_attention_kernels import (  # noqa: E402
    INF,
    NAN,
    check_nan_pattern,
    cosine,
    cpu_interp,
    gpu,
    make_qkv,
    nan_reference,
    poison,
    rel_l2,
    spec_check,
)


def hand_mask(nq, nk, causal, window):
    """(nq, nk) bool visibility written out element by element from the definition (raw window_size:
    None / -1 = unbounded), independent of ``window_keep``."""
    left, right = window if window is not None else (None, None)
    rows = []
    for i in range(nq):
        p = i + nk - nq
        row = []
        for j in range(nk):
            ok = not (causal and j > p)
            if left is not None and left >= 0 and j < p - left:
                ok = False
            if right is not None and right >= 0 and j > p + right:
                ok = False
            row.append(ok)
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool).reshape(nq, nk)


def skipped_key_tiles(nq, nk, window, tile=64):
    """(query tile, key tile) pairs whose keys all lie before the window of every row of the query tile
    (its first row's left edge p − left): the tiles the kernel never loads."""
    if window[0] is None or window[0] < 0:
        return []
    return [(m0, n0) for m0 in range(0, nq, tile) for n0 in range(0, nk, tile)
            if n0 + tile <= m0 + nk - nq - window[0]]


def kernel(q, k, v, *, causal, window, recipe, flags=None, **opts):
    """The interpreter kernel with a recipe's flags and a raw ``window_size`` (normalized here)."""
    fmt, _, sq, sk, tlp = reference.recipe_flags(recipe, **(flags or {}))
    return A.attention_fwd(q, k, v, causal=causal, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp,
                           path=A.PATH_INTERP, window=normalize_window(window, causal), **opts)


# -------------------------------------------------------------------------------------------------
# reference semantics (CPU)
# -------------------------------------------------------------------------------------------------
_T, _F = True, False
KEEP_LITERALS = [
    # nq, nk, causal, window_size, the mask written out
    (3, 5, True, (1, None), [[_F, _T, _T, _F, _F],  # p = 2, 3, 4: keys p - 1 .. p
                             [_F, _F, _T, _T, _F],
                             [_F, _F, _F, _T, _T]]),
    (5, 3, True, (0, 0), [[_F, _F, _F],  # Nq > Nk: p = -2 .. 2, the diagonal only; rows 0, 1 see nothing
                          [_F, _F, _F],
                          [_T, _F, _F],
                          [_F, _T, _F],
                          [_F, _F, _T]]),
    (4, 4, False, (1, 2), [[_T, _T, _T, _F],  # two-sided: keys p - 1 .. p + 2
                           [_T, _T, _T, _T],
                           [_F, _T, _T, _T],
                           [_F, _F, _T, _T]]),
    (4, 2, False, (-1, 0), [[_F, _F],  # right edge only at p: the causal mask (p = -2 .. 1)
                            [_F, _F],
                            [_T, _F],
                            [_T, _T]]),
    (2, 6, False, (2, -1), [[_F, _F, _T, _T, _T, _T],  # Nq < Nk, left edge only: p = 4, 5
                            [_F, _F, _F, _T, _T, _T]]),
]


@pytest.mark.parametrize("case", KEEP_LITERALS, ids=lambda c: f"{c[0]}x{c[1]}-c{int(c[2])}-w{c[3]}")
def test_window_keep_literal_masks(case):
    nq, nk, causal, window, want = case
    keep = window_keep(0, nq, nq, nk, causal, normalize_window(window, causal), "cpu")
    assert torch.equal(keep, torch.tensor(want))
    assert torch.equal(hand_mask(nq, nk, causal, window), torch.tensor(want))  # (the helper agrees)


_WINDOWS = [(0, 0), (7, None), (7, -1), (None, 5), (3, 11), (100, 0), (-1, -1)]


@pytest.mark.parametrize("nq,nk", [(40, 40), (25, 60), (60, 25)])
@pytest.mark.parametrize("causal,window", [(c, w) for c in (False, True) for w in _WINDOWS
                                           if not c or w[1] in (None, -1, 0)], ids=str)
def test_window_keep_matches_definition(nq, nk, causal, window):
    """Every (row chunk, shape, window): window_keep == the element-wise definition; None only when every
    key is visible."""
    want = hand_mask(nq, nk, causal, window)
    norm = normalize_window(window, causal)
    for r0, r1 in [(0, nq), (0, 7), (7, nq - 3), (nq - 1, nq)]:
        keep = window_keep(r0, r1, nq, nk, causal, norm, "cpu")
        if keep is None:
            assert want.all()
        else:
            assert torch.equal(keep, want[r0:r1])


def test_normalize_window_and_sliding_window_convention():
    assert normalize_window(None, False) is None
    assert normalize_window((None, None), False) is None and normalize_window((-1, -1), True) is None
    assert normalize_window((None, 0), True) is None  # plain causal
    assert normalize_window((5, None), True) == (5, 0) and normalize_window((5, -1), True) == (5, 0)
    assert normalize_window((3, None), False) == (3, -1) and normalize_window((-1, 3), False) == (-1, 3)
    assert normalize_window((-1, 0), False) == (-1, 0)  # not causal's None: the flag says causal=False
    # transformers' sliding_window=w: key j visible from position p iff p - w < j <= p: w keys per row
    w, n = 8, 30
    keep = window_keep(0, n, n, n, True, normalize_window((w - 1, 0), True), "cpu")
    assert torch.equal(keep.sum(-1), torch.clamp(torch.arange(n) + 1, max=w))
    j, p = torch.arange(n)[None, :], torch.arange(n)[:, None]
    assert torch.equal(keep, (p - w < j) & (j <= p))


def exact_windowed(q, k, v, mask, scale):
    """Softmax attention in float64 with an explicit bool mask (GQA by repeat): rows without a visible key
    give 0 and LSE -inf."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (scale * q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.where(mask.any(-1, keepdim=True), torch.softmax(s, dim=-1), 0.0)
    return p @ v, lse


@pytest.mark.parametrize("case", [
    # causal, window_size, B, hq, hkv, nq, nk, D
    (True, (3, 0), 1, 2, 2, 20, 20, 16),
    (False, (2, 5), 2, 2, 1, 30, 12, 8),  # Nq > Nk: rows 0..12 see no key (p + 5 < 0)
    (False, (-1, 1), 1, 1, 1, 15, 25, 8),
    (False, (4, None), 1, 4, 2, 10, 40, 16),  # Nq < Nk, GQA
    (True, (0, None), 1, 1, 1, 12, 9, 8),  # the diagonal only; Nq > Nk
], ids=str)
def test_bf16_reference_with_window_is_exact_masked_attention(case):
    causal, window, B, hq, hkv, nq, nk, D = case
    q, k, v = (t.double() for t in make_qkv(B, hq, hkv, nq, nk, D, seed=zlib.crc32(repr(case).encode()) % 1000,
                                             device="cpu"))
    mask = hand_mask(nq, nk, causal, window)
    want, want_lse = exact_windowed(q, k, v, mask, D ** -0.5)
    out, lse = reference.attention(q, k, v, causal=causal, recipe="bf16", window_size=window, return_lse=True)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    empty = ~mask.any(-1)
    torch.testing.assert_close(lse[..., ~empty], want_lse[..., ~empty], rtol=1e-12, atol=1e-12)
    assert (lse[..., empty] == float("-inf")).all() and (out[..., empty, :] == 0).all()
    if window[1] == 5:
        assert empty.sum() == 13


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3"])
@pytest.mark.parametrize("nq,nk", [(50, 70), (70, 50)])
def test_covering_window_equals_no_window(recipe, nq, nk):
    """The smallest windows that cover every key (causal: left = Nk − 1; two-sided: Nk − 1 and Nq − 1)
    give bit-identical outputs and LSE to no window; one key less on either side does not."""
    q, k, v = (t.double() for t in make_qkv(1, 2, 1, nq, nk, 32, seed=nq, device="cpu"))

    def ref(causal, window):
        return reference.attention(q, k, v, causal=causal, recipe=recipe, window_size=window, return_lse=True)

    for causal, covering, smaller in [(True, [(nk - 1, 0), (nk + 1000, None)], [(nk - 2, 0)]),
                                      (False, [(nk - 1, nq - 1), (10**9, 10**9)], [(nk - 2, nq - 1),
                                                                                   (nk - 1, nq - 2)])]:
        base = ref(causal, None)
        for w in covering:
            got = ref(causal, w)
            assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1]), w
        for w in smaller:
            assert not torch.equal(ref(causal, w)[0], base[0]), w


def test_non_causal_right_edge_zero_is_causal():
    q, k, v = (t.double() for t in make_qkv(1, 2, 1, 40, 60, 16, seed=2, device="cpu"))
    for recipe in ("nvfp4", "sage3"):
        a = reference.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
        b = reference.attention(q, k, v, causal=False, recipe=recipe, window_size=(-1, 0), return_lse=True)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("recipe", ["nvfp4", "sage3"])
@pytest.mark.parametrize("nq,nk,left", [(100, 100, 37), (40, 64, 40), (130, 70, 10)])
def test_rows_inside_window_equal_plain_causal(recipe, nq, nk, left):
    """Quantization blocks are those of the whole sequence (V along all keys, P̃ rows with masked zeros;
    sage3's q̄ / k̄ / two-level tiles too), so a query row whose causal key range already lies inside its
    window (p − left <= 0) gives exactly plain causal's output and LSE; every other row sees fewer keys
    and differs."""
    q, k, v = (t.double() for t in make_qkv(1, 2, 1, nq, nk, 32, seed=left, device="cpu"))
    out_c, lse_c = reference.attention(q, k, v, causal=True, recipe=recipe, return_lse=True)
    out_w, lse_w = reference.attention(q, k, v, causal=True, recipe=recipe, window_size=(left, 0), return_lse=True)
    inside = torch.arange(nq) + nk - nq - left <= 0
    assert inside.any() and (~inside).any()
    assert torch.equal(out_w[:, :, inside], out_c[:, :, inside])
    assert torch.equal(lse_w[:, :, inside], lse_c[:, :, inside])
    assert (out_w[:, :, ~inside] != out_c[:, :, ~inside]).any(-1).all()
    assert (lse_w[:, :, ~inside] != lse_c[:, :, ~inside]).all()


# -------------------------------------------------------------------------------------------------
# validation (the public op on CPU runs the reference)
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window,causal,exc", [
    (5, False, TypeError),
    ((1,), False, TypeError),
    ((1, 2, 3), False, TypeError),
    ("ab", False, TypeError),
    ((1.5, 0), False, TypeError),
    ((0, 2.0), False, TypeError),
    ((True, 0), False, TypeError),
    ((0, False), True, TypeError),
    ((-2, 0), False, ValueError),
    ((3, -5), False, ValueError),
    ((4, 2), True, ValueError),
], ids=str)
def test_window_size_validation(window, causal, exc):
    q, k, v = make_qkv(1, 2, 1, 8, 8, 16, device="cpu")
    with pytest.raises(exc, match="window_size"):
        fp4attn.attention(q, k, v, causal=causal, window_size=window)


def test_window_size_accepted_forms():
    """(None, None) and (-1, -1) are no window and (-1, 0)/(None, 0) with causal plain causal, bit for
    bit; any Integral (numpy too) and a list are accepted; check_window returns the normal form."""
    q, k, v = make_qkv(1, 2, 1, 30, 40, 16, device="cpu")
    for causal in (False, True):
        base = fp4attn.attention(q, k, v, causal=causal, return_lse=True)
        for w in [(None, None), (-1, -1), [-1, None]] + ([(-1, 0), (None, 0)] if causal else []):
            got = fp4attn.attention(q, k, v, causal=causal, window_size=w, return_lse=True)
            assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1]), w
    a = fp4attn.attention(q, k, v, causal=True, window_size=(np.int64(5), 0))
    b = fp4attn.attention(q, k, v, causal=True, window_size=[5, -1])
    c = fp4attn.attention(q, k, v, causal=True)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert check_window((5, None), True) == (5, 0) and check_window((None, 3), False) == (-1, 3)
    assert check_window((-1, -1), False) is None and check_window(None, True) is None


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_window_bshd_layout(recipe):
    """bshd inputs give the bhsd bits, transposed. (sage3 is left out: its float32 means over the strided
    views differ from the contiguous ones by ~1e-7 with or without a window.)"""
    q, k, v = make_qkv(2, 4, 2, 33, 47, 16, device="cpu")
    for causal, w in [(True, (9, 0)), (False, (5, 12))]:
        out, lse = fp4attn.attention(q, k, v, causal=causal, window_size=w, recipe=recipe, return_lse=True)
        ob, lb = fp4attn.attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), causal=causal,
                                   window_size=w, recipe=recipe, layout="bshd", return_lse=True)
        assert ob.shape == (2, 33, 4, 16)
        assert torch.equal(ob.transpose(1, 2), out) and torch.equal(lb, lse)
        assert not torch.equal(out, fp4attn.attention(q, k, v, causal=causal, recipe=recipe))


# -------------------------------------------------------------------------------------------------
# interpreter kernel vs the float64 reference
# -------------------------------------------------------------------------------------------------
WINDOW_CASES = [
    # recipe, causal, window_size, B, hq, hkv, nq, nk, D, flags, kernel options
    ("nvfp4", True, (20, 0), 1, 2, 1, 150, 150, 32, {}, {}),  # window inside one 64-key tile; GQA
    ("nvfp4", True, (100, 0), 1, 2, 2, 130, 190, 40, {}, {}),  # window wider than a tile; Nq < Nk
    ("mxfp4", True, (0, 0), 1, 1, 1, 100, 100, 16, {}, {}),  # left = 0: the diagonal only
    ("nvfp4", True, (10, 0), 1, 2, 1, 150, 60, 32, {}, {}),  # Nq > Nk: rows that see no key
    ("mxfp4", False, (30, 40), 2, 2, 1, 160, 70, 32, {}, {}),  # two-sided; Nq > Nk: rows 0..49 see no key
    ("nvfp4", False, (-1, 10), 1, 2, 1, 180, 70, 32, {}, {}),  # right edge only; rows 0..99 see no key
    ("sage3", False, (50, -1), 1, 2, 1, 70, 190, 40, {}, {}),  # left edge only, Nq < Nk
    ("sage3", True, (70, 0), 1, 2, 2, 150, 150, 64, {}, {}),  # smooth_q: two q̄ blocks, the second ragged
    ("mxfp4", False, (40, 25), 1, 2, 1, 100, 100, 64, {"two_level_p": True}, {}),
    ("nvfp4", True, (63, 0), 1, 2, 1, 100, 100, 48, {}, {"staged": False}),  # packed operands
    ("nvfp4", False, (64, 64), 1, 3, 1, 70, 200, 16, {"smooth_k": True}, {}),  # MQA, smooth_k
    ("sage3", False, (5, 130), 1, 2, 1, 200, 140, 32, {"smooth_q": False}, {"staged": False}),
]


def _case_id(c):
    return f"{c[0]}-c{int(c[1])}-w{c[2][0]},{c[2][1]}-{c[3:9]}-{c[9]}-{c[10]}"


@cpu_interp
@pytest.mark.parametrize("case", WINDOW_CASES, ids=_case_id)
def test_interpreter_window_vs_reference(case):
    """As ``test_interpreter_vs_reference``: with the exact row max (or two-level P) the kernel makes the
    reference's quantization decisions, so only FP32-vs-float64 rounding remains (rel L2 <= 1e-3); the LSE
    is finite exactly where the reference's is (rows that see a key) and within 1e-4; rows that see no key
    are 0 / -inf."""
    recipe, causal, window, B, hq, hkv, nq, nk, D, flags, opts = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, seed=zlib.crc32(repr(case[:9]).encode()) % 1000)
    out, lse = kernel(q, k, v, causal=causal, window=window, recipe=recipe, flags=flags, **opts)
    spec_check(out, q, k, v, causal=causal, window=window, recipe=recipe, flags=flags, tight=1e-3)
    _, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe=recipe,
                                     window_size=window, return_lse=True, **flags)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=1e-4)
    empty = ~hand_mask(nq, nk, causal, window).any(-1)
    assert torch.equal(~fin, empty.expand(B, hq, nq))
    assert (out[:, :, empty] == 0).all()


def test_window_cases_cover_the_tile_logic():
    """The case list reaches every branch of the window's tile loop (64x64 interpreter tiles): rows that
    see no key, key tiles skipped below the window, tiles its left edge crosses, fully visible tiles
    inside it."""
    kinds = set()
    for case in WINDOW_CASES:
        causal, window, nq, nk = case[1], case[2], case[6], case[7]
        m = hand_mask(nq, nk, causal, window)
        if (~m.any(-1)).any():
            kinds.add("empty rows")
        if skipped_key_tiles(nq, nk, window):
            kinds.add("skipped")
        for m0 in range(0, nq, 64):
            for n0 in range(0, nk, 64):
                t = m[m0:m0 + 64, n0:n0 + 64]
                seen = t.any(-1)
                if t.all():
                    kinds.add("full")
                elif (seen & (t.int().argmax(-1) > 0)).any():  # a row's first visible key is not the tile's first
                    kinds.add("left edge")
    assert kinds == {"empty rows", "skipped", "full", "left edge"}


@cpu_interp
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_interpreter_window_online_softmax(fmt):
    """One-pass online softmax with a window. Its early tiles' P̃ is quantized against a smaller running
    max, so it is not bit-compatible with the one-shot reference (``test_interpreter_online_softmax``:
    ~0.05 / ~0.12 relative L2, hence the looser cosine 0.99); its FP4 error vs exact windowed attention
    stays within 1.05x the reference's, and l (hence the LSE) sums the unquantized P̃: 1e-4 as always."""
    causal, window = True, (90, 0)
    q, k, v = make_qkv(1, 2, 1, 130, 160, 32, seed=21)
    out, lse = kernel(q, k, v, causal=causal, window=window, recipe=fmt, online=True)
    qd, kd, vd = q.double(), k.double(), v.double()
    ref, ref_lse = reference.attention(qd, kd, vd, causal=causal, recipe=fmt, window_size=window, return_lse=True)
    exact = reference.attention(qd, kd, vd, causal=causal, recipe="bf16", window_size=window)
    assert cosine(out, ref) >= 0.99
    assert rel_l2(out, exact) <= 1.05 * rel_l2(ref, exact)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=1e-4)
    exact_max, _ = kernel(q, k, v, causal=causal, window=window, recipe=fmt, online=False)
    assert rel_l2(exact_max, ref) < 1e-3 < rel_l2(out, ref)  # the online path really ran


@cpu_interp
@pytest.mark.parametrize("causal,window", [(True, (89, 0)), (True, (2**40, 0)), (False, (89, 69)),
                                           (False, (2**33, 2**33))], ids=str)
def test_interpreter_covering_window_equals_no_window(causal, window):
    """A window covering every key (the smallest, and a huge one past int32) gives the bits of no window."""
    q, k, v = make_qkv(1, 2, 1, 70, 90, 32, seed=9)
    o0, l0 = kernel(q, k, v, causal=causal, window=None, recipe="nvfp4")
    o1, l1 = kernel(q, k, v, causal=causal, window=window, recipe="nvfp4")
    assert torch.equal(o0, o1) and torch.equal(l0, l1)


@cpu_interp
@pytest.mark.parametrize("window", [(-1, 2**31 - 100), (-1, 2**31), (5, 2**31), (2**31, 3), (2**40, 2**40)],
                         ids=str)
def test_interpreter_huge_extents(window):
    """An extent that reaches past every key is no bound: the kernel gives what it gives with that side
    unbounded (found by this file: a right extent near 2**31 overflowed the int32 key range of
    causal_key_range, and past it every row hit finish_rows' 'no bad key' sentinel and came out NaN; the
    launcher now treats left >= Nk - 1 and right >= Nq - 1 as unbounded)."""
    q, k, v = make_qkv(1, 1, 1, 130, 90, 32, seed=9)
    bounded = tuple(-1 if w >= 2**31 - 100 else w for w in window)
    o0, l0 = kernel(q, k, v, causal=False, window=None if bounded == (-1, -1) else bounded, recipe="nvfp4")
    o1, l1 = kernel(q, k, v, causal=False, window=window, recipe="nvfp4")
    assert torch.equal(o0, o1) and torch.equal(l0, l1)


@cpu_interp
def test_attention_fp4_impl_window_arguments():
    """The custom op's implementation maps (window_left, window_right) to the kernel's normalized window
    ((-1, -1): none) and its fake implementation takes them: run here on CPU tensors under the interpreter
    (the op itself is registered for CUDA)."""
    from fp4attn.ops.attention import _attention_fp4_impl

    q, k, v = make_qkv(1, 2, 1, 70, 90, 32, seed=4, device="cpu")
    for causal, wl, wr in [(True, 31, 0), (False, -1, 10), (False, 20, 30), (False, 7, -1), (True, -1, -1)]:
        out, lse = _attention_fp4_impl(q, k, v, causal, 0.125, "nvfp4", False, False, False, "bhsd", True, wl, wr)
        ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, scale=0.125,
                                           window_size=(wl, wr), return_lse=True)
        assert rel_l2(out, ref) <= 1e-3, (causal, wl, wr)  # as test_interpreter_window_vs_reference
        fin = torch.isfinite(ref_lse)
        assert torch.equal(fin, torch.isfinite(lse))
        torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=1e-4)
    meta = [t.to("meta") for t in (q, k, v)]
    o, l = torch.ops.fp4attn.attention_fp4.default(*meta, True, 0.125, "nvfp4", False, False, False, "bhsd", True,
                                                   31, 0)
    assert o.shape == q.shape and l.shape == (1, 2, 70)


# -------------------------------------------------------------------------------------------------
# non-finite inputs with a window
# -------------------------------------------------------------------------------------------------
NAN_WINDOW_CASES = [
    # recipe, flags, causal, window_size, (B, hq, hkv, nq, nk, D), bad keys (b, kv head, key), kernel options
    # rows 63..83 (p = i + 1) see key 64, later rows have it before their window, earlier rows after (causal);
    # row 63, the last of the first query tile, is the only one of its tile that sees it (the first key of the
    # second 64-key scan chunk)
    ("nvfp4", {}, True, (20, 0), (1, 2, 1, 150, 151, 32), [(0, 0, 64)], {}),
    # key 10 lies before every window (p >= 80), key 100 inside the windows of rows 20..40: the head's first bad
    # key alone says nothing about its rows; another batch / kv head with its own bad key
    ("nvfp4", {}, True, (20, 0), (2, 4, 2, 70, 150, 32), [(1, 1, 10), (1, 1, 100), (0, 0, 140)], {}),
    # two-sided, Nq > Nk (rows 0..49 see no key): key 5 before the windows of rows > 115, key 40 inside 100..150
    ("mxfp4", {}, False, (20, 30), (1, 2, 1, 160, 70, 32), [(0, 0, 5), (0, 0, 40)], {"staged": False}),
    # a window wider than the epilogue's 64-key scan chunks: key 20 before every window, 120 and 245 inside some
    ("nvfp4", {}, True, (100, 0), (1, 2, 1, 100, 250, 32), [(0, 0, 20), (0, 0, 120), (0, 0, 245)], {}),
    # left edge only (two-level P, one pass; smooth_k off: its k̄ would carry the NaN to every key)
    ("sage3", {"smooth_k": False}, False, (50, -1), (1, 2, 1, 70, 190, 40), [(0, 0, 30), (0, 0, 150)], {}),
    ("nvfp4", {}, True, (40, 0), (1, 2, 2, 130, 130, 32), [(0, 1, 3), (0, 1, 90)], {"online": True}),
    # smooth_k: the NaN reaches k̄, hence every key of the head and every row
    ("nvfp4", {"smooth_k": True}, True, (20, 0), (1, 2, 1, 80, 80, 16), [(0, 0, 5)], {}),
]


def _first_key_rule(causal, window, shape, bad_keys):
    """The NaN rows if only each head's *first* bad key counted (the rows whose window holds it)."""
    B, hq, hkv, nq, nk, D = shape
    mask = hand_mask(nq, nk, causal, window)
    rows = torch.zeros(B, hq, nq, dtype=torch.bool)
    g = hq // hkv
    for b in range(B):
        for h in range(hkv):
            js = [j for bb, hh, j in bad_keys if (bb, hh) == (b, h)]
            if js:
                rows[b, h * g:(h + 1) * g] = mask[:, min(js)]
    return rows


@cpu_interp
@pytest.mark.parametrize("bad", ["k", "qv"])
@pytest.mark.parametrize("case", NAN_WINDOW_CASES, ids=lambda c: f"{c[0]}-c{int(c[2])}-w{c[3]}-{c[4]}-{c[5]}-{c[6]}")
def test_interpreter_window_nan_pattern(case, bad):
    """NaN/±Inf with a window: a bad key row makes NaN exactly the rows whose window holds it (the
    epilogue scans the per-key flags when the first bad key alone does not decide), a bad query row its
    row, a bad V element its channel in every row that sees any key; the NaN-propagating reference gives
    the same pattern, and the finite part is what it is without them."""
    recipe, flags, causal, window, shape, bad_keys, opts = case
    B, hq, hkv, nq, nk, D = shape
    q, k, v = make_qkv(*shape, seed=nq + nk)
    if "k" in bad:
        for n, (b, h, j) in enumerate(bad_keys):
            k[b, h, j, (3 * n) % D] = (NAN, INF, -INF)[n % 3]
    else:
        q, k, v = poison(q, k, v, bad)
    out, lse = kernel(q, k, v, causal=causal, window=window, recipe=recipe, flags=flags, **opts)
    ref, ref_lse = nan_reference(q, k, v, causal=causal, recipe=recipe, window_size=window, **flags)
    assert torch.isnan(ref).any()
    # online softmax (single-level) is not bit-compatible with the one-shot reference (see
    # test_interpreter_window_online_softmax): its finite part gets the tolerance of the GPU online NaN test
    tol = 0.25 if opts.get("online") else 1e-3
    check_nan_pattern(out, lse, ref, ref_lse, tol=tol, lse_atol=1e-4)
    if bad == "k" and not flags.get("smooth_k"):
        # one bad key per head: its rows; several: the cases are built so that the first alone is wrong
        first = _first_key_rule(causal, window, shape, bad_keys)
        assert torch.equal(torch.isnan(ref_lse), first) == (len(bad_keys) == 1)


# -------------------------------------------------------------------------------------------------
# keys outside a row's window never reach it
# -------------------------------------------------------------------------------------------------
INDEP_CASES = [
    # recipe, flags, causal, window_size, (B, hq, hkv, nq, nk, D), modified key ranges, kernel options
    # keys 0..129 lie before every window (two whole key tiles skipped), key 140 inside rows 0..10's windows
    ("nvfp4", {}, True, (30, 0), (1, 2, 1, 40, 200, 32), [(0, 130), (140, 141)], {}),
    ("mxfp4", {}, False, (20, 20), (1, 2, 1, 200, 200, 32), [(0, 64), (150, 200)], {"staged": False}),
    ("sage3", {"smooth_k": False}, True, (50, 0), (1, 2, 2, 150, 150, 64), [(0, 40), (140, 141)], {}),
]


@cpu_interp
@pytest.mark.parametrize("case", INDEP_CASES, ids=lambda c: f"{c[0]}-c{int(c[2])}-w{c[3]}-{c[4]}-{c[5]}")
def test_interpreter_keys_outside_window_do_not_matter(case):
    """Large finite values in some K rows (K is quantized per key row along D, so no other key's codes
    change; V unchanged): every query row whose window holds none of them keeps its output and LSE bit for
    bit (the key tiles below the window are skipped and the edge tiles masked); every row that sees one
    changes its LSE, and its output too when it also sees an unmodified key."""
    recipe, flags, causal, window, shape, ranges, opts = case
    B, hq, hkv, nq, nk, D = shape
    q, k, v = make_qkv(*shape, seed=nq + D)
    k2 = k.clone()
    modified = torch.zeros(nk, dtype=torch.bool)
    for a, b in ranges:
        k2[:, :, a:b] = 50.0 * k[:, :, a:b] + 20.0
        modified[a:b] = True
    o1, l1 = kernel(q, k, v, causal=causal, window=window, recipe=recipe, flags=flags, **opts)
    o2, l2 = kernel(q, k2, v, causal=causal, window=window, recipe=recipe, flags=flags, **opts)
    mask = hand_mask(nq, nk, causal, window)
    hit = mask[:, modified].any(-1)
    mixed = hit & mask[:, ~modified].any(-1)  # (a row that sees one key only outputs its V row, whatever K)
    assert mixed.any() and (~hit).any()
    assert torch.equal(o1[:, :, ~hit], o2[:, :, ~hit]) and torch.equal(l1[:, :, ~hit], l2[:, :, ~hit])
    assert (l1[:, :, hit] != l2[:, :, hit]).all() and (o1[:, :, mixed] != o2[:, :, mixed]).any(-1).all()
    # some modified keys lie in key tiles the kernel skips for some query tile
    assert any(modified[n0:n0 + 64].any() for _, n0 in skipped_key_tiles(nq, nk, window))


# -------------------------------------------------------------------------------------------------
# GPU: the public op vs the reference
# -------------------------------------------------------------------------------------------------
BF16, FP16 = torch.bfloat16, torch.float16
GPU_WINDOW_CASES = [
    # recipe, causal, window_size, B, hq, hkv, nq, nk, D, dtype, layout, flags
    ("nvfp4", True, (255, 0), 2, 4, 2, 1000, 1000, 128, BF16, "bhsd", {}),
    ("nvfp4", False, (100, 100), 2, 4, 2, 1000, 1000, 128, BF16, "bshd", {}),
    ("mxfp4", True, (127, 0), 1, 4, 2, 777, 1024, 64, BF16, "bhsd", {}),
    ("sage3", True, (300, 0), 1, 4, 1, 900, 900, 128, BF16, "bhsd", {}),
    ("mxfp4", False, (-1, 50), 1, 2, 2, 1000, 600, 128, FP16, "bhsd", {}),  # Nq > Nk: rows that see no key
    ("sage3", False, (64, -1), 1, 4, 4, 500, 1200, 64, BF16, "bhsd", {}),
    ("nvfp4", True, (31, 0), 1, 4, 2, 600, 400, 64, torch.float32, "bhsd", {"two_level_p": True}),  # Nq > Nk
    ("mxfp4", False, (10, 300), 1, 4, 2, 512, 512, 256, BF16, "bhsd", {"smooth_q": True}),
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("operands", ["packed", "staged"])
@pytest.mark.parametrize("case", GPU_WINDOW_CASES,
                         ids=lambda c: f"{c[0]}-c{int(c[1])}-w{c[2][0]},{c[2][1]}-{c[3:9]}-{c[10]}-{c[11]}")
def test_gpu_window_op_vs_reference(case, operands, monkeypatch):
    monkeypatch.setenv("FP4ATTN_ATTN_OPERANDS", operands)
    recipe, causal, window, B, hq, hkv, nq, nk, D, dtype, layout, flags = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=dtype, seed=nq + D)
    args = [t.transpose(1, 2).contiguous() if layout == "bshd" else t for t in (q, k, v)]
    out, lse = fp4attn.attention(*args, causal=causal, recipe=recipe, layout=layout, return_lse=True,
                                 window_size=window, **flags)
    assert out.dtype == dtype and out.shape == args[0].shape
    if layout == "bshd":
        out = out.transpose(1, 2)
    spec_check(out.float(), q.float(), k.float(), v.float(), causal=causal, window=window, recipe=recipe,
                      flags=flags)
    _, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe=recipe,
                                     window_size=window, return_lse=True, **flags)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=2e-3)
    empty = ~window_keep(0, nq, nq, nk, causal, normalize_window(window, causal), fin.device).any(-1)
    assert torch.equal(~fin, empty.expand(B, hq, nq))
    assert (out[~fin] == 0).all()


@gpu
@pytest.mark.gpu
def test_gpu_window_bf16_recipe_runs_reference():
    """The bf16 recipe has no windowed kernel (SDPA has no sliding window): the reference runs on CUDA."""
    q, k, v = make_qkv(1, 4, 2, 700, 900, 64, dtype=BF16, seed=3)
    for causal, w in [(True, (127, 0)), (False, (50, 20))]:
        out, lse = fp4attn.attention(q, k, v, causal=causal, recipe="bf16", window_size=w, return_lse=True)
        ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe="bf16",
                                           window_size=w, return_lse=True)
        assert rel_l2(out.float(), ref) < 0.01
        torch.testing.assert_close(lse.double(), ref_lse, rtol=0, atol=2e-3)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("operands", ["packed", "staged"])
def test_gpu_window_nan_pattern(operands, monkeypatch):
    """The compiled epilogue's window scan: a bad key before every window plus one inside some, GQA, and a
    bad V element: NaN exactly where the reference has it."""
    monkeypatch.setenv("FP4ATTN_ATTN_OPERANDS", operands)
    B, hq, hkv, nq, nk, D = 2, 4, 2, 700, 1500, 128
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=BF16, seed=13)
    k[1, 1, 100, 7] = NAN  # before every window (p >= 800, window 255)
    k[1, 1, 1000, 0] = INF  # inside the windows of rows 200..455
    k[0, 0, 1499, 3] = -INF  # the last key: the last row only
    v[0, 1, 20, 5] = NAN  # a channel of kv head 1's query heads, every row
    out, lse = fp4attn.attention(q, k, v, causal=True, window_size=(255, 0), return_lse=True)
    ref, ref_lse = nan_reference(q.cpu(), k.cpu(), v.cpu(), causal=True, recipe="nvfp4", window_size=(255, 0))
    assert torch.isnan(ref_lse).sum() == 2 * 256 + 2
    check_nan_pattern(out.float().cpu(), lse.cpu(), ref, ref_lse, tol=0.05, lse_atol=2e-3)


GLUON_WINDOW_CASES = [
    # B, hq, hkv, nq, nk, D, causal, window, sinks, (smooth_q, smooth_k, two_level_p)
    (2, 4, 2, 1000, 1000, 128, True, (127, 0), True, (False, False, False)),
    (1, 4, 1, 333, 517, 64, True, (63, 0), True, (False, False, False)),  # Nq < Nk, D = 64
    (1, 2, 2, 517, 333, 128, True, (100, 0), True, (False, False, False)),  # Nq > Nk: rows that see no key
    (1, 4, 4, 300, 800, 128, False, (40, 40), False, (False, False, False)),  # both edges, not causal
    (1, 4, 2, 600, 900, 64, False, (100, -1), True, (False, False, False)),  # a left edge alone
    (1, 4, 4, 128, 4096, 128, True, (1000, 0), False, (False, False, False)),  # many key tiles per program
    (2, 4, 2, 1000, 1000, 128, True, (200, 0), True, (False, False, True)),  # two-level P (one pass)
    (1, 4, 2, 700, 700, 64, False, (64, 64), True, (False, False, True)),
    (1, 4, 2, 900, 900, 128, True, (300, 0), True, (True, True, True)),  # sage3: smooth_q table, smooth_k
]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", GLUON_WINDOW_CASES, ids=str)
def test_gpu_gluon_window_and_sinks(case, monkeypatch):
    """Sliding windows and attention sinks on the Gluon passes (``attention_gluon``: the key loop from the window's
    first tile, the tiles its edges cross masked, the sink in the row-max pass's maximum and in l; the epilogue's
    window scan of the per-key flags) against the Triton pass on the same quantized operands.

    - Single-level P: the Gluon passes with the float32 P̃ rounding (``P16=False``) against the Triton passes, to
      the bound of ``test_gpu_gluon_attention_pass`` (2e-4: S·scale − m in one fma); the LSEs to 1e-5. The Gluon
      row-max pass gives the Triton row-max pass's maxima bit for bit (equal outputs and LSEs with either).
    - Two-level P (sage3's pass, also with smooth_q / smooth_k): both round P̃/s1 at float16 precision (2e-4).
    - ``kernel="auto"`` runs the Gluon passes (bit-equal to kernel="gluon" with its defaults), and the public op
      (operands in the Gluon passes' key order) is within SPEC §6 of the reference, LSEs to 2e-3."""
    from fp4attn.kernels import attention_gluon as AG
    B, hq, hkv, nq, nk, D, causal, window, with_sinks, (sq, sk, tlp) = case
    q, k, v = make_qkv(B, hq, hkv, nq, nk, D, dtype=BF16, seed=nq + nk + D + window[0])
    if not A.attention_gluon.supported(is_mx=False, two_level=tlp, smooth_q=sq, staged=True, dp=D, device=q.device):
        pytest.skip("the Gluon attention pass needs an sm_90 GPU and Triton's Gluon")
    sinks = torch.linspace(-1.0, 3.0, hq, device=q.device) if with_sinks else None
    win = normalize_window(window, causal)
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, smooth_q=sq, smooth_k=sk, key_rows=True)
    kw = dict(causal=causal, scale=D ** -0.5, two_level_p=tlp, B=B, Hq=hq, Hkv=hkv, window=win, sinks=sinks)
    f32 = None if tlp else {**AG.default_config(D), "P16": False}
    runs = {"triton": ("triton", None, "auto"), "gluon": ("gluon", f32, "auto"), "gluon16": ("gluon", None, "auto"),
            "auto": ("auto", None, "auto"), "gluon_tmax": ("gluon", f32, "triton")}
    res = {}
    for name, (kern, cfg, rowmax) in runs.items():
        monkeypatch.setenv("FP4ATTN_ROWMAX_KERNEL", rowmax)
        out = torch.empty_like(q)
        lse = A.attention_packed(pk, out=out, kernel=kern, gluon_config=cfg, **kw)
        res[name] = out, lse[:, :, :nq]
    (o_t, l_t), (o_g, l_g) = res["triton"], res["gluon"]
    fin = torch.isfinite(l_t)
    assert torch.equal(fin, torch.isfinite(l_g))
    empty = ~window_keep(0, nq, nq, nk, causal, win, q.device).any(-1)
    assert torch.equal(~fin, empty.expand(B, hq, nq) & (sinks is None))  # a sink keeps every row's LSE finite
    torch.testing.assert_close(l_g[fin], l_t[fin], rtol=0, atol=1e-5)
    assert rel_l2(o_g.float(), o_t.float()) < 2e-4
    assert torch.equal(o_g[~fin], o_t[~fin])  # rows without a key: 0
    if not tlp and not sq:  # the two row-max passes: the same maxima
        assert torch.equal(res["gluon_tmax"][0], o_g) and torch.equal(res["gluon_tmax"][1], l_g)
    assert torch.equal(res["auto"][0], res["gluon16"][0]) and torch.equal(res["auto"][1], res["gluon16"][1])
    flags = dict(smooth_q=sq, smooth_k=sk, two_level_p=tlp)
    out, lse = fp4attn.attention(q, k, v, causal=causal, window_size=window, sinks=sinks, return_lse=True, **flags)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe="nvfp4",
                                       window_size=window, sinks=None if sinks is None else sinks.double(),
                                       return_lse=True, **flags)
    assert cosine(out.double(), ref) >= 0.998 and rel_l2(out.double(), ref) <= 0.05
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=2e-3)


@gpu
@pytest.mark.gpu
def test_gpu_window_opcheck():
    import fp4attn.ops.attention  # noqa: F401  (registers the custom op)

    q, k, v = make_qkv(1, 4, 2, 136, 200, 64, dtype=BF16, seed=0)
    for args in [(q, k, v, True, 0.125, "nvfp4", False, False, False, "bhsd", True, 31, 0),
                 (q, k, v, False, 0.125, "mxfp4", False, False, False, "bhsd", True, -1, 40),
                 (q, k, v, False, 0.125, "nvfp4", True, True, True, "bhsd", False, 20, 30)]:
        torch.library.opcheck(torch.ops.fp4attn.attention_fp4.default, args)


@cpu_interp
def test_window_left_edge_needs_the_key_row_flags():
    """The per-key non-finite flags are written only when asked (key_rows=True: what attention_fwd does for a
    window), so a left edge on operands quantized without them is refused instead of reading garbage."""
    q, k, v = make_qkv(1, 2, 1, 40, 40, 32, seed=31)
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", path=A.PATH_INTERP)
    assert pk.krows is None
    with pytest.raises(ValueError, match="key_rows=True"):
        A.attention_packed(pk, causal=True, scale=0.2, two_level_p=False, B=1, Hq=2, Hkv=1,
                           out=torch.empty_like(q), window=(5, 0))
    pk = A.quantize_qkv(q, k, v, fmt="nvfp4", path=A.PATH_INTERP, key_rows=True)
    assert pk.krows.shape == (1, 1, 128) and (pk.krows[..., :40] == 0).all()
