"""Where an op runs: Triton kernels for CUDA tensors, the PyTorch reference otherwise.

Set ``FP4ATTN_FORCE_REFERENCE=1`` to run the reference on CUDA too (debugging, A/B checks).
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (``TRITON_INTERPRET`` set and not 0): read at each call,
    so that tests may set it before launching. The one test every module uses (no Triton import here)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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


def kernels_for(*tensors: torch.Tensor) -> bool:
    """``use_kernels`` for an op that also runs under tracing: while Dynamo compiles, CUDA inputs take the
    kernel path (its custom op) without reading the environment."""
    if torch.compiler.is_compiling():
        return all(t.is_cuda for t in tensors)
    return use_kernels(*tensors)


@functools.lru_cache(maxsize=None)
def _capability_of(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def capability(device) -> tuple[int, int]:
    """Compute capability of a CUDA device (a ``torch.device``, an index, or None: the current one), cached per
    device: ``torch.cuda.get_device_capability`` costs 4-12 µs of host time per call, and an attention call asked
    it three times (benchmarks/order-s49)."""
    if isinstance(device, torch.device):
        device = device.index
    return _capability_of(torch.cuda.current_device() if device is None else device)


def on_device(t: torch.Tensor):
    """``with on_device(t):`` makes ``t``'s CUDA device the current one for the block (a no-op context
    when it already is, or for a CPU tensor).

    Triton launches a kernel on the *current* device and its current stream, not on its arguments'
    device. Without this, a call with tensors on cuda:1 while cuda:0 is current (a model split over
    GPUs, e.g. transformers' ``device_map="auto"``, which never calls ``torch.cuda.set_device``) would
    launch on cuda:0 with pointers into cuda:1's memory, which Triton 3.6 refuses ("Pointer argument
    (at 0) cannot be accessed from Triton (cpu tensor?)", 2× H200, benchmarks/multidevice-s15).
    Every CUDA branch of the public ops (and of ``KVCache`` and the Quartet layers) runs under it.
    """
    d = t.device
    if d.type != "cuda" or d.index is None or d.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(d)


def traced(*tensors: torch.Tensor) -> bool:
    """Whether the call is being traced (``torch.compile``, ``torch.export``, ``make_fx``): Dynamo is
    compiling or an input is a tensor subclass such as a FakeTensor."""
    return torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in tensors)


def call_op(op, impl, *args):
    """``op(*args)``, a ``torch.library`` custom op that tracing sees as one opaque node, while the call
    is ``traced``; else ``impl(*args)``, the same implementation called directly, without the 25-45 µs
    of host time a custom op's dispatch adds per eager call (H200 host, benchmarks/compile-s15)."""
    return op(*args) if traced(*(a for a in args if isinstance(a, torch.Tensor))) else impl(*args)


def window_args(window) -> tuple[int, int]:
    """A normalized window (``_validate.check_window``) as the custom ops' two int arguments (-1, -1: none)."""
    return window if window is not None else (-1, -1)


def window_from_args(window_left: int, window_right: int):
    """The custom ops' window arguments back to the kernels' normalized ``window`` (None: no window)."""
    return None if window_left < 0 and window_right < 0 else (window_left, window_right)
