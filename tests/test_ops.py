"""Public ops on CPU (the reference path): SPEC §3 conventions and §5 errors."""

import math
import warnings

import pytest
import torch

import fp4attn
from fp4attn import reference

OPS = {
    "attention": lambda q, k, v, **kw: fp4attn.attention(q, k, v, **kw),
    "thrift": lambda q, k, v, **kw: fp4attn.thrift_attention(q, k, v, **kw),
}


def qkv(B=1, hq=4, hkv=2, nq=40, nk=56, D=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, hq, nq, D, generator=g).to(dtype), torch.randn(B, hkv, nk, D, generator=g).to(dtype),
            torch.randn(B, hkv, nk, D, generator=g).to(dtype))


@pytest.mark.parametrize("op", list(OPS))
def test_layouts_agree(op):
    q, k, v = qkv()
    a = OPS[op](q, k, v)
    b = OPS[op](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd")
    assert b.shape == (1, 40, 4, 32) and b.is_contiguous()
    assert torch.equal(a, b.transpose(1, 2))


@pytest.mark.parametrize("op", list(OPS))
def test_gqa_equals_repeated_kv(op):
    q, k, v = qkv()
    a = OPS[op](q, k, v, causal=True)
    b = OPS[op](q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), causal=True)
    assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3", "bf16"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtypes_return_lse_and_no_mutation(recipe, dtype):
    q, k, v = qkv(dtype=dtype)
    copies = [t.clone() for t in (q, k, v)]
    out, lse = fp4attn.attention(q, k, v, recipe=recipe, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (1, 4, 40)
    for t, c in zip((q, k, v), copies):
        assert torch.equal(t, c)


def test_bf16_recipe_is_exact_attention_and_lse():
    q, k, v = qkv(hkv=4, nq=33, nk=33)
    out, lse = fp4attn.attention(q, k, v, recipe="bf16", causal=True, return_lse=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out, ref, atol=1e-5)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(32)
    s = s.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)


def test_causal_is_bottom_right_aligned():
    q, k, v = qkv(hkv=4, nq=5, nk=9)
    out = fp4attn.attention(q, k, v, recipe="bf16", causal=True)
    mask = torch.arange(9).view(1, -1) <= torch.arange(5).view(-1, 1) + 4
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, ref, atol=1e-5)


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = qkv(nq=12, nk=5)
    out, lse = fp4attn.attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :, :7] == 0) and torch.isfinite(out).all()
    assert torch.all(lse[:, :, :7] == float("-inf"))


@pytest.mark.parametrize("D", [1, 8, 80, 200, 256])
def test_any_head_dim_and_ragged_lengths(D):
    q, k, v = qkv(nq=17, nk=23, D=D)
    out = fp4attn.attention(q, k, v)
    ref = reference.attention(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all()
    assert torch.equal(out, ref.to(out.dtype))
    # zero padding of D changes nothing: explicitly padded inputs give the same output
    if D % 16:
        pad = (-D) % 16
        P = lambda t: torch.nn.functional.pad(t, (0, pad))
        outp = fp4attn.attention(P(q), P(k), P(v), scale=1 / math.sqrt(D))
        assert torch.allclose(outp[..., :D], out, atol=1e-6)


def test_scale_argument():
    q, k, v = qkv()
    a = fp4attn.attention(q, k, v, scale=0.1, recipe="bf16")
    b = fp4attn.attention(q * 0.1 * math.sqrt(32), k, v, recipe="bf16")
    assert torch.allclose(a, b, atol=1e-5)


def test_attention_is_inference_only():
    """The inference ops have no autograd: called where autograd wants gradients of their inputs they say so (an
    SDPA user would otherwise get no gradient into q, k, v without noticing); not under torch.no_grad()."""
    q, k, v = qkv()
    q.requires_grad_(True)
    with pytest.warns(UserWarning, match="fp4attn.attention is an inference op"):
        out = fp4attn.attention(q, k, v)
    assert not out.requires_grad
    with pytest.warns(UserWarning, match="fp4attn.thrift_attention is an inference op"):
        fp4attn.thrift_attention(q, k, v)
    cache = fp4attn.KVCache(1, k.shape[1], k.shape[3], dtype=torch.float32)
    cache.append(k.detach(), v.detach())
    with pytest.warns(UserWarning, match="fp4attn.decode is an inference op"):
        fp4attn.decode(q[:, :, -1:], cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            fp4attn.attention(q, k, v)
        fp4attn.attention(q.detach(), k, v)


# ------------------------------------------------------------------------------------- errors
BAD = [
    (lambda q, k, v: (q[0], k, v), {}, ValueError, "q must be 4-D"),
    (lambda q, k, v: (q, k[:, :, :, :16], v), {}, ValueError, "head dim"),
    (lambda q, k, v: (q, k, v[:, :, :20]), {}, ValueError, "Nk"),
    (lambda q, k, v: (q, k[:1], v[:1]), {}, ValueError, "batch"),
    (lambda q, k, v: (q[:, :3], k, v), {}, ValueError, "multiple"),
    (lambda q, k, v: (torch.randn(1, 2, 4, 300), torch.randn(1, 2, 4, 300), torch.randn(1, 2, 4, 300)), {},
     ValueError, "256"),
    (lambda q, k, v: (q.long(), k, v), {}, TypeError, "q must be a float16"),
    (lambda q, k, v: (q, k.half(), v), {}, TypeError, "dtype"),
    (lambda q, k, v: (q, k, v), {"layout": "bsdh"}, ValueError, "layout"),
    (lambda q, k, v: (q, k, v), {"scale": -1.0}, ValueError, "scale"),
    (lambda q, k, v: (q, k, v), {"scale": float("nan")}, ValueError, "scale"),
    (lambda q, k, v: (q, k, v), {"scale": float("inf")}, ValueError, "scale"),
    (lambda q, k, v: (q, k, v), {"scale": "x"}, TypeError, "scale"),
    (lambda q, k, v: (q, k, v), {"causal": 1}, TypeError, "causal"),
    (lambda q, k, v: ("q", k, v), {}, TypeError, "q must be a torch.Tensor"),
    (lambda q, k, v: (q[:, :0], k, v), {}, ValueError, "Hq=0"),  # (no heads: as an empty batch, refused)
    (lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), {}, ValueError, "Hkv=0"),
    (lambda q, k, v: (q[:0], k[:0], v[:0]), {}, ValueError, "B=0"),
]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_inputs_raise_naming_the_argument(op, case):
    make, kw, exc, msg = BAD[case]
    q, k, v = qkv(B=2)
    with pytest.raises(exc, match=msg):
        OPS[op](*make(q, k, v), **kw)


def test_bad_recipe_fmt_budget():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="recipe"):
        fp4attn.attention(q, k, v, recipe="fp4")
    with pytest.raises(TypeError, match="two_level_p"):
        fp4attn.attention(q, k, v, two_level_p="yes")
    with pytest.raises(ValueError, match="fmt"):
        fp4attn.thrift_attention(q, k, v, fmt="int4")
    for b in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="budget"):
            fp4attn.thrift_attention(q, k, v, budget=b)
    with pytest.raises(TypeError, match="budget"):
        fp4attn.thrift_attention(q, k, v, budget="5%")
    with pytest.raises(ValueError, match="block_size"):
        fp4attn.thrift_attention(q, k, v, block_size=50)


def test_mixed_devices_rejected():
    q, k, v = qkv()
    meta = torch.randn(1, 2, 56, 32, device="meta")
    with pytest.raises(ValueError, match="device"):
        fp4attn.attention(q, meta, v)


def test_top_level_api_resolves_in_a_fresh_interpreter():
    """Every public name is reachable from `import fp4attn` alone (lazy attributes, no GPU needed)."""
    import subprocess
    import sys
    code = ("import fp4attn\n"
            "names = ['quantize', 'fake_quantize', 'FP4Tensor', 'attention', 'attn_qat', 'thrift_attention',\n"
            "         'KVCache', 'decode', 'sdpa_patch']\n"
            "assert all(callable(getattr(fp4attn, n)) for n in names)\n"
            "assert fp4attn.nn.QuartetLinear is not None\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_argument_types_named():
    """Arguments of the wrong type are TypeErrors naming them (a truthy string is not global_scale=True; a float
    block size is not a block size), and decode's num_splits is checked on every device."""
    q, k, v = qkv()
    x = torch.randn(4, 32)
    for fn in (fp4attn.quantize, fp4attn.fake_quantize):
        with pytest.raises(TypeError, match="global_scale must be a bool"):
            fn(x, global_scale="no")
    for bs in (64.0, True, None):
        with pytest.raises(TypeError, match="block_size"):
            fp4attn.thrift_attention(q, k, v, block_size=bs)
    cache = fp4attn.KVCache(1, k.shape[1], k.shape[3], dtype=torch.float32)
    cache.append(k, v)
    for ns in (0, -3, "x", 2.0, True):
        with pytest.raises(ValueError, match="num_splits"):
            fp4attn.decode(q[:, :, -1:], cache, num_splits=ns)
    fp4attn.decode(q[:, :, -1:], cache, num_splits=3)
    with pytest.raises(TypeError, match="scale must be a float"):
        fp4attn.attention(q, k, v, scale=torch.tensor(0.2, requires_grad=True))
    fp4attn.attention(q, k, v, scale=torch.tensor(0.2))  # (a plain one-element tensor: its value)
