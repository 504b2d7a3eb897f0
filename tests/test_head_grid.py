"""Launch grids with more (batch, head) pairs than CUDA's gridDim.y (65535).

The attention-family kernels (pre-passes, attention passes, Attn-QAT, Thrift, decode) run one program per
(tile, batch·head) pair. They take the pair from ``kernels._tiles.head_program`` on a grid from
``kernels._launch.head_grid``: the tiles on axis 0, B·H folded over axes 1 and 2 as an exact factorization
y·z = B·H (both at most 65535). Before, B·H sat on axis 1 alone and B·H > 65535 failed with "Triton Error
[CUDA]: invalid argument" (H200, ``benchmarks/biggrid-s16/``); the ops then split such batches and
concatenated the parts. (A fold onto axis 0, tile = pid % tiles, was 2-6% slower on the GPU:
``benchmarks/grid-s19/``.)

CPU: the kernels under ``TRITON_INTERPRET=1`` (the ops forced onto their kernel path) with the per-axis
limit lowered to 4, so that 6 (batch, head) pairs are folded as 3 x 2: the same bits as the unfolded launch.
GPU (``-m gpu``): B·H = 65600 for real, against the two halves of the batch called apart.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.kernels import _launch  # noqa: E402
from fp4attn.ops import _dispatch  # noqa: E402
from fp4attn.ops import decode as decode_op  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available() and not INTERPRET
cpu_interp = pytest.mark.skipif(not INTERPRET, reason="interpreter test (TRITON_INTERPRET=1)")
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (and TRITON_INTERPRET unset)")


def test_head_grid_factorizes_exactly():
    assert _launch.head_grid(3, 5) == (3, 5, 1)
    assert _launch.head_grid(7, 65535) == (7, 65535, 1)
    assert _launch.head_grid(64, 65600) == (64, 32800, 2)  # B = 8200, H = 8
    assert _launch.head_grid(2, 65536) == (2, 32768, 2)
    for heads in (3 * 65536, 65536 * 32767, 65535 ** 2, 8192 * 40):
        _, y, z = _launch.head_grid(1, heads)
        assert y * z == heads and y <= 65535 and z <= 65535
    for heads in (65537, 2 * 65537, 3 * 65537):  # no two factors <= 65535 (65537 is prime)
        with pytest.raises(ValueError, match="do not factor"):
            _launch.head_grid(1, heads)


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    """The ops' kernel branch for CPU tensors (the interpreter runs the kernels)."""
    monkeypatch.setattr(_dispatch, "use_kernels", lambda *t: True)
    monkeypatch.setattr(decode_op, "use_kernels", lambda *t: True)


def _both(monkeypatch, fn):
    """fn() on unfolded grids, then with the per-axis limit lowered to 4 (B·H folded over axes 1 and 2)."""
    whole = fn()
    monkeypatch.setattr(_launch, "GRID_YZ_MAX", 4)
    assert _launch.head_grid(1, 6) == (1, 3, 2)
    folded = fn()
    monkeypatch.setattr(_launch, "GRID_YZ_MAX", 65535)
    return whole, folded


def _qkv(B, Hq, Hkv, N, D, layout="bhsd", seed=0):
    g = torch.Generator().manual_seed(seed)
    shp = (lambda h: (B, h, N, D)) if layout == "bhsd" else (lambda h: (B, N, h, D))
    return [torch.randn(*shp(h), generator=g) for h in (Hq, Hkv, Hkv)]


@cpu_interp
@pytest.mark.parametrize("recipe,layout", [("nvfp4", "bhsd"), ("mxfp4", "bhsd"), ("sage3", "bshd")])
def test_attention_folded_grid_is_bit_identical(kernels_on_cpu, monkeypatch, recipe, layout):
    q, k, v = _qkv(3, 2, 2, 200, 32, layout)  # 6 (batch, head) pairs, 2 query tiles of 128 each
    whole, folded = _both(monkeypatch, lambda: fp4attn.attention(q, k, v, causal=True, recipe=recipe,
                                                                 layout=layout, return_lse=True))
    assert torch.equal(whole[0], folded[0]) and torch.equal(whole[1], folded[1])
    assert whole[0].abs().sum() > 0


@cpu_interp
def test_thrift_folded_grid_is_bit_identical(kernels_on_cpu, monkeypatch):
    q, k, v = _qkv(3, 2, 2, 130, 32)  # 3 query blocks of 64 per head
    whole, folded = _both(monkeypatch, lambda: fp4attn.thrift_attention(q, k, v, causal=True, budget=0.5))
    assert torch.equal(whole, folded) and whole.abs().sum() > 0


@cpu_interp
def test_decode_folded_grid_is_bit_identical(kernels_on_cpu, monkeypatch):
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D = 3, 4, 2, 64
    cache = fp4attn.KVCache(B, Hkv, D, page_size=64)
    cache.append(torch.randn(B, Hkv, 200, D, generator=g), torch.randn(B, Hkv, 200, D, generator=g),
                 lengths=[200, 37, 130])
    q = torch.randn(B, Hq, 1, D, generator=g)
    # 2 splits x 6 (sequence, kv head) pairs
    whole, folded = _both(monkeypatch, lambda: fp4attn.decode(q, cache, return_lse=True, num_splits=2))
    assert torch.equal(whole[0], folded[0]) and torch.equal(whole[1], folded[1])
    assert whole[0].abs().sum() > 0


@gpu
@pytest.mark.gpu
def test_gpu_more_pairs_than_grid_axis_1():
    """B·H = 65600 > 65535 on the GPU: each op runs and equals the two halves of the batch called apart."""
    B, H, N, D = 8200, 8, 32, 64
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    h = B // 2
    for f in (lambda a, b, c: fp4attn.attention(a, b, c, causal=True),
              lambda a, b, c: fp4attn.attention(a, b, c, recipe="mxfp4"),
              lambda a, b, c: fp4attn.attention(a, b, c, recipe="sage3", causal=True),
              lambda a, b, c: fp4attn.thrift_attention(a, b, c, causal=True),
              lambda a, b, c: fp4attn.attn_qat(a, b, c, causal=True)):
        out = f(q, k, v)
        assert torch.equal(out, torch.cat([f(q[:h], k[:h], v[:h]), f(q[h:], k[h:], v[h:])]))
    qq = q.clone().requires_grad_(True)
    fp4attn.attn_qat(qq, k, v).float().square().sum().backward()
    parts = []
    for s in (slice(0, h), slice(h, B)):
        qh = q[s].clone().requires_grad_(True)
        fp4attn.attn_qat(qh, k[s], v[s]).float().square().sum().backward()
        parts.append(qh.grad)
    assert torch.equal(qq.grad, torch.cat(parts)) and qq.grad.abs().sum() > 0
    whole, halves = (fp4attn.KVCache.from_dense(k, v, keep_16bit=True),
                     [fp4attn.KVCache.from_dense(k[s], v[s], keep_16bit=True) for s in (slice(0, h), slice(h, B))])
    qd = torch.randn(B, 2 * H, 1, D, device="cuda", dtype=torch.bfloat16)
    for budget in (None, 0.25):
        out = fp4attn.decode(qd, whole, thrift_budget=budget)
        assert out.shape == qd.shape and torch.isfinite(out).all()
        ref = torch.cat([fp4attn.decode(qd[:h], halves[0], thrift_budget=budget),
                         fp4attn.decode(qd[h:], halves[1], thrift_budget=budget)])
        assert torch.equal(out, ref)
