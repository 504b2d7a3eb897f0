"""ThriftAttention prefill with a sliding window (``window_size``) and attention sinks (``sinks``).

Reference: block visibility is the block-wise OR of the per-key window mask; the budget rule over the
window's band; budget 1 is 16-bit windowed attention, an empty selection is two-level NVFP4 windowed
attention (both with sinks). Kernels (interpreter, tiny sizes): selection bit-exact against the reference,
the fused kernel against the reference; GPU tests with the mark."""

import itertools
import os
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import reference  # noqa: E402
from fp4attn.reference.common import effective_window, normalize_window, window_keep  # noqa: E402
from fp4attn.reference.thrift import budget_to_k, selected_per_block, visible_blocks  # noqa: E402

# helpers of the Thrift kernel tests (tests/ is on sys.path under pytest's default rootdir import mode)
from test_thrift_kernels import _qkv, _rel, gpu, needs_interp  # noqa: E402


# ------------------------------------------------------------------------------------------------
# reference
# ------------------------------------------------------------------------------------------------
def test_visible_blocks_are_the_blockwise_or_of_the_window_mask():
    bs = 16
    n_cases = 0
    for nq, nk, left, right, causal in itertools.product([1, 5, 16, 40, 70], [1, 7, 16, 33, 90],
                                                         [-1, 0, 3, 15, 16, 40], [-1, 0, 5, 20], [False, True]):
        if causal and right not in (-1, 0):
            continue
        window = normalize_window((left, right), causal)
        if window is None:
            continue
        keep = window_keep(0, nq, nq, nk, causal, window, "cpu")
        nqb, nkb = -(-nq // bs), -(-nk // bs)
        blocks = torch.nn.functional.pad(keep, (0, nkb * bs - nk, 0, nqb * bs - nq)).view(nqb, bs, nkb, bs)
        expect = blocks.any(dim=3).any(dim=1)
        assert torch.equal(visible_blocks(nq, nk, bs, causal, "cpu", window), expect), (nq, nk, left, right, causal)
        # the budget rule: the band (most blocks one query block sees) for a window that cuts a key
        band = max(int(expect.sum(dim=1).max()), 1)
        for f in (0.05, 0.3, 0.5, 1.0):
            k = selected_per_block(f, nq, nk, bs, causal, window)
            if effective_window(window, causal, nq, nk) is None:
                assert k == budget_to_k(f, nkb, causal)
            else:
                assert k == min(max(round(f * band), 1), band)
        n_cases += 1
    assert n_cases > 300


def test_a_window_that_cuts_no_key_is_no_window():
    q, k, v = _qkv(1, 2, 1, 150, 150, 16, seed=3)
    for causal, window in ((True, (149, 0)), (True, (10**6, -1)), (False, (149, 149))):
        a = reference.thrift_attention(q, k, v, causal=causal, budget=0.3, block_size=16, window_size=window)
        b = reference.thrift_attention(q, k, v, causal=causal, budget=0.3, block_size=16)
        assert torch.equal(a, b)
    # one key less on the left is a window: it moves the budget to the band rule
    assert selected_per_block(0.3, 150, 150, 16, True, (148, 0)) != selected_per_block(0.3, 150, 150, 16, True, None)


WINDOWS = [(True, (40, 0)), (True, (5, 0)), (False, (30, 20)), (False, (-1, 10)), (False, (25, -1))]


@pytest.mark.parametrize("causal,window", WINDOWS)
def test_reference_budget_one_is_16bit_windowed_attention(causal, window):
    q, k, v = _qkv(1, 4, 2, 90, 130, 16, seed=5, dtype=torch.float64)
    sinks = torch.tensor([0.5, -1.0, 3.0, float("-inf")], dtype=torch.float64)
    for s in (None, sinks):
        out, lse = reference.thrift_attention(q, k, v, causal=causal, budget=1.0, block_size=16, window_size=window,
                                              sinks=s, return_lse=True)
        exact, exact_lse = reference.attention(q, k, v, causal=causal, recipe="bf16", window_size=window, sinks=s,
                                               return_lse=True)
        assert torch.allclose(out, exact, atol=1e-12) and torch.allclose(lse, exact_lse, atol=1e-12)


@pytest.mark.parametrize("causal,window", WINDOWS[:3])
def test_reference_nothing_selected_is_two_level_nvfp4_windowed_attention(causal, window):
    q, k, v = _qkv(1, 2, 1, 90, 130, 16, seed=6, dtype=torch.float64)
    none = torch.zeros(1, 2, 6, 9, dtype=torch.bool)
    for s in (None, torch.tensor([0.7, 4.0], dtype=torch.float64)):
        out = reference.thrift_attention(q, k, v, causal=causal, block_size=16, window_size=window, sinks=s,
                                         selection=none)
        fp4 = reference.attention(q, k, v, causal=causal, recipe="nvfp4", two_level_p=True, window_size=window,
                                  sinks=s)
        assert torch.equal(out, fp4)


def test_reference_selection_stays_inside_the_window():
    q, k, _ = _qkv(2, 2, 1, 200, 200, 16, seed=7)
    window = (30, 0)
    sel = reference.select_blocks(q, k, causal=True, budget=0.5, block_size=16, window=window)
    vis = visible_blocks(200, 200, 16, True, "cpu", window)
    assert not (sel & ~vis).any()
    kk = selected_per_block(0.5, 200, 200, 16, True, window)
    assert kk == 2  # band: 3 blocks (queries 16i..16i+15 see keys 16i-30..16i+15: blocks i-2..i); round(1.5) = 2
    n = sel.sum(dim=-1)
    assert torch.equal(n, torch.clamp(vis.sum(dim=-1), max=kk).expand_as(n))


# ------------------------------------------------------------------------------------------------
# kernels (interpreter)
# ------------------------------------------------------------------------------------------------
KCASES = [  # causal, window, (B, Hq, Hkv, Nq, Nk, D), budget
    (True, (70, 0), (1, 2, 1, 200, 200, 16), 0.5),
    (True, (10, 0), (1, 2, 1, 130, 260, 16), 1.0),
    (False, (40, 90), (1, 2, 2, 100, 300, 16), 0.4),
    (False, (-1, 30), (1, 2, 1, 150, 150, 16), 0.3),
    (True, (20, 0), (1, 2, 1, 300, 150, 16), 0.5),  # Nq > Nk: the first rows see no key
]


@needs_interp
@pytest.mark.parametrize("causal,window,shape,budget", KCASES)
def test_selection_kernel_with_window_matches_reference(causal, window, shape, budget):
    from fp4attn.kernels.thrift import select

    q, k, _ = _qkv(*shape, seed=8)
    seli, selm, kk = select(q, k, causal=causal, budget=budget, window=window)
    ref = reference.select_blocks(q, k, causal=causal, budget=budget, block_size=64, window=window)
    # (Nq > Nk, causal: a query block whose rows see no key selects nothing; the kernel's integer division
    # truncates toward zero, so its last visible key block is tested for a negative key first)
    assert torch.equal(selm, ref)
    assert kk == selected_per_block(budget, shape[3], shape[4], 64, causal, window)
    for b, h, i in itertools.product(range(q.shape[0]), range(q.shape[1]), range(selm.shape[2])):
        idx = sorted(x for x in seli[b, h, i].tolist() if x >= 0)
        assert idx == torch.nonzero(ref[b, h, i]).flatten().tolist()


@needs_interp
@pytest.mark.parametrize("causal,window,shape,budget", KCASES)
def test_fused_kernel_with_window_matches_reference(causal, window, shape, budget):
    from fp4attn.kernels.thrift import select, thrift_fwd

    q, k, v = _qkv(*shape, seed=9)
    sel = select(q, k, causal=causal, budget=budget, window=window)
    out, lse = thrift_fwd(q, k, v, causal=causal, scale=shape[-1] ** -0.5, budget=budget, selection=sel,
                          window=window)
    ref, ref_lse = reference.thrift_attention(q, k, v, causal=causal, budget=budget, window_size=window,
                                              return_lse=True)
    # as test_thrift_kernels' non-window test: the same values up to float rounding (two-level P does not
    # depend on the running max)
    assert _rel(out, ref) <= 1e-4
    assert torch.allclose(lse, ref_lse, atol=1e-4)
    # the window matters (the same call without it is far off)
    assert _rel(fp4attn.thrift_attention(q, k, v, causal=causal, budget=budget), ref) > 0.05


@needs_interp
@pytest.mark.parametrize("causal,window", [(True, None), (True, (50, 0)), (False, None)])
def test_fused_kernel_with_sinks_matches_reference(causal, window):
    from fp4attn.kernels.thrift import thrift_fwd

    q, k, v = _qkv(2, 4, 2, 130, 130, 16, seed=10)
    sinks = torch.tensor([0.0, 6.0, -2.0, float("-inf")])
    out, lse = thrift_fwd(q, k, v, causal=causal, scale=0.25, budget=0.4, window=window, sinks=sinks)
    ref, ref_lse = reference.thrift_attention(q, k, v, causal=causal, scale=0.25, budget=0.4, window_size=window,
                                              sinks=sinks, return_lse=True)
    assert _rel(out, ref) <= 1e-4
    assert torch.allclose(lse, ref_lse, atol=1e-4)
    # a -inf sink is no sink; a large one takes most of the mass
    plain = reference.thrift_attention(q, k, v, causal=causal, scale=0.25, budget=0.4, window_size=window)
    assert torch.allclose(out[:, 3], plain[:, 3], atol=1e-5)
    assert out[:, 1].norm() < 0.6 * plain[:, 1].norm()


@needs_interp
def test_rows_without_keys_get_the_sink_alone():
    """Nq > Nk causal: the first Nq − Nk rows see no key; with a sink their output is 0 and LSE = the sink."""
    q, k, v = _qkv(1, 2, 1, 100, 40, 16, seed=11)
    sinks = torch.tensor([1.5, float("-inf")])
    out, lse = fp4attn.thrift_attention(q, k, v, causal=True, budget=0.5, window_size=(10, 0), sinks=sinks,
                                        return_lse=True)
    assert torch.equal(out[0, :, :60], torch.zeros_like(out[0, :, :60]))
    assert torch.allclose(lse[0, 0, :60], torch.full((60,), 1.5))
    assert torch.isneginf(lse[0, 1, :60]).all()
    ref, ref_lse = reference.thrift_attention(q, k, v, causal=True, budget=0.5, window_size=(10, 0), sinks=sinks,
                                              return_lse=True)
    assert _rel(out, ref) <= 1e-4 and torch.allclose(lse, ref_lse, atol=1e-4)


@needs_interp
def test_op_bshd_layout_and_gqa_with_window_and_sinks():
    q, k, v = _qkv(1, 4, 2, 140, 140, 16, seed=12)
    sinks = torch.tensor([0.1, 0.2, 0.3, 0.4])
    out = fp4attn.thrift_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                                   budget=0.5, window_size=(60, 0), sinks=sinks, layout="bshd")
    ref = reference.thrift_attention(q, k, v, causal=True, budget=0.5, window_size=(60, 0), sinks=sinks)
    assert _rel(out.transpose(1, 2), ref) <= 1e-4


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
def test_validation_names_the_argument():
    q, k, v = _qkv(1, 2, 1, 20, 20, 16)
    with pytest.raises(ValueError, match="window_size"):
        fp4attn.thrift_attention(q, k, v, causal=True, window_size=(4, 3))
    with pytest.raises(TypeError, match="window_size"):
        fp4attn.thrift_attention(q, k, v, window_size=5)
    with pytest.raises(ValueError, match="sinks"):
        fp4attn.thrift_attention(q, k, v, sinks=torch.zeros(3))
    with pytest.raises(TypeError, match="sinks"):
        fp4attn.thrift_attention(q, k, v, sinks=[0.0, 0.0])


# ------------------------------------------------------------------------------------------------
# transformers: Mistral (sliding window) and gpt-oss (sinks, a sliding layer) under recipe="thrift"
# ------------------------------------------------------------------------------------------------
def _spy(monkeypatch):
    calls = []
    real = fp4attn.thrift_attention
    monkeypatch.setattr(fp4attn, "thrift_attention", lambda *a, **kw: calls.append(
        (kw.get("window_size"), kw.get("sinks") is not None)) or real(*a, **kw))
    return calls


def test_mistral_thrift_runs_one_windowed_call_per_layer_and_sequence(monkeypatch):
    """recipe="thrift" on a sliding-window model: one thrift_attention call per layer with window_size=(w - 1, 0)
    (per sequence with left padding), no per-row split; budget 1 (every visible block in 16 bits, float32 on CPU)
    gives transformers' sdpa logits."""
    fh = pytest.importorskip("fp4attn.integrations.transformers")
    from test_integrations import _mistral

    m = _mistral()
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(31))
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, :9] = 0  # left padding
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    calls = _spy(monkeypatch)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no "many op calls" warning, no fallback
        m.set_attn_implementation(fh.register("thrift", budget=1.0, block_size=16))
        out = m(ids).logits
        assert calls == [((7, 0), False)] * 2
        out_pad = m(ids, attention_mask=am, position_ids=pos).logits
        assert calls[2:] == [((7, 0), False)] * 4
        m.set_attn_implementation("sdpa")
        ref = m(ids).logits
        ref_pad = m(ids, attention_mask=am, position_ids=pos).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_pad[am.bool()], ref_pad[am.bool()], rtol=1e-4, atol=1e-4)


def test_gpt_oss_thrift_runs_with_its_sinks(monkeypatch):
    """gpt-oss under recipe="thrift": its sinks go to thrift_attention (no eager fallback), the sliding layer with
    its window; budget 1 gives transformers' eager logits; a small budget stays close to them."""
    fh = pytest.importorskip("fp4attn.integrations.transformers")
    from test_sinks import _gpt_oss

    m = _gpt_oss()
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(32))
    calls = _spy(monkeypatch)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        m.set_attn_implementation(fh.register("thrift", budget=1.0, block_size=16))
        out = m(ids).logits
        assert calls == [((7, 0), True), (None, True)]
        m.set_attn_implementation(fh.register("thrift", budget=0.3, block_size=16))
        low = m(ids).logits
        m.set_attn_implementation("eager")
        ref = m(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert 0 < (low - ref).abs().max() < 0.5


def test_mistral_thrift_decodes_the_window_from_fp4_pages(monkeypatch):
    """Thrift decode steps of a sliding-window model on fp4_cache(keep_16bit=True) run fp4attn.decode with the
    window and the budget (eagerly from the mask, under CUDA-graph capture from the layer's sliding_window: the
    same logits); budget 1 equals the 16-bit window attention of the dense path, a small budget stays near it."""
    fh = pytest.importorskip("fp4attn.integrations.transformers")
    from transformers import DynamicCache

    from test_integrations import _mistral, _teacher_forced

    m = _mistral(window=12)
    ids = torch.randint(0, 96, (2, 44), generator=torch.Generator().manual_seed(33))
    calls = []
    real = fp4attn.decode
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: calls.append(
        (kw.get("window_size"), kw.get("thrift_budget"))) or real(*a, **kw))
    low = fh.register("thrift", budget=0.25, block_size=64)
    cached = _teacher_forced(m, low, fh.fp4_cache(m.config, keep_16bit=True), ids, 36)
    assert calls == [((11, 0), 0.25)] * 16
    monkeypatch.setattr(fh, "_capturing", lambda: True)
    assert torch.equal(_teacher_forced(m, low, fh.fp4_cache(m.config, keep_16bit=True), ids, 36), cached)
    assert calls[16:] == [((11, 0), 0.25)] * 16
    monkeypatch.setattr(fh, "_capturing", lambda: False)
    full = _teacher_forced(m, fh.register("thrift", budget=1.0), fh.fp4_cache(m.config, keep_16bit=True), ids, 36)
    exact = _teacher_forced(m, "sdpa", DynamicCache(config=m.config), ids, 36)
    # budget 1: every page of the window from the 16-bit copy (float32 here), the prompt's blocks in 16 bits
    torch.testing.assert_close(full, exact, rtol=1e-4, atol=1e-4)
    assert 0 < (cached - exact).abs().max() < 0.5


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("causal,window", [(True, (1023, 0)), (True, (300, 0)), (False, (200, 500))])
def test_thrift_window_and_sinks_gpu(causal, window):
    from fp4attn.kernels.thrift import select

    q, k, v = _qkv(2, 8, 2, 2000, 2000, 128, seed=13, dtype=torch.bfloat16, device="cuda")
    sinks = torch.linspace(-2, 3, 8, device="cuda")
    for budget, s in ((0.1, None), (0.25, sinks)):
        _, selm, _ = select(q, k, causal=causal, budget=budget, window=window)
        ref_sel = reference.select_blocks(q, k, causal=causal, budget=budget, block_size=64, window=window)
        # FP32 block means summed in another order: near-ties may differ (as the non-window GPU test)
        assert (selm == ref_sel).float().mean().item() >= 0.995
        out = fp4attn.thrift_attention(q, k, v, causal=causal, budget=budget, window_size=window, sinks=s)
        ref = reference.thrift_attention(q, k, v, causal=causal, budget=budget, window_size=window, sinks=s,
                                         selection=selm)
        exact = reference.attention(q, k, v, causal=causal, recipe="bf16", window_size=window, sinks=s)
        cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), 0).item()
        assert cos >= 0.998 and _rel(out, ref) <= 0.05
        assert _rel(out, exact) <= 1.05 * _rel(ref, exact) + 1e-3  # + bf16 output rounding
    full = fp4attn.thrift_attention(q, k, v, causal=causal, budget=1.0, window_size=window, sinks=sinks)
    exact = reference.attention(q, k, v, causal=causal, recipe="bf16", window_size=window, sinks=sinks)
    assert _rel(full, exact) <= 1e-2


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("D", [128, 64])
def test_thrift_window_gluon_fp4_phase_gpu(D, monkeypatch):
    """With a sliding window of at least ``GLUON_MIN_WINDOW`` keys the FP4 phase runs on the Gluon attention pass too
    (its window: the key loop from the window's first tile, the edges' tiles masked), then the fused kernel's 16-bit
    phase (narrower windows: both phases in the fused kernel, where that is faster): against the fused Triton
    kernel (``FP4ATTN_THRIFT_KERNEL=triton``), which rounds P̃/s1 at float32 instead of float16 precision: the
    bound of ``test_thrift_gluon_fp4_phase_gpu`` (3e-2 relative L2; the LSEs sum the unrounded P̃: 1e-4), with
    and without sinks; budget 1 (every visible tile in 16 bits) bit-identical."""
    from fp4attn.kernels import thrift as T

    q, k, v = _qkv(2, 8, 2, 1000, 1000, D, seed=17, dtype=torch.bfloat16, device="cuda")
    if not T.gluon_fp4_phase(q):
        pytest.skip("the Gluon attention pass needs an sm_90 GPU and Triton's Gluon")
    assert not T.gluon_fp4_phase(q, (T.GLUON_MIN_WINDOW - 2, 0)) and T.gluon_fp4_phase(q, (T.GLUON_MIN_WINDOW - 1, 0))
    assert T.gluon_fp4_phase(q, (-1, 10)) and not T.gluon_fp4_phase(q, (300, 200))
    sinks = torch.linspace(-1.0, 3.0, 8, device="cuda")
    for causal, window in ((True, (600, 0)), (False, (400, 300))):
        monkeypatch.delenv("FP4ATTN_THRIFT_KERNEL", raising=False)
        assert T.gluon_fp4_phase(q, window)
        runs = {}
        for kern in ("auto", "triton"):
            monkeypatch.setenv("FP4ATTN_THRIFT_KERNEL", kern)
            for budget in (1.0, 0.1):
                for sk in (None, sinks):
                    runs[kern, budget, sk is None] = T.thrift_fwd(q, k, v, causal=causal, scale=D ** -0.5,
                                                                  budget=budget, window=window, sinks=sk)
        for nosink in (True, False):
            assert torch.equal(runs["auto", 1.0, nosink][0], runs["triton", 1.0, nosink][0])
            (o_g, l_g), (o_r, l_r) = runs["auto", 0.1, nosink], runs["triton", 0.1, nosink]
            assert _rel(o_g, o_r) < 3e-2, (causal, nosink, _rel(o_g, o_r))
            torch.testing.assert_close(l_g, l_r, rtol=0, atol=1e-4)


@pytest.mark.gpu
@gpu
def test_thrift_window_opcheck_and_compile_gpu():
    import fp4attn.ops.thrift  # noqa: F401  (registers the custom op)

    q, k, v = _qkv(1, 4, 2, 300, 300, 64, seed=14, dtype=torch.bfloat16, device="cuda")
    sinks = torch.zeros(4, device="cuda")
    torch.library.opcheck(torch.ops.fp4attn.thrift_attention_fp4,
                          (q, k, v, True, 0.125, 0.25, "bhsd", True, 100, 0, sinks))

    def f(q, k, v):
        return fp4attn.thrift_attention(q, k, v, causal=True, budget=0.25, window_size=(100, 0), sinks=sinks)

    eager = f(q, k, v)
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v), eager)
