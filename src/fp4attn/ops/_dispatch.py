"""Where an op runs: Triton kernels for CUDA tensors, the PyTorch reference otherwise.

Set ``FP4ATTN_FORCE_REFERENCE=1`` to run the reference on CUDA too (debugging, A/B checks).
"""

from __future__ import annotations

import functools
import os

import torch


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def use_kernels(*tensors: torch.Tensor) -> bool:
    if os.environ.get("FP4ATTN_FORCE_REFERENCE", "0") not in ("", "0"):
        return False
    return all(t.is_cuda for t in tensors) and triton_available()


def device_capability(t: torch.Tensor) -> tuple[int, int]:
    return torch.cuda.get_device_capability(t.device)
