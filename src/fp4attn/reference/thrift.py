"""Reference ThriftAttention (SPEC §3, ``fp4attn.thrift_attention``): plain PyTorch, row-chunked.

1. Block means Q̄ᵢ, K̄ⱼ over ``block_size`` tokens (FP32; a tail block averages its valid tokens).
2. Ŝ = Q̄ K̄ᵀ; for each query block the top-k visible key blocks (ties to the lower index) are
   *selected*; k comes from the budget (:func:`selected_per_block`).
3. Selected blocks run in 16 bits: S from the input-dtype q, k (FP32 accumulation), unquantized P̃
   and V. All other blocks run FP4 (Q, K along D, V along tokens) with two-level P.
4. One softmax over the merged scores (one-shot P̃ in the reference); attention ``sinks`` join it as in
   :func:`fp4attn.reference.attention` (a logit per query head, no value).

A sliding window (``window_size``, :func:`.common.normalize_window`) masks the scores exactly as in
:func:`fp4attn.reference.attention`; a key block is visible to a query block when some query of the block
sees some key of it, and the budget counts the blocks of the window's band (:func:`selected_per_block`).
"""

from __future__ import annotations

import torch

from .common import (
    compute_dtype,
    default_scale,
    effective_window,
    expand_kv,
    fq,
    lse_of,
    normalize,
    normalize_window,
    quantize_p,
    row_chunks,
    softmax_numerator,
    window_keep,
)


def budget_to_k(budget: float, n: int, causal: bool) -> int:
    """Number of selected key blocks per query block for a budget fraction f of n key blocks.

    Non-causal: k = clamp(round(f·n), 1, n) (Python's round, half to even).
    Causal: the k whose covered share of the causal triangle, (k·n − k(k−1)/2) / (n(n+1)/2), is
    closest to f (ties to the smaller k), clamped to [1, n].
    """
    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    if not causal:
        return min(max(round(budget * n), 1), n)
    total = n * (n + 1) / 2
    best_k, best_err = 1, float("inf")
    for k in range(1, n + 1):
        err = abs((k * n - k * (k - 1) / 2) / total - budget)
        if err < best_err:
            best_k, best_err = k, err
    return best_k


def block_means(x: torch.Tensor, bs: int) -> torch.Tensor:
    """(B, H, N, D) -> (B, H, ceil(N/bs), D) float32 means over each block's valid tokens."""
    B, H, N, D = x.shape
    nb = -(-N // bs)
    pad = nb * bs - N
    xp = torch.nn.functional.pad(x.float(), (0, 0, 0, pad)).view(B, H, nb, bs, D)
    counts = torch.full((nb,), float(bs), device=x.device)
    counts[-1] = bs - pad
    return xp.sum(dim=3) / counts.view(1, 1, nb, 1)


def _block_key_ranges(nq: int, nk: int, bs: int, causal: bool, window):
    """Per query block (of ``bs`` queries): the keys [lo, hi] some query of it sees (hi < lo: none), under
    bottom-right ``causal`` and a normalized ``window``. Query i (position p = i + nk − nq) sees keys
    p − left <= j <= p + right; over a block of consecutive queries the union of those ranges is one range."""
    first_q = torch.arange(-(-nq // bs), dtype=torch.int64) * bs
    last_q = torch.clamp(first_q + bs, max=nq) - 1
    left, right = window if window is not None else (-1, 0 if causal else -1)
    hi = torch.clamp(last_q + nk - nq + right, max=nk - 1) if right >= 0 else torch.full_like(last_q, nk - 1)
    lo = torch.clamp(first_q + nk - nq - left, min=0) if left >= 0 else torch.zeros_like(first_q)
    return lo, hi


def visible_blocks(nq: int, nk: int, bs: int, causal: bool, device, window=None) -> torch.Tensor:
    """(nqb, nkb) bool: key block j has a key visible to some query of query block i (bottom-right causal;
    ``window``: a normalized sliding window, :func:`.common.normalize_window`)."""
    lo, hi = (x.to(device) for x in _block_key_ranges(nq, nk, bs, causal, window))
    first_k = torch.arange(-(-nk // bs), device=device) * bs
    last_k = torch.clamp(first_k + bs, max=nk) - 1
    return (first_k.unsqueeze(0) <= hi.unsqueeze(1)) & (last_k.unsqueeze(0) >= lo.unsqueeze(1))


def selected_per_block(budget: float, nq: int, nk: int, bs: int, causal: bool, window=None) -> int:
    """k, the key blocks each query block computes in 16 bits, for the budget fraction f.

    Without a window: :func:`budget_to_k` over all nkb = ceil(nk/bs) key blocks (the causal triangle
    rule under ``causal``). With a sliding window, the non-causal rule over the window's band: n = the
    most key blocks visible to one query block, k = clamp(round(f·n), 1, n) (a query block that sees
    fewer key blocks selects all of its own when they are fewer than k). Window extents that reach past
    every key count as unbounded (:func:`.common.effective_window`): a window that cuts nothing is no
    window."""
    window = effective_window(window, causal, nq, nk)
    if window is None:
        return budget_to_k(budget, -(-nk // bs), causal)
    lo, hi = _block_key_ranges(nq, nk, bs, causal, window)  # (O(nqb): no nqb x nkb matrix)
    band = int(torch.where(hi >= lo, hi // bs - lo // bs + 1, 0).max())
    return budget_to_k(budget, max(band, 1), False)


def select_blocks(q, k, *, causal, budget, block_size, window=None):
    """(B, Hq, nqb, nkb) bool selection of the top-k visible key blocks per query block."""
    hq = q.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    qm = block_means(q, block_size)
    km = expand_kv(block_means(k, block_size), hq)
    s_hat = qm @ km.transpose(-1, -2)
    vis = visible_blocks(nq, nk, block_size, causal, q.device, window)
    s_hat = s_hat.masked_fill(~vis, float("-inf"))
    kk = selected_per_block(budget, nq, nk, block_size, causal, window)
    order = torch.sort(s_hat, dim=-1, descending=True, stable=True).indices[..., :kk]
    sel = torch.zeros_like(s_hat, dtype=torch.bool).scatter_(-1, order, True)
    return sel & vis


def thrift_attention(q, k, v, *, causal=False, scale=None, budget=0.05, block_size=64, fmt="nvfp4",
                     return_lse=False, selection=None, window_size=None, sinks=None):
    """Reference ThriftAttention on bhsd tensors; returns float32 (float64 for float64 inputs).

    ``selection`` (optional, (B, Hq, nqb, nkb) bool) overrides the top-k selection (for tests).
    ``window_size``, ``sinks``: as :func:`fp4attn.reference.attention`'s.
    """
    cd = compute_dtype(q, k, v)
    B, hq, nq, D = q.shape
    nk = k.shape[2]
    scale = default_scale(D, scale)
    window = normalize_window(window_size, causal)
    sel = select_blocks(q, k, causal=causal, budget=budget, block_size=block_size, window=window) \
        if selection is None else selection
    # 16-bit path operands: the input-dtype values (exact in the compute dtype)
    qx, kx, vx = q.to(cd), expand_kv(k.to(cd), hq), expand_kv(v.to(cd), hq)
    qf = fq(q.to(cd), fmt, -1, cd)
    kf = expand_kv(fq(k.to(cd), fmt, -1, cd), hq)
    vf = expand_kv(fq(v.to(cd), fmt, -2, cd), hq)
    out = torch.empty(B, hq, nq, D, dtype=cd, device=q.device)
    lse = torch.empty(B, hq, nq, dtype=cd, device=q.device)
    for r0, r1 in row_chunks(B, hq, nq, nk):
        rows_blk = torch.arange(r0, r1, device=q.device) // block_size
        sel_el = sel[:, :, rows_blk].repeat_interleave(block_size, dim=-1)[..., :nk]
        s16 = scale * (qx[:, :, r0:r1] @ kx.transpose(-1, -2))
        s4 = scale * (qf[:, :, r0:r1] @ kf.transpose(-1, -2))
        s = torch.where(sel_el, s16, s4)
        keep = window_keep(r0, r1, nq, nk, causal, window, q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        p, m, l = softmax_numerator(s, None if sinks is None else sinks.to(cd).view(1, hq, 1, 1))
        zero = torch.zeros_like(p)
        o16 = torch.where(sel_el, p, zero) @ vx
        o4 = quantize_p(torch.where(sel_el, zero, p), fmt, True) @ vf
        out[:, :, r0:r1] = normalize(o16 + o4, l)
        lse[:, :, r0:r1] = lse_of(m, l)
    return (out, lse) if return_lse else out
