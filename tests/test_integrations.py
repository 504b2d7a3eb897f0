"""transformers integration (register / AttentionInterface), the SDPA drop-in patch, and the mask
planner they share, on small randomly initialized models built from configs (no downloads)."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import fp4attn
from fp4attn.integrations import _common

transformers = pytest.importorskip("transformers", minversion="5.0")
fh = pytest.importorskip("fp4attn.integrations.transformers")

ORIG_SDPA = F.scaled_dot_product_attention


@pytest.fixture(autouse=True)
def _fresh_warnings():
    _common.reset_warnings()
    yield
    _common.reset_warnings()


def _llama(seed=0, layers=2, heads=4, kv_heads=2, hidden=64):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def _bert(seed=0):
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=128)
    torch.manual_seed(seed)
    return BertModel(cfg, add_pooling_layer=False).eval()


class _Mod(torch.nn.Module):
    def __init__(self, groups=1, is_causal=True):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = is_causal
        self.eval()  # inference op unless a test switches to training


def _qkv(B=2, hq=4, hkv=2, nq=40, nk=40, D=32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, hq, nq, D, generator=g)
    k = torch.randn(B, hkv, nk, D, generator=g)
    v = torch.randn(B, hkv, nk, D, generator=g)
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v


def _teacher_forced(m, impl, cache, ids, prompt):
    """Last-position logits of ``m`` (attention ``impl``) on ``cache``: the first ``prompt`` tokens of ``ids`` in
    one call, then the rest one token per step; (B, steps + 1, vocab)."""
    m.set_attn_implementation(impl)
    with torch.no_grad():
        outs = [m(ids[:, :prompt], past_key_values=cache, use_cache=True).logits[:, -1]]
        for t in range(prompt, ids.shape[1]):
            outs.append(m(ids[:, t: t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    return torch.stack(outs, 1)


def _masked_exact(q, k, v, allowed, scale=None):
    """Masked softmax attention in float64 with repeated K/V (independent of fp4attn)."""
    hq, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(hq // hkv, 1).double()
    v = v.repeat_interleave(hq // hkv, 1).double()
    s = (q.double() @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ v).float()


# ------------------------------------------------------------------------------------------------
# the attention function itself: equals the direct op
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3"])
def test_function_equals_direct_op_gqa_causal(recipe):
    fn = fh.make_attention_function(recipe)
    q, k, v = _qkv()
    with torch.no_grad():
        out, w = fn(_Mod(groups=2), q, k, v, None, scaling=0.2, is_causal=True, extra_kwarg=1)
    ref = fp4attn.attention(q, k, v, causal=True, scale=0.2, recipe=recipe)
    assert w is None
    assert out.shape == (2, 40, 4, 32) and out.is_contiguous()
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=0)


def test_function_thrift_and_noncausal_module():
    fn = fh.make_attention_function("thrift", budget=0.25, block_size=16)
    q, k, v = _qkv(nq=64, nk=64)
    with torch.no_grad():
        out, _ = fn(_Mod(groups=2, is_causal=False), q, k, v, None)
    ref = fp4attn.thrift_attention(q, k, v, causal=False, budget=0.25, block_size=16)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=0, atol=0)


def test_pure_causal_mask_becomes_causal_flag():
    fn = fh.make_attention_function("nvfp4")
    q, k, v = _qkv(nq=8, nk=24)  # decode-like: 8 new queries on 24 keys, bottom-right causal
    keep = torch.arange(24)[None, :] <= torch.arange(8)[:, None] + 16
    with torch.no_grad():
        out_bool, _ = fn(_Mod(2), q, k, v, keep[None, None].expand(2, 1, 8, 24))
        additive = torch.zeros(2, 1, 8, 24).masked_fill(~keep, torch.finfo(torch.float32).min)
        out_add, _ = fn(_Mod(2), q, k, v, additive)
    ref = fp4attn.attention(q, k, v, causal=True).transpose(1, 2)
    torch.testing.assert_close(out_bool, ref, rtol=0, atol=0)
    torch.testing.assert_close(out_add, ref, rtol=0, atol=0)


def test_padding_mask_is_per_sequence_unpadded_call():
    """Left padding (sequence 1) and right padding (sequence 0): each real row equals the op on that
    sequence alone; a fully masked row is zero."""
    fn = fh.make_attention_function("nvfp4")
    q, k, v = _qkv(nq=32, nk=32)
    real = torch.ones(2, 32, dtype=torch.bool)
    real[0, 20:] = False  # right padding
    real[1, :9] = False   # left padding
    allowed = real[:, None, None, :] & torch.tril(torch.ones(32, 32, dtype=torch.bool))[None, None]
    with torch.no_grad():
        out, _ = fn(_Mod(2), q, k, v, allowed)
    a0 = fp4attn.attention(q[:1, :, :20], k[:1, :, :20], v[:1, :, :20], causal=True)
    a1 = fp4attn.attention(q[1:, :, 9:], k[1:, :, 9:], v[1:, :, 9:], causal=True)
    torch.testing.assert_close(out[0, :20], a0[0].transpose(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(out[1, 9:], a1[0].transpose(0, 1), rtol=0, atol=0)
    assert out[1, :9].abs().max() == 0  # those rows see no key
    # right-padded rows past the end see all 20 real keys (as transformers' mask says)
    tail = fp4attn.attention(q[:1, :, 20:], k[:1, :, :20], v[:1, :, :20], causal=False)
    torch.testing.assert_close(out[0, 20:], tail[0].transpose(0, 1), rtol=0, atol=0)
    # and the mask matters: ignoring it gives something else
    with torch.no_grad():
        ignored, _ = fn(_Mod(2), q, k, v, None, is_causal=True)
    assert (ignored[1, 9:] - out[1, 9:]).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["sliding", "scattered", "per_head"])
def test_unusual_masks_exact_with_bf16_recipe(kind):
    fn = fh.make_attention_function("bf16")
    q, k, v = _qkv(nq=24, nk=24)
    i, j = torch.arange(24)[:, None], torch.arange(24)[None, :]
    if kind == "sliding":
        allowed = ((j <= i) & (j > i - 5))[None, None].expand(2, 1, 24, 24)
    elif kind == "scattered":
        g = torch.Generator().manual_seed(3)
        allowed = torch.rand(2, 1, 24, 24, generator=g) < 0.5
        allowed[..., 0] = True
    else:
        g = torch.Generator().manual_seed(4)
        allowed = (torch.rand(2, 4, 24, 24, generator=g) < 0.7) | (j == i)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = fn(_Mod(2), q, k, v, allowed)
    ref = _masked_exact(q, k, v, allowed.expand(2, 4, 24, 24)).transpose(1, 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_row_runs():
    m = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    m[:, 4:] = False  # right padding after 4 tokens
    assert _common._row_runs(m) == [(0, 4, 0, 4, True), (4, 6, 0, 4, False)]
    m2 = torch.zeros(3, 5, dtype=torch.bool)
    m2[0, [0, 2]] = True
    assert _common._row_runs(m2) is None


# ------------------------------------------------------------------------------------------------
# fallbacks, modes
# ------------------------------------------------------------------------------------------------
def test_fallbacks_warn_once_and_match_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    fn = fh.make_attention_function("nvfp4")
    q, k, v = _qkv(nq=16, nk=16)
    bias = torch.randn(2, 1, 16, 16)
    mod = _Mod(2)
    with torch.no_grad():
        with pytest.warns(UserWarning, match="non-zero biases"):
            out, _ = fn(mod, q, k, v, bias)
        ref, _ = sdpa_attention_forward(mod, q, k, v, bias)
        torch.testing.assert_close(out, ref)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same reason again: no second warning
            fn(mod, q, k, v, bias)
        with pytest.warns(UserWarning, match="dropout"):
            fn(mod, q, k, v, None, dropout=0.1)
        with pytest.raises(NotImplementedError, match="softcap"):
            fn(mod, q, k, v, None, softcap=30.0)  # _Mod's module has no eager_attention_forward
        with pytest.warns(UserWarning, match="output_attentions"):
            _, w = fn(mod, q, k, v, None, output_attentions=True)
        assert w is None


def test_mode_switching(monkeypatch):
    calls = []
    real_qat, real_attn = fp4attn.attn_qat, fp4attn.attention

    def spy(name, f):
        def wrapped(*a, **kw):
            calls.append(name)
            return f(*a, **kw)
        return wrapped

    monkeypatch.setattr(fp4attn, "attn_qat", spy("qat", real_qat))
    monkeypatch.setattr(fp4attn, "attention", spy("attention", real_attn))
    q, k, v = _qkv(nq=16, nk=16, grad=True)
    mod = _Mod(2)
    auto = fh.make_attention_function("nvfp4", mode="auto")
    mod.train()
    out, _ = auto(mod, q, k, v, None)
    out.square().sum().backward()
    assert calls == ["qat"] and q.grad is not None and q.grad.abs().sum() > 0 and k.grad.abs().sum() > 0
    mod.eval()
    with torch.no_grad():
        auto(mod, q, k, v, None)
    assert calls[-1] == "attention"
    with torch.no_grad():
        fh.make_attention_function("nvfp4", mode="qat")(mod, q, k, v, None)
    assert calls[-1] == "qat"
    mod.train()
    with torch.no_grad():
        fh.make_attention_function("nvfp4", mode="infer")(mod, q, k, v, None)
    assert calls[-1] == "attention"
    with pytest.warns(UserWarning, match="no gradient flows"):
        fh.make_attention_function("nvfp4", mode="infer")(mod, q, k, v, None)


def test_register_validates_and_names():
    assert fh.register("nvfp4") == "fp4attn_nvfp4"
    assert fh.register("thrift", budget=0.1) == "fp4attn_thrift_budget0p1"
    assert fh.register("sage3", mode="infer", name="my_fp4") == "my_fp4"
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    assert "my_fp4" in AttentionInterface._global_mapping and "my_fp4" in AttentionMaskInterface._global_mapping
    with pytest.raises(ValueError, match="recipe"):
        fh.register("int8")
    with pytest.raises(ValueError, match="mode"):
        fh.register("nvfp4", mode="train")


# ------------------------------------------------------------------------------------------------
# whole models
# ------------------------------------------------------------------------------------------------
def test_llama_gqa_bf16_recipe_matches_sdpa_and_eager_with_padding():
    m = _llama()
    ids = torch.randint(0, 96, (3, 40), generator=torch.Generator().manual_seed(1))
    am = torch.ones(3, 40, dtype=torch.long)
    am[1, 30:] = 0
    am[2, 25:] = 0
    name = fh.register("bf16")
    with torch.no_grad():
        outs = {}
        for impl in ("sdpa", "eager", name):
            m.set_attn_implementation(impl)
            outs[impl] = (m(ids, attention_mask=am).logits, m(ids).logits)
    real = am.bool()
    for impl in ("sdpa", "eager"):
        torch.testing.assert_close(outs[name][0][real], outs[impl][0][real], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(outs[name][1], outs[impl][1], rtol=1e-4, atol=1e-4)


def test_llama_fp4_left_padding_equals_each_sequence_alone():
    m = _llama()
    name = fh.register("nvfp4")
    m.set_attn_implementation(name)
    g = torch.Generator().manual_seed(2)
    lens = [40, 31, 22]
    ids = torch.zeros(3, 40, dtype=torch.long)
    am = torch.zeros(3, 40, dtype=torch.long)
    seqs = [torch.randint(1, 96, (L,), generator=g) for L in lens]
    for b, (s, L) in enumerate(zip(seqs, lens)):
        ids[b, 40 - L:] = s
        am[b, 40 - L:] = 1
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = m(ids, attention_mask=am, position_ids=pos).logits
        alone = [m(s[None]).logits[0] for s in seqs]
        m.set_attn_implementation(fh.register("bf16"))
        exact = m(ids, attention_mask=am, position_ids=pos).logits
    for b, L in enumerate(lens):
        torch.testing.assert_close(out[b, 40 - L:], alone[b], rtol=1e-4, atol=1e-4)
    # FP4 really ran: the logits differ from unquantized attention
    assert (out[0] - exact[0]).abs().max() > 1e-3


def test_bert_padding_mask_honoured():
    m = _bert()
    name = fh.register("mxfp4")
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, 96, (2, 24), generator=g)
    am = torch.ones(2, 24, dtype=torch.long)
    am[1, 15:] = 0
    with torch.no_grad():
        m.set_attn_implementation("sdpa")
        ref = m(ids, attention_mask=am).last_hidden_state
        m.set_attn_implementation(fh.register("bf16"))
        ours_bf16 = m(ids, attention_mask=am).last_hidden_state
        m.set_attn_implementation(name)
        ours = m(ids, attention_mask=am).last_hidden_state
        alone = m(ids[1:, :15]).last_hidden_state
        nomask = m(ids).last_hidden_state
    torch.testing.assert_close(ours_bf16, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours[1, :15], alone[0], rtol=1e-4, atol=1e-4)
    assert (nomask[1, :15] - ours[1, :15]).abs().max() > 1e-2  # the padding mask changed the result


def test_llama_training_step_uses_attn_qat_and_generation_runs():
    m = _llama(layers=1)
    name = fh.register("nvfp4")
    m.set_attn_implementation(name)
    ids = torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(6))
    m.train()
    loss = m(ids, labels=ids).loss
    loss.backward()
    gq = m.model.layers[0].self_attn.q_proj.weight.grad
    assert gq is not None and gq.abs().sum() > 0  # gradients flow through the Attn-QAT op
    m.eval()
    m.zero_grad()
    with torch.no_grad():
        m.set_attn_implementation(fh.register("bf16"))
        ref = m.generate(ids[:1, :8], max_new_tokens=6, do_sample=False)
        m.set_attn_implementation("sdpa")
        sd = m.generate(ids[:1, :8], max_new_tokens=6, do_sample=False)
        m.set_attn_implementation(name)
        fp4 = m.generate(ids[:1, :8], max_new_tokens=6, do_sample=False)
    assert torch.equal(ref, sd)
    assert fp4.shape == (1, 14)


# ------------------------------------------------------------------------------------------------
# SDPA patch
# ------------------------------------------------------------------------------------------------
def test_sdpa_patch_routes_and_restores():
    q, k, v = _qkv(hkv=4, nq=32, nk=32)
    with torch.no_grad():
        with fp4attn.sdpa_patch(recipe="nvfp4") as fn:
            assert F.scaled_dot_product_attention is fn
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
        assert F.scaled_dot_product_attention is ORIG_SDPA
        ref = fp4attn.attention(q, k, v, causal=True, scale=0.3)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        # GQA through enable_gqa
        q2, k2, v2 = _qkv(hkv=2, nq=16, nk=16)
        with fp4attn.sdpa_patch(recipe="sage3"):
            out2 = F.scaled_dot_product_attention(q2, k2, v2, enable_gqa=True)
        torch.testing.assert_close(out2, fp4attn.attention(q2, k2, v2, recipe="sage3"), rtol=0, atol=0)


@pytest.mark.parametrize("nq,nk", [(8, 24), (24, 8), (16, 16)])
def test_sdpa_patch_top_left_causal_and_masks_exact(nq, nk):
    q, k, v = _qkv(hkv=4, nq=nq, nk=nk)
    g = torch.Generator().manual_seed(7)
    bool_mask = torch.rand(nq, nk, generator=g) < 0.6
    bool_mask[:, 0] = True
    add_mask = torch.zeros(nq, nk).masked_fill(~bool_mask, float("-inf"))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fp4attn.sdpa_patch(recipe="bf16"):
            c = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            mb = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)
            ma = F.scaled_dot_product_attention(q, k, v, attn_mask=add_mask)
    torch.testing.assert_close(c, ORIG_SDPA(q, k, v, is_causal=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mb, ORIG_SDPA(q, k, v, attn_mask=bool_mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ma, ORIG_SDPA(q, k, v, attn_mask=add_mask), rtol=1e-5, atol=1e-5)


def test_sdpa_patch_fallbacks_warn_once_per_reason():
    q, k, v = _qkv(hkv=4, nq=16, nk=16)
    bias = torch.randn(16, 16)
    with torch.no_grad(), fp4attn.sdpa_patch(recipe="nvfp4"):
        with pytest.warns(UserWarning, match="non-zero biases"):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        torch.testing.assert_close(out, ORIG_SDPA(q, k, v, attn_mask=bias))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # warned already
        with pytest.warns(UserWarning, match="dropout_p"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        with pytest.warns(UserWarning, match="not 4-D"):
            out3 = F.scaled_dot_product_attention(q[0], k[0], v[0])
        torch.testing.assert_close(out3, ORIG_SDPA(q[0], k[0], v[0]))
        q2, k2, v2 = _qkv(hkv=2, nq=16, nk=16)
        with pytest.warns(UserWarning, match="enable_gqa"), pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q2, k2, v2)  # the original raises, as it would unpatched
        with pytest.warns(UserWarning, match="dtype"):
            F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        # what SDPA computes and the fp4attn ops refuse (SPEC: sizes >= 1, a positive finite scale): SDPA's result
        with pytest.warns(UserWarning, match="empty dimension"):
            out0 = F.scaled_dot_product_attention(q[:0], k[:0], v[:0])
        assert out0.shape == q[:0].shape
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the same reason for an empty key sequence: warned once above)
            torch.testing.assert_close(F.scaled_dot_product_attention(q, k[:, :, :0], v[:, :, :0]),
                                       ORIG_SDPA(q, k[:, :, :0], v[:, :, :0]), equal_nan=True)
        for bad in (0.0, -0.5, float("inf")):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                out4 = F.scaled_dot_product_attention(q, k, v, scale=bad)
            assert any(f"scale={bad!r}" in str(x.message) for x in w), [str(x.message) for x in w]
            torch.testing.assert_close(out4, ORIG_SDPA(q, k, v, scale=bad), equal_nan=True)


def test_sdpa_patch_auto_mode_trains_with_attn_qat():
    q, k, v = _qkv(hkv=4, nq=16, nk=16, grad=True)
    with fp4attn.sdpa_patch(recipe="nvfp4"):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.square().sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = fp4attn.attn_qat(q2, k2, v2, causal=True)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    torch.testing.assert_close(q.grad, q2.grad, rtol=0, atol=0)
    with fp4attn.sdpa_patch(recipe="nvfp4", mode="infer"), pytest.warns(UserWarning, match="gradients"):
        F.scaled_dot_product_attention(q, k, v)


def test_sdpa_patch_on_a_transformers_sdpa_model():
    m = _llama(layers=1)
    m.set_attn_implementation("sdpa")
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(8))
    am = torch.ones(2, 20, dtype=torch.long)
    am[0, 14:] = 0
    with torch.no_grad():
        ref = m(ids, attention_mask=am).logits
        with fp4attn.sdpa_patch(recipe="bf16"):
            same = m(ids, attention_mask=am).logits
        with fp4attn.sdpa_patch(recipe="nvfp4"):
            fp4 = m(ids, attention_mask=am).logits
    real = am.bool()
    torch.testing.assert_close(same[real], ref[real], rtol=1e-4, atol=1e-4)
    assert (fp4[real] - ref[real]).abs().max() > 1e-3


def test_fp4_kv_cache_decode_matches_dense_fp4(monkeypatch):
    """Teacher-forced decoding with the NVFP4 KV cache: decode steps run fp4attn.decode on the NVFP4
    pages, and the logits stay close to the same model with a 16-bit cache and the dense FP4 op (closer
    than FP4 attention is to exact attention)."""
    from transformers import DynamicCache
    m = _llama()
    ids = torch.randint(0, 96, (2, 44), generator=torch.Generator().manual_seed(9))
    calls = []
    real = fp4attn.decode
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))

    def run(impl, cache):
        return _teacher_forced(m, impl, cache, ids, 36)

    cache = fh.fp4_cache()
    fp4_cached = run(fh.register("nvfp4"), cache)
    assert len(calls) == 8 * 2  # every single-token step of both layers decoded from the NVFP4 pages
    dense_fp4 = run(fh.register("nvfp4"), DynamicCache(config=m.config))
    exact = run("sdpa", DynamicCache(config=m.config))
    err_cache = (fp4_cached - dense_fp4).abs().max()
    assert err_cache < 0.05 and err_cache < (dense_fp4 - exact).abs().max()
    kv = cache.layers[0].kv
    assert kv.get_seq_length() == 44 and kv.committed_lengths() == [32, 32]  # 2 NVFP4 slots + a 12-token raw tail
    # generate() with the FP4 cache runs end to end
    with torch.no_grad():
        out = m.generate(ids[:, :20], max_new_tokens=4, do_sample=False, past_key_values=fh.fp4_cache())
    assert out.shape == (2, 24)


@pytest.mark.parametrize("padded", [False, True])
def test_fp4_cache_placeholders_give_the_dense_path_logits(monkeypatch, padded):
    """Once the fp4attn attention function has read a layer, FP4CacheLayer.update returns zero-stride
    placeholders instead of dequantizing the whole cache every step. The logits must equal, bit for
    bit, those of the same run with the dense dequantized K/V returned every step (the flag disabled):
    unpadded single-token steps decode from the pages either way; with a left-padding mask every call
    takes the dense op, which must then dequantize the pages itself (zeros would be used otherwise)."""
    from fp4attn.kvcache import KVCache
    m = _llama()
    ids = torch.randint(0, 96, (2, 30), generator=torch.Generator().manual_seed(11))
    am = torch.ones(2, 30, dtype=torch.long)
    if padded:
        am[1, :5] = 0
    impl = fh.register("nvfp4")
    m.set_attn_implementation(impl)

    def run():
        cache = fh.fp4_cache()
        with torch.no_grad():
            outs = [m(ids[:, :24], attention_mask=am[:, :24], past_key_values=cache, use_cache=True).logits[:, -1]]
            for t in range(24, 30):
                outs.append(m(ids[:, t:t + 1], attention_mask=am[:, :t + 1], past_key_values=cache,
                              use_cache=True).logits[:, -1])
        return torch.stack(outs, 1), cache

    lazy, cache = run()
    layer = cache.layers[0]
    kn = torch.randn(2, layer.kv.num_kv_heads, 1, layer.kv.head_dim)
    assert layer.update(kn, kn)[0].stride() == (0, 0, 0, 0)  # placeholders once fp4attn has read the layer
    with monkeypatch.context() as mp:  # the flag ignored: dense K/V every step, as before placeholders
        mp.setattr(KVCache, "fp4attn_reads_pages", property(lambda self: False, lambda self, v: None),
                   raising=False)
        dense, cache2 = run()
        layer2 = cache2.layers[0]
        assert layer2.update(kn, kn)[0].stride() != (0, 0, 0, 0)
    assert torch.equal(lazy, dense)


def test_fp4_cache_layers_keep_no_dense_copy():
    """FP4CacheLayer.update returns the dense K/V of its first call (the prefill: the flag that lets it return
    placeholders is set by that call's attention) but must not keep them: they used to stay referenced from
    the layer until its next update, so right after a prefill every layer held its whole cache in the model's
    dtype next to the NVFP4 pages (a B=64, 32k-token prefill of a 16-layer model: 82 GiB instead of 18 on an
    H200, benchmarks/gen-s21)."""
    m = _llama()
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(12))
    m.set_attn_implementation(fh.register("nvfp4"))
    cache = fh.fp4_cache()
    with torch.no_grad():
        m(ids, past_key_values=cache, use_cache=True)
    for layer in cache.layers:
        dense = 2 * layer.kv.num_kv_heads * 40 * layer.kv.head_dim  # elements of one dense K (B=2, 40 tokens)
        kept = {n: t.numel() for n, t in vars(layer).items() if isinstance(t, torch.Tensor)}
        assert all(n < dense for n in kept.values()), kept
        for t in (layer.keys, layer.values):  # placeholders of the cache's shape for transformers' own reads
            assert t.shape == (2, layer.kv.num_kv_heads, 40, layer.kv.head_dim) and t.stride() == (0, 0, 0, 0)


def test_padding_mask_in_training_gradients_match_unpadded_calls():
    fn = fh.make_attention_function("nvfp4")
    q, k, v = _qkv(nq=24, nk=24, grad=True)
    real = torch.ones(2, 24, dtype=torch.bool)
    real[1, :7] = False  # left padding
    allowed = real[:, None, None, :] & torch.tril(torch.ones(24, 24, dtype=torch.bool))[None, None]
    mod = _Mod(2).train()
    out, _ = fn(mod, q, k, v, allowed)
    (out[0].square().sum() + out[1, 7:].square().sum()).backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o0 = fp4attn.attn_qat(q2[:1], k2[:1], v2[:1], causal=True)
    o1 = fp4attn.attn_qat(q2[1:, :, 7:], k2[1:, :, 7:], v2[1:, :, 7:], causal=True)
    (o0.square().sum() + o1.square().sum()).backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    assert q.grad[1, :, :7].abs().max() == 0 and k.grad[1, :, :7].abs().max() == 0  # padding gets no gradient


def test_mask_function_keeps_decode_masks_none_under_stream_capture(monkeypatch):
    """Under CUDA stream capture transformers materializes even a no-padding decode mask (it counts capture as
    tracing); the mask function registered with fp4attn returns None for such a step (1..16 causal queries,
    no padding mask, no sliding window), so that the attention function decodes from the FP4 pages, and
    defers to sdpa_mask otherwise. The decode steps' logits are those of the same run outside capture."""
    from transformers.masking_utils import causal_mask_function

    calls = []
    wrapped = fh._mask_function(lambda **kw: calls.append(kw) or "sdpa")
    kw = dict(batch_size=2, q_length=1, kv_length=40, q_offset=39, kv_offset=0, mask_function=causal_mask_function,
              attention_mask=None, allow_is_causal_skip=True)
    assert wrapped(**kw) == "sdpa"  # not capturing
    monkeypatch.setattr(fh, "_capturing", lambda: True)
    assert wrapped(**kw) is None and wrapped(**{**kw, "q_length": 16}) is None
    for other in (dict(q_length=17), dict(attention_mask=torch.ones(2, 40, dtype=torch.bool)),
                  dict(allow_is_causal_skip=False), dict(mask_function=lambda *a: True),
                  dict(local_attention_size=8)):
        assert wrapped(**{**kw, **other}) == "sdpa", other
    assert len(calls) == 6
    # end to end: prefill + decode steps with the "capturing" mask function give the same logits
    m = _llama()
    ids = torch.randint(0, 96, (2, 36), generator=torch.Generator().manual_seed(13))
    m.set_attn_implementation(fh.register("nvfp4"))

    def run():
        cache = fh.fp4_cache()
        with torch.no_grad():
            outs = [m(ids[:, :30], past_key_values=cache, use_cache=True).logits[:, -1]]
            for t in range(30, 36):
                outs.append(m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
        return torch.stack(outs, 1)
    captured = run()
    monkeypatch.setattr(fh, "_capturing", lambda: False)
    assert torch.equal(captured, run())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_transformers_decode_step_replayed_from_a_cuda_graph_equals_eager_steps():
    """A transformers forward of one decode step with fp4_cache(), captured once in a CUDA graph (every layer's
    KVCache reserved, host lengths resynced after the capture) and replayed 20 times with its own greedy
    token, gives the logits of the same 20 steps run eagerly, bit for bit."""
    m = _llama(layers=2, heads=8, kv_heads=2, hidden=512).to("cuda", torch.bfloat16)  # D = 64
    m.set_attn_implementation(fh.register("nvfp4"))
    ids = torch.randint(0, 96, (2, 300), generator=torch.Generator().manual_seed(14)).to("cuda")
    steps = 20

    def prefill():
        cache = fh.fp4_cache()
        with torch.no_grad():
            tok = m(ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            tok = m(tok, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)  # one eager step
        for layer in cache.layers:
            layer.kv.reserve(301 + steps + 1)
        return cache, tok

    cache, tok = prefill()
    want = []
    with torch.no_grad():
        for i in range(steps):
            pos = torch.full((2, 1), 301 + i, device="cuda")
            logits = m(tok, past_key_values=cache, position_ids=pos, cache_position=pos[0], use_cache=True).logits
            want.append(logits[:, -1])
            tok = logits[:, -1:].argmax(-1)
    cache, tok = prefill()
    pos = torch.full((2, 1), 301, device="cuda")
    cpos = pos[0].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        logits = m(tok, past_key_values=cache, position_ids=pos, cache_position=cpos, use_cache=True).logits
    for layer in cache.layers:
        layer.kv.sync_lengths()
    for i in range(steps):
        graph.replay()
        assert torch.equal(logits[:, -1], want[i]), i
        tok.copy_(logits[:, -1:].argmax(-1))
        pos += 1
        cpos += 1
    for layer in cache.layers:
        layer.kv.sync_lengths()
        assert layer.kv.lengths == [301 + steps] * 2


def test_greedy_generate_eager_checks_and_tokens():
    """greedy_generate with cuda_graph=False on CPU: prompt + new tokens, the tokens of a plain greedy loop with
    an fp4_cache (reserving changes no CPU result: the reference path has no splits); argument errors."""
    m = _llama()
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(15))
    with pytest.raises(ValueError, match="'nvfp4' or 'thrift'"):
        m.set_attn_implementation("sdpa")
        fh.greedy_generate(m, ids, 4, cuda_graph=False)
    m.set_attn_implementation(fh.register("nvfp4"))
    with pytest.raises(ValueError, match="max_new_tokens"):
        fh.greedy_generate(m, ids, 0, cuda_graph=False)
    with pytest.raises(ValueError, match="CUDA"):
        fh.greedy_generate(m, ids, 4)
    for recipe, kw in (("nvfp4", {}), ("thrift", dict(keep_16bit=True))):  # thrift: its 16-bit copy by default
        m.set_attn_implementation(fh.register(recipe))
        out = fh.greedy_generate(m, ids, 6, cuda_graph=False)
        assert out.shape == (2, 26) and torch.equal(out[:, :20], ids)
        cache, seq = fh.fp4_cache(**kw), ids
        with torch.no_grad():
            tok = m(ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            for _ in range(6):
                seq = torch.cat([seq, tok], 1)
                tok = m(tok, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        assert torch.equal(out, seq), recipe


def test_generate_equals_transformers_generate_with_sampling_and_eos():
    """generate() gives transformers' generate() tokens with the same fp4_cache: sampled (temperature, top-k,
    top-p; the same draws from the same seed) and greedy with an EOS id (the sequence that produced it continues
    with the pad id, and generation stops when every sequence has); argument errors."""
    m = _llama()
    m.set_attn_implementation(fh.register("nvfp4"))
    ids = torch.randint(0, 96, (3, 20), generator=torch.Generator().manual_seed(18))
    ones = torch.ones_like(ids)

    def theirs(**kw):
        return m.generate(ids, attention_mask=ones, past_key_values=fh.fp4_cache(), **kw)

    for kw in (dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=1.3, top_k=96, top_p=1.0),
               dict(temperature=1.0, top_k=5, top_p=0.5)):
        torch.manual_seed(19)
        ours = fh.generate(m, ids, 12, do_sample=True, cuda_graph=False, **kw)
        torch.manual_seed(19)
        want = theirs(max_new_tokens=12, do_sample=True, **kw)
        assert torch.equal(ours, want), kw
    greedy = fh.generate(m, ids, 12, cuda_graph=False)
    assert torch.equal(greedy, theirs(max_new_tokens=12, do_sample=False))
    # EOS: the token sequence 0 generates third; the others finish at their first such token or run on
    eos = int(greedy[0, 22])
    for pad in (None, 0):
        ours = fh.greedy_generate(m, ids, 12, cuda_graph=False, eos_token_id=[95, eos], pad_token_id=pad)
        want = theirs(max_new_tokens=12, do_sample=False, eos_token_id=[95, eos],
                      pad_token_id=95 if pad is None else pad)
        assert torch.equal(ours, want), pad
        assert (ours[0, 23:] == (95 if pad is None else pad)).all()
    # every sequence stops at once: generation ends early
    first = fh.greedy_generate(m, ids, 12, cuda_graph=False, eos_token_id=greedy[:, 20].tolist())
    assert first.shape == (3, 21) and torch.equal(first, greedy[:, :21])
    for bad in (dict(temperature=0.0, do_sample=True), dict(top_k=0, do_sample=True), dict(top_p=1.5, do_sample=True),
                dict(do_sample=1), dict(eos_token_id=[]), dict(eos_token_id="2"), dict(pad_token_id=1.0)):
        name = [k for k in bad if k != "do_sample"] or ["do_sample"]
        with pytest.raises(ValueError, match=name[0]):
            fh.generate(m, ids, 4, cuda_graph=False, **bad)


def test_prefill_sdpa_runs_the_prompt_in_full_precision_and_decodes_from_fp4_pages(monkeypatch):
    """register(..., prefill="sdpa"): the prompt's forward is transformers' sdpa on its own K/V (the logits of an
    sdpa model, bit for bit); the decode steps read the FP4 pages through fp4attn.decode (close to sdpa with a
    bf16 cache: the KV quantization error only); generate() gives transformers' generate() tokens."""
    import fp4attn

    m = _llama()
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(22))
    m.set_attn_implementation("sdpa")
    with torch.no_grad():
        want = m(ids).logits
        want_next = m(torch.cat([ids, ids[:, :1]], 1)).logits[:, -1]
    name = fh.register("nvfp4", prefill="sdpa")
    assert name.endswith("_prefillsdpa") and fh.registered()[name]["prefill"] == "sdpa"
    m.set_attn_implementation(name)
    calls = []
    real = fp4attn.decode
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    cache = fh.fp4_cache()
    with torch.no_grad():
        got = m(ids, past_key_values=cache, use_cache=True).logits
        assert torch.equal(got, want) and not calls  # the prompt: no FP4 decode
        nxt = m(ids[:, :1], past_key_values=cache, use_cache=True).logits[:, -1]
    assert len(calls) == 2  # one decode step, two layers
    cos = torch.nn.functional.cosine_similarity(nxt.flatten(), want_next.flatten(), dim=0)
    assert 0.99 < cos < 1.0, cos  # the FP4 cache, not exact (and not the prompt's full-precision K/V)
    ours = fh.generate(m, ids, 8, cuda_graph=False)
    assert torch.equal(ours, m.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=fh.fp4_cache(),
                                        max_new_tokens=8, do_sample=False))
    with pytest.raises(ValueError, match="prefill"):
        fh.register("nvfp4", prefill="bf16")


def test_cli_generate_prints_the_tokens_of_generate(tmp_path, capsys):
    """fp4attn generate on a saved model with prompt ids (no tokenizer): the printed tokens are generate()'s, with
    the timing / cache line; --compare adds transformers' generate(); bad arguments exit with status 2."""
    from fp4attn.cli import main

    m = _llama()
    m.save_pretrained(tmp_path / "tiny")
    ids = [5, 17, 3, 60, 44, 9, 12, 80, 2, 33, 71, 6, 18, 25, 40, 41, 77, 8]
    m.set_attn_implementation(fh.register("nvfp4"))
    want = fh.generate(m, torch.tensor([ids]), 6, cuda_graph=False)[0, len(ids):].tolist()
    for extra in ([], ["--compare"], ["--recipe", "thrift", "--prefill", "sdpa"]):
        assert main(["generate", str(tmp_path / "tiny"), "--prompt-ids", ",".join(map(str, ids)),
                     "--max-new-tokens", "6", "--device", "cpu", *extra]) == 0
        out = capsys.readouterr().out.splitlines()
        if extra[:1] != ["--recipe"]:  # (thrift with an sdpa prefill gives other tokens)
            assert out[0] == str(want), (extra, out)
        assert "first token" in out[1] and "KV cache of the prompt" in out[1], out
        assert "-" not in out[1].split("first token")[1].split("per later token")[0]  # (no negative time)
        assert "graph capture" not in out[1]  # (eager steps on the CPU)
        assert ("16-bit copy" in out[1]) == (extra[:1] == ["--recipe"])  # Thrift's copy counted
        assert ("transformers generate" in out[-1]) == (extra == ["--compare"])
    assert main(["generate", str(tmp_path / "tiny"), "--prompt-ids", "1,x", "--device", "cpu"]) == 2
    assert main(["generate", str(tmp_path / "tiny"), "--prompt-ids", "1,2", "--max-new-tokens", "0",
                 "--device", "cpu"]) == 2


@pytest.mark.parametrize("recipe", ["nvfp4", "thrift"])
def test_generate_padded_prompts_equal_each_prompt_alone(recipe):
    """Prompts of 20, 13 and 7 tokens, left- or right-padded with an attention mask: every sequence's new tokens
    are those of its prompt alone (each prompt is prefilled alone into a cache of its own tokens; the decode
    steps attend each sequence to its own length); bad masks are refused."""
    m = _llama()
    m.set_attn_implementation(fh.register(recipe))
    g = torch.Generator().manual_seed(21)
    prompts = [torch.randint(1, 96, (n,), generator=g) for n in (20, 13, 7)]
    alone = [fh.greedy_generate(m, p[None], 10, cuda_graph=False)[0, len(p):] for p in prompts]
    for side in ("left", "right"):
        ids = torch.zeros(3, 20, dtype=torch.long)
        mask = torch.zeros(3, 20, dtype=torch.long)
        for b, p in enumerate(prompts):
            sl = slice(20 - len(p), 20) if side == "left" else slice(0, len(p))
            ids[b, sl], mask[b, sl] = p, 1
        out = fh.greedy_generate(m, ids, 10, cuda_graph=False, attention_mask=mask)
        assert out.shape == (3, 30) and torch.equal(out[:, :20], ids)
        for b in range(3):
            assert torch.equal(out[b, 20:], alone[b]), (side, b)
    ids = torch.randint(1, 96, (2, 6), generator=g)
    for bad in (torch.ones(2, 5), torch.tensor([[1, 0, 1, 1, 1, 1], [1] * 6]), torch.zeros(2, 6),
                torch.full((2, 6), 2)):
        with pytest.raises(ValueError, match="attention_mask"):
            fh.greedy_generate(m, ids, 3, cuda_graph=False, attention_mask=bad)


@pytest.mark.parametrize("recipe,kw", [("nvfp4", {}), ("mxfp4", {}), ("bf16", {}), ("nvfp4", {"prefill": "sdpa"})])
def test_ragged_cache_steps_off_the_pages_equal_each_sequence_alone(recipe, kw):
    """A cache of sequences of different lengths (FP4Cache.cat of prompts prefilled alone, as generate() builds it)
    and a step of 3 new tokens each: whichever path runs it (decode from the pages, or the dense K/V with a mask:
    recipes that do not decode, the sdpa prefill), each sequence's logits are those of its prompt alone. The dense
    paths attended the shorter sequence's zero-filled slots with a mask built for the longest (logits off by ~0.07
    at a logit std of 0.17) before the mask was rebuilt from the lengths."""
    m = _llama()
    m.set_attn_implementation(fh.register(recipe, **kw))
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 96, (1, n), generator=g) for n in (30, 20)]
    nxt = torch.randint(1, 96, (2, 3), generator=g)
    with torch.no_grad():
        parts = [fh.fp4_cache() for _ in prompts]
        for c, x in zip(parts, prompts):
            m(x, past_key_values=c, use_cache=True)
        cache = fh.FP4Cache.cat(parts)
        pos = torch.tensor([[30], [20]]) + torch.arange(3)
        out = m(nxt, past_key_values=cache, position_ids=pos, use_cache=True).logits
        for b, x in enumerate(prompts):
            c1 = fh.fp4_cache()
            m(x, past_key_values=c1, use_cache=True)
            alone = m(nxt[b:b + 1], past_key_values=c1, use_cache=True).logits[0]
            torch.testing.assert_close(out[b], alone, rtol=0, atol=1e-5)


def test_generate_padded_prompts_on_a_softcapped_model_equal_each_prompt_alone():
    """Gemma 2 (attention logit softcapping: every call falls back to the model's eager attention on the dense K/V):
    with padded prompts each sequence's new tokens are those of its prompt alone, the fallback's mask rebuilt from
    the ragged cache's lengths and the sliding window of its local layers."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    cfg = Gemma2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                       sliding_window=20)
    torch.manual_seed(0)
    m = Gemma2ForCausalLM(cfg).eval()
    m.set_attn_implementation(fh.register("nvfp4"))
    ids = torch.randint(1, 96, (2, 50), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :30], ids[1, :30] = 0, 0  # the second prompt: 20 tokens, left-padded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the softcap fallback's warning)
        out = fh.generate(m, ids, 12, cuda_graph=False, attention_mask=mask)
        for b, p in enumerate((ids[:1], ids[1:, 30:])):
            assert torch.equal(out[b, 50:], fh.generate(m, p, 12, cuda_graph=False)[0, p.shape[1]:]), b


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_generate_cuda_graph_gives_the_eager_tokens():
    m = _llama(layers=2, heads=8, kv_heads=2, hidden=512).to("cuda", torch.bfloat16)
    m.set_attn_implementation(fh.register("nvfp4"))
    ids = torch.randint(0, 96, (3, 200), generator=torch.Generator().manual_seed(16)).to("cuda")
    eager = fh.greedy_generate(m, ids, 40, cuda_graph=False)
    graphed = fh.greedy_generate(m, ids, 40)
    assert graphed.shape == (3, 240) and torch.equal(graphed, eager)
    # sampling with a seeded generator and an EOS stop: the replayed steps' logits are the eager ones, so are the draws
    eos = int(eager[1, 210])
    runs = [fh.generate(m, ids, 40, do_sample=True, temperature=0.8, top_k=30, top_p=0.95, eos_token_id=eos,
                        generator=torch.Generator("cuda").manual_seed(20), cuda_graph=g) for g in (False, True)]
    assert torch.equal(runs[0], runs[1])
    # prompts of 200, 150 and 77 tokens, left-padded: replayed steps with three lengths, the eager tokens
    mask = torch.ones_like(ids)
    mask[1, :50], mask[2, :123] = 0, 0
    runs = [fh.greedy_generate(m, ids, 40, attention_mask=mask, cuda_graph=g) for g in (False, True)]
    assert torch.equal(runs[0], runs[1])
    # the prompts in full precision (prefill="sdpa"), the decode steps from the FP4 pages
    m.set_attn_implementation(fh.register("nvfp4", prefill="sdpa"))
    runs = [fh.greedy_generate(m, ids, 40, attention_mask=mask, cuda_graph=g) for g in (False, True)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_generate_head_dim_96_runs_the_kernels(monkeypatch):
    """A Phi-3-like model (head dim 96, no GQA): the FP4 cache's appends and decode steps run the kernels on padded
    tiles (the decode's PyTorch reference path is made to raise), eagerly and replayed from a CUDA graph, with the
    same tokens; nvfp4 and Thrift."""
    from transformers import Phi3Config, Phi3ForCausalLM

    import fp4attn.ops.decode as opd

    def no_reference(*a, **k):
        raise AssertionError("decode ran the PyTorch reference path")

    monkeypatch.setattr(opd, "decode_reference", no_reference)
    cfg = Phi3Config(vocab_size=96, hidden_size=384, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=1024, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    m = Phi3ForCausalLM(cfg).eval().to("cuda", torch.bfloat16)
    assert m.model.layers[0].self_attn.head_dim == 96
    ids = torch.randint(2, 96, (2, 200), generator=torch.Generator().manual_seed(18)).to("cuda")
    for recipe, kw in (("nvfp4", {}), ("thrift", {"budget": 0.25})):
        m.set_attn_implementation(fh.register(recipe, **kw))
        eager = fh.greedy_generate(m, ids, 70, cuda_graph=False)
        graphed = fh.greedy_generate(m, ids, 70)
        assert graphed.shape == (2, 270) and torch.equal(graphed, eager), recipe


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_generate_thrift_cuda_graph_gives_the_eager_tokens():
    """Thrift decode steps replayed from a CUDA graph past two page boundaries (tokens 256 and 320): the page
    means and the selection follow the lengths on the device, so the tokens are the eager ones."""
    m = _llama(layers=2, heads=8, kv_heads=2, hidden=512).to("cuda", torch.bfloat16)
    m.set_attn_implementation(fh.register("thrift", budget=0.25))
    ids = torch.randint(0, 96, (2, 200), generator=torch.Generator().manual_seed(17)).to("cuda")
    eager = fh.greedy_generate(m, ids, 150, cuda_graph=False)
    graphed = fh.greedy_generate(m, ids, 150)
    assert graphed.shape == (2, 350) and torch.equal(graphed, eager)


# ------------------------------------------------------------------------------------------------
# sliding windows (Mistral-style sliding_window)
# ------------------------------------------------------------------------------------------------
def _mistral(seed=0, window=8, layers=2):
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        sliding_window=window)
    torch.manual_seed(seed)
    return MistralForCausalLM(cfg).eval()


def _gemma3(window, layers, seed=0):
    """A small Gemma 3 (local sliding-window and global layers, ``layers`` their types) in eval mode."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=len(layers),
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                           sliding_window=window, layer_types=list(layers))
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(cfg).eval()


def test_sliding_window_of():
    i, j = torch.arange(12)[:, None], torch.arange(12)[None, :]
    win = (j <= i) & (j > i - 4)
    assert _common.sliding_window_of(win) == (0, 0, 3)
    padded = win & (j >= 5)  # left padding: keys (and query rows) before 5 are padding
    assert _common.sliding_window_of(padded) == (5, 5, 3)
    assert _common.sliding_window_of(j <= i) is None  # plain causal: no window binds
    assert _common.sliding_window_of(torch.tril(torch.ones(12, 12, dtype=torch.bool), -1) | (j > i + 20)) is None
    gap = win.clone()
    gap[9, 7] = False  # not contiguous
    assert _common.sliding_window_of(gap) is None
    # Nq < Nk (a chunk after a prefix): bottom-right positions
    assert _common.sliding_window_of(win[8:]) == (0, 0, 3)
    assert _common.sliding_window_of((j <= i) & (j > i - 4) & (i > 20)) is None  # no row sees a key


def test_mistral_sliding_window_runs_one_windowed_call_and_is_exact_with_bf16(monkeypatch):
    """A Mistral model with sliding_window=8 (key j visible from q iff q - 8 < j <= q): every layer runs one
    fp4attn.attention call with window_size=(7, 0), unpadded and per sequence with left padding, and with
    the bf16 recipe the logits are transformers' sdpa ones (which apply the window through the mask)."""
    m = _mistral()
    g = torch.Generator().manual_seed(21)
    ids = torch.randint(1, 96, (2, 30), generator=g)
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, :9] = 0  # left padding
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    calls = []
    real = fp4attn.attention
    monkeypatch.setattr(fp4attn, "attention", lambda *a, **kw: calls.append(kw.get("window_size")) or real(*a, **kw))
    name = fh.register("bf16")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no "many op calls" warning
        m.set_attn_implementation(name)
        out = m(ids).logits
        assert calls == [(7, 0)] * 2
        out_pad = m(ids, attention_mask=am, position_ids=pos).logits
        assert calls[2:] == [(7, 0)] * 4  # one windowed call per sequence and layer
        m.set_attn_implementation("sdpa")
        ref = m(ids).logits
        ref_pad = m(ids, attention_mask=am, position_ids=pos).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    real_tok = am.bool()
    torch.testing.assert_close(out_pad[real_tok], ref_pad[real_tok], rtol=1e-4, atol=1e-4)
    # the window matters here: full causal attention gives other logits
    m.config.sliding_window = None
    for layer in m.model.layers:
        layer.self_attn.sliding_window = None
    with torch.no_grad():
        full = m(ids).logits
    assert (full - ref).abs().max() > 1e-3


def test_mistral_sliding_window_decodes_the_window_from_fp4_pages(monkeypatch):
    """Decode steps of a sliding-window model on an fp4_cache run fp4attn.decode with window_size=(w - 1, 0)
    (from transformers' sliding mask eagerly, from the layer's sliding_window when the mask function leaves
    the mask out under CUDA-graph capture: the same logits), close to the dense FP4 path with the window."""
    from transformers import DynamicCache
    m = _mistral(window=12)
    ids = torch.randint(0, 96, (2, 44), generator=torch.Generator().manual_seed(22))
    calls = []
    real = fp4attn.decode
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: calls.append(kw.get("window_size")) or real(*a, **kw))

    def run(impl, cache):
        return _teacher_forced(m, impl, cache, ids, 36)

    name = fh.register("nvfp4")
    fp4_cached = run(name, fh.fp4_cache())
    assert calls == [(11, 0)] * 16
    monkeypatch.setattr(fh, "_capturing", lambda: True)
    assert torch.equal(run(name, fh.fp4_cache()), fp4_cached)
    assert calls[16:] == [(11, 0)] * 16
    monkeypatch.setattr(fh, "_capturing", lambda: False)
    dense_fp4 = run(name, DynamicCache(config=m.config))
    exact = run("sdpa", DynamicCache(config=m.config))
    err_cache = (fp4_cached - dense_fp4).abs().max()
    assert err_cache < 0.05 and err_cache < (dense_fp4 - exact).abs().max()


def test_gemma3_local_layers_windowed_global_layer_not(monkeypatch):
    """Gemma 3 (local sliding-window layers and a global one, sliding_window passed per layer): the local
    layers run fp4attn.attention / fp4attn.decode with window_size=(w - 1, 0), the global layer without;
    bf16 logits equal sdpa's; generate() gives transformers' generate() tokens with the same fp4_cache."""
    m = _gemma3(window=8, layers=["sliding_attention"] * 3 + ["full_attention"])
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(23))
    calls, dec = [], []
    real_attention, real_decode = fp4attn.attention, fp4attn.decode
    monkeypatch.setattr(fp4attn, "attention", lambda *a, **kw: calls.append(kw.get("window_size"))
                        or real_attention(*a, **kw))
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: dec.append(kw.get("window_size")) or real_decode(*a, **kw))
    with torch.no_grad():
        m.set_attn_implementation(fh.register("bf16"))
        out = m(ids).logits
        assert calls == [(7, 0)] * 3 + [None]
        m.set_attn_implementation("sdpa")
        torch.testing.assert_close(out, m(ids).logits, rtol=1e-4, atol=1e-4)
        m.set_attn_implementation(fh.register("nvfp4"))
        ours = fh.generate(m, ids, 6, cuda_graph=False)
        theirs = m.generate(ids, max_new_tokens=6, do_sample=False, past_key_values=fh.fp4_cache())
    assert torch.equal(ours, theirs)
    assert dec[:8] == [(7, 0)] * 3 + [None] + [(7, 0)] * 3 + [None]


def test_fp4_cache_with_config_keeps_only_the_window_of_sliding_layers():
    """fp4_cache(model.config): sliding-window layers (Gemma 3's local ones here) hold KVCache(window=w - 1),
    which recycles its pages; the global layer keeps every token. Prompt, one-token steps and a chunk of 200
    tokens (whose first queries read keys its append recycles: read before it) give the logits of a cache that
    keeps everything, with less memory; the same for Thrift's cache (keep_16bit: the ring keeps the window's 16-bit
    copy too)."""
    m = _gemma3(window=24, layers=["sliding_attention", "full_attention"])
    m.set_attn_implementation(fh.register("nvfp4"))
    ids = torch.randint(1, 96, (2, 510), generator=torch.Generator().manual_seed(24))

    def run(cache):
        with torch.no_grad():
            outs = [m(ids[:, :300], past_key_values=cache, use_cache=True).logits[:, -1]]
            for t in range(300, 305):
                outs.append(m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
            chunk = m(ids[:, 305:505], past_key_values=cache, use_cache=True).logits
            outs += [chunk[:, 0], chunk[:, -1]]
            for t in range(505, 510):
                outs.append(m(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
        return torch.stack(outs, 1)

    ring, full = fh.fp4_cache(m.config), fh.fp4_cache()
    out_ring, out_full = run(ring), run(full)
    assert [layer.kv.window for layer in ring.layers] == [23, None]
    assert torch.equal(out_ring, out_full)
    assert ring.layers[0].kv._num_used == 2 * 3 < full.layers[0].kv._num_used == 2 * 8  # pool pages, B = 2
    assert ring.layers[0].kv.nbytes < full.layers[0].kv.nbytes
    assert ring.layers[1].kv.nbytes == full.layers[1].kv.nbytes
    # Thrift: the ring keeps the window's 16-bit copy too, and its decode steps select among the window's pages
    m.set_attn_implementation(fh.register("thrift", budget=0.25))
    ring16, full16 = fh.fp4_cache(m.config, keep_16bit=True), fh.fp4_cache(keep_16bit=True)
    out_ring16, out_full16 = run(ring16), run(full16)
    assert [layer.kv.window for layer in ring16.layers] == [23, None]
    assert torch.equal(out_ring16, out_full16)
    assert ring16.layers[0].kv.nbytes < full16.layers[0].kv.nbytes
    assert not torch.equal(out_ring16, out_ring)  # (Thrift's 16-bit pages: other logits than nvfp4's)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_generate_cuda_graph_sliding_window_model():
    """A Gemma 3 model with local (sliding-window) layers on the GPU: generate()'s replayed steps decode the window
    from recycled pages (the mask function leaves the sliding mask out under capture; the layer's sliding_window
    gives the window) and give the eager tokens, which are transformers' generate() tokens with the same cache
    (ragged prompts included: each prefilled alone, then one batch)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                           sliding_window=100, layer_types=["sliding_attention"] * 3 + ["full_attention"])
    torch.manual_seed(0)
    m = Gemma3ForCausalLM(cfg).eval().to("cuda", torch.bfloat16)
    m.set_attn_implementation(fh.register("nvfp4"))
    # token ids from 1: transformers' generate() masks every pad token (id 0) of the prompt, which made its prefill
    # a mask with holes (1198 exact per-row-group calls per layer, warned) and compared other attention
    ids = torch.randint(1, 96, (3, 400), generator=torch.Generator().manual_seed(25)).to("cuda")
    eager = fh.greedy_generate(m, ids, 60, cuda_graph=False)
    assert torch.equal(fh.greedy_generate(m, ids, 60), eager)
    with torch.no_grad():
        theirs = m.generate(ids, max_new_tokens=60, do_sample=False, past_key_values=fh.fp4_cache(m.config))
    assert torch.equal(theirs, eager)
    mask = torch.ones_like(ids)
    mask[1, :150] = 0
    runs = [fh.greedy_generate(m, ids, 40, attention_mask=mask, cuda_graph=g) for g in (False, True)]
    assert torch.equal(runs[0], runs[1])


def test_generate_sliding_window_padded_prompts_equal_each_prompt_alone():
    """Gemma 3 with 8-key windows, prompts of 40, 25 and 11 tokens left-padded: every sequence's new tokens are
    those of its prompt alone, eagerly: each decode step reads each sequence's own window from its pages (the
    sliding mask transformers builds for the longest sequence describes none of the others)."""
    m = _gemma3(window=8, layers=["sliding_attention", "full_attention"])
    m.set_attn_implementation(fh.register("nvfp4"))
    g = torch.Generator().manual_seed(26)
    prompts = [torch.randint(1, 96, (n,), generator=g) for n in (40, 25, 11)]
    alone = [fh.generate(m, p[None], 8, cuda_graph=False)[0, len(p):] for p in prompts]
    ids = torch.zeros(3, 40, dtype=torch.long)
    mask = torch.zeros(3, 40, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, 40 - len(p):], mask[b, 40 - len(p):] = p, 1
    out = fh.generate(m, ids, 8, cuda_graph=False, attention_mask=mask)
    for b in range(3):
        assert torch.equal(out[b, 40:], alone[b]), b


def test_mistral_training_runs_windowed_attn_qat(monkeypatch):
    """Training a sliding-window model: one fp4attn.attn_qat call per layer with window_size=(w - 1, 0), not one
    call per query row; with the bf16 recipe the gradients are those of transformers' sdpa (the window as a
    mask)."""
    m = _mistral()
    m.train()
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(27))
    calls = []
    real = fp4attn.attn_qat
    monkeypatch.setattr(fp4attn, "attn_qat", lambda *a, **kw: calls.append(kw.get("window_size")) or real(*a, **kw))
    m.set_attn_implementation(fh.register("nvfp4"))
    m(ids, labels=ids).loss.backward()
    assert calls == [(7, 0)] * 2
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)

    def grads(impl):
        m.zero_grad()
        m.set_attn_implementation(impl)
        m(ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in m.parameters() if p.grad is not None]
    for ours, theirs in zip(grads(fh.register("bf16")), grads("sdpa")):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_softcap_fallback_runs_eager_attention_with_the_causal_and_sliding_masks():
    """Gemma 2 (attention logit softcapping: the model's eager attention runs instead of FP4): the fallback gets
    the additive mask eager attention needs. transformers' sdpa-style mask function gives None for a plain
    causal prompt (eager then attended to every key) and boolean masks for sliding layers (eager then added
    True/False to the scores) — the logits were wrong before both were written out as additive masks. Now they
    are eager's, unpadded and left-padded."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    cfg = Gemma2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                       sliding_window=8)
    torch.manual_seed(0)
    m = Gemma2ForCausalLM(cfg).eval()
    ids = torch.randint(1, 96, (2, 30), generator=torch.Generator().manual_seed(28))
    am = torch.ones_like(ids)
    am[1, :7] = 0
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    outs = {}
    for impl in (fh.register("nvfp4"), "eager"):
        m.set_attn_implementation(impl)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs[impl] = (m(ids).logits, m(ids, attention_mask=am, position_ids=pos).logits)
    ours, eager = outs[fh.register("nvfp4")], outs["eager"]
    torch.testing.assert_close(ours[0], eager[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1][am.bool()], eager[1][am.bool()], rtol=1e-5, atol=1e-5)


def test_fp4_cache_crop_rolls_back_a_speculative_step():
    """FP4Cache.crop (transformers' assisted / prompt-lookup generation drops rejected draft tokens): the layer's
    KVCache afterwards holds the bits of one that never had them, for transformers' negative counts and earlier
    versions' absolute lengths; a multi-token append is recorded without being asked, a one-token append that
    completed a slot only after activate_past_recording."""
    from fp4attn.kvcache import KVCache
    from test_kvcache_decode import _assert_same_content
    g = torch.Generator().manual_seed(91)
    k = torch.randn(1, 2, 80, 32, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 2, 80, 32, generator=g).to(torch.bfloat16)
    cache = fh.fp4_cache()
    cache.update(k[:, :, :60], v[:, :, :60], 0)
    cache.update(k[:, :, 60:66], v[:, :, 60:66], 0)  # a verify step: completes slot 48..63
    cache.crop(-4)  # 2 of 6 accepted
    kv = cache.layers[0].kv
    _assert_same_content(kv, KVCache.from_dense(k[:, :, :62], v[:, :, :62]))
    cache.update(k[:, :, 62:70], v[:, :, 62:70], 0)
    cache.crop(63)  # an absolute length (earlier transformers)
    _assert_same_content(kv, KVCache.from_dense(k[:, :, :63], v[:, :, :63]))
    cache.update(k[:, :, 63:64], v[:, :, 63:64], 0)  # one token completes slot 48..63, not recorded
    with pytest.raises(RuntimeError, match="record_past"):
        cache.crop(-1)
    for layer in cache.layers:
        layer.activate_past_recording()
    cache.crop(0)
    cache.update(k[:, :, 64:65], v[:, :, 64:65], 0)
    cache.update(k[:, :, 65:80], v[:, :, 65:80], 0)  # completes slot 64..79
    cache.crop(-3)
    _assert_same_content(kv, KVCache.from_dense(k[:, :, :77], v[:, :, :77]))


def test_bottom_right_causal_mask_decodes_from_the_fp4_pages(monkeypatch):
    """A speculative step's verification passes several queries with a materialized causal mask: when every row is
    the bottom-right causal pattern the attention function decodes from the FP4 pages, as without a mask; a
    padding mask still takes the dense path."""
    m = _llama()
    attn = m.model.layers[0].self_attn
    fn = fh.make_attention_function("nvfp4")
    g = torch.Generator().manual_seed(92)
    B, Hq, Hkv, T, S, D = 2, 4, 2, 70, 3, 16
    k = torch.randn(B, Hkv, T, D, generator=g)
    v = torch.randn(B, Hkv, T, D, generator=g)
    q = torch.randn(B, Hq, S, D, generator=g)
    kv = fp4attn.KVCache.from_dense(k, v)
    calls = []
    real = fp4attn.decode
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: calls.append(a[0].shape[2]) or real(*a, **kw))

    def run(mask):
        key = kv.dequantize()[0]  # dense values, as the placeholders' fallback would read
        key._fp4attn_kvcache = kv
        return fn(attn, q, key, kv.dequantize()[1], mask, scaling=D ** -0.5, is_causal=True)[0]

    allowed = torch.ones(S, T, dtype=torch.bool).tril(T - S)
    additive = torch.zeros(B, 1, S, T).masked_fill(~allowed, float("-inf"))
    out_mask, out_none = run(additive), run(None)
    assert calls == [S, S] and torch.equal(out_mask, out_none)
    padded = additive.clone()
    padded[1, :, :, :5] = float("-inf")  # sequence 1 left-padded: not a plain decode step
    run(padded)
    assert calls == [S, S]


def test_prompt_lookup_generation_with_the_fp4_cache(monkeypatch):
    """transformers' prompt-lookup (speculative) generation on an FP4Cache: verify steps decode several queries from
    the pages and rejected drafts are cropped; it gives as many tokens as asked and starts with greedy's first."""
    _prompt_lookup_case(monkeypatch, _llama(), "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prompt_lookup_generation_with_the_fp4_cache_gpu(monkeypatch):
    """The same on a GPU (the append kernels; D = 64 and 8 query heads per kv head: a 5-token verify step has 40
    query rows, the split kernel with the rows along M)."""
    _prompt_lookup_case(monkeypatch, _llama(heads=8, kv_heads=1, hidden=512).to("cuda", torch.bfloat16), "cuda")


@pytest.mark.parametrize("with_config", [False, True])
def test_prompt_lookup_with_long_drafts_records_every_layer(with_config):
    """Assisted generation asks the cache to record its appends (``activate_past_recording``, with transformers'
    keyword ``recurrent_states_to_keep``) so that rejected drafts of any length can be cropped: with
    ``fp4_cache(config)`` (layers made up front) the call reaches every layer (it raised a TypeError), and without
    a config the layers created afterwards record too (drafts of 64 or more tokens could not be cropped)."""
    m = _llama()
    m.set_attn_implementation(fh.register("nvfp4"))
    base = torch.randint(1, 96, (1, 90), generator=torch.Generator().manual_seed(3))
    ids = torch.cat([base] * 3, 1)
    cache = fh.fp4_cache(m.config) if with_config else fh.fp4_cache()
    with torch.no_grad():
        out = m.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, max_new_tokens=100,
                         do_sample=False, prompt_lookup_num_tokens=80, max_matching_ngram_size=2)
    assert out.shape == (1, 370)


def _prompt_lookup_case(monkeypatch, m, dev):
    name = fh.register("nvfp4")
    m.set_attn_implementation(name)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11,
                         5, 6, 7, 8, 9, 10, 11, 5, 6, 7]], device=dev)
    crops, multi = [], []
    real_crop, real_dec = fp4attn.KVCache.crop, fp4attn.decode
    monkeypatch.setattr(fp4attn.KVCache, "crop", lambda self, n: crops.append(n) or real_crop(self, n))
    monkeypatch.setattr(fp4attn, "decode", lambda *a, **kw: multi.append(a[0].shape[2]) or real_dec(*a, **kw))
    with torch.no_grad():
        out = m.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, prompt_lookup_num_tokens=4,
                         past_key_values=fh.fp4_cache())
        greedy = m.generate(ids, max_new_tokens=1, do_sample=False, past_key_values=fh.fp4_cache())
    assert out.shape == (1, ids.shape[1] + 24)
    assert max(multi) > 1  # verify steps decoded several queries from the pages
    assert any(crops)  # some drafts were rejected and cropped
    assert out[0, ids.shape[1]] == greedy[0, ids.shape[1]]
