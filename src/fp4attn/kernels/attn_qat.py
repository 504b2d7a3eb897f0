"""Attn-QAT training kernels (SPEC §3, issue 3): fused Triton forward and backward, fast on Hopper.

Read top to bottom, like the Triton fused-attention tutorial:

1. ``_prep_kernel`` -- the quantization pre-pass. One memory-bound sweep writes Qᶠ, Kᶠ (fake-quantized
   along D) and Vᶠ (fake-quantized along tokens, per channel, blocks of 16 keys for NVFP4 / 32 for
   MXFP4) as zero-padded, contiguous ``(B, H, N_pad, D_pad)`` buffers in the dot dtype. Fake-quantized
   values (an E2M1 value times an E4M3 or power-of-two scale, no global scale) have at most 6
   significant bits, so they are *exact* in bf16: the bf16 tensor cores then compute the FP4 products
   exactly with FP32 accumulation. These buffers are what the backward re-reads (not q, k, v).
   The same kernel in copy mode (no quantization) pads the unquantized q, k, v for ``backward="naive"``.

2. ``_fwd_kernel`` -- Algorithm 2. Per 128-query tile it streams the key/value tiles, computes
   S = scale·QᶠKᶠᵀ in the exp2 domain, and keeps the online softmax (running sum l). By default a
   first pass over the key tiles computes S only, for the final row max m (``exact_max``), so that
   P̃ is the one-shot P̃ of SPEC §3. The three quantities the backward needs are defined once here:

   * **P̃ = exp(S − m)**, the un-normalized probabilities against the row max. ``l`` sums the
     *unquantized* P̃. ϕ(P̃) is P̃ fake-quantized in registers in blocks of 16 (32) keys
     (``fake_quant_p``: one max per block, float arithmetic), and O accumulates ϕ(P̃)·Vᶠ.
   * **O' = P̃·Vᶠ / l**, the high-precision output (a second PV dot into a second accumulator). It
     is used only by the backward, for D below; it is not computed when the backward does not need it.
   * **LSE = m + log l** (natural log; -inf for a row that sees no key, whose O is 0).

   Causal tiles strictly above the (bottom-right aligned) diagonal are skipped; only the diagonal
   tiles and the ragged key tail take the masked path. A sliding window (``window``, constexpr WINDOW:
   query i sees keys i + LOFF <= j <= i + COFF) adds the left edge: key tiles before it are skipped, the
   ones it crosses masked (``window_key_range``); the non-window kernels compile as before.

3. Backward, FlashAttention-2 style, Algorithm 3 with straight-through Q, K, V:

   * ``_bwd_pre_kernel``: **D = rowsum(dO ∘ O')** (∘ O when ``high_precision_o=False`` or for the naive
     backward), minus the incoming gradient of the LSE output if there is one; it also writes dO into a
     padded dot-dtype buffer.
   * ``_bwd_dkdv_kernel``: one program per (key tile, kv head); it loops over the query heads of its
     GQA group and over the query tiles, recomputing P = exp(S − LSE). dV += ϕ(P)ᵀ dO with ϕ(P)
     quantized along keys (Pᵀ dO when ``quantize_p_in_backward=False``), dP = dO Vᶠᵀ,
     dS = P ∘ (dP − D), dK += scale · dSᵀ Qᶠ. Summing the group inside one program keeps GQA
     deterministic without atomics.
   * ``_bwd_dq_kernel``: one program per (query tile, query head): dQ = scale · Σ dS Kᶠ.

Padded keys (zero K and V rows beyond Nk) are masked out of the forward softmax. In the backward
only ϕ(P) needs them masked (their P = exp(−LSE) would enter the block maxima of the last real keys:
the KEY_TAIL loop); otherwise zero V gives dP = 0 there, a zero K adds nothing to dQ, and their dK/dV
rows are not stored. Padded query rows have zero dO and D, hence zero dS.

The launchers take the dot dtype from the buffers: bf16 (fp16 for fp16 inputs) on GPU; the CPU tests
run the same kernels under ``TRITON_INTERPRET=1`` with float32 buffers (the interpreter has no bf16
``tl.dot``; the quantized values are exact in either).
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ..formats.triton_helpers import fake_quant_blocks, fake_quant_p
from ..ops._dispatch import interpreting as _interpret
from ._launch import cdiv, fast, head_grid
from ._tiles import (
    LOG2E,
    LOG2E_K,
    causal_key_range,
    head_program,
    load_bhsd_rows,
    program_rows,
    softmax_finish,
    visible,
    window_key_range,
    window_offsets,
    window_query_range,
)

LN2 = 0.6931471805599453
N_ALIGN = 128  # token padding of the internal buffers (a multiple of every tile size below)


def head_dim_padded(d: int) -> int:
    """Internal head dim: the next power of two >= D, at least 32 (an MXFP4 block along D)."""
    p = 32
    while p < d:  # a loop, not bit tricks: d may be a SymInt under torch.compile
        p *= 2
    return p


def _autotune() -> bool:
    """Autotuning is on by default on GPU; FP4ATTN_AUTOTUNE=0 uses the fixed default configs (tests)."""
    return not _interpret() and os.environ.get("FP4ATTN_AUTOTUNE", "1") not in ("", "0")


def _launch(kernel, tuned, grid, args, meta, config):
    """Run ``tuned`` (autotuned) or ``kernel`` with an explicit config dict (BLOCK_M/BLOCK_N and
    optionally num_warps/num_stages); ``grid`` maps the config dict to the launch grid."""
    if config is None and _autotune():
        tuned[lambda m: grid(m)](*args, **meta)
        return
    c = dict(config)
    nw, ns = c.pop("num_warps", 4), c.pop("num_stages", 2)
    kernel[grid(c)](*args, **meta, **c, num_warps=nw, num_stages=ns)


def pad_tokens(n: int) -> int:
    return cdiv(n, N_ALIGN) * N_ALIGN


def exact_max() -> bool:
    """Whether the forward runs the two-pass exact-max variant (EXACT_M in ``_fwd_kernel``): yes,
    for both formats, unless FP4ATTN_QAT_EXACT_MAX=0.

    P~'s block quantization is not invariant to the non-power-of-two shift between a running max and
    the final max, so a running-max kernel differs from the one-shot P~ of SPEC §3 by about one
    quantization error of P: for MXFP4 rel. L2 0.06-0.09 vs the reference; for NVFP4 0.03-0.064 at
    (1, 8, 1024-4096, 64-128) with N(0,1) keys and queries scaled 0.1-3 (cosine down to 0.9980),
    over SPEC §6's 0.05 in the non-causal and low-temperature cases, while the exact max gives 0.0017
    everywhere (H200, benchmarks/fuzz-s14/out/qat_running_max.txt). The extra S = QKᵀ pass costs the
    forward 12-19% and a training step (forward + backward) 4-6% at (4-8, 16, 2048-4096, 64-128).
    FP4ATTN_QAT_EXACT_MAX=0 keeps the one-pass running-max variant (within about one P quantization
    error of the reference, not within SPEC §6 everywhere).
    """
    return os.environ.get("FP4ATTN_QAT_EXACT_MAX", "") != "0"


def quant_block(fmt: str) -> tuple[int, bool]:
    if fmt == "nvfp4":
        return 16, False
    if fmt == "mxfp4":
        return 32, True
    raise ValueError(f"fmt must be 'nvfp4' or 'mxfp4', got {fmt!r}")


# =================================================================================================
# 1. Quantization pre-pass
# =================================================================================================
@triton.jit
def _prep_kernel(X, Y, sx_b, sx_h, sx_n, sx_d, H, N, D, NP,
                 MODE: tl.constexpr,  # 0: copy, 1: fake-quantize along D, 2: along tokens
                 QB: tl.constexpr, IS_MX: tl.constexpr,
                 BLOCK_T: tl.constexpr, DP: tl.constexpr):
    # The tile is loaded directly as (rows, blocks, QB) so that the block axis is a real tensor axis:
    # loads and stores then stay vectorized along the contiguous dim (a 2-D load followed by a
    # reshape made Triton propagate the reshape's layout back to scalar 2-byte loads).
    pid_t, pid_bh = head_program()
    b = pid_bh // H
    h = pid_bh % H
    t0 = pid_t * BLOCK_T
    src = X + b.to(tl.int64) * sx_b + h.to(tl.int64) * sx_h
    dst = Y + pid_bh.to(tl.int64) * NP * DP
    if MODE == 2:
        # element [d, nb, j] = x[t0 + nb * QB + j, d]: blocks of QB consecutive tokens per channel
        d = tl.arange(0, DP)[:, None, None]
        t = t0 + tl.arange(0, BLOCK_T // QB)[None, :, None] * QB + tl.arange(0, QB)[None, None, :]
    else:
        QD: tl.constexpr = QB if MODE == 1 else 16
        t = t0 + tl.arange(0, BLOCK_T)[:, None, None]
        d = tl.arange(0, DP // QD)[None, :, None] * QD + tl.arange(0, QD)[None, None, :]
    x = tl.load(src + t.to(tl.int64) * sx_n + d * sx_d, mask=(t < N) & (d < D), other=0.0)
    if MODE != 0:
        x = fake_quant_blocks(x.to(tl.float32), IS_MX, True)
    tl.store(dst + t * DP + d, x.to(Y.dtype.element_ty))


def _prep_configs():
    return [triton.Config({"BLOCK_T": bt}, num_warps=w) for bt, w in ((32, 4), (64, 4), (64, 8), (128, 8))]


def _prune_prep(configs, named_args, **kwargs):
    dp = kwargs.get("DP", named_args.get("DP"))
    return [c for c in configs if c.kwargs["BLOCK_T"] * dp <= 64 * 128] if dp and dp > 128 else configs


_prep_tuned = triton.autotune(_prep_configs(), key=["NP", "DP", "MODE", "QB"],
                              prune_configs_by={"early_config_prune": _prune_prep})(_prep_kernel)


def prep(x: torch.Tensor, mode: int, fmt: str, dot_dtype: torch.dtype) -> torch.Tensor:
    """(B, H, N, D) bhsd view (any strides) -> padded contiguous (B, H, N_pad, D_pad) buffer."""
    B, H, N, D = x.shape
    NP, DP = pad_tokens(N), head_dim_padded(D)
    y = torch.empty((B, H, NP, DP), device=x.device, dtype=dot_dtype)
    qb, is_mx = quant_block(fmt)
    args = (x, y, *x.stride(), H, N, D, NP)
    meta = dict(MODE=mode, QB=qb, IS_MX=is_mx, DP=DP)
    cfg = None if _autotune() else {"BLOCK_T": 64 if DP <= 128 else 32, "num_warps": 4}
    _launch(_prep_kernel, _prep_tuned, lambda m: head_grid(NP // m["BLOCK_T"], B * H), args, meta, cfg)
    return y


# =================================================================================================
# 2. Forward (Algorithm 2)
# =================================================================================================
@triton.jit
def _fwd_rowmax(m_i, q, k_base, offs_m, lo, hi, Nk, causal_off, left_off, qk_scale,
                MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr,
                DP: tl.constexpr):
    """EXACT_M pass 1: the row max of S (log2 domain) over key tiles [lo, hi); S only, no PV."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    kT_ptrs = k_base + offs_n[None, :] * DP + offs_d[:, None]
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        s = tl.dot(q, tl.load(kT_ptrs + start_n * DP))
        if MASK:
            s = tl.where(visible(start_n + offs_n, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW), s,
                         float("-inf"))
        m_i = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    return m_i


@triton.jit
def _fwd_inner(acc, acc_hp, l_i, m_i, q, k_base, v_base, offs_m, lo, hi, Nk, causal_off, left_off, qk_scale,
               MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, HP_O: tl.constexpr,
               QB: tl.constexpr, IS_MX: tl.constexpr, EXACT_M: tl.constexpr,
               BLOCK_N: tl.constexpr, DP: tl.constexpr):
    """One sweep over key tiles [lo, hi); m_i is the max in the log2 domain.

    EXACT_M: m_i is already the final row max (pass 1), so P~ = exp(S - m) is exactly the
    reference's one-shot P~ and nothing is ever rescaled. Otherwise m_i is the running max and the
    accumulators are rescaled by alpha = exp(m_old - m_new) as in FlashAttention.
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    kT_ptrs = k_base + offs_n[None, :] * DP + offs_d[:, None]
    v_ptrs = v_base + offs_n[:, None] * DP + offs_d[None, :]
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kT = tl.load(kT_ptrs + start_n * DP)
        s = tl.dot(q, kT)  # unscaled; S * log2(e) = s * qk_scale
        if MASK:
            s = tl.where(visible(start_n + offs_n, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW), s,
                         float("-inf"))
        if EXACT_M:
            m_use = m_i
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            m_use = m_new
            if MASK:
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw no key yet
            alpha = tl.math.exp2(m_i - m_use)
            acc = acc * alpha[:, None]
            if HP_O:
                acc_hp = acc_hp * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        p = tl.math.exp2(tl.fma(s, qk_scale, -m_use[:, None]))  # P~ = exp(S - m)
        l_i = l_i + tl.sum(p, 1)  # l from the unquantized P~
        v = tl.load(v_ptrs + start_n * DP)
        p_q = fake_quant_p(p, QB, IS_MX)  # phi(P~) in registers
        acc = tl.dot(p_q.to(v.dtype), v, acc)
        if HP_O:
            acc_hp = tl.dot(p.to(v.dtype), v, acc_hp)
    return acc, acc_hp, l_i, m_i


@triton.jit
def _fwd_kernel(Qf, Kf, Vf, O, OP, LSE,
                so_b, so_h, so_n, so_d,
                qk_scale, Hq, GROUP, Nq, Nk, NQP, NKP, D,
                CAUSAL: tl.constexpr, HP_O: tl.constexpr, QB: tl.constexpr, IS_MX: tl.constexpr,
                EXACT_M: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr,
                MAX_BN: tl.constexpr = 0,
                WINDOW: tl.constexpr = False,  # a sliding window: the offsets below
                COFF=0,  # with WINDOW, the right edge (CAUSAL): query i sees keys j <= i + COFF
                LOFF=0,  # with WINDOW, the left edge: query i sees keys j >= i + LOFF
                SINK=0,  # with SINKS: the (Hq,) attention-sink logits in score units
                SINKS: tl.constexpr = False):
    start_m, pid_bh = head_program()
    b = pid_bh // Hq
    h = pid_bh % Hq
    kv_bh = b * (Hq // GROUP) + h // GROUP
    q_base = Qf + pid_bh.to(tl.int64) * NQP * DP
    k_base = Kf + kv_bh.to(tl.int64) * NKP * DP
    v_base = Vf + kv_bh.to(tl.int64) * NKP * DP

    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DP)
    q = tl.load(q_base + offs_m[:, None] * DP + offs_d[None, :])

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, DP], dtype=tl.float32)
    acc_hp = tl.zeros([BLOCK_M, DP], dtype=tl.float32)

    if WINDOW:  # query i sees keys i + LOFF <= j (<= i + COFF with CAUSAL)
        causal_off = COFF
    else:
        causal_off = Nk - Nq  # bottom-right: query i sees keys j <= i + Nk - Nq
    hi, full_end = causal_key_range(m0, causal_off, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    # key tiles [lo, e1) masked (the window's left edge crosses them, the right one may), [e1, e2) unmasked,
    # [e2, hi) masked (the right edge and the key tail; the left edge is behind them); without WINDOW
    # (0, 0, full_end)
    lo, e1, e2 = window_key_range(m0, LOFF, hi, full_end, BLOCK_M, BLOCK_N, WINDOW)
    if SINKS and not EXACT_M:  # running max: start from the sink (exp2(sk - sk) = 1; -inf: no sink)
        sk0 = tl.load(SINK + h).to(tl.float32) * LOG2E_K
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sk0
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + tl.where(sk0 == float("-inf"), 0.0, 1.0)
    if EXACT_M:  # pass 1: the final row max, so that P~ is the one-shot P~ of SPEC §3
        if WINDOW:
            m_i = _fwd_rowmax(m_i, q, k_base, offs_m, lo, e1, Nk, causal_off, LOFF, qk_scale, True, CAUSAL,
                              WINDOW, BLOCK_N, DP)
        mid = e1
        if MAX_BN > BLOCK_N:  # wider key tiles for the S-only pass (the maxima do not depend on the tiles)
            if WINDOW:  # the wide tiles start at a multiple of MAX_BN
                wlo = tl.minimum(tl.cdiv(e1, MAX_BN) * MAX_BN, e2)
                m_i = _fwd_rowmax(m_i, q, k_base, offs_m, e1, wlo, Nk, causal_off, LOFF, qk_scale, False,
                                  CAUSAL, WINDOW, BLOCK_N, DP)
                mid = tl.maximum(e2 // MAX_BN * MAX_BN, wlo)
            else:
                wlo = 0
                mid = e2 // MAX_BN * MAX_BN
            m_i = _fwd_rowmax(m_i, q, k_base, offs_m, wlo, mid, Nk, causal_off, LOFF, qk_scale, False, CAUSAL,
                              WINDOW, MAX_BN, DP)
        m_i = _fwd_rowmax(m_i, q, k_base, offs_m, mid, e2, Nk, causal_off, LOFF, qk_scale, False, CAUSAL,
                          WINDOW, BLOCK_N, DP)
        m_i = _fwd_rowmax(m_i, q, k_base, offs_m, e2, hi, Nk, causal_off, LOFF, qk_scale, True, CAUSAL,
                          False, BLOCK_N, DP)
        if SINKS:  # the sink joins the max (one-shot P~ against it) and l, as a key without a value
            sk = tl.load(SINK + h).to(tl.float32) * LOG2E_K
            m_i = tl.maximum(m_i, sk)
            l_i = l_i + tl.math.exp2(sk - tl.where(m_i == float("-inf"), 0.0, m_i))
        m_i = tl.where(m_i == float("-inf"), 0.0, m_i)  # rows that see no key: P~ = 0, l = 0
    if WINDOW:  # key tiles the window's left edge crosses
        acc, acc_hp, l_i, m_i = _fwd_inner(acc, acc_hp, l_i, m_i, q, k_base, v_base, offs_m, lo, e1,
                                           Nk, causal_off, LOFF, qk_scale, True, CAUSAL, WINDOW, HP_O, QB,
                                           IS_MX, EXACT_M, BLOCK_N, DP)
    # tiles every query of this block fully sees: no masks
    acc, acc_hp, l_i, m_i = _fwd_inner(acc, acc_hp, l_i, m_i, q, k_base, v_base, offs_m, e1, e2,
                                       Nk, causal_off, LOFF, qk_scale, False, CAUSAL, WINDOW, HP_O, QB, IS_MX,
                                       EXACT_M, BLOCK_N, DP)
    # diagonal tiles (the right edge) and the ragged key tail (the left edge is behind them: no mask)
    acc, acc_hp, l_i, m_i = _fwd_inner(acc, acc_hp, l_i, m_i, q, k_base, v_base, offs_m, e2, hi,
                                       Nk, causal_off, LOFF, qk_scale, True, CAUSAL, False, HP_O, QB, IS_MX,
                                       EXACT_M, BLOCK_N, DP)

    inv_l, lse = softmax_finish(l_i, m_i)
    tl.store(LSE + pid_bh.to(tl.int64) * NQP + offs_m, lse)
    o = acc * inv_l[:, None]
    o_ptrs = (O + b.to(tl.int64) * so_b + h.to(tl.int64) * so_h + offs_m[:, None].to(tl.int64) * so_n
              + offs_d[None, :] * so_d)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < Nq) & (offs_d[None, :] < D))
    if HP_O:
        op = acc_hp * inv_l[:, None]
        tl.store(OP + pid_bh.to(tl.int64) * NQP * DP + offs_m[:, None] * DP + offs_d[None, :],
                 op.to(OP.dtype.element_ty))


def max_pass_block_n(dp: int) -> int:
    """Key tile of the EXACT_M row-max pass (S only) when it differs from the attention pass's: the
    maxima, hence the outputs, are bit-identical whatever the tiles. 256 keys at DP = 128 (H200,
    autotuned configs, processes A/B at (16,16,4096,128): forward nvfp4 -0.3%, causal -2.5%, mxfp4
    -3.4% / -1.9% time; with the fixed default config -5% to -8%). Not at DP = 64 (autotuned: +6-8%
    slower), nor at DP = 256 (out of shared memory); 0 = the attention tile there. 64 under the
    interpreter, so that CPU tests run the split of the key range (benchmarks/qat/maxbn-s15).
    ``FP4ATTN_QAT_MAX_BN`` overrides."""
    env = os.environ.get("FP4ATTN_QAT_MAX_BN", "")
    if env:
        return int(env)
    if _interpret():
        return 64
    return 256 if dp == 128 else 0


def _fwd_configs():
    cfgs = []
    # (ptxas spills at D=128 on sm_90, bytes: 128x64/8w 388, 128x32/8w 8, 64x64/8w 204; 4 warps with
    # BLOCK_M=128 spill kilobytes: two 128 x D fp32 accumulators plus the P quantization)
    # 128 x 128 spills ~60 bytes but halves the per-element cost of rescaling the two accumulators
    for bm, bn, w, s in ((128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 2), (128, 128, 8, 2)):
        cfgs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s))
    return cfgs


def _prune_fwd(configs, named_args, **kwargs):
    dp = kwargs.get("DP", named_args.get("DP"))
    if dp is not None and dp >= 256:  # two 128 x 256 fp32 accumulators: keep the tiles small
        small = [c for c in configs if c.kwargs["BLOCK_M"] == 64]
        return [triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2)] + small
    return configs


_fwd_tuned = triton.autotune(_fwd_configs(), key=["NKP", "CAUSAL", "HP_O", "QB", "DP", "EXACT_M", "MAX_BN",
                                                 "WINDOW", "SINKS"],
                             prune_configs_by={"early_config_prune": _prune_fwd})(_fwd_kernel)


def window_meta(window: tuple[int, int] | None, causal: bool, nq: int, nk: int, nqp: int) -> dict:
    """The kernels' window arguments for a normalized ``window=(left, right)`` (``fp4attn.attn_qat``'s
    ``window_size`` after ``check_window``: -1 = unbounded, right 0 with ``causal``) or None: CAUSAL (a right
    edge: causal, or a bounded right side), WINDOW, and the edges' offsets: query i sees keys
    i + LOFF <= j (<= i + COFF with CAUSAL), from ``window_offsets`` (the inference kernel's); an unbounded
    left side gets LOFF = -nqp (no query's edge reaches key 0)."""
    if window is None:
        return dict(CAUSAL=causal, WINDOW=False)
    right, coff, left, loff = window_offsets(window, causal, nq, nk)
    return dict(CAUSAL=right, WINDOW=True, COFF=coff, LOFF=loff if left else -nqp)


def forward(qf: torch.Tensor, kf: torch.Tensor, vf: torch.Tensor, o: torch.Tensor, *, nq: int, nk: int,
            d: int, causal: bool, scale: float, fmt: str, hp_o: bool, config: dict | None = None,
            window: tuple[int, int] | None = None, sinks: torch.Tensor | None = None):
    """Run Algorithm 2 on the pre-pass buffers; writes ``o`` (a bhsd view, any strides).

    Returns ``(o_prime, lse)``: O' as a padded (B, Hq, NQP, DP) buffer in the dot dtype (an empty
    tensor when ``hp_o`` is False) and LSE as a padded (B, Hq, NQP) float32 buffer.

    ``window=(left, right)``: a sliding window, normalized (``window_meta``): query i sees keys
    i + Nk − Nq − left ... i + Nk − Nq + right. Per query tile, the key tiles outside every row's window are
    skipped and the ones an edge crosses masked (``window_key_range``); P̃'s quantization blocks stay those of
    the whole sequence (tiles start at multiples of BLOCK_N).
    """
    B, Hq, NQP, DP = qf.shape
    Hkv, NKP = kf.shape[1], kf.shape[2]
    qb, is_mx = quant_block(fmt)
    lse = torch.empty((B, Hq, NQP), device=qf.device, dtype=torch.float32)
    op = (torch.empty((B, Hq, NQP, DP), device=qf.device, dtype=qf.dtype) if hp_o
          else torch.empty((0,), device=qf.device, dtype=qf.dtype))
    args = (qf, kf, vf, o, op if hp_o else o, lse, *o.stride(), scale * LOG2E, Hq, Hq // Hkv,
            nq, nk, NQP, NKP, d)
    meta = dict(HP_O=hp_o, QB=qb, IS_MX=is_mx, DP=DP, EXACT_M=exact_max(), **window_meta(window, causal, nq, nk, NQP))
    if sinks is not None:  # (Hq,) logits in score units (the kernel takes them to its log2 units)
        meta.update(SINKS=True, SINK=sinks.contiguous())
    if meta["EXACT_M"]:
        meta["MAX_BN"] = max_pass_block_n(DP)
    if config is None and not _autotune():
        config = _default_config("fwd", DP)
    _launch(_fwd_kernel, _fwd_tuned, lambda m: head_grid(NQP // m["BLOCK_M"], B * Hq), args, meta, config)
    return op, lse


# =================================================================================================
# 3. Backward (Algorithm 3)
# =================================================================================================
@triton.jit
def _bwd_pre_kernel(OX, DO, DOP, DLSE, DELTA,
                    so_b, so_h, so_n, so_d, sd_b, sd_h, sd_n, sd_d,
                    Hq, Nq, D, NQP,
                    HAS_DLSE: tl.constexpr, WRITE_DO: tl.constexpr, BLOCK_M: tl.constexpr,
                    DP: tl.constexpr):
    pid_m, pid_bh, b, h, rows = program_rows(Hq, BLOCK_M)
    cols = tl.arange(0, DP)
    o, _ = load_bhsd_rows(OX, so_b, so_h, so_n, so_d, b, h, rows, Nq, D, DP)
    do, _ = load_bhsd_rows(DO, sd_b, sd_h, sd_n, sd_d, b, h, rows, Nq, D, DP)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:
        # d lse_i / d S_ij = P_ij, so an lse gradient folds into D: dS = P (dP - (D - dlse))
        dl = tl.load(DLSE + pid_bh.to(tl.int64) * Nq + rows, mask=rows < Nq, other=0.0)
        delta = delta - dl
    tl.store(DELTA + pid_bh.to(tl.int64) * NQP + rows, delta)
    if WRITE_DO:  # dO in the padded dot-dtype layout (skipped when dO already is exactly that)
        tl.store(DOP + pid_bh.to(tl.int64) * NQP * DP + rows[:, None] * DP + cols[None, :],
                 do.to(DOP.dtype.element_ty))


@triton.jit
def _load_lse2(LSE, Delta, row_off, offs_m):
    """LSE in the log2 domain; a row that saw no key (lse = -inf) gets +inf so that P = 0."""
    lse = tl.load(LSE + row_off + offs_m) * 1.4426950408889634
    lse = tl.where(lse == float("-inf"), float("inf"), lse)
    return lse, tl.load(Delta + row_off + offs_m)


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, LSE, Delta, row_off, offs_n, lo, hi, causal_off, left_off,
                qk_scale, Nk, MASK: tl.constexpr, KEY_TAIL: tl.constexpr, WINDOW: tl.constexpr,
                QUANT_P: tl.constexpr, QB: tl.constexpr, IS_MX: tl.constexpr, BLOCK_M: tl.constexpr,
                DP: tl.constexpr):
    """dK, dV of one key tile over query tiles [lo, hi).

    P is computed as (queries, keys), the orientation of the forward's S, so that the blocks of 16
    (32) keys of ϕ(P) lie along the accumulator's columns: each thread then holds 4 elements of a
    block (the (keys, queries) orientation of the Triton tutorial gives it 2, doubling the per-block
    scale arithmetic). The two products that need Pᵀ / dSᵀ take a transposed register operand.

    MASK: the causal (right) edge, query i sees keys j <= i + causal_off; WINDOW: a sliding window's left
    edge, j >= i + left_off. KEY_TAIL: the tile reaches past Nk. Its zero-padded keys have S = 0, so
    P = exp(-LSE) there, which is not zero and would enter the ϕ(P) block maxima of the last real keys: it
    is zeroed first. (Causal MASK tiles need no such step: the causal mask already hides every key >= Nk
    from every real query; a window's right edge may not, so its masked tiles set KEY_TAIL.)
    """
    offs_d = tl.arange(0, DP)
    offs_mb = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_mb
        q = tl.load(q_base + offs_m[:, None] * DP + offs_d[None, :])
        do = tl.load(do_base + offs_m[:, None] * DP + offs_d[None, :])
        lse, delta = _load_lse2(LSE, Delta, row_off, offs_m)
        s = tl.dot(q, tl.trans(k))  # (BLOCK_M queries, BLOCK_N keys), unscaled
        p = tl.math.exp2(tl.fma(s, qk_scale, -lse[:, None]))  # P = exp(S - LSE)
        if MASK:
            p = tl.where(offs_m[:, None] + causal_off >= offs_n[None, :], p, 0.0)
        if WINDOW:
            p = tl.where(offs_n[None, :] >= offs_m[:, None] + left_off, p, 0.0)
        if KEY_TAIL:
            p = tl.where(offs_n[None, :] < Nk, p, 0.0)
        if QUANT_P:  # phi(P) in blocks along keys, the same rounding as the forward
            p_q = fake_quant_p(p, QB, IS_MX)
        else:
            p_q = p
        dv = tl.dot(tl.trans(p_q.to(do.dtype)), do, dv)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk)
    return dk, dv


@triton.jit
def _dkdv_inner_kq(dk, dv, k, v, q_base, do_base, LSE, Delta, row_off, offs_n, lo, hi, causal_off, left_off,
                   qk_scale, Nk, MASK: tl.constexpr, KEY_TAIL: tl.constexpr, WINDOW: tl.constexpr,
                   QUANT_P: tl.constexpr, QB: tl.constexpr, IS_MX: tl.constexpr, BLOCK_M: tl.constexpr,
                   DP: tl.constexpr):
    """The same in the (keys, queries) orientation of the Triton tutorial: Pᵀ and dSᵀ come out of
    the dots ready to use, but ϕ needs its blocks along the accumulator's rows (2 elements of a block
    per thread). Autotuning picks the faster orientation per shape."""
    offs_d = tl.arange(0, DP)
    offs_mb = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_mb
        qT = tl.load(q_base + offs_m[None, :] * DP + offs_d[:, None])
        do = tl.load(do_base + offs_m[:, None] * DP + offs_d[None, :])
        lse, delta = _load_lse2(LSE, Delta, row_off, offs_m)
        sT = tl.dot(k, qT)  # (BLOCK_N keys, BLOCK_M queries), unscaled
        pT = tl.math.exp2(tl.fma(sT, qk_scale, -lse[None, :]))
        if MASK:
            pT = tl.where(offs_m[None, :] + causal_off >= offs_n[:, None], pT, 0.0)
        if WINDOW:
            pT = tl.where(offs_n[:, None] >= offs_m[None, :] + left_off, pT, 0.0)
        if KEY_TAIL:
            pT = tl.where(offs_n[:, None] < Nk, pT, 0.0)
        if QUANT_P:
            pT_q = tl.trans(fake_quant_p(tl.trans(pT), QB, IS_MX))
        else:
            pT_q = pT
        dv = tl.dot(pT_q.to(do.dtype), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk)
    return dk, dv


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_base, do_base, LSE, Delta, row_off, offs_n, lo, hi, causal_off, left_off,
                qk_scale, Nk, MASK: tl.constexpr, KEY_TAIL: tl.constexpr, WINDOW: tl.constexpr,
                QUANT_P: tl.constexpr, QB: tl.constexpr, IS_MX: tl.constexpr, BLOCK_M: tl.constexpr,
                DP: tl.constexpr, P_QK: tl.constexpr):
    """Query tiles [lo, hi) of a key tile in the orientation ``P_QK`` picks (``_dkdv_inner`` or ``_kq``)."""
    if P_QK:
        return _dkdv_inner(dk, dv, k, v, q_base, do_base, LSE, Delta, row_off, offs_n, lo, hi, causal_off, left_off,
                           qk_scale, Nk, MASK, KEY_TAIL, WINDOW, QUANT_P, QB, IS_MX, BLOCK_M, DP)
    else:
        return _dkdv_inner_kq(dk, dv, k, v, q_base, do_base, LSE, Delta, row_off, offs_n, lo, hi, causal_off,
                              left_off, qk_scale, Nk, MASK, KEY_TAIL, WINDOW, QUANT_P, QB, IS_MX, BLOCK_M, DP)


@triton.jit
def _bwd_dkdv_kernel(Qb, Kb, Vb, DOb, LSE, Delta, DK, DV,
                     sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d,
                     qk_scale, scale, Hq, GROUP, Nq, Nk, NQP, NKP, D,
                     CAUSAL: tl.constexpr, QUANT_P: tl.constexpr, QB: tl.constexpr, IS_MX: tl.constexpr,
                     P_QK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr,
                     WINDOW: tl.constexpr = False, COFF=0, LOFF=0):  # as _fwd_kernel's
    pid_n, pid_bh = head_program()  # pid_bh = b * Hkv + kv head
    Hkv = Hq // GROUP
    b = pid_bh // Hkv
    hk = pid_bh % Hkv
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    kv_off = pid_bh.to(tl.int64) * NKP * DP
    k = tl.load(Kb + kv_off + offs_n[:, None] * DP + offs_d[None, :])
    v = tl.load(Vb + kv_off + offs_n[:, None] * DP + offs_d[None, :])
    dk = tl.zeros([BLOCK_N, DP], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, DP], dtype=tl.float32)

    if WINDOW:
        # query tiles [lo, mid) masked (the right edge crosses them, the left one may), [mid, e) unmasked,
        # [e, hi) masked (the left edge; the right one is behind them); the others see none of these keys.
        # The last key tile (padded keys): all masked
        causal_off = COFF
        lo, mid, e, hi = window_query_range(n0, COFF, LOFF, NQP, BLOCK_M, BLOCK_N, CAUSAL)
        e = tl.where(n0 + BLOCK_N > Nk, mid, e)
    elif CAUSAL:
        causal_off = Nk - Nq
        # queries i < n0 - off see none of these keys; i >= n0 + BLOCK_N - 1 - off see all of them
        lo = (tl.maximum(n0 - causal_off, 0) // BLOCK_M) * BLOCK_M
        mid = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - causal_off, 0), BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.maximum(mid, lo), NQP)
        lo = tl.minimum(lo, mid)
    else:
        causal_off = Nk - Nq
        # only the last key tile has padded keys: all its query tiles run the KEY_TAIL loop [0, mid),
        # the other tiles the plain loop [mid, NQP) (two sequential loops, one empty, as for the causal
        # mask: an if/else around two calls doubled the shared memory, beyond the limit at D > 128)
        lo = 0
        mid = tl.where(n0 + BLOCK_N > Nk, NQP, 0)
    for g in range(0, GROUP):
        qh = pid_bh * GROUP + g  # = b * Hq + hk * GROUP + g
        q_off = qh.to(tl.int64) * NQP * DP
        row_off = qh.to(tl.int64) * NQP
        qb, dob = Qb + q_off, DOb + q_off
        if WINDOW:  # masked tiles mask the padded keys too (a window's right edge may reach past Nk)
            if CAUSAL:
                dk, dv = _dkdv_tiles(dk, dv, k, v, qb, dob, LSE, Delta, row_off, offs_n, lo, mid, causal_off, LOFF,
                                     qk_scale, Nk, True, True, True, QUANT_P, QB, IS_MX, BLOCK_M, DP, P_QK)
            dk, dv = _dkdv_tiles(dk, dv, k, v, qb, dob, LSE, Delta, row_off, offs_n, mid, e, causal_off, LOFF,
                                 qk_scale, Nk, False, False, False, QUANT_P, QB, IS_MX, BLOCK_M, DP, P_QK)
            dk, dv = _dkdv_tiles(dk, dv, k, v, qb, dob, LSE, Delta, row_off, offs_n, e, hi, causal_off, LOFF,
                                 qk_scale, Nk, False, True, True, QUANT_P, QB, IS_MX, BLOCK_M, DP, P_QK)
        else:
            if CAUSAL:
                dk, dv = _dkdv_tiles(dk, dv, k, v, qb, dob, LSE, Delta, row_off, offs_n, lo, mid, causal_off, LOFF,
                                     qk_scale, Nk, True, False, False, QUANT_P, QB, IS_MX, BLOCK_M, DP, P_QK)
            else:
                dk, dv = _dkdv_tiles(dk, dv, k, v, qb, dob, LSE, Delta, row_off, offs_n, lo, mid, causal_off, LOFF,
                                     qk_scale, Nk, False, True, False, QUANT_P, QB, IS_MX, BLOCK_M, DP, P_QK)
            dk, dv = _dkdv_tiles(dk, dv, k, v, qb, dob, LSE, Delta, row_off, offs_n, mid, NQP, causal_off, LOFF,
                                 qk_scale, Nk, False, False, False, QUANT_P, QB, IS_MX, BLOCK_M, DP, P_QK)

    dk = dk * scale
    msk = (offs_n[:, None] < Nk) & (offs_d[None, :] < D)
    r64 = offs_n[:, None].to(tl.int64)
    tl.store(DK + b.to(tl.int64) * sk_b + hk.to(tl.int64) * sk_h + r64 * sk_n + offs_d[None, :] * sk_d,
             dk.to(DK.dtype.element_ty), mask=msk)
    tl.store(DV + b.to(tl.int64) * sv_b + hk.to(tl.int64) * sv_h + r64 * sv_n + offs_d[None, :] * sv_d,
             dv.to(DV.dtype.element_ty), mask=msk)


@triton.jit
def _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, lo, hi, causal_off, left_off, qk_scale,
              MASK: tl.constexpr, WINDOW: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr):
    """dQ of one query tile over key tiles [lo, hi). MASK: the causal (right) edge, query i sees keys
    j <= i + causal_off; WINDOW: a sliding window's left edge, j >= i + left_off. (Padded keys need no
    mask here: their zero K rows add nothing to dQ.)"""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, DP)
    kT_ptrs = k_base + offs_n[None, :] * DP + offs_d[:, None]
    vT_ptrs = v_base + offs_n[None, :] * DP + offs_d[:, None]
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kT = tl.load(kT_ptrs + start_n * DP)
        vT = tl.load(vT_ptrs + start_n * DP)
        s = tl.dot(q, kT)
        p = tl.math.exp2(tl.fma(s, qk_scale, -lse[:, None]))
        if MASK:
            keys = start_n + offs_n
            p = tl.where(keys[None, :] <= offs_m[:, None] + causal_off, p, 0.0)
        if WINDOW:
            keys = start_n + offs_n
            p = tl.where(keys[None, :] >= offs_m[:, None] + left_off, p, 0.0)
        dp = tl.dot(do, vT)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq)
    return dq


@triton.jit
def _bwd_dq_kernel(Qb, Kb, Vb, DOb, LSE, Delta, DQ,
                   sq_b, sq_h, sq_n, sq_d,
                   qk_scale, scale, Hq, GROUP, Nq, Nk, NQP, NKP, D,
                   CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr,
                   WINDOW: tl.constexpr = False, COFF=0, LOFF=0):  # as _fwd_kernel's
    pid_m, pid_bh = head_program()
    b = pid_bh // Hq
    h = pid_bh % Hq
    kv_bh = b * (Hq // GROUP) + h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, DP)
    q_off = pid_bh.to(tl.int64) * NQP * DP
    q = tl.load(Qb + q_off + offs_m[:, None] * DP + offs_d[None, :])
    do = tl.load(DOb + q_off + offs_m[:, None] * DP + offs_d[None, :])
    lse, delta = _load_lse2(LSE, Delta, pid_bh.to(tl.int64) * NQP, offs_m)
    k_base = Kb + kv_bh.to(tl.int64) * NKP * DP
    v_base = Vb + kv_bh.to(tl.int64) * NKP * DP
    dq = tl.zeros([BLOCK_M, DP], dtype=tl.float32)

    if WINDOW:  # the forward's key tiles: [lo, e1) and [e2, hi) masked (as there), [e1, e2) not
        hi, full_end = causal_key_range(m0, COFF, Nk, BLOCK_M, BLOCK_N, CAUSAL)
        lo, e1, e2 = window_key_range(m0, LOFF, hi, full_end, BLOCK_M, BLOCK_N, WINDOW)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, lo, e1, COFF, LOFF, qk_scale,
                       CAUSAL, True, BLOCK_N, DP)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, e1, e2, COFF, LOFF, qk_scale,
                       False, False, BLOCK_N, DP)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, e2, hi, COFF, LOFF, qk_scale,
                       CAUSAL, False, BLOCK_N, DP)
    elif CAUSAL:
        causal_off = Nk - Nq
        hi = tl.minimum(tl.maximum(m0 + BLOCK_M + causal_off, 0), Nk)
        full_end = tl.minimum((tl.maximum(m0 + causal_off + 1, 0) // BLOCK_N) * BLOCK_N, hi)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, 0, full_end, causal_off, LOFF, qk_scale,
                       False, False, BLOCK_N, DP)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, full_end, hi, causal_off, LOFF, qk_scale,
                       True, False, BLOCK_N, DP)
    else:
        causal_off = Nk - Nq
        # keys in the zero padding beyond Nk contribute nothing (zero K rows)
        dq = _dq_inner(dq, q, do, lse, delta, k_base, v_base, offs_m, 0, Nk, causal_off, LOFF, qk_scale,
                       False, False, BLOCK_N, DP)
    dq = dq * scale
    msk = (offs_m[:, None] < Nq) & (offs_d[None, :] < D)
    tl.store(DQ + b.to(tl.int64) * sq_b + h.to(tl.int64) * sq_h + offs_m[:, None].to(tl.int64) * sq_n
             + offs_d[None, :] * sq_d, dq.to(DQ.dtype.element_ty), mask=msk)


def _bwd_configs(kind):
    cfgs = []
    if kind == "dkdv":
        # P_QK (queries x keys): 128 x 64 on 8 warps has no spills and ~32 instructions per P element
        # for phi(P) by PTX count; the tutorial's (keys x queries) orientation (P_QK False) was the
        # faster one in some H200 runs, so both are in the list
        for qk, bm, bn, w, s in ((True, 128, 64, 8, 2), (True, 128, 32, 8, 2), (False, 64, 128, 8, 2),
                                 (False, 32, 64, 4, 2), (False, 32, 128, 8, 2)):
            cfgs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "P_QK": qk}, num_warps=w,
                                      num_stages=s))
    else:
        for bm, bn, w, s in ((64, 64, 4, 3), (64, 32, 4, 2), (128, 64, 8, 2), (128, 32, 8, 3)):
            cfgs.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s))
    return cfgs


def _prune_bwd(configs, named_args, **kwargs):
    dp = kwargs.get("DP", named_args.get("DP"))
    if dp is not None and dp >= 256:
        return [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 64]
    return configs


def _prune_dkdv(configs, named_args, **kwargs):
    dp = kwargs.get("DP", named_args.get("DP"))
    if dp is not None and dp >= 256:  # dK, dV accumulators of BLOCK_N x 256: only 128 x 32 does not spill
        return [c for c in configs if c.kwargs["BLOCK_N"] <= 32]
    return configs


_dkdv_tuned = triton.autotune(_bwd_configs("dkdv"), key=["NQP", "NKP", "CAUSAL", "QUANT_P", "QB", "DP", "WINDOW"],
                              prune_configs_by={"early_config_prune": _prune_dkdv})(_bwd_dkdv_kernel)
_dq_tuned = triton.autotune(_bwd_configs("dq"), key=["NQP", "NKP", "CAUSAL", "DP", "WINDOW"],
                            prune_configs_by={"early_config_prune": _prune_bwd})(_bwd_dq_kernel)


def backward(do: torch.Tensor, o_for_delta: torch.Tensor, qb: torch.Tensor, kb: torch.Tensor,
             vb: torch.Tensor, lse: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, *,
             nq: int, nk: int, d: int, causal: bool, scale: float, fmt: str, quant_p: bool,
             dlse: torch.Tensor | None = None, configs: dict | None = None,
             window: tuple[int, int] | None = None):
    """Algorithm 3 (or the naive FlashAttention backward when given unquantized buffers, quant_p=False).

    ``do`` and ``o_for_delta`` are bhsd views (any strides; ``o_for_delta`` may also be the padded O'
    buffer), ``qb, kb, vb`` the padded pre-pass buffers, ``lse`` the padded forward LSE; writes the bhsd
    views ``dq, dk, dv`` (any strides). ``dlse``: optional (B, Hq, Nq) gradient of the LSE output.

    ``window``: the forward's (``forward``). dQ loops over the forward's key tiles; dK/dV of a key tile over
    the query tiles that see any of its keys (``window_query_range``): those an edge crosses, and all of them
    for the last key tile (its padded keys stay out of ϕ(P)), masked.
    """
    B, Hq, NQP, DP = qb.shape
    Hkv, NKP = kb.shape[1], kb.shape[2]
    qbk, is_mx = quant_block(fmt)
    # dO is re-read by both kernels in the padded contiguous dot-dtype layout; when it already is
    # exactly that (contiguous bhsd, N and D at their padded sizes), use it as is: no copy, no memory
    reuse_do = (do.dtype == qb.dtype and tuple(do.shape) == tuple(qb.shape) and do.is_contiguous())
    dop = do if reuse_do else torch.empty_like(qb)
    delta = torch.empty((B, Hq, NQP), device=qb.device, dtype=torch.float32)
    has_dlse = dlse is not None
    if has_dlse:
        dlse = dlse.float().contiguous()
    fast(_bwd_pre_kernel)[head_grid(NQP // 64, B * Hq)](
        o_for_delta, do, dop, dlse if has_dlse else delta, delta, *o_for_delta.stride(), *do.stride(),
        Hq, nq, d, NQP, HAS_DLSE=has_dlse, WRITE_DO=not reuse_do, BLOCK_M=64, DP=DP, num_warps=4)
    group = Hq // Hkv
    common = (scale * LOG2E, scale, Hq, group, nq, nk, NQP, NKP, d)
    args_kv = (qb, kb, vb, dop, lse, delta, dk, dv, *dk.stride(), *dv.stride(), *common)
    args_q = (qb, kb, vb, dop, lse, delta, dq, *dq.stride(), *common)
    wmeta = window_meta(window, causal, nq, nk, NQP)
    meta_kv = dict(QUANT_P=quant_p, QB=qbk, IS_MX=is_mx, DP=DP, **wmeta)
    meta_q = dict(DP=DP, **wmeta)
    configs = dict(configs or {})
    if not _autotune():
        configs.setdefault("dkdv", _default_config("dkdv", DP))
        configs.setdefault("dq", _default_config("dq", DP))
    _launch(_bwd_dkdv_kernel, _dkdv_tuned, lambda m: head_grid(NKP // m["BLOCK_N"], B * Hkv), args_kv, meta_kv,
            configs.get("dkdv"))
    _launch(_bwd_dq_kernel, _dq_tuned, lambda m: head_grid(NQP // m["BLOCK_M"], B * Hq), args_q, meta_q,
            configs.get("dq"))


def _default_config(kind: str, dp: int) -> dict:
    """The config used without autotuning (and the only one under the interpreter)."""
    if _interpret():
        return {"BLOCK_M": 32, "BLOCK_N": 32, **({"P_QK": True} if kind == "dkdv" else {})}
    big = dp >= 256
    if kind == "fwd":
        return ({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2} if big
                else {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2})
    if kind == "dkdv":
        return ({"BLOCK_M": 128, "BLOCK_N": 32, "P_QK": True, "num_warps": 8, "num_stages": 2} if big
                else {"BLOCK_M": 128, "BLOCK_N": 64, "P_QK": True, "num_warps": 8, "num_stages": 2})
    return ({"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2} if big
            else {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3})


# =================================================================================================
# Host-side helpers shared by the op and the tests
# =================================================================================================
def dot_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """bf16 tensor cores (fp16 for fp16 inputs, keeping dO's mantissa); fp32 under the interpreter."""
    if _interpret():
        return torch.float32
    return torch.float16 if dtype == torch.float16 else torch.bfloat16


def attn_qat_fwd_bhsd(q, k, v, o, *, causal: bool, scale: float, fmt: str, hp_o: bool,
                      config: dict | None = None, window: tuple[int, int] | None = None,
                      sinks: torch.Tensor | None = None):
    """Pre-pass + forward on bhsd views. Returns (qf, kf, vf, o_prime, lse_padded). ``window``: see
    ``forward``; ``sinks`` (Hq,): attention sinks (the backward kernels need nothing more: P = exp(S − LSE)
    with the LSE including the sink; the sinks' own gradient is −Σ exp(sink − LSE)·D, ``ops.attn_qat``)."""
    dt = dot_dtype_for(q.dtype)
    qf = prep(q, 1, fmt, dt)
    kf = prep(k, 1, fmt, dt)
    vf = prep(v, 2, fmt, dt)
    op, lse = forward(qf, kf, vf, o, nq=q.shape[2], nk=k.shape[2], d=q.shape[3], causal=causal,
                      scale=scale, fmt=fmt, hp_o=hp_o, config=config, window=window, sinks=sinks)
    return qf, kf, vf, op, lse


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
