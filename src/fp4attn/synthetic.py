"""Seeded synthetic attention inputs with the structure of real LLM / DiT activations.

``make_inputs(kind, B, H, N, D, seed=..., device=..., dtype=...)`` returns ``(q, k, v)``, each
``(B, H, N, D)`` (the ``"bhsd"`` layout). Everything is drawn on the CPU from a
``torch.Generator`` seeded with ``seed`` (in float32), then cast and moved, so one seed gives the
same inputs on every device. The structure is designed for the default softmax scale
``1/sqrt(D)``; logit magnitudes quoted below are after that scale. V is N(0, 1) for every kind.

Kinds (see each generator's docstring):

- ``"gaussian"``  — Q, K, V i.i.d. N(0, 1): the benign case every paper reports.
- ``"key_bias"``  — K has a large per-channel bias shared by all tokens of a head, as real LLM
  keys do (SageAttention's motivation for smoothing K). The bias does not change softmax
  (it adds a per-query constant to every logit) but dominates K's quantization blocks.
- ``"outliers"``  — a few channels of Q and K (the same channels) carry heavy-tailed values
  several times larger than the rest (the "massive activation" / RoPE outlier channels of LLMs).
- ``"sinks"``     — peaked attention: a few early keys ("attention sinks") have a large dot product
  with every query, and every query also peaks on keys near its own position (local attention).
"""

from __future__ import annotations

import hashlib
import math

import torch

__all__ = ["KINDS", "make_inputs", "gaussian", "key_bias", "outliers", "sinks"]

_Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def gaussian(B: int, H: int, N: int, D: int, g: torch.Generator) -> _Tensors:
    """Q, K, V i.i.d. N(0, 1). Logits ``q·k/sqrt(D)`` are then ~N(0, 1): a flat attention map."""
    return _randn(g, B, H, N, D), _randn(g, B, H, N, D), _randn(g, B, H, N, D)


def key_bias(B: int, H: int, N: int, D: int, g: torch.Generator, *, bias_std: float = 6.0) -> _Tensors:
    """Q, V ~ N(0, 1); ``K = N(0, 1) + b`` with one bias vector ``b ~ N(0, bias_std²)`` per (batch, head)
    shared by all tokens (a per-channel bias, ``bias_std`` = 6 times the token-to-token spread).

    Softmax is invariant to it (``q·b`` is the same for every key of a query), so exact attention
    equals that of the unbiased K; but a 16- or 32-element quantization block along D is scaled by
    the bias, so the token-dependent part of K loses most of its FP4 resolution unless K is
    smoothed (mean over tokens subtracted) first.
    """
    q = _randn(g, B, H, N, D)
    k = _randn(g, B, H, N, D) + bias_std * _randn(g, B, H, 1, D)
    v = _randn(g, B, H, N, D)
    return q, k, v


def outlier_channels(D: int) -> int:
    """Number of outlier channels ``outliers`` uses for head dim ``D``: ``max(1, D // 32)``."""
    return max(1, D // 32)


def outliers(B: int, H: int, N: int, D: int, g: torch.Generator, *, scale: float = 3.0,
             df: int = 4) -> _Tensors:
    """Q, K, V ~ N(0, 1), except ``max(1, D // 32)`` channels per (batch, head), the same channels
    in Q and K, which hold ``scale ·`` Student-t(``df``) values (heavy tails; with the defaults
    a typical |value| there is ~3x that of a normal channel, and the largest of a 1024-token head
    is 40-100, where a normal channel never exceeds ~5).

    Because Q and K share the channels, the outliers also move the logits (std ≈ 3 instead of 1),
    as in real heads, and any quantization block that contains an outlier channel is scaled by it.
    """
    q = _randn(g, B, H, N, D)
    k = _randn(g, B, H, N, D)
    v = _randn(g, B, H, N, D)
    n_out = outlier_channels(D)
    for b in range(B):
        for h in range(H):
            ch = torch.randperm(D, generator=g)[:n_out]
            for x in (q, k):
                # Student-t(df) = Z / sqrt(chi2_df / df), chi2_df a sum of df squared normals
                z = _randn(g, N, n_out)
                chi2 = (_randn(g, N, n_out, df) ** 2).sum(-1)
                x[b, h][:, ch] = scale * z / torch.sqrt(chi2 / df)
    return q, k, v


def sink_positions(N: int, n_sinks: int = 4) -> list[int]:
    """Positions of the sink keys ``sinks`` uses: the first ``min(n_sinks, N)`` tokens."""
    return list(range(min(n_sinks, N)))


def sinks(B: int, H: int, N: int, D: int, g: torch.Generator, *, n_sinks: int = 4, sink_logit: float = 8.0,
          local_logit: float = 4.0, local_width: float = 4.0, query_sink: float = 2.0) -> _Tensors:
    """Peaked attention with attention sinks and local peaks.

    Per (batch, head), with ``s = 1/sqrt(D)`` and a random unit direction ``u``:

    - every query gets a component ``query_sink · u``; the first ``n_sinks`` keys get
      ``c · u`` with ``c = sink_logit / (query_sink · s)``, so every query's logit on a sink key is
      ``≈ sink_logit`` (8) above the N(0, 1) background;
    - queries and keys share a smooth positional code: ``q_i += w p_i``, ``k_j += w p_j`` with random
      Fourier features ``p_i·p_j ≈ exp(−(i−j)² / (2 local_width²))`` and ``w² s = local_logit``, so
      every query also peaks (``≈ local_logit`` = 4) on the keys within a few positions of its own;
    - the rest is N(0, 1), as in ``gaussian``.

    With the defaults at N = 1024 the sinks take ~60% of the attention mass and are the argmax of
    ~3/4 of the rows; a key within two positions of its query gets ~20x the weight of another
    non-sink key; most keys get tiny probabilities (the regime in which P̃'s small values are
    hardest to quantize).
    """
    s = 1.0 / math.sqrt(D)
    q = _randn(g, B, H, N, D)
    k = _randn(g, B, H, N, D)
    v = _randn(g, B, H, N, D)
    n_s = len(sink_positions(N, n_sinks))
    c = sink_logit / (query_sink * s)
    w = math.sqrt(local_logit / s)
    m = D // 2
    pos = torch.arange(N, dtype=torch.float32)
    for b in range(B):
        for h in range(H):
            u = _randn(g, D)
            u = u / u.norm()
            q[b, h] += query_sink * u
            k[b, h, :n_s] += c * u
            # random Fourier features of a Gaussian kernel with length scale local_width
            omega = _randn(g, m) / local_width
            phase = 2 * math.pi * torch.rand(m, generator=g)
            ang = pos[:, None] * omega[None, :] + phase[None, :]
            p = torch.cat([torch.cos(ang), torch.sin(ang)], dim=-1) / math.sqrt(m)  # |p_i| = 1
            if p.shape[-1] < D:  # odd D
                p = torch.nn.functional.pad(p, (0, D - p.shape[-1]))
            q[b, h] += w * p
            k[b, h] += w * p
    return q, k, v


_GENERATORS = {"gaussian": gaussian, "key_bias": key_bias, "outliers": outliers, "sinks": sinks}
KINDS: tuple[str, ...] = tuple(_GENERATORS)


def make_inputs(kind: str, B: int, H: int, N: int, D: int, *, seed: int = 0,
                device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> _Tensors:
    """Seeded ``(q, k, v)`` of shape ``(B, H, N, D)`` for input kind ``kind`` (one of :data:`KINDS`).

    Deterministic in ``seed`` (drawn on the CPU in float32, then cast to ``dtype`` and moved to
    ``device``); different kinds with the same seed are independent draws.
    """
    if kind not in _GENERATORS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    for name, val in (("B", B), ("H", H), ("N", N), ("D", D)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    g = torch.Generator(device="cpu")
    # one stream per (kind, seed), unrelated to every other pair
    digest = hashlib.sha256(f"fp4attn.synthetic:{kind}:{seed}".encode()).digest()
    g.manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    q, k, v = _GENERATORS[kind](B, H, N, D, g)
    return tuple(t.to(device=device, dtype=dtype).contiguous() for t in (q, k, v))
