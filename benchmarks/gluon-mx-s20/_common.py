"""Helpers shared by this folder's probes (run from the repository root with PYTHONPATH=src, patch applied)."""
import torch

from fp4attn.kernels import attention as A


def rel(a, b):
    """Relative L2 distance of a from b."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def run(pk, q, causal, B, hq, hkv, kern, cfg=None):
    """The two attention passes (row max, attention) on pre-pass buffers: (out, padded LSE)."""
    out = torch.empty_like(q)
    lse = A.attention_packed(pk, causal=causal, scale=q.shape[-1] ** -0.5, two_level_p=False, B=B, Hq=hq, Hkv=hkv,
                             out=out, kernel=kern, gluon_config=cfg)
    return out, lse
