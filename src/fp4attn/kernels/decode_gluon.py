"""Flash-decoding split kernel for Hopper written in Gluon (issue 5): FP4 operands decoded straight into
the registers of the tensor-core fragments, no shared memory in the key loop.

Same algorithm, inputs and partial outputs as ``decode._decode_split_kernel``'s FP4 path (with ``THRIFT``:
two-level P̃ on the FP4 tiles, the selected pages either left to ``decode._decode_16bit_kernel`` or, with
``FUSED16``, computed here from the 16-bit copy; ``WINDOW`` and ``SINKS`` as there; see ``decode``'s module
docstring), whose docstring describes the transposed tile (keys along the
MMA's M, the G·n_q query rows of a GQA group along N: Sᵀ = K̂·ϕ(q)ᵀ, Oᵀ += V̂ᵀ·ϕ(P̃)ᵀ). The Triton kernel
decodes K̂ and V̂ in a blocked layout and Triton moves the decoded tiles into the ``mma.sync`` operand layouts
through shared memory; the profile showed those round trips bound the loop. Here every layout is explicit
(Gluon), so each thread loads exactly the packed bytes its operand fragments need and decodes them in place:

* ``mma.sync.m16n8k16`` A fragment (16 rows x 16 k): thread (r = lane/4, c = lane%4) holds rows r and
  r+8, k = 2c, 2c+1, 2c+8, 2c+9, one fp16 pair per 32-bit register.
* K̂ (A of QKᵀ, rows = keys, k = channels). A dot product does not care in which order its channels
  are summed, so the kernel sums them in a *logical* order chosen such that thread c's channels of a
  key are the D/4 consecutive physical channels c·D/4 .. c·D/4 + D/4 - 1: one 16-byte load (D = 128)
  per key row, decoded by the shared E2M1 routine (two codes per fp16 register:
  ``E2M1_HALFWORDS_F16HI_PTX``). Logical k = 16(2jh + kh) + 8kl + 2c + e maps to physical channel
  c·D/4 + 8jh + 4kh + 2e + kl; ϕ(q) is permuted the same way once per program.
* V̂ᵀ (A of the P·V product, rows = channels, k = keys). V is stored with token pairs in one byte
  (SPEC §5), so a byte decodes into exactly one fragment register (two keys): ``E2M1_BYTE_PAIRS_F16HI_PTX``.
  The output's channels run in a logical order too (thread r holds the D/8 consecutive physical
  channels r·D/8 ..: one 16-byte load per token pair); the partial outputs are stored back in
  physical order: logical m = r + 8a + 16(2w + z) is channel (D/8)·r + 4w + 2z + a, through shared memory
  as rows of 16-byte vectors (the fragment's own 4-byte stores cost up to ~11 us per step, when every
  program stores at once; benchmarks/decode-s39/).
* ϕ(P̃)ᵀ (B of the P·V product) comes from the Sᵀ accumulator layout through Triton's layout
  conversion (warp shuffles, no shared memory); ϕ(q)ᵀ is converted once per program (through 512 bytes
  of shared memory, outside the loop).
* ``FOLD`` (1, 2 or 4 query rows: ``default_fold``): the MMA's 8 columns would be half or more padding, so column n
  holds part n % FOLD of query row n // FOLD (ϕ(q) on the logical channels k of part k // (D/FOLD), zero on the
  others). Sᵀ's columns are partial scores, summed per row in registers (plus one shuffle per factor of two past
  the first); the online softmax and the P̃ rounding then run on 4 values per lane instead of 8. The partial sums
  are exact (products of E2M1 codes with E4M3 scales), and the outputs were bit-equal to the unfolded tile on every
  probed shape (benchmarks/decode-fold-s32/). The P·V product keeps one column per row (P̃ padded with zero rows).
  ``FUSED16``'s 16-bit scores are folded the same way (their bf16 / fp16 partial sums are not exact: 1e-6 to 1e-4
  relative L2 from the unfolded tile).

Every reordering is written as reshape/permute of register tensors whose layouts are declared
(``_layouts``), so the conversions into the MMA operand layouts are checked to move no data
(``assert_trivial``). The E4M3 scale bytes are converted to fp16 once per scale (K: per key and
16-channel block; V: per channel and 16-token block) and applied in the decode, which yields
value·2^-14 (the 2^14 is folded into the score scale and V's global scale). The codes become fp16 through integer
ops and byte permutes (fp16 high bytes, ``formats.triton_helpers``), not through the E4M3→fp16 conversion the
Triton kernel uses: ``F2FP`` runs on a narrower pipe of its own (~2.8x an FFMA's issue time, H100,
benchmarks/f2fp-s29/pipes.py). Same products, same bits; 0.5-1.4% less time on the H200.
Numerics are those of the Triton kernel: the same fp16 operands, FP32 accumulation, the same P̃
rounding (``fake_quant_p``) and online softmax (``online_softmax_step``), imported from the shared
helpers. Tiles fully inside the committed, causally visible range skip the masks; their page-table entries are
loaded two tiles ahead. With ``PIPE`` (FP4 tiles of 64 or 128 channels and <= 8 query rows, ``pipe_fits``; the op's
default where ``decode._pipe_pays``) their bytes are loaded one tile ahead as 32- / 16-bit words and carried in
registers through the previous tile's work (``_load_words``; 163 registers at 128 channels: 12 programs per SM), the
same decode then running on the words: bit-equal outputs; 1.01-1.06x the step at 128 channels on the H200, 1.01-1.07x
at 64 on the H100 (benchmarks/pipe-s45/).
Without it, at small head dims the next tile is prefetched into L2 (``L2_PREFETCH``). A split's first FP4 tile is
prefetched into L2 while q is loaded and quantized (``FIRST_L2``; not with Thrift or a window).

``FUSED16`` (Thrift at tiles of <= 64 channels and <= 8 query rows, ``fused16_fits``): a tile that some query head of
the kv group selected also loads its 16-bit K in 16-channel chunks (logical channel order, 8-byte loads: one 16-row
A fragment per chunk) and its 16-bit V in 16-key chunks (an even and an odd key's channels paired by byte permutes
into the A fragments of Vᵀ, the FP4 V's layout), scores the selecting rows from them (q in the keys' dtype), and adds
their unquantized P̃ (rounded to V's dtype) times V; one online softmax over both, as the Triton kernel. At 128
channels the branch needs 255 registers (8 programs per SM instead of 12): 1.00-1.03x the two-kernel path at D = 128
and slower at D = 96, 256 or 16 rows (spills; benchmarks/thrift-fused-s31/), which those keep.

``GROUP16`` (Thrift with a selection equal for every query head of the kv group, ``decode``'s default
thrift_share="group", at tiles of <= 128 channels and <= 8 query rows, ``group16_fits``): each tile is one of two
exclusive branches, chosen by the group's selection bit (read a tile ahead): a selected page from the 16-bit copy only
(``_tile16``: its FP4 bytes are neither read nor decoded), any other as an FP4 tile with no selection to read. The
two-kernel path above reads and decodes every FP4 tile, masks the selected ones and streams the 16-bit pages in a
second kernel; ``FUSED16`` computes both halves of a selected tile. At 5% budgets (18.8% of the pages in the group's
union, G = 4) 1.24-1.25x the two-kernel path at D = 128 and 1.23-1.25x ``FUSED16`` at D = 64 (16 programs per SM
there; H200; 1.16-1.18x on an H100; benchmarks/group16-s51/); at D = 128 168 registers with 24 bytes of spill stores
(one new token).

Head dims: the tiles have D = 64, 128 or 256 channels (the layouts need powers of two); a cache of another head
dim DR (a multiple of 16, 48 ... 240: Phi-3's 96) runs the next of them with masked loads (``PAD``), its padding
channels zeros that score and accumulate nothing. 256-channel tiles (Gemma 2 / 3) take ~190 registers per thread.

GPU only (Gluon has no interpreter): the CPU tests run the Triton kernel, the GPU tests compare the
two (equal bits on the tested shapes) and CI compiles this kernel for sm_90 without a GPU.
"""

from __future__ import annotations

import functools

import torch

from ..formats.triton_helpers import (
    E2M1_BYTE_PAIRS_F16HI_PTX,
    E2M1_HALFWORDS_F16HI_PTX,
    f16x2_halves,
    fake_quant_p,
    fake_quant_p_two_level,
    fake_quant_rows,
)
from ._launch import fast, head_grid, next_pow2
from ._tiles import LOG2E_K, decode_tile_runs, kv_head, online_softmax_step, seq_length

try:  # Gluon ships with Triton >= 3.5
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton: the Triton kernel serves every device
    HAVE_GLUON = False


# Thrift's 16-bit V in the A fragments of Vᵀ: channels 4g .. 4g+3 of an even key in $4, $5 and of the next (odd) key
# in $6, $7 (two 16-bit values per register) -> $0 .. $3 = channel 4g .. 4g+3 as (even key, odd key), the pairing that
# ``E2M1_BYTE_PAIRS_F16HI_PTX`` gives the FP4 V
_TOKEN_PAIRS_PTX = gl.constexpr("prmt.b32 $0, $4, $6, 0x5410; prmt.b32 $1, $4, $6, 0x7632; "
                                "prmt.b32 $2, $5, $7, 0x5410; prmt.b32 $3, $5, $7, 0x7632;") if HAVE_GLUON else None

if HAVE_GLUON:

    @gluon.jit
    def _page(PT, b, t0, MAXP, PS: gl.constexpr):
        """The pool page holding token t0 of sequence b (-1, past a reservation: page 0)."""
        return gl.maximum(gl.load(PT + b * MAXP + t0 // PS), 0).to(gl.int64)

    @gluon.jit
    def _fold_cols(x, FOLD: gl.constexpr):
        """(N, 8) accumulator columns n = (query row n // FOLD, channel part n % FOLD) -> (N, 8 // FOLD): the
        rows' scores, sums of their parts (FOLD = 1: x unchanged)."""
        if FOLD > 1:
            x = gl.sum(gl.reshape(x, (x.shape[0], x.shape[1] // FOLD, FOLD)), 2)
        return x

    @gluon.jit
    def _pad_rows(x, fill, FOLD: gl.constexpr):
        """(R, N) -> (R·FOLD, N): x in rows 0 .. R-1, ``fill`` below (one join per factor of two)."""
        for i in gl.static_range(3):  # FOLD <= 8
            if FOLD >= (2 << i):
                x = gl.reshape(gl.permute(gl.join(x, gl.full_like(x, fill)), (2, 0, 1)), (2 * x.shape[0], x.shape[1]))
        return x

    @gluon.jit
    def _scale_cols(x, v, FOLD: gl.constexpr):
        """x (N, 8) times v (R = 8 / FOLD,) per column: column n of x (the query row n when n < R; the others hold
        zeros) times v[n % R]."""
        N: gl.constexpr = x.shape[0]
        if FOLD > 1:
            x3 = gl.reshape(x, (N, FOLD, x.shape[1] // FOLD))
            vv = gl.convert_layout(v, gl.SliceLayout(0, gl.SliceLayout(0, x3.type.layout)))
            x = gl.convert_layout(gl.reshape(x3 * gl.expand_dims(gl.expand_dims(vv, 0), 0), (N, x.shape[1])),
                                  x.type.layout, assert_trivial=True)
        else:
            x = x * gl.convert_layout(v, gl.SliceLayout(0, x.type.layout))[None, :]
        return x

    @gluon.jit
    def _tile_base(KD16, KS, VD, VS, page, h, t0, Hkv, DR: gl.constexpr, PS: gl.constexpr):
        """Where the tile at t0 of pool page ``page`` starts in the cache's storage (kv head h): its first K half-word,
        K scale byte, V byte and V scale byte. Each of the four is contiguous over the tile."""
        off = t0 % PS
        base = page * Hkv + h  # (page, head)
        row0 = base * PS + off  # storage row of the tile's first key
        return (KD16 + row0 * (DR // 4), KS + row0 * (DR // 16), VD + (base * (PS // 2) + off // 2) * DR,
                VS + (base * (PS // 16) + off // 16) * DR)

    @gluon.jit
    def _prefetch_l2(KD16, KS, VD, VS, page, h, t0, Hkv, DR: gl.constexpr, PS: gl.constexpr, BLOCK_N: gl.constexpr):
        """Bulk prefetches into L2 (sm_90 ``cp.async.bulk.prefetch``, issued by lane 0) of the tile at t0 of pool page
        ``page``: its K bytes, K scales, V bytes and V scales. Sizes and addresses are multiples of 16 bytes, as the
        instruction needs, for DR a multiple of 16 and tiles of >= 16 keys starting on 16-key boundaries."""
        kp, ksp, vp, vsp = _tile_base(KD16, KS, VD, VS, page, h, t0, Hkv, DR, PS)
        gl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b32 l; mov.u32 l, %laneid; setp.eq.u32 p, l, 0; "
            f"@p cp.async.bulk.prefetch.L2.global [$1], {BLOCK_N * DR // 2}; "
            f"@p cp.async.bulk.prefetch.L2.global [$2], {BLOCK_N * DR // 16}; "
            f"@p cp.async.bulk.prefetch.L2.global [$3], {BLOCK_N * DR // 2}; "
            f"@p cp.async.bulk.prefetch.L2.global [$4], {BLOCK_N // 16 * DR}; mov.u32 $0, 0; }}",
            "=r,l,l,l,l", [kp.to(gl.pointer_type(gl.uint8), bitcast=True), ksp, vp, vsp], dtype=gl.int32,
            is_pure=False, pack=1)

    @gluon.jit
    def _load_page_tile(KD16, KS, VD, VS, page, h, t0, Hkv, koff, ksoff, voff, vsoff, kmask, ksmask, vmask,
                        DR: gl.constexpr, PS: gl.constexpr, PAD: gl.constexpr):
        """The packed bytes of the BLOCK_N-token tile at t0 (inside one page) of pool page ``page``: K half-words, K
        scales as fp16, V bytes, V scales as fp16, each in the layout of its offsets. ``DR``: the cache's head dim
        (its row strides); ``PAD``: the tile is wider (DR not a power of two): the masks' padding channels load
        zeros."""
        kp, ksp, vp, vsp = _tile_base(KD16, KS, VD, VS, page, h, t0, Hkv, DR, PS)
        kp = kp + koff
        ksp = ksp + ksoff
        vp = vp + voff
        vsp = vsp + vsoff
        if PAD:
            kh = gl.load(kp, mask=kmask, other=0)
            ks = gl.load(ksp, mask=ksmask, other=0)
            vb = gl.load(vp, mask=vmask, other=0)
            vs = gl.load(vsp, mask=vmask, other=0)
        else:
            kh = gl.load(kp)
            ks = gl.load(ksp)
            vb = gl.load(vp)
            vs = gl.load(vsp)
        return kh, ks.to(gl.float8e4nv, bitcast=True).to(gl.float16), vb, vs.to(gl.float8e4nv,
                                                                                 bitcast=True).to(gl.float16)

    @gluon.jit
    def _load_words(KD16, KS, VD, VS, page, h, t0, Hkv, kw, ksw, vw, vsw, DR: gl.constexpr, PS: gl.constexpr,
                    KS8: gl.constexpr):
        """``PIPE``: the packed bytes of the tile at t0 of pool page ``page`` as 32-bit words (K codes, V codes, V
        scales) and 16-bit words (K scales; ``KS8``, 64-channel tiles, where a lane holds one K scale byte per key:
        bytes), offsets ``kw`` ... in the word layouts of ``_words_layouts``: the loop carries the next tile in as
        few registers as its bytes occupy (one per byte otherwise)."""
        kp, ksp, vp, vsp = _tile_base(KD16, KS, VD, VS, page, h, t0, Hkv, DR, PS)
        kh = gl.load(kp.to(gl.pointer_type(gl.int32), bitcast=True) + kw)
        if KS8:
            ks = gl.load(ksp + ksw)
        else:
            ks = gl.load(ksp.to(gl.pointer_type(gl.int16), bitcast=True) + ksw)
        vb = gl.load(vp.to(gl.pointer_type(gl.int32), bitcast=True) + vw)
        vs = gl.load(vsp.to(gl.pointer_type(gl.int32), bitcast=True) + vsw)
        return kh, ks, vb, vs

    @gluon.jit
    def _key_offsets(L: gl.constexpr, BLOCK_N: gl.constexpr, COLS: gl.constexpr, stride):
        """Offsets of a (BLOCK_N keys, COLS) tile of row stride ``stride`` in a key-rows layout (``_key_rows_layout``),
        and its row and column indices. A thread holds rows r + 8i (lanes give r < 8, registers i), so the row offsets
        are written as (row % 8) + 8·(row // 8), the second a constant per register: LLVM then sees one thread offset
        plus constants and the loads use [address + immediate] (the row index alone, an OR of lane and register bits,
        gave one 64-bit add per load)."""
        r = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, L))
        return (r % 8)[:, None] * stride + c[None, :] + (r // 8 * 8)[:, None] * stride, r, c

    @gluon.jit
    def _pair_offsets(L: gl.constexpr, BLOCK_N: gl.constexpr, COLS: gl.constexpr, stride):
        """Offsets of a (BLOCK_N/2 token pairs, COLS) tile of V (row stride ``stride``) in a pair-rows layout
        (``_pair_rows_layout``), of its scales (one row per 16-token block: tiles start on 16-token blocks), and the
        pair and column indices."""
        r = gl.arange(0, BLOCK_N // 2, layout=gl.SliceLayout(1, L))
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, L))
        return r[:, None] * stride + c[None, :], ((2 * r) // 16)[:, None] * stride + c[None, :], r, c

    @gluon.jit
    def _word_offsets(DS, D: gl.constexpr, BLOCK_N: gl.constexpr, LH32: gl.constexpr, LKS16: gl.constexpr,
                      LV32: gl.constexpr, ksoff, KS8: gl.constexpr):
        """``PIPE``: the offsets of ``_load_words`` (in words from the tile's first K / K scale / V / V scale word):
        the bytes of ``_load_page_tile``'s layouts LH, LKS, LV, four (K scales: two; ``KS8``: one, ``ksoff``) to a
        register (``_words_layouts``)."""
        kw = _key_offsets(LH32, BLOCK_N, D // 8, DS // 8)[0]
        if KS8:
            ksw = ksoff
        else:
            ksw = _key_offsets(LKS16, BLOCK_N, D // 32, DS // 32)[0]
        vw, vsw, _, _ = _pair_offsets(LV32, BLOCK_N, D // 4, DS // 4)
        return kw, ksw, vw, vsw

    @gluon.jit
    def _k_words_f16(kw, ksw, LH: gl.constexpr):
        """``PIPE``: K words (BLOCK_N, D/8) and K scale half-words (BLOCK_N, D/32) -> the four fp16 tensors that
        ``E2M1_HALFWORDS_F16HI_PTX`` gives on ``_load_page_tile``'s half-words (element 2w + e: half e of output word
        w), in layout LH: the same decode, the scale pairs built from the words."""
        A, B = gl.inline_asm_elementwise("{ .reg .b32 t; cvt.rn.f16x2.e4m3x2 t, $2; prmt.b32 $0, t, t, 0x1010; "
                                         "prmt.b32 $1, t, t, 0x3232; }", "=r,=r,h", [ksw],
                                         dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        AB = gl.join(A, B)
        sc = gl.reshape(gl.join(AB, AB), (kw.shape[0], kw.shape[1]))  # word 4c + 2wb + wa: block 2c + wb
        sc = gl.convert_layout(sc, kw.type.layout, assert_trivial=True)
        r0, r1, r2, r3 = gl.inline_asm_elementwise(E2M1_HALFWORDS_F16HI_PTX, "=r,=r,=r,=r,r,r", [kw, sc],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)
        N: gl.constexpr = kw.shape[0]
        M2: gl.constexpr = 2 * kw.shape[1]
        return (gl.convert_layout(gl.reshape(f16x2_halves(r0, gl.float16), (N, M2)), LH, assert_trivial=True),
                gl.convert_layout(gl.reshape(f16x2_halves(r1, gl.float16), (N, M2)), LH, assert_trivial=True),
                gl.convert_layout(gl.reshape(f16x2_halves(r2, gl.float16), (N, M2)), LH, assert_trivial=True),
                gl.convert_layout(gl.reshape(f16x2_halves(r3, gl.float16), (N, M2)), LH, assert_trivial=True))

    @gluon.jit
    def _v_words_f16(vw, vsw, LV: gl.constexpr):
        """``PIPE``: V words and V scale words (BLOCK_N/2, D/4) -> X, Y as ``E2M1_BYTE_PAIRS_F16HI_PTX`` gives them on
        ``_load_page_tile``'s bytes (element 4w + 2a + e: half e of output register a, resp. 2 + a), in layout LV."""
        s01, s23 = gl.inline_asm_elementwise("{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; "
                                             "cvt.rn.f16x2.e4m3x2 $1, h; }", "=r,=r,r", [vsw],
                                             dtype=(gl.int32, gl.int32), is_pure=True, pack=1)
        r0, r1, r2, r3 = gl.inline_asm_elementwise(E2M1_BYTE_PAIRS_F16HI_PTX, "=r,=r,=r,=r,r,r,r", [vw, s01, s23],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)
        N: gl.constexpr = vw.shape[0]
        M4: gl.constexpr = 4 * vw.shape[1]
        X = gl.join(f16x2_halves(r0, gl.float16), f16x2_halves(r1, gl.float16))
        X = gl.reshape(gl.permute(X, (0, 1, 3, 2)), (N, M4))
        Y = gl.join(f16x2_halves(r2, gl.float16), f16x2_halves(r3, gl.float16))
        Y = gl.reshape(gl.permute(Y, (0, 1, 3, 2)), (N, M4))
        return gl.convert_layout(X, LV, assert_trivial=True), gl.convert_layout(Y, LV, assert_trivial=True)

    @gluon.jit
    def _scores16(K16, Q, row0, q_rows, q_ok, qk_scale, DS, D: gl.constexpr, BLOCK_N: gl.constexpr,
                  BLOCK_M: gl.constexpr, LK16: gl.constexpr, MMA: gl.constexpr, PAD: gl.constexpr,
                  FOLD: gl.constexpr):
        """Thrift's 16-bit scores of a tile, Sᵀ = K·qᵀ (log2 domain): the stored 16-bit keys (storage rows row0 ..)
        times the unquantized q in the keys' dtype, FP32 accumulation, in chunks of 16 channels (16 registers of K
        per chunk). The channels run in a logical order, as in the FP4 tile: thread c's 4 channels of chunk J are
        the physical c·D/4 + 4J .. + 3 of each key (one 8-byte load); logical k = 8kl + 2c + e is physical
        c·D/4 + 4J + 2kl + e, the q chunk is gathered the same way. ``FOLD``: the columns hold parts of the rows
        (q_rows, q_ok per column), column n the logical channels 16J + k of part (16J + k) // (D / FOLD) = n % FOLD;
        returns the rows' sums (BLOCK_N, BLOCK_M // FOLD)."""
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, gl.SliceLayout(2, LK16)))
        c = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LK16)))
        i = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, LK16)))
        kch = c[None, :, None] * (D // 4) + i[None, None, :]  # physical channel, chunk 0
        kptr = K16 + (row0 + n[:, None, None]).to(gl.int64) * DS + kch
        kk = gl.arange(0, 16, layout=gl.SliceLayout(1, BOP))
        qch = ((kk // 2) % 4) * (D // 4) + 2 * (kk // 8) + kk % 2
        qptr = Q + q_rows[None, :] * DS + qch[:, None]
        nn = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, BOP))
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA)
        for J in gl.static_range(D // 16):
            qm = q_ok[None, :]
            if FOLD > 1:  # column n loads its part's channels only (zeros elsewhere)
                qm = qm & (((16 * J + kk) // (D // FOLD))[:, None] == (nn % FOLD)[None, :])
            if PAD:
                k = gl.load(kptr + 4 * J, mask=(kch + 4 * J) < DS, other=0.0)
                q = gl.load(qptr + 4 * J, mask=qm & ((qch + 4 * J) < DS)[:, None], other=0.0)
            else:
                k = gl.load(kptr + 4 * J)
                q = gl.load(qptr + 4 * J, mask=qm, other=0.0)
            kA = gl.convert_layout(gl.reshape(gl.permute(gl.reshape(k, (BLOCK_N, 4, 2, 2)), (0, 2, 1, 3)),
                                              (BLOCK_N, 16)), AOP)
            acc = mma_v2(kA, q.to(K16.dtype.element_ty), acc)
        return _fold_cols(acc, FOLD) * qk_scale

    @gluon.jit
    def _pv16_chunk(V16, row, pc, accT, DS, D: gl.constexpr, LV16: gl.constexpr, MMA: gl.constexpr,
                    PAD: gl.constexpr):
        """Oᵀ += V16ᵀ·P̃ᵀ over the 16 keys from storage row ``row`` (pc: their (16, rows) B operand). V16ᵀ's A
        fragments are built as the FP4 tile's from token-packed bytes: thread r loads its D/8 channels of an even
        and an odd key and pairs them per channel with byte permutes (``_TOKEN_PAIRS_PTX``)."""
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        t2 = gl.arange(0, 8, layout=gl.SliceLayout(1, LV16))
        ch = gl.arange(0, D, layout=gl.SliceLayout(0, LV16))
        ptr = V16 + (row + 2 * t2[:, None]).to(gl.int64) * DS + ch[None, :]
        if PAD:
            ve = gl.load(ptr, mask=(ch < DS)[None, :], other=0.0)
            vo = gl.load(ptr + DS, mask=(ch < DS)[None, :], other=0.0)
        else:
            ve = gl.load(ptr)
            vo = gl.load(ptr + DS)
        X, Y = gl.inline_asm_elementwise(_TOKEN_PAIRS_PTX, "=r,=r,=r,=r,r,r,r,r", [ve, vo],
                                         dtype=(V16.dtype.element_ty, V16.dtype.element_ty), is_pure=True, pack=4)
        J = gl.reshape(gl.join(X, Y), (8, 8, D // 32, 2, 2, 2))  # t2, r, w, a, e, z (as _tile's V)
        vA = gl.convert_layout(gl.reshape(gl.permute(J, (2, 5, 3, 1, 0, 4)), (D, 16)), AOP, assert_trivial=True)
        return mma_v2(vA, pc, accT)

    @gluon.jit
    def _pv16(V16, row0, p16T, accT, DS, D: gl.constexpr, LV16: gl.constexpr, MMA: gl.constexpr, PAD: gl.constexpr):
        """Oᵀ += V16ᵀ·P̃ᵀ over a 64-key tile in four 16-key chunks (p16T: the tile's (64, rows) B operand, split
        along its register bits of keys +16 and +32)."""
        BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        R: gl.constexpr = p16T.shape[1]
        lo, hi = gl.split(gl.permute(gl.reshape(p16T, (2, 2, 16, R)), (2, 3, 1, 0)))  # keys +32: lo / hi
        p0, p1 = gl.split(lo)
        p2, p3 = gl.split(hi)
        accT = _pv16_chunk(V16, row0, gl.convert_layout(p0, BOP, assert_trivial=True), accT, DS, D, LV16, MMA, PAD)
        accT = _pv16_chunk(V16, row0 + 16, gl.convert_layout(p1, BOP, assert_trivial=True), accT, DS, D, LV16, MMA,
                           PAD)
        accT = _pv16_chunk(V16, row0 + 32, gl.convert_layout(p2, BOP, assert_trivial=True), accT, DS, D, LV16, MMA,
                           PAD)
        return _pv16_chunk(V16, row0 + 48, gl.convert_layout(p3, BOP, assert_trivial=True), accT, DS, D, LV16, MMA,
                           PAD)

    @gluon.jit
    def _mask_keys(sT, t0, keys0, C, last_key, WL, WINDOW: gl.constexpr):
        """Sᵀ (keys, rows) of the tile at t0 with -inf where a key is past the committed C, after the row's last key
        (bottom-right causal) or, with ``WINDOW``, before its last key - WL."""
        keys = t0 + keys0
        ok = (keys < C)[:, None] & (keys[:, None] <= last_key[None, :])
        if WINDOW:  # query row sees keys >= its last key - WL
            ok = ok & (keys[:, None] >= (last_key - WL)[None, :])
        return gl.where(ok, sT, float("-inf"))

    @gluon.jit
    def _tile(kh, ks, vb, vs, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL, keys0, sel_rows, vg, SEL, MAXP,
              page, h, Hkv, K16, V16, Q, q_rows, q_ok, qk_scale, DS,
              D: gl.constexpr, PS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
              LH: gl.constexpr, MMA: gl.constexpr, MASKED: gl.constexpr, THRIFT: gl.constexpr,
              WINDOW: gl.constexpr, LK16: gl.constexpr, LV16: gl.constexpr, PAD: gl.constexpr,
              FUSED16: gl.constexpr, FOLD: gl.constexpr, WORDS: gl.constexpr = False, LV: gl.constexpr = None,
              GROUP16: gl.constexpr = False):
        """One tile of the key loop: decode K̂ into A fragments, Sᵀ, online softmax over the keys (axis 0),
        P̃ rounded per 16 keys, decode V̂ᵀ into A fragments, Oᵀ += V̂ᵀ·ϕ(P̃)ᵀ. ``MASKED``: the keys' committed,
        causal and (``WINDOW``, left extent WL) sliding-window masks. ``THRIFT``: two-level P̃ on the FP4 tile; the
        rows whose query head selected the tile's page are left out (scores -inf: the 16-bit stream kernel computes
        them) or, with ``FUSED16``, take their scores from the 16-bit keys of pool page ``page`` and add their
        unquantized P̃ times its 16-bit values (a uniform branch, taken when some row selected the page).
        ``WORDS`` (``PIPE``): kh, ks, vb, vs are ``_load_words``' words (same values, decoded the same way).
        ``GROUP16``: the tile is not selected (the caller runs ``_tile16`` on selected ones): no selection read."""
        AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
        BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        if WORDS and D >= 128:
            o0, o1, o2, o3 = _k_words_f16(kh, ks, LH)
        else:
            if WORDS:  # 64 channels: the words split into the half-words, the scale bytes to fp16, as loaded otherwise
                kh = gl.reshape(f16x2_halves(kh, gl.int16), (BLOCK_N, D // 4))
                kh = gl.convert_layout(kh, LH, assert_trivial=True)
                ks = ks.to(gl.float8e4nv, bitcast=True).to(gl.float16)
            # K scales (BLOCK_N, D/16) -> one per half-word (4 per block), as register copies
            ks4 = gl.convert_layout(gl.reshape(gl.join(gl.join(ks, ks), gl.join(ks, ks)), (BLOCK_N, D // 4)), LH,
                                    assert_trivial=True)
            o0, o1, o2, o3 = gl.inline_asm_elementwise(E2M1_HALFWORDS_F16HI_PTX, "=r,=r,=r,=r,r,r", [kh, ks4],
                                                       dtype=(gl.float16, gl.float16, gl.float16, gl.float16),
                                                       is_pure=True, pack=2)
        # element hw = c·D/16 + 2jh + e of o_{kl + 2kh} is code kl + 2e of half-word c·D/16 + 2jh + kh: physical
        # channel c·D/4 + 8jh + 4kh + 2e + kl, logical k = 16(2jh + kh) + 8kl + 2c + e
        J = gl.reshape(gl.join(gl.join(o0, o1), gl.join(o2, o3)), (BLOCK_N, 4, D // 32, 2, 2, 2))  # n,c,jh,e,kl,kh
        kA = gl.convert_layout(gl.reshape(gl.permute(J, (0, 2, 5, 4, 1, 3)), (BLOCK_N, D)), AOP,
                               assert_trivial=True)
        sT = _fold_cols(mma_v2(kA, qT, gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA)), FOLD) * s_scale
        if THRIFT and not GROUP16:  # rows whose query head selected the page: scores from the 16-bit keys, or left out
            sel = gl.load(SEL + sel_rows * MAXP + t0 // PS) != 0
            if FUSED16:
                any_sel = gl.max(sel.to(gl.int32), 0) != 0
                row0 = (page * Hkv + h) * PS + t0 % PS  # the tile's first storage row in K16 / V16
                if any_sel:
                    sT = gl.where(sel[None, :], _scores16(K16, Q, row0, q_rows, q_ok, qk_scale, DS, D, BLOCK_N,
                                                          BLOCK_M, LK16, MMA, PAD, FOLD), sT)
            else:
                sT = gl.where(sel[None, :], float("-inf"), sT)
        if MASKED:
            sT = _mask_keys(sT, t0, keys0, C, last_key, WL, WINDOW)
        # softmax and P̃ rounding on the (rows, keys) view: a relabelling of the same registers
        p, alpha, m_i, l_i = online_softmax_step(gl.permute(sT, (1, 0)), m_i, l_i, MASKED or THRIFT)
        if THRIFT and FUSED16:  # two-level P of the other rows: P̂ = ϕ(P̃/s1), the product scaled by s1 afterwards
            selr = gl.convert_layout(sel, gl.SliceLayout(1, p.type.layout))[:, None]
            pq, s1 = fake_quant_p_two_level(gl.where(selr, 0.0, p), 16)
        elif THRIFT:  # (the selected rows' P̃ is 0 here)
            pq, s1 = fake_quant_p_two_level(p, 16)
        else:
            pq = fake_quant_p(p, 16, False)
        # (FOLD > 1: the P·V product's columns are the query rows, padded with zeros)
        pT = gl.convert_layout(gl.permute(_pad_rows(pq.to(gl.float16), 0.0, FOLD), (1, 0)), BOP)
        # V: a word is 4 channels of one token pair; X holds (even, odd token) of channels +0, +1, Y of +2, +3
        if WORDS:
            X, Y = _v_words_f16(vb, vs, LV)
        else:
            X, Y = gl.inline_asm_elementwise(E2M1_BYTE_PAIRS_F16HI_PTX, "=r,=r,=r,=r,r,r,r", [vb, vs],
                                             dtype=(gl.float16, gl.float16), is_pure=True, pack=4)
        J = gl.reshape(gl.join(X, Y), (BLOCK_N // 2, 8, D // 32, 2, 2, 2))  # t2, r, w, a, e, z
        vA = gl.convert_layout(gl.reshape(gl.permute(J, (2, 5, 3, 1, 0, 4)), (D, BLOCK_N)), AOP,
                               assert_trivial=True)
        accT = _scale_cols(accT, alpha, FOLD)
        if THRIFT:
            pv = mma_v2(vA, pT, gl.zeros([D, BLOCK_M], gl.float32, layout=MMA))
            accT += _scale_cols(pv, s1 * vg, FOLD)
            if FUSED16:
                if any_sel:  # the selecting rows' unquantized P̃ (rounded to V's dtype) times the 16-bit V
                    p16 = _pad_rows(gl.where(selr, p, 0.0).to(V16.dtype.element_ty), 0.0, FOLD)
                    p16T = gl.convert_layout(gl.permute(p16, (1, 0)), BOP)
                    accT = _pv16(V16, row0, p16T, accT, DS, D, LV16, MMA, PAD)
        else:
            accT = mma_v2(vA, pT, accT)
        return accT, m_i, l_i

    @gluon.jit
    def _tile16(t0, accT, m_i, l_i, last_key, C, WL, keys0, page, h, Hkv, K16, V16, Q, q_rows, q_ok, qk_scale, DS,
                D: gl.constexpr, PS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, MMA: gl.constexpr,
                MASKED: gl.constexpr, WINDOW: gl.constexpr, LK16: gl.constexpr, LV16: gl.constexpr, PAD: gl.constexpr,
                FOLD: gl.constexpr):
        """``GROUP16``: a tile of a page the whole kv group selected, from the 16-bit copy only (its FP4 bytes are
        not read): Sᵀ from the 16-bit keys (``_scores16``), the online softmax, Oᵀ += V16ᵀ·P̃ᵀ with the unquantized P̃
        rounded to V's dtype (``_pv16``): the 16-bit half of ``FUSED16``'s tile, whose FP4 half adds zeros where
        every row selected the page."""
        BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        row0 = (page * Hkv + h) * PS + t0 % PS  # the tile's first storage row in K16 / V16
        sT = _scores16(K16, Q, row0, q_rows, q_ok, qk_scale, DS, D, BLOCK_N, BLOCK_M, LK16, MMA, PAD, FOLD)
        if MASKED:
            sT = _mask_keys(sT, t0, keys0, C, last_key, WL, WINDOW)
        p, alpha, m_i, l_i = online_softmax_step(gl.permute(sT, (1, 0)), m_i, l_i, True)
        accT = _scale_cols(accT, alpha, FOLD)
        p16T = gl.convert_layout(gl.permute(_pad_rows(p.to(V16.dtype.element_ty), 0.0, FOLD), (1, 0)), BOP)
        return _pv16(V16, row0, p16T, accT, DS, D, LV16, MMA, PAD), m_i, l_i

    @gluon.jit
    def _masked_tile(KD16, KS, VD, VS, PT, b, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL, keys0, sel_rows, vg,
                     SEL, MAXP, h, Hkv, K16, V16, Q, q_rows, q_ok, qk_scale, koff, ksoff, voff, vsoff, kmask, ksmask,
                     vmask, DS, D: gl.constexpr, PS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
                     LH: gl.constexpr, MMA: gl.constexpr, THRIFT: gl.constexpr, WINDOW: gl.constexpr,
                     LK16: gl.constexpr, LV16: gl.constexpr, PAD: gl.constexpr, FUSED16: gl.constexpr,
                     FOLD: gl.constexpr, GROUP16: gl.constexpr = False, sel_g=0):
        """A tile of the masked runs (a window's first tiles, the last committed keys): its page-table entry, its bytes,
        then ``_tile`` with the masks (``GROUP16``: ``_tile16`` instead where the kv group selected its page, SEL's row
        ``sel_g``)."""
        page = _page(PT, b, t0, MAXP, PS)
        if GROUP16:
            if gl.load(SEL + sel_g + t0 // PS) != 0:
                accT, m_i, l_i = _tile16(t0, accT, m_i, l_i, last_key, C, WL, keys0, page, h, Hkv, K16, V16, Q, q_rows,
                                         q_ok, qk_scale, DS, D, PS, BLOCK_N, BLOCK_M, MMA, True, WINDOW, LK16, LV16,
                                         PAD, FOLD)
            else:
                kh, ks, vb, vs = _load_page_tile(KD16, KS, VD, VS, page, h, t0, Hkv, koff, ksoff, voff, vsoff, kmask,
                                                 ksmask, vmask, DS, PS, PAD)
                accT, m_i, l_i = _tile(kh, ks, vb, vs, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL, keys0,
                                       sel_rows, vg, SEL, MAXP, page, h, Hkv, K16, V16, Q, q_rows, q_ok, qk_scale, DS,
                                       D, PS, BLOCK_N, BLOCK_M, LH, MMA, True, THRIFT, WINDOW, LK16, LV16, PAD, False,
                                       FOLD, GROUP16=True)
        else:
            kh, ks, vb, vs = _load_page_tile(KD16, KS, VD, VS, page, h, t0, Hkv, koff, ksoff, voff, vsoff, kmask,
                                             ksmask, vmask, DS, PS, PAD)
            accT, m_i, l_i = _tile(kh, ks, vb, vs, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL, keys0, sel_rows,
                                   vg, SEL, MAXP, page, h, Hkv, K16, V16, Q, q_rows, q_ok, qk_scale, DS, D, PS,
                                   BLOCK_N, BLOCK_M, LH, MMA, True, THRIFT, WINDOW, LK16, LV16, PAD, FUSED16, FOLD)
        return accT, m_i, l_i

    @gluon.jit
    def _decode_split_kernel_gl(Q, KD, KS, VD, VS, PT, LENS, KG, VG, SEL, K16, V16, OP, MP, LP,
                                qk_scale, Hkv, NQ, G, MAXP, TPS, NS, WL, SINK,
                                D: gl.constexpr, PS: gl.constexpr, BLOCK_M: gl.constexpr,
                                BLOCK_N: gl.constexpr, THRIFT: gl.constexpr,
                                LQ: gl.constexpr, LH: gl.constexpr, LKS: gl.constexpr, LV: gl.constexpr,
                                MMA: gl.constexpr, LK16: gl.constexpr, LV16: gl.constexpr, LOUT: gl.constexpr,
                                PDL_TRIGGER: gl.constexpr = False, WINDOW: gl.constexpr = False,
                                SINKS: gl.constexpr = False, DR: gl.constexpr = 0, L2_PREFETCH: gl.constexpr = False,
                                FUSED16: gl.constexpr = False, FOLD: gl.constexpr = 1, PIPE: gl.constexpr = False,
                                LH32: gl.constexpr = None, LKS16: gl.constexpr = None, LV32: gl.constexpr = None,
                                GROUP16: gl.constexpr = False):
        # D: the tiles' channels (64, 128 or 256); DR: the cache's head dim when it is less (48, 80, 96, 112,
        # 144 ... 240: the padding channels load as zeros), 0 when equal (see launch)
        PAD: gl.constexpr = DR != 0
        R: gl.constexpr = BLOCK_M // FOLD  # query-row slots (FOLD > 1: the MMA's columns hold FOLD parts of each)
        DS: gl.constexpr = DR if PAD else D  # row strides of q and the cache
        BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
        pid_s = gl.program_id(0)
        if PDL_TRIGGER:  # let the reduce kernel (a programmatic dependent launch) be scheduled early
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)
        pid_bh, b, h = kv_head(Hkv)
        KD16 = KD.cast(gl.pointer_type(gl.int16), bitcast=True)
        start = pid_s * TPS
        # FP4 tiles without a window: the split's first tile (at start, decode_tile_runs) is bulk-prefetched into L2
        # as soon as its page-table entry arrives, so that its bytes stream in while q is loaded and quantized; every
        # program of the one-wave grid starts at once, and its first load otherwise waited for that setup (1.6-2.3%
        # of the step, H100, benchmarks/decode-prologue-s42/; Thrift's 64-key tiles: 0.9% slower, not used)
        FIRST_L2: gl.constexpr = not WINDOW and not THRIFT
        if FIRST_L2:
            page0 = _page(PT, b, start, MAXP, PS)
        L, C = seq_length(LENS, b)  # C: committed tokens; the reduce adds the raw tail
        # ϕ(q) along D (exact in fp16) of the R distinct query rows, then copied into the FOLD columns of each
        rq = gl.arange(0, R, layout=gl.SliceLayout(1, LQ))
        dq = gl.arange(0, D, layout=gl.SliceLayout(0, LQ))
        q_rows = (b * Hkv + h).to(gl.int64) * G * NQ + rq
        q = gl.load(Q + q_rows[:, None] * DS + dq[None, :], mask=(rq < G * NQ)[:, None] & (dq < DS)[None, :],
                    other=0.0)
        if FIRST_L2:
            _prefetch_l2(KD16, KS, VD, VS, page0, h, start, Hkv, DS, PS, BLOCK_N)
        qf = fake_quant_rows(q.to(gl.float32), 16, False, True).to(gl.float16)
        for i in gl.static_range(3):  # FOLD <= 8: row r -> rows r·FOLD .. r·FOLD + FOLD - 1
            if FOLD >= (2 << i):
                qf = gl.reshape(gl.permute(gl.join(qf, qf), (0, 2, 1)), (2 * qf.shape[0], D))
        # channels in the logical k order of the K fragments
        qf = gl.reshape(qf, (BLOCK_M, 4, D // 32, 2, 2, 2))  # m, c, jh, kh, e, kl
        qf = gl.reshape(gl.permute(qf, (0, 2, 3, 5, 1, 4)), (BLOCK_M, D))  # m, (jh, kh, kl, c, e)
        if FOLD > 1:  # column m: part m % FOLD of query row m // FOLD, its logical channels k of part k // (D / FOLD)
            mq = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, qf.type.layout))
            kq = gl.arange(0, D, layout=gl.SliceLayout(0, qf.type.layout))
            qf = gl.where((mq % FOLD)[:, None] == (kq // (D // FOLD))[None, :], qf, 0.0)
        qT = gl.convert_layout(gl.permute(qf, (1, 0)), BOP)
        zf = _fold_cols(gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA), FOLD)  # Sᵀ's (keys, rows) layout
        rows = gl.arange(0, R, layout=gl.SliceLayout(0, zf.type.layout))
        last_key = L - NQ + rows % NQ  # bottom-right causal: query i sees keys <= L - NQ + i
        s_scale = qk_scale * gl.load(KG + pid_bh) * 16384.0  # the decode yields K values times 2^-14
        vg = gl.load(VG + pid_bh) * 16384.0  # ... and V values times 2^-14
        # query head of each row (Thrift's SEL rows; padding rows read the group's last head)
        sel_rows = ((b * Hkv + h) * G + gl.minimum(rows // NQ, G - 1)).to(gl.int64)
        sel_g = (b * Hkv + h).to(gl.int64) * G * MAXP  # GROUP16: the group's first query head's SEL row (all equal)
        # Thrift's 16-bit scores: q's row of each B operand column (row n // FOLD), read in its dtype
        c16 = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, BOP))
        q_rows16 = (b * Hkv + h).to(gl.int64) * G * NQ + c16 // FOLD
        q_ok16 = c16 // FOLD < G * NQ
        z = gl.permute(zf, (1, 0))
        m_i = gl.max(z, 1) - float("inf")  # running max / sum per query row, in the (rows, keys) view's slice
        if SINKS:  # P̃ against max(split max, sink), as decode's Triton split kernel; the sink's l: in the reduce
            # SINK: the (Hq,) sinks in score units, sel_rows % Hq the query head of a row
            sk = gl.load(SINK + sel_rows % (G * Hkv), mask=rows < G * NQ, other=float("-inf")).to(gl.float32) * LOG2E_K
            m_i = gl.convert_layout(sk, m_i.type.layout)
        l_i = gl.sum(z, 1)
        accT = gl.zeros([D, BLOCK_M], gl.float32, layout=MMA)
        # loop-invariant offsets of the tile loads (the loop adds one scalar base per tensor)
        koff, kr, kc = _key_offsets(LH, BLOCK_N, D // 4, DS // 4)
        kmask = (kr < BLOCK_N)[:, None] & (kc < DS // 4)[None, :]  # (used with PAD only)
        ksoff, sr, sc = _key_offsets(LKS, BLOCK_N, D // 16, DS // 16)
        ksmask = (sr < BLOCK_N)[:, None] & (sc < DS // 16)[None, :]
        voff, vsoff, vr, vc = _pair_offsets(LV, BLOCK_N, D, DS)
        vmask = (vr < BLOCK_N // 2)[:, None] & (vc < DS)[None, :]
        keys0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, zf.type.layout))
        if WINDOW:  # the splits cover the window of the sequence: from the tile holding its first visible key
            start += (gl.maximum(L - NQ - WL, 0) // BLOCK_N) * BLOCK_N
        end = gl.minimum(start + TPS, C)
        lo_end, full_end = decode_tile_runs(start, end, L, NQ, WL, BLOCK_N, WINDOW)
        if WINDOW:  # tiles below L - 1 - WL hold keys the last query row's window leaves out: masked (<= 2 tiles)
            for t0 in range(start, lo_end, BLOCK_N):
                accT, m_i, l_i = _masked_tile(KD16, KS, VD, VS, PT, b, t0, accT, m_i, l_i, qT, s_scale, last_key, C,
                                              WL, keys0, sel_rows, vg, SEL, MAXP, h, Hkv, K16, V16, Q, q_rows16,
                                              q_ok16, qk_scale, koff, ksoff, voff, vsoff, kmask, ksmask, vmask, DS, D,
                                              PS, BLOCK_N, BLOCK_M, LH, MMA, THRIFT, WINDOW, LK16, LV16, PAD, FUSED16,
                                              FOLD, GROUP16, sel_g)
        # tiles from there below min(end, L - NQ + 1) are committed and visible to every query row: no masks. The
        # page-table entries are loaded two tiles ahead (a tile's bytes are addressed through its entry: two dependent
        # global loads otherwise); with L2_PREFETCH the next tile's bytes are also prefetched into L2; with PIPE the
        # next tile's bytes are loaded before this tile's work and carried in registers, as words
        if full_end > lo_end:
            last_t0 = full_end - BLOCK_N  # the run's last tile (the prefetches past it repeat it)
            page = _page(PT, b, lo_end, MAXP, PS)
            page1 = _page(PT, b, gl.minimum(lo_end + BLOCK_N, last_t0), MAXP, PS)
            if PIPE:
                KS8: gl.constexpr = D < 128
                kw, ksw, vw, vsw = _word_offsets(DS, D, BLOCK_N, LH32, LKS16, LV32, ksoff, KS8)
                wk, wks, wv, wvs = _load_words(KD16, KS, VD, VS, page, h, lo_end, Hkv, kw, ksw, vw, vsw, DS, PS, KS8)
                for t0 in range(lo_end, full_end, BLOCK_N):
                    page2 = _page(PT, b, gl.minimum(t0 + 2 * BLOCK_N, last_t0), MAXP, PS)
                    # (the last tile loads itself again: cached, and no predicate or zero fill in the loop)
                    nk, nks, nv, nvs = _load_words(KD16, KS, VD, VS, page1, h, gl.minimum(t0 + BLOCK_N, last_t0),
                                                   Hkv, kw, ksw, vw, vsw, DS, PS, KS8)
                    accT, m_i, l_i = _tile(wk, wks, wv, wvs, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL, keys0,
                                           sel_rows, vg, SEL, MAXP, page, h, Hkv, K16, V16, Q, q_rows16, q_ok16,
                                           qk_scale, DS, D, PS, BLOCK_N, BLOCK_M, LH, MMA, False, THRIFT, WINDOW, LK16,
                                           LV16, PAD, FUSED16, FOLD, True, LV)
                    wk, wks, wv, wvs = nk, nks, nv, nvs
                    page = page1
                    page1 = page2
            if GROUP16:  # whether the group selected the tile's page, read a tile ahead (as the page-table entries)
                sel1 = gl.load(SEL + sel_g + lo_end // PS)
            else:
                sel1 = 0
            for t0 in range(lo_end, lo_end if PIPE else full_end, BLOCK_N):
                page2 = _page(PT, b, gl.minimum(t0 + 2 * BLOCK_N, last_t0), MAXP, PS)
                if L2_PREFETCH:
                    _prefetch_l2(KD16, KS, VD, VS, page1, h, gl.minimum(t0 + BLOCK_N, last_t0), Hkv, DS, PS, BLOCK_N)
                if GROUP16:
                    selt = sel1
                    sel1 = gl.load(SEL + sel_g + gl.minimum(t0 + BLOCK_N, last_t0) // PS)
                    if selt != 0:  # the whole group's rows in 16 bits; the FP4 bytes are not read
                        accT, m_i, l_i = _tile16(t0, accT, m_i, l_i, last_key, C, WL, keys0, page, h, Hkv, K16, V16,
                                                 Q, q_rows16, q_ok16, qk_scale, DS, D, PS, BLOCK_N, BLOCK_M, MMA,
                                                 False, WINDOW, LK16, LV16, PAD, FOLD)
                    else:
                        kh, ks, vb, vs = _load_page_tile(KD16, KS, VD, VS, page, h, t0, Hkv, koff, ksoff, voff, vsoff,
                                                         kmask, ksmask, vmask, DS, PS, PAD)
                        accT, m_i, l_i = _tile(kh, ks, vb, vs, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL,
                                               keys0, sel_rows, vg, SEL, MAXP, page, h, Hkv, K16, V16, Q, q_rows16,
                                               q_ok16, qk_scale, DS, D, PS, BLOCK_N, BLOCK_M, LH, MMA, False, THRIFT,
                                               WINDOW, LK16, LV16, PAD, False, FOLD, GROUP16=True)
                else:
                    kh, ks, vb, vs = _load_page_tile(KD16, KS, VD, VS, page, h, t0, Hkv, koff, ksoff, voff, vsoff,
                                                     kmask, ksmask, vmask, DS, PS, PAD)
                    accT, m_i, l_i = _tile(kh, ks, vb, vs, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL, keys0,
                                           sel_rows, vg, SEL, MAXP, page, h, Hkv, K16, V16, Q, q_rows16, q_ok16,
                                           qk_scale, DS, D, PS, BLOCK_N, BLOCK_M, LH, MMA, False, THRIFT, WINDOW, LK16,
                                           LV16, PAD, FUSED16, FOLD)
                page = page1
                page1 = page2
        for t0 in range(full_end, end, BLOCK_N):  # at most the last committed 16 + BLOCK_N keys
            accT, m_i, l_i = _masked_tile(KD16, KS, VD, VS, PT, b, t0, accT, m_i, l_i, qT, s_scale, last_key, C, WL,
                                          keys0, sel_rows, vg, SEL, MAXP, h, Hkv, K16, V16, Q, q_rows16, q_ok16,
                                          qk_scale, koff, ksoff, voff, vsoff, kmask, ksmask, vmask, DS, D, PS, BLOCK_N,
                                          BLOCK_M, LH, MMA, THRIFT, WINDOW, LK16, LV16, PAD, FUSED16, FOLD, GROUP16,
                                          sel_g)
        if not THRIFT:
            accT = accT * vg  # (Thrift scales each tile's product by s1·vg in _tile)
        # partials in physical channel order: logical row m = r + 8a + 16(2w + z) is channel (D/8)·r + 4w + 2z + a (a
        # relabelling of the accumulator's registers), then through shared memory into rows of consecutive channels
        # (LOUT), so that the stores write whole sectors: the fragment's own 4-byte stores, scattered over a sector
        # each, cost ~11 us of a step where every program stored at once (one tile per program, (8,32,8,*,128), H100),
        # 1-3% of it at the lengths, 11% with 8 query rows (benchmarks/decode-s39/)
        x = gl.reshape(accT, (D // 32, 2, 2, 8, BLOCK_M))  # (w, z, a, r, column)
        x = gl.convert_layout(gl.reshape(gl.permute(x, (4, 3, 0, 1, 2)), (BLOCK_M, D)), LOUT)
        n = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LOUT))
        dp = gl.arange(0, D, layout=gl.SliceLayout(0, LOUT))
        prow = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + n
        gl.store(OP + prow[:, None] * D + dp[None, :], x, mask=(n < G * NQ)[:, None])
        rrow = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + rows
        gl.store(MP + rrow, gl.convert_layout(m_i, rows.type.layout), mask=rows < G * NQ)
        gl.store(LP + rrow, gl.convert_layout(l_i, rows.type.layout), mask=rows < G * NQ)


def _log2(n: int) -> int:
    return n.bit_length() - 1


def _key_rows_layout(per_lane: int, BLOCK_N: int):
    """(BLOCK_N keys, 4·per_lane elements) in the A fragments' rows: thread (r = lane/4, c = lane%4) holds elements
    c·per_lane .. + per_lane of keys r + 8i (LH, LKS; PIPE's words: LH32, LKS16)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(_log2(per_lane))] + [[8 << i, 0] for i in range(_log2(BLOCK_N // 8))],
        lane_bases=[[0, per_lane], [0, 2 * per_lane], [1, 0], [2, 0], [4, 0]], warp_bases=[], block_bases=[],
        shape=[BLOCK_N, 4 * per_lane])


def _pair_rows_layout(per_lane: int, BLOCK_N: int):
    """(BLOCK_N/2 token pairs, 8·per_lane elements) of Vᵀ's A fragments: thread (r = lane/4, c = lane%4) holds elements
    r·per_lane .. + per_lane of pairs c + 4i (LV; PIPE's words: LV32)."""
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(_log2(per_lane))] + [[4 << i, 0] for i in range(_log2(BLOCK_N // 8))],
        lane_bases=[[1, 0], [2, 0], [0, per_lane], [0, 2 * per_lane], [0, 4 * per_lane]], warp_bases=[],
        block_bases=[], shape=[BLOCK_N // 2, 8 * per_lane])


@functools.lru_cache(maxsize=None)
def _layouts(D: int, BLOCK_N: int, BLOCK_M: int) -> dict:
    """The register layouts of one-warp programs (linear layouts: bases of register bits, then lanes)."""
    MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    LQ = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32], warps_per_cta=[1, 1], order=[1, 0])
    # K half-words (BLOCK_N, D/4): thread (r, c) holds D/16 consecutive half-words (D/4 channels) of its rows
    LH = _key_rows_layout(D // 16, BLOCK_N)
    # K scale bytes (BLOCK_N, D/16): the D/64 blocks of those channels
    LKS = _key_rows_layout(D // 64, BLOCK_N)
    # V bytes (BLOCK_N/2 token pairs, D channels): thread (r, c) holds channels r·D/8 .. + D/8 of pairs c + 4i
    LV = _pair_rows_layout(D // 8, BLOCK_N)
    # Thrift's 16-bit K (BLOCK_N, 4, 4): thread (r, c) holds 4 consecutive channels (c·D/4 + 4J ..) of its rows
    LK16 = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2]] + [[8 << i, 0, 0] for i in range(_log2(BLOCK_N // 8))],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]], warp_bases=[], block_bases=[],
        shape=[BLOCK_N, 4, 4])
    # ... and its 16-bit V in chunks of 16 keys: LV's layout of 8 token pairs
    LV16 = LV if BLOCK_N == 16 else _layouts(D, 16, BLOCK_M)["LV"]
    # the partial outputs (BLOCK_M rows, D channels) as stored: 4 consecutive channels per thread, a warp's lanes along
    # a row's channels
    tp = min(32, D // 4)
    LOUT = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[32 // tp, tp], warps_per_cta=[1, 1],
                            order=[1, 0])
    return dict(LQ=LQ, LH=LH, LKS=LKS, LV=LV, MMA=MMA, LK16=LK16, LV16=LV16, LOUT=LOUT)


@functools.lru_cache(maxsize=None)
def _words_layouts(D: int, BLOCK_N: int) -> dict:
    """``PIPE``'s word layouts: the registers of LH (K half-words), LKS (K scale bytes) and LV (V bytes, V scale bytes)
    two (LKS) or four bytes at a time, as 32- / 16-bit words: (BLOCK_N, D/8), (BLOCK_N, D/32), (BLOCK_N/2, D/4). At
    64 channels a lane holds one K scale byte per key: no LKS16."""
    LKS16 = None if D < 128 else _key_rows_layout(D // 128, BLOCK_N)  # (64 channels: K scale bytes, in LKS)
    return dict(LH32=_key_rows_layout(D // 32, BLOCK_N), LKS16=LKS16, LV32=_pair_rows_layout(D // 32, BLOCK_N))


def pipe_fits(D: int, rows: int, block_n: int, thrift: bool) -> bool:
    """Where the FP4 tiles can run ``PIPE`` (the next tile's words carried in registers through this tile's work):
    64- and 128-channel caches (a 256-channel tile does not fit its registers), 32-key tiles, at most 8 query rows
    and no Thrift selection."""
    return HAVE_GLUON and D in (64, 128) and block_n == 32 and rows <= 8 and not thrift


def fused16_fits(D: int, rows: int, dtype) -> bool:
    """Thrift's selected pages inside this kernel (``FUSED16``), for a 16-bit copy of ``dtype`` float16 or bfloat16
    (a float32 cache keeps the 16-bit stream kernel), where its tile keeps the 168-register budget of 12
    programs per SM (ptxas, sm_90: no spill for one new token, 8 bytes of stack for two): at most 64 channels and 8
    query rows, 1.17-1.27x faster than the two-kernel path (H200). Wider tiles (255 registers at 128 channels: 8 per SM;
    hundreds of bytes of spills at 256 channels or 16 rows) ran 1.00-1.03x at D = 128 and slower elsewhere
    (benchmarks/thrift-fused-s31/): they keep ``decode._decode_16bit_kernel``."""
    return next_pow2(D) <= 64 and rows <= 8 and dtype in (torch.float16, torch.bfloat16)


def group16_fits(D: int, rows: int, dtype) -> bool:
    """Where ``GROUP16`` runs (a selection equal for every query head of a kv group, ``decode``'s
    thrift_share="group"): pages the group selected computed from the 16-bit copy only, as one exclusive branch per
    tile, the others as FP4 tiles (the 16-bit stream kernel and its extra split slots are not used). Tiles of <= 128
    channels, <= 8 query rows, a float16 / bfloat16 copy (as ``fused16_fits``)."""
    return HAVE_GLUON and next_pow2(D) <= 128 and rows <= 8 and dtype in (torch.float16, torch.bfloat16)


def default_fold(rows: int, BLOCK_M: int) -> int:
    """Channel parts per query row in the score MMA's 8 columns (``FOLD``): with rows <= 4 query rows, 8 / rows (a
    power of two), so that the online softmax and the P̃ rounding run on the rows' sums of their parts and no lane
    holds padding columns (1 with 16 columns). Thrift's 16-bit scores (``FUSED16``) are folded the same way."""
    if BLOCK_M != 8:
        return 1
    return 8 // next_pow2(max(1, rows))


def supported(D: int, rows: int, block_n: int, page_size: int) -> bool:
    """Shapes this kernel handles: D a multiple of 16 from 48 to 256 (tiles of 64, 128 or 256 channels), at most 16
    query rows per program (G·n_q), 32- or 64-key tiles inside a page."""
    return (HAVE_GLUON and 48 <= D <= 256 and D % 16 == 0 and rows <= 16 and block_n in (32, 64)
            and page_size % block_n == 0)


def launch(q, cache, pt, ks, vs, OP, MP, LP, qk_scale, NQ, G, maxp, TPS, num_splits, BLOCK_M, block_n,
           sel=None, ns_stride=None, maxnreg=None, pdl_trigger=False, window=None, sink=None, l2_prefetch=False,
           fused16=False, fold=None, pipe=False, group16=False):
    """Run the split kernel on the decode_fwd buffers (grid (splits, B·Hkv), one warp per program; ``maxnreg``: a
    register cap, so that as many programs share an SM as the splits were sized for). ``window``: a sliding
    window's left extent (the splits start at each sequence's window); ``sink``: the (Hq,) attention sinks in score
    units (a float tensor), the running max's start. ``l2_prefetch``: the unmasked tiles' next tile prefetched into
    L2 (``cp.async.bulk.prefetch``). ``fused16`` (with a Thrift selection ``sel``): the selected pages computed here
    from the cache's 16-bit copy (``fused16_fits``) instead of by the separate 16-bit stream kernel. ``fold``: channel
    parts per query row in the score MMA's columns (``default_fold``; 1: one column per row). ``pipe``: the unmasked
    tiles' bytes loaded one tile ahead and carried in registers (``PIPE``, where ``pipe_fits``). ``group16`` (with a
    selection ``sel`` whose rows are equal within each kv group): a selected page is one 16-bit tile (``GROUP16``,
    where ``group16_fits``), its FP4 bytes not read."""
    B, _, _, DR = q.shape
    D = next_pow2(DR)  # the tiles' channels: DR padded to a power of two
    Hkv = cache.num_kv_heads
    extra = {"PDL_TRIGGER": True} if pdl_trigger else {}
    if DR != D:
        extra["DR"] = DR
    if window is not None:
        extra["WINDOW"] = True
    if sink is not None:
        extra["SINKS"] = True
    if l2_prefetch:
        extra["L2_PREFETCH"] = True
    if fused16 and group16:
        raise ValueError("fused16 and group16 are exclusive")
    if fused16:
        extra["FUSED16"] = True
    if group16:
        if sel is None or cache.k16 is None or not group16_fits(DR, BLOCK_M, cache.dtype):
            raise ValueError("group16: a Thrift selection, <= 128 channels, <= 8 query rows and a 16-bit copy")
        extra["GROUP16"] = True
    if pipe:
        if not pipe_fits(DR, BLOCK_M, block_n, sel is not None):
            raise ValueError(f"pipe: 64- or 128-channel caches, 32-key tiles, <= 8 query rows and no Thrift selection "
                             f"(got D={DR}, block_n={block_n}, BLOCK_M={BLOCK_M}, thrift={sel is not None})")
        extra.update(PIPE=True, **_words_layouts(D, block_n))
    fold = default_fold(G * NQ, BLOCK_M) if fold is None else fold
    if fold > 1:
        extra["FOLD"] = fold
    fast(_decode_split_kernel_gl)[head_grid(num_splits, B * Hkv)](
        q, cache.k_data, ks, cache.v_data, vs, pt, cache.seq_lens, cache.k_global_scale, cache.v_global_scale,
        MP if sel is None else sel, cache.k16 if fused16 or group16 else MP, cache.v16 if fused16 or group16 else MP,
        OP, MP, LP, qk_scale,
        Hkv, NQ, G, maxp, TPS, ns_stride or num_splits, window or 0, MP if sink is None else sink,
        D=D, PS=cache.page_size, BLOCK_M=BLOCK_M, BLOCK_N=block_n, THRIFT=sel is not None,
        **_layouts(D, block_n, BLOCK_M), num_warps=1, **({"maxnreg": maxnreg} if maxnreg else {}), **extra)
