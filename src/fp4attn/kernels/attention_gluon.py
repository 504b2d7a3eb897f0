"""The attention pass of ``fp4attn.attention`` on Hopper written in Gluon (issue 4): asynchronous wgmma.

Same inputs, numerics and outputs as ``attention._attn_fwd_kernel`` on the staged operands of the Hopper
path (K̂ and V̂ᵀ in fp16, exact NVFP4 values; see ``attention``'s module docstring), for NVFP4 with
``PMAX=2`` (single-level P̃ quantized against the exact row max from the row-max pass) or, with
``TWO_LEVEL``, SageAttention3's two-level P in one pass (``PMAX=0``: P̃/s1 per key tile, the accumulator in
units of the last tile's s1, ``_tiles.two_level_step``); ``SMOOTH_Q`` adds sage3's q̄·γ(K)ᵀ correction (one
FP32 table value per key, ``attention.smooth_q_corr``) to S·scale in the same fma; ``THRIFT`` (two-level)
leaves out the key tiles ThriftAttention selected for each 64-row query block (``thrift.thrift_fwd``'s FP4
phase, whose 16-bit phase adds them). ``WINDOW`` / ``SINKS`` as the Triton kernel's: a sliding window's key loop
starts at its first tile and masks the tiles its edges cross (``_tiles.window_key_range``; the epilogue scans the
rows' windows in the per-key non-finite flags, ``_tiles.finish_rows``), and a sink joins the row-max pass's maximum
and l (single-level) or starts the running max (two-level). Triton 3.6 issues every
``tl.dot`` as a wgmma it waits for at once, so per warp group QKᵀ, the P̃ rounding and P·V run one after
the other and the pass is latency-bound (BENCHMARKS.md, issue 4, sixteenth session). Here every step is
explicit. Per key tile t, in one warp group (64 query rows):

1. wait for K̂ tile t+1 (TMA into an ``NS``-slot ring, one mbarrier per slot) and issue S(t+1) = Q̂K̂ᵀ
   asynchronously (Q̂ decoded to fp16 into shared memory once per program);
2. wait until only that wgmma is outstanding: P·V of tile t-1 is done, so its V̂ᵀ slot is refilled
   (``NV`` slots; with one, V̂ᵀ tile t arrives while step 3 runs) and its ϕ(P̃) registers are free;
3. round P̃ of tile t (its S came in at the end of the previous iteration) on the ALUs while the tensor
   cores compute S(t+1);
4. issue O += ϕ(P̃)·V̂ asynchronously, ϕ(P̃) from registers (the wgmma A operand: no shared memory);
5. wait for S(t+1) (all but the newest group) and refill its K̂ slot.

With the exact row max (``PMAX=2``) nothing rescales the accumulator, so the P·V products chain on it
without a wait. Two-level P rescales it every tile: there step 2 waits for every group and the accumulator is
rescaled *before* step 1 (see ``_step``: otherwise ptxas serializes all wgmma of the kernel). On the same
operands it gave bit-identical outputs to the Triton pass at the benchmark shapes (H100), 1.09-1.19x faster
for the op at D = 128 (BENCHMARKS.md, thirty-eighth session).

The score scale and the row max enter as one fma (S·scale − m), taken from the accumulator as soon as S is
waited for (so the accumulator's registers take the next S without a copy); the Triton kernel
rounds S·scale first, so ~1e-5 relative L2 of the outputs differ (a P̃ code flips where a value sits on a
rounding boundary; GPU tests). At D = 128 the output tile leaves through shared memory (the idle K̂ ring,
``STAGE_O``) as rows of 16-byte vectors: the fragment's own stores cost 2-4% of a causal op (thirty-ninth session).

The row-max pass before it (``_rowmax_kernel_gl``, the Triton kernel's ``PMAX=1``; ``FP4ATTN_ROWMAX_KERNEL=triton``
selects that one) is a GEMM with a max epilogue: S of key tile t + 1 is issued asynchronously into one of two register
sets, each reused in place, while the row maxima are taken from the other; K̂ comes by TMA through a 6-slot ring, Q̂
stays in registers, and the maxima of S are scaled once per row (max(S)·scale = max(S·scale) bit for bit). Two
programs of 128 rows per SM at D = 128 (four of 64 at D = 64). Same maxima as the Triton pass, bit for bit (GPU test);
1.08-1.16x faster than it, the op 1.5-4% (H100, BENCHMARKS.md, fortieth session). Windows and sinks there too (the
op with them 1.23-1.40x faster than on the Triton passes, H200, fifty-second session).

Key order (``KEY_PERM``; ``fp4attn.attention`` and Thrift's FP4 phase, ``attention.gluon_key_order``): the pre-pass
stores K̂'s rows and V̂ᵀ's columns so that key 64g + 16q + 2j + e sits at position 64g + 8j + 2q + e
(``_tiles.key_position``), the column that lane q of a quad holds in a wgmma accumulator fragment. Score column c is
then key ``position_key(c)`` (the masks; ``attention.smooth_q_corr`` writes the smooth_q table in the same order),
and every 16-key block of a score row lies in one thread: ``_phi`` takes its maximum and E4M3 scale in-thread, once,
instead of after two shuffles in all four lanes of the quad. S, P̃ and ϕ(P̃) of each key are unchanged; P·V and the
row sums add the keys in another order (1e-5 relative L2 in float32). Single-level P: loop 530 → 466 SASS per tile
(static, both sides of the mask branch), the op 1.04-1.11x (H100 and H200, BENCHMARKS.md, forty-sixth session).
Two-level P with smooth_q (sage3): 764 → 718, the op 1.05-1.07x at D = 128 (H200, forty-seventh session). The key of
each column is computed inside the masked branch (``_p_tile``), not kept in 16 registers across the loop: kept, it
made the two-level loop spill.

P̃ rounding (config ``P16``, default True): ``fake_quant_p_f16`` rounds P̃ at float16 precision, two values per
instruction: P̃ and its quotient by the block scale are rounded to float16 before the E2M1 rounding. The loop
is 530 SASS instructions per 64x64 tile per thread instead of 627 (``tools/sass_count.py attn_gl``, static), and
the op 5-11% faster (BENCHMARKS.md, thirty-seventh session). The price: the
output moves ~1.2e-2 relative L2 from the reference's ϕ(P̃) (codes flip where a value lies within float16's
precision of a rounding boundary); its error against exact attention is unchanged (1.000x the float32
rounding's), inside SPEC §6 (0.05 and 1.05x). ``P16=False`` is the shared float32 ``fake_quant_p``. In key order
(``KEY_PERM``) the default is ``P16=2``: the same float16 rounding, bit for bit, on f16x2 words that pair the two
columns of an accumulator register pair (``fake_quant_p_words``); left to the compiler, the float16 values were paired
across rows and re-paired by byte permutes. Loop 466 → 447 SASS, the op 1.00-1.06x (H200 and H100, fifty-third
session; a config with ``P16=True`` runs the element-wise float16 rounding there, for A/B runs and as the tests'
oracle). The masks,
the non-finite flags and the epilogue follow the Triton kernel (``_tiles`` helpers). GPU only (Gluon has no
interpreter): the CPU tests run the Triton kernel and the helpers; the GPU tests compare the float32 rounding
with the Triton pass and the float16 one with its PyTorch model (``tests/p16_model.py``).
"""

from __future__ import annotations

import functools
import os

import torch

from ..formats.triton_helpers import (
    block_bad,
    e2m1_decode_f16,
    e4m3_decode_f16,
    fake_quant_p,
    fake_quant_p_f16,
    fake_quant_p_words,
    fp4_tile_f16,
    pack_nibbles,
    phi_blocks_f16,
    quant_rows,
)
from ..ops import _dispatch
from ._launch import TmaDesc, fast, head_grid
from ._tiles import (
    causal_key_range,
    finish_rows,
    flag_v_channels,
    head_program,
    load_rows,
    position_key,
    sink_start,
    two_level_scale,
    two_level_step,
    visible,
    window_key_range,
)

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernel serves every device
    HAVE_GLUON = False


if HAVE_GLUON:

    @gluon.jit
    def _shifted(s_acc, qk_scale, m_use, cs, SMOOTH_Q: gl.constexpr, TWO_LEVEL: gl.constexpr):
        """The scores of a tile in the log2 domain, taken from the wgmma accumulator as soon as it is waited
        for (the accumulator registers are free for the next S at once: no copy of the scores). Single-level:
        S·scale − m against the exact row max, with one rounding (an fma); two-level: S·scale (its row max is
        the tile's). ``cs`` (SMOOTH_Q): the tile's scale·q̄ᵢ·γ(K)ᵀ, added in the same fma."""
        if TWO_LEVEL:
            if SMOOTH_Q:
                x = gl.fma(s_acc, qk_scale, cs[None, :])
            else:
                x = s_acc * qk_scale
        else:
            if SMOOTH_Q:
                x = gl.fma(s_acc, qk_scale, cs[None, :]) - m_use[:, None]
            else:
                x = gl.fma(s_acc, qk_scale, -m_use[:, None])
        return x

    @gluon.jit
    def _corr(CR, start_n, cols, qk_scale, SMOOTH_Q: gl.constexpr):
        """scale·q̄ᵢ·γ(K)ᵀ of the key tile at ``start_n`` (SageAttention3's smooth_q correction, one FP32 value
        per key from ``attention.smooth_q_corr``'s table row, whose columns are in K̂'s storage order: read at the
        score columns ``cols``, contiguous in each thread); without SMOOTH_Q a dummy nothing reads."""
        if SMOOTH_Q:
            cs = gl.load(CR + start_n + cols) * qk_scale
        else:
            cs = cols.to(gl.float32)
        return cs

    @gluon.jit
    def _p_tile(s, l_i, m_i, tau, start_n, offs_m, cols, Nk, causal_off, full_end, SR, e1, left_off,
                CAUSAL: gl.constexpr, TWO_LEVEL: gl.constexpr, THRIFT: gl.constexpr, BLOCK_N: gl.constexpr,
                KEY_PERM: gl.constexpr, WINDOW: gl.constexpr):
        """P̃ of one tile of scores ``s`` (``_shifted``; masked past ``full_end`` and, with WINDOW, below ``e1``: the
        tiles a sliding window's left edge crosses, ``_tiles.window_key_range``) and the row statistics.
        Single-level: P̃ = exp2(s) against the exact row max, l += its row sums (unquantized), ``pre`` unused.
        Two-level (``_tiles.two_level_step``): P̃/s1, the running max m, the unit ``tau`` of the accumulator
        and ``pre``, the factor the accumulator takes before this tile's product. THRIFT: a key tile selected
        for this query block (``SR``: its row of ThriftAttention's selection mask) is masked out whole."""
        if _masked(start_n, full_end, e1, WINDOW):
            # the keys computed here, not held across the loop (16 registers: the two-level loop spilled)
            keys = _col_keys(cols, KEY_PERM)
            s = gl.where(visible(start_n + keys, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW), s, float("-inf"))
        if THRIFT:
            if gl.load(SR + start_n // BLOCK_N) != 0:
                s = gl.full(s.shape, float("-inf"), gl.float32, s.type.layout)
        if TWO_LEVEL:
            p, pre, tau, m_i, l_i = two_level_step(s, m_i, l_i, tau, True)
        else:
            p = gl.exp2(s)
            l_i = l_i + gl.sum(p, 1)
            pre = l_i
        return p, l_i, m_i, tau, pre

    @gluon.jit
    def _masked(start_n, full_end, e1, WINDOW: gl.constexpr):
        """Whether the key tile at ``start_n`` needs the per-key mask: from ``full_end`` on (the right edge, Nk) and,
        with WINDOW, below ``e1`` (the tiles the window's left edge crosses)."""
        if WINDOW:
            m = (start_n >= full_end) | (start_n < e1)
        else:
            m = start_n >= full_end
        return m

    @gluon.jit
    def _phi(p, QB: gl.constexpr, P_L: gl.constexpr, P16: gl.constexpr, KEY_PERM: gl.constexpr):
        """ϕ(P̃) in fp16, in the layout of the P·V wgmma's A operand (registers). KEY_PERM (keys in storage order,
        ``_tiles.key_position``; float16 rounding): the 16 keys of a block are the 16 columns one thread holds of
        its row, column 8j + 2q + e of each 64 for lane q of a quad (j = 0..7, e = 0, 1), so the block maxima are
        taken in-thread and each scale is computed once, not in all four lanes of the quad after two shuffles."""
        if KEY_PERM and P16 == 2:  # the same rounding on f16x2 words, no byte permutes (fifty-third session)
            pq = fake_quant_p_words(p)
        elif KEY_PERM:
            BM: gl.constexpr = p.shape[0]
            BN: gl.constexpr = p.shape[1]
            pb = gl.reshape(p, [BM, BN // 64, 8, 4, 2]).to(gl.float16)
            pq = gl.reshape(phi_blocks_f16(pb, gl.max(gl.max(pb, axis=4, keep_dims=True), axis=2, keep_dims=True)),
                            [BM, BN])
        elif P16:
            pq = fake_quant_p_f16(p, QB)
        else:
            pq = fake_quant_p(p, QB, False, True)
        return gl.convert_layout(pq, P_L)

    @gluon.jit
    def _col_keys(cols, KEY_PERM: gl.constexpr):
        """The key (from the tile's first) of each score column ``cols`` of a tile; KEY_PERM: K̂ / V̂ᵀ in the
        pre-pass's key order (``_tiles.key_position``), else in order."""
        if KEY_PERM:
            cols = position_key(cols)
        return cols

    @gluon.jit
    def _load(desc, smem, bar, r, c, slot):
        """TMA of the tile at (r, c) of ``desc`` into ring slot ``slot``, completing on its mbarrier."""
        mbarrier.expect(bar.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [r, c], bar.index(slot), smem.index(slot))

    @gluon.jit
    def _pv_done(acc, p16, v_desc, v_smem, v_bar, vrow, n0, t, n_tiles, BLOCK_N: gl.constexpr, NV: gl.constexpr,
                 PENDING: gl.constexpr):
        """Wait for the P·V product of tile t - 1 (all but PENDING newer groups), then refill its V̂ᵀ slot
        (and free the registers of its ϕ(P̃)). Tile t holds keys n0 + t·BLOCK_N ..."""
        acc, p16 = warpgroup_mma_wait(PENDING, deps=[acc, p16])
        gl.thread_barrier()
        if t >= 1:
            if t - 1 + NV < n_tiles:
                _load(v_desc, v_smem, v_bar, vrow, n0 + (t - 1 + NV) * BLOCK_N, (t - 1) % NV)
        return acc, p16

    @gluon.jit
    def _step(t, s_cur, acc, p16, l_i, m_i, tau, q_smem, k_desc, k_smem, k_bar, v_desc, v_smem, v_bar, krow, vrow,
              n_tiles, zero_s, m_use, qk_scale, CR, SR, offs_m, cols, Nk, causal_off, full_end, n0, e1, left_off,
              CAUSAL: gl.constexpr, QB: gl.constexpr, P_L: gl.constexpr, O_ROW: gl.constexpr, BLOCK_N: gl.constexpr,
              NS: gl.constexpr, NV: gl.constexpr, LAST: gl.constexpr, P16: gl.constexpr, SMOOTH_Q: gl.constexpr,
              TWO_LEVEL: gl.constexpr, THRIFT: gl.constexpr, KEY_PERM: gl.constexpr, WINDOW: gl.constexpr):
        """Key tile t of the loop (keys n0 + t·BLOCK_N ...; its scores are ``s_cur``, from ``_shifted``): issue S of
        tile t + 1 (unless LAST), round P̃ of tile t, issue its P·V; return the scores of tile t + 1 (LAST: ``s_cur``;
        every wgmma done) and the row statistics. ``krow``: K̂'s row of tile 0.

        Two-level P rescales the accumulator by ``pre`` before the tile's P·V, and does so before issuing
        S(t + 1), after waiting for all groups (P·V of tile t - 1). Rescaling after that issue (after a wait
        that leaves S(t + 1) pending; in one trial even after a wait for all groups) made ptxas serialize every
        wgmma of the kernel (C7514, "non wgmma instructions reading accumulator registers of a wgmma between
        start and end of the pipeline stage"): the pass then ran no faster than the Triton one.
        ``tests/test_aot_compile.py`` checks the compiled kernels for that note."""
        nxt = (t + 1) % NS
        if TWO_LEVEL:  # P·V of tile t - 1 done; the accumulator into this tile's unit
            p, l_i, m_i, tau, pre = _p_tile(s_cur, l_i, m_i, tau, n0 + t * BLOCK_N, offs_m, cols, Nk, causal_off,
                                            full_end, SR, e1, left_off, CAUSAL, TWO_LEVEL, THRIFT, BLOCK_N, KEY_PERM,
                                            WINDOW)
            acc, p16 = _pv_done(acc, p16, v_desc, v_smem, v_bar, vrow, n0, t, n_tiles, BLOCK_N, NV, 0)
            acc = acc * gl.convert_layout(pre, O_ROW)[:, None]
        if not LAST:  # S of the next tile, on the tensor cores while this tile's P̃ is rounded
            mbarrier.wait(k_bar.index(nxt), ((t + 1) // NS) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), zero_s, use_acc=False,
                                  is_async=True)
            cs = _corr(CR, n0 + (t + 1) * BLOCK_N, cols, qk_scale, SMOOTH_Q)
        if not TWO_LEVEL:  # P·V of tile t - 1 done (S(t + 1) may run on)
            acc, p16 = _pv_done(acc, p16, v_desc, v_smem, v_bar, vrow, n0, t, n_tiles, BLOCK_N, NV,
                                0 if LAST else 1)
            p, l_i, m_i, tau, pre = _p_tile(s_cur, l_i, m_i, tau, n0 + t * BLOCK_N, offs_m, cols, Nk, causal_off,
                                            full_end, SR, e1, left_off, CAUSAL, TWO_LEVEL, THRIFT, BLOCK_N, KEY_PERM,
                                            WINDOW)
        p16 = _phi(p, QB, P_L, P16, KEY_PERM)
        mbarrier.wait(v_bar.index(t % NV), (t // NV) & 1)
        acc = warpgroup_mma(p16, v_smem.index(t % NV).permute((1, 0)), acc, is_async=True)
        if LAST:
            acc, p16 = warpgroup_mma_wait(0, deps=[acc, p16])
            s_next = s_cur
        else:
            # all but the newest group (this P·V) done: the next S; its K̂ slot is free
            s_next, acc = warpgroup_mma_wait(1, deps=[s_tok, acc])
            s_next = _shifted(s_next, qk_scale, m_use, cs, SMOOTH_Q, TWO_LEVEL)
            gl.thread_barrier()
            if t + 1 + NS < n_tiles:
                _load(k_desc, k_smem, k_bar, krow + (t + 1 + NS) * BLOCK_N, 0, nxt)
        return s_next, acc, p16, l_i, m_i, tau

    @gluon.jit
    def _q_tile_f16(Qc, Qs, qrow, qd, DP: gl.constexpr, QB: gl.constexpr):
        """Q̂ rows ``qrow`` (int64, the packed buffers' rows) x channels ``qd`` as exact fp16 values code·scale, from
        the pre-pass's packed codes (element 2i: the low nibble of byte i) and E4M3 scale bytes (one per QB)."""
        byte = gl.load(Qc + qrow[:, None] * (DP // 2) + (qd // 2)[None, :]).to(gl.int32)
        code = (byte >> ((qd % 2) * 4)[None, :]) & 0xF
        sb = gl.load(Qs + qrow[:, None] * (DP // QB) + (qd // QB)[None, :])
        return e2m1_decode_f16(code) * e4m3_decode_f16(sb)

    @gluon.jit
    def _attn_fwd_kernel_gl(Qc, Qs, k_desc, v_desc, QCORR, SELM, O, LSE, MBUF, QBAD, KVBAD, KROWS, SINK,
                            so_b, so_h, so_n, so_d,
                            qk_scale, Hq, GROUP, Nq, Nk, NQP, NKP, D, I0, NQBC, NQB, NKB, COFF, LOFF,
                            CAUSAL: gl.constexpr, SMOOTH_Q: gl.constexpr, TWO_LEVEL: gl.constexpr,
                            THRIFT: gl.constexpr, QB: gl.constexpr, WINDOW: gl.constexpr, SINKS: gl.constexpr,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, DP: gl.constexpr, NS: gl.constexpr,
                            NV: gl.constexpr, UNROLL: gl.constexpr, Q_SL: gl.constexpr, P16: gl.constexpr,
                            KEY_PERM: gl.constexpr,
                            STAGE_O: gl.constexpr, O_SL: gl.constexpr, O_ST: gl.constexpr, num_warps: gl.constexpr):
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, DP, 16])
        P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        ROW: gl.constexpr = gl.SliceLayout(1, S_L)
        O_ROW: gl.constexpr = gl.SliceLayout(1, O_L)

        start_m, pid_bh = head_program()
        start_m = start_m + I0 * (128 // BLOCK_M)  # I0: first 128-query block of this launch (smooth_q chunks)
        b = pid_bh // Hq
        h = pid_bh % Hq
        kv_bh = b * (Hq // GROUP) + h // GROUP  # GQA: no repeated K/V in memory
        m0 = start_m * BLOCK_M
        CR = QCORR + (pid_bh.to(gl.int64) * NQBC + m0 // 128 - I0) * NKP  # this query block's table row (smooth_q)
        # THRIFT: this query block's row of the (B, Hq, NQB, NKB) selection mask (64-token blocks; the padding
        # programs past Nq read the last row)
        SR = SELM + (pid_bh.to(gl.int64) * NQB + gl.minimum(start_m, NQB - 1)) * NKB

        # ---- Q̂ (exact fp16) into shared memory, once per program ------------------------------------
        qr = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LQ))
        qd = gl.arange(0, DP, layout=gl.SliceLayout(0, LQ))
        qrow = pid_bh.to(gl.int64) * NQP + qr
        q_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, DP], Q_SL, _q_tile_f16(Qc, Qs, qrow, qd, DP, QB))

        # ---- the K̂ / V̂ᵀ ring -------------------------------------------------------------------------
        k_smem = gl.allocate_shared_memory(gl.float16, [NS, BLOCK_N, DP], k_desc.layout)
        v_smem = gl.allocate_shared_memory(gl.float16, [NV, DP, BLOCK_N], v_desc.layout)
        k_bar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        v_bar = gl.allocate_shared_memory(gl.int64, [NV, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NS):
            mbarrier.init(k_bar.index(i), count=1)
        for i in gl.static_range(NV):
            mbarrier.init(v_bar.index(i), count=1)
        fence_async_shared()

        # bottom-right: query i sees keys j <= i + COFF (CAUSAL; COFF = Nk - Nq, plus a window's right extent) and,
        # with WINDOW, j >= i + LOFF; key tiles [lo, e1) and [e2, hi) masked, [e1, e2) not (_tiles.window_key_range)
        causal_off = COFF
        hi, full_end = causal_key_range(m0, COFF, Nk, BLOCK_M, BLOCK_N, CAUSAL)
        lo, e1, e2 = window_key_range(m0, LOFF, hi, full_end, BLOCK_M, BLOCK_N, WINDOW)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)  # tile t holds keys lo + t·BLOCK_N ...
        krow = kv_bh * NKP + lo  # K̂'s row of tile 0 in the (B·Hkv·NKP, DP) view
        vrow = kv_bh * DP  # this kv head's first row in the (B·Hkv·DP, NKP) view of V̂ᵀ
        for i in gl.static_range(NS):
            if i < n_tiles:
                _load(k_desc, k_smem, k_bar, krow + i * BLOCK_N, 0, i)
        for i in gl.static_range(NV):
            if i < n_tiles:
                _load(v_desc, v_smem, v_bar, vrow, lo + i * BLOCK_N, i)

        offs_m = m0 + gl.arange(0, BLOCK_M, layout=ROW)
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))  # score columns (their keys: _col_keys)
        if TWO_LEVEL:  # one pass: the running max, and the unit of the accumulator (two_level_step)
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
            m_use = m_i
        else:
            m_i = gl.load(MBUF + pid_bh.to(gl.int64) * NQP + offs_m)  # exact row max (log2 domain)
            m_use = gl.where(m_i == float("-inf"), 0.0, m_i)
        tau = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
        l_i = gl.zeros([BLOCK_M], gl.float32, ROW)
        if SINKS:  # the sink joins the softmax as a key with no value (SINK: per-row logits, log2 units)
            # two-level: the running max starts at the sink; single-level: m (the row-max pass's) includes it
            m_i, l_i = sink_start(gl.load(SINK + pid_bh.to(gl.int64) * NQP + offs_m), m_i, TWO_LEVEL)
        acc = gl.zeros([BLOCK_M, DP], gl.float32, O_L)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)

        if n_tiles > 0:
            mbarrier.wait(k_bar.index(0), 0)
            s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s_cur = _shifted(warpgroup_mma_wait(0, deps=[s_tok]), qk_scale, m_use,
                             _corr(CR, lo, cols, qk_scale, SMOOTH_Q), SMOOTH_Q, TWO_LEVEL)
            gl.thread_barrier()
            if NS < n_tiles:  # slot 0 is free: K̂ tile NS (the loop refills the slot of tile t + 1)
                _load(k_desc, k_smem, k_bar, krow + NS * BLOCK_N, 0, 0)
            p16 = gl.zeros([BLOCK_M, BLOCK_N], gl.float16, P_L)
            # tiles 0 .. n_tiles - 2 (each with a next tile); UNROLL = 2: two per iteration, the next scores
            # alternating between two register sets instead of being copied back every tile
            for t in range(0, n_tiles - UNROLL, UNROLL):
                for u in gl.static_range(UNROLL):
                    s_cur, acc, p16, l_i, m_i, tau = _step(
                        t + u, s_cur, acc, p16, l_i, m_i, tau, q_smem, k_desc, k_smem, k_bar, v_desc, v_smem, v_bar,
                        krow, vrow, n_tiles, zero_s, m_use, qk_scale, CR, SR, offs_m, cols, Nk, causal_off, e2, lo, e1,
                        LOFF, CAUSAL, QB, P_L, O_ROW, BLOCK_N, NS, NV, False, P16, SMOOTH_Q, TWO_LEVEL, THRIFT,
                        KEY_PERM, WINDOW)
            if UNROLL == 2:
                if (n_tiles - 1) % 2 == 1:
                    s_cur, acc, p16, l_i, m_i, tau = _step(
                        n_tiles - 2, s_cur, acc, p16, l_i, m_i, tau, q_smem, k_desc, k_smem, k_bar, v_desc, v_smem,
                        v_bar, krow, vrow, n_tiles, zero_s, m_use, qk_scale, CR, SR, offs_m, cols, Nk, causal_off,
                        e2, lo, e1, LOFF, CAUSAL, QB, P_L, O_ROW, BLOCK_N, NS, NV, False, P16, SMOOTH_Q, TWO_LEVEL,
                        THRIFT, KEY_PERM, WINDOW)
            s_cur, acc, p16, l_i, m_i, tau = _step(
                n_tiles - 1, s_cur, acc, p16, l_i, m_i, tau, q_smem, k_desc, k_smem, k_bar, v_desc, v_smem, v_bar,
                krow, vrow, n_tiles, zero_s, m_use, qk_scale, CR, SR, offs_m, cols, Nk, causal_off, e2, lo, e1, LOFF,
                CAUSAL, QB, P_L, O_ROW, BLOCK_N, NS, NV, True, P16, SMOOTH_Q, TWO_LEVEL, THRIFT, KEY_PERM, WINDOW)
        for i in gl.static_range(NS):
            mbarrier.invalidate(k_bar.index(i))
        for i in gl.static_range(NV):
            mbarrier.invalidate(v_bar.index(i))

        # ---- epilogue: non-finite flags, LSE, O = acc / l (as the Triton kernel) -----------------------
        seen, inv_l, flags = finish_rows(l_i, m_i, offs_m, KVBAD, QBAD, pid_bh, NQP, Nk, causal_off, LSE, DP,
                                         CAUSAL, KROWS + kv_bh.to(gl.int64) * NKP, NKP, LOFF, WINDOW,
                                         gl.arange(0, 64, layout=gl.SliceLayout(0, S_L)))
        if TWO_LEVEL:  # acc is in units of the last tile's s1
            inv_l = inv_l * two_level_scale(tau, m_i)
        o = acc * gl.convert_layout(inv_l, O_ROW)[:, None]
        dd = gl.arange(0, DP, layout=gl.SliceLayout(0, O_L))
        om = gl.convert_layout(offs_m, gl.SliceLayout(1, O_L))
        if gl.load(flags + 1) != 0:  # some V channel of the kv head is non-finite (rare)
            col_nan = gl.load(flags + 2 + dd) != 0
            seen_o = gl.convert_layout(seen, gl.SliceLayout(1, O_L))
            o = gl.where(seen_o[:, None] & col_nan[None, :], float("nan"), o)
        o = o.to(O.dtype.element_ty)
        if STAGE_O:  # the tile through shared memory (the K̂ ring, idle after the loop) into rows of 16-byte vectors:
            # the accumulator fragment's own stores (4 or 8 bytes per lane) made up ~3% of a causal op (H100,
            # BENCHMARKS.md, thirty-ninth session)
            gl.thread_barrier()
            o_smem = k_smem._reinterpret(O.dtype.element_ty, [BLOCK_M, DP], O_SL)
            o_smem.store(o)
            gl.thread_barrier()
            o = o_smem.load(O_ST)
            dd = gl.arange(0, DP, layout=gl.SliceLayout(0, O_ST))
            om = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, O_ST))
        o_ptrs = (O + b.to(gl.int64) * so_b + h.to(gl.int64) * so_h + om[:, None].to(gl.int64) * so_n
                  + dd[None, :] * so_d)
        gl.store(o_ptrs, o, mask=(om[:, None] < Nq) & (dd[None, :] < D))


    @gluon.jit
    def _quantize_q(X, sx_b, sx_h, sx_n, sx_d, Qc, Qs, QBAD, pid_bh, Hq, m0, Nq, D, NQP, BLOCK_M: gl.constexpr,
                    DP: gl.constexpr, QB: gl.constexpr, num_warps: gl.constexpr):
        """The Q pre-pass of rows m0 ... m0 + BLOCK_M - 1 of query head ``pid_bh`` inside the row-max pass
        (``Q_FUSED``): Q (bhsd, any strides) read once, NVFP4 codes, E4M3 scale bytes and the per-row non-finite
        flags written where the Q pre-pass (``attention._prep_qk_kernel``) writes them, by the same encoder
        (``quant_rows``), in chunks of rows with one 16-value block per thread. The row-max pass then reads its Q̂
        back (``_q_tile_f16``) and the attention pass reads the same buffers."""
        TPR: gl.constexpr = DP // QB  # threads per row: one block each
        LX: gl.constexpr = gl.BlockedLayout([1, QB], [32 // TPR, TPR], [num_warps, 1], [1, 0])
        LB: gl.constexpr = gl.BlockedLayout([1, QB // 2], [32 // TPR, TPR], [num_warps, 1], [1, 0])  # its code bytes
        RQ: gl.constexpr = num_warps * (32 // TPR)
        src = X + (pid_bh // Hq).to(gl.int64) * sx_b + (pid_bh % Hq).to(gl.int64) * sx_h
        cols = gl.arange(0, DP, layout=gl.SliceLayout(0, LX))
        rows0 = m0 + gl.arange(0, RQ, layout=gl.SliceLayout(1, LX))
        xn = load_rows(src, sx_n, sx_d, rows0, cols, Nq, D)
        for c in gl.static_range(BLOCK_M // RQ):
            rows = rows0 + c * RQ
            x = xn.to(gl.float32)
            if c + 1 < BLOCK_M // RQ:  # the next chunk's load in flight while this one is encoded
                xn = load_rows(src, sx_n, sx_d, rows + RQ, cols, Nq, D)
            rbad = block_bad(x)
            row64 = pid_bh.to(gl.int64) * NQP + rows
            gl.store(QBAD + row64, rbad.to(gl.uint8))
            codes, sb = quant_rows(x, gl.max(rbad, axis=0), QB, False)
            # a thread's block: its 8 code bytes stored as one 8-byte run (the packed bytes moved into LB, where
            # they already are: no data moves), its scale byte at an offset taken through the same reduction
            rows_b = gl.convert_layout(row64, gl.SliceLayout(1, LB))
            gl.store(Qc + rows_b[:, None] * (DP // 2) + gl.arange(0, DP // 2, layout=gl.SliceLayout(0, LB))[None, :],
                     gl.convert_layout(pack_nibbles(codes), LB))
            off = row64[:, None] * DP + cols[None, :]
            gl.store(Qs + gl.max(gl.reshape(off // QB, [RQ, DP // QB, QB]), axis=2), sb)
        gl.thread_barrier()  # the program's codes written before any of its threads reads them back

    @gluon.jit
    def _quantize_v(X, sx_b, sx_h, sx_n, sx_d, VH, KVF, item, Hkv, GROUP, Nk, D, NKP, DP: gl.constexpr,
                    QB: gl.constexpr, num_warps: gl.constexpr):
        """The V pre-pass (``attention._prep_v_kernel`` with STAGE and KEY_PERM) of one tile of 64 tokens x DP channels
        inside the row-max pass (``V_FUSED``): V (bhsd, any strides) read once, NVFP4 along tokens by the same encoder
        (``quant_rows``), the staged V̂ᵀ (channel-major, fp16) written in the Gluon passes' key order
        (``_tiles.key_position``), and each channel holding NaN/±Inf flagged for the GROUP query heads of its kv head.
        ``item`` = kv head · (NKP / 64) + tile. Loaded with one 16-token block of two channels per thread (each warp
        reads 64 channels of 16 token rows), encoded on the transposed view (blocks along the last axis, in-thread),
        then the fp16 values permuted into key order and stored as 16-byte runs of a channel's row."""
        WC: gl.constexpr = DP // 64  # warps along channels
        WT: gl.constexpr = num_warps // WC  # ... and along tokens: 16 tokens each
        TV: gl.constexpr = QB * WT
        gl.static_assert(TV == 64, "a tile is one 64-key group of the key order")
        LV: gl.constexpr = gl.BlockedLayout([QB, 2], [1, 32], [WT, WC], [1, 0])
        LVT: gl.constexpr = gl.BlockedLayout([2, QB], [32, 1], [WC, WT], [0, 1])  # LV's transpose
        LS: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        n_t = NKP // TV
        bkv = item // n_t
        t0 = (item % n_t) * TV
        src = X + (bkv // Hkv).to(gl.int64) * sx_b + (bkv % Hkv).to(gl.int64) * sx_h
        tok = t0 + gl.arange(0, TV, layout=gl.SliceLayout(1, LV))
        ch = gl.arange(0, DP, layout=gl.SliceLayout(0, LV))
        xt = gl.permute(load_rows(src, sx_n, sx_d, tok, ch, Nk, D).to(gl.float32), [1, 0])  # (DP, TV)
        cbad = block_bad(xt)  # (DP,): the channel holds NaN / ±Inf in this tile
        anybad = gl.max(cbad, axis=0)
        cht = gl.arange(0, DP, layout=gl.SliceLayout(1, LVT))
        flag_v_channels(KVF, bkv, GROUP, DP, cht, cbad, anybad)
        codes, sb = quant_rows(xt, anybad, QB, False)
        vh = fp4_tile_f16(codes, sb, cht, QB, False)  # (DP, TV) exact fp16 values
        # token 16q + 2j + e of the tile to column 8j + 2q + e (``_tiles.key_position``)
        vp = gl.reshape(gl.permute(gl.reshape(vh, [DP, 4, 8, 2]), [0, 2, 1, 3]), [DP, TV])
        vp = gl.convert_layout(vp, LS)
        cs = gl.arange(0, DP, layout=gl.SliceLayout(1, LS))
        ps = gl.arange(0, TV, layout=gl.SliceLayout(0, LS))
        gl.store(VH + (bkv.to(gl.int64) * DP + cs)[:, None] * NKP + t0 + ps[None, :], vp.to(VH.dtype.element_ty))

    @gluon.jit
    def _rowmax_ring(k_desc, BLOCK_N: gl.constexpr, DP: gl.constexpr, NS: gl.constexpr):
        """The row-max pass's ``NS``-slot K̂ ring in shared memory and its barriers (initialized, fenced)."""
        k_smem = gl.allocate_shared_memory(gl.float16, [NS, BLOCK_N, DP], k_desc.layout)
        k_bar = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NS):
            mbarrier.init(k_bar.index(i), count=1)
        fence_async_shared()
        return k_smem, k_bar

    @gluon.jit
    def _rowmax_prefetch(k_desc, k_smem, k_bar, krow, n_tiles, BLOCK_N: gl.constexpr, NS: gl.constexpr):
        """The first NS K̂ tiles of the program (rows krow, krow + BLOCK_N, ...) into the ring."""
        for i in gl.static_range(NS):
            if i < n_tiles:
                _load(k_desc, k_smem, k_bar, krow + i * BLOCK_N, 0, i)

    @gluon.jit
    def _rowmax_issue(q_op, k_smem, k_bar, s, t, NS: gl.constexpr):
        """Wait for K̂ tile t and issue its S = Q̂K̂ᵀ asynchronously into the registers of ``s`` (not accumulated)."""
        mbarrier.wait(k_bar.index(t % NS), (t // NS) & 1)
        return warpgroup_mma(q_op, k_smem.index(t % NS).permute((1, 0)), s, use_acc=False, is_async=True)

    @gluon.jit
    def _rowmax_refill(k_desc, k_smem, k_bar, krow, t, n_tiles, BLOCK_N: gl.constexpr, NS: gl.constexpr):
        """S of tile t is in: once every warp group is, its slot takes tile t + NS."""
        gl.thread_barrier()
        if t + NS < n_tiles:
            _load(k_desc, k_smem, k_bar, krow + (t + NS) * BLOCK_N, 0, t % NS)

    @gluon.jit
    def _tile_rowmax(s, m_i, start_n, full_end, keys0, offs_m, Nk, causal_off, e1, left_off, CAUSAL: gl.constexpr,
                     WINDOW: gl.constexpr):
        """m_i and the row maxima of the score tile ``s`` at key ``start_n`` (its visible keys: masked from
        ``full_end`` on and, with WINDOW, below ``e1``), leaving ``s`` as it is (its registers take the next S)."""
        if _masked(start_n, full_end, e1, WINDOW):
            mx = gl.max(gl.where(visible(start_n + keys0, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW), s,
                                 float("-inf")), 1)
        else:
            mx = gl.max(s, 1)
        return gl.maximum(m_i, mx)

    @gluon.jit
    def _rowmax_kernel_gl(Qc, Qs, k_desc, MBUF, SINK, X, sx_b, sx_h, sx_n, sx_d, QBAD, V, sv_b, sv_h, sv_n, sv_d, VH,
                          KVF, qk_scale, Hq, GROUP, Nq, Nk, NQP, NKP, D, I0, ROWS_END, COFF, LOFF,
                          CAUSAL: gl.constexpr, Q_FUSED: gl.constexpr, V_FUSED: gl.constexpr, K_FIRST: gl.constexpr,
                          QB: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                          DP: gl.constexpr, NS: gl.constexpr, Q_REG: gl.constexpr, Q_SL: gl.constexpr,
                          KEY_PERM: gl.constexpr, WINDOW: gl.constexpr, SINKS: gl.constexpr, num_warps: gl.constexpr):
        """The row-max pass (the Triton kernel's ``PMAX=1``, single-level NVFP4 on the staged K̂, no smooth_q; the
        attention pass's key range: COFF / CAUSAL, LOFF / WINDOW; with SINKS the row's sink logit joins the max):
        m = max over the visible keys of S·scale (log2 domain), per query row, into MBUF. A GEMM with a
        max epilogue, so the tensor cores set its pace; here S of tile t + 1 runs (asynchronous wgmma) while the
        row maxima of tile t are taken, K̂ arrives by TMA into an ``NS``-slot ring, and Q̂ stays in registers
        (``Q_REG``; else shared memory). The maxima are taken of S itself and scaled once at the end:
        max(S)·scale = max(S·scale) bit for bit (rounding is monotone), one multiply per row instead of per score.
        The wgmma accumulates the same k-steps in the same order as the attention pass's, so the maxima are those
        of its scores. Rows from ``ROWS_END`` on (past this launch's 128-query blocks, from I0) are neither read nor
        written (programs of 256 rows may overhang).

        ``Q_FUSED``: the program first runs its rows' Q pre-pass (``_quantize_q``; Q from X) and reads Q̂ back from
        what it wrote. ``V_FUSED``: after its maxima, the program runs the V pre-pass of V's 64-token tiles
        ``item`` = its linear index, + the number of programs, ... (``_quantize_v``; V from V). ``K_FIRST``: the first
        K̂ tiles are requested before Q̂ is built, so that they arrive while Q is read and quantized."""
        S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                      instr_shape=[16, BLOCK_N, 16])
        LQ: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
        ROW: gl.constexpr = gl.SliceLayout(1, S_L)

        pid_m, pid_bh = head_program()
        b = pid_bh // Hq
        h = pid_bh % Hq
        kv_bh = b * (Hq // GROUP) + h // GROUP
        m0 = I0 * 128 + pid_m * BLOCK_M  # I0: the launch's first 128-query block

        # ---- Q̂ (exact fp16), once per program, and the K̂ ring with its first tiles in flight (TMA) ---------
        causal_off = COFF
        hi, full_end = causal_key_range(m0, COFF, Nk, BLOCK_M, BLOCK_N, CAUSAL)
        lo, e1, e2 = window_key_range(m0, LOFF, hi, full_end, BLOCK_M, BLOCK_N, WINDOW)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)  # tile t holds keys lo + t·BLOCK_N ...
        krow = kv_bh * NKP + lo
        if K_FIRST:  # the first tiles arrive while Q is read (and quantized)
            k_smem, k_bar = _rowmax_ring(k_desc, BLOCK_N, DP, NS)
            _rowmax_prefetch(k_desc, k_smem, k_bar, krow, n_tiles, BLOCK_N, NS)
        if Q_FUSED:
            _quantize_q(X, sx_b, sx_h, sx_n, sx_d, Qc, Qs, QBAD, pid_bh, Hq, m0, Nq, D, NQP, BLOCK_M, DP, QB,
                        num_warps)
        qr = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LQ))
        qd = gl.arange(0, DP, layout=gl.SliceLayout(0, LQ))
        qrow = pid_bh.to(gl.int64) * NQP + gl.minimum(qr, ROWS_END - 1)  # (overhanging rows: repeat the last)
        q16 = _q_tile_f16(Qc, Qs, qrow, qd, DP, QB)
        if Q_REG:
            q_op = gl.convert_layout(q16, gl.DotOperandLayout(operand_index=0, parent=S_L, k_width=2))
        else:
            q_op = gl.allocate_shared_memory(gl.float16, [BLOCK_M, DP], Q_SL, q16)
        if not K_FIRST:  # the ring allocated after Q̂ is built, whose layout conversion's scratch it may then reuse
            k_smem, k_bar = _rowmax_ring(k_desc, BLOCK_N, DP, NS)
            _rowmax_prefetch(k_desc, k_smem, k_bar, krow, n_tiles, BLOCK_N, NS)

        offs_m = m0 + gl.arange(0, BLOCK_M, layout=ROW)
        keys0 = _col_keys(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L)), KEY_PERM)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, ROW)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
        if n_tiles > 0:
            # two register sets of S, each reused in place: S of tile t + 1 is issued into one while the maxima of
            # tile t are taken from the other. (A score tile carried across the loop's back edge while its wgmma
            # runs would need a copy of registers the wgmma writes, and ptxas then serializes every wgmma: C7514.)
            mbarrier.wait(k_bar.index(0), 0)
            s_a = warpgroup_mma(q_op, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s_a = warpgroup_mma_wait(1, deps=[s_a])  # (no wait: makes the carried S a tensor)
            s_b = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
            for t in range(0, n_tiles - 2, 2):  # tiles t (in s_a) and t + 1 (s_b), each with a next tile
                s_b = _rowmax_issue(q_op, k_smem, k_bar, s_b, t + 1, NS)
                s_a, s_b = warpgroup_mma_wait(1, deps=[s_a, s_b])
                _rowmax_refill(k_desc, k_smem, k_bar, krow, t, n_tiles, BLOCK_N, NS)
                m_i = _tile_rowmax(s_a, m_i, lo + t * BLOCK_N, e2, keys0, offs_m, Nk, causal_off, e1, LOFF, CAUSAL,
                                   WINDOW)
                s_a = _rowmax_issue(q_op, k_smem, k_bar, s_a, t + 2, NS)
                s_b, s_a = warpgroup_mma_wait(1, deps=[s_b, s_a])
                _rowmax_refill(k_desc, k_smem, k_bar, krow, t + 1, n_tiles, BLOCK_N, NS)
                m_i = _tile_rowmax(s_b, m_i, lo + (t + 1) * BLOCK_N, e2, keys0, offs_m, Nk, causal_off, e1, LOFF,
                                   CAUSAL, WINDOW)
            t0 = (n_tiles - 1) // 2 * 2  # the tile in s_a; one or two tiles left
            if t0 + 1 < n_tiles:
                s_b = _rowmax_issue(q_op, k_smem, k_bar, s_b, t0 + 1, NS)
                s_a, s_b = warpgroup_mma_wait(1, deps=[s_a, s_b])
                m_i = _tile_rowmax(s_a, m_i, lo + t0 * BLOCK_N, e2, keys0, offs_m, Nk, causal_off, e1, LOFF, CAUSAL,
                                   WINDOW)
                s_b = warpgroup_mma_wait(0, deps=[s_b])
                m_i = _tile_rowmax(s_b, m_i, lo + (t0 + 1) * BLOCK_N, e2, keys0, offs_m, Nk, causal_off, e1, LOFF,
                                   CAUSAL, WINDOW)
            else:
                s_a = warpgroup_mma_wait(0, deps=[s_a])
                m_i = _tile_rowmax(s_a, m_i, lo + t0 * BLOCK_N, e2, keys0, offs_m, Nk, causal_off, e1, LOFF, CAUSAL,
                                   WINDOW)
        for i in gl.static_range(NS):
            mbarrier.invalidate(k_bar.index(i))
        m_i = m_i * qk_scale
        if SINKS:  # the sink (SINK: per-row logits, log2 units) joins the max that P̃ is quantized against
            m_i = gl.maximum(m_i, gl.load(SINK + pid_bh.to(gl.int64) * NQP + offs_m, mask=offs_m < ROWS_END,
                                          other=float("-inf")))
        gl.store(MBUF + pid_bh.to(gl.int64) * NQP + offs_m, m_i, mask=offs_m < ROWS_END)
        if V_FUSED:  # V's pre-pass, its 64-token tiles spread over the programs (overlapping other programs' wgmmas)
            n_prog = gl.num_programs(0)  # per head
            n_heads = gl.num_programs(1) * gl.num_programs(2)  # B·Hq (``head_program``)
            for item in range(pid_bh * n_prog + pid_m, n_heads // GROUP * (NKP // 64), n_prog * n_heads):
                _quantize_v(V, sv_b, sv_h, sv_n, sv_d, VH, KVF, item, Hq // GROUP, GROUP, Nk, D, NKP, DP, QB,
                            num_warps)


def supported(*, is_mx: bool, two_level: bool, smooth_q: bool, staged: bool, dp: int, device) -> bool:
    """Whether this kernel can run the attention pass: NVFP4 on the staged fp16 operands, single-level
    (``nvfp4``) or two-level P (``sage3``), with or without the smooth_q correction, D padded to 64 or 128,
    an sm_90 GPU."""
    if not (HAVE_GLUON and staged and not is_mx and dp in (64, 128)):
        return False
    return device.type == "cuda" and _dispatch.capability(device) == (9, 0)


def preferred(dp: int) -> bool:
    """Whether ``kernel="auto"`` picks it where it is supported: at D = 64 and 128. Single-level P: with the
    float32 P̃ rounding it was 5-7% faster than the Triton pass at D = 128 and ~1% slower at D = 64 (H200,
    seventeenth session); with the float16 rounding the op is 5-11% faster at both (H100, thirty-seventh session).
    Two-level P (sage3): the op 1.09-1.19x faster than on the Triton pass at D = 128 (thirty-eighth session); at
    D = 64 1.04-1.06x slower in key order, 1.07-1.09x faster on operands in the pass's key order (H200,
    BENCHMARKS.md, forty-seventh session)."""
    return dp in (64, 128)


@functools.lru_cache(maxsize=None)
def _smem_layouts(block_m: int, block_n: int, dp: int):
    f16 = gl.float16
    return (gl.NVMMASharedLayout.get_default_for([block_m, dp], f16),
            gl.NVMMASharedLayout.get_default_for([block_n, dp], f16),
            gl.NVMMASharedLayout.get_default_for([dp, block_n], f16))


_GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


@functools.lru_cache(maxsize=None)
def _out_staging(block_m: int, block_n: int, dp: int, ns: int, dtype: torch.dtype, num_warps: int):
    """(STAGE_O, its shared layout, its store layout): at D = 128 the output tile is staged through the K̂ ring's
    shared memory when it fits there (BLOCK_M x DP elements of ``dtype`` in NS slots of BLOCK_N x DP fp16) and stored
    as rows of 16-byte vectors. At D = 64 the op ran 1-4% slower with it (H100, both run orders; BENCHMARKS.md,
    thirty-ninth session), so the fragment stores stay there."""
    esize = torch.empty((), dtype=dtype).element_size()
    gdt = getattr(gl, _GL_DTYPES.get(dtype, "float32"))
    vec = 16 // esize
    tpd = max(1, min(32, dp // vec))
    o_st = gl.BlockedLayout(size_per_thread=[1, vec], threads_per_warp=[32 // tpd, tpd],
                            warps_per_cta=[num_warps, 1], order=[1, 0])
    fits = dp == 128 and dtype in _GL_DTYPES and block_m * dp * esize <= ns * block_n * dp * 2
    return fits, gl.NVMMASharedLayout.get_default_for([block_m, dp], gdt), o_st


# 64x64 tiles, one warp group, a 2-slot K̂ ring and one V̂ᵀ slot (loaded while P̃ is rounded): 168 registers
# and 64 KiB of shared memory, 3 programs per SM. From the H200 sweep (benchmarks/gluon-attn-s17): a 3-slot K̂
# ring or 2 V̂ᵀ slots (2 programs per SM) 7-20% slower, two tiles per loop iteration (no copies of S, but 212
# registers: 2 programs per SM) 0-6% slower, 128-key tiles (255 registers) ~1% slower, a 128-register cap
# (4 programs per SM, spills) 1.7x slower at D = 128. The cap of 168 registers keeps 3 programs per SM (without
# it the float16 rounding compiles to 170: 2 programs per SM).
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "NS": 2, "NV": 1, "UNROLL": 1, "num_warps": 4, "maxnreg": 168}


def default_config(dp: int) -> dict:
    """The config ``fp4attn.attention`` runs at head dim ``dp`` (padded): ``DEFAULT``; at D = 64 capped at 128
    registers, 4 programs per SM (the accumulator is half as large), 2-7% faster for nvfp4 at (16,16,4096,64)
    (H100, BENCHMARKS.md, thirty-eighth session)."""
    return {**DEFAULT, "maxnreg": 128} if dp == 64 else DEFAULT


def launch(args, *, edges: tuple, two_level: bool, smooth_q: bool, i0: int, n: int, B: int, Hq: int, cfg: dict,
           thrift_mask: torch.Tensor | None = None, key_perm: bool = False, sinks: bool = False):
    """The attention pass of ``attention.attention_packed`` on this kernel (``args``: that launcher's argument
    tuple, staged operands) for 128-query blocks i0 ... i0 + n - 1: single-level P with the exact row max
    (the Triton kernel's PMAX=2) or two-level P in one pass (PMAX=0); with smooth_q, the correction table of
    those blocks. ``thrift_mask`` (two-level P, 64-row tiles): ThriftAttention's (B, Hq, nqb, nkb) int8 selection
    mask of 64-token blocks; the selected key tiles of each query block are left out (``thrift``'s FP4 phase).
    ``key_perm``: the staged operands are in ``_tiles.key_position`` order (float16 P̃ rounding, key tiles of a
    multiple of 64). ``edges``: ``_tiles.window_offsets``' (right edge?, COFF, left edge?, LOFF): the causal mask
    and a sliding window's; the left edge needs the launcher's per-key flags (KROWS). ``sinks``: the launcher's
    per-row sink logits (SINK) join the softmax."""
    (qc, qs, _kc, _ks, _vc, _vs, _vexp, table, out, lse, mbuf, kh, vh, qbad, kvbad, krows, sink, so_b, so_h,
     so_n, so_d,
     qk_scale, _hq, group, nq, nk, nqp, nkp, d) = args
    right, coff, left, loff = edges
    bm, bn, ns, nv = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["NS"], cfg["NV"]
    dp = kh.shape[-1]
    q_sl, k_sl, v_sl = _smem_layouts(bm, bn, dp)
    k_desc = TmaDesc(kh, (kh.numel() // dp, dp), (dp, 1), (bn, dp), k_sl)
    v_desc = TmaDesc(vh, (vh.numel() // nkp, nkp), (nkp, 1), (dp, bn), v_sl)
    grid = head_grid(n * (128 // bm), B * Hq)
    thrift = thrift_mask is not None
    if thrift:
        assert two_level and not smooth_q and bm == bn == 64 and thrift_mask.dtype == torch.int8, cfg
        assert thrift_mask.is_contiguous() and thrift_mask.shape[:2] == (B, Hq)
    selm, nqb, nkb = (thrift_mask, thrift_mask.shape[2], thrift_mask.shape[3]) if thrift else (qbad, 1, 1)
    stage_o, o_sl, o_st = _out_staging(bm, bn, dp, ns, out.dtype, cfg["num_warps"])
    p16 = cfg.get("P16", 2 if key_perm else True)
    assert not key_perm or (p16 and bn % 64 == 0), cfg
    fast(_attn_fwd_kernel_gl)[grid](qc.view(torch.uint8), qs, k_desc, v_desc, table, selm, out, lse, mbuf, qbad,
                                    kvbad, krows, sink, so_b, so_h, so_n, so_d, qk_scale, Hq, group, nq, nk, nqp, nkp,
                                    d, i0, n, nqb, nkb, coff, loff, CAUSAL=right, SMOOTH_Q=smooth_q,
                                    TWO_LEVEL=two_level, THRIFT=thrift, QB=16, WINDOW=left, SINKS=sinks, BLOCK_M=bm,
                                    BLOCK_N=bn, DP=dp, NS=ns, NV=nv, UNROLL=cfg["UNROLL"],
                                    Q_SL=q_sl, P16=p16, KEY_PERM=key_perm, STAGE_O=stage_o, O_SL=o_sl, O_ST=o_st,
                                    num_warps=cfg["num_warps"], **{k: cfg[k] for k in ("maxnreg",) if k in cfg})


# The row-max pass (H100 sweep, benchmarks/rowmax-s40): at D = 128, 128 query rows on two warp groups, 64-key tiles,
# a 6-slot K̂ ring and Q̂ in registers (122 registers, 96 KiB: 2 programs per SM); at D = 64, 64 rows on one warp group,
# 4 slots (106 registers, 32 KiB: 4 programs per SM). ``K_FIRST`` (the first K̂ loads before Q̂ is built) stays off,
# the order that was measured, until benchmarks/qfuse-s55's probe has timed it (its "k1" variants switch it on).
ROWMAX_CONFIGS = {128: {"BLOCK_M": 128, "BLOCK_N": 64, "NS": 6, "Q_REG": True, "K_FIRST": False, "num_warps": 8},
                  64: {"BLOCK_M": 64, "BLOCK_N": 64, "NS": 4, "Q_REG": True, "K_FIRST": False, "num_warps": 4}}


def rowmax_preferred(dp: int) -> bool:
    """Whether ``kernel="auto"`` runs the row-max pass on ``_rowmax_kernel_gl`` (where the attention pass is this
    module's and there is no smooth_q): ``FP4ATTN_ROWMAX_KERNEL`` = triton / gluon overrides."""
    choice = os.environ.get("FP4ATTN_ROWMAX_KERNEL", "auto")
    if choice not in ("auto", "triton", "gluon"):
        raise ValueError(f"FP4ATTN_ROWMAX_KERNEL: expected 'auto', 'triton' or 'gluon', got {choice!r}")
    return choice == "gluon" or (choice == "auto" and dp in (64, 128))


def launch_rowmax(args, *, edges: tuple, i0: int, n: int, B: int, Hq: int, cfg: dict | None = None,
                  key_perm: bool = False, sinks: bool = False, q_in: torch.Tensor | None = None,
                  v_in: torch.Tensor | None = None):
    """The row-max pass of ``attention.attention_packed`` (single-level NVFP4, staged operands, no smooth_q) on
    ``_rowmax_kernel_gl`` for 128-query blocks i0 ... i0 + n - 1: the exact row maxima into the launcher's MBUF.
    ``key_perm``: K̂ in ``_tiles.key_position`` order (key tiles of a multiple of 64). ``edges`` and ``sinks``: as
    ``launch``'s. ``q_in``: Q (bhsd view) whose pre-pass this pass runs (``quantize_qkv(q_fused=True)``: the
    launcher's codes, scale bytes and row flags are written here, ``_quantize_q``). ``v_in``: V (bhsd view) whose
    pre-pass this launch runs (``quantize_qkv(v_fused=True)``: V̂ᵀ in key order and the channel flags,
    ``_quantize_v``; the launch must cover every query block, i0 = 0)."""
    (qc, qs, _kc, _ks, _vc, _vs, _vexp, _table, _out, _lse, mbuf, kh, vh, qbad, kvbad, _krows, sink, *_so,
     qk_scale, _hq, group, nq, nk, nqp, nkp, d) = args
    right, coff, left, loff = edges
    dp = kh.shape[-1]
    cfg = cfg or ROWMAX_CONFIGS[dp]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    assert not key_perm or bn % 64 == 0, cfg
    assert q_in is None or bm <= 128, cfg  # (programs past ROWS_END would write other heads' rows)
    q_sl, k_sl, _ = _smem_layouts(bm, bn, dp)
    k_desc = TmaDesc(kh, (kh.numel() // dp, dp), (dp, 1), (bn, dp), k_sl)
    grid = head_grid(-(-n * 128 // bm), B * Hq)
    assert v_in is None or (key_perm and i0 == 0 and cfg["num_warps"] * 16 == dp), cfg  # (64-token V tiles)
    x, xs = (q_in, q_in.stride()) if q_in is not None else (qs, (0, 0, 0, 0))
    v, vs = (v_in, v_in.stride()) if v_in is not None else (qs, (0, 0, 0, 0))
    fast(_rowmax_kernel_gl)[grid](qc.view(torch.uint8), qs, k_desc, mbuf, sink, x, *xs, qbad, v, *vs, vh, kvbad,
                                  qk_scale, Hq, group, nq, nk, nqp, nkp, d, i0, (i0 + n) * 128, coff, loff,
                                  CAUSAL=right, Q_FUSED=q_in is not None, V_FUSED=v_in is not None,
                                  K_FIRST=cfg.get("K_FIRST", False),
                                  QB=16, BLOCK_M=bm, BLOCK_N=bn, DP=dp,
                                  NS=cfg["NS"], Q_REG=cfg["Q_REG"], Q_SL=q_sl, KEY_PERM=key_perm, WINDOW=left,
                                  SINKS=sinks, num_warps=cfg["num_warps"],
                                  **{k: cfg[k] for k in ("maxnreg",) if k in cfg})
