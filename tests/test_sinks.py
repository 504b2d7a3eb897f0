"""Attention sinks (gpt-oss's ``sinks`` / transformers' ``s_aux``): one logit per query head that joins every
row's softmax without a value. ``fp4attn.attention(..., sinks=)`` and ``fp4attn.decode(..., sinks=)``:
reference semantics against independent float64 computations, validation, the Triton kernels under the
interpreter against the reference, and on GPU (``@pytest.mark.gpu``); the transformers integration on a
small gpt-oss model."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn import reference  # noqa: E402
from fp4attn.kernels import attention as A  # noqa: E402
from fp4attn.kvcache import KVCache  # noqa: E402
from fp4attn.ops.decode import decode_reference  # noqa: E402
from test_attention_kernels import cpu_interp, gpu, make_qkv, rel_l2, spec_check  # noqa: E402

INF = float("inf")


def sink_exact(q, k, v, sinks, *, causal, scale=None):
    """Unquantized attention with sinks in float64, written out: the sink as an extra score column whose
    value row is zero (the gpt-oss eager formulation: softmax over [scores, sink], the sink column dropped)."""
    q, k, v = q.double(), k.double(), v.double()
    hq, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hkv, 1)
    v = v.repeat_interleave(hq // hkv, 1)
    s = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    nq, nk = s.shape[-2:]
    if causal:
        keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + nk - nq
        s = s.masked_fill(~keep, -INF)
    sk = sinks.double().view(1, hq, 1, 1).expand(*s.shape[:-1], 1)
    p = torch.softmax(torch.cat([s, sk], -1), -1)[..., :-1].nan_to_num(0.0)  # (-inf sink, no key: 0)
    lse = torch.logsumexp(torch.cat([s, sk], -1), -1)
    return p @ v, lse


def _sinks(h, seed=0, scale=2.0):
    return torch.randn(h, generator=torch.Generator().manual_seed(seed)) * scale


# -------------------------------------------------------------------------------------------------
# reference semantics
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal,nq,nk", [(False, 20, 30), (True, 30, 20), (True, 20, 30)])
def test_reference_bf16_with_sinks_equals_explicit_sink_column(causal, nq, nk):
    """The unquantized recipe with sinks is softmax over [scores, sink] with the sink column dropped (rows
    that see no key: output 0, LSE = the sink); GQA; a -inf sink is no sink."""
    q, k, v = make_qkv(2, 4, 2, nq, nk, 16, seed=1, device="cpu")
    sinks = _sinks(4, seed=2)
    sinks[3] = -INF
    out, lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe="bf16",
                                   sinks=sinks.double(), return_lse=True)
    ref, ref_lse = sink_exact(q, k, v, sinks, causal=causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)
    plain = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe="bf16")
    assert torch.equal(out[:, 3], plain[:, 3])  # the -inf sink
    assert (out[:, :3] - plain[:, :3]).abs().max() > 1e-3
    if causal and nq > nk:
        assert (out[:, :, : nq - nk] == 0).all() and torch.equal(lse[:, :, 0], sinks.double().expand(2, 4))


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4"])
def test_reference_fp4_sinks_quantize_against_the_max_including_the_sink(recipe):
    """P̃ = exp(S − m) with m = max(row max, sink): a sink above every score makes P̃ < 1 and changes its
    quantization, a sink far below every score changes nothing but l (out scaled by l / (l + e^(sink − m)))."""
    q, k, v = make_qkv(1, 2, 1, 16, 48, 32, seed=3, device="cpu")
    qd, kd, vd = q.double(), k.double(), v.double()
    plain, plse = reference.attention(qd, kd, vd, recipe=recipe, return_lse=True)
    low = torch.tensor([-30.0, -40.0], dtype=torch.float64)
    out, lse = reference.attention(qd, kd, vd, recipe=recipe, sinks=low, return_lse=True)
    frac = torch.exp(plse - torch.logaddexp(plse, low.view(1, 2, 1)))  # l / (l + e^sink) in LSE terms
    torch.testing.assert_close(out, plain * frac[..., None], rtol=1e-12, atol=0)
    torch.testing.assert_close(lse, torch.logaddexp(plse, low.view(1, 2, 1)), rtol=0, atol=1e-12)
    high = torch.tensor([6.0, 6.0], dtype=torch.float64)
    out_h = reference.attention(qd, kd, vd, recipe=recipe, sinks=high)
    exact_h, _ = sink_exact(q, k, v, high, causal=False)
    # the same error budget as without sinks, but a different rounding than rescaling the sinkless P̂
    assert rel_l2(out_h, exact_h) < 0.3
    lh = torch.exp(plse - torch.logaddexp(plse, high.view(1, 2, 1)))
    assert (out_h - plain * lh[..., None]).abs().max() > 1e-6


def test_reference_sinks_move_with_k_smoothing():
    """K smoothing shifts each score row by scale·q·k̄; the sink must move with it. Unquantized (recipe bf16
    with smooth_k), the smoothed computation equals the plain one to float64 rounding."""
    q, k, v = make_qkv(1, 4, 2, 24, 40, 16, seed=4, device="cpu")
    k = k + 3.0  # a large common K component: a large shift
    sinks = _sinks(4, seed=5)
    kw = dict(causal=True, recipe="bf16", sinks=sinks.double(), return_lse=True)
    a = reference.attention(q.double(), k.double(), v.double(), smooth_k=True, **kw)
    b = reference.attention(q.double(), k.double(), v.double(), **kw)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-12)


def test_sinks_validation():
    q, k, v = make_qkv(1, 4, 2, 8, 8, 16, device="cpu")
    with pytest.raises(TypeError, match="sinks"):
        fp4attn.attention(q, k, v, sinks=[0.0] * 4)
    with pytest.raises(ValueError, match=r"sinks must have shape \(Hq,\) = \(4,\)"):
        fp4attn.attention(q, k, v, sinks=torch.zeros(2))
    with pytest.raises(TypeError, match="floating"):
        fp4attn.attention(q, k, v, sinks=torch.zeros(4, dtype=torch.long))
    c = KVCache.from_dense(k, v, dtype=torch.float32)
    with pytest.raises(ValueError, match="sinks"):
        fp4attn.decode(q[:, :, :1], c, sinks=torch.zeros(3))
    # CPU: the reference, bshd layout too
    s = _sinks(4, seed=6)
    o1 = fp4attn.attention(q, k, v, causal=True, sinks=s)
    o2 = fp4attn.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, sinks=s,
                           layout="bshd")
    assert torch.equal(o1, o2.transpose(1, 2))


# -------------------------------------------------------------------------------------------------
# kernels under the interpreter
# -------------------------------------------------------------------------------------------------
SINK_CASES = [
    # recipe, causal, window, nq, nk, online, flags
    ("nvfp4", True, None, 70, 90, None, {}),
    ("mxfp4", False, None, 70, 90, None, {}),
    ("nvfp4", True, None, 100, 40, None, {}),  # Nq > Nk: rows that see no key (0, LSE = sink)
    ("sage3", True, (20, 0), 130, 130, None, {}),  # smooth_k: the per-row shifted sink; two-level P
    ("nvfp4", False, None, 64, 200, True, {}),  # one-pass online softmax starting from the sink (4 key tiles)
    ("mxfp4", True, None, 40, 100, None, {"two_level_p": True}),
]


@cpu_interp
@pytest.mark.parametrize("case", SINK_CASES, ids=lambda c: f"{c[0]}-c{int(c[1])}-{c[2]}-{c[3]}x{c[4]}-{c[5]}")
def test_interpreter_sinks_vs_reference(case):
    recipe, causal, window, nq, nk, online, flags = case
    q, k, v = make_qkv(1, 2, 1, nq, nk, 32, seed=nq + nk)
    sinks = torch.tensor([1.5, -INF if nq == 100 else 4.0])
    fmt, _, sq, sk, tlp = reference.recipe_flags(recipe, **flags)
    out, lse = A.attention_fwd(q, k, v, causal=causal, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp,
                               path=A.PATH_INTERP, window=reference.common.normalize_window(window, causal),
                               sinks=sinks, online=online)
    ref, ref_lse = reference.attention(q.double(), k.double(), v.double(), causal=causal, recipe=recipe,
                                       window_size=window, sinks=sinks.double(), return_lse=True, **flags)
    if online:
        # one-pass online softmax quantizes early tiles against a running max (module docstring of the kernel):
        # the SPEC §6 criteria, not the reference's decisions (measured: rel 0.030, cos 0.9995, own error 1.00x)
        cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0).item()
        assert cos >= 0.998 and rel_l2(out, ref) <= 0.05, (cos, rel_l2(out, ref))
        exact = sink_exact(q, k, v, sinks, causal=causal)[0]
        assert rel_l2(out, exact) <= 1.05 * rel_l2(ref, exact), (rel_l2(out, exact), rel_l2(ref, exact))
        # ... and it did run with a running max over several key tiles: not the two-pass output
        two_pass, _ = A.attention_fwd(q, k, v, causal=causal, fmt=fmt, smooth_q=sq, smooth_k=sk, two_level_p=tlp,
                                      path=A.PATH_INTERP, sinks=sinks, online=False)
        assert rel_l2(out, two_pass) > 1e-3
    else:  # the exact row max including the sink (or two-level P): the reference's quantization decisions
        assert rel_l2(out, ref) <= 1e-4, rel_l2(out, ref)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=1e-4)
    if nq > nk and causal:
        dead = slice(0, nq - nk)
        assert (out[:, 0, dead] == 0).all() and (lse[:, 0, dead] == 1.5).all()
        assert (lse[:, 1, dead] == -INF).all()  # a -inf sink and no key: -inf, as without sinks


@cpu_interp
def test_interpreter_huge_sink_gives_zero_output_and_the_sink_as_lse():
    """A sink far above every score takes the whole softmax: O = 0 and LSE = the sink (to rounding)."""
    q, k, v = make_qkv(1, 2, 1, 40, 40, 32, seed=7)
    out, lse = A.attention_fwd(q, k, v, causal=True, path=A.PATH_INTERP, sinks=torch.tensor([200.0, 200.0]))
    assert out.abs().max() < 1e-30 and torch.allclose(lse, torch.full_like(lse, 200.0))


# -------------------------------------------------------------------------------------------------
# decode
# -------------------------------------------------------------------------------------------------
def _cache(lens, G, nq, seed, n=None):
    B, Hkv, D = len(lens), 2, 32
    g = torch.Generator().manual_seed(seed)
    n = n or max(lens)
    k, v = torch.randn(B, Hkv, n, D, generator=g), torch.randn(B, Hkv, n, D, generator=g)
    c = KVCache.from_dense(k, v, lengths=lens, dtype=torch.float32)
    return c, k, v, torch.randn(B, Hkv * G, nq, D, generator=g)


def test_decode_reference_with_sinks_equals_attention_reference():
    """No raw tail: decode with sinks over the cache == attention(causal, nvfp4, sinks) (two references)."""
    c, k, v, q = _cache([96, 96], 3, 4, seed=8)
    s = _sinks(6, seed=9)
    out, lse = fp4attn.decode(q, c, sinks=s, return_lse=True)
    ref, ref_lse = reference.attention(q, k, v, causal=True, recipe="nvfp4", sinks=s, return_lse=True)
    assert rel_l2(out, ref) <= 1e-5
    torch.testing.assert_close(lse, ref_lse.float(), rtol=0, atol=1e-5)


@cpu_interp
@pytest.mark.parametrize("G,nq", [(1, 1), (2, 4), (4, 4)])
def test_decode_kernel_interpreter_sinks_one_tile_equals_reference(G, nq):
    """One key tile per sequence: the split kernel starts its running max at the sink, as the reference's
    one-shot max includes it, and the reduce adds the sink's share of l once: equal to float32 rounding."""
    from fp4attn.kernels.decode import decode_fwd

    c, _, _, q = _cache([32, 16, 32], G, nq, seed=10, n=32)
    s = _sinks(2 * G, seed=11)
    out, lse = decode_fwd(q, c, scale=32 ** -0.5, block_n=32, sinks=s)
    ref, ref_lse = decode_reference(q, c, scale=32 ** -0.5, sinks=s)
    assert rel_l2(out, ref) <= 1e-5
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-5)


@cpu_interp
@pytest.mark.parametrize("window", [None, 40])
def test_decode_kernel_interpreter_sinks_ragged_splits(window):
    """Ragged lengths, raw tails, several splits, with and without a window: the LSE is the reference's
    (the same visible keys and sink) and the output within SPEC §6 of it (P̃ against each split's running max)."""
    from fp4attn.kernels.decode import decode_fwd

    c, k, v, q = _cache([200, 77], 2, 1, seed=12)
    s = _sinks(4, seed=13)
    out, lse = decode_fwd(q, c, scale=32 ** -0.5, num_splits=3, window=window, sinks=s)
    ref, ref_lse = decode_reference(q, c, scale=32 ** -0.5, window=window, sinks=s)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-5)
    cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0).item()
    assert cos >= 0.998 and rel_l2(out, ref) <= 0.05


@cpu_interp
def test_decode_kernel_interpreter_sinks_any_float_dtype_and_batch_rows():
    """The kernels read the (Hq,) sinks tensor itself (query head = row's head modulo Hq, times log2 e in the
    kernel): bf16 or strided sinks give the bits of their float32 copy, and each sequence of a batch its own
    rows' sinks (a sink moved to another head changes only that head's output)."""
    from fp4attn.kernels.decode import decode_fwd

    c, _, _, q = _cache([200, 77, 130], 2, 2, seed=14)
    s = _sinks(4, seed=15).bfloat16().float()  # bf16-representable values
    want = decode_fwd(q, c, scale=32 ** -0.5, num_splits=2, sinks=s)
    for other in (s.bfloat16(), torch.stack([s, s], 1)[:, 0]):  # bf16; a strided view
        got = decode_fwd(q, c, scale=32 ** -0.5, num_splits=2, sinks=other)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    moved = s.clone()
    moved[3] = 5.0
    got = decode_fwd(q, c, scale=32 ** -0.5, num_splits=2, sinks=moved)[0]
    assert torch.equal(got[:, :3], want[0][:, :3]) and not torch.equal(got[:, 3], want[0][:, 3])


# -------------------------------------------------------------------------------------------------
# Attn-QAT with sinks (training)
# -------------------------------------------------------------------------------------------------
def test_reference_attn_qat_sink_gradient_is_the_gradient_of_o_prime_and_lse():
    """Attn-QAT's sink gradient −Σ exp(sink − LSE)·(rowsum(dO∘O') − dlse) is the exact gradient of a loss on
    O' (the unquantized-P̃ output) and the LSE: float64 autograd through an explicit sink column agrees."""
    from fp4attn.formats.core import fake_quantize_values
    from fp4attn.reference.attn_qat import attn_qat_backward, attn_qat_forward

    q, k, v = make_qkv(2, 4, 2, 24, 40, 16, dtype=torch.float64, seed=20, device="cpu")
    sinks = _sinks(4, seed=21).double()
    g = torch.Generator().manual_seed(22)
    do, dlse = torch.randn(2, 4, 24, 16, generator=g).double(), torch.randn(2, 4, 24, generator=g).double()
    o, o_prime, lse = attn_qat_forward(q, k, v, causal=True, fmt="nvfp4", sinks=sinks)
    *_, dsink = attn_qat_backward(do, q, k, v, o, o_prime, lse, causal=True, fmt="nvfp4", dlse=dlse, sinks=sinks)
    # explicit: Qᶠ, Kᶠ, Vᶠ fixed (straight-through), the sinks a leaf
    qf, kf, vf = (fake_quantize_values(x, "nvfp4", dim=d).double() for x, d in ((q, -1), (k, -1), (v, -2)))
    kf, vf = kf.repeat_interleave(2, 1), vf.repeat_interleave(2, 1)
    s = (qf @ kf.transpose(-1, -2)) * 16 ** -0.5
    keep = torch.arange(40)[None, :] <= torch.arange(24)[:, None] + 16
    s = s.masked_fill(~keep, -INF)
    leaf = sinks.clone().requires_grad_()
    full = torch.cat([s, leaf.view(1, 4, 1, 1).expand(2, 4, 24, 1)], -1)
    o_p = torch.softmax(full, -1)[..., :-1] @ vf
    lse_x = torch.logsumexp(full, -1)
    torch.testing.assert_close(o_p, o_prime, rtol=0, atol=1e-12)
    ((o_p * do).sum() + (lse_x * dlse).sum()).backward()
    torch.testing.assert_close(dsink, leaf.grad, rtol=0, atol=1e-10)


@cpu_interp
@pytest.mark.parametrize("causal,window,fmt", [(True, None, "nvfp4"), (False, None, "mxfp4"), (True, (30, 0), "nvfp4")])
def test_interpreter_attn_qat_sinks_vs_reference(causal, window, fmt):
    """The Attn-QAT kernels with sinks (the forward starts from the sink; the backward kernels unchanged: P =
    exp(S − LSE)) against the reference: O, O', LSE, dQ, dK, dV; and the op's sink gradient (computed from
    the saved O' buffer and LSE) against the reference's."""
    from types import SimpleNamespace

    from fp4attn.kernels import attn_qat as K
    from fp4attn.ops.attn_qat import _sink_grad
    from fp4attn.reference.attn_qat import attn_qat_backward, attn_qat_forward
    from fp4attn.reference.common import normalize_window

    q, k, v = make_qkv(1, 2, 1, 70, 90, 32, seed=23)
    do = torch.randn(1, 2, 70, 32, generator=torch.Generator().manual_seed(24))
    sinks = torch.tensor([1.0, 3.0])
    win = normalize_window(window, causal)
    o = torch.empty_like(q)
    qf, kf, vf, op, lse = K.attn_qat_fwd_bhsd(q, k, v, o, causal=causal, scale=32 ** -0.5, fmt=fmt, hp_o=True,
                                              window=win, sinks=sinks)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    K.backward(do, op, qf, kf, vf, lse, dq, dk, dv, nq=70, nk=90, d=32, causal=causal, scale=32 ** -0.5, fmt=fmt,
               quant_p=True, window=win)
    qd, kd, vd, dod = (x.double() for x in (q, k, v, do))
    ro, rop, rlse = attn_qat_forward(qd, kd, vd, causal=causal, fmt=fmt, window_size=win, sinks=sinks.double())
    rdq, rdk, rdv, rds = attn_qat_backward(dod, qd, kd, vd, ro, rop, rlse, causal=causal, fmt=fmt, window_size=win,
                                           sinks=sinks.double())
    for got, want in ((o, ro), (op[:, :, :70, :32], rop), (dq, rdq), (dk, rdk), (dv, rdv)):
        assert rel_l2(got, want) <= 1e-4, rel_l2(got, want)
    torch.testing.assert_close(lse[:, :, :70].double(), rlse, rtol=0, atol=1e-4)
    ctx = SimpleNamespace(shape_q=[1, 2, 70, 32], hp_o=True, cfg={"layout": "bhsd"})
    torch.testing.assert_close(_sink_grad(ctx, do, None, op, lse, sinks).double(), rds, rtol=1e-4, atol=1e-6)
    plain = K.attn_qat_fwd_bhsd(q, k, v, torch.empty_like(q), causal=causal, scale=32 ** -0.5, fmt=fmt, hp_o=True,
                                window=win)[-1]
    assert (plain[:, :, :70] - lse[:, :, :70]).abs().max() > 1e-2  # the sinks reached the kernel


# -------------------------------------------------------------------------------------------------
# transformers: gpt-oss (sinks on every layer, alternating sliding-window and full layers)
# -------------------------------------------------------------------------------------------------
def _gpt_oss():
    transformers = pytest.importorskip("transformers", minversion="5.0")
    cfg = transformers.GptOssConfig(vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=512, sliding_window=8, num_local_experts=4,
                                    num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    m = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    return m


def test_gpt_oss_runs_fp4attn_with_sinks(monkeypatch):
    """gpt-oss: every layer's attention runs fp4attn with its sinks (the sliding layers with their window):
    the bf16 recipe gives transformers' eager logits; generate() decodes from the FP4 pages with the sinks and
    gives transformers' generate() tokens; in training (Attn-QAT has no sinks) the model's eager attention
    runs, with a warning."""
    fh = pytest.importorskip("fp4attn.integrations.transformers")
    m = _gpt_oss()
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(14))
    calls, dec = [], []
    real_attention, real_decode = fp4attn.attention, fp4attn.decode
    monkeypatch.setattr(fp4attn, "attention", lambda *a, **kw: calls.append((kw.get("window_size"),
                        kw.get("sinks") is not None)) or real_attention(*a, **kw))
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: dec.append((kw.get("window_size"),
                        kw.get("sinks") is not None)) or real_decode(*a, **kw))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        # (transformers 5.24 deprecates generate()'s past_key_values for cache=; 5.17-5.23 have only the former)
        warnings.filterwarnings("ignore", message=".*past_key_values.* is deprecated", category=FutureWarning)
        m.set_attn_implementation(fh.register("bf16"))
        out = m(ids).logits
        assert calls == [((7, 0), True), (None, True)]
        m.set_attn_implementation("eager")
        torch.testing.assert_close(out, m(ids).logits, rtol=1e-4, atol=1e-5)
        m.set_attn_implementation(fh.register("nvfp4"))
        ours = fh.generate(m, ids, 6, cuda_graph=False)
        theirs = m.generate(ids, max_new_tokens=6, do_sample=False, past_key_values=fh.fp4_cache(m.config))
    assert torch.equal(ours, theirs)
    assert dec[:4] == [((7, 0), True), (None, True)] * 2



def test_gpt_oss_training_runs_attn_qat_with_trainable_sinks(monkeypatch):
    """Training gpt-oss: one fp4attn.attn_qat call per layer with the sinks (and the sliding window); the sinks
    get gradients. With the bf16 recipe (exact attention with the sink column) every gradient, the sinks'
    included, is transformers' eager one."""
    fh = pytest.importorskip("fp4attn.integrations.transformers")
    m = _gpt_oss()
    m.train()
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(19))
    calls = []
    real = fp4attn.attn_qat
    monkeypatch.setattr(fp4attn, "attn_qat", lambda *a, **kw: calls.append((kw.get("window_size"),
                        kw.get("sinks") is not None)) or real(*a, **kw))

    def grads(impl):
        m.zero_grad()
        m.set_attn_implementation(impl)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            m(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    fp4 = grads(fh.register("nvfp4"))
    assert calls == [((7, 0), True), (None, True)]
    sink_names = [n for n in fp4 if n.endswith("sinks")]
    assert len(sink_names) == 2 and all(fp4[n].abs().max() > 0 for n in sink_names)
    exact, eager = grads(fh.register("bf16")), grads("eager")
    assert exact.keys() == eager.keys()
    for n in eager:
        torch.testing.assert_close(exact[n], eager[n], rtol=1e-4, atol=1e-6)


# -------------------------------------------------------------------------------------------------
# GPU
# -------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("recipe,causal,window", [("nvfp4", True, None), ("mxfp4", False, None),
                                                  ("sage3", True, (255, 0)), ("nvfp4", True, (127, 0))])
def test_gpu_attention_sinks_vs_reference(recipe, causal, window):
    q, k, v = make_qkv(2, 8, 2, 700, 900, 128, dtype=torch.bfloat16, seed=15)
    s = _sinks(8, seed=16).cuda()
    out, lse = fp4attn.attention(q, k, v, causal=causal, recipe=recipe, window_size=window, sinks=s,
                                 return_lse=True)
    qd, kd, vd = q.double(), k.double(), v.double()
    ref, ref_lse = reference.attention(qd, kd, vd, causal=causal, recipe=recipe, window_size=window,
                                       sinks=s.double(), return_lse=True)
    assert torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0) >= 0.998
    assert rel_l2(out, ref) <= 0.05
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=0, atol=2e-3)
    if window is None:  # the sinkless spec check of the same call without sinks still holds
        spec_check(fp4attn.attention(q, k, v, causal=causal, recipe=recipe).float(), q.float(), k.float(),
                   v.float(), causal=causal, recipe=recipe)


@gpu
@pytest.mark.gpu
def test_gpu_decode_sinks_vs_reference():
    B, Hkv, G, D = 3, 2, 4, 128
    lens = [3000, 777, 20]
    g = torch.Generator().manual_seed(17)
    k = torch.randn(B, Hkv, max(lens), D, generator=g).to("cuda", torch.bfloat16)
    v = torch.randn(B, Hkv, max(lens), D, generator=g).to("cuda", torch.bfloat16)
    c = KVCache.from_dense(k, v, lengths=lens)
    q = torch.randn(B, Hkv * G, 1, D, generator=g).to("cuda", torch.bfloat16)
    s = _sinks(Hkv * G, seed=18).cuda()
    for window in (None, (255, 0)):
        out, lse = fp4attn.decode(q, c, sinks=s, window_size=window, return_lse=True)
        ref, ref_lse = decode_reference(q, c, scale=D ** -0.5, sinks=s, window=None if window is None else 255)
        # the criteria of test_kvcache_decode.test_decode_kernel_gpu, for its reason (split running maxima)
        cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0).item()
        assert cos >= 0.995 and rel_l2(out, ref) <= 0.1
        torch.testing.assert_close(lse, ref_lse.float(), rtol=0, atol=1e-3)


@cpu_interp
def test_interpreter_attn_qat_sinks_running_max_variant(monkeypatch):
    """The one-pass (running max) Attn-QAT forward starts from the sink: O' and the LSE (which do not depend on
    P̃'s quantization) equal the reference's."""
    from fp4attn.kernels import attn_qat as K
    from fp4attn.reference.attn_qat import attn_qat_forward

    monkeypatch.setenv("FP4ATTN_QAT_EXACT_MAX", "0")
    assert not K.exact_max()
    q, k, v = make_qkv(1, 2, 1, 70, 90, 32, seed=25)
    sinks = torch.tensor([2.0, -1.0])
    _, _, _, op, lse = K.attn_qat_fwd_bhsd(q, k, v, torch.empty_like(q), causal=True, scale=32 ** -0.5, fmt="nvfp4",
                                           hp_o=True, sinks=sinks)
    _, rop, rlse = attn_qat_forward(q.double(), k.double(), v.double(), causal=True, sinks=sinks.double())
    assert rel_l2(op[:, :, :70, :32], rop) <= 1e-5
    torch.testing.assert_close(lse[:, :, :70].double(), rlse, rtol=0, atol=1e-5)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("causal,window", [(True, None), (True, (255, 0))])
def test_gpu_attn_qat_sinks_vs_reference(causal, window):
    """Attn-QAT with sinks on the GPU: O, LSE and every gradient (the sinks' too) against the reference."""
    q, k, v = make_qkv(2, 8, 2, 600, 600, 128, dtype=torch.bfloat16, seed=26)
    s = _sinks(8, seed=27).cuda()
    do = torch.randn_like(q)
    grads = []
    for x in ((q, k, v, s), tuple(t.detach().double().cpu() for t in (q, k, v, s))):
        leaves = [t.detach().clone().requires_grad_() for t in x]
        out, lse = fp4attn.attn_qat(*leaves[:3], causal=causal, window_size=window, sinks=leaves[3], return_lse=True)
        (out.double() * do.double().to(out.device)).sum().backward()
        grads.append((out.detach().double().cpu(), lse.detach().double().cpu(),
                      *[t.grad.double().cpu() for t in leaves]))
    for got, want in zip(*grads):
        assert rel_l2(got, want) <= 0.02, rel_l2(got, want)  # bf16 operands and outputs


def test_reference_attn_qat_sink_gradient_finite_for_rows_without_keys():
    """A row that sees no key with a -inf sink has LSE = -inf: its sink share is 0 (the gradient stays
    finite, not NaN); a finite sink on such a row gets its share 1·D = 0 (O' = 0 there)."""
    from fp4attn.reference.attn_qat import attn_qat_backward, attn_qat_forward

    q, k, v = make_qkv(1, 2, 1, 30, 10, 16, dtype=torch.float64, seed=29, device="cpu")  # Nq > Nk: 20 empty rows
    sinks = torch.tensor([-INF, 1.0], dtype=torch.float64)
    do = torch.randn(1, 2, 30, 16, generator=torch.Generator().manual_seed(30)).double()
    o, o_prime, lse = attn_qat_forward(q, k, v, causal=True, sinks=sinks)
    assert torch.isneginf(lse[0, 0, :20]).all()
    *_, dsink = attn_qat_backward(do, q, k, v, o, o_prime, lse, causal=True, sinks=sinks)
    assert torch.isfinite(dsink).all() and dsink[0] == 0
