"""The reference implementations against independent, fully materialized float64 implementations.

SPEC §6: the CPU reference path matches an independent float64 implementation to relative
L2 <= 1e-4 for float32 inputs. The independent versions below share only the element quantizer
(tested on its own in test_formats.py) and ThriftAttention's budget→k rule (``budget_to_k``, pinned by
test_budget_to_k_rules), take the recipes from their own table (``RECIPES``, checked against the library's), and
are written the slow, obvious way: full N×N matrices, explicit loops over heads, blocks and tiles.
"""

import math

import pytest
import torch

import fp4attn
from fp4attn import reference
from fp4attn.reference.thrift import budget_to_k

TOL = 1e-4


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def phi(x, fmt, dim):
    """FP4 fake quantization of a float64 tensor (quantizer runs in float32, values exact)."""
    return fp4attn.fake_quantize(x.float(), fmt, dim=dim).double()


def kv_for_head(x, h, hq):
    return x[:, h // (hq // x.shape[1])]


def causal_mask(nq, nk):
    i = torch.arange(nq).view(-1, 1)
    j = torch.arange(nk).view(1, -1)
    return j <= i + nk - nq


def indep_quant_p(p, fmt, two_level):
    if not two_level:
        return phi(p, fmt, -1)
    out = torch.zeros_like(p)
    for t0 in range(0, p.shape[-1], 64):
        tile = p[..., t0:t0 + 64]
        s1 = tile.amax(-1, keepdim=True) / (448.0 * 6.0)
        safe = torch.where(s1 > 0, s1, torch.ones_like(s1))
        out[..., t0:t0 + 64] = torch.where(s1 > 0, phi(tile / safe, fmt, -1) * s1, torch.zeros_like(tile))
    return out


# SPEC §3's recipes, written out here (not read from the code under test): fmt, quantized, smooth_q, smooth_k,
# two_level_p
RECIPES = {
    "nvfp4": ("nvfp4", True, False, False, False),  # Attn-QAT Algorithm 1
    "mxfp4": ("mxfp4", True, False, False, False),  # the same with MXFP4
    "sage3": ("nvfp4", True, True, True, True),  # SageAttention3: both smoothings, two-level P
    "bf16": (None, False, False, False, False),  # unquantized
}


def test_recipe_table_is_the_spec():
    """The library's recipe table (which the kernel tests read their flags from) is SPEC §3's."""
    assert reference.RECIPES == RECIPES
    for name, flags in RECIPES.items():
        assert reference.recipe_flags(name) == flags
        assert reference.recipe_flags(name, True, False, True) == (*flags[:2], True, False, True)  # the overrides


def indep_attention(q, k, v, *, recipe, causal=False, scale=None, sq=None, sk=None, tl=None):
    fmt, quantized, sq0, sk0, tl0 = RECIPES[recipe]
    sq = sq0 if sq is None else sq
    sk = sk0 if sk is None else sk
    tl = tl0 if tl is None else tl
    q, k, v = q.double(), k.double(), v.double()
    B, hq, nq, D = q.shape
    nk = k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    outs, lses = [], []
    for h in range(hq):
        qh, kh, vh = q[:, h], kv_for_head(k, h, hq), kv_for_head(v, h, hq)
        lse_add = 0.0
        if sk:
            kbar = kh.mean(dim=1, keepdim=True)
            kh = kh - kbar
            lse_add = scale * (qh @ kbar.transpose(-1, -2))[..., 0]
        corr = torch.zeros(B, nq, nk, dtype=torch.float64)
        if sq:
            qs = qh.clone()
            for b0 in range(0, nq, 128):
                qbar = qh[:, b0:b0 + 128].mean(dim=1, keepdim=True)
                qs[:, b0:b0 + 128] = qh[:, b0:b0 + 128] - qbar
                corr[:, b0:b0 + 128] = scale * (qbar @ kh.transpose(-1, -2))
            qh = qs
        if quantized:
            qf, kf, vf = phi(qh, fmt, -1), phi(kh, fmt, -1), phi(vh, fmt, -2)
        else:
            qf, kf, vf = qh, kh, vh
        s = scale * qf @ kf.transpose(-1, -2) + corr
        if causal:
            s = s.masked_fill(~causal_mask(nq, nk), float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.nan_to_num(m, neginf=0.0))
        l = p.sum(-1, keepdim=True)
        pq = indep_quant_p(p, fmt, tl) if quantized else p
        o = torch.nan_to_num((pq @ vf) / l)
        outs.append(o)
        lses.append((m + torch.log(l))[..., 0] + lse_add)
    return torch.stack(outs, 1), torch.stack(lses, 1)


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp4", "sage3", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_independent(recipe, causal):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 150, 48)
    k = torch.randn(2, 2, 170, 48) + 0.5  # key bias: smoothing matters
    v = torch.randn(2, 2, 170, 48)
    out, lse = reference.attention(q, k, v, recipe=recipe, causal=causal, return_lse=True)
    ref, ref_lse = indep_attention(q, k, v, recipe=recipe, causal=causal)
    assert out.dtype == torch.float32
    assert rel_l2(out, ref) <= TOL
    assert rel_l2(lse, ref_lse) <= TOL


@pytest.mark.parametrize("flags", [dict(sq=True), dict(sk=True), dict(tl=True), dict(sq=True, sk=True)])
def test_attention_override_flags(flags):
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 200, 64), torch.randn(1, 2, 130, 64) * 2, torch.randn(1, 2, 130, 64)
    out = reference.attention(q, k, v, recipe="nvfp4", smooth_q=flags.get("sq"), smooth_k=flags.get("sk"),
                              two_level_p=flags.get("tl"))
    ref, _ = indep_attention(q, k, v, recipe="nvfp4", **flags)
    assert rel_l2(out, ref) <= TOL


def test_attention_chunking_is_exact(monkeypatch):
    """Row chunks keep one-shot semantics: tiny chunks give the same result as one big chunk."""
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 2, 97, 32), torch.randn(1, 2, 75, 32), torch.randn(1, 2, 75, 32)
    full = reference.attention(q, k, v, recipe="sage3", causal=True)
    import fp4attn.reference.common as common
    monkeypatch.setattr(common, "CHUNK_ELEMS", 2 * 75 * 3)  # 3 rows per chunk
    assert len(list(common.row_chunks(1, 2, 97, 75))) == 33
    chunked = reference.attention(q, k, v, recipe="sage3", causal=True)
    # not bit-equal: BLAS sums a 3-row product in another order than a 97-row one (float32
    # rounding, ~1e-7); a semantic difference (running max instead of the row max) would be ~1e-2
    assert rel_l2(chunked, full) <= 1e-5


def test_long_sequence_memory_is_bounded():
    """A 32k-token attention runs without materializing N×N (32k² float32 would be 4 GiB)."""
    import resource
    torch.manual_seed(3)
    n = 32768
    q = torch.randn(1, 1, 64, 32)  # a few queries against 32k keys keeps the test fast
    k, v = torch.randn(1, 1, n, 32), torch.randn(1, 1, n, 32)
    out = reference.attention(q, k, v, recipe="nvfp4")
    assert torch.isfinite(out).all()
    rows = list(reference.common.row_chunks(1, 1, n, n))
    assert max(r1 - r0 for r0, r1 in rows) * n <= reference.common.CHUNK_ELEMS
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 8 * 1024 * 1024  # KiB: < 8 GiB


# ------------------------------------------------------------------------------------- Attn-QAT
def indep_attn_qat(q, k, v, do, *, fmt, causal, hp_o=True, qp_bwd=True, naive=False):
    q, k, v, do = q.double(), k.double(), v.double(), do.double()
    B, hq, nq, D = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D)
    O, dq = torch.zeros(B, hq, nq, D, dtype=torch.float64), torch.zeros(B, hq, nq, D, dtype=torch.float64)
    dk, dv = torch.zeros(B, hkv, nk, D, dtype=torch.float64), torch.zeros(B, hkv, nk, D, dtype=torch.float64)
    for h in range(hq):
        g = h // (hq // hkv)
        qf, kf, vf = phi(q[:, h], fmt, -1), phi(k[:, g], fmt, -1), phi(v[:, g], fmt, -2)
        s = scale * qf @ kf.transpose(-1, -2)
        if causal:
            s = s.masked_fill(~causal_mask(nq, nk), float("-inf"))
        m = s.amax(-1, keepdim=True)
        pt = torch.exp(s - m)
        l = pt.sum(-1, keepdim=True)
        o = (phi(pt, fmt, -1) @ vf) / l
        o_p = (pt @ vf) / l
        lse = m + torch.log(l)
        O[:, h] = o
        if naive:
            qf, kf, vf = q[:, h], k[:, g], v[:, g]
            s = scale * qf @ kf.transpose(-1, -2)
            if causal:
                s = s.masked_fill(~causal_mask(nq, nk), float("-inf"))
        p = torch.exp(s - lse)
        d = (do[:, h] * (o if (naive or not hp_o) else o_p)).sum(-1, keepdim=True)
        pv = phi(p, fmt, -1) if (qp_bwd and not naive) else p
        dv[:, g] += pv.transpose(-1, -2) @ do[:, h]
        ds = p * (do[:, h] @ vf.transpose(-1, -2) - d)
        dq[:, h] = scale * ds @ kf
        dk[:, g] += scale * ds.transpose(-1, -2) @ qf
    return O, dq, dk, dv


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("switches", [dict(), dict(hp_o=False), dict(qp_bwd=False), dict(naive=True)])
def test_attn_qat_forward_backward_match_independent(fmt, causal, switches):
    torch.manual_seed(4)
    q = torch.randn(1, 4, 70, 32)
    k = torch.randn(1, 2, 90, 32)
    v = torch.randn(1, 2, 90, 32)
    do = torch.randn(1, 4, 70, 32)
    o, o_p, lse = reference.attn_qat_forward(q, k, v, causal=causal, fmt=fmt)
    dq, dk, dv = reference.attn_qat_backward(
        do, q, k, v, o, o_p, lse, causal=causal, fmt=fmt, high_precision_o=switches.get("hp_o", True),
        quantize_p_in_backward=switches.get("qp_bwd", True),
        backward="naive" if switches.get("naive") else "qat")
    ref_o, rdq, rdk, rdv = indep_attn_qat(q, k, v, do, fmt=fmt, causal=causal, **switches)
    assert rel_l2(o, ref_o) <= TOL
    for got, ref in ((dq, rdq), (dk, rdk), (dv, rdv)):
        assert rel_l2(got, ref) <= TOL


def test_attn_qat_backward_equals_autograd_of_high_precision_path():
    """With P unquantized in the backward and D from O', Algorithm 3 is exactly the autograd gradient
    of softmax(scale·ϕ(Q)ϕ(K)ᵀ)·ϕ(V) with straight-through ϕ — checked with torch.autograd."""
    torch.manual_seed(5)
    q = torch.randn(1, 2, 40, 32, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 50, 32, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 50, 32, dtype=torch.float64, requires_grad=True)
    do = torch.randn(1, 2, 40, 32, dtype=torch.float64)
    qf = fp4attn.fake_quantize(q, dim=-1)
    kf = fp4attn.fake_quantize(k, dim=-1)
    vf = fp4attn.fake_quantize(v, dim=-2)
    o_prime = torch.softmax(qf @ kf.transpose(-1, -2) / math.sqrt(32), -1) @ vf
    o_prime.backward(do)
    o, o_p, lse = reference.attn_qat_forward(q.detach(), k.detach(), v.detach())
    assert rel_l2(o_p, o_prime.detach()) <= 1e-10
    dq, dk, dv = reference.attn_qat_backward(do, q.detach(), k.detach(), v.detach(), o, o_p, lse,
                                             quantize_p_in_backward=False)
    for got, ref in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert rel_l2(got, ref) <= 1e-10


def test_attn_qat_fully_masked_rows_no_nan():
    q, k, v = torch.randn(1, 1, 20, 16), torch.randn(1, 1, 8, 16), torch.randn(1, 1, 8, 16)
    o, o_p, lse = reference.attn_qat_forward(q, k, v, causal=True)
    assert torch.all(o[0, 0, :12] == 0) and torch.isinf(lse[0, 0, :12]).all()
    dq, dk, dv = reference.attn_qat_backward(torch.randn_like(q), q, k, v, o, o_p, lse, causal=True)
    assert all(torch.isfinite(t).all() for t in (o, dq, dk, dv))
    assert torch.all(dq[0, 0, :12] == 0)


# ------------------------------------------------------------------------------------- Thrift
def indep_thrift(q, k, v, *, causal, budget, bs=64, fmt="nvfp4"):
    q, k, v = q.double(), k.double(), v.double()
    B, hq, nq, D = q.shape
    nk = k.shape[2]
    scale = 1 / math.sqrt(D)
    nqb, nkb = -(-nq // bs), -(-nk // bs)
    kk = budget_to_k(budget, nkb, causal)
    out = torch.zeros(B, hq, nq, D, dtype=torch.float64)
    for b in range(B):
        for h in range(hq):
            qh, kh, vh = q[b, h], kv_for_head(k, h, hq)[b], kv_for_head(v, h, hq)[b]
            qf, kf, vf = phi(qh, fmt, -1), phi(kh, fmt, -1), phi(vh, fmt, -2)
            s = torch.empty(nq, nk, dtype=torch.float64)
            selm = torch.zeros(nq, nk, dtype=torch.bool)
            for i in range(nqb):
                qi = slice(i * bs, min(nq, i * bs + bs))
                qbar = qh[qi].float().mean(0).double()
                cands = []
                for j in range(nkb):
                    kj = slice(j * bs, min(nk, j * bs + bs))
                    visible = (not causal) or (j * bs <= qi.stop - 1 + nk - nq)
                    if visible:
                        cands.append((-(qbar @ kh[kj].float().mean(0).double()).item(), j))
                for _, j in sorted(cands)[:kk]:
                    selm[qi, j * bs:min(nk, j * bs + bs)] = True
            s16 = scale * qh @ kh.T
            s4 = scale * qf @ kf.T
            s = torch.where(selm, s16, s4)
            if causal:
                s = s.masked_fill(~causal_mask(nq, nk), float("-inf"))
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            l = p.sum(-1, keepdim=True)
            o = torch.where(selm, p, 0.0) @ vh + indep_quant_p(torch.where(selm, 0.0, p), fmt, True) @ vf
            out[b, h] = o / l
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("budget", [0.1, 0.3, 1.0])
def test_thrift_matches_independent(causal, budget):
    torch.manual_seed(6)
    q, k, v = torch.randn(1, 2, 300, 32), torch.randn(1, 1, 300, 32), torch.randn(1, 1, 300, 32)
    out = reference.thrift_attention(q, k, v, causal=causal, budget=budget)
    ref = indep_thrift(q, k, v, causal=causal, budget=budget)
    assert rel_l2(out, ref) <= TOL


def test_thrift_full_budget_is_unquantized_attention():
    torch.manual_seed(7)
    q, k, v = torch.randn(1, 2, 130, 32), torch.randn(1, 2, 130, 32), torch.randn(1, 2, 130, 32)
    for causal in (False, True):
        a = reference.thrift_attention(q, k, v, causal=causal, budget=1.0)
        b = reference.attention(q, k, v, causal=causal, recipe="bf16")
        assert rel_l2(a, b) <= 1e-6


def test_thrift_selection_ties_go_to_lower_index():
    q = torch.ones(1, 1, 64, 16)
    k = torch.ones(1, 1, 256, 16)  # all four key blocks tie
    sel = reference.select_blocks(q, k, causal=False, budget=0.5, block_size=64)
    assert sel[0, 0, 0].tolist() == [True, True, False, False]


def test_budget_to_k_rules():
    assert budget_to_k(0.05, 64, False) == 3          # round(3.2)
    assert budget_to_k(0.05, 10, False) == 1          # round(0.5) = 0 -> clamped to 1
    assert budget_to_k(1.0, 7, False) == 7
    assert budget_to_k(1.0, 7, True) == 7
    assert budget_to_k(1e-6, 7, True) == 1
    for n in (1, 5, 16, 64):
        for f in (0.05, 0.1, 0.25, 0.5, 0.9):
            k = budget_to_k(f, n, True)
            def share(kk, n=n):
                return (kk * n - kk * (kk - 1) / 2) / (n * (n + 1) / 2)
            assert all(abs(share(k) - f) <= abs(share(j) - f) for j in range(1, n + 1))
    assert budget_to_k(0.25, 64, True) == 9           # share(9) = 540/2080 = 0.2596


def test_attn_qat_lse_gradient():
    """A loss on the returned LSE flows back as dS += P·dlse (dLSE/dS = P); checked against autograd
    of logsumexp over the fake-quantized scores."""
    torch.manual_seed(8)
    q = torch.randn(1, 2, 30, 32, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 40, 32, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 40, 32, dtype=torch.float64)
    w = torch.randn(1, 2, 30, dtype=torch.float64)
    _, lse = reference.attn_qat_reference(q, k, v)
    (lse.double() * w).sum().backward()
    q2, k2 = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
    s = fp4attn.fake_quantize(q2, dim=-1) @ fp4attn.fake_quantize(k2, dim=-1).transpose(-1, -2) / math.sqrt(32)
    (torch.logsumexp(s, -1) * w).sum().backward()
    # the op returns LSE as float32 (SPEC §3), so dlse reaches the backward rounded to float32 (~1e-8)
    assert rel_l2(q.grad, q2.grad) <= 1e-6 and rel_l2(k.grad, k2.grad) <= 1e-6
