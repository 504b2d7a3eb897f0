"""ThriftAttention prefill kernels (SPEC §3 ``thrift_attention``, issue 5): selection + one fused kernel.

1. ``_block_mean_kernel``: FP32 means of Q and K over blocks of ``block_size`` (= 64) tokens, a tail block
   averaging its valid tokens (as ``reference.thrift.block_means``).
2. ``_select_kernel``: one program per (sequence, query head, query block i): Ŝᵢⱼ = Q̄ᵢ·K̄ⱼ for every key
   block j (kv head of the GQA group), invisible blocks (bottom-right causal, a sliding window's edges) at
   −inf, then the top-k by k rounds of argmax (the first maximum wins: ties go to the lower index, as the
   reference's stable sort).
   Writes the selected indices (B, Hq, nqb, k) (−1 padded) and a (B, Hq, nqb, nkb) int8 mask.
3. ``_thrift_fwd_kernel``: one program per (query block, sequence·head), BLOCK_M = BLOCK_N = 64 (the
   Thrift block), one online softmax in two phases:

   * **FP4 phase** over every visible key tile (a window's tiles only): S = scale·Q̂K̂ᵀ from the fake-quantized
     operands (NVFP4 values are exact in fp16/bf16: tensor-core products are the FP4 products), the
     tiles selected for this query block masked out (−inf), two-level P (s1 = rowmax(P̃ tile)/(448·6),
     O += s1·ϕ(P̃/s1)·V̂).
   * **16-bit phase** over the k selected tiles only (their indices, not a scan): the 16-bit Q tile is
     loaded here (scoped to this phase), S from the input-dtype q, k (FP32 accumulate), unquantized P̃
     and V. Tiles of no selected block are never loaded in 16 bits.

   The FP4 operands come from the committed Attn-QAT quantization pre-pass
   (``kernels.attn_qat.prep``: fake-quantized, zero-padded (B, H, N_pad, D_pad) buffers) and the 16-bit
   ones from its copy mode. Masked selected tiles keep the FP4 loop free of branches (it pipelines); they
   cost ~budget of extra FP4 MMA work.

   A sliding window (``window``: query i sees keys i + LOFF <= j <= i + COFF, ``_tiles.window_offsets``)
   starts the FP4 loop at the window's first tile; every FP4 and 16-bit tile is masked per key. Attention
   sinks (``SINKS``, the (Hq,) logits in score units, taken to log2 units in the kernel) start each row's online
   softmax at the sink:
   m = sink, l = 1 (the two-level P̃/s1 of a tile does not depend on m, so the FP4 values do not move).

   On sm_90 (D padded to 64 / 128; windows of >= 512 keys; ``gluon_fp4_phase``) the FP4 phase runs first, on the Gluon
   attention pass (``attention_gluon``: two-level P, the selected tiles masked out, FP32 output rows and their
   LSE), and this kernel (``FP4_IN``) starts from that state: acc = O, m = LSE (log2 units), l = 1, the sink
   merged in as one more key. Two-level P̃/s1 does not depend on the running max, so the split moves no
   quantization decision (that pass rounds P̃/s1 at float16 precision). 1.35x -> 1.04x the nvfp4 op's time at
   (4,16,16384,128) causal, 5% (H100, BENCHMARKS.md, thirty-eighth session).

``DOT_F32`` (the interpreter) runs the same values through FP32 dots.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..formats import triton_helpers as _th
from ..formats.triton_helpers import fake_quant_p
from ..ops._dispatch import interpreting as _interpret
from ..reference.thrift import selected_per_block
from . import attention as _attention
from ._launch import cdiv, fast, head_grid, next_pow2
from ._tiles import (
    LOG2E,
    LOG2E_K,
    causal_key_range,
    head_program,
    load_bhsd_rows,
    online_softmax_step,
    program_rows,
    sink_start,
    softmax_finish,
    two_level_scale,
    two_level_step,
    visible,
    window_key_range,
    window_offsets,
)
from .attn_qat import head_dim_padded, pad_tokens, prep

if not isinstance(_th._RINT_MAGIC, tl.constexpr):
    _th._RINT_MAGIC = tl.constexpr(_th._RINT_MAGIC)  # same workaround as kernels/attn_qat.py

BLOCK = 64  # the Thrift block (queries and keys); the kernels require block_size == 64


# =================================================================================================
# 1-2. Selection
# =================================================================================================
@triton.jit
def _block_mean_kernel(X, M, sx_b, sx_h, sx_n, H, N, NB, D,
                       BS: tl.constexpr, DP: tl.constexpr):
    j, bh, b, h, rows = program_rows(H, BS)
    cols = tl.arange(0, DP)
    x, _ = load_bhsd_rows(X, sx_b, sx_h, sx_n, 1, b, h, rows, N, D, DP)
    cnt = tl.minimum(N - j * BS, BS).to(tl.float32)
    tl.store(M + (bh.to(tl.int64) * NB + j) * DP + cols, tl.sum(x, 0) / cnt)


@triton.jit
def _select_kernel(QM, KM, SELI, SELM, Hq, GROUP, NQB, NKB, Nq, Nk, KSEL, COFF, LOFF,
                   CAUSAL: tl.constexpr, WINDOW: tl.constexpr, NKB_P2: tl.constexpr, CH: tl.constexpr,
                   DP: tl.constexpr, KMAX_P2: tl.constexpr):
    i, bh = head_program()
    b = bh // Hq
    h = bh % Hq
    kvh = b * (Hq // GROUP) + h // GROUP
    idx = tl.arange(0, NKB_P2)
    # key blocks with a key visible to some query of block i: [first_vis, n_vis) (query r sees keys
    # r + LOFF <= j <= r + COFF: COFF = Nk - Nq causal, + a window's right extent)
    if CAUSAL:
        hi_key = tl.minimum(i * 64 + 64, Nq) - 1 + COFF  # the block's last visible key (< 0: none; integer
        n_vis = tl.where(hi_key < 0, 0, tl.minimum(hi_key // 64 + 1, NKB))  # division truncates toward 0)
    else:
        n_vis = NKB
    vis = idx < n_vis
    if WINDOW:
        vis = vis & (idx >= tl.maximum(i * 64 + LOFF, 0) // 64)
    # Ŝ for every key block at once, accumulated over chunks of CH channels (a (NKB_P2, CH) tile in
    # registers; an earlier version scattered chunks of key blocks into the vector at O(NKB·CH) each)
    scores = tl.zeros([NKB_P2], tl.float32)
    for d0 in range(0, DP, CH):
        dc = d0 + tl.arange(0, CH)
        km = tl.load(KM + (kvh.to(tl.int64) * NKB + idx)[:, None] * DP + dc[None, :],
                     mask=(idx < NKB)[:, None], other=0.0)
        scores += tl.sum(km * tl.load(QM + (bh.to(tl.int64) * NQB + i) * DP + dc)[None, :], 1)
    scores = tl.where(vis, scores, float("-inf"))
    kidx = tl.arange(0, KMAX_P2)
    chosen = tl.full([KMAX_P2], -1, tl.int32)
    for t in range(0, KMAX_P2):
        best = tl.max(scores, 0)
        j = tl.argmax(scores, 0, tie_break_left=True).to(tl.int32)
        ok = (tl.where(KSEL > t, best, float("-inf")) > float("-inf")).to(tl.int32)
        chosen = tl.where((kidx == t).to(tl.int32) * ok != 0, j, chosen)
        scores = tl.where((idx == j).to(tl.int32) * ok != 0, float("-inf"), scores)
    base = (bh.to(tl.int64) * NQB + i)
    tl.store(SELI + base * KMAX_P2 + kidx, chosen)
    mask = tl.max(((idx[:, None] == chosen[None, :]) & (chosen[None, :] >= 0)).to(tl.int32), 1)
    tl.store(SELM + base * NKB + idx, mask.to(tl.int8), mask=idx < NKB)


def select(q: torch.Tensor, k: torch.Tensor, *, causal: bool, budget: float, window=None):
    """(indices (B, Hq, nqb, KMAX) int32 −1 padded, mask (B, Hq, nqb, nkb) bool, k) for bhsd q, k;
    ``window``: a normalized sliding window (``reference.common.normalize_window``) or None."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    nqb, nkb = cdiv(Nq, BLOCK), cdiv(Nk, BLOCK)
    DP = next_pow2(max(D, 16))
    # every entry written by _block_mean_kernel (padded channels as 0): no memset
    qm = torch.empty(B, Hq, nqb, DP, device=q.device, dtype=torch.float32)
    km = torch.empty(B, Hkv, nkb, DP, device=q.device, dtype=torch.float32)
    for x, m, H, N, nb in ((q, qm, Hq, Nq, nqb), (k, km, Hkv, Nk, nkb)):
        if x.stride(-1) != 1:
            x = x.contiguous()
        fast(_block_mean_kernel)[head_grid(nb, B * H)](x, m, x.stride(0), x.stride(1), x.stride(2), H, N, nb, D,
                                                       BS=BLOCK, DP=DP, num_warps=4)
    kk = selected_per_block(budget, Nq, Nk, BLOCK, causal, window)
    right, coff, left, loff = window_offsets(window, causal, Nq, Nk)
    kmax = next_pow2(kk)
    seli = torch.empty(B, Hq, nqb, kmax, device=q.device, dtype=torch.int32)
    selm = torch.empty(B, Hq, nqb, nkb, device=q.device, dtype=torch.int8)
    fast(_select_kernel)[head_grid(nqb, B * Hq)](qm, km, seli, selm, Hq, Hq // Hkv, nqb, nkb, Nq, Nk, kk, coff, loff,
                                                 CAUSAL=right, WINDOW=left, NKB_P2=next_pow2(nkb),
                                                 CH=max(1, min(DP, 8192 // next_pow2(nkb))), DP=DP,
                                                 KMAX_P2=kmax, num_warps=4)
    return seli, selm.view(torch.bool), kk  # the kernel writes 0 / 1: a bool view, no conversion launched


# =================================================================================================
# 3. Fused mixed-precision forward
# =================================================================================================
@triton.jit
def _fp4_tile(start_n, acc, l_i, m_i, tau, q, Kf, Vf, SELM, kv_off, sel_base, offs_m, Nk, NKB, causal_off, left_off,
              qk_scale, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DP: tl.constexpr):
    """One key tile of the FP4 phase (the tile masked out when it is selected for this query block), two-level
    P through ``two_level_step`` (acc in units of the last tile's s1)."""
    BLOCK_N: tl.constexpr = 64
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    kT = tl.load(Kf + kv_off + (start_n + offs_n)[None, :] * DP + offs_d[:, None])
    s = tl.dot(q, kT) * qk_scale
    ok = visible(start_n + offs_n, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW)
    sel_t = tl.load(SELM + sel_base * NKB + start_n // BLOCK_N)
    ok = ok & (sel_t == 0)
    s = tl.where(ok, s, float("-inf"))
    p2, pre, tau, m_new, l_i = two_level_step(s, m_i, l_i, tau, True)  # p2 = P̃/s1
    v = tl.load(Vf + kv_off + (start_n + offs_n)[:, None] * DP + offs_d[None, :])
    acc = tl.dot(fake_quant_p(p2, 16, False).to(v.dtype), v, acc * pre[:, None])
    return acc, l_i, m_new, tau


@triton.jit
def _fp4_phase(acc, l_i, m_i, tau, Qf, Kf, Vf, SELM, q_off, kv_off, sel_base, offs_m, lo, hi, Nk, NKB, COFF, LOFF,
               qk_scale, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, DP: tl.constexpr, DOT_F32: tl.constexpr,
               N_KT: tl.constexpr):
    """The FP4 phase in this kernel: every visible key tile (``lo`` .. ``hi``), the ones selected for this
    query block masked out; returns (acc, l, m) with acc back in the online softmax's units (relative to m)."""
    BLOCK_N: tl.constexpr = 64
    offs_d = tl.arange(0, DP)
    q = tl.load(Qf + q_off + offs_m[:, None] * DP + offs_d[None, :])
    if DOT_F32:
        # the interpreter cannot loop over program-id dependent bounds: fixed trip count + guard
        for it in range(0, N_KT):
            if (it * BLOCK_N >= lo) & (it * BLOCK_N < hi):
                acc, l_i, m_i, tau = _fp4_tile(it * BLOCK_N, acc, l_i, m_i, tau, q, Kf, Vf, SELM, kv_off, sel_base,
                                               offs_m, Nk, NKB, COFF, LOFF, qk_scale, CAUSAL, WINDOW, DP)
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i, tau = _fp4_tile(start_n, acc, l_i, m_i, tau, q, Kf, Vf, SELM, kv_off, sel_base, offs_m,
                                           Nk, NKB, COFF, LOFF, qk_scale, CAUSAL, WINDOW, DP)
    return acc * two_level_scale(tau, m_i)[:, None], l_i, m_i


@triton.jit
def _thrift_fwd_kernel(Qf, Kf, Vf, Qx, Kx, Vx, SELI, SELM, O, LSE, SINK, O4, LSE4,
                       so_b, so_h, so_n, so_d,
                       qk_scale, Hq, GROUP, Nq, Nk, NQP, NKP, NQB, NKB, D, KSEL, COFF, LOFF,
                       CAUSAL: tl.constexpr, WINDOW: tl.constexpr, SINKS: tl.constexpr, KMAX_P2: tl.constexpr,
                       DP: tl.constexpr, DOT_F32: tl.constexpr, N_KT: tl.constexpr, FP4_IN: tl.constexpr = False):
    BLOCK_M: tl.constexpr = 64
    BLOCK_N: tl.constexpr = 64
    i, pid_bh = head_program()
    b = pid_bh // Hq
    h = pid_bh % Hq
    kv_bh = b * (Hq // GROUP) + h // GROUP
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    q_off = pid_bh.to(tl.int64) * NQP * DP
    kv_off = kv_bh.to(tl.int64) * NKP * DP
    # query r sees keys r + LOFF <= j <= r + COFF (COFF = Nk - Nq causal, + a window's right extent; LOFF
    # with WINDOW only)
    hi, full_end = causal_key_range(i * BLOCK_M, COFF, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    lo, _, _ = window_key_range(i * BLOCK_M, LOFF, hi, full_end, BLOCK_M, BLOCK_N, WINDOW)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if SINKS:  # the sink joins the softmax as a key with no value: start from it (exp2(sk - sk) = 1)
        sk = tl.load(SINK + h).to(tl.float32) * LOG2E_K  # SINK: the (Hq,) sinks in score units
        m_i, l_i = sink_start(tl.zeros([BLOCK_M], tl.float32) + sk, m_i, True)
    acc = tl.zeros([BLOCK_M, DP], tl.float32)
    tau = tl.full([BLOCK_M], float("-inf"), tl.float32)  # two-level P: the last FP4 tile's row max
    sel_base = (pid_bh.to(tl.int64) * NQB + i)
    if FP4_IN:
        # ---- the FP4 phase ran before (the Gluon pass, ``thrift_mask``): its normalized rows O4 and their
        # LSE4 are the same online softmax state as (acc = O4, m = LSE4 in log2 units, l = 1), merged here
        # with the sink (if any) as one more key with no value
        ok_m = offs_m < Nq
        lse4 = tl.load(LSE4 + pid_bh.to(tl.int64) * NQP + offs_m) * LOG2E_K
        o4 = tl.load(O4 + b.to(tl.int64) * so_b + h.to(tl.int64) * so_h + offs_m[:, None].to(tl.int64) * so_n
                     + offs_d[None, :] * so_d, mask=ok_m[:, None] & (offs_d[None, :] < D), other=0.0)
        m_new = tl.maximum(m_i, lse4)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        a4 = tl.math.exp2(lse4 - m_use)  # 0 for rows that saw no FP4 key (LSE4 = -inf)
        a0 = tl.math.exp2(m_i - m_use)  # the sink's share (0 without one)
        acc = o4 * a4[:, None]
        l_i = l_i * a0 + a4
        m_i = m_new
    else:
        acc, l_i, m_i = _fp4_phase(acc, l_i, m_i, tau, Qf, Kf, Vf, SELM, q_off, kv_off, sel_base, offs_m, lo, hi,
                                   Nk, NKB, COFF, LOFF, qk_scale, CAUSAL, WINDOW, DP, DOT_F32, N_KT)
    # ---- 16-bit phase: only the selected tiles; the 16-bit Q tile lives here ----------------------
    q16 = tl.load(Qx + q_off + offs_m[:, None] * DP + offs_d[None, :])
    for t in range(0, KMAX_P2):
        j = tl.load(SELI + sel_base * KMAX_P2 + t)
        if j >= 0:
            start_n = j * BLOCK_N
            kT = tl.load(Kx + kv_off + (start_n + offs_n)[None, :] * DP + offs_d[:, None])
            if DOT_F32:
                s = tl.dot(q16.to(tl.float32), kT.to(tl.float32)) * qk_scale
            else:
                s = tl.dot(q16, kT) * qk_scale
            s = tl.where(visible(start_n + offs_n, offs_m, Nk, COFF, CAUSAL, LOFF, WINDOW), s, float("-inf"))
            p, alpha, m_new, l_i = online_softmax_step(s, m_i, l_i, True)
            v = tl.load(Vx + kv_off + (start_n + offs_n)[:, None] * DP + offs_d[None, :])
            if DOT_F32:
                pv = tl.dot(p, v.to(tl.float32))
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
    inv_l, lse = softmax_finish(l_i, m_i)
    tl.store(LSE + pid_bh.to(tl.int64) * NQP + offs_m, lse)
    o = acc * inv_l[:, None]
    o_ptrs = (O + b.to(tl.int64) * so_b + h.to(tl.int64) * so_h + offs_m[:, None].to(tl.int64) * so_n
              + offs_d[None, :] * so_d)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D))


def thrift_fwd(q, k, v, *, causal: bool, scale: float, budget: float, selection=None, window=None, sinks=None,
               num_warps: int = 4, num_stages: int = 3):
    """bhsd q (B, Hq, Nq, D), k, v (B, Hkv, Nk, D) -> (out (q.dtype, bhsd), lse (B, Hq, Nq) float32).
    (4 warps, 3 stages: the H200 sweep's best at (4,16,16384,128) causal, 17.5 ms vs 18.5 with 2 stages
    and 37-40 with 8 warps.)

    ``selection``: optional (indices, mask, k) from :func:`select` (else computed here). ``window``: a
    normalized sliding window (``reference.common.normalize_window``) or None; ``sinks``: (Hq,) attention
    sinks in score units or None.

    Where :func:`gluon_fp4_phase` says so, the FP4 phase runs first on the Gluon attention pass (two-level P,
    the selected tiles masked out: ``attention.attention_packed(..., thrift_mask=...)``), which writes its
    normalized rows in FP32 and their LSE; this kernel (``FP4_IN``) then starts from that state and runs the
    16-bit phase. Two-level P̃/s1 does not depend on the running max, so the split changes no quantization
    decision; the FP4 phase then rounds P̃/s1 at float16 precision as the attention pass does
    (``fake_quant_p_f16``, ~1e-2 relative L2 from the float32 rounding of the fused kernel)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    interp = _interpret()
    if interp:
        dot_dtype = torch.float32
    else:
        dot_dtype = q.dtype if q.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    if selection is None:
        selection = select(q, k, causal=causal, budget=budget, window=window)
    seli, selm, kk = selection
    # the int8 mask the kernels read: a bool mask's bytes are its 0 / 1 values (a view, no conversion launched)
    selm8 = (selm.view(torch.int8) if selm.dtype == torch.bool else selm.to(torch.int8)).contiguous()
    qx, kx, vx = prep(q, 0, "nvfp4", dot_dtype), prep(k, 0, "nvfp4", dot_dtype), prep(v, 0, "nvfp4", dot_dtype)
    NQP, NKP, DP = pad_tokens(Nq), pad_tokens(Nk), head_dim_padded(D)
    nqb, nkb = cdiv(Nq, BLOCK), cdiv(Nk, BLOCK)
    out = torch.empty(B, Hq, Nq, D, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, NQP, device=q.device, dtype=torch.float32)
    fp4_in = gluon_fp4_phase(q, window)
    if fp4_in:  # the FP4 phase on the Gluon attention pass; the fused kernel below adds the 16-bit phase
        pk = _attention.quantize_qkv(q, k, v, fmt="nvfp4", path=_attention.PATH_HOPPER, staged=True,
                                     key_perm=True,  # the Gluon pass's key order (attention_gluon)
                                     key_rows=window is not None)  # (a window's per-key non-finite flags)
        o4 = torch.empty(B, Hq, Nq, D, device=q.device, dtype=torch.float32)  # out's strides
        lse4 = _attention.attention_packed(pk, causal=causal, scale=scale, two_level_p=True, B=B, Hq=Hq, Hkv=Hkv,
                                           out=o4, thrift_mask=selm8, window=window)
        assert lse4.shape[2] == NQP  # both pad tokens to 128
        qf = kf = vf = qx  # (unused pointers)
    else:
        qf, kf, vf = prep(q, 1, "nvfp4", dot_dtype), prep(k, 1, "nvfp4", dot_dtype), prep(v, 2, "nvfp4", dot_dtype)
        o4, lse4 = out, lse  # (unused pointers)
    right, coff, left, loff = window_offsets(window, causal, Nq, Nk)
    sink = sinks.contiguous() if sinks is not None else lse  # (lse: an unused pointer)
    fast(_thrift_fwd_kernel)[head_grid(nqb, B * Hq)](
        qf, kf, vf, qx, kx, vx, seli, selm8, out, lse, sink, o4, lse4, *out.stride(),
        scale * LOG2E, Hq, Hq // Hkv, Nq, Nk, NQP, NKP, nqb, nkb, D, kk, coff, loff,
        CAUSAL=right, WINDOW=left, SINKS=sinks is not None, KMAX_P2=seli.shape[-1], DP=DP, DOT_F32=interp,
        N_KT=nkb if interp else 0, FP4_IN=fp4_in, num_warps=num_warps, num_stages=num_stages)
    return out, lse[:, :, :Nq]


# The narrowest sliding window (keys a query row sees, left + right + 1) whose FP4 phase runs on the Gluon pass: below
# it the extra staged pre-pass costs more than the faster FP4 loop saves. H200, 5% budget, causal, (1,64,8,16k,64) /
# (1,32,8,16k,128), fused Triton kernel / Gluon phase: w = 128 0.93 / 0.87, 256 1.02 / 0.93, 512 1.14 / 1.03,
# 1024 1.29 / 1.17, 2048 1.41 / 1.31 (benchmarks/gluon-window-s52/thrift_win.py).
GLUON_MIN_WINDOW = 512


def gluon_fp4_phase(q: torch.Tensor, window=None) -> bool:
    """Whether ``thrift_fwd`` runs its FP4 phase on the Gluon attention pass: an sm_90 GPU with Triton's
    Gluon, D padded to 64 or 128, no sliding window or one at least ``GLUON_MIN_WINDOW`` keys wide (``window``:
    normalized, -1 unbounded), and ``FP4ATTN_THRIFT_KERNEL`` not "triton" (which keeps both phases in the fused
    Triton kernel)."""
    kernel = os.environ.get("FP4ATTN_THRIFT_KERNEL", "auto")
    if kernel not in ("auto", "triton"):
        raise ValueError(f"FP4ATTN_THRIFT_KERNEL: expected 'auto' or 'triton', got {kernel!r}")
    if kernel == "triton" or _interpret() or q.device.type != "cuda":
        return False
    if window is not None and min(window) >= 0 and sum(window) + 1 < GLUON_MIN_WINDOW:
        return False
    return _attention.attention_gluon.supported(is_mx=False, two_level=True, smooth_q=False, staged=True,
                                                dp=_attention.head_dim_padded(q.shape[-1]), device=q.device)


__all__ = ["select", "thrift_fwd"]


def compile_for_target(capability: int = 90, *, causal: bool = True, dp: int = 128, kmax: int = 16,
                       dtype: str = "bf16", num_warps: int = 4, num_stages: int = 2, window: bool = False,
                       sinks: bool = False, fp4_in: bool = False):
    """Compile the fused kernel for ``cuda:capability`` with Triton's AOT API (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"Qf": f"*{dtype}", "Kf": f"*{dtype}", "Vf": f"*{dtype}", "Qx": f"*{dtype}", "Kx": f"*{dtype}",
            "Vx": f"*{dtype}", "SELI": "*i32", "SELM": "*i8", "O": f"*{dtype}", "LSE": "*fp32", "SINK": "*fp32",
            "O4": "*fp32", "LSE4": "*fp32"}
    ints = ("so_b", "so_h", "so_n", "so_d")
    sig = {**ptrs, **{n: "i32" for n in ints}, "qk_scale": "fp32",
           **{n: "i32" for n in ("Hq", "GROUP", "Nq", "Nk", "NQP", "NKP", "NQB", "NKB", "D", "KSEL", "COFF",
                                 "LOFF")}}
    consts = dict(CAUSAL=causal, WINDOW=window, SINKS=sinks, KMAX_P2=kmax, DP=dp, DOT_F32=False, N_KT=0,
                  FP4_IN=fp4_in)
    sig.update({k: "constexpr" for k in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(ptrs))}
    src = ASTSource(_thrift_fwd_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
