"""Public ``fp4attn.attn_qat``: the Attn-QAT training op (SPEC §3).

CUDA tensors run the fused Triton kernels of :mod:`fp4attn.kernels.attn_qat` through two
``torch.library`` custom ops (``fp4attn::attn_qat_fwd`` / ``fp4attn::attn_qat_bwd``, the forward
with ``register_autograd``), so ``torch.compile(fullgraph=True)`` traces it without graph breaks.
Other devices run the PyTorch reference (:func:`fp4attn.reference.attn_qat.attn_qat_reference`).

What the backward keeps (O(N) memory): the quantized Qᶠ, Kᶠ, Vᶠ buffers, O' (or O) and the LSE for
``backward="qat"``; the original q, k, v, O and LSE for ``backward="naive"``.
"""

from __future__ import annotations

import torch

from ._dispatch import kernels_for, on_device, window_args, window_from_args
from ._validate import (
    check_attention_args,
    check_bool,
    check_choice,
    check_fmt,
    check_sinks,
    check_window,
    from_bhsd,
)

BACKWARDS = ("qat", "naive")


def _bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.transpose(1, 2) if layout == "bshd" else x


def _empty_like_layout(shape_bhsd, layout, dtype, device):
    """A contiguous tensor in ``layout``, returned as its bhsd view."""
    B, H, N, D = shape_bhsd
    if layout == "bshd":
        return torch.empty((B, N, H, D), dtype=dtype, device=device).transpose(1, 2)
    return torch.empty((B, H, N, D), dtype=dtype, device=device)


def _padded_shapes(q, k):
    from ..kernels.attn_qat import head_dim_padded, pad_tokens
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    return B, Hq, Hkv, pad_tokens(Nq), pad_tokens(Nk), head_dim_padded(D)


def _buffer_dtype(dtype):
    from ..kernels.attn_qat import dot_dtype_for
    return dot_dtype_for(dtype)


# -------------------------------------------------------------------------------------------------
# custom ops (inputs in the caller's layout; layout is an argument)
# -------------------------------------------------------------------------------------------------
@torch.library.custom_op("fp4attn::attn_qat_fwd", mutates_args=(), device_types="cuda")
def _attn_qat_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                  fmt: str, layout: str, high_precision_o: bool, quantize_p_in_backward: bool, naive: bool,
                  window_left: int = -1, window_right: int = -1, sinks: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                             torch.Tensor]:
    """Returns (o in the caller's layout, lse_padded, o_prime_padded, qf, kf, vf).

    O' is computed only when the backward will use it (``high_precision_o`` and not ``naive``);
    otherwise ``o_prime_padded`` is an empty tensor. ``quantize_p_in_backward`` only travels to the
    autograd context. ``window_left/right``: the normalized sliding window (-1, -1: none); ``sinks``: (Hq,)
    attention sinks or None.
    """
    from ..kernels.attn_qat import attn_qat_fwd_bhsd
    qb, kb, vb = _bhsd(q, layout), _bhsd(k, layout), _bhsd(v, layout)
    o = _empty_like_layout(qb.shape, layout, q.dtype, q.device)
    with on_device(q):
        qf, kf, vf, op, lse = attn_qat_fwd_bhsd(qb, kb, vb, o, causal=causal, scale=scale, fmt=fmt,
                                                hp_o=high_precision_o and not naive,
                                                window=window_from_args(window_left, window_right), sinks=sinks)
    return _bhsd(o, layout), lse, op, qf, kf, vf


@_attn_qat_fwd.register_fake
def _(q, k, v, causal, scale, fmt, layout, high_precision_o, quantize_p_in_backward, naive, window_left=-1,
      window_right=-1, sinks=None):
    qb, kb = _bhsd(q, layout), _bhsd(k, layout)
    B, Hq, Hkv, NQP, NKP, DP = _padded_shapes(qb, kb)
    dt = _buffer_dtype(q.dtype)
    o = _bhsd(_empty_like_layout(qb.shape, layout, q.dtype, q.device), layout)
    lse = q.new_empty((B, Hq, NQP), dtype=torch.float32)
    op = q.new_empty((B, Hq, NQP, DP) if (high_precision_o and not naive) else (0,), dtype=dt)
    return (o, lse, op, q.new_empty((B, Hq, NQP, DP), dtype=dt), q.new_empty((B, Hkv, NKP, DP), dtype=dt),
            q.new_empty((B, Hkv, NKP, DP), dtype=dt))


@torch.library.custom_op("fp4attn::attn_qat_bwd", mutates_args=(), device_types="cuda")
def _attn_qat_bwd(do: torch.Tensor, o_for_delta: torch.Tensor, qb: torch.Tensor, kb: torch.Tensor,
                  vb: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                  shape_q: list[int], shape_k: list[int], dtype: torch.dtype,
                  causal: bool, scale: float, fmt: str, layout: str, quant_p: bool, raw_inputs: bool,
                  o_padded: bool, window_left: int = -1, window_right: int = -1
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (dtype ``dtype``) in the caller's layout.

    ``raw_inputs``: qb/kb/vb are the unquantized q, k, v in the caller's layout (naive backward) and
    still need the padding pre-pass; otherwise they are the forward's padded Qᶠ, Kᶠ, Vᶠ buffers.
    ``o_padded``: ``o_for_delta`` is the padded O' buffer; otherwise O in the caller's layout.
    ``window_left/right``: the forward's sliding window (-1, -1: none).
    """
    from ..kernels import attn_qat as K
    B, Hq, Nq, D = shape_q
    Hkv, Nk = shape_k[1], shape_k[2]
    dev = do.device
    with on_device(do):
        if raw_inputs:
            dt = K.dot_dtype_for(dtype)
            qb = K.prep(_bhsd(qb, layout), 0, fmt, dt)
            kb = K.prep(_bhsd(kb, layout), 0, fmt, dt)
            vb = K.prep(_bhsd(vb, layout), 0, fmt, dt)
        ob = o_for_delta if o_padded else _bhsd(o_for_delta, layout)
        dq = _empty_like_layout((B, Hq, Nq, D), layout, dtype, dev)
        dk = _empty_like_layout((B, Hkv, Nk, D), layout, dtype, dev)
        dv = _empty_like_layout((B, Hkv, Nk, D), layout, dtype, dev)
        K.backward(_bhsd(do, layout), ob, qb, kb, vb, lse, dq, dk, dv, nq=Nq, nk=Nk, d=D, causal=causal,
                   scale=scale, fmt=fmt, quant_p=quant_p, dlse=dlse, window=window_from_args(window_left, window_right))
    return _bhsd(dq, layout), _bhsd(dk, layout), _bhsd(dv, layout)


@_attn_qat_bwd.register_fake
def _(do, o_for_delta, qb, kb, vb, lse, dlse, shape_q, shape_k, dtype, causal, scale, fmt, layout,
      quant_p, raw_inputs, o_padded, window_left=-1, window_right=-1):
    B, Hq, Nq, D = shape_q
    Hkv, Nk = shape_k[1], shape_k[2]
    mk = lambda shp: _bhsd(_empty_like_layout(shp, layout, dtype, do.device), layout)
    return mk((B, Hq, Nq, D)), mk((B, Hkv, Nk, D)), mk((B, Hkv, Nk, D))


# -------------------------------------------------------------------------------------------------
# autograd: the forward op's backward calls the backward op
# -------------------------------------------------------------------------------------------------
def _setup_context(ctx, inputs, output):
    (q, k, v, causal, scale, fmt, layout, high_precision_o, quantize_p_in_backward, naive, window_left,
     window_right, sinks) = inputs
    o, lse, op, qf, kf, vf = output
    ctx.set_materialize_grads(False)  # no zero gradients for the internal buffers
    ctx.cfg = dict(causal=causal, scale=scale, fmt=fmt, layout=layout, window_left=window_left,
                   window_right=window_right)
    ctx.naive = naive
    ctx.quant_p = quantize_p_in_backward and not naive
    ctx.hp_o = high_precision_o and not naive
    qb, kb = _bhsd(q, layout), _bhsd(k, layout)
    ctx.shape_q, ctx.shape_k, ctx.dtype = list(qb.shape), list(kb.shape), q.dtype
    ctx.out_shape = tuple(o.shape)
    if naive:
        ctx.save_for_backward(q, k, v, o, lse, sinks)
    else:
        ctx.save_for_backward(qf, kf, vf, op if ctx.hp_o else o, lse, sinks)


def _sink_grad(ctx, do, dlse, o_for_delta, lse, sinks):
    """d sinks (Hq,) = −Σ_(b, rows) exp(sink − LSE)·D with D = rowsum(dO∘O') − dlse (O for the naive backward or
    without high_precision_o), the backward kernels' D, in FP32 from the saved buffers."""
    B, Hq, Nq, D = ctx.shape_q
    ob = o_for_delta[:, :, :Nq, :D] if ctx.hp_o else _bhsd(o_for_delta, ctx.cfg["layout"])
    d = (_bhsd(do, ctx.cfg["layout"]).float() * ob.float()).sum(-1)
    if dlse is not None:
        d = d - dlse.float()
    lse = lse[:, :, :Nq]  # -inf: a row with no key and a -inf sink (P of the sink 0, not NaN)
    p_sink = torch.where(torch.isfinite(lse), torch.exp(sinks.float().view(1, Hq, 1) - lse), 0.0)
    return -(p_sink * d).sum(dim=(0, 2)).to(sinks.dtype)


def _backward(ctx, do, dlse, d_op, d_qf, d_kf, d_vf):
    qb, kb, vb, o_for_delta, lse, sinks = ctx.saved_tensors
    if do is None:  # only lse was used
        do = torch.zeros(ctx.out_shape, dtype=ctx.dtype, device=lse.device)
    if dlse is not None:
        # the public lse is lse_padded[..., :Nq]; only that part can carry a gradient
        dlse = dlse[:, :, : ctx.shape_q[2]]
    dq, dk, dv = torch.ops.fp4attn.attn_qat_bwd(
        do, o_for_delta, qb, kb, vb, lse, dlse, ctx.shape_q, ctx.shape_k, ctx.dtype,
        quant_p=ctx.quant_p, raw_inputs=ctx.naive, o_padded=ctx.hp_o, **ctx.cfg)
    dsink = _sink_grad(ctx, do, dlse, o_for_delta, lse, sinks) if sinks is not None and ctx.needs_input_grad[12] \
        else None
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, dsink


_attn_qat_fwd.register_autograd(_backward, setup_context=_setup_context)


# -------------------------------------------------------------------------------------------------
# public op
# -------------------------------------------------------------------------------------------------
def attn_qat(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale=None,
             fmt: str = "nvfp4", layout: str = "bhsd", high_precision_o: bool = True,
             quantize_p_in_backward: bool = True, backward: str = "qat", return_lse: bool = False,
             window_size=None, sinks=None):
    """Attn-QAT attention for training (SPEC §3): FP4 fake-quantized forward, Algorithm-3 backward.

    Args:
        q: (B, Hq, Nq, D) for ``layout="bhsd"`` ((B, Nq, Hq, D) for ``"bshd"``); k, v: (B, Hkv, Nk, D).
        causal: bottom-right aligned causal mask (query i sees keys j <= i + Nk - Nq).
        scale: softmax scale (default 1/sqrt(D)).
        fmt: ``"nvfp4"`` (blocks of 16, E4M3 scales) or ``"mxfp4"`` (blocks of 32, E8M0 scales).
        high_precision_o: D = rowsum(dO ∘ O') with the unquantized-P output O' (else ∘ O).
        quantize_p_in_backward: dV = ϕ(P)ᵀ dO (else Pᵀ dO).
        backward: ``"qat"`` (Algorithm 3) or ``"naive"`` (FP4 forward + ordinary FlashAttention
            backward on the unquantized q, k, v: the unstable drop-in baseline).
        return_lse: also return the float32 log-sum-exp (B, Hq, Nq) (-inf for rows that see no key).
        window_size: ``(left, right)`` sliding window, as :func:`fp4attn.attention`'s (FlashAttention's
            convention): query i (at position p = i + Nk − Nq) sees keys p − left ... p + right; -1 or None
            leaves a side unbounded; with ``causal=True`` right must be 0 or -1 (transformers'
            ``sliding_window=w`` is ``causal=True, window_size=(w - 1, 0)``). Key tiles outside the window
            are skipped in the forward and both backward kernels; quantization blocks are those of the whole
            sequence. ``backward="naive"`` honours it too.
        sinks: (Hq,) attention sinks, as :func:`fp4attn.attention`'s (gpt-oss), trainable: their gradient is
            −Σ_rows exp(sink − LSE)·D with Attn-QAT's D = rowsum(dO∘O') − dlse.

    Returns ``out`` (q's dtype and layout), or ``(out, lse)``. Gradients flow to q, k, v (and through
    ``lse`` as d lse / dS = P).
    """
    check_fmt(fmt)
    check_choice("backward", backward, BACKWARDS)
    check_bool("high_precision_o", high_precision_o)
    check_bool("quantize_p_in_backward", quantize_p_in_backward)
    check_bool("return_lse", return_lse)
    qb, kb, vb, scale = check_attention_args(q, k, v, layout=layout, scale=scale, causal=causal)
    window = check_window(window_size, causal)
    sinks = check_sinks(sinks, qb.shape[1], q.device)
    on_gpu = kernels_for(q, k, v)
    if on_gpu and q.dtype != torch.float64:
        o, lse, *_ = torch.ops.fp4attn.attn_qat_fwd(q, k, v, causal, scale, fmt, layout, high_precision_o,
                                                    quantize_p_in_backward, backward == "naive", *window_args(window),
                                                    sinks)
        if return_lse:
            return o, lse[:, :, : qb.shape[2]].contiguous()
        return o
    from ..reference.attn_qat import attn_qat_reference
    out, lse = attn_qat_reference(qb, kb, vb, causal=causal, scale=scale, fmt=fmt,
                                  high_precision_o=high_precision_o,
                                  quantize_p_in_backward=quantize_p_in_backward, backward=backward,
                                  window_size=window, sinks=sinks)
    out = from_bhsd(out, layout)
    return (out, lse) if return_lse else out
