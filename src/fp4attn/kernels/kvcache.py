"""Appends to the NVFP4 :class:`fp4attn.KVCache` in one launch (issue 5): one token per sequence, or many.

A generation step appends one token per sequence and layer. The cache's general ``append`` (plain
PyTorch, a Python loop over the batch, the 16-token slot quantized by ``formats.core``) costs ~0.3 ms of
host time per call on an H200 machine, i.e. several milliseconds per generated token over a model's
layers. ``_append_one_kernel`` does the whole batch in one launch, one program per (sequence, kv head):

* the new token goes into row ``t = L % 16`` of the raw tail (``L``: the length before the append);
* when that fills the slot (``t == 15``) the program quantizes the slot's 16 tokens exactly as
  ``KVCache._commit`` does -- K along D and V along tokens, NVFP4 with the per-(sequence, head) global
  scale, through ``kernels.quantize._quant_pair`` (bit-exact with ``formats.core.quantize_blocks``) --
  writes codes and scale bytes into the slot's page (and the 16-bit copy with ``keep_16bit``), and
  zeroes the tail.

The host side (page allocation, the length mirror) stays in ``KVCache.append_one``.

``_append_slots_kernel`` quantizes many tokens of sequences whose tails are empty (a prefill, or an aligned
chunk of one): one program per (slot, sequence, kv head), the same slot code (``_store_slot``). The cache's
PyTorch path did that with a Python loop of ops per sequence: with the attention itself in full precision, the
prompt forward into an FP4 cache took 440 ms against 147 for a bf16 ``DynamicCache`` (B = 8, 4096 tokens, a
16-layer model, H200); 163 with this kernel and the changes beside it (``benchmarks/gen-s22``).

``_page_mean_kernel`` computes the FP32 K means of completed pages (Thrift's key-block means) from the
16-bit copy, for pages given by index (``KVCache._commit``) or, after a one-token append, for the page
that token completed, found from the lengths on the device: no host code depends on the lengths, so a
Thrift decode step can be replayed from a CUDA graph. Both callers run the same kernel, so the means are
the same bits for any append chunking.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..formats.triton_helpers import finite_abs_bits
from ._launch import device_ints, fast, head_grid, next_pow2
from ._tiles import dim_mask, head_program
from .quantize import _quant_pair

SLOT = 16
_SLOT = tl.constexpr(SLOT)  # inside kernels (a Python int global is not allowed there)


@triton.jit
def _store_slot(k, v, start, b, h, ph_row, H, MAXP, KG, VG, PT, KD, KS, VD, VS, K16, V16,
                D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr, KEEP16: tl.constexpr):
    """Quantize one full slot -- k, v: (16, DP) tiles in the cache dtype (D channels, zero-padded to the power of
    two DP), the tokens start .. start + 15 of sequence b, kv head h (``ph_row`` = b·H + h: the row of the global
    scales) -- exactly as ``KVCache._commit`` does, and store codes, scale bytes (and the 16-bit copy) of the D
    channels into its page (the padding's blocks quantize to zeros and are not stored)."""
    rows = tl.arange(0, _SLOT)
    offs_d = tl.arange(0, DP)
    dm = dim_mask(offs_d, D, DP)
    dm2 = dim_mask(tl.arange(0, DP // 2), D // 2, DP // 2)
    dm16 = dim_mask(tl.arange(0, DP // _SLOT), D // _SLOT, DP // _SLOT)
    # no page (-1): a CUDA-graph replay past KVCache.reserve's pages (sync_lengths reports it); the
    # slot is dropped instead of written below the pool (its page row clamped to 0, every store masked)
    page_i = tl.load(PT + b * MAXP + start // PS).to(tl.int64)
    ok = page_i >= 0
    page = tl.maximum(page_i, 0)
    off = start % PS
    ph = page * H + h
    # K along D: blocks of 16 channels of one token, element pairs (2i, 2i+1) -> one byte
    klo, khi = tl.split(tl.reshape(k.to(tl.float32), (_SLOT, DP // _SLOT, _SLOT // 2, 2)))
    senc_k = tl.math.div_rn(1.0, tl.load(KG + ph_row))
    clo, chi, _s, sb = _quant_pair(klo, khi, senc_k, False, False, True, True)
    kbytes = tl.reshape(clo | (chi << 4), (_SLOT, DP // 2)).to(tl.uint8)
    krow = ph * PS + off + rows  # storage row of each token
    tl.store(KD + krow[:, None] * (D // 2) + tl.arange(0, DP // 2)[None, :], kbytes, mask=ok & dm2[None, :])
    tl.store(KS + krow[:, None] * (D // _SLOT) + tl.arange(0, DP // _SLOT)[None, :], sb.to(tl.uint8),
             mask=ok & dm16[None, :])
    # V along tokens: one block of the 16 tokens per channel, token pairs (2j, 2j+1) -> one byte
    vlo, vhi = tl.split(tl.reshape(tl.trans(v.to(tl.float32)), (DP, 1, _SLOT // 2, 2)))
    senc_v = tl.math.div_rn(1.0, tl.load(VG + ph_row))
    clo, chi, _s, sb = _quant_pair(vlo, vhi, senc_v, False, False, True, True)
    vbytes = tl.reshape(clo | (chi << 4), (DP, _SLOT // 2)).to(tl.uint8)  # [channel, token pair]
    j = tl.arange(0, _SLOT // 2)
    tl.store(VD + ((ph * (PS // 2) + off // 2 + j) * D)[None, :] + offs_d[:, None], vbytes, mask=ok & dm[:, None])
    tl.store(VS + (ph * (PS // _SLOT) + off // _SLOT) * D + offs_d, tl.reshape(sb, (DP,)).to(tl.uint8),
             mask=ok & dm)
    if KEEP16:
        tl.store(K16 + krow[:, None] * D + offs_d[None, :], k, mask=ok & dm[None, :])
        tl.store(V16 + krow[:, None] * D + offs_d[None, :], v, mask=ok & dm[None, :])


@triton.jit
def _append_one_kernel(KN, skb, skh, skd, VN, svb, svh, svd, LENS, KT, VT, KG, VG, PT, KD, KS, VD, VS, K16, V16,
                       H, MAXP, D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr, KEEP16: tl.constexpr):
    pid = tl.program_id(0)  # b * H + h
    b = pid // H
    h = pid % H
    L = tl.load(LENS + b)
    t = L % _SLOT
    offs_d = tl.arange(0, DP)  # D padded to a power of two
    dm = dim_mask(offs_d, D, DP)
    kn = tl.load(KN + b.to(tl.int64) * skb + h * skh + offs_d * skd, mask=dm, other=0.0)
    vn = tl.load(VN + b.to(tl.int64) * svb + h * svh + offs_d * svd, mask=dm, other=0.0)
    tail = pid.to(tl.int64) * _SLOT * D
    if t < _SLOT - 1:
        tl.store(KT + tail + t * D + offs_d, kn, mask=dm)
        tl.store(VT + tail + t * D + offs_d, vn, mask=dm)
    else:
        # the slot is full: its first 15 tokens from the tail, the 16th from registers
        rows = tl.arange(0, _SLOT)
        r2 = tail + rows[:, None] * D + offs_d[None, :]
        old = (rows[:, None] < _SLOT - 1) & dm[None, :]
        last = rows[:, None] == _SLOT - 1
        k = tl.where(last, kn[None, :], tl.load(KT + r2, mask=old, other=0.0))  # (16, DP), cache dtype
        v = tl.where(last, vn[None, :], tl.load(VT + r2, mask=old, other=0.0))
        _store_slot(k, v, L - (_SLOT - 1), b, h, pid, H, MAXP, KG, VG, PT, KD, KS, VD, VS, K16, V16, D, DP, PS,
                    KEEP16)
        zero = tl.zeros([_SLOT, DP], KT.dtype.element_ty)
        tl.store(KT + r2, zero, mask=dm[None, :])
        tl.store(VT + r2, zero, mask=dm[None, :])


@triton.jit
def _append_slots_kernel(KN, skb, skh, skn, skd, VN, svb, svh, svn, svd, L0, NSLOT, KG, VG, PT, KD, KS, VD, VS,
                         K16, V16, H, MAXP, D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr,
                         KEEP16: tl.constexpr):
    """Many new tokens of sequences whose tails are empty (a prefill): program (s, b·H + h) quantizes slot s
    of sequence b's new tokens (rows 16s .. 16s + 15 of KN / VN), s < NSLOT[b], into the cache from token
    L0[b] + 16s on."""
    s, pid = head_program()  # (a head_grid: B·H may exceed one grid axis)
    b = pid // H
    h = pid % H
    if s < tl.load(NSLOT + b):
        rows = 16 * s + tl.arange(0, _SLOT)
        offs_d = tl.arange(0, DP)  # D padded to a power of two
        dm = dim_mask(offs_d, D, DP)[None, :]
        src = b.to(tl.int64) * skb + h * skh + rows[:, None].to(tl.int64) * skn + offs_d[None, :] * skd
        k = tl.load(KN + src, mask=dm, other=0.0)
        v = tl.load(VN + b.to(tl.int64) * svb + h * svh + rows[:, None].to(tl.int64) * svn + offs_d[None, :] * svd,
                    mask=dm, other=0.0)
        _store_slot(k, v, tl.load(L0 + b) + 16 * s, b, h, pid, H, MAXP, KG, VG, PT, KD, KS, VD, VS, K16, V16, D, DP,
                    PS, KEEP16)


@triton.jit
def _head_amax_kernel(KN, skb, skh, skn, skd, VN, svb, svh, svn, svd, COUNT, KA, VA, H,
                      D: tl.constexpr, DP: tl.constexpr, BLOCK_T: tl.constexpr):
    """The largest finite |value| of K and of V over the first COUNT[b] new tokens of each (sequence b, kv head h),
    as float32 bits atomically max-ed into KA / VA[b·H + h] (int32, zeroed): what ``KVCache._set_global_scales``
    derives a sequence's global scales from. Program (t, b·H + h) reads tokens t·BLOCK_T ... of one head."""
    t, pid = head_program()
    b = pid // H
    h = pid % H
    n = tl.load(COUNT + b)
    if t * BLOCK_T < n:
        rows = (t * BLOCK_T + tl.arange(0, BLOCK_T))[:, None]
        offs_d = tl.arange(0, DP)[None, :]  # D padded to a power of two
        m = (rows < n) & dim_mask(offs_d, D, DP)
        k = tl.load(KN + b.to(tl.int64) * skb + h * skh + rows.to(tl.int64) * skn + offs_d * skd, mask=m, other=0.0)
        v = tl.load(VN + b.to(tl.int64) * svb + h * svh + rows.to(tl.int64) * svn + offs_d * svd, mask=m, other=0.0)
        tl.atomic_max(KA + pid, tl.max(tl.max(finite_abs_bits(k.to(tl.float32).to(tl.int32, bitcast=True)), 1), 0))
        tl.atomic_max(VA + pid, tl.max(tl.max(finite_abs_bits(v.to(tl.float32).to(tl.int32, bitcast=True)), 1), 0))


@triton.jit
def _page_mean_kernel(K16, MEAN, PAGES, PT, LENS, H, MAXP, D: tl.constexpr, DP: tl.constexpr, PS: tl.constexpr,
                      FROM_LENS: tl.constexpr):
    pid = tl.program_id(0)  # i * H + h
    i = pid // H
    h = pid % H
    if FROM_LENS:  # i: a sequence; its page completed by the last appended token, if any (-1: none)
        L = tl.load(LENS + i)
        j = L // PS - 1
        ok = (L % PS == 0) & (j >= 0) & (j < MAXP)
        page = tl.where(ok, tl.load(PT + i * MAXP + tl.minimum(tl.maximum(j, 0), MAXP - 1)), -1)
    else:  # i: the i-th page of PAGES
        page = tl.load(PAGES + i)
    if page >= 0:  # (-1 also for a page past a KVCache.reserve, as in the append kernel)
        ph = page.to(tl.int64) * H + h
        rows = ph * PS + tl.arange(0, PS)
        offs_d = tl.arange(0, DP)  # D padded to a power of two
        dm = dim_mask(offs_d, D, DP)
        k = tl.load(K16 + rows[:, None] * D + offs_d[None, :], mask=dm[None, :], other=0.0).to(tl.float32)
        tl.store(MEAN + ph * D + offs_d, tl.math.div_rn(tl.sum(k, 0), PS * 1.0), mask=dm)


def page_means(cache, pages: torch.Tensor | None = None) -> None:
    """Store the FP32 K means of completed pages in ``cache.k_page_mean`` (``keep_16bit`` caches): of the pool
    pages ``pages`` (int64), or with None of each sequence's page its last appended token completed (read from
    ``seq_lens`` and the page table on the device)."""
    H, D = cache.num_kv_heads, cache.head_dim
    n = cache.batch_size if pages is None else pages.numel()
    if n == 0:
        return
    maxp = cache.page_table.shape[1]
    pt = cache.page_table if maxp else torch.full((cache.batch_size, 1), -1, dtype=torch.int32,
                                                  device=cache.device)
    fast(_page_mean_kernel)[(n * H,)](
        cache.k16, cache.k_page_mean, cache.seq_lens if pages is None else pages, pt, cache.seq_lens, H,
        max(maxp, 1), D=D, DP=next_pow2(D), PS=cache.page_size, FROM_LENS=pages is None, num_warps=4)


def append_one(cache, k: torch.Tensor, v: torch.Tensor) -> None:
    """Device part of ``KVCache.append_one``: k, v (B, Hkv, 1, D) in the cache dtype; the pages of the
    slots this step completes must exist. Leaves ``seq_lens`` and the host bookkeeping to the caller."""
    B, H, _, D = k.shape
    maxp = cache.page_table.shape[1]
    pt = cache.page_table if maxp else torch.zeros(B, 1, dtype=torch.int32, device=k.device)
    keep = cache.keep_16bit
    k16 = cache.k16 if keep else cache.k_tail
    v16 = cache.v16 if keep else cache.v_tail
    fast(_append_one_kernel)[(B * H,)](
        k, k.stride(0), k.stride(1), k.stride(3), v, v.stride(0), v.stride(1), v.stride(3),
        cache.seq_lens, cache.k_tail, cache.v_tail, cache.k_global_scale, cache.v_global_scale, pt,
        cache.k_data, cache.k_scale.view(torch.uint8), cache.v_data, cache.v_scale.view(torch.uint8), k16, v16,
        H, max(maxp, 1), D=D, DP=next_pow2(D), PS=cache.page_size, KEEP16=keep, num_warps=4)


def append_slots(cache, k: torch.Tensor, v: torch.Tensor, starts, nslots) -> None:
    """Device part of a many-token append to sequences with empty tails: k, v (B, Hkv, n, D) in the cache dtype;
    sequence b's first ``nslots[b]`` slots of new tokens go to its tokens ``starts[b]`` (a multiple of 16) on; the
    pages must exist. Leaves the tails, lengths and page means to the caller."""
    B, H, _, D = k.shape
    maxp = cache.page_table.shape[1]
    keep = cache.keep_16bit
    dev = k.device
    L0 = device_ints(starts, dev)
    ns = device_ints(nslots, dev)
    fast(_append_slots_kernel)[head_grid(max(nslots), B * H)](
        k, *k.stride(), v, *v.stride(), L0, ns, cache.k_global_scale, cache.v_global_scale, cache.page_table,
        cache.k_data, cache.k_scale.view(torch.uint8), cache.v_data, cache.v_scale.view(torch.uint8),
        cache.k16 if keep else cache.k_tail, cache.v16 if keep else cache.v_tail,
        H, max(maxp, 1), D=D, DP=next_pow2(D), PS=cache.page_size, KEEP16=keep, num_warps=4)


def head_amax(k: torch.Tensor, v: torch.Tensor, counts) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Hkv) float32 largest finite |k| and |v| over the first ``counts[b]`` tokens of each sequence's heads
    (k, v: (B, Hkv, n, D), any strides; 0 where counts[b] is 0): one pass over the new tokens, in place of the
    float32 temporaries of the PyTorch path."""
    B, H, n, D = k.shape
    amax = torch.zeros(2, B * H, dtype=torch.int32, device=k.device)
    if n:
        cnt = device_ints(counts, k.device)
        DP = next_pow2(D)
        BLOCK_T = max(1, 8192 // DP)
        fast(_head_amax_kernel)[head_grid(-(-max(counts) // BLOCK_T), B * H)](
            k, *k.stride(), v, *v.stride(), cnt, amax[0], amax[1], H, D=D, DP=DP, BLOCK_T=BLOCK_T, num_warps=8)
    a = amax.view(torch.float32).view(2, B, H)
    return a[0], a[1]


def supported(head_dim: int) -> bool:
    """Shapes the kernel handles: a head dim that is a multiple of 16 (a KVCache's; the tiles pad it to a power of
    two)."""
    return head_dim >= SLOT and head_dim % SLOT == 0


__all__ = ["append_one", "append_slots", "head_amax", "page_means", "supported"]
