"""Batches with more (batch, head) pairs than one CUDA launch grid holds (gridDim.y <= 65535).

The kernels put one (batch, head) pair per program on grid axis 1, so before the ops split such batches,
``attention`` / ``thrift_attention`` / ``attn_qat`` / ``decode`` with B·H > 65535 failed with "Triton Error
[CUDA]: invalid argument" (H200, ``benchmarks/biggrid-s16/``), where SDPA runs. CPU: the kernels under
``TRITON_INTERPRET=1`` with the limit lowered to 4 (the ops forced onto their kernel path): the split call
gives the same bits as the whole batch in one launch (``attn_qat``'s kernels run only as CUDA custom ops,
so its split, forward and backward, is checked on the GPU). GPU (``-m gpu``): B·H = 65600 for real.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.ops import _dispatch  # noqa: E402
from fp4attn.ops import decode as decode_op  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available() and not INTERPRET
cpu_interp = pytest.mark.skipif(not INTERPRET, reason="interpreter test (TRITON_INTERPRET=1)")
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")


def test_batch_chunks_slices():
    assert _dispatch.batch_chunks(8, 8192) == [slice(0, 7), slice(7, 8)]  # 65536 > 65535: split ...
    assert _dispatch.batch_chunks(7, 8192) is None  # ... 57344 fits
    assert _dispatch.batch_chunks(3, 40000) == [slice(b, b + 1) for b in range(3)]  # one sequence per chunk
    c = _dispatch.batch_chunks(8200, 8)
    assert c == [slice(0, 8191), slice(8191, 8200)]
    assert all((s.stop - s.start) * 8 <= _dispatch.GRID_Y_MAX for s in c)


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """The ops' kernel branch for CPU tensors (the interpreter runs the kernels)."""
    monkeypatch.setattr(_dispatch, "use_kernels", lambda *t: True)
    monkeypatch.setattr(decode_op, "use_kernels", lambda *t: True)


def _both(monkeypatch, fn):
    """fn() with the whole batch in one launch, then with the grid limit lowered to 4 pairs."""
    whole = fn()
    monkeypatch.setattr(_dispatch, "GRID_Y_MAX", 4)
    split = fn()
    monkeypatch.setattr(_dispatch, "GRID_Y_MAX", 65535)
    return whole, split


def _qkv(B, Hq, Hkv, N, D, layout="bhsd", seed=0):
    g = torch.Generator().manual_seed(seed)
    shp = (lambda h: (B, h, N, D)) if layout == "bhsd" else (lambda h: (B, N, h, D))
    return [torch.randn(*shp(h), generator=g) for h in (Hq, Hkv, Hkv)]


@cpu_interp
@pytest.mark.parametrize("recipe,layout", [("nvfp4", "bhsd"), ("sage3", "bshd")])
def test_attention_split_batch_is_bit_identical(kernels_on_cpu, monkeypatch, recipe, layout):
    q, k, v = _qkv(3, 2, 1, 40, 32, layout)  # B·Hq = 6 > 4: chunks of 2 and 1 sequences
    whole, split = _both(monkeypatch, lambda: fp4attn.attention(q, k, v, causal=True, recipe=recipe,
                                                                layout=layout, return_lse=True))
    assert whole[0].shape == split[0].shape == q.shape and split[1].shape == (3, 2, 40)
    assert torch.equal(whole[0], split[0]) and torch.equal(whole[1], split[1])
    assert whole[0].abs().sum() > 0


@cpu_interp
def test_thrift_split_batch_is_bit_identical(kernels_on_cpu, monkeypatch):
    q, k, v = _qkv(3, 2, 2, 130, 32)
    whole, split = _both(monkeypatch, lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.5))
    assert torch.equal(whole, split) and whole.abs().sum() > 0


@cpu_interp
def test_decode_split_batch_is_bit_identical(kernels_on_cpu, monkeypatch):
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D = 3, 4, 2, 64  # B·Hq = 12 > 4: chunks of one sequence
    cache = fp4attn.KVCache(B, Hkv, D, page_size=64)
    cache.append(torch.randn(B, Hkv, 90, D, generator=g), torch.randn(B, Hkv, 90, D, generator=g),
                 lengths=[90, 37, 70])
    q = torch.randn(B, Hq, 1, D, generator=g)
    whole, split = _both(monkeypatch, lambda: fp4attn.decode(q, cache, return_lse=True))
    assert torch.equal(whole[0], split[0]) and torch.equal(whole[1], split[1])
    assert whole[0].abs().sum() > 0
    assert cache.batch_size == 3 and cache.lengths == [90, 37, 70]  # the views left the cache alone


@gpu
@pytest.mark.gpu
def test_gpu_more_pairs_than_a_launch_grid():
    """B·H = 65600 > 65535 on the GPU: each op runs and equals the two halves of the batch called apart."""
    B, H, N, D = 8200, 8, 32, 64
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    h = B // 2
    for f in (lambda a, b, c: fp4attn.attention(a, b, c, causal=True),
              lambda a, b, c: fp4attn.attention(a, b, c, recipe="mxfp4"),
              lambda a, b, c: fp4attn.thrift_attention(a, b, c, causal=True),
              lambda a, b, c: fp4attn.attn_qat(a, b, c, causal=True)):
        out = f(q, k, v)
        assert torch.equal(out, torch.cat([f(q[:h], k[:h], v[:h]), f(q[h:], k[h:], v[h:])]))
    qq = q.clone().requires_grad_(True)
    fp4attn.attn_qat(qq, k, v).float().square().sum().backward()
    assert torch.isfinite(qq.grad).all() and qq.grad.abs().sum() > 0
    cache = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    qd = torch.randn(B, 2 * H, 1, D, device="cuda", dtype=torch.bfloat16)
    for budget in (None, 0.25):
        out = fp4attn.decode(qd, cache, thrift_budget=budget)
        assert out.shape == qd.shape and torch.isfinite(out).all()
        ref = torch.cat([fp4attn.decode(qd[:h], cache._batch_view(slice(0, h)), thrift_budget=budget),
                         fp4attn.decode(qd[h:], cache._batch_view(slice(h, B)), thrift_budget=budget)])
        assert torch.equal(out, ref)
