"""``QuartetLinear``: an ``nn.Linear`` whose three GEMMs run in MXFP4 (Quartet, SPEC §4).

Semantics (forward QuEST + Hadamard, backward randomized Hadamard + stochastic rounding) and the RNG
handling are documented in :mod:`fp4attn.reference.quartet`. CPU tensors run that reference; CUDA
tensors run :mod:`fp4attn.kernels.quartet` (Triton quantizers + FP8 tensor-core GEMMs on Hopper) when
the shapes allow it, else the reference.

Randomness: each module owns a :class:`~fp4attn.reference.quartet.QuartetRNG` (``module.rng``:
``seed`` and ``step``). Only the backward pass draws random numbers, from ``seed`` and ``step``,
and then advances ``step``; the forward is deterministic. Hence activation checkpointing (which
replays forwards) recomputes identically, and two runs with the same seeds give identical gradients.
``seed=None`` draws the seed from torch's global RNG at construction (``torch.manual_seed`` makes it
reproducible). Data-parallel replicas built with the same seed draw the same noise. On CUDA the step
lives on the device and the backward advances it there, so a training step captured in a CUDA graph
(``torch.cuda.make_graphed_callables``) draws fresh noise at every replay (``QuartetRNG``).
"""

from __future__ import annotations

import fnmatch
import warnings

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from ..ops._dispatch import on_device
from ..reference.quartet import HADAMARD_GROUPS, QuartetLinearFunction, QuartetRNG, quartet_quantize_operand

__all__ = ["QuartetLinear", "quartet_linear", "swap_linear_layers"]


def _kernels():
    """The CUDA implementation module, or None when it cannot be imported."""
    try:
        from ..kernels import quartet as kq
    except Exception:  # no triton, or the kernels are not built yet
        return None
    return kq


def _check_group(hadamard_group) -> int:
    if not isinstance(hadamard_group, int) or isinstance(hadamard_group, bool):
        raise TypeError(f"hadamard_group must be an int, got {type(hadamard_group).__name__}")
    if hadamard_group not in HADAMARD_GROUPS:
        raise ValueError(f"hadamard_group must be one of {HADAMARD_GROUPS}, got {hadamard_group}")
    return hadamard_group


def _check_inputs(x, weight, bias, hadamard_group):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating-point tensor, got dtype {weight.dtype}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., in_features)")
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"x.shape[-1] must equal weight.shape[1]={K} (in_features), got {x.shape[-1]}")
    if K % hadamard_group:
        raise ValueError(f"in_features (weight.shape[1]={K}) must be a multiple of "
                         f"hadamard_group={hadamard_group}")
    if x.device != weight.device:
        raise ValueError(f"x and weight must be on the same device, got {x.device} and {weight.device}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
        if not bias.is_floating_point():
            raise TypeError(f"bias must be a floating-point tensor, got dtype {bias.dtype}")
        if bias.shape != (N,):
            raise ValueError(f"bias must have shape ({N},) (out_features), got {tuple(bias.shape)}")
        if bias.device != weight.device:
            raise ValueError(f"bias must be on weight's device {weight.device}, got {bias.device}")


def _compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype | None:
    """The autocast dtype when autocast is on for x's device, else None (then dtypes must match)."""
    dev = x.device.type
    try:
        if torch.is_autocast_enabled(dev):
            return torch.get_autocast_dtype(dev)
    except (TypeError, RuntimeError, AttributeError):
        pass
    return None


def _apply(x, weight, bias, rng, hadamard_group, module=None):
    ac = _compute_dtype(x, weight)
    if ac is not None:  # as F.linear under autocast: compute and return in the autocast dtype
        x = x.to(ac)
        weight = weight.to(ac)
        bias = None if bias is None else bias.to(ac)
    elif x.dtype != weight.dtype:
        raise TypeError(f"x.dtype ({x.dtype}) must equal weight.dtype ({weight.dtype}), as in nn.Linear")
    kq = _kernels() if x.is_cuda else None
    if kq is not None and kq.supported(x, weight, hadamard_group):
        with on_device(x):  # the backward runs on the autograd engine's thread of x's device
            wq = module._cached_weight("cuda", weight) if module is not None else None
            return kq.quartet_linear_cuda(x, weight, bias, rng, hadamard_group, wq)
    wq = module._cached_weight("reference", weight) if module is not None else None
    return QuartetLinearFunction.apply(x, weight, bias, rng, hadamard_group, wq)


def quartet_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   hadamard_group: int = 32, seed: int | None = None) -> torch.Tensor:
    """Functional Quartet linear: ``y ≈ x @ weight.T + bias`` with MXFP4 forward and backward.

    ``seed``: the backward's random seed; None draws one from torch's global RNG now (so
    ``torch.utils.checkpoint``, which restores that RNG before recomputing, replays the same seed).
    """
    _check_group(hadamard_group)
    _check_inputs(x, weight, bias, hadamard_group)
    return _apply(x, weight, bias, QuartetRNG(seed), hadamard_group)


class QuartetLinear(nn.Linear):
    """Drop-in ``nn.Linear`` training in MXFP4 with Quartet (forward QuEST, backward unbiased SR).

    ``in_features`` must be a multiple of ``hadamard_group`` (32, 64, 128 or 256; the MXFP4 groups are
    always 32). Parameters, initialization, bias and dtypes are those of ``nn.Linear``; under autocast
    the output has the autocast dtype, as ``F.linear``'s. CUDA inputs run the kernels when
    ``hadamard_group == 32``, both feature counts are multiples of 32 and the GPU has FP8 (or FP4)
    tensor cores (compute capability >= 8.9); anything else runs the reference (same semantics).

    ``cache_weight`` (attribute, default False): reuse the quantized weight while ``weight`` is unchanged
    (checked through its version counter, its storage and the count of optimizer steps taken: fused
    optimizers such as ``AdamW(fused=True)`` write without bumping the version counter), e.g. across
    gradient-accumulation micro-batches or in evaluation. Other writes through ``weight.data`` or raw
    pointers bypass all three: keep it off if something updates weights that way, or call
    :meth:`clear_weight_cache` after them. Both the CUDA and the reference path use it.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, hadamard_group: int = 32,
                 device=None, dtype=None, seed: int | None = None):
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
            if v <= 0:
                raise ValueError(f"{name} must be positive, got {v}")
        if not isinstance(bias, bool):
            raise TypeError(f"bias must be a bool, got {type(bias).__name__}")
        _check_group(hadamard_group)
        if in_features % hadamard_group:
            raise ValueError(f"in_features must be a multiple of hadamard_group={hadamard_group}, "
                             f"got {in_features}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype or None, got {dtype!r}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.hadamard_group = hadamard_group
        self.rng = QuartetRNG(seed)
        self.cache_weight = False
        self._w_cache = None

    def _cached_weight(self, kind: str, w: torch.Tensor):
        """The quantized weight for path ``kind`` ("cuda" | "reference"), reused while unchanged.

        ``w`` is the weight as the op sees it (autocast may have cast it); the cache key is the
        parameter's version counter and storage plus ``w``'s dtype and device.
        """
        if not self.cache_weight:
            return None
        _watch_optimizer_steps()
        p = self.weight
        storage = p.untyped_storage()
        key = (kind, p._version, p.data_ptr(), w.dtype, w.device, tuple(w.shape), self.hadamard_group,
               _OPTIMIZER_STEPS[0])
        if kind == "cuda":
            from ..kernels import quartet as kq
            key = key + (kq.gemm_path(w.device),)
        # the storage itself, not only its address: a weak reference keeps the old StorageImpl's address from being
        # reused by a new one (model.half().float() may put the new weight where the old one was)
        if (self._w_cache is None or self._w_cache[0] != key or self._w_cache[2].expired()
                or self._w_cache[2].cdata != storage._cdata):
            if kind == "cuda":
                from ..kernels import quartet as kq
                val = kq.quantize_weight(w.detach())
            else:
                val = quartet_quantize_operand(w.detach(), self.hadamard_group)
            self._w_cache = (key, val, StorageWeakRef(storage))
        return self._w_cache[1]

    def clear_weight_cache(self) -> None:
        """Drop the cached quantized weight (``cache_weight``): the next call quantizes ``weight`` again."""
        self._w_cache = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_inputs(x, self.weight, self.bias, self.hadamard_group)
        return _apply(x, self.weight, self.bias, self.rng, self.hadamard_group, self)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, hadamard_group={self.hadamard_group}, "
                f"seed={self.rng.seed}")

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, hadamard_group: int = 32, seed: int | None = None):
        """A QuartetLinear sharing ``linear``'s parameters (same tensors, so ties and optimizers hold)."""
        w = linear.weight
        q = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                hadamard_group=hadamard_group, device="meta", dtype=w.dtype, seed=seed)
        q.weight = w
        q.bias = linear.bias
        return q


# optimizer steps taken (any torch.optim optimizer, fused ones included: they update parameters without bumping
# their version counters): part of QuartetLinear's weight-cache key, counted once a layer caches its weight
_OPTIMIZER_STEPS = [0]
_STEP_HOOK = []


def _count_step(optimizer, args, kwargs) -> None:
    _OPTIMIZER_STEPS[0] += 1


def _watch_optimizer_steps() -> None:
    if not _STEP_HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _STEP_HOOK.append(register_optimizer_step_post_hook(_count_step))


def _excluded(name: str, patterns) -> bool:
    last = name.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(last, p) for p in patterns)


def swap_linear_layers(model: nn.Module, exclude=("lm_head",), *, hadamard_group: int = 32,
                       seed: int | None = None, strict: bool = False) -> nn.Module:
    """Replace the ``nn.Linear`` modules of ``model`` (in place) by :class:`QuartetLinear`; returns model.
    Modules of ``nn.Linear`` subclasses are kept, with a warning (their own forward or parameters would be lost).

    ``exclude``: names or glob patterns matched against each module's qualified name and its last
    component (default keeps ``lm_head`` in high precision). The new modules share the old
    parameters. Layers whose ``in_features`` is not a multiple of ``hadamard_group`` are left as they
    are with a warning (``strict=True`` raises ValueError instead). ``seed``: base seed; layer i gets
    ``seed + i`` (None: each draws its own from torch's global RNG).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(exclude, str):
        exclude = (exclude,)
    exclude = tuple(exclude or ())
    if not all(isinstance(p, str) for p in exclude):
        raise TypeError("exclude must be a sequence of str")
    _check_group(hadamard_group)
    if type(model) is nn.Linear:
        warnings.warn("swap_linear_layers swaps the nn.Linear modules inside model, not model itself: use "
                      "QuartetLinear.from_linear(model)", stacklevel=2)
    # every name of a module (one registered twice is swapped under both, by one QuartetLinear); nn.Linear itself
    # only: a subclass's own forward or parameters would be lost (and nn.MultiheadAttention's out_proj is read as
    # weights by its owner, never called)
    named = [(n, m) for n, m in model.named_modules(remove_duplicate=False) if n and not _excluded(n, exclude)]
    targets = [(n, m) for n, m in named if type(m) is nn.Linear]
    subclasses = sorted({n for n, m in named if isinstance(m, nn.Linear) and type(m) is not nn.Linear
                         and not isinstance(m, QuartetLinear)})
    skipped, made, index = [], {}, {}
    for name, lin in targets:
        index.setdefault(id(lin), len(index))  # (layer i: seed + i, i counting the distinct nn.Linear modules)
        if lin.in_features % hadamard_group:
            if strict:
                raise ValueError(f"{name}: in_features={lin.in_features} is not a multiple of "
                                 f"hadamard_group={hadamard_group}")
            skipped.append(name)
            continue
        if id(lin) not in made:
            made[id(lin)] = q = QuartetLinear.from_linear(lin, hadamard_group=hadamard_group,
                                                          seed=None if seed is None else seed + index[id(lin)])
            q.train(lin.training)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, made[id(lin)])
    if skipped:
        warnings.warn(f"swap_linear_layers kept {len(skipped)} nn.Linear layer(s) whose in_features is "
                      f"not a multiple of {hadamard_group}: {skipped}", stacklevel=2)
    if subclasses:
        warnings.warn(f"swap_linear_layers kept {len(subclasses)} module(s) of nn.Linear subclasses (their own "
                      f"forward or parameters would be lost): {subclasses}", stacklevel=2)
    return model
