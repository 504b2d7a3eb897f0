"""fp4attn: 4-bit attention and 4-bit training for PyTorch.

Formats (SPEC §2): :func:`quantize`, :func:`fake_quantize`, :class:`FP4Tensor`.
Attention (SPEC §3): :func:`attention` (inference recipes nvfp4 / mxfp4 / sage3 / bf16),
:func:`attn_qat` (Attn-QAT training op), :func:`thrift_attention` (ThriftAttention).
Linear (SPEC §4): :class:`fp4attn.nn.QuartetLinear`.

CUDA tensors run Triton kernels; CPU tensors run the reference implementation in
:mod:`fp4attn.reference`. Importing needs no GPU.
"""

from .formats import FP4Tensor
from .ops.quantize import fake_quantize, quantize

__version__ = "0.1.0"

__all__ = ["FP4Tensor", "quantize", "fake_quantize", "attention", "attn_qat", "thrift_attention", "nn",
           "KVCache", "decode", "sdpa_patch", "__version__"]


def __getattr__(name):
    # attention ops are imported lazily so that `import fp4attn` stays light
    if name == "attention":
        from .ops.attention import attention
        return attention
    if name == "thrift_attention":
        from .ops.thrift import thrift_attention
        return thrift_attention
    if name == "attn_qat":
        from .ops.attn_qat import attn_qat
        return attn_qat
    if name == "KVCache":
        from .kvcache import KVCache
        return KVCache
    if name == "decode":
        from .ops.decode import decode
        return decode
    if name == "sdpa_patch":
        from .integrations.sdpa import sdpa_patch
        return sdpa_patch
    if name == "nn":
        import importlib
        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'fp4attn' has no attribute {name!r}")
