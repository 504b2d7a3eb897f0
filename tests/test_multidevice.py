"""Every public op on a CUDA device that is not the current one (GPU, two or more devices).

Triton launches on the current device, not on the arguments' device; the ops make the tensors' device
current around their kernels (``ops._dispatch.on_device``). A model split over GPUs (transformers'
``device_map="auto"``) calls the ops on cuda:1 while cuda:0 is current. Each test runs an op on cuda:0
as the current device, then on copies of its inputs on cuda:1 with cuda:0 still current (and the
reverse), and checks that the results lie on the inputs' device, equal the cuda:0 results bit for bit
(same GPU model, deterministic kernels) and that the current device is unchanged afterwards. Without the
guard these calls launched on the current device, and Triton refused the other device's pointers.
"""

import pytest
import torch

import fp4attn
from fp4attn import KVCache

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs 2 CUDA devices"),
]

OTHER = [(0, 1), (1, 0)]  # (current device, tensors' device)


def _same(a, b):
    """Bitwise equality of (nested) results computed on two devices."""
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    if isinstance(a, torch.Tensor):
        assert torch.equal(a.cpu(), b.cpu())
        return
    assert a == b


def _run(fn, inputs, cur, dev):
    """fn(*inputs on ``dev``) with ``cur`` the current device; checks the devices and returns the result."""
    moved = [x.to(f"cuda:{dev}") if isinstance(x, torch.Tensor) else x for x in inputs]
    with torch.cuda.device(cur):
        out = fn(*moved)
        torch.cuda.synchronize(dev)
        assert torch.cuda.current_device() == cur
    for t in (out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(t, torch.Tensor):
            assert t.device == torch.device(f"cuda:{dev}")
    return out


def _check(fn, inputs, cur, dev):
    ref = _run(fn, inputs, dev, dev)  # on the tensors' own device as the current one
    _same(_run(fn, inputs, cur, dev), ref)


def _qkv(B=2, Hq=4, Hkv=2, N=200, D=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, D, generator=g).to(dtype) for h in (Hq, Hkv, Hkv)]


@pytest.mark.parametrize("cur,dev", OTHER)
@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3", "bf16"])
def test_attention_on_another_device(recipe, cur, dev):
    _check(lambda q, k, v: fp4attn.attention(q, k, v, causal=True, recipe=recipe, return_lse=recipe != "bf16"),
           _qkv(), cur, dev)


@pytest.mark.parametrize("cur,dev", OTHER)
def test_thrift_attention_on_another_device(cur, dev):
    _check(lambda q, k, v: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.25, return_lse=True),
           _qkv(N=300), cur, dev)


@pytest.mark.parametrize("cur,dev", OTHER)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_on_another_device(fmt, cur, dev):
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)

    def fn(x):
        t = fp4attn.quantize(x, fmt, dim=0)
        return t.data, t.scales, fp4attn.fake_quantize(x, fmt, dim=-1)

    _check(fn, [x], cur, dev)


@pytest.mark.parametrize("cur,dev", OTHER)
def test_attn_qat_forward_backward_on_another_device(cur, dev):
    def fn(q, k, v, do):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        o = fp4attn.attn_qat(q, k, v, causal=True)
        o.backward(do)
        return o.detach(), q.grad, k.grad, v.grad

    q, k, v = _qkv(N=130)
    _check(fn, [q, k, v, torch.randn_like(q)], cur, dev)


@pytest.mark.parametrize("cur,dev", OTHER)
def test_kvcache_and_decode_on_another_device(cur, dev):
    B, Hq, Hkv, D = 2, 8, 2, 128
    g = torch.Generator().manual_seed(2)
    k, v = (torch.randn(B, Hkv, 300, D, generator=g).to(torch.bfloat16) for _ in range(2))
    steps = [(torch.randn(B, Hkv, 1, D, generator=g).to(torch.bfloat16),
              torch.randn(B, Hkv, 1, D, generator=g).to(torch.bfloat16),
              torch.randn(B, Hq, 1, D, generator=g).to(torch.bfloat16)) for _ in range(20)]

    def fn(k, v, *flat):
        # from_dense (the general append path), then one-token appends (the append kernel) with a
        # decode (FP4, and Thrift over the 16-bit copy) after each
        c = KVCache.from_dense(k, v, lengths=[300, 211], keep_16bit=True)
        outs = []
        for i in range(0, len(flat), 3):
            ks, vs, q = flat[i:i + 3]
            c.append(ks, vs)
            outs.append(fp4attn.decode(q, c, return_lse=True))
            outs.append(fp4attn.decode(q, c, thrift_budget=0.1))
        return (c.k_data, c.k_scale, c.v_data, c.v_scale, c.k16, c.k_page_mean, *outs)

    _check(fn, [k, v, *[t for s in steps for t in s]], cur, dev)


@pytest.mark.parametrize("cur,dev", OTHER)
def test_quartet_linear_on_another_device(cur, dev):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 128, generator=g).to(torch.bfloat16)
    dy = torch.randn(256, 192, generator=g).to(torch.bfloat16)
    w = torch.randn(192, 128, generator=g).to(torch.bfloat16) * 0.05
    bias = torch.randn(192, generator=g).to(torch.bfloat16)

    def fn(x, dy, w, bias):
        lin = fp4attn.nn.QuartetLinear(128, 192, dtype=torch.bfloat16, device=w.device, seed=7)
        with torch.no_grad():  # the same parameters on both devices (nn.Linear's init draws from the global RNG)
            lin.weight.copy_(w)
            lin.bias.copy_(bias)
        xr = x.detach().requires_grad_()
        y = lin(xr)
        y.backward(dy)
        return y.detach(), xr.grad, lin.weight.grad, lin.bias.grad

    _check(fn, [x, dy, w, bias], cur, dev)
