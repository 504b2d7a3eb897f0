"""Reference Attn-QAT (SPEC §3, ``fp4attn.attn_qat``): Algorithms 2 and 3 in plain PyTorch.

Forward (Algorithm 2): Qᶠ, Kᶠ fake-quantized along D, Vᶠ along tokens; S = scale·QᶠKᶠᵀ;
one-shot P̃ = exp(S − rowmax S); O = ϕ(P̃)Vᶠ / l; O' = P̃Vᶠ / l; LSE = m + log l.

Backward (Algorithm 3; straight-through for Q, K, V):
P = exp(S − LSE); D = rowsum(dO∘O') (∘O without ``high_precision_o``); dV = ϕ(P)ᵀdO (PᵀdO without
``quantize_p_in_backward``); dP = dO Vᶠᵀ; dS = P∘(dP − D); dQ = scale·dS Kᶠ; dK = scale·dSᵀQᶠ.

``backward="naive"`` is the drop-in baseline: the FP4 forward's O and LSE with an ordinary
FlashAttention backward on the unquantized q, k, v (P recomputed from them), which is inconsistent
with the forward and is expected to be unstable.

``window_size=(left, right)``: a sliding window (:func:`.common.normalize_window`, FlashAttention's
convention, bottom-right aligned like ``causal``): scores outside it are −inf exactly as causal's (P̃ = P = 0
there); quantization blocks stay those of the whole sequence (Vᶠ and ϕ(P̃) along all Nk keys).

``sinks`` (Hq,): attention sinks (gpt-oss), a logit per query head joining every row's softmax without a
value (:func:`.common.softmax_numerator`): m, l and the LSE include it, so the backward's P = exp(S − LSE)
is unchanged, and the sinks' gradient is d sink = −Σ_rows exp(sink − LSE)·D (D = rowsum(dO∘O') − dlse: the
same D as dS's).
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
    reduce_kv,
    row_chunks,
    softmax_numerator,
    window_keep,
)

FMTS = ("nvfp4", "mxfp4")
BACKWARDS = ("qat", "naive")


def _quantized_operands(q, k, v, fmt, cd):
    return fq(q.to(cd), fmt, -1, cd), fq(k.to(cd), fmt, -1, cd), fq(v.to(cd), fmt, -2, cd)


def attn_qat_forward(q, k, v, *, causal=False, scale=None, fmt="nvfp4", window_size=None, sinks=None):
    """Returns (O, O', LSE) in the compute dtype (float32, float64 for float64 inputs)."""
    cd = compute_dtype(q, k, v)
    B, hq, nq, D = q.shape
    nk = k.shape[2]
    scale = default_scale(D, scale)
    window = normalize_window(window_size, causal)
    qf, kf, vf = _quantized_operands(q, k, v, fmt, cd)
    kf = expand_kv(kf, hq)
    vf = expand_kv(vf, hq)
    o = torch.empty(B, hq, nq, D, dtype=cd, device=q.device)
    o_prime = torch.empty_like(o)
    lse = torch.empty(B, hq, nq, dtype=cd, device=q.device)
    for r0, r1 in row_chunks(B, hq, nq, nk):
        s = scale * (qf[:, :, r0:r1] @ kf.transpose(-1, -2))
        keep = window_keep(r0, r1, nq, nk, causal, window, q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        p, m, l = softmax_numerator(s, None if sinks is None else sinks.to(cd).view(1, hq, 1, 1))
        o[:, :, r0:r1] = normalize(quantize_p(p, fmt, False) @ vf, l)
        o_prime[:, :, r0:r1] = normalize(p @ vf, l)
        lse[:, :, r0:r1] = lse_of(m, l)
    return o, o_prime, lse


def attn_qat_backward(do, q, k, v, o, o_prime, lse, *, causal=False, scale=None, fmt="nvfp4",
                      high_precision_o=True, quantize_p_in_backward=True, backward="qat", dlse=None,
                      window_size=None, sinks=None):
    """Returns (dQ, dK, dV) in the compute dtype; dK, dV summed over GQA groups (and d sinks (Hq,) as a
    fourth value when ``sinks`` is given).

    ``dlse`` (optional, (B, Hq, Nq)) is a gradient flowing into the returned LSE: since
    dLSE/dS = P, it adds P·dlse to dS. ``window_size``: the forward's; P = 0 outside the window (and
    above the causal diagonal), as the masked scores are −inf.
    """
    cd = compute_dtype(q, k, v, do)
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = default_scale(D, scale)
    window = normalize_window(window_size, causal)
    naive = backward == "naive"
    if naive:
        qf, kf, vf = q.to(cd), k.to(cd), v.to(cd)
    else:
        qf, kf, vf = _quantized_operands(q, k, v, fmt, cd)
    kf = expand_kv(kf, hq)
    vf = expand_kv(vf, hq)
    do = do.to(cd)
    o_for_d = (o if (naive or not high_precision_o) else o_prime).to(cd)
    lse = lse.to(cd)
    dq = torch.empty(B, hq, nq, D, dtype=cd, device=q.device)
    dk = torch.zeros(B, hq, nk, D, dtype=cd, device=q.device)
    dv = torch.zeros(B, hq, nk, D, dtype=cd, device=q.device)
    dsink = torch.zeros(hq, dtype=cd, device=q.device)
    for r0, r1 in row_chunks(B, hq, nq, nk):
        s = scale * (qf[:, :, r0:r1] @ kf.transpose(-1, -2))
        keep = window_keep(r0, r1, nq, nk, causal, window, q.device)
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        lr = lse[:, :, r0:r1].unsqueeze(-1)
        p = torch.where(torch.isfinite(lr), torch.exp(s - torch.where(torch.isfinite(lr), lr, 0.0)),
                        torch.zeros_like(s))
        do_c = do[:, :, r0:r1]
        d_row = (do_c * o_for_d[:, :, r0:r1]).sum(dim=-1, keepdim=True)
        if dlse is not None:
            d_row = d_row - dlse[:, :, r0:r1].to(cd).unsqueeze(-1)
        pv = quantize_p(p, fmt, False) if (quantize_p_in_backward and not naive) else p
        dv += pv.transpose(-1, -2) @ do_c
        dp = do_c @ vf.transpose(-1, -2)
        ds = p * (dp - d_row)
        if sinks is not None:  # P of the sink: exp(sink − LSE)
            p_sink = torch.where(torch.isfinite(lr), torch.exp(sinks.to(cd).view(1, hq, 1, 1) - lr), 0.0)
            dsink -= (p_sink * d_row).sum(dim=(0, 2, 3))
        dq[:, :, r0:r1] = scale * (ds @ kf)
        dk += scale * (ds.transpose(-1, -2) @ qf[:, :, r0:r1])
    if sinks is not None:
        return dq, reduce_kv(dk, hkv), reduce_kv(dv, hkv), dsink
    return dq, reduce_kv(dk, hkv), reduce_kv(dv, hkv)


class _AttnQATFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, fmt, high_precision_o, quantize_p_in_backward, backward,
                window_size, sinks):
        o, o_prime, lse = attn_qat_forward(q, k, v, causal=causal, scale=scale, fmt=fmt, window_size=window_size,
                                           sinks=sinks)
        ctx.save_for_backward(q, k, v, o, o_prime, lse, sinks)
        ctx.cfg = dict(causal=causal, scale=scale, fmt=fmt, high_precision_o=high_precision_o,
                       quantize_p_in_backward=quantize_p_in_backward, backward=backward, window_size=window_size)
        return o.to(q.dtype), lse.float()

    @staticmethod
    @torch.autograd.function.once_differentiable  # (no second derivative: refused, not wrong)
    def backward(ctx, do, dlse):
        q, k, v, o, o_prime, lse, sinks = ctx.saved_tensors
        grads = attn_qat_backward(do, q, k, v, o, o_prime, lse, dlse=dlse, sinks=sinks, **ctx.cfg)
        dq, dk, dv = grads[:3]
        dsink = grads[3].to(sinks.dtype) if sinks is not None and ctx.needs_input_grad[10] else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None, dsink


def attn_qat_reference(q, k, v, *, causal=False, scale=None, fmt="nvfp4", high_precision_o=True,
                       quantize_p_in_backward=True, backward="qat", window_size=None, sinks=None):
    """Autograd-enabled reference Attn-QAT on bhsd tensors: returns (out in q.dtype, lse float32).
    ``window_size=(left, right)``: a sliding window; ``sinks`` (Hq,): attention sinks, with their gradient
    (module docstring)."""
    return _AttnQATFunction.apply(q, k, v, causal, scale, fmt, high_precision_o,
                                  quantize_p_in_backward, backward, normalize_window(window_size, causal), sinks)
