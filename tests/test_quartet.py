"""Quartet (SPEC §4): reference forward/backward, stochastic rounding, QuartetLinear API, FP8 embedding.

Independent implementations here are float64 NumPy with a *materialized* block-diagonal Hadamard built
from the closed form ``H[i, j] = (-1)**popcount(i & j) / sqrt(n)`` (not the Sylvester recursion the
library uses) and an E2M1 grid search (not the threshold counting of ``formats.core``).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from fp4attn.formats.stochastic import e2m1_stochastic_round, sr_quantize_mxfp4
from fp4attn.nn import QuartetLinear, quartet_linear, swap_linear_layers
from fp4attn.reference.quartet import (
    QUEST_EPS,
    QUEST_STD_FACTOR,
    QuartetRNG,
    backward_seed,
    hadamard_groups,
    hadamard_matrix,
    masked_ste_gradients,
    quartet_backward,
    quartet_forward,
    quest_exponent,
    quest_quantize,
)

GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny: intra-op threads only add contention (6x slower on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ----------------------------------------------------------------------------------------------
# Independent float64 implementation
# ----------------------------------------------------------------------------------------------
def np_hadamard(n: int) -> np.ndarray:
    i = np.arange(n)
    par = np.vectorize(lambda v: bin(v).count("1") & 1)(i[:, None] & i[None, :])
    return np.where(par == 1, -1.0, 1.0) / math.sqrt(n)


def np_blockdiag_hadamard(K: int, g: int = 32) -> np.ndarray:
    B = np.zeros((K, K))
    h = np_hadamard(g)
    for s in range(0, K, g):
        B[s:s + g, s:s + g] = h
    return B


def np_e2m1_rne(v: np.ndarray) -> np.ndarray:
    """Nearest E2M1 value by grid search; ties to the even code index; saturate at 6."""
    a = np.minimum(np.abs(v), 6.0)
    d = np.abs(a[..., None] - GRID)
    best = d.min(-1, keepdims=True)
    cand = np.isclose(d, best, rtol=0, atol=0)
    idx = np.where(cand.sum(-1) > 1, np.argmax(cand & (np.arange(8) % 2 == 0), -1), np.argmin(d, -1))
    return np.sign(v) * GRID[idx]


def np_quest(xh: np.ndarray):
    """float64 QuEST along the last dim in groups of 32: values, mask, exponent, decision slack."""
    R, K = xh.shape
    xb = xh.reshape(R, K // 32, 32)
    sigma = xb.std(-1)
    a = QUEST_STD_FACTOR * sigma + QUEST_EPS
    e = np.floor(np.log2(a))
    X = 2.0 ** e
    v = xb / X[..., None]
    vals = np_e2m1_rne(v) * X[..., None]
    mask = np.abs(v) < 6
    # relative distance of each decision to its boundary: rounding midpoints, 6 (mask), scale binade
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    av = np.abs(v)
    slack_el = np.min(np.abs(av[..., None] - mids), -1) / np.maximum(av, 1e-30)
    slack_sc = np.abs(np.log2(a) - np.round(np.log2(a)))
    slack = np.minimum(slack_el, slack_sc[..., None])
    return vals.reshape(R, K), mask.reshape(R, K), e, slack.reshape(R, K)


def np_forward(x: np.ndarray, w: np.ndarray, b=None):
    K = x.shape[1]
    B = np_blockdiag_hadamard(K)
    xq, mx, _, sx = np_quest(x @ B)
    wq, mw, _, sw = np_quest(w @ B)
    y = xq @ wq.T
    if b is not None:
        y = y + b
    return y, (xq, mx, sx), (wq, mw, sw)


def rel_l2(a, b) -> float:
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm())


# ----------------------------------------------------------------------------------------------
# Hadamard
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 32, 64, 256])
def test_hadamard_orthogonal_and_closed_form(n):
    h = hadamard_matrix(n, torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(n, dtype=torch.float64), atol=1e-14, rtol=0)
    assert torch.equal(h, h.T)
    np.testing.assert_allclose(h.numpy(), np_hadamard(n), rtol=0, atol=1e-15)


def test_hadamard_groups_random_signs_preserve_products():
    torch.manual_seed(0)
    a, b = torch.randn(5, 96), torch.randn(7, 96)
    s = torch.randint(0, 2, (96,)).float() * 2 - 1
    ah, bh = hadamard_groups(a, 32, -1, signs=s), hadamard_groups(b, 32, -1, signs=s)
    assert torch.allclose(ah @ bh.T, a @ b.T, atol=1e-5)
    # H is its own inverse (no signs), along any dim
    assert torch.allclose(hadamard_groups(hadamard_groups(a.T, 32, 0), 32, 0), a.T, atol=1e-6)
    with pytest.raises(ValueError, match="multiple"):
        hadamard_groups(torch.randn(3, 40), 32)


# ----------------------------------------------------------------------------------------------
# QuEST numbers
# ----------------------------------------------------------------------------------------------
def test_quest_scale_and_mask_hand_computed():
    # +-1 alternating: sigma = 1, a = 0.48708 -> X = 2**-2 = 0.25, codes 4 (trusted)
    g = torch.tensor([1.0, -1.0] * 16)
    vals, mask, e = quest_quantize(g[None], return_exponents=True)
    assert int(e) == -2 and torch.equal(vals[0], g) and bool(mask.all())
    # one outlier of 32 among zeros: sigma = sqrt(31), a = 2.712 -> X = 2; 32/2 = 16 saturates to 6
    g = torch.zeros(32)
    g[5] = 32.0
    vals, mask, e = quest_quantize(g[None], return_exponents=True)
    assert int(e) == 1
    assert vals[0, 5] == 12.0 and not mask[0, 5] and mask[0, :5].all() and mask[0, 6:].all()
    assert (vals[0, :5] == 0).all()
    # exact boundary of the trust mask: |x/X| = 6 is untrusted, just below is trusted
    g = torch.tensor([0.9, -0.9] * 15 + [1.5, -1.5])  # sigma = 0.9487, a = 0.462 -> X = 0.25
    assert int(quest_exponent(g.std(correction=0))) == -2
    vals, mask = quest_quantize(g[None])
    assert vals[0, 30] == 1.5 and not mask[0, 30]  # 1.5 / 0.25 = 6 exactly
    g[30] = 1.4990234375
    vals, mask = quest_quantize(g[None])
    assert vals[0, 30] == 1.5 and mask[0, 30]  # 5.996 rounds to 6 but is trusted
    # ties to even: 2.5 X -> 2 X, 3.5 X -> 4 X (X = 0.25 with sigma ~ 1)
    g = torch.tensor([0.9, -0.9] * 15 + [0.625, -0.875])  # sigma = 0.892 -> X = 0.25
    vals, _ = quest_quantize(g[None])
    assert vals[0, 30] == 0.5 and vals[0, 31] == -1.0
    # zero group -> zeros, trusted; NaN/Inf group -> NaN, untrusted; other groups unaffected
    x = torch.randn(1, 96)
    x[0, :32] = 0
    x[0, 40] = float("nan")
    vals, mask = quest_quantize(x)
    assert (vals[0, :32] == 0).all() and mask[0, :32].all()
    assert vals[0, 32:64].isnan().all() and not mask[0, 32:64].any()
    assert vals[0, 64:].isfinite().all()


def test_quest_exponent_is_exact_floor_log2():
    torch.manual_seed(1)
    sig = torch.exp(torch.empty(20000).uniform_(-40, 40)).float()
    sig = torch.cat([sig, torch.tensor([0.0, 1.0, 2.0 / QUEST_STD_FACTOR])])
    e = quest_exponent(sig)
    a = (sig * QUEST_STD_FACTOR + QUEST_EPS).double().tolist()  # the float32 value, exactly
    expect = [max(-127, min(127, math.frexp(v)[1] - 1)) for v in a]
    assert e.tolist() == expect


def test_quest_dim_argument_matches_transpose():
    torch.manual_seed(2)
    x = torch.randn(64, 6) * 3
    v0, m0 = quest_quantize(x, dim=0)
    v1, m1 = quest_quantize(x.T.contiguous(), dim=-1)
    assert torch.equal(v0, v1.T) and torch.equal(m0, m1.T)


# ----------------------------------------------------------------------------------------------
# Forward vs the float64 materialized implementation
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dist", ["normal", "heavy"])
def test_forward_matches_float64_materialized(dist):
    g = torch.Generator().manual_seed(3)
    M, K, N = 48, 128, 64
    if dist == "normal":
        x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) * 0.05
    else:  # Student-t(3) with a few large outlier channels: exercises saturation and the mask
        t = torch.distributions.StudentT(3.0)
        torch.manual_seed(3)
        x, w = t.sample((M, K)), t.sample((N, K)) * 0.05
        x[:, 7] *= 40
    b = torch.randn(N, generator=g)
    y, ctx = quartet_forward(x, w, b)
    y64, (xq64, mx64, sx), (wq64, mw64, sw) = np_forward(x.double().numpy(), w.double().numpy(),
                                                          b.double().numpy())
    # every decision agrees except where float64 sits within 1e-5 (relative) of a boundary
    for got, gm, ref, rm, slack in ((ctx.x_q, ctx.m_x, xq64, mx64, sx), (ctx.w_q, ctx.m_w, wq64, mw64, sw)):
        differ = (got.double().numpy() != ref) | (gm.numpy() != rm)
        assert (slack[differ] < 1e-5).all()
        assert differ.mean() < 1e-3
    if dist == "heavy":
        assert not ctx.m_x.all()  # the case does hit the mask
    # SPEC §6: relative L2 <= 1e-4 against the float64 implementation
    assert rel_l2(y, y64) <= 1e-4
    # the GEMM itself is float32-exact up to accumulation rounding: |err| <= K * 2**-24 * sum|a||b|
    exact = ctx.x_q.double() @ ctx.w_q.double().T + b.double()
    bound = K * 2.0 ** -24 * (ctx.x_q.double().abs() @ ctx.w_q.double().abs().T + b.double().abs())
    assert ((y.double() - exact).abs() <= bound).all()
    # dequantized operands are E2M1 values times powers of two
    for q in (ctx.x_q, ctx.w_q):
        m, _ = torch.frexp(q[q != 0].abs())
        assert set(m.unique().tolist()) <= {0.5, 0.75}


def test_forward_is_close_to_float_linear():
    torch.manual_seed(4)
    x, w = torch.randn(64, 256), torch.randn(96, 256)
    y, _ = quartet_forward(x, w)
    cos = torch.nn.functional.cosine_similarity(y.flatten(), (x @ w.T).flatten(), 0)
    assert cos > 0.97  # MXFP4 QuEST of both operands; ~0.98 measured on Gaussians


# ----------------------------------------------------------------------------------------------
# Stochastic rounding
# ----------------------------------------------------------------------------------------------
def _neighbours(v: np.ndarray):
    a = np.abs(v)
    lo = GRID[np.searchsorted(GRID, a, side="right") - 1]
    hi = GRID[np.minimum(np.searchsorted(GRID, a, side="left"), 7)]
    return lo, hi


def test_sr_picks_only_neighbours_with_exact_probability():
    v = torch.linspace(-6, 6, 4801)
    v = torch.cat([v, torch.tensor(GRID, dtype=torch.float32), -torch.tensor(GRID, dtype=torch.float32)])
    n = 256
    u = (torch.arange(n, dtype=torch.float32) / n)[:, None].expand(n, v.numel())  # stratified noise
    r = e2m1_stochastic_round(v.expand(n, -1), u).numpy()
    lo, hi = _neighbours(v.numpy())
    s = np.sign(v.numpy())
    assert ((np.abs(r) == lo) | (np.abs(r) == hi)).all()
    assert ((np.sign(r) == s) | (r == 0)).all()
    # with u = k/n, P(hi) is ceil(frac * n) / n exactly, frac = (|v| - lo)/(hi - lo)
    frac = np.where(hi > lo, (np.abs(v.numpy()) - lo) / np.where(hi > lo, hi - lo, 1), 0.0)
    p_hi = (np.abs(r) == hi).mean(0)
    p_hi = np.where(hi > lo, p_hi, 0.0)
    np.testing.assert_allclose(p_hi, np.ceil(frac * n) / n, atol=1e-12)
    # grid values are fixed points
    on_grid = torch.tensor(GRID, dtype=torch.float32)
    assert torch.equal(e2m1_stochastic_round(on_grid, torch.rand(8)), on_grid)


def test_sr_unbiased_random_noise():
    g = torch.Generator().manual_seed(5)
    v = torch.empty(2000).uniform_(-6, 6, generator=g)
    n = 4000
    r = e2m1_stochastic_round(v.expand(n, -1), torch.rand(n, v.numel(), generator=g))
    lo, hi = _neighbours(v.numpy())
    sd = np.sqrt((hi - np.abs(v.numpy())) * (np.abs(v.numpy()) - lo))  # Bernoulli sd of one draw
    z = (r.double().mean(0).numpy() - v.double().numpy()) / np.maximum(sd / math.sqrt(n), 1e-12)
    # 2000 independent ~N(0,1) statistics: P(max |z| > 5.5) < 2000 * 4e-8
    assert np.abs(z).max() < 5.5
    assert 0.85 < (z ** 2).mean() < 1.15  # chi2(2000)/2000 has sd 0.03


def test_sr_mxfp4_scales_never_clip_and_unbiased():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(16, 128, generator=g) * torch.logspace(-3, 3, 16)[:, None]
    out = sr_quantize_mxfp4(x, generator=g)
    amax = x.reshape(16, 4, 32).abs().amax(-1).double()
    expect = torch.tensor([[math.frexp(float(a))[1] - 3 for a in row] for row in amax])
    assert torch.equal(out.exponents, expect.to(torch.int32))
    scaled = out.values.reshape(16, 4, 32) / torch.ldexp(torch.ones(16, 4), out.exponents)[..., None]
    assert scaled.abs().max() <= 6.0  # 0.75 * amax / 2**e < 6: never clips
    m = torch.stack([sr_quantize_mxfp4(x, generator=g).values for _ in range(3000)]).double()
    sd = m.std(0) / math.sqrt(3000)
    z = (m.mean(0) - 0.75 * x.double()) / sd.clamp_min(1e-30)
    z = z[sd > 0]
    assert z.abs().max() < 6.0  # 2048 statistics; P(|z| > 6) ~ 2e-9 each
    # the dim argument, zero and non-finite blocks
    y = torch.randn(64, 3, generator=g)
    y[:32, 1] = 0
    y[40, 2] = float("inf")
    o = sr_quantize_mxfp4(y, dim=0, generator=g).values
    assert (o[:32, 1] == 0).all() and o[32:, 2].isnan().all() and o[:32, 2].isfinite().all()
    with pytest.raises(ValueError, match="prescale"):
        sr_quantize_mxfp4(x, prescale=0.9)


# ----------------------------------------------------------------------------------------------
# Backward: unbiasedness, variance, determinism
# ----------------------------------------------------------------------------------------------
def _np_targets(dy, ctx):
    K = ctx.x_q.shape[1]
    B = np_blockdiag_hadamard(K)
    dy = dy.double().numpy()
    dx = ((dy @ ctx.w_q.double().numpy()) * ctx.m_x.numpy()) @ B.T
    dw = ((dy.T @ ctx.x_q.double().numpy()) * ctx.m_w.numpy()) @ B.T
    return dx, dw


def test_backward_unbiased_masked_ste():
    """Mean over S seeds -> the masked straight-through gradient, per element within 6 standard errors.

    M = 40 and N = 48 are not multiples of 32 (the zero padding of the reduction dims is exercised).
    """
    g = torch.Generator().manual_seed(7)
    M, K, N, S = 40, 64, 48, 1200
    x = torch.randn(M, K, generator=g) * 2
    x[:, 3] *= 30  # outlier channel: some masked entries
    w = torch.randn(N, K, generator=g) * 0.1
    dy = torch.randn(M, N, generator=g)
    _, ctx = quartet_forward(x, w)
    assert not ctx.m_x.all()
    tdx, tdw = _np_targets(dy, ctx)
    ldx, ldw = masked_ste_gradients(dy, ctx)
    np.testing.assert_allclose(ldx.double().numpy(), tdx, rtol=1e-4, atol=1e-4 * np.abs(tdx).max())
    np.testing.assert_allclose(ldw.double().numpy(), tdw, rtol=1e-4, atol=1e-4 * np.abs(tdw).max())
    dxs, dws = [], []
    for s in range(S):
        dx, dw, db = quartet_backward(dy, ctx, torch.Generator().manual_seed(s))
        dxs.append(dx)
        dws.append(dw)
    assert torch.equal(db, dy.sum(0))
    for est, target in ((torch.stack(dxs).double(), tdx), (torch.stack(dws).double(), tdw)):
        target = torch.from_numpy(target)
        se = est.std(0) / math.sqrt(S)
        z = (est.mean(0) - target) / se
        # ~2500 statistics per tensor, CLT over 1200 draws: P(max |z| > 6) is negligible (< 1e-5)
        assert z.abs().max() < 6.0
        assert 0.8 < (z ** 2).mean() < 1.25
        # power: the same statistic flags an estimator biased by 1% (~3.3 measured) or lacking 16/9
        z_biased = (est.mean(0) * 1.01 - target) / se
        assert (z_biased ** 2).mean() > 1.5
        assert ((est.mean(0) * 9 / 16 - target) / se).abs().max() > 50
        # variance sanity: one draw is a usable gradient (relative error of a single draw)
        rel = ((est - target).norm(dim=(1, 2)) / target.norm()).mean()
        assert rel < 0.4  # ~0.22 measured


def test_backward_masked_entries_get_zero_before_inverse_hadamard():
    g = torch.Generator().manual_seed(8)
    xh = torch.randn(32, 64, generator=g)
    xh[:, 5] = 40.0  # spikes in the Hadamard domain: saturated and untrusted
    x = hadamard_groups(xh, 32, -1)  # H is its own inverse, so x H = xh
    w = torch.randn(32, 64, generator=g)
    _, ctx = quartet_forward(x, w)
    assert not ctx.m_x[:, 5].any() and ctx.m_x.float().mean() > 0.8
    dy = torch.randn(32, 32, generator=g)
    dx, _, _ = quartet_backward(dy, ctx, torch.Generator().manual_seed(0))
    back = hadamard_groups(dx, 32, -1)  # undo the inverse Hadamard: the masked gradient in H space
    assert (back[~ctx.m_x].abs() < 1e-5 * back.abs().max()).all()
    assert (back[ctx.m_x] != 0).float().mean() > 0.9


def test_backward_deterministic_given_seed():
    torch.manual_seed(9)
    x = torch.randn(2, 20, 64, requires_grad=True)
    m = QuartetLinear(64, 32, seed=123)

    def grads(step):
        m.rng.step = step
        x.grad = None
        m.zero_grad()
        m(x).square().sum().backward()
        return x.grad.clone(), m.weight.grad.clone(), m.bias.grad.clone()

    a, b, c = grads(0), grads(0), grads(1)
    assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])
    assert torch.equal(a[2], c[2])  # bias gradient is exact
    assert m.rng.step == 2
    assert backward_seed(123, 0) != backward_seed(123, 1) != backward_seed(124, 1)
    # activation checkpointing replays the forward; the gradients are those of the plain run
    from torch.utils.checkpoint import checkpoint
    for reentrant in (False, True):
        m.rng.step = 0
        x.grad = None
        m.zero_grad()
        checkpoint(lambda t: m(t), x, use_reentrant=reentrant).square().sum().backward()
        assert torch.equal(x.grad, a[0]) and torch.equal(m.weight.grad, a[1])


def test_functional_matches_module_and_checkpoint_with_global_seed():
    torch.manual_seed(10)
    m = QuartetLinear(64, 64, seed=77)
    x = torch.randn(8, 64, requires_grad=True)
    y1 = m(x)
    y2 = quartet_linear(x, m.weight, m.bias, seed=77)
    assert torch.equal(y1, y2)
    g1 = torch.autograd.grad(y1.sum(), (x, m.weight))
    g2 = torch.autograd.grad(y2.sum(), (x, m.weight))
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    # seed=None draws from the global RNG: reproducible under torch.manual_seed
    from torch.utils.checkpoint import checkpoint
    outs = []
    for ck in (False, True):
        torch.manual_seed(11)
        f = (lambda t: quartet_linear(t, m.weight))
        y = checkpoint(f, x, use_reentrant=True) if ck else f(x)
        x.grad = None
        y.sum().backward()
        outs.append(x.grad.clone())
    assert torch.equal(outs[0], outs[1])


# ----------------------------------------------------------------------------------------------
# Module API
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_module_dtypes_and_bias(dtype, bias):
    torch.manual_seed(12)
    m = QuartetLinear(96, 40, bias=bias, dtype=dtype, seed=1)
    assert isinstance(m, nn.Linear) and m.weight.dtype == dtype and (m.bias is None) == (not bias)
    x = torch.randn(3, 4, 96, dtype=dtype, requires_grad=True)
    y = m(x)
    assert y.shape == (3, 4, 40) and y.dtype == dtype
    yr, _ = quartet_forward(x.detach(), m.weight.detach(), None if m.bias is None else m.bias.detach())
    assert torch.equal(y, yr.to(dtype))
    y.float().sum().backward()
    assert x.grad.dtype == dtype and m.weight.grad.dtype == dtype
    if bias:
        assert m.bias.grad.dtype == dtype
        assert torch.allclose(m.bias.grad.float(), torch.full((40,), 12.0))


def test_module_under_autocast_computes_in_autocast_dtype():
    torch.manual_seed(16)
    m = QuartetLinear(64, 32, seed=3)
    x = torch.randn(6, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)
    assert y.dtype == torch.bfloat16
    ref, _ = quartet_forward(x.detach().bfloat16(), m.weight.detach().bfloat16(), m.bias.detach().bfloat16())
    assert torch.equal(y, ref.bfloat16())  # the float32 GEMM was not itself autocast to bf16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and m.weight.grad.dtype == torch.float32


def test_module_loads_linear_state_dict_and_validates():
    lin = nn.Linear(64, 32)
    m = QuartetLinear(64, 32)
    m.load_state_dict(lin.state_dict())
    assert torch.equal(m.weight, lin.weight)
    with pytest.raises(ValueError, match="in_features"):
        QuartetLinear(48, 32)
    with pytest.raises(ValueError, match="in_features"):
        QuartetLinear(0, 32)
    with pytest.raises(TypeError, match="out_features"):
        QuartetLinear(64, 32.0)
    with pytest.raises(ValueError, match="hadamard_group"):
        QuartetLinear(64, 32, hadamard_group=48)
    with pytest.raises(ValueError, match="in_features"):
        QuartetLinear(64, 32, hadamard_group=128)
    with pytest.raises(TypeError, match="seed"):
        QuartetLinear(64, 32, seed="x")
    with pytest.raises(ValueError, match="x.shape"):
        m(torch.randn(4, 63))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        m(torch.ones(4, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match="dtype"):
        m(torch.randn(4, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bias"):
        quartet_linear(torch.randn(2, 64), m.weight, torch.zeros(5))
    with pytest.raises(ValueError, match="weight"):
        quartet_linear(torch.randn(2, 64), torch.randn(64))
    # hadamard_group 64 works (MXFP4 groups stay 32)
    m64 = QuartetLinear(128, 32, hadamard_group=64, seed=0)
    x = torch.randn(5, 128, requires_grad=True)
    m64(x).sum().backward()
    assert x.grad.shape == x.shape


def test_weight_cache_invalidated_by_optimizer_step():
    torch.manual_seed(13)
    m = QuartetLinear(64, 32, seed=0)
    m.cache_weight = True
    x = torch.randn(4, 64)
    y0 = m(x)
    assert torch.equal(m(x), y0)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(x).sum().backward()
    opt.step()
    y1 = m(x)
    m.cache_weight = False
    assert torch.equal(y1, m(x)) and not torch.equal(y1, y0)


@pytest.mark.parametrize("opt", ["adamw_fused", "sgd_fused", "half_float", "clear"])
def test_weight_cache_sees_fused_steps_new_storage_and_clears(opt):
    """The quantized-weight cache is not fooled by fused optimizers (they update the weight without bumping its
    version counter: the optimizer-step count is in the key) nor by a new storage at the old one's address
    (model.half().float(); the key holds the storage itself); clear_weight_cache() drops it after raw writes."""
    torch.manual_seed(15)
    m = QuartetLinear(256, 64, seed=0)
    m.cache_weight = True
    x = torch.randn(8, 256)
    y0 = m(x)
    if opt in ("adamw_fused", "sgd_fused"):
        o = (torch.optim.AdamW if opt == "adamw_fused" else torch.optim.SGD)(m.parameters(), lr=0.1, fused=True)
        m(x).sum().backward()
        v = m.weight._version
        o.step()
        assert m.weight._version == v  # (the write the version counter does not see)
    elif opt == "half_float":
        with torch.no_grad():
            m.weight.mul_(1.37)
        m(x)
        m.half()
        m.float()  # the fp16-rounded weight, in a new storage (often at the freed address)
    else:
        m.weight.data.mul_(1.37)  # a raw write: neither version nor storage changes
        assert torch.equal(m(x), y0)  # (stale, as documented ...)
        m.clear_weight_cache()  # (... until cleared)
    y1 = m(x)
    m.cache_weight = False
    assert torch.equal(y1, m(x)) and not torch.equal(y1, y0)


def test_swap_linear_layers_keeps_subclasses_and_swaps_shared_modules_once():
    """nn.Linear subclasses are kept (their forward and extra parameters would be lost), warned, as is
    nn.MultiheadAttention's out_proj (a subclass its owner never calls); a module registered under two names becomes
    one QuartetLinear under both; the root itself is not swapped (warned)."""
    class Scaled(nn.Linear):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.scale = nn.Parameter(torch.tensor(10.0))

        def forward(self, x):
            return super().forward(x) * self.scale

    net = nn.Module()
    net.scaled = Scaled(64, 64)
    net.mha = nn.MultiheadAttention(64, 4)
    net.a = net.b = nn.Linear(64, 64)
    with pytest.warns(UserWarning, match="subclasses") as rec:
        swap_linear_layers(net, seed=1)
    assert "scaled" in str(rec[0].message) and "mha.out_proj" in str(rec[0].message)
    assert type(net.scaled) is Scaled and type(net.mha.out_proj) is not QuartetLinear
    assert isinstance(net.a, QuartetLinear) and net.b is net.a
    lin = nn.Linear(64, 64)
    with pytest.warns(UserWarning, match="from_linear"):
        assert swap_linear_layers(lin) is lin


def test_swap_linear_layers_with_exclusion():
    torch.manual_seed(14)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(64, 64)
            self.odd = nn.Linear(40, 64)  # in_features not a multiple of 32: kept, with a warning
            self.mlp = nn.Sequential(nn.Linear(64, 128, bias=False), nn.GELU(), nn.Linear(128, 64))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Block(), Block()])
            self.lm_head = nn.Linear(64, 100, bias=False)

    model = LM()
    w_before = model.layers[0].mlp[0].weight
    with pytest.warns(UserWarning, match="odd"):
        swap_linear_layers(model, seed=5)
    assert type(model.lm_head) is nn.Linear
    assert isinstance(model.layers[1].q_proj, QuartetLinear)
    assert isinstance(model.layers[0].mlp[2], QuartetLinear) and model.layers[0].mlp[0].bias is None
    assert model.layers[0].mlp[0].weight is w_before  # parameters shared, not copied
    assert type(model.layers[0].odd) is nn.Linear
    seeds = {m.rng.seed for m in model.modules() if isinstance(m, QuartetLinear)}
    assert len(seeds) == 6
    model2 = LM()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        swap_linear_layers(model2, exclude=("lm_head", "layers.1.*"))
    assert type(model2.layers[1].q_proj) is nn.Linear and isinstance(model2.layers[0].q_proj, QuartetLinear)
    with pytest.raises(ValueError, match="in_features"):
        swap_linear_layers(LM(), strict=True)
    with pytest.raises(TypeError, match="model"):
        swap_linear_layers("not a model")
    # the swapped model trains: a step lowers the loss of a fixed batch
    x = torch.randn(16, 64)
    loss0 = model.layers[0].mlp(x).square().mean()
    loss0.backward()
    with torch.no_grad():
        for p in model.layers[0].mlp.parameters():
            p -= 0.05 * p.grad
    assert model.layers[0].mlp(x).square().mean() < loss0


def test_rng_seed_from_global_state():
    torch.manual_seed(15)
    a = QuartetRNG()
    torch.manual_seed(15)
    b = QuartetRNG()
    assert a.seed == b.seed


# ----------------------------------------------------------------------------------------------
# Experiment / benchmark entry points (smoke)
# ----------------------------------------------------------------------------------------------
def test_quartet_train_smoke(tmp_path, capsys):
    from fp4attn.bench import quartet_train as qt

    data = tmp_path / "t.txt"
    data.write_text("To be, or not to be, that is the question.\n" * 40)
    rc = qt.main(["--data", str(data), "--device", "cpu", "--steps", "2", "--d-model", "32", "--layers", "1",
                  "--heads", "2", "--ffn", "64", "--seq", "16", "--batch", "2", "--val-batches", "1",
                  "--log-every", "0", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and (tmp_path / "quartet_train.csv").exists()
    for m in ("bf16", "quartet", "rtn"):
        assert f"| {m} |" in out
    # the swaps hit every block linear and keep the LM head
    model = qt.TinyLlama(10, 32, 1, 2, 64)
    swap_linear_layers(model, seed=0)
    assert type(model.lm_head) is nn.Linear and isinstance(model.layers[0].down_proj, QuartetLinear)
    model = qt.swap_rtn(qt.TinyLlama(10, 32, 1, 2, 64))
    assert type(model.lm_head) is nn.Linear and isinstance(model.layers[0].q_proj, qt.RTNLinear)


def test_bench_linear_needs_cuda(capsys):
    from fp4attn.bench import linear

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the benchmark would run")
    assert linear.main(["--shapes", "64x64x64"]) == 2
    assert linear.parse_shapes("1x2x3, 4x5x6") == [(1, 2, 3), (4, 5, 6)]


def test_second_derivatives_are_refused_not_wrong():
    """The Quartet and Attn-QAT backward passes are first-order (stochastic rounding / straight-through estimators):
    differentiating them again raises instead of returning zeros or meaningless values."""
    import fp4attn

    m = QuartetLinear(64, 32, seed=0)
    x = torch.randn(4, 64, requires_grad=True)
    g, = torch.autograd.grad(m(x).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()
    q = torch.randn(1, 2, 32, 32, requires_grad=True)
    g, = torch.autograd.grad(fp4attn.attn_qat(q, q, q).square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()
