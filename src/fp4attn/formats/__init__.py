"""FP4 formats: E2M1 elements with NVFP4 (E4M3 scales, block 16) or MXFP4 (E8M0 scales, block 32).

``quantize`` / ``fake_quantize`` dispatch to Triton kernels for CUDA tensors and to the PyTorch
implementation in :mod:`fp4attn.formats.core` otherwise (see :mod:`fp4attn.ops.quantize`).
"""

from .core import (
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    FORMATS,
    MXFP4_BLOCK,
    NVFP4_BLOCK,
    SCALE_MODES,
    FP4Tensor,
    block_size,
    e2m1_decode,
    e2m1_encode,
    e2m1_round,
    e4m3_round,
    mx_exponent,
)

__all__ = [
    "E2M1_MAX", "E2M1_VALUES", "E4M3_MAX", "FORMATS", "MXFP4_BLOCK", "NVFP4_BLOCK", "SCALE_MODES",
    "FP4Tensor", "block_size", "e2m1_decode", "e2m1_encode", "e2m1_round", "e4m3_round",
    "mx_exponent", "quantize", "fake_quantize",
]


def __getattr__(name):  # quantize/fake_quantize live in ops (dispatch), re-exported lazily
    if name in ("quantize", "fake_quantize"):
        from ..ops import quantize as _q
        return getattr(_q, name)
    raise AttributeError(name)
