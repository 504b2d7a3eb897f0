"""``torch.compile`` over the ops ``attention``, ``thrift_attention``, ``quantize`` and ``fake_quantize``.

On CUDA, under tracing, their kernels run as the custom ops ``fp4attn::attention_fp4``,
``fp4attn::thrift_attention_fp4``, ``fp4attn::quantize`` and ``fp4attn::fake_quantize``: checked with
``torch.library.opcheck`` and by compiling small functions with ``fullgraph=True`` (Inductor, and CUDA
graphs through ``mode="reduce-overhead"``), whose results (and the straight-through gradient of
``fake_quantize``) must equal the eager call bit for bit. CPU (CI): the reference paths trace with
``fullgraph=True`` (Dynamo with the eager backend) and give the eager results.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
import fp4attn.ops.attention  # noqa: E402,F401  (registers the custom ops; fp4attn imports them lazily)
import fp4attn.ops.quantize  # noqa: E402,F401
import fp4attn.ops.thrift  # noqa: E402,F401

HAS_CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")


def _qkv(B, Hq, Hkv, N, D, dtype, device, layout="bhsd", seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, h, N, D) if layout == "bhsd" else (B, N, h, D) for h in (Hq, Hkv, Hkv)]
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in shapes]


def _model(op, return_lse=True, **kw):
    """A small function around the op, as a model's attention block would call it."""
    def f(q, k, v):
        res = op(q * 1.0, k, v, return_lse=return_lse, **kw)
        out, lse = res if return_lse else (res, q.new_zeros(()))
        return out.float() * 2.0 + 1.0, lse
    return f


def _equal_results(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_call_op_takes_the_custom_op_only_when_traced():
    """``_dispatch.call_op``: the implementation itself for plain eager tensors (no custom-op dispatch
    cost), the custom op under Dynamo and for tensor subclasses (FakeTensor: export, make_fx)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fp4attn.ops._dispatch import call_op

    seen = []

    def op(x, n):
        seen.append("op")
        return x + n

    def impl(x, n):
        seen.append("impl")
        return x + n

    x = torch.ones(3)
    assert torch.equal(call_op(op, impl, x, 2), x + 2) and seen == ["impl"]
    with FakeTensorMode() as mode:
        call_op(op, impl, mode.from_tensor(x), 2)
    assert seen == ["impl", "op"]
    torch._dynamo.reset()
    torch.compile(lambda x: call_op(op, impl, x, 2), backend="eager", fullgraph=True)(x)
    assert seen[-1] == "op"


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3", "bf16"])
def test_cpu_reference_path_traces_fullgraph(recipe):
    torch._dynamo.reset()
    q, k, v = _qkv(1, 4, 2, 48, 32, torch.float32, "cpu")
    f = _model(fp4attn.attention, causal=True, recipe=recipe)
    _equal_results(torch.compile(f, backend="eager", fullgraph=True)(q, k, v), f(q, k, v))


def test_cpu_thrift_reference_path_traces_fullgraph():
    torch._dynamo.reset()
    q, k, v = _qkv(1, 2, 1, 130, 32, torch.float32, "cpu")
    f = _model(fp4attn.thrift_attention, causal=True, budget=0.5)
    _equal_results(torch.compile(f, backend="eager", fullgraph=True)(q, k, v), f(q, k, v))


def _quant_model(fmt, dim, global_scale):
    def f(x):
        t = fp4attn.quantize(x, fmt, dim=dim, global_scale=global_scale)
        y = fp4attn.fake_quantize(x * 2.0, fmt, dim=dim, global_scale=global_scale)
        g = t.global_scale if global_scale else x.new_ones(())
        return t.data, t.scales.view(torch.uint8), g, y.float().sum(dim) + 1.0
    return f


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_cpu_quantize_reference_path_traces_fullgraph(fmt):
    torch._dynamo.reset()
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    f = _quant_model(fmt, 0, fmt == "nvfp4")
    _equal_results(torch.compile(f, backend="eager", fullgraph=True)(x), f(x))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_quantize_ops_opcheck_and_compile(fmt):
    torch._dynamo.reset()
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).cuda()
    gs = fmt == "nvfp4"
    for dim in (0, 1):
        torch.library.opcheck(torch.ops.fp4attn.quantize.default, (x, fmt, dim, "rceil", gs))
        xr = x.float().requires_grad_()
        torch.library.opcheck(torch.ops.fp4attn.fake_quantize.default, (xr, fmt, dim, "rceil", gs))
        f = _quant_model(fmt, dim, gs)
        _equal_results(torch.compile(f, fullgraph=True)(x), f(x))
    # the straight-through gradient, compiled and eager

    def loss(x):
        return (fp4attn.fake_quantize(x, fmt, dim=-1) ** 2).sum()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        xr = x.float().requires_grad_()
        fn(xr).backward()
        grads.append(xr.grad)
    assert torch.equal(grads[0], grads[1])
    assert torch.equal(grads[0], 2 * fp4attn.fake_quantize(x.float(), fmt, dim=-1))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_gpu_custom_ops_opcheck(layout):
    q, k, v = _qkv(1, 4, 2, 136, 64, torch.bfloat16, "cuda", layout)
    tr = (lambda t: t.transpose(1, 2)) if layout == "bshd" else (lambda t: t)
    qb, kb, vb = tr(q), tr(k), tr(v)  # the ops take bhsd views and return the caller's layout
    for args in [(qb, kb, vb, True, 0.125, "nvfp4", False, False, False, layout, True),
                 (qb, kb, vb, False, 0.125, "nvfp4", True, True, True, layout, False),  # sage3, no lse
                 (qb, kb, vb, True, 0.125, "mxfp4", False, False, False, layout, True)]:
        torch.library.opcheck(torch.ops.fp4attn.attention_fp4.default, args)
    for lse in (True, False):
        torch.library.opcheck(torch.ops.fp4attn.thrift_attention_fp4.default,
                              (qb, kb, vb, True, 0.125, 0.25, layout, lse))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_compile_fullgraph_equals_eager(mode):
    torch._dynamo.reset()
    q, k, v = _qkv(2, 8, 2, 300, 128, torch.bfloat16, "cuda", "bshd")
    for op, kw in [(fp4attn.attention, dict(recipe="nvfp4", causal=True)),
                   (fp4attn.attention, dict(recipe="sage3", return_lse=False)),
                   (fp4attn.attention, dict(recipe="mxfp4", causal=True)),
                   (fp4attn.thrift_attention, dict(budget=0.2, causal=True))]:
        f = _model(op, layout="bshd", **kw)
        cf = torch.compile(f, fullgraph=True, mode=mode)
        ref = f(q, k, v)
        for _ in range(3):  # reduce-overhead: warm-up, record, replay
            got = cf(q, k, v)
            _equal_results([t.clone() for t in got], ref)
