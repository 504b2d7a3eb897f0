"""Public inference attention op ``attention`` (recipes nvfp4 / mxfp4 / sage3 / bf16).

Validation here; CUDA tensors go to Triton kernels where a kernel exists for the recipe, everything
else to :mod:`fp4attn.reference` (same semantics, SPEC §3)."""

from __future__ import annotations

import torch

from .. import reference
from ._validate import check_attention_args, check_bool, check_choice, from_bhsd


def finish(out, lse, q_dtype, layout, return_lse):
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
    return finish(out, lse, q.dtype, layout, return_lse)
