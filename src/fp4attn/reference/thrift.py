"""Reference ThriftAttention (SPEC §3, ``fp4attn.thrift_attention``): plain PyTorch, row-chunked.

1. Block means Q̄ᵢ, K̄ⱼ over ``block_size`` tokens (FP32; a tail block averages its valid tokens).
2. Ŝ = Q̄ K̄ᵀ; for each query block the top-k causally visible key blocks (ties to the lower index)
   are *selected*; k comes from the budget (:func:`budget_to_k`).
3. Selected blocks run in 16 bits: S from the input-dtype q, k (FP32 accumulation), unquantized P̃
   and V. All other blocks run FP4 (Q, K along D, V along tokens) with two-level P.
4. One softmax over the merged scores (one-shot P̃ in the reference).
"""

from __future__ import annotations

import torch

from .common import (
    causal_keep,
    compute_dtype,
    default_scale,
    expand_kv,
    fq,
    lse_of,
    normalize,
    quantize_p,
    row_chunks,
    softmax_numerator,
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


def visible_blocks(nq: int, nk: int, bs: int, causal: bool, device) -> torch.Tensor:
    """(nqb, nkb) bool: key block j has at least one key visible to query block i."""
    nqb, nkb = -(-nq // bs), -(-nk // bs)
    if not causal:
        return torch.ones(nqb, nkb, dtype=torch.bool, device=device)
    last_q = torch.clamp(torch.arange(nqb, device=device) * bs + bs, max=nq) - 1
    first_k = torch.arange(nkb, device=device) * bs
    return first_k.unsqueeze(0) <= (last_q + nk - nq).unsqueeze(1)


def select_blocks(q, k, *, causal, budget, block_size):
    """(B, Hq, nqb, nkb) bool selection of the top-k visible key blocks per query block."""
    hq = q.shape[1]
    nq, nk = q.shape[2], k.shape[2]
    qm = block_means(q, block_size)
    km = expand_kv(block_means(k, block_size), hq)
    s_hat = qm @ km.transpose(-1, -2)
    vis = visible_blocks(nq, nk, block_size, causal, q.device)
    s_hat = s_hat.masked_fill(~vis, float("-inf"))
    kk = budget_to_k(budget, km.shape[2], causal)
    order = torch.sort(s_hat, dim=-1, descending=True, stable=True).indices[..., :kk]
    sel = torch.zeros_like(s_hat, dtype=torch.bool).scatter_(-1, order, True)
    return sel & vis


def thrift_attention(q, k, v, *, causal=False, scale=None, budget=0.05, block_size=64, fmt="nvfp4",
                     return_lse=False, selection=None):
    """Reference ThriftAttention on bhsd tensors; returns float32 (float64 for float64 inputs).

    ``selection`` (optional, (B, Hq, nqb, nkb) bool) overrides the top-k selection (for tests).
    """
    cd = compute_dtype(q, k, v)
    B, hq, nq, D = q.shape
    nk = k.shape[2]
    scale = default_scale(D, scale)
    sel = select_blocks(q, k, causal=causal, budget=budget, block_size=block_size) \
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
        if causal:
            s = s.masked_fill(~causal_keep(r0, r1, nq, nk, q.device), float("-inf"))
        p, m, l = softmax_numerator(s)
        zero = torch.zeros_like(p)
        o16 = torch.where(sel_el, p, zero) @ vx
        o4 = quantize_p(torch.where(sel_el, zero, p), fmt, True) @ vf
        out[:, :, r0:r1] = normalize(o16 + o4, l)
        lse[:, :, r0:r1] = lse_of(m, l)
    return (out, lse) if return_lse else out
