"""Flash-decoding over the NVFP4 :class:`fp4attn.KVCache` (issue 5): ``fp4attn.decode`` on CUDA.

Two attention kernels (1-2) and, for ``thrift_budget``, two page-selection kernels that run before them (3):

1. ``_decode_split_kernel`` -- grid (splits, B·Hkv). A program owns one kv head of one sequence and a
   contiguous range of its committed (quantized) tokens, and computes **all query rows of the GQA
   group at once**: rows = (query head g of the group, new query i), ``G·n_q <= BLOCK_M``, so every KV
   page is read once for the whole group. The tile is **transposed**: keys run along the MMA's M
   dimension and the few query rows along N (Sᵀ = K̂·ϕ(q)ᵀ, Oᵀ += V̂ᵀ·ϕ(P̃)ᵀ), so a decode step with 4
   query rows fills half an 8-wide MMA instead of a quarter of a 16-row one: half the MMAs, the
   softmax/P̃ work and the accumulator registers of the row-major tile (measured 1.13× faster at the
   same launch, 142 instead of 182 registers, which lets 12 one-warp programs share an SM).
   Per BLOCK_N-token tile (inside one page, looked up in the page table) it loads the packed K nibbles
   and E4M3 scales, decodes them in registers to float16 (exact: code·scale has <= 6 significant bits;
   bit placement via ``fp4attn.formats.triton_helpers``), Sᵀ (FP32 accumulate, log2 domain, global K
   scale folded into the score scale), online softmax along the keys, P̃ quantized in blocks of 16 keys
   (``fake_quant_p``), Oᵀ += V̂ᵀ·ϕ(P̃)ᵀ with V̂ decoded from its token-packed nibbles.
   Causal among the new tokens: query i sees keys j <= len − n_q + i (bottom-right). With ``WINDOW`` (a
   sliding window of left extent WL) also j >= len − n_q + i − WL, and the splits start at the tile holding
   the sequence's first visible key: only the window's pages are read.
   With ``THRIFT``: per tile (= Thrift block = page when page_size == BLOCK_N) the rows whose query
   head selected the block take S from the 16-bit copy (input-dtype q, FP32 accumulate), unquantized
   P̃ and 16-bit V; the others use the FP4 path with two-level P (s1 = rowmax(P̃ tile)/(448·6)). The
   16-bit K/V tiles are loaded only when some head of the group selected the tile. ``THRIFT`` composes
   with ``WINDOW`` (the window's mask on the 16-bit and the FP4 scores alike; the selection then holds only
   pages of the window) and ``SINKS`` (the running max starts at the sink, the reduce adds its share of l).
   Partials (unnormalized O, running max m in log2 units, l) go to FP32 buffers, valid rows only.
   With ``ROWM`` (more than 16 rows per kv head, 32 at D = 64: speculative decoding's draft tokens, wide
   GQA groups; FP4 tiles only) the tile is not transposed: the rows run along M, 64-key tiles on 4 warps
   (wgmma on Hopper), as in prefill attention, so the softmax and the P̃ rounding reduce along each warp's own keys
   instead of across the warps that share the key axis (same tiles, masks and rounding: equal results up to
   float32 accumulation order; 2.4-2.9x faster than the transposed tiles at 64 rows, H100).

2. ``_decode_reduce_kernel`` -- one program per (sequence, query head, query) and block of 32 output
   channels: merges the splits' partials (max-rescaled sums, one pass over chunks of up to 256 splits)
   with the raw 16-bit tail (< 16 tokens per sequence, scored in FP32 with unquantized P̃), writes O in
   q's dtype and the natural-log LSE. On sm_90+ it is a programmatic dependent launch (see ``_PDL``).

3. ``select_pages``: the Thrift selection of ``ops.decode.thrift_select`` (which stays the definition and
   the reference path's) as two launches instead of ~40 torch ops: ``_page_scores_kernel`` (grid (page
   chunks, B·Hkv): Ŝ = q̄·K̄_p for the G query heads of a kv head at once, the partial last page's mean
   computed in the kernel) and ``_page_topk_kernel`` (one program per (sequence, query head): k from the
   budget and the device-side length, top-k by a bisection over order-preserving integer keys, ties to
   the lower index), writing the int8 (B, Hq, max_pages) layout the split kernel's ``SEL`` reads. No
   host sync: the decode step stays CUDA-graph capturable. With a sliding window (``WINDOW``) both kernels
   cover only each sequence's candidate pages (those holding keys ``max(L − n_q − WL, 0) ... L − 1``, found
   from the device-side length): the scores' chunks start at the first of them, k counts them, and the
   top-k tile holds them (at most ceil((WL + n_q) / page_size) + 1 pages, whatever the context length).

``DOT_F32`` (the interpreter, which has no fp16/bf16 ``tl.dot``) runs the same decoded values
(exact in FP32 as well) through FP32 dots.

Head dims: every kernel here takes the cache's D (any multiple of 16) and tiles of DP = the next power of two
channels (``_tiles.dim_mask``: masked loads whose padding channels are zeros; for D == DP the mask folds away and the
code is that of the unpadded tile). The split partials (OP) have DP channels; the reduce writes D.

On Hopper the FP4 split loop runs ``decode_gluon._decode_split_kernel_gl`` instead (see
``_use_gluon``): the same arithmetic with the packed bytes loaded straight into the MMA operand registers,
1.6-2.0x faster than kernel 1 on an H200; kernel 1 stays the portable path and the interpreter's. With a
Thrift selection equal for every query head of a kv group (the op's default thrift_share="group",
``decode_fwd(group_sel=True)``), at tiles of <= 128 channels and <= 8 query rows (``decode_gluon.group16_fits``), a
page the group selected is one tile from the 16-bit copy only and any other one an FP4 tile (``GROUP16``: the FP4
bytes of selected pages are not read; 1.16-1.25x the paths below, H200 and H100). Per-head selections: at tiles of
<= 64 channels and <= 8 query rows (``decode_gluon.fused16_fits``) the Gluon kernel
computes the selected pages itself from the 16-bit copy, as kernel 1 does (1.17-1.27x faster than the two kernels
below at D = 48 / 64, H200). Wider tiles do not fit its register budget: there it leaves the selected (query head,
page) pairs out (their scores -inf, its FP4 tiles with two-level P̃) and ``_decode_16bit_kernel`` computes them from
the 16-bit copy as extra split partials: the reduce's max-rescaled merge of the two streams is the one online softmax
of the fused kernel (two-level P̂ does not depend on the running max; only the 16-bit P̃'s rounding to V's dtype for
the MMA is relative to another maximum). A window and sinks work the same way in both split kernels (and the
16-bit stream masks its keys by the window; sinks enter through the reduce).
"""

from __future__ import annotations

import functools
import os
import struct

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda.gdc import gdc_wait

from ..formats.triton_helpers import (
    e2m1_halfwords_f16,
    fake_quant_p,
    fake_quant_p_two_level,
    fake_quant_rows,
    fp4_tile_f16,
    unpack_e2m1_f16_scaled,
    unpack_nibbles,
)
from ..ops import _dispatch
from ..ops._dispatch import interpreting as _interpret
from ..ops._validate import check_choice
from . import decode_gluon
from ._launch import cdiv, fast, head_grid, next_pow2
from ._tiles import LOG2E, LOG2E_K, decode_tile_runs, dim_mask, kv_head_program, online_softmax_step

LN2 = 0.6931471805599453
SLOT = 16


@triton.jit
def _fp4_rows_f16(packed, sbytes, QB: tl.constexpr):
    """(R, C/2) packed bytes (blocks along the last axis) + (R, C/QB) E4M3 bytes -> (R, C) float16
    values code·scale (exact in float16): the FP4 attention kernel's tile decode, reused."""
    return fp4_tile_f16(unpack_nibbles(packed), sbytes, 0, QB, False)


@triton.jit
def _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok, hq_rows, last_key, WL, C,
                 b, h, KD, KS, VD, VS, K16, V16, PT, SEL, Hkv, MAXP,
                 D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr, BLOCK_N: tl.constexpr, THRIFT: tl.constexpr,
                 DOT_F32: tl.constexpr, WINDOW: tl.constexpr, ROWM: tl.constexpr = False,
                 MASKED: tl.constexpr = True):
    """One BLOCK_N-token tile (inside one page) of the split loop, transposed: FP4 (or Thrift-mixed)
    online softmax over the tile's keys for the program's query rows (the columns). With ``ROWM`` (many
    query rows, FP4 only) the tile is not transposed: ``qT`` holds ϕ(q) as rows (BLOCK_M, D) and ``accT``
    is O (BLOCK_M, D), the rows along the MMA's M. ``MASKED``: the keys' committed, causal and window masks
    (False: a tile of ``decode_tile_runs``' unmasked run; padding rows then score their zero q, unused).
    ``DP``: the channels of the tile, D padded to a power of two (the padding channels load as code 0 and
    scale 0, i.e. zeros, and score and accumulate nothing)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_n2 = tl.arange(0, BLOCK_N // 2)
    offs_n16 = tl.arange(0, BLOCK_N // 16)
    offs_d = tl.arange(0, DP)
    dmask = dim_mask(offs_d, D, DP)
    pidx = t0 // PS
    page = tl.maximum(tl.load(PT + b * MAXP + pidx), 0).to(tl.int64)  # -1 (past a reservation): page 0
    off = t0 % PS
    base = page * Hkv + h  # (page, head) index
    row0 = base * PS + off  # storage row of the tile's first key
    offs_c16 = tl.arange(0, DP // 16)
    ksb = tl.load(KS + (row0 + offs_n[:, None]) * (D // 16) + offs_c16[None, :],
                  mask=dim_mask(offs_c16, D // 16, DP // 16)[None, :], other=0)
    if DOT_F32:
        offs_c2 = tl.arange(0, DP // 2)
        kb = tl.load(KD + (row0 + offs_n[:, None]) * (D // 2) + offs_c2[None, :],
                     mask=dim_mask(offs_c2, D // 2, DP // 2)[None, :], other=0)
        k = _fp4_rows_f16(kb, ksb, 16).to(tl.float32)
    else:
        # half-words of 4 codes, decoded to value·2^-6 (the 2^6 is folded into s_scale)
        offs_c4 = tl.arange(0, DP // 4)
        kh = tl.load(KD.to(tl.pointer_type(tl.int16)) + (row0 + offs_n[:, None]) * (D // 4) + offs_c4[None, :],
                     mask=dim_mask(offs_c4, D // 4, DP // 4)[None, :], other=0)
        # the block's scale byte for each of its 4 half-words, twice (codes 0-1 and 2-3)
        ks4 = tl.reshape(tl.broadcast_to(ksb.to(tl.int16)[:, :, None], (BLOCK_N, DP // 16, 4)), (BLOCK_N, DP // 4))
        k = unpack_e2m1_f16_scaled(kh, ks4 | (ks4 << 8))
    keys = t0 + offs_n
    if ROWM:
        tl.static_assert(not THRIFT, "ROWM: FP4 tiles only")
        s = tl.dot(qT, tl.trans(k)) * s_scale  # (BLOCK_M, BLOCK_N)
        if MASKED:
            ok = (keys < C)[None, :] & (keys[None, :] <= last_key[:, None]) & row_ok[:, None]
            if WINDOW:  # a sliding window: query row sees keys >= its last key - WL
                ok = ok & (keys[None, :] >= (last_key - WL)[:, None])
            s = tl.where(ok, s, float("-inf"))
    else:
        sT = tl.dot(k, qT) * s_scale  # (BLOCK_N, BLOCK_M)
        if MASKED:
            ok = (keys < C)[:, None] & (keys[:, None] <= last_key[None, :]) & row_ok[None, :]
            if WINDOW:
                ok = ok & (keys[:, None] >= (last_key - WL)[None, :])
    if THRIFT:
        selr = tl.load(SEL + hq_rows.to(tl.int64) * MAXP + pidx, mask=row_ok, other=0) != 0
        any_sel = tl.max(selr.to(tl.int32), axis=0) > 0
        if any_sel:
            k16 = tl.load(K16 + (row0 + offs_n)[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
            if DOT_F32:
                k16 = k16.to(tl.float32)
            sT = tl.where(selr[None, :], tl.dot(k16, q16T) * qk_scale, sT)
    if not ROWM:
        if MASKED:  # (after Thrift's 16-bit scores: the masks hold for both)
            sT = tl.where(ok, sT, float("-inf"))
        # the softmax and the P̃ rounding run on the (rows, keys) view of the tile (a transposed layout,
        # no data movement)
        s = tl.trans(sT)
    p, alpha, m_new, l_i = online_softmax_step(s, m_i, l_i, MASKED or THRIFT)
    accT = accT * (alpha[:, None] if ROWM else alpha[None, :])
    if DOT_F32:
        # V tile: bytes (BLOCK_N/2, D) packed along tokens, read transposed as (D, BLOCK_N/2)
        vbT = tl.load(VD + (base * (PS // 2) + off // 2 + offs_n2)[None, :] * D + offs_d[:, None],
                      mask=dmask[:, None], other=0)
        vsT = tl.load(VS + (base * (PS // 16) + off // 16 + offs_n16)[None, :] * D + offs_d[:, None],
                      mask=dmask[:, None], other=0)
        vT = _fp4_rows_f16(vbT, vsT, 16).to(tl.float32)  # (DP, BLOCK_N)
    else:
        # half-word (token pair t2, channels 2c, 2c+1): code k is (token 2·t2 + k%2, channel 2c + k//2)
        offs_c = tl.arange(0, DP // 2)
        cmask = dim_mask(offs_c, D // 2, DP // 2)[None, :]
        vh = tl.load(VD.to(tl.pointer_type(tl.int16)) + (base * (PS // 2) + off // 2 + offs_n2)[:, None] * (D // 2)
                     + offs_c[None, :], mask=cmask, other=0)
        # scale bytes of channels 2c, 2c+1 of the half-word's 16-token block, as one int16
        vs2 = tl.load(VS.to(tl.pointer_type(tl.int16)) + (base * (PS // 16) + off // 16 + offs_n16)[:, None] * (D // 2)
                      + offs_c[None, :], mask=cmask, other=0)
        vs2 = tl.reshape(tl.broadcast_to(vs2[:, None, :], (BLOCK_N // 16, 8, DP // 2)), (BLOCK_N // 2, DP // 2))
        o0, o1, o2, o3 = e2m1_halfwords_f16(vh, vs2)
        x = tl.join(tl.join(o0, o2), tl.join(o1, o3))  # [t2, c, b, a] = code a + 2b
        vT = tl.reshape(tl.permute(x, (1, 2, 0, 3)), (DP, BLOCK_N))  # [c, b, t2, a]: (channel, token)
    if THRIFT:
        # two-level P: P̂ = ϕ(P̃/s1) with s1 = rowmax(P̃ tile) / (448·6), s1 applied after the product
        pq, s1 = fake_quant_p_two_level(tl.where(selr[:, None], 0.0, p), 16)
    else:
        pq = fake_quant_p(p, 16, False)
    if ROWM:  # O += ϕ(P̃)·V̂ (P̂ exact in fp16, see below)
        accT = tl.dot(pq if DOT_F32 else pq.to(tl.float16), tl.trans(vT), accT)
    else:
        # P̂ is exact in fp16 (E2M1 code times an E4M3 scale, at most 2688)
        pqT = tl.trans(pq) if DOT_F32 else tl.trans(pq).to(tl.float16)
        # FP4 path: V's global scale vg is applied once after the loop. Thrift: the tile's products are
        # scaled by s1 (per query row: the columns) and vg here, as O += s1·(P̂·V̂) in the reference (s1
        # folded into P̂ before the fp16 MMA operand would round s1·P̂, or flush it when the tile's P̃ is small)
        if THRIFT:
            accT += tl.dot(vT, pqT) * (s1 * vg)[None, :]
            if any_sel:
                v16T = tl.load(V16 + (row0 + offs_n)[None, :] * D + offs_d[:, None], mask=dmask[:, None], other=0.0)
                p16T = tl.trans(tl.where(selr[:, None], p, 0.0))
                if DOT_F32:
                    accT += tl.dot(v16T.to(tl.float32), p16T)
                else:
                    accT += tl.dot(v16T, p16T.to(v16T.dtype))
        else:
            accT = tl.dot(vT, pqT, accT)
    return accT, l_i, m_new


@triton.jit
def _decode_split_kernel(
        Q, KD, KS, VD, VS, K16, V16, PT, LENS, KG, VG, SEL,
        OP, MP, LP,
        qk_scale, Hkv, NQ, G, MAXP, TPS, NS, WL, SINK,
        D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        THRIFT: tl.constexpr, DOT_F32: tl.constexpr, N_IT: tl.constexpr, WINDOW: tl.constexpr = False,
        SINKS: tl.constexpr = False, ROWM: tl.constexpr = False):
    """See the module docstring (kernel 1). ``DP``: the head dim D padded to a power of two, the channels of the
    tiles and of the partials' rows in OP."""
    pid_s = tl.program_id(0)
    pid_bh, b, h, L, C = kv_head_program(LENS, Hkv)  # C: committed (quantized) tokens; the rest is the raw tail
    r = tl.arange(0, BLOCK_M)  # query rows (g, i), the columns of the transposed tiles
    row_ok = r < G * NQ
    qi = r % NQ
    last_key = L - NQ + qi  # bottom-right causal: query i sees keys <= L - NQ + i
    offs_d = tl.arange(0, DP)
    # q rows (b, h*G + g, i) are contiguous in a (B, Hq, NQ, D) tensor
    q_rows = (b * Hkv + h).to(tl.int64) * G * NQ + r
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & dim_mask(offs_d, D, DP)[None, :],
                other=0.0).to(tl.float32)
    qf = fake_quant_rows(q, 16, False, True)  # ϕ(q) along D (exact in fp16)
    if not DOT_F32:
        qf = qf.to(tl.float16)
    qT = qf if ROWM else tl.trans(qf)  # ROWM: the rows along M (see _decode_tile)
    if THRIFT:  # the 16-bit q for the selected tiles' scores, as columns
        if DOT_F32:
            q16T = tl.trans(q)
        else:
            q16T = tl.trans(q.to(K16.dtype.element_ty))
    else:
        q16T = qT  # unused
    kg = tl.load(KG + pid_bh)
    vg = tl.load(VG + pid_bh)
    s_scale = qk_scale * kg  # log2-domain scale of the FP4 scores
    if not DOT_F32:
        s_scale = s_scale * 64.0  # the GPU tile decode yields K values times 2^-6
        vg = vg * 64.0  # ... and V values times 2^-6
    hq_rows = (b * Hkv + h) * G + r // NQ
    if SINKS:  # P̃ against max(split max, sink), as the one-shot max includes the sink; its l: in the reduce
        # SINK: the (Hq,) sinks in score units, hq_rows % Hq the query head
        m_i = tl.load(SINK + hq_rows % (G * Hkv), mask=row_ok, other=float("-inf")).to(tl.float32) * LOG2E_K
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if ROWM:
        accT = tl.zeros([BLOCK_M, DP], tl.float32)
    else:
        accT = tl.zeros([DP, BLOCK_M], tl.float32)
    start = pid_s * TPS
    if WINDOW:  # the splits cover the window of the sequence: from the tile holding its first visible key
        start += (tl.maximum(L - NQ - WL, 0) // BLOCK_N) * BLOCK_N
    end = tl.minimum(start + TPS, C)
    # ROWM: masked tiles (the window's first ones, the causal diagonal, the last partial tile) around an unmasked
    # run, 1.07-1.25x faster at 64-128 rows (H100). The transposed tiles keep one masked loop: with the three loops
    # they ran 1.04x (4 rows) and 1.44x (16 rows) slower (benchmarks/rowm-s27/).
    lo_end, full_end = decode_tile_runs(start, end, L, NQ, WL, BLOCK_N, WINDOW)
    if DOT_F32:
        # the interpreter cannot loop over program-id dependent bounds: fixed trip count + guard
        for it in range(0, N_IT):
            t0 = start + it * BLOCK_N
            if t0 < end:
                if ROWM and (t0 >= lo_end) & (t0 < full_end):
                    accT, l_i, m_i = _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok,
                                                  hq_rows, last_key, WL, C, b, h, KD, KS, VD, VS, K16, V16, PT, SEL,
                                                  Hkv, MAXP, D, DP, PS, BLOCK_N, THRIFT, DOT_F32, WINDOW, ROWM, False)
                else:
                    accT, l_i, m_i = _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok,
                                                  hq_rows, last_key, WL, C, b, h, KD, KS, VD, VS, K16, V16, PT, SEL,
                                                  Hkv, MAXP, D, DP, PS, BLOCK_N, THRIFT, DOT_F32, WINDOW, ROWM, True)
    elif ROWM:
        if WINDOW:
            for t0 in range(start, lo_end, BLOCK_N):
                accT, l_i, m_i = _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok, hq_rows,
                                              last_key, WL, C, b, h, KD, KS, VD, VS, K16, V16, PT, SEL, Hkv, MAXP,
                                              D, DP, PS, BLOCK_N, THRIFT, DOT_F32, WINDOW, ROWM, True)
        for t0 in range(lo_end, full_end, BLOCK_N):
            accT, l_i, m_i = _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok, hq_rows,
                                          last_key, WL, C, b, h, KD, KS, VD, VS, K16, V16, PT, SEL, Hkv, MAXP,
                                          D, DP, PS, BLOCK_N, THRIFT, DOT_F32, WINDOW, ROWM, False)
        for t0 in range(full_end, end, BLOCK_N):
            accT, l_i, m_i = _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok, hq_rows,
                                          last_key, WL, C, b, h, KD, KS, VD, VS, K16, V16, PT, SEL, Hkv, MAXP,
                                          D, DP, PS, BLOCK_N, THRIFT, DOT_F32, WINDOW, ROWM, True)
    else:
        for t0 in range(start, end, BLOCK_N):
            accT, l_i, m_i = _decode_tile(t0, accT, l_i, m_i, qT, q16T, s_scale, qk_scale, vg, row_ok, hq_rows,
                                          last_key, WL, C, b, h, KD, KS, VD, VS, K16, V16, PT, SEL, Hkv, MAXP,
                                          D, DP, PS, BLOCK_N, THRIFT, DOT_F32, WINDOW, ROWM, True)
    if not THRIFT:
        accT = accT * vg  # the FP4 products' V global scale (see _decode_tile)
    prow = (pid_bh.to(tl.int64) * NS + pid_s) * BLOCK_M + r
    if ROWM:
        tl.store(OP + prow[:, None] * DP + offs_d[None, :], accT, mask=row_ok[:, None])
    else:
        tl.store(OP + prow[None, :] * DP + offs_d[:, None], accT, mask=row_ok[None, :])
    tl.store(MP + prow, m_i, mask=row_ok)
    tl.store(LP + prow, l_i, mask=row_ok)


@triton.jit
def _decode_reduce_kernel(OP, MP, LP, Q, KT, VT, LENS, O, LSE, qk_scale, NS, GQ, NQ, Hkv, BLOCK_M, WL, SINK,
                          BLOCK_S: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, DB: tl.constexpr,
                          PDL: tl.constexpr = False, WINDOW: tl.constexpr = False, SINKS: tl.constexpr = False):
    """Grid (output rows, D / DB): program (r, j) merges the NS split partials of row r = (b·Hkv + h)·G·NQ +
    row, output channels j·DB .. j·DB + DB - 1, with the raw 16-bit tail (< 16 tokens per sequence, not yet
    quantized): its scores in FP32 from the input values, unquantized P̃ (kept out of the split kernel, where
    its tiles raised the register count of every program). One pass of max-rescaled sums over chunks of
    BLOCK_S splits: a B = 1 decode at long context has hundreds of splits and only B·Hq·NQ rows, so the
    channel blocks and the large chunks keep the programs many and their dependent loads few. ``DP``: the
    partials' row length in OP (D padded to a power of two); DB divides D."""
    r = tl.program_id(0)
    c0 = tl.program_id(1) * DB
    bh = r // GQ
    row = r % GQ
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, DP)
    dmask = dim_mask(offs_d, D, DP)
    offs_c = c0 + tl.arange(0, DB)
    # the tail: keys C .. L-1 (C = committed length), causal among the new queries (bottom-right)
    L = tl.load(LENS + bh // Hkv)
    C = L - L % 16
    offs_t = tl.arange(0, 16)
    tmask = (offs_t < L - C) & (C + offs_t <= L - NQ + row % NQ)
    if WINDOW:
        tmask = tmask & (C + offs_t >= L - NQ + row % NQ - WL)
    # q (B, Hq, NQ, D): row r is (b, hq, i)
    q = tl.load(Q + r.to(tl.int64) * D + offs_d, mask=dmask, other=0.0).to(tl.float32)
    trow = (bh.to(tl.int64) * 16 + offs_t)[:, None] * D
    kt = tl.load(KT + trow + offs_d[None, :], mask=tmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    st = tl.where(tmask, tl.sum(kt * q[None, :], 1) * qk_scale, float("-inf"))
    m_run = tl.max(st, 0)
    if SINKS:  # the query head's attention sink (log2 units): a key with no value, in the max and in l
        # row r = (b, query head, i); SINK: the (Hq,) sinks in score units
        sk = tl.load(SINK + (r // NQ) % (GQ // NQ * Hkv)).to(tl.float32) * LOG2E_K
        m_run = tl.maximum(m_run, sk)
    m_use = tl.where(m_run == float("-inf"), 0.0, m_run)
    pt = tl.where(tmask, tl.math.exp2(st - m_use), 0.0)
    l_tot = tl.sum(pt, 0)
    if SINKS:
        l_tot += tl.math.exp2(sk - m_use)
    vt = tl.load(VT + trow + offs_c[None, :], mask=tmask[:, None], other=0.0).to(tl.float32)
    o = tl.sum(vt * pt[:, None], 0)
    if PDL:  # launched as a programmatic dependent of the split kernel: its partials are complete from here on
        gdc_wait()
    for s0 in range(0, NS, BLOCK_S):
        smask = s0 + offs_s < NS
        prow = (bh.to(tl.int64) * NS + s0 + offs_s) * BLOCK_M + row
        m = tl.load(MP + prow, mask=smask, other=float("-inf"))
        l = tl.load(LP + prow, mask=smask, other=0.0)
        part = tl.load(OP + prow[:, None] * DP + offs_c[None, :], mask=smask[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_run - m_use)  # 0 while nothing was seen (m_run = -inf)
        w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_use))
        l_tot = l_tot * alpha + tl.sum(l * w, 0)
        o = o * alpha + tl.sum(part * w[:, None], 0)
        m_run = m_new
    inv = tl.where(l_tot > 0, 1.0 / l_tot, 0.0)
    tl.store(O + r.to(tl.int64) * D + offs_c, (o * inv).to(O.dtype.element_ty))
    if c0 == 0:
        lse = tl.where(l_tot > 0, (m_use + tl.math.log2(tl.where(l_tot > 0, l_tot, 1.0))) * 0.6931471805599453,
                       float("-inf"))
        tl.store(LSE + r, lse)


@triton.jit
def _nth(pos, it, x):
    """The entry of the 1-D tile ``x`` at the position numbered ``it`` in ``pos`` (positions are distinct; -1 for
    none): a scalar picked out of registers."""
    return tl.sum(tl.where(pos == it, x, 0), 0)


@triton.jit
def _page16(pidx, page, acc, m_i, l_i, q, qk_scale, sel_rows, row_ok, last_key, WL, C, h, K16, V16, SEL, Hkv, MAXP,
            offs_n, offs_d, dmask, D: tl.constexpr, PS: tl.constexpr, DOT_F32: tl.constexpr, WINDOW: tl.constexpr):
    """One selected page (index ``pidx`` of the sequence, pool page ``page``) of Thrift's 16-bit stream: scored for
    the query rows that selected it, online softmax, unquantized P̃ (rounded to V's dtype for the MMA) times 16-bit
    V."""
    selr = tl.load(SEL + sel_rows * MAXP + pidx, mask=row_ok, other=0) != 0
    rows = (page * Hkv + h) * PS + offs_n
    k16 = tl.load(K16 + rows[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
    v16 = tl.load(V16 + rows[:, None] * D + offs_d[None, :], mask=dmask[None, :], other=0.0)
    if DOT_F32:
        k16 = k16.to(tl.float32)
    keys = pidx * PS + offs_n
    ok = selr[:, None] & (keys < C)[None, :] & (keys[None, :] <= last_key[:, None])
    if WINDOW:
        ok = ok & (keys[None, :] >= (last_key - WL)[:, None])
    s = tl.where(ok, tl.dot(q, tl.trans(k16)) * qk_scale, float("-inf"))
    p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i, True)
    if DOT_F32:
        acc = acc * alpha[:, None] + tl.dot(p, v16.to(tl.float32))
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v16.dtype), v16)
    return acc, m_i, l_i


@triton.jit
def _decode_16bit_kernel(Q, K16, V16, PT, LENS, SEL, OP, MP, LP, qk_scale, Hkv, NQ, G, MAXP, NS, S0, WL,
                         D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr, PPS: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK_M: tl.constexpr, DOT_F32: tl.constexpr,
                         WINDOW: tl.constexpr = False, STAGES: tl.constexpr = 2):
    """Thrift's 16-bit stream for the Gluon FP4 kernel where that leaves the selected pages out (tiles of more than 64
    channels or 8 query rows; ``decode_gluon.fused16_fits``): grid (NS16, B·Hkv), program ``pid`` takes pages
    [pid·PPS, (pid+1)·PPS) of its sequence; a page that some query head of the kv group selected is scored from the
    16-bit copy (input-dtype q and K, FP32 accumulation) for the selecting rows only, with unquantized P̃ (rounded
    to V's dtype for the MMA, as the fused kernel does) and 16-bit V. Partials go to split slot S0 + pid (BLOCK_M
    rows per slot); the reduce merges them with the FP4 stream's by their maxima, which equals one online softmax
    over both. With ``WINDOW`` (left extent WL) the pages are counted from the sequence's first candidate page (that
    of key max(L − NQ − WL, 0): a windowed selection holds no earlier one) and the window masks the keys. Sinks need
    nothing here: the reduce merges them (this stream's P̃ is not quantized).

    The program first reads the selection bits and page-table entries of its PPS pages as one tile each and numbers
    the pages that some row selected (in order); the loop then runs over those only, picking the it-th one's index
    and pool page out of the registers, without a branch or a dependent load, so that the compiler pipelines it
    (``STAGES``: the next pages' K and V are copied into shared memory while one is computed). Before, the loop
    visited every page behind two branches: each page's loads waited on its selection bits, its page-table entry and
    the previous page's arithmetic. Same pages in the same order: the same partials (bit-equal, H200)."""
    pid = tl.program_id(0)
    pid_bh, b, h, L, C = kv_head_program(LENS, Hkv)
    r = tl.arange(0, BLOCK_R)
    row_ok = r < G * NQ
    last_key = L - NQ + r % NQ
    offs_d = tl.arange(0, DP)  # D padded to a power of two (OP's rows)
    dmask = dim_mask(offs_d, D, DP)
    offs_n = tl.arange(0, PS)
    q_rows = (b * Hkv + h).to(tl.int64) * G * NQ + r
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None] & dmask[None, :], other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    else:
        q = q.to(K16.dtype.element_ty)
    sel_rows = ((b * Hkv + h) * G + r // NQ).to(tl.int64)
    m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, DP], tl.float32)
    n_pages = (C + PS - 1) // PS
    p0 = 0
    if WINDOW:
        p0 = tl.maximum(L - NQ - WL, 0) // PS
    # the program's pages that some row selected: their positions in the list (in order) and pool pages
    pidx = p0 + pid * PPS + tl.arange(0, PPS)
    inb = pidx < n_pages
    selt = tl.load(SEL + sel_rows[:, None] * MAXP + pidx[None, :], mask=row_ok[:, None] & inb[None, :], other=0)
    hit = tl.max((selt != 0).to(tl.int32), 0)
    pos = tl.where(hit != 0, tl.cumsum(hit, 0) - 1, -1)
    pages = tl.maximum(tl.load(PT + b * MAXP + pidx, mask=inb, other=0), 0)  # -1 (past a reservation): page 0
    n_sel = tl.sum(hit, 0)
    if DOT_F32:  # the interpreter cannot loop to a computed bound: the same pages in a fixed trip count
        for it in range(0, PPS):
            if it < n_sel:
                acc, m_i, l_i = _page16(_nth(pos, it, pidx), _nth(pos, it, pages).to(tl.int64), acc, m_i, l_i, q,
                                        qk_scale, sel_rows, row_ok, last_key, WL, C, h, K16, V16, SEL, Hkv, MAXP,
                                        offs_n, offs_d, dmask, D, PS, DOT_F32, WINDOW)
    else:
        for it in tl.range(0, n_sel, num_stages=STAGES):
            acc, m_i, l_i = _page16(_nth(pos, it, pidx), _nth(pos, it, pages).to(tl.int64), acc, m_i, l_i, q,
                                    qk_scale, sel_rows, row_ok, last_key, WL, C, h, K16, V16, SEL, Hkv, MAXP, offs_n,
                                    offs_d, dmask, D, PS, DOT_F32, WINDOW)
    prow = (pid_bh.to(tl.int64) * NS + S0 + pid) * BLOCK_M + r
    tl.store(OP + prow[:, None] * DP + offs_d[None, :], acc, mask=row_ok[:, None])
    tl.store(MP + prow, m_i, mask=row_ok)
    tl.store(LP + prow, l_i, mask=row_ok)


# Launch configs, the best of the H200 sweeps in BENCHMARKS.md (issue 5). FP4: 1 warp, 32-key tiles,
# 2 stages, 12 programs per SM in one wave (the transposed tile needs 142 registers, so 14 fit; 8 per SM
# ran 1.13x slower, a partial last wave up to 1.6x). Thrift: its two-level P tile is 64 keys and its
# tiles also read 16-bit pages: 2 warps, 2 stages, ~2 programs per SM, at most ~16 tiles per split.
# Programs of more than 8 query rows use more warps (the accumulator is D x rows) and proportionally
# fewer programs per SM.
_CONFIGS = {False: dict(block_n=32, num_warps=1, num_stages=2, per_sm=12, max_tiles=None),
            True: dict(block_n=64, num_warps=2, num_stages=2, per_sm=2, max_tiles=16)}
# FP4 tiles of 256 channels (D > 128; where the Gluon kernel does not run: other GPUs): 2 warps, 64-key tiles, 3
# stages, 4 programs per SM, 1.02 / 1.08x cuDNN at (8,8,4,32k,256) / (1,8,4,128k,256) where the FP4 config above ran
# 0.83 / 0.82x (H100 sweep of 72 configs, benchmarks/d256-s28/: the best at each shape 1.05 / 1.08x)
_CONFIGS_WIDE_D = dict(block_n=64, num_warps=2, num_stages=3, per_sm=4, max_tiles=None)
# The Gluon kernel (decode_gluon, sm_90): one warp per program (at most 128 registers), 32-key tiles, 16
# programs per SM in one wave (H200 sweeps of 2026-11-22 in benchmarks/decode-s10/: 64-key tiles, 8-28
# programs per SM, register caps of 88-112, register or L2 prefetch of later tiles were all slower; a cp.async
# ring of the next tiles in shared memory was no faster, benchmarks/decode-s18/: the loop is ALU-bound).
# Short loops (windows, short contexts, small batches) take splits of fewer tiles, down to one, until the grid has
# 512 programs (min_programs): 1.06-1.27x faster at (B, context or window) = (8, w 128-512), (1, w 128-4096),
# (1, 1k-4k), (8, 512) on the H200, the other probed shapes unchanged (benchmarks/gluon-window-s25/splits_probe.py).
# More than 16 query rows per kv head (G·n_q: speculative decoding's draft tokens, wide GQA groups) without a Thrift
# selection: the Triton split kernel with the rows along the MMA's M (ROWM), as in prefill attention, so that the
# softmax and the P̃ rounding reduce along a warp's own keys. H100 sweep (benchmarks/multiq-s26/, 32-128 rows, D 64
# and 128): 64-key tiles on 4 warps with 2 programs per SM best or within 2% of the best but at one shape (D = 64,
# 64 rows: 32-key tiles, 4 per SM, 0.82x the time); 8 warps 1.1-1.8x and 32-key tiles 1.2-1.6x slower elsewhere.
# At D = 64 and 32 rows the transposed tiles stayed 6% faster (two runs): ROWM above 32 rows there (wide_rows).
# Up to 64 rows per program a cap of 168 registers (ptxas took 240 at D = 128: 2 programs per SM) lets 3 programs
# share an SM: 1.05-1.25x faster than 2 uncapped (one spilled value in the loop); at 128 rows the cap spills the
# loop (2.1-2.9x slower), so those keep 2 uncapped programs (benchmarks/rowm-s27/, H100). Keyed by BLOCK_M > 64, or
# tiles of more than 128 channels: at D = 256 and 32 rows (padded to 64) the capped config spilled, 1.79 ms against
# 0.585 ms uncapped with 2 programs per SM, the best of 48 configs (H100, benchmarks/d256-s28/rowm_sweep.py).
_WIDE_CONFIG = {False: dict(block_n=64, num_warps=4, num_stages=2, per_sm=3, max_tiles=None, maxnreg=168),
                True: dict(block_n=64, num_warps=4, num_stages=2, per_sm=2, max_tiles=None)}
_GLUON_CONFIG = {False: dict(block_n=32, num_warps=1, num_stages=1, per_sm=16, max_tiles=None, min_programs=512),
                 # Thrift: 64-key tiles (the two-level P̃ tile), the selected pages in the 16-bit stream (in the
                 # kernel for a kv group's selection at <= 128 channels, decode_gluon.group16_fits, and for per-head
                 # ones at <= 64 channels and <= 8 rows, decode_gluon.fused16_fits, which fit this cap); at most
                 # 168 registers (ptxas chose 174 for a variant of the kernel: 11 programs per SM, and splits sized
                 # for 12 per SM ran in two waves: the FP4 kernel 1.55x the time, the Thrift op 1.23-1.27x;
                 # benchmarks/grid-s19/)
                 True: dict(block_n=64, num_warps=1, num_stages=1, per_sm=12, max_tiles=None)}
# Head dims above 128 (Gemma 2 / 3: 256; 144-240 padded to 256). FP4: the 256-channel tile needs ~190 registers
# uncapped; 12 programs per SM under a 168-register cap (no spill at D = 256; ptxas, sm_90), 2.35-2.99x cuDNN at
# Gemma-like shapes where the Triton split kernel ran 0.80-0.83x (its best launch configs 1.05-1.08x); 8, 16 programs
# per SM or 64-key tiles were up to 8% slower, 10 or 14 per SM 1.4x (H100, benchmarks/d256-s28/). Thrift's 64-key tile
# takes 255 registers without spilling (8 per SM; a cap of 168 or 200 spills).
_GLUON_WIDE = {False: dict(block_n=32, num_warps=1, num_stages=1, per_sm=12, max_tiles=None, min_programs=512),
               True: dict(block_n=64, num_warps=1, num_stages=1, per_sm=8, max_tiles=None)}
# FP4 programs of 16 query rows (G·n_q 9..16) at D <= 128: the 128-register cap of 16 programs per SM spills (ptxas,
# sm_90: 176 bytes of stack), 168 registers do not: 12 per SM ran 1.07x / 1.07x faster than 16 at (8,32,8,32k,128)
# with 4 new tokens (H100 / H200, benchmarks/f2fp-s29/). At D <= 64 the unmasked tiles' next tile is prefetched
# into L2 (`decode_gluon`'s L2_PREFETCH): 1.04x at (8,32,8,32k,64) on both; 0.81-0.98x at D = 128 and 256. Into L1
# (`prefetch.global.L1`, one line per lane) at D = 128: 0.92-0.94x (H100, benchmarks/decode-s39/).
_GLUON_ROWS16 = dict(_GLUON_CONFIG[False], per_sm=12)
# FP4 tiles of 64 or 128 channels and <= 8 query rows carry the next tile's bytes in registers through the tile's work
# (`decode_gluon`'s PIPE, where `decode_gluon.pipe_fits`). Bit-equal outputs to the same splits without PIPE.
# - D = 128: 163 registers, so 12 programs per SM instead of 16 (without PIPE, 12 per SM ran 0.90-0.95x). Against the
#   16 per SM without it, one call per CUDA graph / 10 back to back: H200 1.013-1.058x / 1.005-1.048x at
#   (8,32,8,32k,128), (1,32,8,128k,128), (8,32,8,16k,128), (4,32,32,16k,128), (8,16,8,32k,128); H100 1.004-1.017x /
#   1.005-1.028x, except 0.98-1.00x at (8,32,8,32k,128) in two runs. On the H100 the step runs at the board's power
#   limit, where hiding load latency raises power and lowers the clock (benchmarks/layout-s43/).
# - D = 64: 111 registers, 16 per SM as before; in place of the next tile's L2 prefetch: H100 1.031-1.042x /
#   1.011-1.070x at (8,32,8,32k,64), (1,32,8,128k,64), (8,64,8,32k,64) (gpt-oss's heads), (8,32,8,8k,64); H200
#   0.992-1.005x / 1.000-1.033x (benchmarks/pipe-s45/).
# At short contexts, see _pipe_pays.
_GLUON_PIPE = {128: dict(_GLUON_CONFIG[False], per_sm=12), 64: dict(_GLUON_CONFIG[False])}
_PIPE_MIN_TILES = 8  # (see _pipe_pays)
_GLUON_L2_PREFETCH_MAX_D = 64
# GROUP16 (a kv group's Thrift selection, decode_gluon.group16_fits) at tiles of <= 64 channels: 16 programs per SM
# (its 146 registers capped at 128), 1.06-1.08x the 12 of the Thrift config at (8,32,8,32k,64) / (1,32,8,128k,64);
# at 128 channels 16 per SM ran 0.99x, 10 or 14 (200 / 144 registers) 0.64-0.71x, and the next FP4 tile's L2 prefetch
# 0.81-0.95x at both widths (H200, benchmarks/group16-s51/tune.py)
_GLUON_GROUP16_64 = dict(_GLUON_CONFIG[True], per_sm=16)

# The reduce kernel is launched as a programmatic dependent of the split kernel (sm_90+): its launch and its tail
# scores overlap the split kernel's last programs, it waits (griddepcontrol.wait) before reading the partials, and
# the Gluon split kernel lets it be scheduled from its start. Same bits; 1-2 us (1.5-4%) less per decode step on
# the H200 (benchmarks/decode-s21/). Not after Thrift's side stream (the reduce's predecessor there is the join).
# FP4ATTN_DECODE_PDL=0 launches them plainly.
_PDL = os.environ.get("FP4ATTN_DECODE_PDL", "1") != "0"
# Thrift's 16-bit stream (_decode_16bit_kernel): pages one program scans, its loop's pipeline stages (3: two slots of
# K and V pages in shared memory, 72 KB), warps. H200 (benchmarks/thrift16-s30/): 72.4 / 49.4 us at (8,32,8,32k,128) /
# (1,32,8,128k,128), where the loop with branches ran 87.8 / 55.0; 16 pages 69.8 / 45.8 alone but the Thrift op
# 214.1 / 132.1 against 214.2 / 130.1; 8 warps, 2 or 4 stages 1-16% slower.
_PAGES_16BIT = 32
_STAGES_16BIT = 3
_WARPS_16BIT = 4
# Thrift on Hopper, per-head selections: the Gluon FP4 kernel + the 16-bit stream (two kernels on two CUDA streams)
# pays a fixed cost that the fused Triton split kernel does not: below B·Hkv·(tokens covered) = 2^17 the Triton kernel
# is faster (a kv group's selection runs GROUP16 tiles in the one Gluon kernel at any size, see decode_fwd)
# (H100 CUDA graphs, benchmarks/gluon-window-s25/: Triton/Gluon time 0.71-0.88 at 2^15-2^16, 0.94-1.13 at
# 2^17, 1.19-1.46 at 2^18 and above; with or without a window).
_THRIFT_GLUON_MIN_WORK = 1 << 17
# How Thrift's two streams share the GPU: "side" runs the 16-bit kernel on a side CUDA stream, concurrently with the
# FP4 kernel (the FP4 loop is bound by its integer/conversion work and leaves room for the 16-bit kernel's
# reads: 5-9% less time at `bench decode`'s shapes on the H200, benchmarks/decode-s13/; with the pipelined 16-bit
# stream 1-4% less (the op at (8,32,8,32k,128) 214.5 against 221.1 us; with a given selection 202.2 / 116.2 against
# 203.7 / 121.5 at 32k / 128k; benchmarks/thrift16-s30/): the FP4 grid fills the SMs' registers, so the 16-bit
# programs mostly run as its programs finish; giving them a fixed share of every SM was slower), "serial" one after
# the other on the current stream. Same bits either way (each writes its own split slots).
# (_THRIFT_GLUON_MIN_WORK above was first measured with the 16-bit stream before it was pipelined. It still holds on
# the H200, benchmarks/thrift-fused-s31/: Triton/Gluon time at D = 128 (two kernels) 0.77-0.84 at 2^15-2^16,
# 1.12-1.17 at 2^17, 1.59-1.63 at 2^18; at D = 64 (the 16-bit pages inside the Gluon kernel) 0.86-0.88 at
# 2^14-2^16, 1.21-1.26 at 2^17, 1.46-1.75 above.)
_THRIFT_STREAMS = os.environ.get("FP4ATTN_THRIFT_STREAMS", "side")
if _THRIFT_STREAMS not in ("side", "serial"):
    raise ValueError(f"FP4ATTN_THRIFT_STREAMS: expected 'side' or 'serial', got {_THRIFT_STREAMS!r}")
_SIDE: dict = {}


def _side_stream(dev: torch.device) -> torch.cuda.Stream:
    """One side stream per device for Thrift's 16-bit stream (made on first use)."""
    s = _SIDE.get(dev)
    if s is None:
        s = _SIDE[dev] = torch.cuda.Stream(device=dev)
    return s


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    """SMs of CUDA device ``index`` (cached: the property query cost ~10 us per decode call)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def gluon_maxnreg(thrift: bool, per_sm: int | None = None) -> int:
    """The Gluon split kernel's register cap: ``per_sm`` (default ``_GLUON_CONFIG[thrift]["per_sm"]``) one-warp
    programs share an SM's 64K registers (allocated per warp in units of 8 per thread), as many as the splits are
    sized for."""
    return min(255, 65536 // (32 * (per_sm or _GLUON_CONFIG[thrift]["per_sm"])) // 8 * 8)


def wide_rows(D: int) -> int:
    """Above this many query rows per kv head (G·n_q) the split kernel runs with the rows along M (``rowm``)."""
    return 32 if D <= 64 else 16


def default_splits(B: int, hkv: int, max_committed: int, block_n: int, device=None, per_sm: int = 12,
                   max_tiles: int | None = None, min_programs: int = 0) -> int:
    """Splits along the context: at most ``per_sm`` programs per SM in all, each split keeping >= 4
    tiles, and at most ``max_tiles`` tiles per split when given (24 splits at B=8/Hkv=8/32k and 198 at
    B=1/Hkv=8/128k with the FP4 config on a 132-SM GPU). Where that leaves fewer than ``min_programs``
    programs (a short loop: a sliding window, a short context, a small batch), splits of fewer tiles, down to
    one, until there are ``min_programs``: each split is a chain of dependent tile loads."""
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    else:
        sms = 132
    tiles = max(1, -(-max_committed // block_n))
    fill = -(-tiles // 4)
    if B * hkv * fill < min_programs:
        fill = min(tiles, -(-min_programs // (B * hkv)))
    fill = min(per_sm * sms // (B * hkv), fill)
    return max(1, -(-tiles // max_tiles) if max_tiles else 1, fill)


def _pipe_pays(B: int, hkv: int, max_c: int, block_n: int, device, pcfg: dict, cfg: dict) -> bool:
    """Whether ``PIPE``'s config (``pcfg``) runs by default: where its splits are those of the config without it
    (``cfg``), or still hold >= ``_PIPE_MIN_TILES`` tiles. Its fewer programs per SM at D = 128 make the splits of a
    short context fewer and longer: at (8,32,8,4k,128) 24 splits of 5.3 tiles instead of 32 of 4 ran 0.977x / 0.986x
    (H100) and 0.982x / 0.953x (H200), one call per CUDA graph / 10 back to back; with equal splits at
    (1,32,8,8k,128) 1.08x / 1.05x and 1.09x / 1.04x; 10.7 tiles at (32,32,8,2k,128) 0.99-1.02x
    (benchmarks/pipe-s45/results/ab_pipe_short_*.txt)."""
    tiles = max(1, -(-max_c // block_n))
    n = default_splits(B, hkv, max_c, block_n, device, pcfg["per_sm"], pcfg["max_tiles"], pcfg.get("min_programs", 0))
    return n == default_splits(B, hkv, max_c, block_n, device, cfg["per_sm"], cfg["max_tiles"],
                               cfg.get("min_programs", 0)) or tiles >= _PIPE_MIN_TILES * n


def _selection_int8(selection: torch.Tensor, B: int, Hq: int, maxp: int) -> torch.Tensor:
    """A (B, Hq, n) page selection as the split kernel's SEL: int8 (B, Hq, max(maxp, 1)), zeros past the
    page table's maxp columns. ``select_pages``' output (already that) is used as is."""
    width = max(maxp, 1)
    if selection.dtype == torch.int8 and selection.shape == (B, Hq, width) and selection.is_contiguous():
        return selection
    sel = torch.zeros(B, Hq, width, dtype=torch.int8, device=selection.device)
    n = min(selection.shape[-1], maxp)
    sel[:, :, :n] = selection[:, :, :n].to(torch.int8)
    return sel


def _use_gluon(kernel: str, q: torch.Tensor, thrift: bool, rows: int, block_n: int, page_size: int,
               work: int | None = None) -> bool:
    """Whether the FP4 split loop runs the Gluon kernel (``decode_gluon``): ``kernel`` "auto" picks it on
    sm_90 (Hopper, where it is tested and timed) for the shapes it supports, "gluon" requires it (it also
    compiles for sm_89, which has the same mma.sync and E4M3 conversions, but has not run there),
    "triton" never uses it. ``FP4ATTN_DECODE_KERNEL`` overrides "auto". Thrift with less ``work`` (B·Hkv·tokens
    covered) than ``_THRIFT_GLUON_MIN_WORK`` runs the fused Triton kernel under "auto"."""
    if kernel not in ("auto", "gluon", "triton"):
        raise ValueError(f"kernel: expected 'auto', 'gluon' or 'triton', got {kernel!r}")
    if kernel == "auto":
        kernel = os.environ.get("FP4ATTN_DECODE_KERNEL", "auto")
        if kernel == "auto" and thrift and work is not None and work < _THRIFT_GLUON_MIN_WORK:
            return False
    if kernel == "triton":
        return False
    ok = (q.is_cuda and not _interpret() and (not thrift or block_n == 64)
          and decode_gluon.supported(q.shape[-1], rows, block_n, page_size))
    if kernel == "gluon":
        if not ok:
            raise ValueError("kernel='gluon': needs a CUDA device, D a multiple of 16 in [48, 256], at most 16 query "
                             "rows per kv head (G·n_q) and block_n 32 or 64 dividing the page size (64 with a Thrift "
                             "selection)")
        return True
    return ok and _dispatch.capability(q.device) == (9, 0)


def decode_fwd(q: torch.Tensor, cache, *, scale: float, selection: torch.Tensor | None = None,
               num_splits: int | None = None, block_n: int | None = None, num_warps: int | None = None,
               num_stages: int | None = None, kernel: str = "auto", per_sm: int | None = None,
               window: int | None = None, sinks: torch.Tensor | None = None, rowm: bool | None = None,
               block_m: int | None = None, maxnreg: int | None = None, pipe: bool | None = None,
               group_sel: bool = False, group16: bool | None = None):
    """q (B, Hq, NQ, D) contiguous -> (out (B, Hq, NQ, D) in q.dtype, lse (B, Hq, NQ) float32).

    ``selection``: (B, Hq, max_pages) bool Thrift selection (pages computed in 16 bits) or None; an int8
    (B, Hq, max(page_table columns, 1)) contiguous tensor (what :func:`select_pages` returns) is read as is.
    ``kernel``: the FP4 split loop's implementation (see ``_use_gluon``); ``per_sm``: programs per SM
    (default: the kernel's config below). ``window``: a sliding window's left extent w (query i sees keys
    len − n_q + i − w ... len − n_q + i): the splits cover only the last ~w + n_q tokens of each sequence
    (a Thrift ``selection`` is read for the window's pages only: pass the windowed one,
    ``select_pages(..., window=w)``). ``sinks`` (Hq,): attention sinks in score units, merged in the reduce (a
    key with no value: in the max, l and the LSE); the split kernels start their running max at the sink.
    ``rowm``: the Triton split kernel with the query rows along the MMA's M (default: for more than 16 rows
    per kv head without a Thrift selection, see ``_WIDE_CONFIG``); ``block_m``: its rows per program (padding).
    ``maxnreg``: a register cap for the split kernel (default: the config's; the Gluon kernel's from its programs per
    SM, ``gluon_maxnreg``). ``pipe``: the Gluon kernel's FP4 tiles carry the next tile's bytes in registers
    (``_GLUON_PIPE``; default: where ``decode_gluon.pipe_fits``, at most its programs per SM, and ``_pipe_pays``
    unless the splits or programs per SM are given).
    ``group_sel``: the caller vouches that ``selection``'s rows are equal within each kv group (``select_pages`` /
    ``thrift_select`` with share="group"). The Gluon kernel then computes a selected page as one 16-bit tile, its FP4
    bytes not read (``decode_gluon.GROUP16``; ``group16``: default where ``decode_gluon.group16_fits``, False keeps
    the paths for per-head selections), instead of reading and masking them and adding the page in a separate 16-bit
    stream (D > 64) or next to them in the same tile (``FUSED16``, D <= 64).
    """
    thrift = selection is not None
    B, Hq, NQ, D = q.shape
    Hkv = cache.num_kv_heads
    G = Hq // Hkv
    # a reserved cache (KVCache.reserve): splits sized for its capacity, so that a step captured in a CUDA
    # graph covers the tokens appended by later replays
    committed = cache.committed_lengths()
    max_c = max(max(committed) if committed else 0, cache.reserved_len - cache.reserved_len % 16)
    if window is not None:  # a window longer than every sequence, reserved length included, is capped there (exact;
        # and int32)
        window = min(window, max(max(cache.lengths, default=0), cache.reserved_len))
    gcfg = (_GLUON_WIDE if D > 128 else _GLUON_CONFIG)[thrift]
    # Thrift's work (sequences x kv heads x tokens the splits cover; 64: its tile) for the choice of its kernel;
    # none for a kv group's selection that GROUP16 runs: 1.17-1.28x the Triton kernel down to 2^14 (H200,
    # benchmarks/group16-s51/cross.py)
    # (the Gluon kernel's rows per program: block_m or G·n_q padded to >= 8, hence the max)
    group_ok = (thrift and group_sel and group16 is not False
                and decode_gluon.group16_fits(D, max(G * NQ, block_m or 0), cache.dtype))
    work = B * Hkv * (max_c if window is None else min(max_c, window + NQ + 64)) if thrift and not group_ok else None
    gluon = _use_gluon(kernel, q, thrift, G * NQ, block_n or gcfg["block_n"], cache.page_size, work)
    if rowm is None:
        rowm = not gluon and not thrift and G * NQ > wide_rows(D)
    if rowm and (gluon or thrift):
        raise ValueError("rowm: the Triton split kernel's FP4 tiles only (no Gluon kernel, no Thrift selection)")
    # ROWM's rows per program: at least the MMA's 16; on Hopper at least 64, the rows of a warp group's wgmma (32
    # rows ran mma.sync tiles: 1406 instead of 1184 SASS per tile, 1.03-1.05x the time of 64 padded rows, H100)
    BLOCK_M = None
    if rowm:
        hopper = q.is_cuda and not _interpret() and _dispatch.capability(q.device)[0] == 9
        BLOCK_M = block_m or max(64 if hopper else 16, next_pow2(G * NQ))
    # (the FP4 tile: the config's keys, or fewer where the page is smaller; see block_n below)
    bn = block_n or min(gcfg["block_n"], cache.page_size & -cache.page_size)
    fits = gluon and decode_gluon.pipe_fits(D, G * NQ, bn, thrift)
    if pipe and not fits:
        raise ValueError("pipe: the Gluon split kernel's FP4 tiles at D = 64 or 128, 32-key tiles, <= 8 query rows "
                         "per kv head, no Thrift selection")
    if pipe is None:  # (at most as many programs per SM as its registers allow; with explicit splits, on)
        pipe = fits and (per_sm or _GLUON_PIPE[D]["per_sm"]) <= _GLUON_PIPE[D]["per_sm"] and (
            num_splits is not None or per_sm is not None
            or _pipe_pays(B, Hkv, max_c if window is None else min(max_c, window + NQ + bn), bn, q.device,
                          _GLUON_PIPE[D], gcfg))
    if gluon:
        cfg = _GLUON_PIPE[D] if pipe else _GLUON_ROWS16 if not thrift and D <= 128 and G * NQ > 8 else gcfg
        if group_ok and next_pow2(D) <= 64:
            cfg = _GLUON_GROUP16_64
    elif rowm:
        cfg = _WIDE_CONFIG[BLOCK_M > 64 or D > 128]
    else:
        cfg = _CONFIGS_WIDE_D if D > 128 and not thrift else _CONFIGS[thrift]
    # FP4 tiles: the config's, or the largest power of two below it that divides the page (pages are multiples of
    # 16 tokens: 48 gives 16-key tiles); Thrift's tile is its 64-token block
    block_n = block_n or (cfg["block_n"] if thrift else min(cfg["block_n"], cache.page_size & -cache.page_size))
    if rowm:
        num_warps = num_warps or cfg["num_warps"]
    else:
        # query rows of a program (the columns of its transposed tiles), padded to a power of two >= 4
        # (>= 8 in the Gluon kernel: the MMA's N)
        BLOCK_M = block_m or max(8 if gluon else 4, next_pow2(G * NQ))
        wide = max(1, BLOCK_M // 8)  # more warps for more rows
        num_warps = 1 if gluon else num_warps or min(8, max(cfg["num_warps"], wide))
    num_stages = num_stages or cfg["num_stages"]
    PS = cache.page_size
    if PS % block_n:
        raise ValueError(f"page_size {PS} must be a multiple of block_n {block_n}")
    if selection is not None and block_n != 64:
        raise ValueError("Thrift decode needs block_n=64 (the two-level P tile of 64 keys)")
    interp = _interpret()
    q = q.contiguous()
    if window is not None:  # tokens the splits of one sequence cover: from its first visible key's tile
        max_c = min(max_c, window + NQ + block_n)
    if num_splits is None:
        per_sm = per_sm or max(1, cfg["per_sm"] * cfg["num_warps"] // num_warps)
        num_splits = default_splits(B, Hkv, max_c, block_n, q.device, per_sm, cfg["max_tiles"],
                                    cfg.get("min_programs", 0))
    tiles = max(1, -(-max_c // block_n))
    num_splits = max(1, min(int(num_splits), tiles))
    TPS = -(-tiles // num_splits) * block_n
    num_splits = max(1, -(-max_c // TPS)) if max_c else 1
    dev = q.device
    maxp = cache.page_table.shape[1]
    # Thrift with the Gluon FP4 kernel: its selected pages come from the kernel itself (fused16, small tiles) or from a
    # separate 16-bit stream whose partials occupy n16 more split slots (with a window: enough for its candidate pages)
    if group16 and not (gluon and group_ok):
        raise ValueError("group16: the Gluon kernel with a kv-group-shared selection (group_sel=True), <= 128 "
                         "channels, <= 8 query rows per kv head and a float16 / bfloat16 cache")
    group16 = gluon and group_ok
    fused16 = thrift and gluon and not group16 and decode_gluon.fused16_fits(D, BLOCK_M, cache.dtype)
    pages16 = max(maxp, 1) if window is None else _window_pages(window, NQ, PS, max(maxp, 1))
    n16 = max(1, -(-pages16 // _PAGES_16BIT)) if (thrift and gluon and not fused16 and not group16) else 0
    ns_all = num_splits + n16
    DP = next_pow2(D)  # the kernels' channels: a head dim of 48, 80, 96, ... runs padded tiles
    OP = torch.empty(B * Hkv * ns_all * BLOCK_M, DP, dtype=torch.float32, device=dev)
    MP = torch.empty(B * Hkv * ns_all * BLOCK_M, dtype=torch.float32, device=dev)
    # the (Hq,) sinks in score units, read (and taken to log2 units) by the kernels (an unused pointer without)
    sink = sinks.contiguous() if sinks is not None else MP
    LP = torch.empty_like(MP)
    if thrift:
        sel = _selection_int8(selection, B, Hq, maxp)
        k16, v16 = cache.k16, cache.v16
    else:
        sel = MP  # unused
        k16 = v16 = cache.k_tail  # unused (any 16-bit tensor)
    pt = cache.page_table if maxp else torch.zeros(B, 1, dtype=torch.int32, device=dev)
    # scale bytes as uint8 (decoded in registers; the interpreter has no float8 either)
    ks, vs = cache.k_scale.view(torch.uint8), cache.v_scale.view(torch.uint8)
    # the reduce as a programmatic dependent launch (see _PDL), sm_90+
    pdl = (_PDL and q.is_cuda and not interp and not (n16 and _THRIFT_STREAMS == "side")
           and _dispatch.capability(dev)[0] >= 9)
    if gluon:
        side = n16 and _THRIFT_STREAMS == "side"
        if side:  # the 16-bit partials on a side stream (forked from and joined back into the current one:
            # the tensors it uses are freed after the join, so the allocator needs no record_stream)
            cur = torch.cuda.current_stream(dev)
            s16 = _side_stream(dev)
            s16.wait_stream(cur)
            with torch.cuda.stream(s16):
                _launch_16bit(q, k16, v16, pt, cache.seq_lens, sel, OP, MP, LP, scale, Hkv, NQ, G, maxp, ns_all,
                              num_splits, n16, B, D, PS, BLOCK_M, interp, window)
        decode_gluon.launch(q, cache, pt, ks, vs, OP, MP, LP, scale * LOG2E, NQ, G, max(maxp, 1), TPS, num_splits,
                            BLOCK_M, block_n, sel if thrift else None, ns_all,
                            maxnreg=maxnreg or gluon_maxnreg(thrift, per_sm or cfg["per_sm"]),
                            pdl_trigger=pdl, window=window, sink=None if sinks is None else sink,
                            l2_prefetch=not thrift and not pipe and D <= _GLUON_L2_PREFETCH_MAX_D, fused16=fused16,
                            pipe=pipe, group16=group16)
        if side:
            cur.wait_stream(s16)
        elif n16:
            _launch_16bit(q, k16, v16, pt, cache.seq_lens, sel, OP, MP, LP, scale, Hkv, NQ, G, maxp, ns_all,
                          num_splits, n16, B, D, PS, BLOCK_M, interp, window)
    else:
        fast(_decode_split_kernel)[head_grid(num_splits, B * Hkv)](
            q, cache.k_data, ks, cache.v_data, vs, k16, v16, pt,
            cache.seq_lens, cache.k_global_scale, cache.v_global_scale, sel,
            OP, MP, LP,
            scale * LOG2E, Hkv, NQ, G, max(maxp, 1), TPS, num_splits, window or 0, sink,
            D=D, DP=DP, PS=PS, BLOCK_M=BLOCK_M, BLOCK_N=block_n, THRIFT=thrift, DOT_F32=interp,
            N_IT=TPS // block_n if interp else 0, WINDOW=window is not None, SINKS=sinks is not None, ROWM=rowm,
            num_warps=num_warps, num_stages=num_stages,
            **({} if interp or not (maxnreg or cfg.get("maxnreg")) else {"maxnreg": maxnreg or cfg["maxnreg"]}))
    out = torch.empty(B, Hq, NQ, D, dtype=q.dtype, device=dev)
    lse = torch.empty(B, Hq, NQ, dtype=torch.float32, device=dev)
    DB = min(D & -D, 32)  # output channels per reduce program (a power of two dividing D)
    fast(_decode_reduce_kernel)[(B * Hq * NQ, D // DB)](
        OP, MP, LP, q, cache.k_tail, cache.v_tail, cache.seq_lens, out, lse, scale * LOG2E, ns_all, G * NQ, NQ, Hkv,
        BLOCK_M, window or 0, sink, BLOCK_S=min(256, max(2, next_pow2(ns_all))), D=D, DP=DP, DB=DB,
        WINDOW=window is not None, SINKS=sinks is not None, num_warps=4,
        **({"PDL": True, "launch_pdl": True} if pdl else {}))
    return out, lse


def _launch_16bit(q, k16, v16, pt, seq_lens, sel, OP, MP, LP, scale, Hkv, NQ, G, maxp, ns_all, num_splits, n16,
                  B, D, PS, BLOCK_M, interp, window=None):
    """Thrift's 16-bit stream: the selected pages' partials into split slots num_splits.. of OP/MP/LP."""
    fast(_decode_16bit_kernel)[head_grid(n16, B * Hkv)](
        q, k16, v16, pt, seq_lens, sel, OP, MP, LP, scale * LOG2E, Hkv, NQ, G, max(maxp, 1),
        ns_all, num_splits, window or 0, D=D, DP=next_pow2(D), PS=PS, PPS=_PAGES_16BIT, BLOCK_R=max(16, BLOCK_M),
        BLOCK_M=BLOCK_M, DOT_F32=interp, WINDOW=window is not None, STAGES=_STAGES_16BIT, num_warps=_WARPS_16BIT)


# =================================================================================================
# Thrift page selection on the device (``ops.decode.thrift_select``'s semantics)
# =================================================================================================
MAX_SELECT_PAGES = 16384  # pages per sequence that the top-k kernel holds in one register tile


@triton.jit
def _page_scores_kernel(Q, KM, K16, KT, PT, LENS, S, Hkv, MAXP, NPG, WL,
                        NQ: tl.constexpr, G: tl.constexpr, G_P2: tl.constexpr, D: tl.constexpr,
                        DP: tl.constexpr, PS: tl.constexpr, CHUNK: tl.constexpr, WINDOW: tl.constexpr = False):
    """Grid (page chunks, B·Hkv). Ŝ[b, h·G + g, p] = q̄·K̄_p (FP32) for the program's CHUNK pages p that
    are valid (p < ceil(L_b / PS)), for the G query heads of kv head h at once (every page mean is read
    once per GQA group); q̄ = the mean of the NQ new queries. A full page reads its stored FP32 mean; the
    sequence's partial last page is averaged here over its committed 16-bit tokens and the raw tail,
    as ``KVCache.block_means`` (equal up to float32 summation order). With ``WINDOW`` (left extent WL) the
    chunks start at the sequence's first candidate page, max(L − NQ − WL, 0) // PS: only the window's pages
    are scored (the entries before them are left unset)."""
    pid_c = tl.program_id(0)
    pid_bh, b, h, L, _ = kv_head_program(LENS, Hkv)
    n_b = tl.minimum((L + PS - 1) // PS, NPG)  # NPG bounds it when a graph replays past its capture
    nfull = L // PS
    p0 = pid_c * CHUNK
    if WINDOW:
        p0 += tl.maximum(L - NQ - WL, 0) // PS
    if p0 < n_b:
        offs_p = p0 + tl.arange(0, CHUNK)
        offs_d = tl.arange(0, DP)  # D padded to a power of two
        dmask = dim_mask(offs_d, D, DP)
        full = offs_p < nfull
        page = tl.load(PT + b * MAXP + offs_p, mask=full, other=0).to(tl.int64)
        km = tl.load(KM + (page * Hkv + h)[:, None] * D + offs_d[None, :], mask=full[:, None] & dmask[None, :],
                     other=0.0)
        if (L % PS != 0) & (nfull >= p0) & (nfull < p0 + CHUNK):
            # the partial page nfull: its committed tokens (16-bit copy) + the raw tail, over their count
            C = L - L % 16
            in_page = C - nfull * PS
            ppage = tl.load(PT + b * MAXP + nfull, mask=in_page > 0, other=0).to(tl.int64)
            offs_t = tl.arange(0, 16)
            acc = tl.zeros([16, DP], tl.float32)
            for t0 in range(0, PS, 16):
                rows = (ppage * Hkv + h) * PS + t0 + offs_t
                acc += tl.load(K16 + rows[:, None] * D + offs_d[None, :],
                               mask=(t0 + offs_t < in_page)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
            tail = (b * Hkv + h).to(tl.int64) * 16 + offs_t
            acc += tl.load(KT + tail[:, None] * D + offs_d[None, :], mask=(offs_t < L - C)[:, None] & dmask[None, :],
                           other=0.0).to(tl.float32)
            part = tl.sum(acc, 0) / (L - nfull * PS).to(tl.float32)
            km = tl.where((offs_p == nfull)[:, None], part[None, :], km)
        # q̄ of the group's G heads as one (G, D) tile: NQ independent loads of one query row per head (their latency
        # overlaps the means'; registers for G rows, whatever NQ), each head's q̄ then picked out of registers
        offs_g = tl.arange(0, G_P2)
        qrow0 = ((b * Hkv + h) * G + offs_g).to(tl.int64) * NQ  # the first new query of each head
        qsum = tl.zeros([G_P2, DP], tl.float32)
        for i in tl.static_range(NQ):
            qsum += tl.load(Q + (qrow0 + i)[:, None] * D + offs_d[None, :],
                            mask=(offs_g < G)[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        qbars = qsum / NQ
        for g in tl.static_range(G):
            hq = (b * Hkv + h) * G + g
            qbar = tl.sum(tl.where((offs_g == g)[:, None], qbars, 0.0), 0)
            s = tl.sum(km * qbar[None, :], 1)
            tl.store(S + hq.to(tl.int64) * NPG + offs_p, s, mask=offs_p < n_b)


@triton.jit
def _page_topk_kernel(S, LENS, SEL, Hq, NPG, W, budget_bits, NQ, WL, G, PS: tl.constexpr, BLOCK: tl.constexpr,
                      WINDOW: tl.constexpr = False, SHARE: tl.constexpr = False):
    """One program per (sequence, query head) row of Ŝ: selects the kk = clamp(round(f·n_b), 1, n_b) best
    of the row's n_b valid pages, ties to the lower page index (the stable descending sort of
    ``thrift_select``), and writes the row's int8 selection (W columns, 0 past the selected ones).
    With ``WINDOW`` the candidates are the pages p0 = max(L − NQ − WL, 0) // PS ... n_b − 1 (n_w = n_b − p0 of
    them, kk = clamp(round(f·n_w), 1, n_w)): the tile holds BLOCK pages from p0 on and only its columns are
    written (the caller zeroes the row). With ``SHARE`` (``ops.decode``'s thrift_share="group") the program
    writes a 1 for each of its selected pages into the rows of all G query heads of its kv group and nothing
    else: on a zeroed SEL every row ends up the union of its group's selections (the programs of a group store
    the same value, so their order does not matter).

    kk: the budget f arrives as the bits of its float64 (a Python float argument would be passed as
    float32); f·n_b is rounded to float64 and then half to even, as Python's ``round(f * n)``.
    Top-k: each score becomes an order-preserving int32 key (-0.0 as +0.0 first, so that the two tie as
    in the sort; NaN as the largest key: torch.sort(descending) puts NaN first, several NaNs in index
    order). A 32-step bisection over the key range finds T, the kk-th largest key (the largest T with
    #(key >= T) >= kk); the selection is every key > T plus the lowest-index keys == T (a cumulative
    count) up to kk."""
    r = tl.program_id(0)
    L = tl.load(LENS + r // Hq)
    n_b = tl.minimum((L + PS - 1) // PS, NPG)
    if WINDOW:  # the candidates: the pages from the one holding the first key some query row sees
        p0 = tl.maximum(L - NQ - WL, 0) // PS
        n_c = n_b - p0
        offs = p0 + tl.arange(0, BLOCK)
    else:
        n_c = n_b
        offs = tl.arange(0, BLOCK)
    x = n_c.to(tl.float64) * budget_bits.to(tl.float64, bitcast=True)
    fl = x.to(tl.int64)  # x >= 0: truncation is the floor
    # x against fl + 0.5 (exact) by comparisons only: the fraction x − fl was contracted with the product into
    # one fma on the GPU, the unrounded f·n (0.1·65 = 6.50000000000000036: k = 7 where round(6.5) = 6)
    half = fl.to(tl.float64) + 0.5
    kk = fl + ((x > half) | ((x == half) & (fl % 2 == 1))).to(tl.int64)
    kk = tl.minimum(tl.maximum(kk, 1), n_c.to(tl.int64)).to(tl.int32)
    valid = offs < n_b
    s = tl.load(S + r.to(tl.int64) * NPG + offs, mask=valid, other=0.0)
    s = tl.where(s == 0.0, 0.0, s)
    bits = s.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats: larger magnitude, smaller key
    key = tl.where(s != s, 2147483647, key)
    # invalid pages hold the smallest key, which no valid score maps to (that would be a NaN) and the
    # bisection never counts (its thresholds are > lo >= INT32_MIN)
    key = tl.where(valid, key, -2147483648)
    lo = tl.full([], -2147483648, tl.int64)  # #(key >= lo) >= kk (every valid page)
    hi = tl.full([], 2147483647, tl.int64)  # #(key > hi) = 0 < kk
    for _ in range(32):  # 2^32 candidate thresholds, halved per step
        mid = (lo + hi + 1) >> 1
        ok = tl.sum((key >= mid.to(tl.int32)).to(tl.int32), 0) >= kk
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    T = lo.to(tl.int32)
    gt = valid & (key > T)
    eq = valid & (key == T)
    room = kk - tl.sum(gt.to(tl.int32), 0)
    sel = gt | (eq & (tl.cumsum(eq.to(tl.int32), 0) <= room))
    if SHARE:
        r0 = (r - r % G).to(tl.int64)  # the group's first row
        for g in range(G):
            tl.store(SEL + (r0 + g) * W + offs, tl.full([BLOCK], 1, tl.int8), mask=sel & (offs < W))
    else:
        tl.store(SEL + r.to(tl.int64) * W + offs, sel.to(tl.int8), mask=offs < W)


def _scored_pages(cache) -> int:
    """Pages per row that the Thrift selection scores: those of the longest sequence, or of the reserved length
    (``KVCache.reserve``) so that a selection captured in a CUDA graph covers the pages later replays add (the
    top-k kernel reads only each sequence's own pages, from the lengths on the device)."""
    return max(1, -(-max(cache.get_seq_length(), cache.reserved_len) // cache.page_size))


def _window_pages(window: int, nq: int, page_size: int, npg: int) -> int:
    """The most candidate pages a sequence has under a window of left extent ``window`` with ``nq`` new queries
    (pages holding keys L − nq − window ... L − 1: window + nq keys), at most ``npg``."""
    return min(npg, -(-(window + nq) // page_size) + 1)


def _cap_window(window: int, npg: int, page_size: int) -> int:
    """A window's left extent capped at the scored pages' tokens (``_scored_pages``: the longest or reserved
    length): the same candidate pages (it already reaches key 0 of every sequence), and an int32 kernel
    argument."""
    return min(int(window), npg * page_size)


def page_scores(q: torch.Tensor, cache, *, chunk: int | None = None, num_warps: int = 1,
                window: int | None = None) -> torch.Tensor:
    """(B, Hq, npg) float32 Ŝ = q̄·K̄_p of the Thrift selection (npg: ``_scored_pages``); entries of pages
    past a sequence's end are left unset, and with ``window`` (a sliding window's left extent) those before its
    first candidate page (see ``_page_scores_kernel``). q (B, Hq, NQ, D) contiguous."""
    B, Hq, NQ, D = q.shape
    Hkv = cache.num_kv_heads
    ps = cache.page_size
    npg = _scored_pages(cache)
    # a (16, D) FP32 tile of page means, one warp: the best or within 0.3 us of it in H200 sweeps (chunk 8-128 x 1-4
    # warps, CUDA graphs: 9.7 / 8.1 / 13.7 / 9.6 us at (8,32,8,32k) / (1,32,8,128k), D = 64 / 128, with ~4 us of graph
    # launch in each; benchmarks/thrift-fused-s31/probe_select.py; 64 / 32 pages ran 10.5 / 9.5 / 13.9 / 10.6)
    chunk = chunk or 16
    maxp = cache.page_table.shape[1]
    pt = cache.page_table if maxp else torch.zeros(B, 1, dtype=torch.int32, device=q.device)
    scores = torch.empty(B, Hq, npg, dtype=torch.float32, device=q.device)
    rows = npg  # the pages scored per sequence: all, or with a window its candidates (from each one's first)
    if window is not None:
        window = _cap_window(window, npg, ps)
        rows = _window_pages(window, NQ, ps, npg)
    fast(_page_scores_kernel)[head_grid(cdiv(rows, chunk), B * Hkv)](
        q, cache.k_page_mean, cache.k16, cache.k_tail, pt, cache.seq_lens, scores, Hkv, max(maxp, 1), npg,
        window or 0, NQ=NQ, G=Hq // Hkv, G_P2=next_pow2(Hq // Hkv), D=D, DP=next_pow2(D), PS=ps, CHUNK=chunk,
        WINDOW=window is not None, num_warps=num_warps)
    return scores


def page_topk(scores: torch.Tensor, seq_lens: torch.Tensor, page_size: int, budget: float, width: int, *,
              num_warps: int | None = None, window: int | None = None, nq: int = 1, group: int = 1) -> torch.Tensor:
    """(B, Hq, width) int8 selection from (B, Hq, npg) float32 scores (only the first ceil(L_b /
    page_size) of each row are read; with ``window``, a sliding window's left extent for ``nq`` new queries,
    only the candidate pages max(L_b − nq − window, 0) // page_size ... of them), width >= 1; ``group`` > 1:
    each row the union of its group of ``group`` consecutive rows' (a kv group's query heads); see
    ``_page_topk_kernel``."""
    B, Hq, npg = scores.shape
    if window is not None:
        window = _cap_window(window, npg, page_size)
    # the top-k tile: every page of a row, or with a window its candidate pages
    block = max(16, next_pow2(npg if window is None else _window_pages(window, nq, page_size, npg)))
    if block > MAX_SELECT_PAGES:
        raise ValueError(f"the top-k kernel holds at most {MAX_SELECT_PAGES} pages per row, got {npg}")
    bits = struct.unpack("<q", struct.pack("<d", float(budget)))[0]
    num_warps = num_warps or min(8, max(1, block // 512))
    # columns past the tile (a page table wider than the longest sequence; with a window, all but the candidate
    # pages' columns) are zeroed up front
    alloc = torch.empty if window is None and width <= block and group == 1 else torch.zeros
    sel = alloc(B, Hq, width, dtype=torch.int8, device=scores.device)
    fast(_page_topk_kernel)[(B * Hq,)](scores, seq_lens, sel, Hq, npg, width, bits, nq, window or 0, group,
                                       PS=page_size, BLOCK=block, WINDOW=window is not None, SHARE=group > 1,
                                       num_warps=num_warps)
    return sel


def select_pages(q: torch.Tensor, cache, budget: float, window: int | None = None, share: str = "head") -> torch.Tensor:
    """The Thrift decode selection of ``ops.decode.thrift_select(q, cache, budget, window, share)`` computed by
    two kernels (scores, then top-k per row; with share="group" per kv group, the union of its rows), as the
    (B, Hq, max(max_pages, 1)) int8 tensor that :func:`decode_fwd`'s ``selection`` takes without a copy. Device
    ops only (no host sync, CUDA-graph capturable). ``window``: a sliding window's left extent w
    (``window_size=(w, 0)``) or None: the top-k among the pages holding keys some query row sees (only those
    are scored). Rows of more than ``MAX_SELECT_PAGES`` pages (candidate pages with a window) run
    ``thrift_select`` instead.

    The scores equal ``thrift_select``'s up to float32 summation order (the partial page's mean, the
    dot products, q̄ for n_q > 1), so the selections are equal except where two pages' scores are within
    a few float32 ulps of each other at the k-th place; exact ties (equal means) go to the lower index
    in both."""
    B, Hq, NQ, D = q.shape
    maxp = cache.page_table.shape[1]
    width = max(maxp, 1)
    npg = _scored_pages(cache)
    rows = npg if window is None else _window_pages(window, NQ, cache.page_size, npg)
    from ..ops.decode import SHARES, thrift_select  # (ops.decode imports this module lazily too)

    check_choice("share", share, SHARES)  # (a misspelt value would run the per-head rule silently)
    group = Hq // cache.num_kv_heads if share == "group" else 1
    if max(16, next_pow2(rows)) > MAX_SELECT_PAGES:
        return _selection_int8(thrift_select(q, cache, budget, window, share=share), B, Hq, maxp)
    scores = page_scores(q.contiguous(), cache, window=window)
    return page_topk(scores, cache.seq_lens, cache.page_size, budget, width, window=window, nq=NQ, group=group)


__all__ = ["decode_fwd", "default_splits", "page_scores", "page_topk", "select_pages"]


def compile_for_target(capability: int = 90, *, thrift: bool = False, d: int = 128, page_size: int = 64,
                       block_m: int = 4, block_n: int = 64, dtype16: str = "bf16", num_warps: int = 4,
                       num_stages: int = 2, window: bool = False, sinks: bool = False):
    """Compile the split kernel for ``cuda:capability`` with Triton's AOT API (no GPU needed); returns
    the compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``, ``.n_regs``, ``.n_spills`` when known).
    ``window`` / ``sinks``: the sliding-window and attention-sink variants (with ``thrift`` or without)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptrs = {"Q": "*bf16", "KD": "*u8", "KS": "*u8", "VD": "*u8", "VS": "*u8", "K16": f"*{dtype16}",
            "V16": f"*{dtype16}", "PT": "*i32", "LENS": "*i32",
            "KG": "*fp32", "VG": "*fp32", "SEL": "*i8", "OP": "*fp32", "MP": "*fp32", "LP": "*fp32"}
    sig = {**ptrs, "qk_scale": "fp32", **{n: "i32" for n in ("Hkv", "NQ", "G", "MAXP", "TPS", "NS", "WL")},
           "SINK": "*fp32"}
    consts = dict(D=d, DP=next_pow2(d), PS=page_size, BLOCK_M=block_m, BLOCK_N=block_n, THRIFT=thrift,
                  DOT_F32=False, N_IT=0, WINDOW=window, SINKS=sinks)
    sig.update({k: "constexpr" for k in consts})
    # pointers 16-byte aligned, as the JIT specializes them at run time
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(ptrs))}
    src = ASTSource(_decode_split_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
