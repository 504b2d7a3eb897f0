"""Public ``thrift_attention`` (ThriftAttention, SPEC §3): validation, then kernel or reference.

CUDA tensors with ``fmt="nvfp4"``, ``block_size=64`` and D <= 256 run the Triton selection kernel and the
fused mixed-precision kernel (:mod:`fp4attn.kernels.thrift`), under tracing as the ``torch.library`` custom
op ``fp4attn::thrift_attention_fp4`` (``torch.compile(fullgraph=True)`` traces it; see ``ops/attention.py``);
everything else runs the reference."""

from __future__ import annotations

import math
import numbers

import torch

from .. import reference
from ._dispatch import call_op, kernels_for, on_device, window_args, window_from_args
from ._validate import (
    check_attention_args,
    check_bool,
    check_fmt,
    check_sinks,
    check_window,
    fake_outputs,
    warn_no_autograd,
)
from .attention import finish, op_outputs


def _check_budget(budget) -> float:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a float in (0, 1], got {budget!r}")
    budget = float(budget)
    if not math.isfinite(budget) or not 0.0 < budget <= 1.0:
        raise ValueError(f"budget must be in (0, 1], got {budget}")
    return budget


def thrift_attention(q, k, v, *, causal=False, scale=None, budget=0.05, block_size=64, fmt="nvfp4",
                     layout="bhsd", return_lse=False, window_size=None, sinks=None):
    """ThriftAttention (SPEC §3): the top-k key blocks of each query block (by block-mean scores)
    in 16 bits, all other blocks in FP4 with two-level P, merged in one softmax.

    ``budget`` is the fraction f in (0, 1] of key blocks computed in 16 bits (see
    :func:`fp4attn.reference.budget_to_k` for the causal rule); ``block_size`` tokens per block.

    The 16-bit blocks use the input dtype's operands for float16 / bfloat16 inputs; float32 inputs run
    them in bfloat16 on CUDA (the CPU reference keeps float32), about 2^-9 relative rounding of q, k, v:
    e.g. 0.3% rel. L2 at budget 1 on N(0,1) inputs, 1.6% with |q|, |k| ~ 8 (peaked softmax).

    ``window_size=(left, right)``: a sliding window, as :func:`fp4attn.attention`'s (transformers'
    ``sliding_window=w`` is ``causal=True, window_size=(w - 1, 0)``). Only the window's key blocks are
    candidates, and the budget counts the blocks of the window's band: k = clamp(round(f·n), 1, n) with n
    the most key blocks one query block sees (:func:`fp4attn.reference.thrift.selected_per_block`); a
    window that cuts no key is no window. Key tiles outside the window are skipped.
    ``sinks``: (Hq,) attention sinks (gpt-oss), as :func:`fp4attn.attention`'s: one logit per query head
    that joins every row's softmax without a value; the selection does not see them.
    """
    q, k, v, scale = check_attention_args(q, k, v, layout=layout, scale=scale, causal=causal)
    window = check_window(window_size, causal)
    sinks = check_sinks(sinks, q.shape[1], q.device)
    budget = _check_budget(budget)
    check_fmt(fmt)
    check_bool("return_lse", return_lse)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise TypeError(f"block_size must be an int (a positive multiple of 16), got {block_size!r}")
    if block_size < 16 or block_size % 16:
        raise ValueError(f"block_size must be a positive multiple of 16, got {block_size!r}")
    warn_no_autograd("thrift_attention", q, k, v, sinks)
    if kernels_for(q, k, v) and fmt == "nvfp4" and block_size == 64 and q.dtype != torch.float64:
        out, lse = call_op(torch.ops.fp4attn.thrift_attention_fp4, _thrift_fp4_impl, q, k, v, causal, scale, budget,
                           layout, return_lse, *window_args(window), sinks)
        return (out, lse) if return_lse else out
    with torch.no_grad():
        out, lse = reference.thrift_attention(q, k, v, causal=causal, scale=scale, budget=budget,
                                              block_size=block_size, fmt=fmt, return_lse=True, window_size=window,
                                              sinks=sinks)
    return finish(out, lse, q.dtype, layout, return_lse)


def _thrift_fp4_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                     budget: float, layout: str, return_lse: bool, window_left: int = -1, window_right: int = -1,
                     sinks: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Thrift kernels on bhsd views q, k, v (validated by ``thrift_attention``): (out in the caller's
    ``layout`` and q's dtype, contiguous; lse (B, Hq, Nq) float32 or, without ``return_lse``, empty).
    ``window_left/right``: the normalized window (-1, -1: none); ``sinks``: (Hq,) or None."""
    from ..kernels.thrift import thrift_fwd

    with torch.no_grad(), on_device(q):
        out, lse = thrift_fwd(q, k, v, causal=causal, scale=scale, budget=budget,
                              window=window_from_args(window_left, window_right), sinks=sinks)
        return op_outputs(out, lse, q.dtype, layout, return_lse)


_thrift_attention_fp4 = torch.library.custom_op("fp4attn::thrift_attention_fp4", _thrift_fp4_impl, mutates_args=(),
                                                device_types="cuda")


@_thrift_attention_fp4.register_fake
def _(q, k, v, causal, scale, budget, layout, return_lse, window_left=-1, window_right=-1, sinks=None):
    return fake_outputs(q, layout, return_lse)
