"""Shared pieces of the reference attention implementations (plain PyTorch).

Glossary (the papers' names, used throughout fp4attn):

* S  = scale · Q Kᵀ, the attention scores (FP32).
* P̃  = exp(S − m), the *unnormalized* softmax numerator with m a row max. The reference takes the
  row max over all keys ("one-shot" P̃, SPEC §3); kernels use the running max of online softmax.
* l  = rowsum(P̃), always from the unquantized P̃; the output is O = (Σ ϕ(P̃)·V) / l.
* ϕ  = FP4 fake quantization (quantize then dequantize) in blocks along the stated axis.
* O' = P̃·Vᶠ / l, the high-precision output Attn-QAT keeps for its backward.
* LSE = m + log(l), the log-sum-exp of each row's scores (natural log).
* D  = rowsum(dO ∘ O'), the softmax-backward row term of FlashAttention's backward.

Memory stays bounded: every op walks the queries in row chunks, each chunk materializing its full
rows of S (so the row max is exact) but never all N×N at once.
"""

from __future__ import annotations

import math

import torch

from ..formats.core import fake_quantize_values

# Upper bound on the elements of one (B, H, rows, Nk) score chunk (float32: 4 bytes each).
CHUNK_ELEMS = 1 << 24


def compute_dtype(*ts: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def default_scale(D: int, scale: float | None) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)


def expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    """(B, Hkv, N, D) -> (B, Hq, N, D): query head h reads kv head h // (Hq // Hkv)."""
    g = hq // x.shape[1]
    return x if g == 1 else x.repeat_interleave(g, dim=1)


def reduce_kv(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, N, D) gradients -> (B, Hkv, N, D), summed over each GQA group."""
    B, hq, N, D = x.shape
    return x if hq == hkv else x.view(B, hkv, hq // hkv, N, D).sum(dim=2)


def row_chunks(B: int, H: int, nq: int, nk: int, limit: int | None = None):
    """Yield (r0, r1) query-row ranges whose score chunk has at most ~limit elements."""
    limit = CHUNK_ELEMS if limit is None else limit
    rows = max(1, limit // max(1, B * H * nk))
    for r0 in range(0, nq, rows):
        yield r0, min(nq, r0 + rows)


def causal_keep(r0: int, r1: int, nq: int, nk: int, device) -> torch.Tensor:
    """Bottom-right causal mask for query rows r0..r1: True where key j <= i + nk - nq."""
    i = torch.arange(r0, r1, device=device).unsqueeze(1)
    j = torch.arange(nk, device=device).unsqueeze(0)
    return j <= i + (nk - nq)


def normalize_window(window_size, causal: bool) -> tuple[int, int] | None:
    """A sliding window ``window_size=(left, right)`` (FlashAttention's convention) in normal form.

    Query i, at position p = i + Nk − Nq (bottom-right aligned, as ``causal``), sees key j iff
    p − left <= j <= p + right; None or a negative value leaves that side unbounded, and ``causal``
    bounds the right side at p (its ``right`` must then be 0 or unbounded). Returns (left, right) with
    -1 = unbounded and right = 0 under ``causal``, or None when neither side is bounded beyond
    ``causal``. (transformers' ``sliding_window=w``, key j visible from q when q − w < j <= q, is
    ``window_size=(w − 1, 0)`` with ``causal=True``.) Values are assumed validated
    (``fp4attn.ops._validate.check_window``)."""
    if window_size is None:
        return None
    left, right = (-1 if w is None or w < 0 else int(w) for w in window_size)
    if causal:
        right = 0
    if left < 0 and (right < 0 or causal):
        return None
    return left, right


def effective_window(window, causal: bool, nq: int, nk: int) -> tuple[int, int] | None:
    """A normalized ``window`` with the extents that reach past every key unbounded (no row's window is cut
    there: left >= nk − 1, right >= nq − 1), None when nothing beyond ``causal`` is left. Masks are the same;
    the kernels' offsets (``kernels._tiles.window_offsets``) and Thrift's budget rule use this form."""
    if window is None:
        return None
    left, right = window
    left = -1 if left >= nk - 1 else left
    right = -1 if right >= nq - 1 else right
    if left < 0 and (right < 0 or causal):
        return None
    return left, right


def window_keep(r0: int, r1: int, nq: int, nk: int, causal: bool, window, device) -> torch.Tensor | None:
    """Visible keys of query rows r0..r1 (bool (r1 − r0, nk)) under ``causal`` and a normalized
    ``window`` (:func:`normalize_window`), or None when every key is visible."""
    if window is None:
        return causal_keep(r0, r1, nq, nk, device) if causal else None
    left, right = window
    p = torch.arange(r0, r1, device=device).unsqueeze(1) + (nk - nq)
    j = torch.arange(nk, device=device).unsqueeze(0)
    keep = torch.ones(r1 - r0, nk, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= p - left
    if right >= 0:
        keep &= j <= p + right
    return keep


def softmax_numerator(s: torch.Tensor, sink: torch.Tensor | None = None):
    """One-shot P̃ for a chunk of score rows (masked entries already -inf).

    Returns (p, m, l): P̃ = exp(S − m) with m the row max over all keys, l = rowsum(P̃).
    A row with no visible key has m = -inf, P̃ = 0 and l = 0.

    ``sink`` (broadcastable to (..., rows, 1), natural-log score units): an *attention sink* (gpt-oss), a
    logit with no value that joins every row's softmax: m = max(row max, sink), l = rowsum(P̃) + exp(sink − m)
    (so a row with no visible key has P̃ = 0, l = 1, m = sink).
    """
    m = s.amax(dim=-1, keepdim=True)
    if sink is not None:
        m = torch.maximum(m, sink.to(s.dtype).expand_as(m))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m_safe)
    l = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        l = l + torch.exp(sink.to(s.dtype) - m_safe)
    return p, m, l


def normalize(o: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """O / l with fully masked rows (l == 0) giving 0. A NaN l (a NaN/Inf query or key reached the
    row, SPEC §2) stays NaN: the test is ``l != 0``, not ``l > 0``, which would return a silent 0."""
    ok = l != 0
    return torch.where(ok, o / torch.where(ok, l, torch.ones_like(l)), torch.zeros_like(o))


def lse_of(m: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """LSE = m + log(l); -inf for fully masked rows; NaN where l is NaN (see ``normalize``)."""
    ok = l != 0
    lse = m + torch.log(torch.where(ok, l, torch.ones_like(l)))
    return torch.where(ok, lse, torch.full_like(lse, float("-inf"))).squeeze(-1)


def quantize_p(p: torch.Tensor, fmt: str, two_level: bool, tile: int = 64) -> torch.Tensor:
    """ϕ(P̃) along keys (last dim), single-level or SageAttention3's two-level scaling.

    Two-level: per row and ``tile``-key tile, s1 = rowmax(P̃)/(448·6); the tile is quantized as
    s1 · ϕ(P̃ / s1), so P̃'s block scales use the E4M3 range instead of sitting near its bottom.
    """
    if not two_level:
        return fake_quantize_values(p, fmt, dim=-1).to(p.dtype)
    nk = p.shape[-1]
    pad = (-nk) % tile
    pt = torch.nn.functional.pad(p, (0, pad)) if pad else p
    pt = pt.reshape(*p.shape[:-1], (nk + pad) // tile, tile)
    s1 = pt.amax(dim=-1, keepdim=True) / (448.0 * 6.0)
    pos = s1 > 0
    p2 = pt / torch.where(pos, s1, torch.ones_like(s1))
    q = fake_quantize_values(p2.float(), fmt, dim=-1).to(p.dtype) * torch.where(pos, s1, torch.zeros_like(s1))
    return q.reshape(*p.shape[:-1], nk + pad)[..., :nk]


def fq(x: torch.Tensor, fmt: str, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """ϕ(x) along ``dim`` (zero padding of that dim internal), returned in ``dtype``."""
    return fake_quantize_values(x, fmt, dim=dim).to(dtype)
