"""Accuracy metrics for attention outputs, as SageAttention / SageAttention3 report them (Table 1).

Every metric flattens both tensors and computes in float64, so the metric itself adds no
error worth mentioning. ``out`` is the tensor under test, ``ref`` the exact reference.

- :func:`cossim`  — cosine similarity ``Σ o·r / (‖o‖₂ ‖r‖₂)`` (1 is perfect).
- :func:`rel_l1`  — relative L1 ``Σ|o − r| / Σ|r|`` (0 is perfect).
- :func:`rmse`    — root mean square error ``sqrt(mean((o − r)²))`` (0 is perfect; absolute, in
  the units of the output).
- :func:`rel_l2`  — relative L2 ``‖o − r‖₂ / ‖r‖₂`` (the measure SPEC §6 tolerances use).

Degenerate cases are defined rather than raising: two all-zero tensors have CosSim 1 and relative
errors 0; a zero reference with a non-zero output gives CosSim 0 and relative errors ``inf``.
A NaN anywhere propagates to NaN.
"""

from __future__ import annotations

import math

import torch

__all__ = ["cossim", "rel_l1", "rmse", "rel_l2", "all_metrics"]


def _flat64(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError("out and ref must be torch.Tensor")
    if out.shape != ref.shape:
        raise ValueError(f"out and ref must have the same shape, got {tuple(out.shape)} and "
                         f"{tuple(ref.shape)}")
    if out.numel() == 0:
        raise ValueError("out and ref must not be empty")
    o = out.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
    r = ref.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
    return o, r


def _ratio(num: float, den: float, *, zero_zero: float) -> float:
    if math.isnan(num) or math.isnan(den):
        return float("nan")
    if den == 0.0:
        return zero_zero if num == 0.0 else float("inf")
    return num / den


def cossim(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors, ``Σ o·r / sqrt(Σo² · Σr²)``, in float64."""
    o, r = _flat64(out, ref)
    num = float((o * r).sum())
    den = math.sqrt(float((o * o).sum()) * float((r * r).sum()))
    if math.isnan(num) or math.isnan(den):
        return float("nan")
    if den == 0.0:
        # both zero: identical; exactly one zero: no similarity
        return 1.0 if float(o.abs().sum()) == float(r.abs().sum()) == 0.0 else 0.0
    return num / den


def rel_l1(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L1 error ``Σ|o − r| / Σ|r|``, in float64."""
    o, r = _flat64(out, ref)
    return _ratio(float((o - r).abs().sum()), float(r.abs().sum()), zero_zero=0.0)


def rmse(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Root mean square error ``sqrt(mean((o − r)²))``, in float64."""
    o, r = _flat64(out, ref)
    return math.sqrt(float(((o - r) ** 2).mean()))


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error ``‖o − r‖₂ / ‖r‖₂``, in float64."""
    o, r = _flat64(out, ref)
    return _ratio(float(torch.linalg.vector_norm(o - r)), float(torch.linalg.vector_norm(r)), zero_zero=0.0)


def all_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``{"cossim", "rel_l1", "rmse", "rel_l2"}`` of ``out`` against ``ref``."""
    return {"cossim": cossim(out, ref), "rel_l1": rel_l1(out, ref), "rmse": rmse(out, ref),
            "rel_l2": rel_l2(out, ref)}
