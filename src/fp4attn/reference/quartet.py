"""Quartet (MXFP4 training of linear layers, Algorithm 1 of the Quartet paper) in plain PyTorch.

This is the semantics of ``fp4attn.nn.QuartetLinear`` (SPEC §4); the CUDA kernels are tested against it.

``y = x @ W^T (+ b)`` with x (..., K), W (N, K); M = the number of rows of x (tokens).

Forward
  * ``x_h = x H``, ``W_h = W H`` per group of ``g`` (default 32) along K, H the normalized Sylvester
    Hadamard matrix (``H H^T = I``; it is symmetric, so ``H^-1 = H^T = H``).
  * QuEST per MXFP4 group of 32 (:func:`quest_quantize`): ``sigma = std(group, correction=0)``,
    ``X = 2**floor(log2(2.92247856/6 * sigma + 1e-8))``, codes ``e2m1_rne(x/X)`` (saturating at 6),
    trust mask ``M = |x/X| < 6``. ``X_q``/``W_q`` are the dequantized values (E2M1 times powers of two).
  * ``y = X_q @ W_q^T`` in float32 (+ b), cast to x's dtype.

Backward (an unbiased estimate of the masked straight-through gradient)
  * target: ``dx = ((dy W_q) ⊙ M_x) H^T`` and ``dW = ((dy^T X_q) ⊙ M_w) H^T`` (per group along K).
  * dx: fresh random signs s (one per element of the reduction dim N, so fresh per group), the
    random Hadamard ``R = blockdiag(diag(s_g) H)`` along N applied to dy and to ``W_q^T`` (so that
    ``(dy R)(W_q^T R)^T = dy W_q``), stochastic rounding of ``3/4 *`` each to MXFP4 along N
    (:func:`fp4attn.formats.stochastic.sr_quantize_mxfp4`), float32 GEMM, ``16/9`` rescale, ``⊙ M_x``,
    inverse Hadamard along K. The two SR draws are independent, so ``E = (9/16)(16/9) dy W_q``.
  * dW: likewise with the random Hadamard along the token dim M, applied to ``dy^T`` and ``X_q^T``.
    M (and N) are zero-padded to the group size; zero rows add nothing to either product.
  * db = dy summed over tokens (unquantized, float32).

RNG handling (determinism and activation checkpointing)
  The forward pass is deterministic and draws no random numbers, so recomputing it (activation
  checkpointing) changes nothing. All randomness is drawn in the backward pass from a
  ``torch.Generator`` on dy's device seeded with ``backward_seed(seed, step)`` (a SplitMix64 mix of a
  per-module seed and a counter of backward passes, :class:`QuartetRNG`). The draw order is fixed:
  dx signs (N), dx SR noise for dy (M x N) then for W_q^T (K x N), dW signs (M), dW SR noise for dy^T
  (N x M) then for X_q^T (K x M) (padded sizes). Gradients not needed are skipped without drawing.
  Same seed, same step, same inputs -> bit-identical gradients.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..formats.core import E2M1_MAX, MXFP4_BLOCK, e2m1_round, mx_exponent
from ..formats.stochastic import SR_PRESCALE, sr_quantize_mxfp4

QUEST_STD_FACTOR = 2.92247856 / 6.0  # QuEST's RMSE-optimal clip for a Gaussian, over E2M1's max
QUEST_EPS = 1e-8
SR_RESCALE = 16.0 / 9.0  # 1 / (3/4)**2
HADAMARD_GROUPS = (32, 64, 128, 256)


# ----------------------------------------------------------------------------------------------
# Hadamard
# ----------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _hadamard_cpu64(n: int) -> torch.Tensor:
    if n < 1 or n & (n - 1):
        raise ValueError(f"n must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def hadamard_matrix(n: int = 32, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The normalized n x n Sylvester Hadamard matrix (symmetric, ``H @ H.T = I``)."""
    return _hadamard_cpu64(n).to(dtype=dtype, device=device)


def hadamard_groups(x: torch.Tensor, group: int = 32, dim: int = -1,
                    signs: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (float32) times H (or ``diag(signs) H``) per group of ``group`` along ``dim``.

    ``signs``: optional +-1 vector of ``x.shape[dim]`` entries (the random-sign Hadamard).
    Applying it with the same signs to both operands of a product along ``dim`` leaves the product
    unchanged. H is symmetric, so the same call is its own inverse when ``signs`` is None.
    """
    d = dim % x.dim()
    xt = x.float().movedim(d, -1)
    L = xt.shape[-1]
    if L % group:
        raise ValueError(f"x.shape[dim]={L} must be a multiple of the Hadamard group {group}")
    if signs is not None:
        xt = xt * signs.to(xt.dtype)
    h = hadamard_matrix(group, torch.float32, x.device)
    out = (xt.reshape(*xt.shape[:-1], L // group, group) @ h).reshape(xt.shape)
    return out.movedim(-1, d)


# ----------------------------------------------------------------------------------------------
# QuEST
# ----------------------------------------------------------------------------------------------
def quest_exponent(sigma: torch.Tensor) -> torch.Tensor:
    """``floor(log2(2.92247856/6 * sigma + 1e-8))`` (int32, clamped to E8M0's [-127, 127]).

    Read exactly from the float32 exponent bits (core's ``mx_exponent``, "floor": that is
    ``floor(log2(a)) - 2``), never from a rounded log2.
    """
    a = sigma.float() * QUEST_STD_FACTOR + QUEST_EPS
    return (mx_exponent(a, "floor") + 2).clamp(-127, 127)


def quest_quantize(x: torch.Tensor, dim: int = -1, return_exponents: bool = False):
    """QuEST MXFP4 quantization of (already Hadamard-rotated) ``x`` in groups of 32 along ``dim``.

    Returns ``(values, mask)``: the dequantized values ``e2m1_rne(x/X) * X`` (float32) and the trust
    mask ``|x/X| < 6`` (bool), both x's shape; with ``return_exponents`` also the int32 group
    exponents (``X = 2**e``, dim moved last). Groups holding NaN/Inf give NaN values, mask False.
    """
    d = dim % x.dim()
    xt = x.float().movedim(d, -1)
    L = xt.shape[-1]
    if L % MXFP4_BLOCK:
        raise ValueError(f"x.shape[dim]={L} must be a multiple of {MXFP4_BLOCK}")
    xb = xt.reshape(*xt.shape[:-1], L // MXFP4_BLOCK, MXFP4_BLOCK)
    sigma = xb.std(dim=-1, correction=0)
    e = quest_exponent(sigma)
    v = torch.ldexp(xb, -e.unsqueeze(-1))  # x / X, exact
    vals = torch.ldexp(e2m1_round(v), e.unsqueeze(-1))
    mask = v.abs() < E2M1_MAX
    bad = ~torch.isfinite(xb).all(dim=-1, keepdim=True)
    vals = torch.where(bad, torch.full_like(vals, float("nan")), vals)
    mask = mask & ~bad
    vals = vals.reshape(xt.shape).movedim(-1, d)
    mask = mask.reshape(xt.shape).movedim(-1, d)
    if return_exponents:
        return vals, mask, e
    return vals, mask


# ----------------------------------------------------------------------------------------------
# Forward / backward
# ----------------------------------------------------------------------------------------------
@dataclass
class QuartetContext:
    """What the forward keeps for the backward (Algorithm 1's ctx), 2-D (M, K) / (N, K)."""

    x_q: torch.Tensor  # float32 (M, K): QuEST(x H), dequantized
    w_q: torch.Tensor  # float32 (N, K): QuEST(W H), dequantized
    m_x: torch.Tensor  # bool (M, K)
    m_w: torch.Tensor  # bool (N, K)
    hadamard_group: int = 32


def quartet_quantize_operand(a: torch.Tensor, hadamard_group: int = 32):
    """(R, K) -> (QuEST values, mask) of ``a H`` (group Hadamard along K)."""
    return quest_quantize(hadamard_groups(a, hadamard_group, -1), -1)


def quartet_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
                    hadamard_group: int = 32, w_quantized=None):
    """Quartet forward: returns ``(y, ctx)``; y float32 of shape (..., N).

    ``w_quantized``: optional precomputed ``(W_q, M_w)`` (the weight cache of QuartetLinear).
    """
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    x_q, m_x = quartet_quantize_operand(x2, hadamard_group)
    if w_quantized is None:
        w_q, m_w = quartet_quantize_operand(w, hadamard_group)
    else:
        w_q, m_w = w_quantized
    y = x_q @ w_q.t()
    if b is not None:
        y = y + b.float()
    ctx = QuartetContext(x_q, w_q, m_x, m_w, hadamard_group)
    return y.reshape(*x.shape[:-1], w.shape[0]), ctx


def _random_signs(n: int, generator: torch.Generator | None, device) -> torch.Tensor:
    return torch.randint(0, 2, (n,), generator=generator, device=device).float() * 2.0 - 1.0


def _pad_dim0(a: torch.Tensor, n: int) -> torch.Tensor:
    return a if a.shape[0] == n else F.pad(a, (0, 0, 0, n - a.shape[0]))


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def sr_product(a: torch.Tensor, b: torch.Tensor, generator: torch.Generator | None,
               group: int = 32) -> torch.Tensor:
    """Unbiased MXFP4 estimate of ``a @ b^T`` (a (P, L), b (Q, L)), the reduction along L.

    Random-sign Hadamard along L on both, SR of 3/4 x to MXFP4 along L, float32 GEMM, 16/9.
    L is zero-padded to a multiple of ``group``.
    """
    L = a.shape[1]
    Lp = _round_up(L, group)
    if Lp != L:
        a = F.pad(a, (0, Lp - L))
        b = F.pad(b, (0, Lp - L))
    s = _random_signs(Lp, generator, a.device)
    a_h = hadamard_groups(a, group, -1, signs=s)
    b_h = hadamard_groups(b, group, -1, signs=s)
    a_q = sr_quantize_mxfp4(a_h, -1, generator=generator, prescale=SR_PRESCALE).values
    b_q = sr_quantize_mxfp4(b_h, -1, generator=generator, prescale=SR_PRESCALE).values
    return (a_q @ b_q.t()) * SR_RESCALE


def quartet_backward(dy: torch.Tensor, ctx: QuartetContext, generator: torch.Generator | None,
                     needs=(True, True, True)):
    """Quartet backward (Algorithm 1): returns ``(dx, dW, db)`` as float32 (None where not needed).

    dy: (..., N). dx has dy's leading shape with K columns; dW (N, K); db (N,).
    """
    N = dy.shape[-1]
    g = ctx.hadamard_group
    dy2 = dy.reshape(-1, N).float()
    dx = dw = db = None
    if needs[0]:
        dxq = sr_product(dy2, ctx.w_q.t(), generator, MXFP4_BLOCK)  # reduction along N
        dx = hadamard_groups(dxq * ctx.m_x, g, -1)  # H^T = H
        dx = dx.reshape(*dy.shape[:-1], dx.shape[-1])
    if needs[1]:
        dwq = sr_product(dy2.t(), ctx.x_q.t(), generator, MXFP4_BLOCK)  # reduction along M
        dw = hadamard_groups(dwq * ctx.m_w, g, -1)
    if len(needs) > 2 and needs[2]:
        db = dy2.sum(0)
    return dx, dw, db


def masked_ste_gradients(dy: torch.Tensor, ctx: QuartetContext):
    """The exact target the backward estimates: ``((dy W_q) ⊙ M_x) H^T``, ``((dy^T X_q) ⊙ M_w) H^T``."""
    N = dy.shape[-1]
    dy2 = dy.reshape(-1, N).float()
    dx = hadamard_groups((dy2 @ ctx.w_q) * ctx.m_x, ctx.hadamard_group, -1)
    dw = hadamard_groups((dy2.t() @ ctx.x_q) * ctx.m_w, ctx.hadamard_group, -1)
    return dx.reshape(*dy.shape[:-1], dx.shape[-1]), dw


# ----------------------------------------------------------------------------------------------
# RNG
# ----------------------------------------------------------------------------------------------
_MASK64 = (1 << 64) - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def backward_seed(seed: int, step: int) -> int:
    """A 63-bit seed for one backward pass from a module seed and a step counter."""
    return _splitmix64((_splitmix64(int(seed) & _MASK64) + int(step)) & _MASK64) >> 1


class QuartetRNG:
    """Per-module randomness: ``seed`` and ``step``, the number of backward passes drawn so far.

    Each backward pass takes ``backward_seed(seed, step)`` and advances ``step`` by one. The forward
    draws nothing, so activation checkpointing (which replays forwards) leaves the stream unchanged.
    Set ``step`` explicitly to reproduce a given step (e.g. when resuming training).

    On a GPU the step lives on the device (``device_state``): the CUDA backward derives its seeds from
    it and advances it in a kernel, so a backward captured in a CUDA graph (``torch.cuda.graph``,
    ``make_graphed_callables``) draws fresh noise at every replay, the same as eager steps would.
    Reading ``step`` then synchronizes with the device; setting it writes there.
    """

    def __init__(self, seed: int | None = None, step: int = 0):
        if seed is None:
            seed = int(torch.randint(0, 2 ** 62, (1,)).item())  # from torch's global RNG
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self._state = None  # the device state (see device_state), created by the first CUDA backward
        self.seed = seed
        self.step = step

    @property
    def step(self) -> int:
        return self._step if self._state is None else int(self._state[0].item())

    @step.setter
    def step(self, value: int) -> None:
        self._step = int(value)
        if self._state is not None:
            self._state[0].fill_(self._step)

    def device_state(self, device) -> torch.Tensor | None:
        """int64 (3,) on ``device``: ``[step, 0, splitmix64(seed)]`` (the last as a signed 64-bit
        integer; the middle word is the kernel's completion ticket), which the CUDA backward reads and
        advances on the device. Created on first use, from the current ``step``; None while a CUDA
        graph is being captured and no state exists yet (the capture then fixes this call's seeds)."""
        st = self._state
        if st is not None and st.device == torch.device(device) and self._state_seed == self.seed:
            return st
        if torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        mix = _splitmix64(int(self.seed) & _MASK64)
        step = self.step
        self._state = torch.tensor([step, 0, mix - (1 << 64) if mix >= 1 << 63 else mix], dtype=torch.int64,
                                   device=device)
        self._state_seed = self.seed
        return self._state

    def next_seed(self) -> int:
        s = backward_seed(self.seed, self.step)
        self.step += 1
        return s

    def next_generator(self, device) -> torch.Generator:
        g = torch.Generator(device=device)
        g.manual_seed(self.next_seed())
        return g

    def __repr__(self) -> str:
        return f"QuartetRNG(seed={self.seed}, step={self.step})"


class QuartetLinearFunction(torch.autograd.Function):
    """The reference autograd Function: ``apply(x, weight, bias, rng, hadamard_group, w_quantized)``."""

    @staticmethod
    def forward(ctx, x, weight, bias, rng, hadamard_group=32, w_quantized=None):
        with torch.autocast(x.device.type, enabled=False):  # float32 GEMM even inside autocast
            y, q = quartet_forward(x.detach(), weight.detach(), None if bias is None else bias.detach(),
                                   hadamard_group, w_quantized)
        ctx.save_for_backward(q.x_q, q.w_q, q.m_x, q.m_w)  # saved tensors: checkpointing can drop them
        ctx.rng = rng
        ctx.hadamard_group = hadamard_group
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y.to(x.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable  # (no second derivative: refused, not wrong)
    def backward(ctx, dy):
        needs = ctx.needs_input_grad[:3]
        if not any(needs):
            return None, None, None, None, None, None
        x_q, w_q, m_x, m_w = ctx.saved_tensors
        q = QuartetContext(x_q, w_q, m_x, m_w, ctx.hadamard_group)
        gen = ctx.rng.next_generator(dy.device)
        dx, dw, db = quartet_backward(dy, q, gen, needs)
        xd, wd, bd = ctx.dtypes
        return (None if dx is None else dx.to(xd), None if dw is None else dw.to(wd),
                None if db is None else db.to(bd), None, None, None)
