"""Reference FP4 inference attention (SPEC §3, ``fp4attn.attention``): plain PyTorch, row-chunked.

Recipes:
* ``nvfp4`` — Attn-QAT Algorithm 1: NVFP4 Q, K (along D), V (along tokens) and P̃ (along keys).
* ``mxfp4`` — the same in MXFP4 (blocks of 32, E8M0 scales).
* ``sage3`` — SageAttention3: NVFP4 with K smoothing (K − mean over tokens), Q smoothing (Q minus
  its per-128-query-block mean q̄ᵢ, with q̄ᵢ·γ(K)ᵀ added back in FP32) and two-level P.
* ``bf16`` — no quantization (exact attention in the compute dtype) through the same code.
"""

from __future__ import annotations

import torch

from .common import (
    compute_dtype,
    default_scale,
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

RECIPES = {
    #          fmt,     quantized, smooth_q, smooth_k, two_level_p
    "nvfp4": ("nvfp4", True, False, False, False),
    "mxfp4": ("mxfp4", True, False, False, False),
    "sage3": ("nvfp4", True, True, True, True),
    "bf16": (None, False, False, False, False),
}
SMOOTH_Q_BLOCK = 128


def recipe_flags(recipe: str, smooth_q=None, smooth_k=None, two_level_p=None):
    """(fmt, quantized, smooth_q, smooth_k, two_level_p) after applying the override flags."""
    fmt, quantized, sq, sk, tl = RECIPES[recipe]
    return (fmt, quantized,
            sq if smooth_q is None else bool(smooth_q),
            sk if smooth_k is None else bool(smooth_k),
            tl if two_level_p is None else bool(two_level_p))


def attention(q, k, v, *, causal=False, scale=None, recipe="nvfp4", smooth_q=None, smooth_k=None,
              two_level_p=None, return_lse=False, window_size=None, sinks=None):
    """Reference attention on bhsd tensors (GQA allowed); returns float32 (float64 for float64 in).
    ``window_size=(left, right)``: a sliding window (:func:`.common.normalize_window`); masked scores are
    −inf exactly as causal's, and nothing else changes (quantization blocks stay those of the whole
    sequence: V and P̃ along all Nk keys, the masked P̃ entries 0).
    ``sinks`` (Hq,): attention sinks (gpt-oss), one logit per query head in score units that joins every
    row's softmax without a value (:func:`.common.softmax_numerator`); the one-shot max that P̃ is quantized
    against includes it, and so do l and the LSE. With K smoothing the scores are shifted by scale·q·k̄ per
    row, so the sink is too (the softmax is invariant to the common shift only when the sink moves with it)."""
    fmt, quantized, sq, sk, two_level = recipe_flags(recipe, smooth_q, smooth_k, two_level_p)
    cd = compute_dtype(q, k, v)
    B, hq, nq, D = q.shape
    nk = k.shape[2]
    scale = default_scale(D, scale)
    window = normalize_window(window_size, causal)
    q = q.to(cd)
    k = k.to(cd)
    v = v.to(cd)
    qbar = None
    lse_shift = None
    if sk:
        # subtracting one vector from every key shifts each score row by a constant (softmax-invariant);
        # the LSE is shifted back by scale·q·k̄ so that it refers to the true scores
        kbar = k.mean(dim=2, keepdim=True)
        k = k - kbar
        lse_shift = scale * (q @ expand_kv(kbar, hq).transpose(-1, -2)).squeeze(-1)
    if sq:
        nb = -(-nq // SMOOTH_Q_BLOCK)
        pad = nb * SMOOTH_Q_BLOCK - nq
        qp = torch.nn.functional.pad(q, (0, 0, 0, pad)).view(B, hq, nb, SMOOTH_Q_BLOCK, D)
        counts = torch.full((nb,), SMOOTH_Q_BLOCK, dtype=cd, device=q.device)
        counts[-1] = SMOOTH_Q_BLOCK - pad
        qbar = qp.sum(dim=3) / counts.view(1, 1, nb, 1)  # (B, H, nb, D)
        q = q - qbar.repeat_interleave(SMOOTH_Q_BLOCK, dim=2)[:, :, :nq]
    if quantized:
        qf = fq(q, fmt, -1, cd)
        kf = fq(k, fmt, -1, cd)
        vf = fq(v, fmt, -2, cd)
    else:
        qf, kf, vf = q, k, v
    kf = expand_kv(kf, hq)
    vf = expand_kv(vf, hq)
    kx = expand_kv(k, hq)
    out = torch.empty(B, hq, nq, D, dtype=cd, device=q.device)
    lse = torch.empty(B, hq, nq, dtype=cd, device=q.device)
    for r0, r1 in row_chunks(B, hq, nq, nk):
        s = scale * (qf[:, :, r0:r1] @ kf.transpose(-1, -2))
        if qbar is not None:
            # the GEMV correction q̄ᵢ·γ(K)ᵀ, in full precision with the unquantized smoothed K
            rows_blk = torch.arange(r0, r1, device=q.device) // SMOOTH_Q_BLOCK
            s = s + scale * (qbar[:, :, rows_blk] @ kx.transpose(-1, -2))
        keep = window_keep(r0, r1, nq, nk, causal, window, q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        sink = None
        if sinks is not None:
            sink = sinks.to(cd).view(1, hq, 1, 1).expand(B, hq, r1 - r0, 1)
            if lse_shift is not None:
                sink = sink - lse_shift[:, :, r0:r1, None]
        p, m, l = softmax_numerator(s, sink)
        pq = quantize_p(p, fmt, two_level) if quantized else p
        out[:, :, r0:r1] = normalize(pq @ vf, l)
        lse[:, :, r0:r1] = lse_of(m, l)
    if lse_shift is not None:
        lse = lse + lse_shift
    return (out, lse) if return_lse else out
