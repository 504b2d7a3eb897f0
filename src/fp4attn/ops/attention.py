"""Public inference attention ops: ``attention`` (recipes nvfp4 / mxfp4 / sage3 / bf16) and
``thrift_attention``. Validation here; CUDA tensors go to Triton kernels where a kernel exists
for the recipe, everything else to :mod:`fp4attn.reference` (same semantics, SPEC §3)."""

from __future__ import annotations

import math
import numbers

import torch

from .. import reference
from ._validate import check_attention_args, check_bool, check_choice, check_fmt, from_bhsd


def _finish(out, lse, q_dtype, layout, return_lse):
    out = from_bhsd(out.to(q_dtype), layout)
    if return_lse:
        return out, lse.float().contiguous()
    return out


def attention(q, k, v, *, causal=False, scale=None, recipe="nvfp4", layout="bhsd", return_lse=False,
              smooth_q=None, smooth_k=None, two_level_p=None):
    """FP4 inference attention (SPEC §3).

    Args:
        q: (B, Hq, Nq, D) for ``layout="bhsd"`` (as SDPA) or (B, Nq, Hq, D) for ``"bshd"``.
        k, v: (B, Hkv, Nk, D) / (B, Nk, Hkv, D); ``Hq % Hkv == 0`` (GQA/MQA).
        causal: bottom-right aligned causal mask (query i sees keys j <= i + Nk - Nq).
        scale: softmax scale, default 1/sqrt(D).
        recipe: "nvfp4" (Attn-QAT Algorithm 1), "mxfp4", "sage3" (SageAttention3), "bf16" (no
            quantization).
        smooth_q, smooth_k, two_level_p: override the recipe's defaults (ablations).
        return_lse: also return the log-sum-exp (B, Hq, Nq) float32.

    Returns:
        out in q's layout and dtype (and lse). No autograd (use :func:`fp4attn.attn_qat` to train).
    """
    q, k, v, scale = check_attention_args(q, k, v, layout=layout, scale=scale, causal=causal)
    check_choice("recipe", recipe, tuple(reference.RECIPES))
    check_bool("return_lse", return_lse)
    for name, val in (("smooth_q", smooth_q), ("smooth_k", smooth_k), ("two_level_p", two_level_p)):
        check_bool(name, val, allow_none=True)
    with torch.no_grad():
        out, lse = reference.attention(q, k, v, causal=causal, scale=scale, recipe=recipe,
                                       smooth_q=smooth_q, smooth_k=smooth_k, two_level_p=two_level_p,
                                       return_lse=True)
    return _finish(out, lse, q.dtype, layout, return_lse)


def _check_budget(budget) -> float:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a float in (0, 1], got {budget!r}")
    budget = float(budget)
    if not math.isfinite(budget) or not 0.0 < budget <= 1.0:
        raise ValueError(f"budget must be in (0, 1], got {budget}")
    return budget


def thrift_attention(q, k, v, *, causal=False, scale=None, budget=0.05, block_size=64, fmt="nvfp4",
                     layout="bhsd", return_lse=False):
    """ThriftAttention (SPEC §3): the top-k key blocks of each query block (by block-mean scores)
    in 16 bits, all other blocks in FP4 with two-level P, merged in one softmax.

    ``budget`` is the fraction f in (0, 1] of key blocks computed in 16 bits (see
    :func:`fp4attn.reference.budget_to_k` for the causal rule); ``block_size`` tokens per block.
    """
    q, k, v, scale = check_attention_args(q, k, v, layout=layout, scale=scale, causal=causal)
    budget = _check_budget(budget)
    check_fmt(fmt)
    check_bool("return_lse", return_lse)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 16 \
            or block_size % 16:
        raise ValueError(f"block_size must be a positive multiple of 16, got {block_size!r}")
    with torch.no_grad():
        out, lse = reference.thrift_attention(q, k, v, causal=causal, scale=scale, budget=budget,
                                              block_size=block_size, fmt=fmt, return_lse=True)
    return _finish(out, lse, q.dtype, layout, return_lse)
