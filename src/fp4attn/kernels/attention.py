"""FP4 inference attention kernels (SPEC §3 ``fp4attn.attention``, issue 4): nvfp4 / mxfp4 / sage3.

Two kernels, read top to bottom:

1. **Pre-pass** (``_prep_qk_kernel``, ``_prep_v_kernel``): one memory-bound sweep per tensor writes the
   quantized operands in their *storage* form, packed E2M1 codes (two per byte, element 2i in the low
   nibble) plus one scale byte per block (E4M3 for NVFP4, E8M0 for MXFP4):

   * Q and K quantized along D: codes ``(B, H, N_pad, D_pad/2)``, scales ``(B, H, N_pad, D_pad/QB)``.
   * V quantized along tokens (blocks of 16/32 consecutive keys per channel) and packed along tokens,
     so that the P·V product reads it along its reduction dim: codes ``(B, H, N_pad/2, D_pad)``
     (byte (t, d) = keys 2t, 2t+1 of channel d), scales ``(B, H, D_pad, N_pad/QB)``.
   * SageAttention3 smoothing is fused: ``smooth_k`` subtracts the per-head token mean k̄ (one torch
     reduction computes k̄; the subtraction happens in the kernel before quantizing); ``smooth_q``
     subtracts the per-128-query-block mean q̄ᵢ, computed inside the 128-row tile, and stores q̄ᵢ in
     FP32. The correction cᵢⱼ = q̄ᵢ·γ(kⱼ) uses the *unquantized* smoothed K, as the reference (the
     dequantized K̂ instead moves the result by ~0.05 relative L2 at small sizes, at the SPEC §6 limit):
     ``_smooth_q_corr_kernel`` writes it as a table, one FP32 value per (query block, key), from
     tensor-core products of ~fp32 accuracy (16-bit K: q̄ᵢ·kⱼ − q̄ᵢ·k̄, the keys exact as an operand, against
     q̄ᵢ in three bf16 / two TF32 parts; else tf32x3), and the main kernel adds scale·cᵢⱼ to S: one load per key
     instead of a K tile reduced against q̄ᵢ in every key tile of every query tile (that cost sage3 ~25% of its
     time). The table grows as N²/32 bytes per head, so ``attention_packed`` builds it for as many
     query blocks at a time as ``smooth_q_table_max_bytes`` (256 MiB) allows and runs the main kernel
     chunk by chunk (K is read once more per chunk: negligible next to the N² attention work).
   * Optional *staged* operands (``staged=True`` / ``FP4ATTN_ATTN_OPERANDS=staged``, the Hopper
     default): K̂ and V̂ᵀ are written once per tensor in the tensor-core dtype (exact fp16 NVFP4 values /
     the FP8 MXFP4 embedding below), so the main loop loads them instead of dequantizing the packed
     codes again in every query tile. The K and V pre-passes write them from the codes still in
     registers (the values ``stage_operands`` decodes from the packed form), and in this mode the
     packed K / V codes, which nothing reads, are not written; MXFP4 V̂ᵀ needs every token's block
     exponent first, so V's packed codes go through ``_stage_kernel`` as a second pass. For the Gluon passes
     (nvfp4 and sage3 at D = 64 / 128, Thrift's FP4 phase) they are written in those passes' key order
     (``quantize_qkv(key_perm=True)``, ``_tiles.key_position``: each 16-key block of P̃ in one thread; see
     ``attention_gluon``), and so is sage3's smooth_q table (``smooth_q_corr``).
   * MXFP4 V also records, per (head, channel), the largest block exponent over all tokens
     (``atomic_max``): the FP8 embedding below needs it.
   * Non-finite inputs are flagged here, where every element is seen anyway (see "Non-finite inputs"
     below): per query row, the first non-finite key row of each head and the non-finite V channels.

   Rounding is the reference's (IEEE division by the NVFP4 scale, exact power-of-two scaling for MXFP4,
   ties to the even code), from ``fp4attn.formats.triton_helpers``; the codes are bit-identical to
   ``fp4attn.quantize`` for finite inputs.

2. **Main kernel** (``_attn_fwd_kernel``): FlashAttention-2 style forward. Per BLOCK_M-query tile it
   streams key tiles: S = scale·Q̂K̂ᵀ (log2 domain) [+ scale·q̄ᵢ·γ(Kⱼ)ᵀ for smooth_q], online softmax
   with the running max m and l = rowsum of the *unquantized* P̃ = exp(S − m), P̃ quantized in registers
   in blocks of 16 (NVFP4) / 32 (MXFP4) keys, O += ϕ(P̃)·V̂. Two-level P (sage3): per row and key tile
   s1 = rowmax(P̃)/(448·6), O += s1·(ϕ(P̃/s1)·V̂). Causal is bottom-right aligned; tiles above the
   diagonal are skipped and only diagonal / ragged-tail tiles are masked. A sliding window
   (``window``, FlashAttention's ``window_size``) moves the right edge (``COFF``) and adds a left one
   (``WINDOW``, ``LOFF``): key tiles left of every row's window are skipped too, and the tiles its left
   edge crosses are masked (sm_90, D = 128: 575 SASS per unmasked tile, 589 without window; 252 registers).
   GQA reads kv head h // (Hq/Hkv) (nothing repeated in memory). Output in q's dtype, LSE in FP32 (natural log).

   The operand path is a constexpr ``PATH``:

   * ``PATH_HOPPER`` (sm_80 … sm_90), the fast path on H100/H200:

     - **NVFP4 on FP16 tensor cores.** An NVFP4 value q·s (E2M1 times an E4M3 scale, no global scale)
       has at most 6 significant bits and lies in [2⁻¹⁰, 2688]: it is *exact* in float16 (normal
       range). Codes and scales are decoded with bit shifts straight into fp16
       (``e2m1_decode_f16``/``e4m3_decode_f16``), multiplied in fp16 (exact) and fed to fp16
       ``tl.dot`` with FP32 accumulation. ϕ(P̃) (and ϕ(P̃/s1)) are exact in fp16 too. Same products as
       a bf16 emulation, with half the conversion work. (The issue says bf16; fp16 is equally exact
       here and cheaper to produce from the bits.)
     - **MXFP4 on FP8 tensor cores.** An MXFP4 value is c·2ᵉ with c ∈ {0, ±0.5, …, ±6}. For each row of
       Q and K (each query / key) take the largest block exponent E of the row and store c·2^(e − E + 6)
       in float8e4nv: 6·2⁶ = 384 ≤ 448, and c·2^k is a multiple of 2^(k−1), which E4M3 represents
       exactly (down to its subnormal step 2⁻⁹) as long as k ≥ −8, i.e. for every block at most **14
       binades below its row's largest block** (e ≥ E − 14). QKᵀ then runs as an fp8 ``tl.dot``
       (products of two such values are exact in FP32, and so are the sums up to FP32 accumulation
       order), and the offsets are folded back in the FP32 scale of S: S = dot · 2^(E_q − 6) · 2^(E_k −
       6) · scale. Hopper's FP8 MMA accumulates with reduced precision (about 14 bits survive; Triton's
       sm_90 default lets it run over the whole K), so the QKᵀ dot promotes to the FP32 accumulator
       after every 32 products (``max_num_imprecise_acc=32``: one MXFP4 block, whose products share one
       scale); without it S was off by ~1e-4 relative at a 14-binade span on the H200, and the outputs
       of rows whose blocks lie 2-7 binades apart moved by 1e-4 to 4e-3 relative L2
       (benchmarks/gluon-mx-s20). The P·V dot keeps the fast accumulation (its ~2⁻¹⁴ relative rounding
       is far below the FP4 error; SPEC §6 checks pass). V uses the largest block exponent of each
       *channel* over all tokens (the P·V reduction runs over tokens), folded into the output columns.
       ϕ(P̃) ≤ 1 has block exponents ≤ −2 and is stored as ϕ(P̃)·2⁸ (ϕ(P̃/s1) ≤ 3072 for two-level P as
       ϕ·2⁻³), exact for blocks down to 2⁻¹⁶ (2⁻⁵ for the two-level ϕ values, i.e. P̃ ≥ ~2⁻¹⁶·s1·…);
       smaller P̃ blocks are rounded by the FP8 conversion (round to nearest) and contribute below 2⁻¹⁴
       of the row's largest weight. **Exactness condition:** every Q/K block within 14 binades of its
       row's largest block, every V block within 14 binades of its channel's largest block, every ϕ(P̃)
       block exponent ≥ −16 (−5 for two-level); blocks outside it are rounded to the E4M3 grid (they
       underflow), nothing else changes. ``tests/test_attention_kernels.py`` checks S bit for bit
       against an FP32 emulation on inputs inside the condition.

   * ``PATH_BLACKWELL`` (sm_100 / sm_120): the same kernel feeds the packed codes and the scale bytes
     straight to ``tl.dot_scaled`` (native block-scaled MMA: ``tcgen05.mma … block_scale`` on
     sm_100, ``mma.sync … kind::mxf4nvf4`` on sm_120). MXFP4: e2m1 with e8m0 scales (group 32).
     NVFP4: Triton 3.6 treats a ``float8e4nv`` scale tensor as group 16 (``scale_vec::4X``,
     ``ue4m3``), i.e. exactly NVFP4 without a global scale. ϕ(P̃) is re-quantized to codes and
     scale bytes in registers. ``tests/test_blackwell_ptx.py`` compiles this path for sm_100 and
     sm_120 on CPU and checks the PTX; we have no Blackwell GPU, so no speed claims. On Hopper,
     Triton emulates MXFP4 ``dot_scaled`` (bf16 upcast), which lets the GPU tests run this path's
     logic for ``mxfp4`` numerically.

   * ``PATH_INTERP`` (``TRITON_INTERPRET=1``): the interpreter has no ``dot_scaled`` and no
     fp16/fp8 ``tl.dot``; the same decoded values (exact in FP32 as well) go through an fp32 dot.

Softmax max. The reference quantizes P̃ = exp(S − m) against the *one-shot* row max. One-pass online
softmax quantizes early tiles against a smaller running max, i.e. P̃·exp(m_final − m_run), which the
block scales round differently (measured: ~0.05 relative L2 for nvfp4 and ~0.12 for mxfp4 against the
reference on N(0,1) inputs, while the error against exact attention is unchanged). So single-level P
runs two passes by default (``PMAX=1`` writes the exact row max, ``PMAX=2`` runs attention with it,
no rescaling) and matches the reference's quantization decisions; ``online=True`` is the one-pass
variant. Two-level P is max-invariant (P̃/s1 = 2688·exp(S − tile max)) and always runs one pass. On Hopper
the Gluon pass (``attention_gluon``: single- and two-level at D = 64 / 128) and the two-level Triton
pass round P̃ at float16 precision (``fake_quant_p_f16``): ~1.2e-2 relative L2 from the reference's decisions,
the same error against exact attention.

Non-finite inputs. SPEC §2: a block holding NaN or ±Inf dequantizes to NaN, never silently finite.
Followed through the reference's arithmetic (S = Q̂K̂ᵀ, P̃, l, ϕ(P̃)·V̂, O = ·/l, LSE), that gives NaN in:

* a query row holding NaN/±Inf: its output row and LSE (with smooth_q the NaN reaches q̄ of its
  128-row block, hence every row of the block);
* a key row holding NaN/±Inf: the output row and LSE of every query row that sees that key (all rows;
  causal: rows i ≥ j − (Nk − Nq)); with smooth_k the NaN reaches k̄, hence every key and every row;
* a V element holding NaN/±Inf: its channel in every output row that sees any key (ϕ(P̃)·V̂ multiplies
  the NaN block by every P̃ of the row, masked keys' zeros included: 0·NaN = NaN);
* rows that see no key (causal, Nq > Nk) stay 0 with LSE −inf (with smooth_k −inf + scale·q·k̄,
  NaN where q or k̄ is); GQA: a kv head's NaN reaches all of its query heads.

(The reference's ``normalize`` / ``lse_of`` test ``l > 0`` and so currently turn the NaN rows of the
first two cases into 0 / −inf; the tests compare with it made to propagate NaN through 1/l.) GPU
``max``/``min`` drop NaN and the P̃ quantization saturates it, so NaN must not reach the main loop: the
pre-pass keeps everything it writes finite (non-finite elements are left out of the block amax, NaN
encodes as code 0 and ±Inf as ±6; q̄ and the smooth_q correction table count them as 0) and records
flags instead, a per-row byte for Q and, per query head, the first non-finite key and the non-finite V
channels. The main kernel applies them in its epilogue (NaN l for the rows above, a NaN select over the
tile only when the head has a non-finite V channel), so its loop is unchanged; the flags are indexed by
query head because a kv-head index kept live across the loop shifts the register allocation of these
255-register kernels. The flags cost the pre-pass a reduction and masked (usually no) stores.

Differences from the reference (all within SPEC §6): FP32 vs float64 arithmetic and accumulation
order; the two-level s1 is per kernel key tile (BLOCK_N keys; the defaults use 64, as the
reference); the smooth_q correction is a tf32x3 dot (~2⁻²¹ relative to Σ|q̄ᵢ||k|).
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..formats.triton_helpers import (
    block_bad,
    e2m1_code,
    exp2i,
    fake_quant_p,
    fake_quant_p_f16,
    fp4_tile_f16,
    p_block_scales,
    pack_nibbles,
    quant_rows,
    unpack_nibbles_words,
)
from ..ops import _dispatch
from ..ops._dispatch import interpreting as _interpret
from . import attention_gluon
from ._launch import cdiv, empty0, fast, head_grid
from ._tiles import (
    LOG2E,
    causal_key_range,
    finish_rows,
    flag_v_channels,
    head_program,
    key_position,
    load_bhsd_rows,
    load_rows,
    online_softmax_step,
    program_rows,
    sink_start,
    two_level_scale,
    two_level_step,
    visible,
    window_key_range,
    window_offsets,
)

__all__ = ["PackedQKV", "quantize_qkv", "attention_packed", "attention_fwd", "default_path",
           "PATH_INTERP", "PATH_HOPPER", "PATH_BLACKWELL"]

PATH_INTERP = 0
PATH_HOPPER = 1
PATH_BLACKWELL = 2
PATH_NAMES = {"interp": PATH_INTERP, "hopper": PATH_HOPPER, "blackwell": PATH_BLACKWELL}

N_ALIGN = 128  # token padding of the buffers (multiple of every BLOCK_M / BLOCK_N and of 128)
SMOOTH_Q_BLOCK = 128
E4M3_TIMES_E2M1 = 448.0 * 6.0


def default_path(device: torch.device | None = None) -> int:
    """Operand path for a device: interpreter, Hopper/Ampere (fp16 / fp8 dots) or Blackwell
    (``tl.dot_scaled``). ``FP4ATTN_ATTN_PATH=hopper|blackwell`` overrides on GPU."""
    if _interpret():
        return PATH_INTERP
    env = os.environ.get("FP4ATTN_ATTN_PATH", "")
    if env:
        return PATH_NAMES[env]
    major, _ = _dispatch.capability(device)
    return PATH_BLACKWELL if major >= 10 else PATH_HOPPER


def quant_block(fmt: str) -> tuple[int, bool]:
    if fmt == "nvfp4":
        return 16, False
    if fmt == "mxfp4":
        return 32, True
    raise ValueError(f"fmt must be 'nvfp4' or 'mxfp4', got {fmt!r}")


def head_dim_padded(d: int, path: int = PATH_HOPPER) -> int:
    """Internal head dim: next power of two >= D, at least 32 (64 on Blackwell: the FP4 MMA's K)."""
    p = 64 if path == PATH_BLACKWELL else 32
    while p < d:
        p *= 2
    return p


def pad_tokens(n: int) -> int:
    return cdiv(n, N_ALIGN) * N_ALIGN


# =================================================================================================
# 1. Pre-pass
# =================================================================================================
@triton.jit
def _row_exp(sbytes):
    """Largest block exponent of each row of an E8M0 scale-byte tile (int32, (R,))."""
    return tl.max(sbytes.to(tl.int32), axis=1) - 127


@triton.jit
def _prep_qk_kernel(X, sx_b, sx_h, sx_n, sx_d, C, S, SUB, QBAR, XH, QROWS, KVF, QKB, KB, H, N, D, NP, GROUP,
                    SUB_MODE: tl.constexpr,  # 0: none, 1: subtract SUB (k̄ per head), 2: per-tile mean
                    QK_SHIFT: tl.constexpr,  # Q with smooth_k: QKB <- q·k̄ per row (k̄ of the kv head from KB)
                    BAD_MODE: tl.constexpr,  # 1: Q row flags, 2: K's first non-finite row, 3: and K row flags
                    PACKED: tl.constexpr,  # store the packed codes into C
                    STAGE: tl.constexpr,  # store the staged operand (``fp4_tile_f16``) into XH
                    KEY_PERM: tl.constexpr,  # ... its rows in the Gluon passes' key order (``_tiles.key_position``)
                    QB: tl.constexpr, IS_MX: tl.constexpr, BLOCK_T: tl.constexpr, DP: tl.constexpr):
    """Q or K (bhsd, any strides) -> packed codes along D (PACKED) + scale bytes (+ q̄ for SUB_MODE 2),
    the staged operand K̂ (STAGE: the values ``stage_operands`` would decode from those codes and scale
    bytes, written here from the codes still in registers), and the rows (after smoothing) that hold
    NaN/±Inf. BAD_MODE 1 (Q): one uint8 flag per row into QROWS
    (B, H, NP), and the first tile of each head zeroes the head's row of KVF (the per-query-head
    flags, int32 (B, H, 2 + DP), written by the K and V pre-passes that run after this one: no memset
    launch). BAD_MODE 2 (K): the first such row r as KVF[q head, 0] = max(., 2**31 - 1 - r) (atomic;
    0 = none) for each of the GROUP query heads reading this kv head; BAD_MODE 3 also one uint8 flag per row
    into QROWS (B, Hkv, NP), which only a sliding window's epilogue reads. Everything the main kernel reads
    stays finite: non-finite elements are left out of the block scales (NaN -> code 0, ±Inf -> ±6)
    and zeroed in q̄ / XS, so NaN never reaches its loop; the flags are applied in its epilogue."""
    pid_t, pid_bh, b, h, rows = program_rows(H, BLOCK_T)
    cols = tl.arange(0, DP)
    x, msk = load_bhsd_rows(X, sx_b, sx_h, sx_n, sx_d, b, h, rows, N, D, DP)
    if QK_SHIFT:  # the LSE shift of K smoothing: scale·q·k̄ (applied by attention_fwd), from the unsmoothed q
        kb = tl.load(KB + ((b * (H // GROUP) + h // GROUP).to(tl.int64)) * DP + cols)
        tl.store(QKB + pid_bh.to(tl.int64) * NP + rows, tl.sum(x * kb[None, :], axis=1))
    if SUB_MODE == 1:
        sub = tl.load(SUB + pid_bh.to(tl.int64) * DP + cols)
        x = tl.where(msk, x - sub[None, :], 0.0)
    elif SUB_MODE == 2:
        cnt = tl.minimum(N - pid_t * BLOCK_T, BLOCK_T).to(tl.float32)
        mean = tl.sum(x, axis=0) / cnt
        tl.store(QBAR + (pid_bh.to(tl.int64) * (NP // BLOCK_T) + pid_t) * DP + cols,
                 tl.where(tl.abs(mean) < float("inf"), mean, 0.0))  # a non-finite mean flags every row
        x = tl.where(msk, x - mean[None, :], 0.0)
    r64 = rows[:, None].to(tl.int64)
    # rows holding NaN/±Inf after smoothing (padding rows are zeros): their attention rows are NaN
    rbad = block_bad(x)
    if BAD_MODE == 1:
        tl.store(QROWS + pid_bh.to(tl.int64) * NP + rows, rbad.to(tl.uint8))
        if pid_t == 0:
            kvf = KVF + pid_bh.to(tl.int64) * (DP + 2)
            tl.store(kvf + tl.arange(0, 2), tl.zeros([2], tl.int32))
            tl.store(kvf + 2 + cols, tl.zeros([DP], tl.int32))
    else:
        if BAD_MODE == 3:
            tl.store(QROWS + pid_bh.to(tl.int64) * NP + rows, rbad.to(tl.uint8))
        enc = tl.max(tl.where(rbad != 0, 2147483647 - rows, 0), axis=0)  # 2**31 - 1 - first bad row
        for j in range(GROUP):  # masked: no memory traffic for finite tiles
            tl.atomic_max(KVF + (pid_bh * GROUP + j).to(tl.int64) * (DP + 2), enc, mask=enc != 0)
    codes, sb = quant_rows(x, tl.max(rbad, axis=0), QB, IS_MX)
    if PACKED:
        tl.store(C + pid_bh.to(tl.int64) * NP * (DP // 2) + r64 * (DP // 2) + tl.arange(0, DP // 2)[None, :],
                 pack_nibbles(codes))
    tl.store(S + pid_bh.to(tl.int64) * NP * (DP // QB) + r64 * (DP // QB) + tl.arange(0, DP // QB)[None, :],
             sb)
    if STAGE:  # MXFP4: the FP8 embedding against the row's largest block exponent (the tile holds the row)
        xh = fp4_tile_f16(codes, sb, _row_exp(sb) if IS_MX else rows, QB, IS_MX)
        if KEY_PERM:
            r64 = key_position(rows)[:, None].to(tl.int64)
        tl.store(XH + pid_bh.to(tl.int64) * NP * DP + r64 * DP + cols[None, :], xh.to(XH.dtype.element_ty))


@triton.jit
def _prep_v_kernel(X, sx_b, sx_h, sx_n, sx_d, C, S, VEXP, VH, KVF, H, N, D, NP, GROUP,
                   PACKED: tl.constexpr,  # store the packed codes and the scale bytes
                   STAGE: tl.constexpr,  # store the staged V̂ᵀ (NVFP4 only: MXFP4's needs VEXP complete)
                   KEY_PERM: tl.constexpr,  # ... its columns in the Gluon passes' key order (``_tiles.key_position``)
                   QB: tl.constexpr, IS_MX: tl.constexpr, R: tl.constexpr, BLOCK_T: tl.constexpr,
                   DC: tl.constexpr, DP: tl.constexpr):
    """V (bhsd, any strides) -> codes packed along tokens (DP, NP/2) and scale bytes (DP, NP/QB)
    (PACKED), the staged V̂ᵀ (DP, NP) (STAGE, NVFP4: the values ``stage_operands`` would decode) and,
    for MXFP4, atomic max of each channel's block exponent into VEXP (DP,). Channels c holding
    NaN/±Inf (their elements get finite codes, as in ``_prep_qk_kernel``): KVF[q head, 2 + c] = 1 and
    KVF[q head, 1] = 1 (int32 (B, H·GROUP, 2 + DP)) for each of the GROUP query heads of this kv head.

    A program takes BLOCK_T tokens × DC channels (``head_grid`` of NP/BLOCK_T · DP/DC tiles per head: the
    token tile and the channel chunk, the chunk fastest). The blocks run along tokens while V is stored
    token-major, so the tile is loaded as (R, BLOCK_T/QB, QB/R, DC) with
    element [r, j, g, c] = token j·QB + g·R + r: Triton lays a load out with 8 channels per thread, the
    lanes and warps over the middle axes (the launcher sizes them to cover them exactly) and the first
    axis in registers, so each thread holds R consecutive tokens of its channels and a block spans R
    registers × QB/R lanes of one warp. Permuted and reshaped to (blocks·DC, QB) (a relabeling, no data
    movement) it goes through the same ``quant_rows`` as Q and K, with in-thread block reductions."""
    NC: tl.constexpr = DP // DC
    pid_tc, pid_bh = head_program()
    pid_t = pid_tc // NC
    b = pid_bh // H
    h = pid_bh % H
    G: tl.constexpr = QB // R
    NB: tl.constexpr = BLOCK_T // QB
    ch = (pid_tc % NC) * DC + tl.arange(0, DC)  # (DC,) channels
    tok = (pid_t * BLOCK_T + tl.arange(0, G)[:, None, None, None] * R + tl.arange(0, NB)[None, :, None, None] * QB
           + tl.arange(0, R)[None, None, :, None])  # (G, NB, R, 1) token of [g, j, r, .]
    c4 = ch[None, None, None, :]
    src = X + b.to(tl.int64) * sx_b + h.to(tl.int64) * sx_h
    x = tl.load(src + tok.to(tl.int64) * sx_n + c4 * sx_d, mask=(tok < N) & (c4 < D), other=0.0).to(tl.float32)
    xb = tl.reshape(tl.permute(x, (1, 3, 0, 2)), (NB * DC, QB))  # row j·DC + c: block j of channel c
    cbad = tl.max(tl.reshape(block_bad(xb), (NB, DC)), axis=0)  # (DC,)
    anybad = tl.max(cbad, axis=0)
    flag_v_channels(KVF, pid_bh, GROUP, DP, ch, cbad, anybad)
    codes, sb = quant_rows(xb, anybad, QB, IS_MX)  # (NB·DC, QB), (NB·DC, 1)
    vrow = (pid_bh.to(tl.int64) * DP + ch)[None, :, None]  # (1, DC, 1) row of the channel-major buffers
    jb = tl.arange(0, NB)[:, None, None]
    if PACKED:
        q2 = tl.arange(0, QB // 2)[None, None, :]
        tl.store(C + vrow * (NP // 2) + pid_t * (BLOCK_T // 2) + jb * (QB // 2) + q2,
                 tl.reshape(pack_nibbles(codes), (NB, DC, QB // 2)))
        tl.store(S + vrow * (NP // QB) + pid_t * NB + jb, tl.reshape(sb, (NB, DC, 1)))
    if STAGE:
        vh = tl.reshape(fp4_tile_f16(codes, sb, ch, QB, False), (NB, DC, QB)).to(VH.dtype.element_ty)
        if KEY_PERM:  # token 64g + 16q + 2j + e of the tile to column 64g + 8j + 2q + e (_tiles.key_position), in
            # registers (through shared memory), so that each channel's row is stored as 16-byte vectors
            vp = tl.permute(tl.reshape(vh, (BLOCK_T // 64, 4, DC, 8, 2)), (2, 0, 3, 1, 4))
            tl.store(VH + (pid_bh.to(tl.int64) * DP + ch)[:, None] * NP + pid_t * BLOCK_T
                     + tl.arange(0, BLOCK_T)[None, :], tl.reshape(vp, (DC, BLOCK_T)))
        else:
            tl.store(VH + vrow * NP + pid_t * BLOCK_T + jb * QB + tl.arange(0, QB)[None, None, :], vh)
    if IS_MX:
        emax = tl.max(tl.reshape(sb.to(tl.int32), (NB, DC)), axis=0) - 127
        tl.atomic_max(VEXP + pid_bh.to(tl.int64) * DP + ch, emax)


@triton.jit
def _tf32_hi(x):
    """x rounded to TF32 (10 mantissa bits, to nearest): exact in a TF32 product; x − this is exact in float32."""
    return ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)


@triton.jit
def _smooth_q_corr_kernel(X, sx_b, sx_h, sx_n, sx_d, SUB, QBAR, CORR, H, N, D, NKP, NQB, GROUP, I0, NQBC, Nq,
                          NPROG_T, SUB_MODE: tl.constexpr, CAUSAL: tl.constexpr, CQB: tl.constexpr,
                          BLOCK_T: tl.constexpr, DP: tl.constexpr, KEY_PERM: tl.constexpr, K_EXACT: tl.constexpr):
    """SageAttention3's smooth_q correction cᵢⱼ = q̄ᵢ·γ(kⱼ) with the unquantized smoothed K (as the
    reference) for the query blocks i in [I0, I0 + NQBC) of the GROUP query heads reading kv head
    (b, h): CORR (B, H·GROUP, NQBC, NKP) float32, unscaled, zero at padded keys; KEY_PERM: key j's entry at column
    ``key_position(j)``, where the staged K̂ holds it (BLOCK_T a multiple of 64). K (bhsd, any strides) minus SUB
    (k̄, SUB_MODE 1). Keys × query blocks products on the tensor cores (keys along the MMA's M: wgmma), ~fp32
    accuracy:
    - K_EXACT (16-bit K): q̄ᵢ·kⱼ − q̄ᵢ·k̄, the keys exact as an operand: K_EXACT 1 (bf16 K) three bf16 products
      against q̄'s split into three bf16 parts (24 bits: the float32 significand), K_EXACT 2 (fp16 K, exact in TF32)
      two TF32 products against q̄'s TF32 hi / lo parts (22 bits); the smallest part first. The error is relative to
      |q̄ᵢ|·(|kⱼ| + |k̄|). Entries of keys whose smoothed row holds NaN/±Inf are unspecified but finite: the K
      pre-pass flags those keys, and every query row that sees one is NaN (a non-finite entry could instead hide
      every key of a row: −∞ scores leave no key seen, so the row would be 0, not NaN).
    - otherwise q̄ᵢ·(kⱼ − k̄) in three TF32 products (hi·hi + hi·lo + lo·hi of each operand's TF32 split, as
      ``input_precision="tf32x3"``), non-finite entries of the smoothed K counting as 0.
    Loops: query head, chunk of CQB query blocks (q̄'s parts made once), then the key tiles pid_t, pid_t + NPROG_T,
    ... of this program (causal: those the chunk sees), the next tile's keys loaded while this one's products run."""
    pid_t, pid_bh = head_program()
    b = pid_bh // H
    h = pid_bh % H
    cols = tl.arange(0, DP)
    src = X + b.to(tl.int64) * sx_b + h.to(tl.int64) * sx_h
    if SUB_MODE == 1:
        kbar = tl.load(SUB + pid_bh.to(tl.int64) * DP + cols)
    n_t = NKP // BLOCK_T
    for j in range(GROUP):
        qh = (pid_bh * GROUP + j).to(tl.int64)  # query head b·Hq + h·GROUP + j
        for c0 in range(0, NQBC, CQB):
            ci = c0 + tl.arange(0, CQB)
            qb = tl.load(QBAR + (qh * NQB + I0 + ci[:, None]) * DP + cols[None, :], mask=ci[:, None] < NQBC,
                         other=0.0)  # (CQB, DP)
            if K_EXACT == 1:  # q̄ in three bf16 parts
                q1 = qb.to(tl.bfloat16)
                r = qb - q1.to(tl.float32)
                q2 = r.to(tl.bfloat16)
                q3 = (r - q2.to(tl.float32)).to(tl.bfloat16)
            else:
                q_hi = _tf32_hi(qb)
                q_lo = qb - q_hi
            if K_EXACT != 0 and SUB_MODE == 1:
                qk = tl.sum(qb * kbar[None, :], 1)
            t_end = n_t
            if CAUSAL:  # key tiles that no query block of this chunk sees (bottom-right) are never read
                t_end = tl.minimum(n_t, tl.cdiv((I0 + c0 + CQB) * 128 + N - Nq, BLOCK_T))
            x_n = load_rows(src, sx_n, sx_d, pid_t * BLOCK_T + tl.arange(0, BLOCK_T), cols, N, D)
            for t in range(pid_t, t_end, NPROG_T):
                rows = t * BLOCK_T + tl.arange(0, BLOCK_T)
                x = x_n
                # the next tile's keys, in flight during this one's products
                x_n = load_rows(src, sx_n, sx_d, rows + NPROG_T * BLOCK_T, cols, N, D)
                if K_EXACT != 0:  # the smallest part first
                    if K_EXACT == 1:
                        ct = tl.dot(x, tl.trans(q3))  # (BLOCK_T, CQB)
                        ct = tl.dot(x, tl.trans(q2), ct)
                        ct = tl.dot(x, tl.trans(q1), ct)
                    else:
                        x = x.to(tl.float32)
                        ct = tl.dot(x, tl.trans(q_lo), input_precision="tf32")
                        ct = tl.dot(x, tl.trans(q_hi), ct, input_precision="tf32")
                    if SUB_MODE == 1:
                        ct = ct - qk[None, :]
                    ct = tl.where((rows[:, None] < N) & (tl.abs(ct) < float("inf")), ct, 0.0)
                else:
                    x = x.to(tl.float32)
                    if SUB_MODE == 1:
                        x = tl.where((rows[:, None] < N) & (cols[None, :] < D), x - kbar[None, :], 0.0)
                    x = tl.where(tl.abs(x) < float("inf"), x, 0.0)
                    x_hi = _tf32_hi(x)
                    ct = tl.dot(x_hi, tl.trans(q_lo), input_precision="tf32")
                    ct = tl.dot(x - x_hi, tl.trans(q_hi), ct, input_precision="tf32")
                    ct = tl.dot(x_hi, tl.trans(q_hi), ct, input_precision="tf32")
                if KEY_PERM:  # key 64g + 16q + 2j + e to row 64g + 8j + 2q + e, in registers
                    ct = tl.reshape(tl.permute(tl.reshape(ct, (BLOCK_T // 64, 4, 8, 2, CQB)), (0, 2, 1, 3, 4)),
                                    (BLOCK_T, CQB))
                tl.store(CORR + (qh * NQBC + ci[None, :]) * NKP + rows[:, None], ct, mask=ci[None, :] < NQBC)


# The table kernel's tiles: 64 keys x 32 query blocks per product, 4 warps, 4 key tiles per program. H200
# (benchmarks/corr-s48, forty-eighth session), against the forty-seventh session's kernel (one key tile per program,
# query blocks along M: mma.sync tf32x3 on the smoothed keys, 246 registers): 328 -> 126 us at (16,16,4096,128),
# 332 -> 127 causal, 780 -> 426 at (4,16,16384,128), 176 -> 78 at (16,16,4096,64). 2 / 8 / 16 tiles per program:
# 146 / 122 / 122 us at the first shape, 469 / 444 / 465 at the second; 64 query blocks per product: 375 us there
# (K read half as often), 182 at the first. The plain fill of its bytes takes 33 / 118 us.
_CORR_CFG = dict(block_t=64, cqb=32, num_warps=4, tiles_per_prog=4)


def _corr_k_exact(dtype: torch.dtype) -> int:
    """``_smooth_q_corr_kernel``'s K_EXACT for keys of ``dtype``: 1 bf16 (not under the interpreter, which has no bf16
    dot: it takes fp16's TF32 form of the same sum, the bf16 keys being exact in TF32 too), 2 fp16, 0 otherwise."""
    if dtype == torch.bfloat16:
        return 2 if _interpret() else 1
    return 2 if dtype == torch.float16 else 0


def smooth_q_corr(pk: "PackedQKV", i0: int, nqbc: int, out: torch.Tensor | None = None,
                  causal: bool = False) -> torch.Tensor:
    """The smooth_q correction table for query blocks [i0, i0 + nqbc): (B, Hq, nqbc, NKP) float32, its columns in
    the order of the staged K̂ (``pk.key_perm``: ``_tiles.key_position``).
    ``causal``: entries of query blocks that see none of a 64-key tile (bottom-right) are left unset (the
    main kernel does not read them)."""
    B, Hq, NQB, DP = pk.qbar.shape
    k = pk.k_in
    Hkv, NKP = k.shape[1], pk.ks.shape[2]
    if out is None:
        out = torch.empty((B, Hq, nqbc, NKP), device=k.device, dtype=torch.float32)
    ksub = pk.kbar_p if pk.kbar is not None else pk.qbar  # unused pointer without smooth_k
    bt, cqb, nw = _CORR_CFG["block_t"], _CORR_CFG["cqb"], _CORR_CFG["num_warps"]
    bt = bt if DP <= 128 else bt // 2
    assert not pk.key_perm or bt % 64 == 0, bt
    nprog = cdiv(NKP // bt, _CORR_CFG["tiles_per_prog"])
    fast(_smooth_q_corr_kernel)[head_grid(nprog, B * Hkv)](
        k, *k.stride(), ksub, pk.qbar, out, Hkv, pk.nk, pk.d, NKP, NQB, Hq // Hkv, i0, nqbc, pk.nq, nprog,
        SUB_MODE=1 if pk.kbar is not None else 0, CAUSAL=causal, CQB=cqb, BLOCK_T=bt, DP=DP,
        KEY_PERM=pk.key_perm, K_EXACT=_corr_k_exact(k.dtype), num_warps=nw)
    return out


@triton.jit
def _stage_kernel(Cw, Sb, EREF, OUT, NROWS, NCOLS,
                  USE_EREF: tl.constexpr, QB: tl.constexpr, IS_MX: tl.constexpr,
                  ROWS_T: tl.constexpr, COLS_T: tl.constexpr):
    """Staged operands: packed codes (NROWS, NCOLS/8 words) + scale bytes (NROWS, NCOLS/QB) ->
    the tensor-core operand (NROWS, NCOLS) in OUT's dtype, once per tensor instead of once per query
    tile: NVFP4 exact fp16 values; MXFP4 the FP8 embedding c·2^(e − E + 6) with E the row's largest
    block exponent (K rows; COLS_T must cover the row) or EREF[row] (V channels)."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = (pid_r * ROWS_T + tl.arange(0, ROWS_T)).to(tl.int64)
    w = tl.load(Cw + rows[:, None] * (NCOLS // 8) + pid_c * (COLS_T // 8) + tl.arange(0, COLS_T // 8)[None, :])
    sb = tl.load(Sb + rows[:, None] * (NCOLS // QB) + pid_c * (COLS_T // QB)
                 + tl.arange(0, COLS_T // QB)[None, :])
    if IS_MX:
        if USE_EREF:
            eref = tl.load(EREF + rows)
        else:
            eref = _row_exp(sb)
    else:
        eref = rows
    v = fp4_tile_f16(unpack_nibbles_words(w), sb, eref, QB, IS_MX)
    cols = pid_c * COLS_T + tl.arange(0, COLS_T)
    tl.store(OUT + rows[:, None] * NCOLS + cols[None, :], v.to(OUT.dtype.element_ty))


def _staged_dtype(is_mx: bool, path: int) -> torch.dtype:
    if path == PATH_INTERP:
        return torch.float32
    return torch.float8_e4m3fn if is_mx else torch.float16


def _stage_v(vc, vs, vexp, is_mx: bool, qb: int, path: int) -> torch.Tensor:
    """V̂ᵀ (B, Hkv, DP, NKP) from the packed V codes and scale bytes (MXFP4 against ``vexp``)."""
    B, Hkv, DP, NKP2 = vc.shape
    NKP = NKP2 * 2
    vh = torch.empty((B, Hkv, DP, NKP), device=vc.device, dtype=_staged_dtype(is_mx, path))
    rt, ct = 32, 128
    fast(_stage_kernel)[(B * Hkv * DP // rt, NKP // ct)](vc.view(torch.int32), vs, vexp if is_mx else vs, vh,
                                                         B * Hkv * DP, NKP, USE_EREF=True, QB=qb, IS_MX=is_mx,
                                                         ROWS_T=rt, COLS_T=ct, num_warps=4)
    return vh


def stage_operands(pk: "PackedQKV") -> tuple[torch.Tensor, torch.Tensor]:
    """K̂ (B, Hkv, NKP, DP) and V̂ᵀ (B, Hkv, DP, NKP) in the tensor-core operand dtype (fp16 NVFP4
    values, FP8 MXFP4 embedding; fp32 under the interpreter) from a packed pre-pass output. (The staged
    ``quantize_qkv`` writes the same values from the pre-pass kernels instead.)"""
    qb, is_mx = quant_block(pk.fmt)
    B, Hkv, NKP, DP2 = pk.kc.shape
    DP = DP2 * 2
    kh = torch.empty((B, Hkv, NKP, DP), device=pk.kc.device, dtype=_staged_dtype(is_mx, pk.path))
    rt = 32
    fast(_stage_kernel)[(B * Hkv * NKP // rt, 1)](pk.kc.view(torch.int32), pk.ks, pk.ks, kh, B * Hkv * NKP, DP,
                                                  USE_EREF=False, QB=qb, IS_MX=is_mx, ROWS_T=rt, COLS_T=DP,
                                                  num_warps=4)
    return kh, _stage_v(pk.vc, pk.vs, pk.vexp, is_mx, qb, pk.path)


class PackedQKV(NamedTuple):
    """The pre-pass output: what the main kernel reads (all padded, contiguous)."""

    qc: torch.Tensor  # uint8 (B, Hq, NQP, DP/2)
    qs: torch.Tensor  # uint8 (B, Hq, NQP, DP/QB)
    kc: torch.Tensor  # uint8 (B, Hkv, NKP, DP/2); staged: empty (the main kernel reads kh)
    ks: torch.Tensor  # uint8 (B, Hkv, NKP, DP/QB)
    vc: torch.Tensor  # uint8 (B, Hkv, DP, NKP/2): channel-major, packed along tokens; staged: empty
    vs: torch.Tensor  # uint8 (B, Hkv, DP, NKP/QB); staged: empty
    vexp: torch.Tensor  # int32 (B, Hkv, DP) (MXFP4) or empty
    qbar: torch.Tensor  # float32 (B, Hq, NQP/128, DP) (smooth_q) or empty
    k_in: torch.Tensor | None  # smooth_q: the input K (bhsd view), read again for the correction table
    kbar: torch.Tensor | None  # float32 (B, Hkv, D) (smooth_k) or None
    # non-finite inputs (GQA: the kv head's flags repeated for each of its query heads)
    qbad: torch.Tensor  # uint8 (B, Hq, NQP): 1 where the (smoothed) query row holds NaN/±Inf
    kvbad: torch.Tensor  # int32 (B, Hq, 2 + DP): [0] 2**31 - 1 - (first key whose (smoothed) K row
    #                      holds NaN/±Inf), 0 if none; [1] 1 if some V element is NaN/±Inf; [2 + c] 1
    #                      if V channel c holds one (zeroed by the Q pre-pass, set by the K / V ones)
    fmt: str
    nq: int
    nk: int
    d: int
    path: int
    kh: torch.Tensor | None = None  # staged K̂ (B, Hkv, NKP, DP) fp16 / fp8 (see stage_operands) or None
    vh: torch.Tensor | None = None  # staged V̂ᵀ (B, Hkv, DP, NKP) or None
    qkb: torch.Tensor | None = None  # smooth_k: q·k̄ per query row (B, Hq, NQP) float32 (the LSE shift / scale)
    krows: torch.Tensor | None = None  # key_rows: uint8 (B, Hkv, NKP), 1 where the (smoothed) K row holds NaN/±Inf
    key_perm: bool = False  # kh rows / vh columns in the Gluon passes' key order (``_tiles.key_position``)
    kbar_p: torch.Tensor | None = None  # smooth_k: kbar zero-padded to DP (B, Hkv, DP), as the kernels read it
    q_in: torch.Tensor | None = None  # q_fused: Q (bhsd view), quantized into qc / qs / qbad by the row-max pass
    v_in: torch.Tensor | None = None  # v_fused: V (bhsd view), quantized into vh / kvbad by the row-max pass


def default_staged() -> bool:
    """Staged operands (K̂/V̂ decoded once per tensor, see the module docstring) are the default on
    Hopper: ~2x faster than decoding the packed codes in every query tile (BENCHMARKS.md, issue 4),
    and validated by the GPU tests in both modes. ``FP4ATTN_ATTN_OPERANDS=packed`` selects the
    in-register decoding (the Blackwell path always reads the packed codes)."""
    return os.environ.get("FP4ATTN_ATTN_OPERANDS", "staged") != "packed"


def smooth_q_table_max_bytes() -> int:
    """Largest smooth_q correction table (B·Hq·(query blocks)·Nk float32) held at once:
    ``FP4ATTN_SMOOTHQ_TABLE_BYTES`` (default 256 MiB). The whole table grows as N²/32 bytes per head;
    above the limit the main kernel runs in chunks of query blocks, each with its own table (K is read
    once more per chunk)."""
    return int(os.environ.get("FP4ATTN_SMOOTHQ_TABLE_BYTES", str(1 << 28)))


# Pre-pass launch configs per format (is_mx): Q and K (tokens per program at D <= 128, halved above;
# warps), V (channels per program, consecutive tokens per thread; 128 tokens per program), the warps of
# smooth_q's 128-row Q tiles. H200 sweep (BENCHMARKS.md, issue 4, sixth session): the NVFP4 kernels are
# ALU-bound (~40 SASS per value for the exact E2M1 codes against E4M3 scales) and ran with 255 registers
# per thread at 64 x 128 tiles (V spilled); the smaller tiles cut the NVFP4 pre-pass 0.99 -> 0.87 ms at
# (16,16,4096,128), sage3's 1.29 -> 1.08. A second sweep after the finite-tile fast path
# (benchmarks/session6-2026-11-22/prep_sweep2.txt): K 16 tokens on 2 warps and V 16 channels, 2-35 us
# faster at D = 64 and 128 for nvfp4 and sage3.
_PREP_CFG = {False: dict(q=(32, 4), k=(16, 2), v=(16, 4), q_smooth_warps=4),
             True: dict(q=(64, 4), k=(64, 4), v=(32, 8), q_smooth_warps=8)}


def quantize_qkv(q, k, v, *, fmt: str = "nvfp4", smooth_q: bool = False, smooth_k: bool = False,
                 path: int | None = None, staged: bool | None = None, key_rows: bool = False,
                 key_perm: bool = False, q_fused: bool = False, v_fused: bool = False) -> PackedQKV:
    """The quantization pre-pass on bhsd views (any strides). ``staged`` (Hopper/interpreter paths
    only): write K̂ and V̂ᵀ in the tensor-core operand dtype *instead of* the packed K / V codes (``kc``,
    ``vc``, ``vs`` are then empty: the main kernel reads K's scale bytes and the staged operands only).
    K̂ and NVFP4 V̂ᵀ come straight from the pre-pass kernels; MXFP4 V̂ᵀ needs every token's block
    exponent first (``vexp``), so V's packed codes go through ``_stage_kernel`` as before.
    smooth_q keeps a reference to ``k``: the main kernel's launcher builds the correction table from it.
    ``key_perm`` (staged NVFP4 only): K̂'s rows and V̂ᵀ's columns in the order of ``_tiles.key_position`` (each
    16-key block of a score row in one thread of the Gluon passes, ``attention_gluon._phi``); only the Gluon passes
    read such operands (``attention_packed`` checks). ``q_fused`` (single-level NVFP4 in key order, no smoothing):
    Q is not quantized here; ``qc``, ``qs`` and ``qbad`` are left for the Gluon row-max pass to write
    (``attention_gluon._quantize_q``; ``PackedQKV.q_in`` keeps Q for it) and ``kvbad`` is zeroed by a memset.
    ``v_fused`` (same conditions): likewise V's staged ``vh`` and its channel flags in ``kvbad``
    (``attention_gluon._quantize_v``, ``PackedQKV.v_in``)."""
    if path is None:
        path = default_path(q.device)
    if staged is None:
        staged = default_staged()
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    qb, is_mx = quant_block(fmt)
    DP = head_dim_padded(D, path)
    NQP, NKP = pad_tokens(Nq), pad_tokens(Nk)
    dev = q.device
    u8 = torch.uint8
    stage = staged and path != PATH_BLACKWELL
    stage_v = stage and not is_mx  # MXFP4 V̂ᵀ: from the packed codes once vexp is complete
    if key_perm and not stage_v:
        raise ValueError("key_perm: staged NVFP4 operands on the Hopper path only")
    for name, fused in (("q_fused", q_fused), ("v_fused", v_fused)):
        if fused and not (key_perm and not (smooth_q or smooth_k)):
            raise ValueError(f"{name}: NVFP4 operands in key order (key_perm=True), without smoothing")
    none = empty0(dev, u8)
    qc = torch.empty((B, Hq, NQP, DP // 2), device=dev, dtype=u8)
    qs = torch.empty((B, Hq, NQP, DP // qb), device=dev, dtype=u8)
    kc = none if stage else torch.empty((B, Hkv, NKP, DP // 2), device=dev, dtype=u8)
    ks = torch.empty((B, Hkv, NKP, DP // qb), device=dev, dtype=u8)
    vc = none if stage_v else torch.empty((B, Hkv, DP, NKP // 2), device=dev, dtype=u8)
    vs = none if stage_v else torch.empty((B, Hkv, DP, NKP // qb), device=dev, dtype=u8)
    kh = torch.empty((B, Hkv, NKP, DP), device=dev, dtype=_staged_dtype(is_mx, path)) if stage else None
    vh = torch.empty((B, Hkv, DP, NKP), device=dev, dtype=_staged_dtype(is_mx, path)) if stage_v else None
    vexp = (torch.full((B, Hkv, DP), -127, device=dev, dtype=torch.int32) if is_mx
            else empty0(dev, torch.int32))
    qbar = (torch.empty((B, Hq, NQP // SMOOTH_Q_BLOCK, DP), device=dev, dtype=torch.float32) if smooth_q
            else empty0(dev, torch.float32))
    kbar = None
    ksub = empty0(dev, torch.float32)
    # smooth_k: q·k̄ per query row (the LSE shift), from the Q pre-pass. (smooth_q's correction table is
    # built by attention_packed, chunk by chunk, from k: see smooth_q_corr)
    qkb = empty0(dev, torch.float32)
    if smooth_k:
        kbar = k.mean(dim=2, dtype=torch.float32)  # (B, Hkv, D), as the reference; no float32 copy of K
        # zero-padded to DP as the kernels read it (PackedQKV.kbar_p): k̄ itself where D = DP, no copy launched
        ksub = kbar if D == DP else torch.nn.functional.pad(kbar, (0, DP - D)).contiguous()
        qkb = torch.empty((B, Hq, NQP), device=dev, dtype=torch.float32)
    g = Hq // Hkv
    qbad = torch.empty((B, Hq, NQP), device=dev, dtype=u8)
    # zeroed by the Q pre-pass (a memset where the row-max pass runs it: the K and V pre-passes set flags first)
    kvbad = (torch.zeros if q_fused else torch.empty)((B, Hq, 2 + DP), device=dev, dtype=torch.int32)
    # the per-key non-finite flags a sliding window's epilogue scans (``key_rows``; written only then)
    krows = torch.empty((B, Hkv, NKP), device=dev, dtype=u8) if key_rows else None
    cfg = _PREP_CFG[is_mx]
    wide = 1 if DP <= 128 else 2  # D > 128: half the tokens per program
    bq, nwq = cfg["q"]
    bt, nw = cfg["k"]
    bq, bt = bq // wide, bt // wide
    if smooth_q:  # Q: tiles of 128 rows when smoothing (the q̄ blocks)
        bq, nwq = SMOOTH_Q_BLOCK, cfg["q_smooth_warps"]
    if not q_fused:
        fast(_prep_qk_kernel)[head_grid(NQP // bq, B * Hq)](
            q, *q.stride(), qc, qs, qs, qbar, qs, qbad, kvbad, qkb, ksub, Hq, Nq, D, NQP, g,
            SUB_MODE=2 if smooth_q else 0, QK_SHIFT=smooth_k, BAD_MODE=1, PACKED=True, STAGE=False, KEY_PERM=False,
            QB=qb, IS_MX=is_mx, BLOCK_T=bq, DP=DP, num_warps=nwq)
    fast(_prep_qk_kernel)[head_grid(NKP // bt, B * Hkv)](
        k, *k.stride(), kc if not stage else ks, ks, ksub, ks, kh if stage else ks, krows if key_rows else ks, kvbad,
        ks, ks, Hkv, Nk, D, NKP, g, SUB_MODE=1 if smooth_k else 0, QK_SHIFT=False, BAD_MODE=3 if key_rows else 2,
        PACKED=not stage, STAGE=stage, KEY_PERM=key_perm, QB=qb, IS_MX=is_mx, BLOCK_T=bt, DP=DP, num_warps=nw)
    # V: 128 tokens x dc channels per program, r consecutive tokens x 8 channels per thread (see
    # _prep_v_kernel; r = 4: no register spill at D = 128 but ~15% more instructions per element)
    dc, r = cfg["v"]
    dc = min(DP, dc)
    if not v_fused:
        fast(_prep_v_kernel)[head_grid(NKP // 128 * (DP // dc), B * Hkv)](
            v, *v.stride(), vc if not stage_v else ks, vs if not stage_v else ks, vexp, vh if stage_v else ks, kvbad,
            Hkv, Nk, D, NKP, g, PACKED=not stage_v, STAGE=stage_v, KEY_PERM=key_perm, QB=qb, IS_MX=is_mx, R=r,
            BLOCK_T=128, DC=dc, DP=DP, num_warps=128 * dc // (r * 256))
    if stage and is_mx:
        vh = _stage_v(vc, vs, vexp, is_mx, qb, path)
        vc = vs = none
    return PackedQKV(qc, qs, kc, ks, vc, vs, vexp, qbar, k if smooth_q else None, kbar, qbad, kvbad, fmt, Nq, Nk,
                     D, path, kh, vh, qkb if smooth_k else None, krows, key_perm, ksub if smooth_k else None,
                     q if q_fused else None, v if v_fused else None)


# =================================================================================================
# 2. Main kernel
# =================================================================================================
@triton.jit
def _mx_q_operand(qb, qsb, PATH: tl.constexpr, QB: tl.constexpr):
    """MXFP4 Q tile (packed bytes, E8M0 bytes) -> (FP8 operand c·2^(e − E_row + 6), row factor
    2^(E_row − 6)); fp32 operand under the interpreter (same values)."""
    eq = _row_exp(qsb)
    q16 = fp4_tile_f16(unpack_nibbles_words(qb), qsb, eq, QB, True)
    if PATH == 1:
        q_op = q16.to(tl.float8e4nv)
    else:
        q_op = q16.to(tl.float32)
    return q_op, exp2i(eq - 6)


@triton.jit
def _mx_qk(q_op, qfac, kb, ks, PATH: tl.constexpr, QB: tl.constexpr):
    """Q̂K̂ᵀ for MXFP4 on FP8 tensor cores: K rows embedded like Q's, offsets folded into FP32."""
    ek = _row_exp(ks)
    k16 = fp4_tile_f16(unpack_nibbles_words(kb), ks, ek, QB, True)
    return _mx_qk_dot(q_op, tl.trans(k16), qfac, ek, PATH)


@triton.jit
def _mx_qk_dot(q_op, kT, qfac, ek, PATH: tl.constexpr):
    """The FP8 QKᵀ with the row offsets folded back. ``max_num_imprecise_acc=32``: Hopper's FP8 MMA
    accumulates with reduced precision (~14 bits kept; Triton's sm_90 default lets it run over the
    whole K); promoting to the FP32 accumulator after every 32 products (one MXFP4 block, whose
    products share one scale) keeps S exact inside the condition."""
    if PATH == 1:
        qk = tl.dot(q_op, kT.to(tl.float8e4nv), max_num_imprecise_acc=32)
    else:
        qk = tl.dot(q_op, kT.to(tl.float32))
    return qk * qfac[:, None] * exp2i(ek - 6)[None, :]


@triton.jit
def _mx_qk_probe_kernel(Qc, Qs, Kc, Ks, S, PATH: tl.constexpr, QB: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, DP: tl.constexpr):
    """Test probe: S = Q̂K̂ᵀ of the first (BLOCK_M, BLOCK_N) tile of one head through the main
    kernel's MXFP4 FP8 code (``_mx_q_operand`` / ``_mx_qk``), unscaled."""
    m = tl.arange(0, BLOCK_M)
    n = tl.arange(0, BLOCK_N)
    d8 = tl.arange(0, DP // 8)
    dq = tl.arange(0, DP // QB)
    qb = tl.load(Qc + m[:, None] * (DP // 8) + d8[None, :])
    qsb = tl.load(Qs + m[:, None] * (DP // QB) + dq[None, :])
    kb = tl.load(Kc + n[:, None] * (DP // 8) + d8[None, :])
    ks = tl.load(Ks + n[:, None] * (DP // QB) + dq[None, :])
    q_op, qfac = _mx_q_operand(qb, qsb, PATH, QB)
    s = _mx_qk(q_op, qfac, kb, ks, PATH, QB)
    tl.store(S + m[:, None] * BLOCK_N + n[None, :], s)


def mx_qk_probe(pk: PackedQKV, block_m: int = 64, block_n: int = 64) -> torch.Tensor:
    """S = Q̂K̂ᵀ (unscaled, FP32) of the first tile of head 0 computed by the main kernel's MXFP4
    path (FP8 tensor cores on GPU). For the exactness tests."""
    assert pk.fmt == "mxfp4"
    DP = pk.qc.shape[3] * 2
    out = torch.empty((block_m, block_n), device=pk.qc.device, dtype=torch.float32)
    fast(_mx_qk_probe_kernel)[(1,)](pk.qc.view(torch.int32), pk.qs, pk.kc.view(torch.int32), pk.ks, out,
                                    PATH=pk.path, QB=32, BLOCK_M=block_m,
                                    BLOCK_N=block_n, DP=DP, num_warps=4)
    return out


@triton.jit
def _p_codes(p, QB: tl.constexpr, IS_MX: tl.constexpr):
    """P̃ tile (R, C) >= 0 -> (packed codes (R, C/2), scales (R, C/QB)) for ``tl.dot_scaled``:
    the same values as ``fake_quant_p``. Scales: uint8 E8M0 bytes or float8e4nv."""
    R: tl.constexpr = p.shape[0]
    C: tl.constexpr = p.shape[1]
    pb = tl.reshape(p, (R, C // QB, QB))
    s, inv = p_block_scales(tl.max(pb, axis=2), IS_MX)
    if IS_MX:
        # E8M0 byte = the float32 exponent field of s = 2**e (e = -127 is the subnormal 2**-127: 0)
        sc = ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
    else:
        sc = s.to(tl.float8e4nv)  # exact: s is on the E4M3 grid
    codes = e2m1_code(pb * inv[:, :, None])
    return pack_nibbles(tl.reshape(codes, (R, C))), sc


@triton.jit
def _attn_inner(acc, l_i, m_i, tau, q_op, q_sc, qfac, CR, Kc, Ks, Vc, Vs, vexp, KH, VH,
                offs_m, lo, hi, Nk, causal_off, left_off, qk_scale, NKP,
                PMAX: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                IS_MX: tl.constexpr,
                TWO_LEVEL: tl.constexpr, STAGED: tl.constexpr, SMOOTH_Q: tl.constexpr, PATH: tl.constexpr,
                QB: tl.constexpr,
                BLOCK_N: tl.constexpr, DP: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    d2 = tl.arange(0, DP // 2)
    d8 = tl.arange(0, DP // 8)
    dq = tl.arange(0, DP // QB)
    # Blackwell: Triton 3.6 fails to lower (sm_100, "uninitialized tmem_alloc") a tl.dot_scaled with
    # no accumulator inside a loop; a loop-carried zero tile (not constant-foldable) works around it
    s_zero = tl.zeros([acc.shape[0], BLOCK_N], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        kn = start_n + offs_n
        ks = tl.load(Ks + kn[:, None] * (DP // QB) + dq[None, :])  # (BLOCK_N, DP/QB)
        # ---- S = Q̂ K̂ᵀ (log2 domain) ----------------------------------------------------------
        if PATH == 2:
            kT = tl.load(Kc.to(tl.pointer_type(tl.uint8)) + kn[None, :] * (DP // 2) + d2[:, None])  # (DP/2, BLOCK_N)
            if IS_MX:
                qk = tl.dot_scaled(q_op, q_sc, "e2m1", kT, ks, "e2m1", s_zero)
            else:
                qk = tl.dot_scaled(q_op, q_sc, "e2m1", kT, ks.to(tl.float8e4nv, bitcast=True), "e2m1", s_zero)
            s_zero = qk * 0.0
            s = qk * qk_scale
        elif STAGED:
            kT = tl.load(KH + kn[None, :] * DP + tl.arange(0, DP)[:, None])  # (DP, BLOCK_N) staged operand
            if IS_MX:
                s = _mx_qk_dot(q_op, kT, qfac, _row_exp(ks), PATH)
            else:
                s = tl.dot(q_op, kT.to(q_op.dtype)) * qk_scale
        else:
            kb = tl.load(Kc + kn[:, None] * (DP // 8) + d8[None, :])  # (BLOCK_N, DP/8) words
            if IS_MX:
                s = _mx_qk(q_op, qfac, kb, ks, PATH, QB)
            else:
                k16 = fp4_tile_f16(unpack_nibbles_words(kb), ks, offs_n, QB, False)
                if PATH == 1:
                    qk = tl.dot(q_op, tl.trans(k16))
                else:
                    qk = tl.dot(q_op, tl.trans(k16.to(tl.float32)))
                s = qk * qk_scale
        if SMOOTH_Q:
            # SageAttention3's correction q̄ᵢ·γ(K)ᵀ (FP32, from ``smooth_q_corr``): one value per key
            s += (tl.load(CR + kn) * qk_scale)[None, :]
        # ---- softmax -----------------------------------------------------------------------------
        if MASK:
            s = tl.where(visible(kn, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW), s, float("-inf"))
        if PMAX == 1:  # max-only pass
            m_i = tl.maximum(m_i, tl.max(s, 1))
        else:
            if TWO_LEVEL:  # p = P̃/s1, acc in units of the last tile's s1 (any m_i: also after PMAX 1)
                p, pre, tau, m_i, l_i = two_level_step(s, m_i, l_i, tau, MASK)
            elif PMAX == 2:  # the exact row max is known: no rescaling
                m_use = tl.where(m_i == float("-inf"), 0.0, m_i)
                p = tl.math.exp2(s - m_use[:, None])
                pre = tl.zeros_like(l_i) + 1.0
                l_i = l_i + tl.sum(p, 1)
            else:  # online softmax
                p, pre, m_i, l_i = online_softmax_step(s, m_i, l_i, MASK)  # P̃ = exp(S − m), pre = alpha
            acc = _pv_update(acc, p, pre, Vc, Vs, vexp, VH, start_n, NKP, IS_MX, TWO_LEVEL, STAGED, PATH,
                             QB, BLOCK_N, DP)
    return acc, l_i, m_i, tau


@triton.jit
def _pv_update(acc, p, pre, Vc, Vs, vexp, VH, start_n, NKP, IS_MX: tl.constexpr, TWO_LEVEL: tl.constexpr,
               STAGED: tl.constexpr, PATH: tl.constexpr, QB: tl.constexpr, BLOCK_N: tl.constexpr,
               DP: tl.constexpr):
    """acc·pre + ϕ(p)·V̂ for one key tile: p = P̃ and pre = alpha, or for two-level P p = P̃/s1 and pre
    from ``two_level_step`` (acc in units of s1; MXFP4 on FP8: of s1/8, see below)."""
    dd = tl.arange(0, DP)
    n2 = tl.arange(0, BLOCK_N // 2)
    n8 = tl.arange(0, BLOCK_N // 8)
    nq = tl.arange(0, BLOCK_N // QB)
    # ---- O += ϕ(P̃) V̂ -----------------------------------------------------------------------
    if PATH == 2:
        pc, psc = _p_codes(p, QB, IS_MX)
        vb = tl.load(Vc.to(tl.pointer_type(tl.uint8)) + dd[None, :] * (NKP // 2) + (start_n // 2 + n2)[:, None])
        vs = tl.load(Vs + dd[:, None] * (NKP // QB) + (start_n // QB + nq)[None, :])  # (DP, BLOCK_N/QB)
        if IS_MX:
            vsc = vs
        else:
            vsc = vs.to(tl.float8e4nv, bitcast=True)
        # two-level: the MMA accumulates in place (the accumulator-less form hits the same Triton 3.6
        # sm_100 lowering bug as above)
        acc = tl.dot_scaled(pc, psc, "e2m1", vb, vsc, "e2m1", acc * pre[:, None])
    else:
        if STAGED:
            vT16 = tl.load(VH + dd[:, None] * NKP + (start_n + tl.arange(0, BLOCK_N))[None, :])  # (DP, BLOCK_N)
        else:
            vTw = tl.load(Vc + dd[:, None] * (NKP // 8) + (start_n // 8 + n8)[None, :])  # (DP, BLOCK_N/8) words
            vs = tl.load(Vs + dd[:, None] * (NKP // QB) + (start_n // QB + nq)[None, :])  # (DP, BLOCK_N/QB)
            vT16 = fp4_tile_f16(unpack_nibbles_words(vTw), vs, vexp, QB, IS_MX)  # (DP, BLOCK_N)
        if TWO_LEVEL and PATH == 1 and not IS_MX:  # sage3: P̃/s1 rounded at float16 precision (attention_gluon)
            pq = fake_quant_p_f16(p, QB)
        else:
            pq = fake_quant_p(p, QB, IS_MX, PATH == 1 and not IS_MX)  # fp16 for the fp16 MMA
        if IS_MX:
            if TWO_LEVEL:
                pq = pq * 0.125  # ϕ(P̃/s1) <= 3072 -> <= 384
            else:
                pq = pq * 256.0  # ϕ(P̃) <= 1.5 -> <= 384
        if PATH == 1:
            if IS_MX:
                pop = pq.to(tl.float8e4nv)
                vop = tl.trans(vT16.to(tl.float8e4nv))
            else:
                pop = pq
                vop = tl.trans(vT16)
        else:
            pop = pq
            vop = tl.trans(vT16.to(tl.float32))
        acc = tl.dot(pop, vop, acc * pre[:, None])  # MXFP4 two-level: acc in units of s1/8
    return acc


@triton.jit
def _attn_fwd_kernel(Qc, Qs, Kc, Ks, Vc, Vs, VEXP, QCORR, O, LSE, MBUF, KH, VH, QBAD, KVBAD, KROWS, SINK,
                     so_b, so_h, so_n, so_d,
                     qk_scale, Hq, GROUP, Nq, Nk, NQP, NKP, D, I0, NQBC, COFF, LOFF,
                     PMAX: tl.constexpr,  # 0: online softmax, 1: row-max pass, 2: with the exact row max
                     CAUSAL: tl.constexpr,  # the right edge: query i sees keys j <= i + COFF
                     WINDOW: tl.constexpr,  # a sliding window's left edge: keys j >= i + LOFF
                     SINKS: tl.constexpr,  # attention sinks: SINK (B, Hq, NQP) per-row logits, log2 units
                     IS_MX: tl.constexpr, TWO_LEVEL: tl.constexpr, STAGED: tl.constexpr,
                     SMOOTH_Q: tl.constexpr, PATH: tl.constexpr, QB: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr):
    pid_m, pid_bh = head_program()
    start_m = pid_m + I0 * (128 // BLOCK_M)  # I0: first 128-query block of this launch
    b = pid_bh // Hq
    h = pid_bh % Hq
    kv_bh = (b * (Hq // GROUP) + h // GROUP).to(tl.int64)  # GQA: no repeated K/V in memory
    m0 = start_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    d2 = tl.arange(0, DP // 2)
    dq = tl.arange(0, DP // QB)
    dd = tl.arange(0, DP)

    qsb = tl.load(Qs + pid_bh.to(tl.int64) * NQP * (DP // QB) + offs_m[:, None] * (DP // QB) + dq[None, :])
    qfac = tl.full([BLOCK_M], 1.0, tl.float32) * qk_scale
    if PATH == 2:
        q_op = tl.load(Qc.to(tl.pointer_type(tl.uint8)) + pid_bh.to(tl.int64) * NQP * (DP // 2)
                       + offs_m[:, None] * (DP // 2) + d2[None, :])
        if IS_MX:
            q_sc = qsb
        else:
            q_sc = qsb.to(tl.float8e4nv, bitcast=True)
    else:
        q_sc = qsb
        qb_ = tl.load(Qc + pid_bh.to(tl.int64) * NQP * (DP // 8) + offs_m[:, None] * (DP // 8)
                      + tl.arange(0, DP // 8)[None, :])
        if IS_MX:
            q_op, qfac = _mx_q_operand(qb_, qsb, PATH, QB)
            qfac = qfac * qk_scale
        else:
            q16 = fp4_tile_f16(unpack_nibbles_words(qb_), qsb, offs_m, QB, False)
            if PATH == 1:
                q_op = q16
            else:
                q_op = q16.to(tl.float32)
    CR = QCORR + (pid_bh.to(tl.int64) * NQBC + m0 // 128 - I0) * NKP  # this query block's table row (smooth_q)
    if IS_MX:
        vexp = tl.load(VEXP + kv_bh * DP + dd)
    else:
        vexp = tl.zeros([DP], tl.int32)

    Kc_h = Kc + kv_bh * NKP * (DP // 8)  # int32 words
    Ks_h = Ks + kv_bh * NKP * (DP // QB)
    Vc_h = Vc + kv_bh * DP * (NKP // 8)  # int32 words
    Vs_h = Vs + kv_bh * DP * (NKP // QB)
    KH_h = KH + kv_bh * NKP * DP
    VH_h = VH + kv_bh * DP * NKP

    if PMAX == 2:
        m_i = tl.load(MBUF + pid_bh.to(tl.int64) * NQP + offs_m)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SINKS:  # the sink joins the softmax as a key with no value: its share of l, and of the max
        sk = tl.load(SINK + pid_bh.to(tl.int64) * NQP + offs_m)
        if PMAX != 1:  # PMAX 2: m (from the row-max pass) includes the sink; 0: the running max starts at it
            m_i, l_i = sink_start(sk, m_i, PMAX == 0)
    tau = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # two-level P: the last tile's row max
    acc = tl.zeros([BLOCK_M, DP], dtype=tl.float32)

    # bottom-right: query i sees keys j <= i + COFF (COFF = Nk - Nq causal; + the right extent of a window)
    # and, with WINDOW, j >= i + LOFF (LOFF = Nk - Nq - the window's left extent)
    hi, full_end = causal_key_range(m0, COFF, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    lo, e1, e2 = window_key_range(m0, LOFF, hi, full_end, BLOCK_M, BLOCK_N, WINDOW)
    if WINDOW:  # key tiles the window's left edge crosses
        acc, l_i, m_i, tau = _attn_inner(acc, l_i, m_i, tau, q_op, q_sc, qfac, CR, Kc_h, Ks_h, Vc_h, Vs_h, vexp,
                                         KH_h, VH_h,
                                         offs_m, lo, e1, Nk, COFF, LOFF, qk_scale, NKP, PMAX,
                                         True, CAUSAL, WINDOW, IS_MX, TWO_LEVEL, STAGED, SMOOTH_Q, PATH, QB,
                                         BLOCK_N, DP)
    acc, l_i, m_i, tau = _attn_inner(acc, l_i, m_i, tau, q_op, q_sc, qfac, CR, Kc_h, Ks_h, Vc_h, Vs_h, vexp,
                                KH_h, VH_h,
                                offs_m, e1, e2, Nk, COFF, LOFF, qk_scale, NKP, PMAX,
                                False, CAUSAL, WINDOW, IS_MX, TWO_LEVEL, STAGED, SMOOTH_Q, PATH, QB, BLOCK_N, DP)
    acc, l_i, m_i, tau = _attn_inner(acc, l_i, m_i, tau, q_op, q_sc, qfac, CR, Kc_h, Ks_h, Vc_h, Vs_h, vexp,
                                KH_h, VH_h,
                                offs_m, e2, hi, Nk, COFF, LOFF, qk_scale, NKP, PMAX,  # (left edge behind)
                                True, CAUSAL, False, IS_MX, TWO_LEVEL, STAGED, SMOOTH_Q, PATH, QB, BLOCK_N, DP)
    if PMAX == 1:
        if SINKS:
            m_i = tl.maximum(m_i, sk)
        tl.store(MBUF + pid_bh.to(tl.int64) * NQP + offs_m, m_i)
        return

    # Non-finite inputs (module docstring), from the pre-pass flags: the loops above only saw finite
    # operands. A NaN/Inf query row, or a key row that the row sees, makes the row of S NaN, hence the
    # output row and its LSE; a NaN/Inf V element makes its channel NaN in every row (0·NaN for masked
    # keys too). Rows that see no key stay 0 / -inf. Indexed by query head (pid_bh), not kv_bh: a value
    # live across the loops would shift the register allocation of these 255-register kernels.
    seen, inv_l, flags = finish_rows(l_i, m_i, offs_m, KVBAD, QBAD, pid_bh, NQP, Nk, COFF, LSE, DP, CAUSAL,
                                     KROWS + (b * (Hq // GROUP) + h // GROUP).to(tl.int64) * NKP, NKP, LOFF,
                                     WINDOW, tl.arange(0, 64))
    if TWO_LEVEL:  # acc is in units of the last tile's s1 (two_level_step)
        inv_l = inv_l * two_level_scale(tau, m_i)
        if IS_MX and PATH != 2:
            inv_l = inv_l * 8.0  # the FP8 operand held ϕ(P̃/s1)/8
    o = acc * inv_l[:, None]
    if tl.load(flags + 1) != 0:  # some V channel of the kv head is non-finite (rare)
        col_nan = tl.load(flags + 2 + dd) != 0
        o = tl.where(seen[:, None] & col_nan[None, :], float("nan"), o)
    if IS_MX:
        if PATH != 2:
            vf = exp2i(vexp - 6)
            if not TWO_LEVEL:
                vf = vf * (1.0 / 256.0)
            o = o * vf[None, :]
    o_ptrs = (O + b.to(tl.int64) * so_b + h.to(tl.int64) * so_h + offs_m[:, None].to(tl.int64) * so_n
              + dd[None, :] * so_d)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < Nq) & (dd[None, :] < D))


def default_config(dp: int, path: int, two_level: bool = False) -> dict:
    """The tile config ``fp4attn.attention`` runs (no autotuning). D <= 128 on Hopper: 64x64 tiles, 4 warps,
    3 stages for every recipe, the best (or within 1% of the best) of the H200 config sweep of ``fp4attn
    bench attention`` at every benchmark shape (BENCHMARKS.md, issue 4). With 8 warps and 128 rows the
    MXFP4, two-level and online loops fit one program per SM: e.g. (16,16,4096,64) sage3 6.22 -> 5.00
    ms, mxfp4 6.70 -> 4.67. NVFP4 two-level P (sage3) at D = 128: 2 stages, re-measured in the thirty-fourth
    session (benchmarks/prepass-s34, H200: sage3 8.34 -> 8.06 ms at (16,16,4096,128), 4.99 -> 4.89 causal,
    29.7 -> 29.5 at (4,16,16384,128), same bits; 2 stages were 5-13% slower for mxfp4, 7% for nvfp4 and 0-1% for sage3
    at D = 64). Under the interpreter: small tiles."""
    if path == PATH_INTERP:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 1}
    if dp >= 256:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2}
    if path != PATH_HOPPER:  # Blackwell (compile-checked only): the tiles its PTX test was written for
        return {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}
    return {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2 if two_level and dp == 128 else 3}


def default_max_config(dp: int, path: int, is_mx: bool = False) -> dict | None:
    """Tiles of the row-max pass (S and its row max only: a GEMM with a max epilogue) when they differ
    from the attention pass's; None = the same. From an H200 sweep (BENCHMARKS.md, issue 4): larger
    tiles, 2-4% off the two passes' time (e.g. (16,16,4096,128) nvfp4 7.20 -> 7.06 ms, mxfp4 6.96 ->
    6.79; the row maxima, hence the outputs, are bit-identical whatever the tiles)."""
    if path != PATH_HOPPER or dp > 128:
        return None
    if is_mx:
        return {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3}
    if dp == 128:
        return {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
    return None


def gluon_pass_choice(kernel: str, *, is_mx: bool, two_level_p: bool, online: bool, smooth_q: bool, staged: bool,
                      dp: int, path: int, device, thrift: bool = False) -> tuple[bool, bool]:
    """(can, does): whether the Gluon attention pass can run these passes (single-level P with the exact row max,
    or two-level P in one pass; ``attention_gluon.supported``; sliding windows and sinks as the Triton pass), and
    whether ``kernel`` ("auto" / "gluon" / "triton") runs them there (auto: where ``attention_gluon.preferred``; a
    Thrift mask always)."""
    can = (online == two_level_p and path == PATH_HOPPER
           and attention_gluon.supported(is_mx=is_mx, two_level=two_level_p, smooth_q=smooth_q, staged=staged, dp=dp,
                                         device=device))
    does = can and (kernel == "gluon" or thrift or (kernel == "auto" and attention_gluon.preferred(dp)))
    return can, does


def gluon_rowmax(does: bool, *, smooth_q: bool, dp: int) -> bool:
    """Whether the row-max pass runs on ``attention_gluon``'s kernel, given ``does`` (``gluon_pass_choice``'s: the
    attention pass there): not with smooth_q, and where ``attention_gluon.rowmax_preferred``."""
    return does and not smooth_q and attention_gluon.rowmax_preferred(dp)


def gluon_key_order(does: bool, *, online: bool, smooth_q: bool, dp: int) -> bool:
    """Whether ``fp4attn.attention`` has the pre-pass write its staged operands in the Gluon passes' key order
    (``quantize_qkv(key_perm=True)``), given ``does`` (``gluon_pass_choice``'s): every pass on the Gluon kernels,
    i.e. two-level P (one pass) or single-level P with its row-max pass there too (``gluon_rowmax``). The attention
    pass then takes each block's maximum and scale in one thread: nvfp4 4-11% faster (H100 and H200, BENCHMARKS.md,
    forty-sixth session)."""
    return does and (online or gluon_rowmax(does, smooth_q=smooth_q, dp=dp))


def attention_packed(pk: PackedQKV, *, causal: bool, scale: float, two_level_p: bool, B: int, Hq: int,
                     Hkv: int, out: torch.Tensor, online: bool | None = None,
                     config: dict | None = None, max_config: dict | None = None,
                     kernel: str | None = None, gluon_config: dict | None = None,
                     gluon_max_config: dict | None = None, window: tuple[int, int] | None = None,
                     sinks: torch.Tensor | None = None,
                     thrift_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Main kernel on the pre-pass buffers; writes ``out`` (a bhsd view, any strides) and returns
    the padded LSE (B, Hq, NQP) float32 (natural log, relative to the smoothed K if smooth_k).

    ``online=False`` (default for single-level P) runs a row-max pass first (S only) and then the
    attention pass with the exact row max, so ϕ(P̃) is quantized against the one-shot max exactly as
    the reference defines it. With the running max of one-pass online softmax, P̃ of early tiles is
    P̃·exp(m_final − m_run), which the block scales round differently: measured on N(0,1) inputs
    (N=1024, D=128) that alone moves the output by ~0.05 relative L2 for nvfp4 and ~0.12 for mxfp4
    against the reference (its error against exact attention is the same as the reference's). Two-level
    P is invariant to the max (P̃/s1 = 2688·exp(S − tile max)), so it always runs one pass.

    ``kernel`` (default ``FP4ATTN_ATTN_KERNEL`` or "auto"): which kernel runs the attention pass (with the
    exact row max, or two-level P in one pass): "triton" (``_attn_fwd_kernel``), "gluon" (``attention_gluon``:
    asynchronous wgmma, sm_90, NVFP4) or "auto" (Gluon where supported and ``attention_gluon.preferred``).
    Where it is the Gluon pass and there is no smooth_q, the row-max pass runs on ``attention_gluon``'s row-max
    kernel as well (the same maxima; ``attention_gluon.rowmax_preferred``, ``FP4ATTN_ROWMAX_KERNEL``), with
    ``gluon_max_config`` overriding its tiles.

    ``window=(left, right)``: a sliding window (``fp4attn.attention``'s ``window_size``, normalized: -1 =
    unbounded, ``right == 0`` when ``causal``): query i sees keys i + Nk − Nq − left ... i + Nk − Nq + right.
    Key tiles outside every row's window are skipped, the ones its edges cross are masked (both kernels).

    ``sinks`` (Hq,): attention sinks in score units (``fp4attn.attention``'s); they join the row max (the
    one-shot max P̃ is quantized against), l and the LSE. With smooth_k the scores are shifted by scale·q·k̄
    per row, so the kernel's per-row sink is shifted by the same (both kernels read it per row).

    ``thrift_mask``: ThriftAttention's (B, Hq, nqb, nkb) int8 mask of the 64-token key blocks selected per
    64-token query block (``kernels.thrift.select``): those key tiles are left out (the FP4 phase of
    ``thrift.thrift_fwd``, whose 16-bit phase adds them). Two-level P on the Gluon pass only.
    """
    qb, is_mx = quant_block(pk.fmt)
    NQP, DP = pk.qc.shape[2], pk.qc.shape[3] * 2
    NKP = pk.ks.shape[2]
    lse = torch.empty((B, Hq, NQP), device=out.device, dtype=torch.float32)
    if online is None:
        online = two_level_p
    config = config or default_config(DP, pk.path, two_level_p and not is_mx)
    max_config = max_config or default_max_config(DP, pk.path, is_mx) or config
    vexp = pk.vexp if is_mx else lse  # unused pointer when not MX
    mbuf = lse if online else torch.empty((B, Hq, NQP), device=out.device, dtype=torch.float32)
    smooth_q = pk.k_in is not None
    nqb = NQP // SMOOTH_Q_BLOCK
    # smooth_q: the correction table, for as many 128-query blocks at a time as its size limit allows
    chunk = max(1, min(nqb, smooth_q_table_max_bytes() // (B * Hq * NKP * 4))) if smooth_q else nqb
    table = (torch.empty((B, Hq, chunk, NKP), device=out.device, dtype=torch.float32) if smooth_q
             else lse)  # unused pointer without smooth_q
    i32 = torch.int32  # packed codes are read as 32-bit words (vectorized loads)
    staged = pk.kh is not None
    assert staged or pk.kc.numel() > 0, "packed operands: quantize_qkv(..., staged=False)"
    kh = pk.kh if staged else lse
    vh = pk.vh if staged else lse
    right, coff, left, loff = window_offsets(window, causal, pk.nq, pk.nk)
    edges = (right, coff, left, loff)
    if left and pk.krows is None:
        raise ValueError("a sliding window's left edge needs the per-key flags: quantize_qkv(..., key_rows=True)")
    if sinks is not None:  # per-row sink logits in the kernel's log2 units (minus the smooth_k shift: per row,
        # hence host-side here, where the other kernels read the (Hq,) sinks themselves)
        sink = (sinks.float() * LOG2E).view(1, Hq, 1).expand(B, Hq, NQP)
        if pk.qkb is not None:
            sink = sink - (scale * LOG2E) * pk.qkb
        sink = sink.contiguous()
    else:
        sink = lse  # unused pointer
    args = (pk.qc.view(i32), pk.qs, pk.kc.view(i32), pk.ks, pk.vc.view(i32), pk.vs, vexp, table, out, lse, mbuf,
            kh, vh, pk.qbad, pk.kvbad, pk.krows if left else lse, sink, *out.stride(),
            scale * LOG2E, Hq, Hq // Hkv, pk.nq, pk.nk, NQP, NKP, pk.d)
    targs = (coff, loff)  # the Triton kernel's window offsets (after I0, NQBC)
    meta = dict(CAUSAL=right, WINDOW=left, SINKS=sinks is not None, IS_MX=is_mx, TWO_LEVEL=two_level_p,
                STAGED=staged, SMOOTH_Q=smooth_q, PATH=pk.path, QB=qb, DP=DP)

    kernel = kernel or os.environ.get("FP4ATTN_ATTN_KERNEL", "auto")
    if kernel not in ("auto", "gluon", "triton"):
        raise ValueError(f"kernel: expected 'auto', 'gluon' or 'triton', got {kernel!r}")
    gluon_ok, use_gluon = gluon_pass_choice(kernel, is_mx=is_mx, two_level_p=two_level_p, online=online,
                                            smooth_q=smooth_q, staged=staged, dp=DP, path=pk.path, device=out.device,
                                            thrift=thrift_mask is not None)
    if thrift_mask is not None and not (gluon_ok and two_level_p and kernel != "triton"):
        raise ValueError("thrift_mask: runs on the Gluon pass with two-level P only")
    if kernel == "gluon" and not gluon_ok:
        raise ValueError("kernel='gluon': the Gluon attention pass runs nvfp4 (single-level P with the exact row "
                         "max, or two-level P in one pass) on sm_90 (staged operands, 32 < D <= 128)")

    # the row-max pass on the Gluon kernel too, where the attention pass runs there (not with smooth_q)
    gluon_max = gluon_rowmax(use_gluon, smooth_q=smooth_q, dp=DP)
    if pk.key_perm and not (use_gluon and (online or gluon_max)):
        raise ValueError("operands in the Gluon passes' key order (quantize_qkv(key_perm=True)) run on the Gluon "
                         "attention and row-max passes only")
    if (pk.q_in is not None or pk.v_in is not None) and online:
        raise ValueError("quantize_qkv(q_fused=True / v_fused=True): Q / V are quantized by the row-max pass "
                         "(single-level P only)")

    def launch(pmax, cfg, i0, n):
        if pmax == 1 and gluon_max:
            attention_gluon.launch_rowmax(args, edges=edges, i0=i0, n=n, B=B, Hq=Hq, cfg=gluon_max_config,
                                          key_perm=pk.key_perm, sinks=sinks is not None, q_in=pk.q_in, v_in=pk.v_in)
            return
        if pmax != 1 and use_gluon:
            attention_gluon.launch(args, edges=edges, two_level=two_level_p, smooth_q=smooth_q, i0=i0, n=n, B=B,
                                   Hq=Hq, cfg=gluon_config or attention_gluon.default_config(DP),
                                   thrift_mask=thrift_mask, key_perm=pk.key_perm, sinks=sinks is not None)
            return
        c = dict(cfg)
        extra = {k: c.pop(k) for k in ("num_warps", "num_stages", "maxnreg") if k in c}
        assert SMOOTH_Q_BLOCK % c["BLOCK_M"] == 0 and c["BLOCK_N"] % qb == 0 and N_ALIGN % c["BLOCK_N"] == 0, cfg
        grid = head_grid(n * (SMOOTH_Q_BLOCK // c["BLOCK_M"]), B * Hq)
        fast(_attn_fwd_kernel)[grid](*args, i0, n, *targs, PMAX=pmax, **meta, **c, **extra)

    for i0 in range(0, nqb, chunk):
        n = min(chunk, nqb - i0)
        if smooth_q:
            smooth_q_corr(pk, i0, n, out=table, causal=causal)  # (a window reads a subset of causal's)
        if online:
            launch(0, config, i0, n)
        else:
            launch(1, max_config, i0, n)
            launch(2, config, i0, n)
    return lse


def op_key_perm(D: int, *, fmt: str, two_level_p: bool, online: bool | None, smooth_q: bool, staged: bool,
                path: int, device) -> bool:
    """``quantize_qkv``'s ``key_perm`` for ``attention_fwd``'s passes (``attention_packed`` with the kernel of
    ``FP4ATTN_ATTN_KERNEL``, default auto): ``gluon_key_order`` of ``gluon_pass_choice``'s choice."""
    online = two_level_p if online is None else online
    dp = head_dim_padded(D, path)
    _, does = gluon_pass_choice(os.environ.get("FP4ATTN_ATTN_KERNEL", "auto"), is_mx=quant_block(fmt)[1],
                                two_level_p=two_level_p, online=online, smooth_q=smooth_q, staged=staged, dp=dp,
                                path=path, device=device)
    return gluon_key_order(does, online=online, smooth_q=smooth_q, dp=dp)


# single-level NVFP4 in key order: Q / V quantized inside the Gluon row-max pass (``quantize_qkv(q_fused=True)``,
# ``v_fused``) where True; False runs the separate pre-pass. Off until measured on a GPU (benchmarks/qfuse-s55)
Q_FUSED = False
V_FUSED = False


def attention_fwd(q, k, v, *, causal: bool = False, scale: float | None = None, fmt: str = "nvfp4",
                  smooth_q: bool = False, smooth_k: bool = False, two_level_p: bool = False,
                  out: torch.Tensor | None = None, path: int | None = None, online: bool | None = None,
                  staged: bool | None = None, config: dict | None = None, window: tuple[int, int] | None = None,
                  sinks: torch.Tensor | None = None, want_lse: bool = True):
    """Pre-pass + main kernel on bhsd views (any strides). Returns (out (B, Hq, Nq, D) in q's dtype,
    lse (B, Hq, Nq) float32), lse None with ``want_lse=False`` (the op called without ``return_lse``: no
    smooth_k shift of it is computed). ``window``, ``sinks``: see ``attention_packed``."""
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if path is None:
        path = default_path(q.device)
    if staged is None:
        staged = default_staged()
    key_perm = op_key_perm(D, fmt=fmt, two_level_p=two_level_p, online=online, smooth_q=smooth_q, staged=staged,
                           path=path, device=q.device)
    fusable = key_perm and not (two_level_p if online is None else online) and not (smooth_q or smooth_k)
    # V's 64-token tiles are spread over the row-max programs (128 or 64 query rows each): at most two per program
    # (fewer queries than keys, e.g. a short prefill against a long context, keep V's own pre-pass)
    v_fused = fusable and V_FUSED and Hq * pad_tokens(Nq) >= Hkv * pad_tokens(k.shape[2])
    pk = quantize_qkv(q, k, v, fmt=fmt, smooth_q=smooth_q, smooth_k=smooth_k, path=path, staged=staged,
                      key_rows=window is not None, key_perm=key_perm, q_fused=fusable and Q_FUSED, v_fused=v_fused)
    if out is None:
        out = torch.empty((B, Hq, Nq, D), device=q.device, dtype=q.dtype)
    lse = attention_packed(pk, causal=causal, scale=scale, two_level_p=two_level_p, B=B, Hq=Hq, Hkv=Hkv,
                           out=out, online=online, config=config, window=window, sinks=sinks)
    if not want_lse:
        return out, None
    lse = lse[:, :, :Nq]
    if pk.kbar is not None:
        # K smoothing shifts every score of a row by scale·q·k̄ (softmax-invariant); LSE refers to the
        # true scores, as the reference's (q·k̄ from the Q pre-pass)
        lse = lse + scale * pk.qkb[:, :, :Nq]
    return out, lse


# =================================================================================================
# Ahead-of-time compilation for a target without its GPU (tests/test_blackwell_ptx.py, CI)
# =================================================================================================
def compile_for_target(capability: int, *, fmt: str = "nvfp4", causal: bool = False, window: bool = False,
                       sinks: bool = False,
                       two_level_p: bool = False, smooth_q: bool = False, pmax: int = 0, staged: bool = False,
                       path: int | None = None, dp: int = 128, block_m: int = 128, block_n: int = 64,
                       num_warps: int = 8, num_stages: int = 2):
    """Compile the main kernel for ``cuda:capability`` (e.g. 90, 100, 120) with Triton's AOT API and
    return the compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``). No GPU is needed."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if path is None:
        path = PATH_BLACKWELL if capability >= 100 else PATH_HOPPER
    qb, is_mx = quant_block(fmt)
    ptrs = {"Qc": "*i32", "Qs": "*u8", "Kc": "*i32", "Ks": "*u8", "Vc": "*i32", "Vs": "*u8",
            "VEXP": "*i32", "QCORR": "*fp32", "O": "*bf16", "LSE": "*fp32", "MBUF": "*fp32",
            "KH": "*fp8e4nv" if is_mx else "*fp16", "VH": "*fp8e4nv" if is_mx else "*fp16",
            "QBAD": "*u8", "KVBAD": "*i32", "KROWS": "*u8", "SINK": "*fp32"}
    ints = {n: "i32" for n in ("so_b", "so_h", "so_n", "so_d")}
    sig = {**ptrs, **ints, "qk_scale": "fp32", "Hq": "i32", "GROUP": "i32", "Nq": "i32", "Nk": "i32",
           "NQP": "i32", "NKP": "i32", "D": "i32", "I0": "i32", "NQBC": "i32", "COFF": "i32", "LOFF": "i32"}
    consts = dict(PMAX=pmax, CAUSAL=causal, WINDOW=window, SINKS=sinks, IS_MX=is_mx, TWO_LEVEL=two_level_p,
                  STAGED=staged, SMOOTH_Q=smooth_q, PATH=path, QB=qb, BLOCK_M=block_m, BLOCK_N=block_n, DP=dp)
    sig.update({k: "constexpr" for k in consts})
    src = ASTSource(_attn_fwd_kernel, sig, consts)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})
