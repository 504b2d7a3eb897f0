"""Public quantize / fake_quantize: validation, then Triton on CUDA, the PyTorch formats elsewhere."""

from __future__ import annotations

import torch

from ..formats import core
from ..formats.core import FP4Tensor
from ._dispatch import on_device, use_kernels


def quantize(x: torch.Tensor, fmt: str = "nvfp4", dim: int = -1, *, scale_mode: str = "rceil",
             global_scale: bool = False) -> FP4Tensor:
    """Block-quantize ``x`` to FP4 along ``dim`` (SPEC §2); returns an :class:`FP4Tensor`.

    ``x.shape[dim]`` must be a multiple of the block size (16 for ``"nvfp4"``, 32 for ``"mxfp4"``).
    """
    core._check_x(x)
    core._check_fmt(fmt, scale_mode, global_scale)
    d = core._norm_dim(dim, x.dim())
    if use_kernels(x):
        from ..kernels import quantize as kq
        with on_device(x):
            return kq.quantize(x, fmt, d, scale_mode=scale_mode, global_scale=global_scale)
    return core.quantize_reference(x, fmt, d, scale_mode=scale_mode, global_scale=global_scale)


class _FakeQuantizeKernelSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fmt, dim, scale_mode, global_scale):
        from ..kernels import quantize as kq
        with on_device(x):
            return kq.fake_quantize(x, fmt, dim, scale_mode=scale_mode, global_scale=global_scale)

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None, None


def fake_quantize(x: torch.Tensor, fmt: str = "nvfp4", dim: int = -1, *, scale_mode: str = "rceil",
                  global_scale: bool = False) -> torch.Tensor:
    """``quantize(x).dequantize()`` in x's shape and dtype (``dim`` zero-padded internally).

    The gradient is straight-through (identity).
    """
    core._check_x(x)
    core._check_fmt(fmt, scale_mode, global_scale)
    d = core._norm_dim(dim, x.dim())
    if use_kernels(x):
        return _FakeQuantizeKernelSTE.apply(x, fmt, d, scale_mode, global_scale)
    return core.fake_quantize_reference(x, fmt, d, scale_mode=scale_mode, global_scale=global_scale)
