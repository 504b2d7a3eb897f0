"""``fp4attn.sdpa_patch``: route ``torch.nn.functional.scaled_dot_product_attention`` to fp4attn.

```python
with fp4attn.sdpa_patch(recipe="nvfp4"):
    out = model(x)          # every F.scaled_dot_product_attention call inside runs FP4 attention
```

Inside the block, ``torch.nn.functional.scaled_dot_product_attention`` (the attribute; code that
imported the function object itself before the patch keeps the original) is replaced by a wrapper
with SDPA's semantics:

* ``is_causal=True`` is SDPA's **top-left** aligned mask (query i sees keys j ≤ i), translated for
  fp4attn's bottom-right ops (identical when Nq == Nk; otherwise split into exact calls).
* ``attn_mask``: boolean (True = attend) or additive with only 0 / -inf (or dtype-min) values,
  broadcastable to (B, Hq, Nq, Nk): honoured exactly (see :mod:`fp4attn.integrations._common`).
* ``scale`` as SDPA; ``enable_gqa=True`` with Hq a multiple of Hkv: native GQA.
* ``mode="auto"``: :func:`fp4attn.attn_qat` when autograd will need gradients of q, k or v
  (grad mode on and an input requires grad), the inference op otherwise; ``"qat"`` / ``"infer"``
  force one (``"infer"`` with inputs that need gradients falls back, warned, since the inference op
  has no autograd).

Anything it cannot honour goes to the original function, with a warning once per reason:
``dropout_p > 0``, additive masks with real biases, inputs that are not 4-D, different Q/K/V head
dims or > 256, Hq ≠ Hkv without ``enable_gqa`` (the original then raises, as it would anyway),
Hq not a multiple of Hkv, ``is_causal`` together with ``attn_mask``, dtypes other than
float16 / bfloat16 / float32, nested tensors, an empty dimension (B, H, N or D of 0), a ``scale`` that is not
a positive finite number.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F

from ..ops._validate import check_scale
from ._common import (
    _ORIGINAL_SDPA,
    additive_to_bool,
    check_recipe_mode,
    make_op,
    masked_attention,
    warn_once,
)

__all__ = ["sdpa_patch"]

_lock = threading.Lock()
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _top_left_causal(nq: int, nk: int, device) -> torch.Tensor:
    return torch.arange(nk, device=device)[None, :] <= torch.arange(nq, device=device)[:, None]


def make_sdpa(recipe: str = "nvfp4", mode: str = "auto", original=None, **op_kwargs):
    """A drop-in replacement for ``F.scaled_dot_product_attention`` (see the module docstring)."""
    check_recipe_mode(recipe, mode)
    op = make_op(recipe, op_kwargs)
    original = original or _ORIGINAL_SDPA

    def fallback(reason, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extra):
        warn_once(f"sdpa:{reason}", f"fp4attn.sdpa_patch: {reason}; this call runs the original "
                  "scaled_dot_product_attention (not FP4)")
        kw = dict(attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **extra)
        if enable_gqa:
            kw["enable_gqa"] = True
        return original(query, key, value, **kw)

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False, **extra):
        args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, extra)
        ts = (query, key, value)
        if extra:
            return fallback(f"unknown arguments {sorted(extra)}", *args)
        if any(getattr(t, "is_nested", False) for t in ts):
            return fallback("nested tensors are not supported", *args)
        if any(t.dim() != 4 for t in ts):
            return fallback("inputs are not 4-D (B, H, N, D)", *args)
        if any(t.dtype not in _DTYPES for t in ts):
            return fallback("dtype other than float16/bfloat16/float32", *args)
        if dropout_p and dropout_p > 0:
            return fallback(f"dropout_p={dropout_p} is not supported", *args)
        if any(0 in t.shape for t in ts):  # (SDPA returns empty / zero outputs; the fp4attn ops need every size >= 1)
            return fallback("an empty dimension", *args)
        try:
            check_scale(scale, query.shape[-1])
        except (TypeError, ValueError):
            return fallback(f"scale={scale!r} (fp4attn takes a positive finite float)", *args)
        D = query.shape[-1]
        if key.shape[-1] != D or value.shape[-1] != D or D > 256:
            return fallback(f"head dims q={D} k={key.shape[-1]} v={value.shape[-1]} (need equal and <= 256)",
                            *args)
        if key.shape[:2] != value.shape[:2] or key.shape[2] != value.shape[2] or key.shape[0] != query.shape[0]:
            return fallback("broadcast batch / head dims are not supported", *args)
        hq, hkv = query.shape[1], key.shape[1]
        if hq != hkv and not enable_gqa:
            return fallback(f"{hq} query heads vs {hkv} key/value heads without enable_gqa=True", *args)
        if hq % hkv:
            return fallback(f"{hq} query heads not a multiple of {hkv} key/value heads", *args)
        if is_causal and attn_mask is not None:
            return fallback("is_causal=True together with attn_mask", *args)
        allowed = None
        if attn_mask is not None:
            allowed = additive_to_bool(attn_mask)
            if allowed is None:
                return fallback("additive attn_mask with non-zero biases on visible positions", *args)
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in ts)
        train = needs_grad if mode == "auto" else mode == "qat"
        if needs_grad and not train:
            return fallback("mode='infer' but gradients are required (the inference op has no autograd)", *args)
        nq, nk = query.shape[2], key.shape[2]
        if allowed is None:
            if not is_causal or nq == nk:
                return op(query, key, value, bool(is_causal) and nq > 1, scale, train)
            allowed = _top_left_causal(nq, nk, query.device)
        return masked_attention(op, query, key, value, allowed, scale, train)

    scaled_dot_product_attention.fp4attn_config = dict(recipe=recipe, mode=mode, op_kwargs=dict(op_kwargs))
    return scaled_dot_product_attention


@contextlib.contextmanager
def sdpa_patch(recipe: str = "nvfp4", mode: str = "auto", **op_kwargs):
    """Within the ``with`` block, ``torch.nn.functional.scaled_dot_product_attention`` runs fp4attn.

    Args:
        recipe: ``"nvfp4"``, ``"mxfp4"``, ``"sage3"``, ``"bf16"`` or ``"thrift"``.
        mode: ``"auto"`` (Attn-QAT when gradients are needed), ``"qat"``, ``"infer"``.
        op_kwargs: passed on to the op (e.g. ``budget=0.1`` for thrift).

    Yields the replacement function. Nested patches restore in order; not thread-safe across
    threads that patch concurrently (the patch is process-global, as the attribute is).
    """
    with _lock:
        previous = F.scaled_dot_product_attention
        fn = make_sdpa(recipe, mode, **op_kwargs)
        F.scaled_dot_product_attention = fn
    try:
        yield fn
    finally:
        with _lock:
            F.scaled_dot_product_attention = previous
