"""Argument validation shared by every public op (SPEC §5): errors name the argument."""

from __future__ import annotations

import math
import numbers
import warnings

import torch

LAYOUTS = ("bhsd", "bshd")
FMTS = ("nvfp4", "mxfp4")
MAX_HEAD_DIM = 256
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_fmt(fmt) -> None:
    check_choice("fmt", fmt, FMTS)


def check_bool(name: str, value, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool{' or None' if allow_none else ''}, got {value!r}")


def check_scale(scale, D: int) -> float:
    """Softmax scale: default 1/sqrt(D); otherwise a positive finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"scale must be a number, got a tensor of shape {tuple(scale.shape)}")
        if scale.requires_grad:
            raise TypeError("scale must be a float (no gradient flows to the softmax scale), got a tensor that "
                            "requires grad")
        scale = scale.item()
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a positive finite float or None, got {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale}")
    return scale


def check_window(window_size, causal: bool):
    """``window_size=(left, right)`` (FlashAttention's convention; None or -1 = unbounded side) ->
    the normal form of :func:`fp4attn.reference.common.normalize_window`: (left, right) with -1 for
    unbounded, or None for no window."""
    from ..reference.common import normalize_window

    if window_size is None:
        return None
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair of ints (-1 or None: unbounded) or None, "
                        f"got {window_size!r}")
    for side, w in zip(("left", "right"), window_size):
        if w is None:
            continue
        if isinstance(w, bool) or not isinstance(w, numbers.Integral):
            raise TypeError(f"window_size's {side} extent must be an int (-1 or None: unbounded), got {w!r}")
        if w < -1:
            raise ValueError(f"window_size's {side} extent must be >= 0, or -1 / None for unbounded, got {w}")
    right = window_size[1]
    if causal and right is not None and right not in (-1, 0):
        raise ValueError(f"window_size=(left, right) with causal=True needs right 0 or -1 (causal already "
                         f"bounds the right side), got right={right}")
    return normalize_window(window_size, causal)


def check_sinks(sinks, hq: int, device: torch.device):
    """Attention sinks: None, or a float tensor of shape (Hq,) on the inputs' device (one logit per query head,
    in score units; values are not inspected: no host sync, CUDA-graph safe)."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor of shape (Hq,) or None, got {type(sinks).__name__}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks must be a floating-point tensor, got dtype {sinks.dtype}")
    if tuple(sinks.shape) != (hq,):
        raise ValueError(f"sinks must have shape (Hq,) = ({hq},), one logit per query head, got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks must be on the inputs' device {device}, got {sinks.device}")
    return sinks


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} must be a float16, bfloat16 or float32 (or float64, reference path) tensor, "
                        f"got dtype {t.dtype}")


def check_attention_args(q, k, v, *, layout="bhsd", scale=None, causal=False):
    """Validate q, k, v (SPEC §3/§5) and return bhsd views plus the float softmax scale.

    Shapes: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D) for layout "bhsd"; (B, N, H, D) for "bshd".
    """
    check_choice("layout", layout, LAYOUTS)
    check_bool("causal", causal)
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    shape_doc = "(B, H, N, D)" if layout == "bhsd" else "(B, N, H, D)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {shape_doc} for layout={layout!r}, "
                             f"got shape {tuple(t.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k and v must be on one device, got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must have one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if layout == "bshd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    B, hq, nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch size of k ({k.shape[0]}) and v ({v.shape[0]}) must equal q's ({B})")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"head dim D of k ({k.shape[3]}) and v ({v.shape[3]}) must equal q's ({D})")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k and v must have the same number of heads, got {k.shape[1]} and {v.shape[1]}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same sequence length Nk, got {k.shape[2]} and "
                         f"{v.shape[2]}")
    hkv = k.shape[1]
    if hq < 1 or hkv < 1:
        raise ValueError(f"the numbers of query heads Hq and key/value heads Hkv must be >= 1, got Hq={hq}, "
                         f"Hkv={hkv}")
    if hq % hkv:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the number of "
                         f"key/value heads ({hkv}) (GQA/MQA)")
    if D > MAX_HEAD_DIM or D < 1:
        raise ValueError(f"head dim D must be in [1, {MAX_HEAD_DIM}], got {D}")
    if nq < 1 or k.shape[2] < 1 or B < 1:
        raise ValueError(f"B, Nq and Nk must be >= 1, got B={B}, Nq={nq}, Nk={k.shape[2]}")
    return q, k, v, check_scale(scale, D)


def from_bhsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """bhsd result -> the caller's layout, contiguous."""
    return (x.transpose(1, 2) if layout == "bshd" else x).contiguous()


def fake_outputs(q: torch.Tensor, layout: str, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake (meta) results of an attention custom op for bhsd ``q`` (B, Hq, Nq, D): out contiguous in
    ``layout`` with q's dtype, lse (B, Hq, Nq) float32 (empty without ``return_lse``), as the CUDA
    implementations return them (``ops.attention.op_outputs``)."""
    B, H, N, D = q.shape
    shape = (B, N, H, D) if layout == "bshd" else (B, H, N, D)
    return q.new_empty(shape), q.new_empty((B, H, N) if return_lse else (0,), dtype=torch.float32)


def warn_no_autograd(op: str, *tensors) -> None:
    """An inference op (no autograd) called where autograd wants gradients of its inputs: say so (once per call
    site, Python's default warning filter), since no gradient would reach q, k, v silently otherwise (SDPA users
    expect one)."""
    if (torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)):
        warnings.warn(f"fp4attn.{op} is an inference op (no autograd): no gradient flows to its inputs; train with "
                      "fp4attn.attn_qat, or call it under torch.no_grad() / torch.inference_mode()", stacklevel=3)
