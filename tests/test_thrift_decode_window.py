"""ThriftAttention decode with a sliding window and with attention sinks (``fp4attn.decode(q, cache,
thrift_budget=f, window_size=(w, 0), sinks=s)``), and the sliding-window cache with its 16-bit copy
(``KVCache(window=w, keep_16bit=True)``).

Semantics (``ops/decode.py``): query row i of sequence b sees keys L_b − n_q + i − w ... L_b − n_q + i; Thrift's
candidate pages are those holding keys max(L_b − n_q − w, 0) ... L_b − 1 (n_w of them), the top
k = clamp(round(f·n_w), 1, n_w) of them by q̄·K̄_p run in 16 bits, ties to the lower index; the window's mask
applies to the 16-bit and the FP4 keys alike; a sink joins the one softmax (max and l), the selection unchanged.

CPU: the reference against independent float64 materializations; the page-selection kernels and the split
kernel under the Triton interpreter (tiny sizes) against the reference, the selection bit for bit; a ring cache
against a cache that kept everything, bit for bit. GPU (``-m gpu``): the same at realistic sizes.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import reference  # noqa: E402
from fp4attn.kvcache import KVCache  # noqa: E402
from fp4attn.ops.decode import decode_reference, share_selection, thrift_select, top_pages  # noqa: E402

# helpers of the decode tests (tests/ is on sys.path under pytest's default rootdir import mode)
from test_kvcache_decode import (  # noqa: E402
    _assert_same_storage,
    _decode_f64,
    _k_of,
    _kv,
    _rel,
    _scores_f64,
    gpu,
    needs_interp,
)

PS = 64  # page size = Thrift's block (the split kernel's 64-key two-level P tile)


def _case(lens, G, nq, seed, D=32, Hkv=2, dtype=torch.float32, device="cpu"):
    """A ragged cache with its 16-bit copy (page_size 64) and n_q new queries for Hkv·G query heads."""
    k, v = _kv(len(lens), Hkv, max(lens), D, dtype=dtype, seed=seed)
    c = KVCache.from_dense(k.to(device), v.to(device), lengths=lens, keep_16bit=True, dtype=dtype)
    q = torch.randn(len(lens), Hkv * G, nq, D, generator=torch.Generator().manual_seed(seed + 1)).to(device, dtype)
    return c, k, v, q


def _first(L, nq, w, ps=PS):
    """The first candidate page of a sequence of L keys: the page of key max(L − n_q − w, 0)."""
    return 0 if w is None else max(L - nq - w, 0) // ps


def _select_f64(q, k, lens, budget, window, ps=PS, margin=1e-4):
    """(B, Hq, npg) bool: the windowed Thrift selection written out from float64 scores of the dense K: per
    (sequence, query head), the candidate pages first .. n_b − 1, the k = round(f·n_w) best, ties to the lower
    index. Asserts that the k-th and (k+1)-th best are apart by more than float32 rounding could move them
    (the test data's check: then the float32 selections must equal this one)."""
    s64 = _scores_f64(q, k, lens, ps)
    B, hq, npg = s64.shape
    nq = q.shape[2]
    sel = torch.zeros(B, hq, npg, dtype=torch.bool)
    for b, L in enumerate(lens):
        p0, n_b = _first(L, nq, window, ps), -(-L // ps)
        kk = _k_of(budget, n_b - p0)
        for h in range(hq):
            order = sorted(range(p0, n_b), key=lambda p: (-s64[b, h, p].item(), p))
            sel[b, h, order[:kk]] = True
            if kk < n_b - p0:
                gap = s64[b, h, order[kk - 1]] - s64[b, h, order[kk]]
                assert gap > margin, f"near-tie in the test data (sequence {b}, head {h}, gap {gap})"
    return sel


def _exact_window(q, k, v, lens, w):
    """Unquantized windowed attention over each sequence's raw keys (what budget 1 must give)."""
    return torch.cat([reference.attention(q[b:b + 1], k[b:b + 1, :, :L].to(q.device), v[b:b + 1, :, :L].to(q.device),
                                          causal=True, recipe="bf16", window_size=None if w is None else (w, 0))
                      for b, L in enumerate(lens)])


def _sink_rescaled(out, lse, sinks):
    """Output and LSE with a sink, from those without: O·exp(LSE − LSE') with LSE' = logaddexp(LSE, sink)."""
    s = sinks.double().view(1, -1, 1)
    lse2 = torch.logaddexp(lse.double(), s)
    return out.double() * torch.exp(lse.double() - lse2).unsqueeze(-1), lse2


LENS = [64 * 5 + 5, 10, 128, 64 * 2 + 16, 200]  # partial pages with a tail, shorter than a page, full pages
WINDOWS = [0, 5, 40, 64, 130, 1000]  # inside one page (or the tail), a page, several pages, past every key


# ------------------------------------------------------------------------------------------------
# the reference (CPU)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nq", [1, 3])
def test_thrift_select_window_is_the_top_k_of_the_candidate_pages(nq):
    """thrift_select(..., window=w): the top round(f·n_w) of the pages holding keys max(L − n_q − w, 0) .. L − 1,
    from float64 scores; no page before the window selected; a window past every key is no window."""
    c, k, _, q = _case(LENS, 2, nq, seed=100)
    for w in WINDOWS:
        for f in (0.25, 0.5, 1.0):
            sel = thrift_select(q, c, f, w)
            want = _select_f64(q, k, LENS, f, w)
            assert torch.equal(sel[..., :want.shape[-1]], want), (w, f)
            assert not sel[..., want.shape[-1]:].any()
            for b, L in enumerate(LENS):
                p0 = _first(L, nq, w)
                assert not sel[b, :, :p0].any()
                assert (sel[b].sum(-1) == _k_of(f, -(-L // PS) - p0)).all(), (w, f, b)
    assert torch.equal(thrift_select(q, c, 0.25, 1000), thrift_select(q, c, 0.25))


def test_top_pages_window_ranks_among_the_candidates_only():
    """A row whose candidate pages all score -inf while pages before the window score +inf or NaN: the k lowest
    candidates win (the pages before the window, which a stable sort puts first, are not counted)."""
    s = torch.tensor([[[float("inf"), float("nan"), 5.0, float("-inf"), float("-inf"), float("-inf"), 1.0]]])
    sel = top_pages(s, torch.tensor([6]), 0.5, 8, first=torch.tensor([3]))  # candidates 3, 4, 5: k = 2
    assert sel.tolist() == [[[False, False, False, True, True, False, False, False]]]
    sel = top_pages(s, torch.tensor([7]), 0.4, 7, first=torch.tensor([2]))  # candidates 2..6: k = 2
    assert sel.tolist() == [[[False, False, True, False, False, False, True]]]


@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("window", [0, 5, 40, 130, 1000])
def test_thrift_window_reference_matches_float64(nq, window):
    """decode_reference with a Thrift budget and a window == an independent float64 materialization with the
    same selection and window (ragged, GQA, raw tails), for both thrift_share rules (the default "group": each
    head computes its kv group's union of selections)."""
    c, k, v, q = _case([300, 77, 20], 2, nq, seed=102)
    for share in ("group", "head"):
        sel = thrift_select(q, c, 0.3, window, share=share)
        out, _ = decode_reference(q, c, scale=32 ** -0.5, thrift_budget=0.3, window=window, thrift_share=share)
        assert _rel(out, _decode_f64(q, c, 32 ** -0.5, selection=sel, window=window)) <= 1e-4
        # the public op (CPU: the reference) computes the same
        assert torch.equal(fp4attn.decode(q, c, thrift_budget=0.3, window_size=(window, 0), thrift_share=share), out)


@pytest.mark.parametrize("window", [0, 40, 130])
def test_thrift_window_budget_one_is_16bit_window_attention(window):
    """Budget 1: every candidate page in 16 bits == unquantized windowed attention over the raw keys."""
    lens = [300, 77, 20]
    c, k, v, q = _case(lens, 2, 3, seed=104)
    out = fp4attn.decode(q, c, thrift_budget=1.0, window_size=(window, 0))
    assert _rel(out, _exact_window(q, k, v, lens, window)) <= 1e-5
    # a smaller budget is not the same where a sequence has several candidate pages (the FP4 ones); with w = 0 each
    # has one (k = 1: the same bits). Per-head selections: the default union of a kv group's selections can cover
    # every candidate page of these short windows
    small = fp4attn.decode(q, c, thrift_budget=0.2, window_size=(window, 0), thrift_share="head")
    if window:
        assert _rel(small, out) > 1e-3
    else:
        assert torch.equal(small, out)


@pytest.mark.parametrize("window", [None, 40])
def test_thrift_sinks_reference_is_the_sinkless_softmax_with_one_more_logit(window):
    """Thrift with sinks: the sink joins the one softmax (O·exp(LSE − LSE'), LSE' = logaddexp(LSE, sink)),
    the selection unchanged; a -inf sink is no sink (bit for bit)."""
    c, k, v, q = _case([300, 77, 20], 2, 3, seed=106)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(107)) * 2
    sinks[1] = float("-inf")
    kw = dict(thrift_budget=0.3, window_size=None if window is None else (window, 0), return_lse=True)
    out, lse = fp4attn.decode(q, c, **kw)
    out_s, lse_s = fp4attn.decode(q, c, sinks=sinks, **kw)
    want, want_lse = _sink_rescaled(out, lse, sinks)
    assert _rel(out_s, want) <= 1e-5
    assert torch.allclose(lse_s.double(), want_lse, atol=1e-5)
    assert torch.equal(out_s[:, 1], out[:, 1]) and torch.equal(lse_s[:, 1], lse[:, 1])  # the -inf sink
    none = torch.full((4,), float("-inf"))
    assert torch.equal(fp4attn.decode(q, c, sinks=none, **kw)[0], out)


# ------------------------------------------------------------------------------------------------
# the page selection kernels (interpreter)
# ------------------------------------------------------------------------------------------------
@needs_interp
@pytest.mark.parametrize("G,nq", [(1, 1), (2, 3)])
def test_select_pages_window_interpreter_equals_thrift_select(G, nq):
    """select_pages(..., window=w) == thrift_select(..., window=w) bit for bit (and the float64 selection), for
    windows inside a page, of a page, over several pages and past every key; the kernel's scores of the candidate
    pages are thrift_select's up to float32 rounding, also with one page per program (the grid then spans the
    most candidate pages a window can have: 258 keys with n_q = 3, w = 64 have 3; 1130 keys with w = 1000 have 17,
    more than the smallest top-k tile)."""
    from fp4attn.kernels.decode import page_scores, select_pages

    lens = LENS + [258, 1130]
    c, k, _, q = _case(lens, G, nq, seed=110 + G + nq, Hkv=1)
    width = c.page_table.shape[1]
    s64 = _scores_f64(q, k, lens)
    for w in (5, 64, 130, 1000):
        sc, sc1 = page_scores(q, c, window=w), page_scores(q, c, window=w, chunk=1)
        for b, L in enumerate(lens):
            p0, n_b = _first(L, nq, w), -(-L // PS)
            assert torch.allclose(sc[b, :, p0:n_b].double(), s64[b, :, p0:n_b], rtol=1e-5, atol=1e-5)
            assert torch.equal(sc1[b, :, p0:n_b], sc[b, :, p0:n_b])
        for f in (0.25, 1.0):
            want = _select_f64(q, k, lens, f, w)
            sel = select_pages(q, c, f, window=w)
            assert sel.dtype == torch.int8 and sel.shape == (len(lens), G, width)
            ref = thrift_select(q, c, f, w)
            assert torch.equal(sel.bool(), ref[..., :width]), (w, f)
            assert torch.equal(ref[..., :want.shape[-1]], want)
            # share="group": the kv group's rows side by side in the windowed top-k tile, their union in each
            union = share_selection(ref, 1)
            assert torch.equal(thrift_select(q, c, f, w, share="group"), union)
            assert torch.equal(select_pages(q, c, f, window=w, share="group").bool(), union[..., :width]), (w, f)


@needs_interp
def test_page_topk_window_interpreter_ties_and_specials():
    """The top-k kernel with a window on crafted scores == top_pages with the same candidate pages: k from the
    candidate count (round half to even), exact ties to the lower index, -0.0 == +0.0, NaN first, ±inf, rows
    whose candidates all score -inf; the pages before the window and past the end hold NaN / +inf (never
    selected). Window 100 with n_q = 2: the first candidate is the page of key L − 102."""
    from fp4attn.kernels.decode import page_topk

    n_b = [2, 6, 10, 50, 30, 1, 7]
    B, Hq, npg, W, nq, w = len(n_b), 3, 50, 52, 2, 100
    lens = [64 * n - (3 if i % 2 == 0 else 50) for i, n in enumerate(n_b)]
    first = torch.tensor([_first(L, nq, w) for L in lens])
    g = torch.Generator().manual_seed(112)
    s = torch.randn(B, Hq, npg, generator=g)
    s[:, 1] = torch.randint(-2, 3, (B, npg), generator=g).float()  # many exact ties
    s[:, 1, ::3] = -0.0
    s[:, 2] = torch.where(torch.rand(B, npg, generator=g) < 0.5, 0.0, -0.0)  # ±0 only: all tie
    s[3, 0, [48, 49]] = float("nan")
    s[3, 0, 47] = float("inf")
    s[1, 0, 3:] = float("-inf")  # every candidate -inf
    for b, n in enumerate(n_b):
        s[b, :, :first[b]] = float("inf")  # before the window: never read
        s[b, 0, :first[b]:2] = float("nan")
        s[b, :, n:] = float("nan")  # past the sequence
    n_w = [n - int(p) for n, p in zip(n_b, first)]
    assert n_w == [2, 3, 2, 3, 2, 1, 2]
    for f in (0.5, 0.25, 1.0):
        sel = page_topk(s, torch.tensor(lens, dtype=torch.int32), 64, f, W, window=w, nq=nq)
        ref = top_pages(s, torch.tensor(n_b), f, W, first)
        assert torch.equal(sel.bool(), ref), f
        assert sel.sum(-1).tolist() == [[_k_of(f, n)] * Hq for n in n_w]
    sel = page_topk(s, torch.tensor(lens, dtype=torch.int32), 64, 0.5, W, window=w, nq=nq)
    assert sel[3, 0, 46:50].tolist() == [0, 0, 1, 1]  # NaN before +inf; k = round(1.5) = 2
    assert sel[1, 0, 2:6].tolist() == [0, 1, 1, 0]  # the lowest two candidates, all -inf
    # no window through the same kernel: the rule of the whole sequence
    assert torch.equal(page_topk(s.nan_to_num(), torch.tensor(lens, dtype=torch.int32), 64, 0.5, W).bool(),
                       top_pages(s.nan_to_num(), torch.tensor(n_b), 0.5, W))


# ------------------------------------------------------------------------------------------------
# the split kernel with Thrift and a window / sinks (interpreter)
# ------------------------------------------------------------------------------------------------
@needs_interp
@pytest.mark.parametrize("nq,window,splits", [(1, 5, 2), (3, 40, 3), (3, 64, 1), (1, 130, 2), (3, 1000, 2)])
def test_thrift_window_decode_kernel_interpreter(nq, window, splits):
    """The split kernel with THRIFT and WINDOW: the splits start at the tile of the first visible key, the
    selected pages run in 16 bits, the window masks the 16-bit and the FP4 keys; two-level P is invariant to
    the running max up to float rounding, so the kernel equals the reference with the same selection nearly
    exactly (ragged lengths, GQA, a sequence shorter than a page, raw tails)."""
    from fp4attn.kernels.decode import decode_fwd, select_pages

    c, k, v, q = _case([300, 77, 20], 2, nq, seed=120)
    sel = select_pages(q, c, 0.3, window=window)
    assert torch.equal(sel.bool(), thrift_select(q, c, 0.3, window)[..., :sel.shape[-1]])
    out, lse = decode_fwd(q, c, scale=32 ** -0.5, selection=sel, window=window, num_splits=splits)
    ref, ref_lse = decode_reference(q, c, scale=32 ** -0.5, selection=sel.bool(), window=window)
    assert _rel(out, ref) <= 1e-4
    assert torch.allclose(lse, ref_lse, atol=1e-4)
    if window == 1000:  # past every key: the bits of no window (with the same selection)
        o2, l2 = decode_fwd(q, c, scale=32 ** -0.5, selection=sel, num_splits=splits)
        assert torch.equal(o2, out) and torch.equal(l2, lse)


@needs_interp
def test_thrift_window_decode_kernel_interpreter_reads_only_the_window():
    """NaN in the 16-bit copy and the FP4 pages of the keys before every window (pages 0-1 of a 300-key
    sequence, window 40): neither the selection kernels nor the split kernel read them, so the output is the
    bits of the clean cache; without the window the NaN reaches it."""
    from fp4attn.kernels.decode import decode_fwd, select_pages

    c, k, v, q = _case([300, 250], 2, 3, seed=122)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, :128] = float("nan")
    v2[:, :, :128] = float("nan")
    cn = KVCache.from_dense(k2, v2, lengths=[300, 250], keep_16bit=True, dtype=torch.float32,
                            k_global_scale=c.k_global_scale, v_global_scale=c.v_global_scale)
    outs = []
    for cache in (c, cn):
        sel = select_pages(q, cache, 0.5, window=40)
        outs.append(decode_fwd(q, cache, scale=32 ** -0.5, selection=sel, window=40, num_splits=2))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert not torch.isfinite(decode_fwd(q, cn, scale=32 ** -0.5, selection=select_pages(q, cn, 0.5))[0]).all()


@needs_interp
@pytest.mark.parametrize("window", [5, 100])
def test_thrift_window_budget_one_kernel_interpreter_is_16bit_window_attention(window):
    """Budget 1 with a window on the kernels: every visible key in 16 bits (float32 cache: exact copies) ==
    unquantized windowed attention."""
    from fp4attn.kernels.decode import decode_fwd, select_pages

    lens = [300, 77]
    c, k, v, q = _case(lens, 2, 3, seed=124)
    sel = select_pages(q, c, 1.0, window=window)
    out, _ = decode_fwd(q, c, scale=32 ** -0.5, selection=sel, window=window, num_splits=2)
    assert _rel(out, _exact_window(q, k, v, lens, window)) <= 1e-5


@needs_interp
@pytest.mark.parametrize("window", [None, 40])
def test_thrift_sinks_decode_kernel_interpreter(window):
    """THRIFT with SINKS (and a window): the split kernel's running max starts at the sink, the reduce adds its
    share of l: the reference with the same selection and sinks, nearly exactly; a -inf sink is no sink, bit for
    bit (per head, and for every head)."""
    from fp4attn.kernels.decode import decode_fwd, select_pages

    c, k, v, q = _case([300, 77], 2, 3, seed=126)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(127)) * 2
    sinks[2] = float("-inf")
    sel = select_pages(q, c, 0.3, window=window)
    out, lse = decode_fwd(q, c, scale=32 ** -0.5, selection=sel, window=window, sinks=sinks, num_splits=3)
    ref, ref_lse = decode_reference(q, c, scale=32 ** -0.5, selection=sel.bool(), window=window, sinks=sinks)
    assert _rel(out, ref) <= 1e-4
    assert torch.allclose(lse, ref_lse, atol=1e-4)
    plain, plain_lse = decode_fwd(q, c, scale=32 ** -0.5, selection=sel, window=window, num_splits=3)
    assert torch.equal(out[:, 2], plain[:, 2]) and torch.equal(lse[:, 2], plain_lse[:, 2])
    none = torch.full((4,), float("-inf"))
    o2, l2 = decode_fwd(q, c, scale=32 ** -0.5, selection=sel, window=window, sinks=none, num_splits=3)
    assert torch.equal(o2, plain) and torch.equal(l2, plain_lse)


# ------------------------------------------------------------------------------------------------
# the sliding-window cache with its 16-bit copy
# ------------------------------------------------------------------------------------------------
def _ring16_and_full(window, chunks, lens=None, seed=130, page_size=PS, D=32):
    """A sliding-window cache with the 16-bit copy and a full one, the same tokens appended in ``chunks``
    (the last chunk ragged with ``lens``), global scales shared."""
    B, H = 2, 2
    n = sum(chunks)
    k, v = _kv(B, H, n, D, dtype=torch.float32, seed=seed)
    full = KVCache(B, H, D, dtype=torch.float32, keep_16bit=True, page_size=page_size)
    full.append(k[:, :, :chunks[0]], v[:, :, :chunks[0]])
    ring = KVCache(B, H, D, dtype=torch.float32, window=window, keep_16bit=True, page_size=page_size,
                   k_global_scale=full.k_global_scale, v_global_scale=full.v_global_scale)
    ring.append(k[:, :, :chunks[0]], v[:, :, :chunks[0]])
    pos = chunks[0]
    for i, c in enumerate(chunks[1:]):
        last = i == len(chunks) - 2 and lens is not None
        for cache in (ring, full):
            cache.append(k[:, :, pos:pos + c], v[:, :, pos:pos + c],
                         lengths=[min(x - pos, c) for x in lens] if last else None)
        pos += c
    return ring, full


def test_window_cache_keeps_the_16bit_copy_in_its_ring():
    """KVCache(window=w, keep_16bit=True): the 16-bit copy and the page means recycle the FP4 pages' ring slots;
    dense_16bit() and block_means() equal the full cache's over the kept tokens / pages and are zero before them;
    the Thrift selection with a window w' <= w and the reference decode (CPU) are the full cache's, bit for bit."""
    w = 100
    ring, full = _ring16_and_full(w, [37, 300, 1, 16, 5, 200, 140], lens=[699, 680])
    R = ring.ring_pages
    assert ring._num_used <= 2 * R and ring.nbytes_16bit < full.nbytes_16bit
    assert ring.nbytes_16bit == 2 * R * ring._page_bytes(True)
    kr, vr = ring.dense_16bit()
    kf, vf = full.dense_16bit()
    for b, L in enumerate(ring.lengths):
        C = L - L % 16
        gone = max(0, -(-C // PS) - R) * PS
        assert gone > 0 and gone <= L - w - 16
        assert torch.equal(kr[b, :, gone:], kf[b, :, gone:]) and torch.equal(vr[b, :, gone:], vf[b, :, gone:])
        assert (kr[b, :, :gone] == 0).all() and (vr[b, :, :gone] == 0).all()
    mr, mf = ring.block_means(), full.block_means()
    for b, L in enumerate(ring.lengths):
        g = max(0, -(-(L - L % 16) // PS) - R)
        assert torch.equal(mr[b, :, g:], mf[b, :, g:]) and (mr[b, :, :g] == 0).all()
    q = torch.randn(2, 4, 3, 32, generator=torch.Generator().manual_seed(131))
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(132))
    for ww in (0, 37, w):
        for f in (0.3, 1.0):
            assert torch.equal(thrift_select(q, ring, f, ww), thrift_select(q, full, f, ww))
            for s in (None, sinks):
                a = fp4attn.decode(q, ring, thrift_budget=f, window_size=(ww, 0), sinks=s, return_lse=True)
                b = fp4attn.decode(q, full, thrift_budget=f, window_size=(ww, 0), sinks=s, return_lse=True)
                assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), (ww, f)
    both = KVCache.cat([ring, ring])  # the ring and its 16-bit copy survive a concatenation
    assert both.keep_16bit and both.window == w
    assert torch.equal(fp4attn.decode(torch.cat([q, q]), both, thrift_budget=0.3, window_size=(w, 0)),
                       torch.cat([fp4attn.decode(q, full, thrift_budget=0.3, window_size=(w, 0))] * 2))


@needs_interp
def test_window_cache_thrift_decode_kernels_interpreter_equal_full_cache():
    """The selection kernels and the split kernel on a ring cache with its 16-bit copy (recycled pool pages behind
    a static page table): the bits of the same Thrift window decode on the cache that kept every token."""
    from fp4attn.kernels.decode import decode_fwd, select_pages

    w = 100
    ring, full = _ring16_and_full(w, [37, 300, 1, 16, 200], lens=[554, 540])
    q = torch.randn(2, 4, 2, 32, generator=torch.Generator().manual_seed(133))
    for ww, splits in ((0, 2), (60, 3), (w, 2)):
        sr, sf = select_pages(q, ring, 0.5, window=ww), select_pages(q, full, 0.5, window=ww)
        assert torch.equal(sr, sf[..., :sr.shape[-1]]) and not sf[..., sr.shape[-1]:].any()
        a = decode_fwd(q, ring, scale=32 ** -0.5, selection=sr, num_splits=splits, window=ww)
        b = decode_fwd(q, full, scale=32 ** -0.5, selection=sf, num_splits=splits, window=ww)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), ww


@needs_interp
def test_window_cache_one_token_appends_keep_the_page_means_interpreter(monkeypatch):
    """Generation steps into a ring cache with its 16-bit copy through the one-token append kernel (and the page
    mean kernel, which finds the completed page from the lengths): the storage of the PyTorch path, bit for bit,
    across several trips around the ring (window 20, page 32: 4 pool pages per sequence)."""
    k, v = _kv(2, 2, 120, 32, dtype=torch.float32, seed=134)
    caches = []
    for kernel in ("1", "0"):
        monkeypatch.setenv("FP4ATTN_KV_APPEND_KERNEL", kernel)
        c = KVCache.from_dense(k[:, :, :40], v[:, :, :40], lengths=[40, 27], keep_16bit=True, window=20,
                               page_size=32, dtype=torch.float32)
        for i in range(40, 120):
            c.append(k[:, :, i:i + 1], v[:, :, i:i + 1])
        caches.append(c)
    assert caches[0].ring_pages == 4 and caches[0].lengths == [120, 107]
    _assert_same_storage(*caches)
    q = torch.randn(2, 4, 1, 32, generator=torch.Generator().manual_seed(135))
    assert torch.equal(fp4attn.decode(q, caches[0], thrift_budget=0.5, window_size=(20, 0)),
                       fp4attn.decode(q, caches[1], thrift_budget=0.5, window_size=(20, 0)))


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def test_thrift_window_and_sinks_validation():
    """What still cannot work is refused, naming the argument: a window on a ring cache wider than its window (or
    none), a right extent, a budget out of range or without the 16-bit copy, malformed sinks; everything else
    combines."""
    ring, _ = _ring16_and_full(40, [150, 3], lens=[153, 150])
    q = torch.randn(2, 4, 1, 32)
    with pytest.raises(ValueError, match="window_size"):
        fp4attn.decode(q, ring, thrift_budget=0.5)
    with pytest.raises(ValueError, match="w <= 40"):
        fp4attn.decode(q, ring, thrift_budget=0.5, window_size=(41, 0))
    with pytest.raises(ValueError, match="right"):
        fp4attn.decode(q, ring, thrift_budget=0.5, window_size=(40, 3))
    with pytest.raises(ValueError, match="thrift_budget"):
        fp4attn.decode(q, ring, thrift_budget=1.5, window_size=(40, 0))
    with pytest.raises(ValueError, match="sinks"):
        fp4attn.decode(q, ring, thrift_budget=0.5, window_size=(40, 0), sinks=torch.zeros(2))
    c = KVCache.from_dense(*_kv(2, 2, 100, 32, dtype=torch.float32), dtype=torch.float32)
    with pytest.raises(ValueError, match="keep_16bit"):
        fp4attn.decode(q, c, thrift_budget=0.5, window_size=(10, 0))
    with pytest.raises(ValueError, match="keep_16bit"):
        fp4attn.decode(q, c, thrift_budget=0.5, sinks=torch.zeros(4))
    # window, sinks and a Thrift budget together, on the ring: no error
    out = fp4attn.decode(q, ring, thrift_budget=0.5, window_size=(40, 0), sinks=torch.zeros(4))
    assert out.shape == q.shape and bool(torch.isfinite(out).all())


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
def _gpu_case(nq, seed, lens=(4096 + 7, 1500, 1000)):
    """A ragged bf16 cache with its 16-bit copy on the GPU: B=3, Hkv=2, Hq=8, D=128."""
    return _case(list(lens), 4, nq, seed=seed, D=128, dtype=torch.bfloat16, device="cuda")


def _thrift_close(out, ref):
    """test_kvcache_decode.test_thrift_decode_kernel_gpu's criteria (two-level P: close to the reference)."""
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0).item()
    assert cos >= 0.998 and _rel(out, ref) <= 0.02, (cos, _rel(out, ref))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("nq", [1, 4])
def test_thrift_window_decode_gpu(nq):
    """Thrift with a window on the GPU: the selection kernels == thrift_select bit for bit (windows of less than a
    page, several pages, past every key), the op vs the reference with that selection;
    budget 1 == the reference's 16-bit window attention."""
    from fp4attn.kernels.decode import select_pages

    c, k, v, q = _gpu_case(nq, seed=140)
    D = 128
    for w in (30, 1023, 5000):
        for f in (0.25, 0.05):
            sel = select_pages(q, c, f, window=w)
            ref_sel = thrift_select(q, c, f, w)
            assert torch.equal(sel.bool(), ref_sel[..., :sel.shape[-1]]), (w, f)
            want = _select_f64(q.cpu(), k, c.lengths, f, w)  # (asserts no near-tie in the data)
            assert torch.equal(ref_sel[..., :want.shape[-1]].cpu(), want), (w, f)
        out, lse = fp4attn.decode(q, c, thrift_budget=0.05, window_size=(w, 0), return_lse=True)
        # (the op's default thrift_share: each head the union of its kv group's selections)
        assert torch.equal(select_pages(q, c, 0.05, window=w, share="group").bool(),
                           share_selection(ref_sel, c.num_kv_heads)[..., :sel.shape[-1]])
        ref, ref_lse = decode_reference(q, c, scale=D ** -0.5, selection=share_selection(ref_sel, c.num_kv_heads),
                                        window=w)
        _thrift_close(out, ref)
        assert torch.allclose(lse, ref_lse.float(), atol=1e-3), w
        full = fp4attn.decode(q, c, thrift_budget=1.0, window_size=(w, 0))
        ref_full, _ = decode_reference(q, c, scale=D ** -0.5, thrift_budget=1.0, window=w)
        assert _rel(full, ref_full) <= 1e-2, w  # bf16 operands on the 16-bit path


@pytest.mark.gpu
@gpu
def test_thrift_sinks_decode_gpu():
    """Thrift with sinks (and with a window) on the GPU vs the reference; a -inf sink is no sink, bit for bit."""
    from fp4attn.kernels.decode import decode_fwd, select_pages

    c, k, v, q = _gpu_case(2, seed=142)
    sinks = (torch.randn(8, generator=torch.Generator().manual_seed(143)) * 2).cuda()
    sinks[5] = float("-inf")
    for w in (None, 700):
        wkw = {} if w is None else {"window_size": (w, 0)}
        out, lse = fp4attn.decode(q, c, thrift_budget=0.1, sinks=sinks, return_lse=True, **wkw)
        ref, ref_lse = decode_reference(q, c, scale=128 ** -0.5, selection=thrift_select(q, c, 0.1, w, share="group"),
                                        window=w, sinks=sinks)
        _thrift_close(out, ref)
        assert torch.allclose(lse, ref_lse.float(), atol=1e-3)
        none = fp4attn.decode(q, c, thrift_budget=0.1, sinks=torch.full_like(sinks, float("-inf")), **wkw)
        plain = decode_fwd(q, c, scale=128 ** -0.5, selection=select_pages(q, c, 0.1, window=w, share="group"),
                           window=w, group_sel=True)[0]  # (the op's: its selection is the kv group's)
        assert torch.equal(none, plain) and torch.equal(out[:, 5], plain[:, 5])


@pytest.mark.gpu
@gpu
def test_thrift_decode_gpu_kernel_choice(monkeypatch):
    """Thrift runs the Gluon path on sm_90 (the bits of kernel='gluon'), with a window or sinks too: with the kv
    group's selection (the default thrift_share) at any size (GROUP16 tiles), with per-head selections from
    B·Hkv·(tokens covered) = _THRIFT_GLUON_MIN_WORK on, and the fused Triton kernel below (the bits of
    kernel='triton'); the selection without a window is the whole sequence's."""
    from fp4attn.kernels import decode as Dk

    c, k, v, q = _gpu_case(1, seed=144)  # B·Hkv·committed tokens = 3·2·4096: below the threshold
    D = 128
    sel = Dk.select_pages(q, c, 0.05, share="group")  # the op's default thrift_share
    assert torch.equal(sel.bool(), thrift_select(q, c, 0.05, share="group")[..., :sel.shape[-1]])
    out = fp4attn.decode(q, c, thrift_budget=0.05)
    ref, _ = decode_reference(q, c, scale=D ** -0.5, selection=sel.bool())
    _thrift_close(out, ref)
    if torch.cuda.get_device_capability() == (9, 0):
        def gluon(s, **kw):
            return Dk.decode_fwd(q, c, scale=D ** -0.5, selection=s, kernel="gluon", group_sel=True, **kw)[0]

        assert torch.equal(out, gluon(sel))
        sh = Dk.select_pages(q, c, 0.05)  # per head: the fused Triton kernel below the threshold
        head = fp4attn.decode(q, c, thrift_budget=0.05, thrift_share="head")
        assert torch.equal(head, Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sh, kernel="triton")[0])
        assert not torch.equal(head, Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sh, kernel="gluon")[0])
        for work, on in ((Dk._THRIFT_GLUON_MIN_WORK - 1, False), (Dk._THRIFT_GLUON_MIN_WORK, True)):
            assert Dk._use_gluon("auto", q, True, 4, 64, c.page_size, work) == on
        monkeypatch.setattr(Dk, "_THRIFT_GLUON_MIN_WORK", 1)  # any work: the Gluon path
        assert torch.equal(fp4attn.decode(q, c, thrift_budget=0.05, thrift_share="head"),
                           Dk.decode_fwd(q, c, scale=D ** -0.5, selection=sh, kernel="gluon")[0])
        sw = Dk.select_pages(q, c, 0.05, window=500, share="group")
        assert torch.equal(fp4attn.decode(q, c, thrift_budget=0.05, window_size=(500, 0)), gluon(sw, window=500))
        s = torch.zeros(8, device="cuda")
        assert torch.equal(fp4attn.decode(q, c, thrift_budget=0.05, sinks=s), gluon(sel, sinks=s))


@pytest.mark.gpu
@gpu
def test_window_cache_thrift_decode_gpu_equals_full_cache_and_replays():
    """A ring cache with its 16-bit copy on the GPU (prefill, chunks, then one-token appends through the append
    kernel): Thrift window decode gives the full cache's bits; the step (append + decode) captured in a CUDA graph
    on a reserved ring cache replays with the eager steps' bits across ring wraps."""
    B, H, D, w, steps = 2, 2, 128, 200, 150
    k, v = _kv(B, H, 1500 + steps, D, seed=146)
    k, v = k.cuda(), v.cuda()
    q = torch.randn(steps, B, 4 * H, 1, D, generator=torch.Generator().manual_seed(147)).to("cuda", torch.bfloat16)

    def build(window):
        c = KVCache(B, H, D, device="cuda", keep_16bit=True, window=window, k_global_scale=1.0, v_global_scale=1.0)
        for a, e in ((0, 1000), (1000, 1037), (1037, 1500)):
            c.append(k[:, :, a:e], v[:, :, a:e])
        return c

    ring, full = build(w), build(None)
    for i in range(20):
        for c in (ring, full):
            c.append(k[:, :, 1500 + i:1501 + i], v[:, :, 1500 + i:1501 + i])
        a = fp4attn.decode(q[i], ring, thrift_budget=0.1, window_size=(w, 0))
        b = fp4attn.decode(q[i], full, thrift_budget=0.1, window_size=(w, 0))
        assert torch.equal(a, b), i
    ref, _ = decode_reference(q[0], full, scale=D ** -0.5, thrift_budget=0.1, window=w)
    _thrift_close(fp4attn.decode(q[0], full, thrift_budget=0.1, window_size=(w, 0)), ref)
    # CUDA graph: eager steps vs replays of one captured step, on reserved ring caches
    eager, graphed = build(w), build(w)
    for c in (eager, graphed):
        c.reserve(1500 + steps)
    want = []
    for i in range(steps):
        eager.append(k[:, :, 1500 + i:1501 + i], v[:, :, 1500 + i:1501 + i])
        want.append(fp4attn.decode(q[i], eager, thrift_budget=0.1, window_size=(w, 0)))
    sk, sv, sq = k[:, :, 1500:1501].clone(), v[:, :, 1500:1501].clone(), q[0].clone()
    warm = build(w)  # compile outside the capture
    warm.append(sk, sv)
    fp4attn.decode(sq, warm, thrift_budget=0.1, window_size=(w, 0))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graphed.append(sk, sv)
        out = fp4attn.decode(sq, graphed, thrift_budget=0.1, window_size=(w, 0))
    graphed.sync_lengths()
    for i in range(steps):
        sk.copy_(k[:, :, 1500 + i:1501 + i])
        sv.copy_(v[:, :, 1500 + i:1501 + i])
        sq.copy_(q[i])
        graph.replay()
        assert torch.equal(out, want[i]), i
    graphed.sync_lengths()
    _assert_same_storage(eager, graphed)

