"""Public quantize / fake_quantize: validation, then Triton on CUDA, the PyTorch formats elsewhere.

Under tracing (``torch.compile``, export: ``_dispatch.call_op``) the CUDA kernels run as the custom ops
``fp4attn::quantize`` and ``fp4attn::fake_quantize`` (the latter with its straight-through gradient), so
compiled models trace them with ``fullgraph=True``; eager calls run the kernels directly."""

from __future__ import annotations

import torch

from ..formats import core
from ..formats.core import FP4Tensor
from ._dispatch import call_op, kernels_for, on_device


def quantize(x: torch.Tensor, fmt: str = "nvfp4", dim: int = -1, *, scale_mode: str = "rceil",
             global_scale: bool = False) -> FP4Tensor:
    """Block-quantize ``x`` to FP4 along ``dim`` (SPEC §2); returns an :class:`FP4Tensor`.

    ``x.shape[dim]`` must be a multiple of the block size (16 for ``"nvfp4"``, 32 for ``"mxfp4"``).
    """
    core._check_x(x)
    core._check_fmt(fmt, scale_mode, global_scale)
    d = core._norm_dim(dim, x.dim())
    if kernels_for(x):
        data, scales, g = call_op(torch.ops.fp4attn.quantize, _quantize_impl, x, fmt, d, scale_mode, global_scale)
        return FP4Tensor(data, scales, g if global_scale else None, fmt, d, x.shape, x.dtype)
    return core.quantize_reference(x, fmt, d, scale_mode=scale_mode, global_scale=global_scale)


def _quantize_impl(x: torch.Tensor, fmt: str, dim: int, scale_mode: str, global_scale: bool
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, scales, global decode scale or an empty tensor) of the Triton quantizer."""
    from ..kernels import quantize as kq
    with on_device(x):
        t = kq.quantize(x, fmt, dim, scale_mode=scale_mode, global_scale=global_scale)
    return t.data, t.scales, t.global_scale if global_scale else x.new_empty(0, dtype=torch.float32)


_quantize_op = torch.library.custom_op("fp4attn::quantize", _quantize_impl, mutates_args=(), device_types="cuda")


@_quantize_op.register_fake
def _(x, fmt, dim, scale_mode, global_scale):
    bs = core.block_size(fmt)
    data = list(x.shape)
    data[dim] //= 2
    sc = list(x.shape)
    sc[dim] //= bs
    sdt = torch.float8_e4m3fn if fmt == "nvfp4" else torch.float8_e8m0fnu
    g = x.new_empty((), dtype=torch.float32) if global_scale else x.new_empty(0, dtype=torch.float32)
    return x.new_empty(data, dtype=torch.uint8), x.new_empty(sc, dtype=sdt), g


def _fake_quantize_impl(x: torch.Tensor, fmt: str, dim: int, scale_mode: str, global_scale: bool) -> torch.Tensor:
    from ..kernels import quantize as kq
    with on_device(x):
        return kq.fake_quantize(x, fmt, dim, scale_mode=scale_mode, global_scale=global_scale)


_fake_quantize_op = torch.library.custom_op("fp4attn::fake_quantize", _fake_quantize_impl, mutates_args=(),
                                            device_types="cuda")


@_fake_quantize_op.register_fake
def _(x, fmt, dim, scale_mode, global_scale):
    return x.new_empty(x.shape)


def _straight_through(ctx, g):
    return g, None, None, None, None


_fake_quantize_op.register_autograd(_straight_through)


class _FakeQuantizeKernelSTE(torch.autograd.Function):
    """Eager form of ``fp4attn::fake_quantize`` (without the custom op's dispatch cost)."""

    @staticmethod
    def forward(ctx, x, fmt, dim, scale_mode, global_scale):
        return _fake_quantize_impl(x, fmt, dim, scale_mode, global_scale)

    @staticmethod
    def backward(ctx, g):
        return _straight_through(ctx, g)


def fake_quantize(x: torch.Tensor, fmt: str = "nvfp4", dim: int = -1, *, scale_mode: str = "rceil",
                  global_scale: bool = False) -> torch.Tensor:
    """``quantize(x).dequantize()`` in x's shape and dtype (``dim`` zero-padded internally).

    The gradient is straight-through (identity).
    """
    core._check_x(x)
    core._check_fmt(fmt, scale_mode, global_scale)
    d = core._norm_dim(dim, x.dim())
    if kernels_for(x):
        return call_op(torch.ops.fp4attn.fake_quantize, _FakeQuantizeKernelSTE.apply, x, fmt, d, scale_mode,
                       global_scale)
    return core.fake_quantize_reference(x, fmt, d, scale_mode=scale_mode, global_scale=global_scale)
