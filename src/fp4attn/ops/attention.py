"""Public inference attention op ``attention`` (recipes nvfp4 / mxfp4 / sage3 / bf16).

Validation here. CUDA tensors (Triton available, ``FP4ATTN_FORCE_REFERENCE`` unset) run the FP4
kernels of :mod:`fp4attn.kernels.attention` for nvfp4 / mxfp4 / sage3 and any override flags
(fp16/fp8 tensor cores on Hopper, ``tl.dot_scaled`` on Blackwell); ``bf16`` runs PyTorch SDPA where
it has the same semantics (no LSE requested, causal only with Nq == Nk) and the reference otherwise.
Everything else (CPU tensors) runs :mod:`fp4attn.reference` (same semantics, SPEC §3).

Under tracing the FP4 kernels run as the ``torch.library`` custom op ``fp4attn::attention_fp4`` (with a
fake implementation), so ``torch.compile(fullgraph=True)`` traces a model calling ``attention`` without
graph breaks, also with CUDA graphs (``mode="reduce-overhead"``); eager calls skip the op's dispatch
(``_dispatch.call_op``)."""

from __future__ import annotations

import torch

from .. import reference
from ._dispatch import call_op, kernels_for, on_device, window_args, window_from_args
from ._validate import (
    check_attention_args,
    check_bool,
    check_choice,
    check_sinks,
    check_window,
    fake_outputs,
    from_bhsd,
    warn_no_autograd,
)


def finish(out, lse, q_dtype, layout, return_lse):
    out = from_bhsd(out.to(q_dtype), layout)
    if return_lse:
        return out, lse.float().contiguous()
    return out


def attention(q, k, v, *, causal=False, scale=None, recipe="nvfp4", layout="bhsd", return_lse=False,
              smooth_q=None, smooth_k=None, two_level_p=None, window_size=None, sinks=None):
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
        window_size: ``(left, right)`` sliding window, as FlashAttention's: query i (at position
            p = i + Nk − Nq) sees keys p − left ... p + right; -1 or None leaves a side unbounded;
            with ``causal=True`` right must be 0 or -1. transformers' ``sliding_window=w`` (Mistral,
            Gemma) is ``causal=True, window_size=(w - 1, 0)``. Key tiles outside the window are skipped
            (the work is O(N·window)); quantization blocks are those of the whole sequence.
        sinks: (Hq,) attention sinks (gpt-oss's ``sinks`` / ``s_aux``): one logit per query head, in score units
            (scale·q·k), that joins every row's softmax without a value, so that O = Σ P̃ⱼ V̂ⱼ / (Σ P̃ⱼ + e^(sink − m))
            with m = max(row max, sink) (P̃ quantized against that m); the LSE includes it. A row with no
            visible key gives 0 (LSE = sink).

    Returns:
        out in q's layout and dtype (and lse). No autograd (use :func:`fp4attn.attn_qat` to train).
    """
    q, k, v, scale = check_attention_args(q, k, v, layout=layout, scale=scale, causal=causal)
    window = check_window(window_size, causal)
    sinks = check_sinks(sinks, q.shape[1], q.device)
    check_choice("recipe", recipe, tuple(reference.RECIPES))
    check_bool("return_lse", return_lse)
    for name, val in (("smooth_q", smooth_q), ("smooth_k", smooth_k), ("two_level_p", two_level_p)):
        check_bool(name, val, allow_none=True)
    warn_no_autograd("attention", q, k, v, sinks)
    if kernels_for(q, k, v) and q.dtype != torch.float64:  # (float64: the reference, as the other ops)
        fmt, quantized, sq, sk, tlp = reference.recipe_flags(recipe, smooth_q, smooth_k, two_level_p)
        if quantized:
            out, lse = call_op(torch.ops.fp4attn.attention_fp4, _attention_fp4_impl, q, k, v, causal, scale, fmt,
                               sq, sk, tlp, layout, return_lse, *window_args(window), sinks)
            return (out, lse) if return_lse else out
        if window is None and sinks is None:  # (SDPA has neither sliding windows nor sinks: the reference)
            res = _attention_bf16_sdpa(q, k, v, causal=causal, scale=scale, layout=layout, return_lse=return_lse)
            if res is not None:
                return res
    with torch.no_grad():
        out, lse = reference.attention(q, k, v, causal=causal, scale=scale, recipe=recipe,
                                       smooth_q=smooth_q, smooth_k=smooth_k, two_level_p=two_level_p,
                                       return_lse=True, window_size=window, sinks=sinks)
    return finish(out, lse, q.dtype, layout, return_lse)


def op_outputs(out, lse, q_dtype, layout, return_lse):
    """(out, lse) as the FP4 custom ops return them: lse contiguous float32, or an empty tensor when the
    caller did not ask for it (``lse`` may then be None; no copy of the padded LSE: one launch less per call)."""
    if return_lse:
        return finish(out, lse, q_dtype, layout, True)
    return finish(out, None, q_dtype, layout, False), out.new_empty(0, dtype=torch.float32)


def _empty_out(q: torch.Tensor, layout: str) -> torch.Tensor:
    """Output buffer contiguous in the caller's layout, returned as its bhsd view (no copy later)."""
    B, H, N, D = q.shape
    if layout == "bshd":
        return torch.empty((B, N, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty((B, H, N, D), dtype=q.dtype, device=q.device)


def _sdpa_aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself if its data pointer and strides are 16-byte aligned (last dim contiguous), else a
    contiguous copy. torch 2.11's SDPA does not check the pointer: on a view 8 bytes off (a slice of a
    padded or packed projection) its flash / efficient / cuDNN kernels fault with "misaligned address",
    a sticky CUDA error, and the default dispatch returned NaN (H200, benchmarks/fuzz-s14)."""
    el = t.element_size()
    ok = (t.stride(-1) == 1 and t.data_ptr() % 16 == 0
          and all((s * el) % 16 == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1))
    return t if ok else t.contiguous()


def _attention_bf16_sdpa(q, k, v, *, causal, scale, layout, return_lse):
    """The ``bf16`` recipe on CUDA through SDPA; None where the reference must run instead (cases SDPA
    lacks: LSE requested, causal with Nq != Nk)."""
    nq, nk = q.shape[2], k.shape[2]
    if return_lse or (causal and nq != nk):
        return None
    if not torch.compiler.is_compiling():  # data_ptr() is not traceable; compiled graphs get no check
        q, k, v = (_sdpa_aligned(t) for t in (q, k, v))
    with torch.no_grad():
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return finish(out, None, q.dtype, layout, False)


def _attention_fp4_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, fmt: str,
                        smooth_q: bool, smooth_k: bool, two_level_p: bool, layout: str, return_lse: bool,
                        window_left: int = -1, window_right: int = -1, sinks: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP4 kernels on bhsd views q, k, v (any strides, validated by ``attention``): returns (out in
    the caller's ``layout`` and q's dtype, contiguous; lse (B, Hq, Nq) float32, or an empty tensor
    without ``return_lse``: no copy of the padded LSE then). ``window_left/right``: the normalized
    window (-1, -1: none); ``sinks``: (Hq,) or None."""
    from ..kernels.attention import attention_fwd

    with torch.no_grad(), on_device(q):
        out = _empty_out(q, layout)
        out, lse = attention_fwd(q, k, v, causal=causal, scale=scale, fmt=fmt, smooth_q=smooth_q,
                                 smooth_k=smooth_k, two_level_p=two_level_p, out=out,
                                 window=window_from_args(window_left, window_right),
                                 sinks=sinks, want_lse=return_lse)
        return op_outputs(out, lse, q.dtype, layout, return_lse)


# what tracing sees (``call_op``): the same implementation as one opaque op with a fake (meta) version
_attention_fp4 = torch.library.custom_op("fp4attn::attention_fp4", _attention_fp4_impl, mutates_args=(),
                                         device_types="cuda")


@_attention_fp4.register_fake
def _(q, k, v, causal, scale, fmt, smooth_q, smooth_k, two_level_p, layout, return_lse, window_left=-1,
      window_right=-1, sinks=None):
    return fake_outputs(q, layout, return_lse)
