"""Tile arithmetic shared by the attention-family kernels (forward, Attn-QAT, Thrift)."""

import triton
import triton.language as tl

from ..reference.common import effective_window

LOG2E = 1.4426950408889634  # the kernels' scores and maxima are in the log2 domain: S·log2(e)
LOG2E_K = tl.constexpr(LOG2E)  # the same inside kernels (a kernel reads only constexpr globals)


# -------------------------------------------------------------------------------------------------
# host side: the launch arguments of sliding windows
# -------------------------------------------------------------------------------------------------
def window_offsets(window, causal: bool, nq: int, nk: int) -> tuple[bool, int, bool, int]:
    """The kernels' edges for a normalized ``window=(left, right)`` (-1: unbounded; right 0 with ``causal``)
    or None: (right edge?, COFF, left edge?, LOFF) with query i seeing keys i + LOFF <= j <= i + COFF
    (bottom-right: COFF = Nk − Nq for causal). Extents that reach past every key are unbounded
    (``reference.common.effective_window``: exact, no row's window is cut there), which also keeps the offsets in
    int32 for huge extents."""
    wl, wr = effective_window(window, causal, nq, nk) or (-1, -1)
    right = causal or wr >= 0
    coff = nk - nq + (max(wr, 0) if not causal else 0)
    return right, coff, wl >= 0, nk - nq - wl


# -------------------------------------------------------------------------------------------------
# key order of the staged operands on the Gluon attention passes (``attention.quantize_qkv(key_perm=True)``)
# -------------------------------------------------------------------------------------------------
# Within each 64 keys, key 16q + 2j + e (block q of 16, pair j, element e) is stored at position 8j + 2q + e: the
# column that lane q of a quad holds in a wgmma accumulator fragment (columns 8j + 2q + e, j = 0..7, e = 0, 1).
# Each 16-key block of a score row is then held by one thread.
@triton.jit
def key_position(k):
    """Storage position of key k (integer tensor)."""
    return (k & -64) | ((k & 14) << 2) | ((k & 48) >> 3) | (k & 1)


@triton.jit
def position_key(c):
    """Key stored at position c (the inverse of ``key_position``)."""
    return (c & -64) | ((c & 6) << 3) | ((c & 56) >> 2) | (c & 1)


def key_positions(n: int, device=None):
    """``key_position`` on the host: the storage position of keys 0 ... n − 1 (n a multiple of 64), int64."""
    import torch

    return key_position.fn(torch.arange(n, device=device))


@triton.jit
def head_program():
    """(t, bh): the tile index t (grid axis 0) and the flat (batch, head) index bh of a program on a
    ``_launch.head_grid`` grid, which folds B·H over axes 1 and 2 (y·z = B·H) so that B·H may exceed CUDA's
    limit of 65535 per axis; the block order is that of a (tiles, B·H) grid."""
    return tl.program_id(0), tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)


@triton.jit
def program_rows(H, BLOCK: tl.constexpr):
    """The tile of a program on a (token tiles, B·H) ``head_grid`` over a (B, H, N, ·) tensor:
    (tile index t, flat head index bh, b, h, the tile's BLOCK token indices t·BLOCK ...)."""
    t, bh = head_program()
    return t, bh, bh // H, bh % H, t * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def kv_head(Hkv):
    """The sequence and kv head of a decode program on a (·, B·Hkv) ``head_grid``: (pid_bh, b, h)."""
    _, pid_bh = head_program()
    return pid_bh, pid_bh // Hkv, pid_bh % Hkv


@triton.jit
def seq_length(LENS, b):
    """(L, C): the length of sequence b and C = L - L % 16, its committed (quantized) tokens; the rest is the raw
    16-bit tail."""
    L = tl.load(LENS + b)
    return L, L - L % 16


@triton.jit
def kv_head_program(LENS, Hkv):
    """``kv_head`` and ``seq_length`` of a decode program: (pid_bh, b, h, L, C)."""
    pid_bh, b, h = kv_head(Hkv)
    L, C = seq_length(LENS, b)
    return pid_bh, b, h, L, C


@triton.jit
def decode_tile_runs(start, end, L, NQ, WL, BLOCK_N: tl.constexpr, WINDOW: tl.constexpr):
    """A decode split's key tiles (from ``start`` in BLOCK_N steps, below ``end`` <= the committed length) in
    three runs, for a sequence of length L with NQ new query rows: [start, lo_end) masked (with a sliding window of
    left extent WL: the tiles holding keys below L - 1 - WL, which the last query row's window leaves out; at most
    two), [lo_end, full_end) committed and visible to every query row (no masks), [full_end, end) masked (the
    causal diagonal of the new tokens and the last partial tile). Returns (lo_end, full_end)."""
    lo_end = start
    if WINDOW:
        lo_end = tl.minimum(start + tl.cdiv(tl.maximum(L - 1 - WL - start, 0), BLOCK_N) * BLOCK_N, end)
    n_full = tl.maximum(tl.minimum(end, L - NQ + 1) - lo_end, 0) // BLOCK_N
    return lo_end, lo_end + n_full * BLOCK_N


@triton.jit
def dim_mask(offs, N: tl.constexpr, NP: tl.constexpr):
    """``offs < N`` for the offsets ``offs`` = arange(0, NP) of a tile padded from N to the power of two NP (a head
    dim of 48, 80, 96 ... in NP = 64, 128 lanes); all true when N == NP, which Triton folds away (an unmasked load,
    the code of an unpadded tile unchanged)."""
    if N == NP:
        return tl.full(offs.shape, 1, tl.int1)
    else:
        return offs < N


@triton.jit
def load_bhsd_rows(X, sx_b, sx_h, sx_n, sx_d, b, h, rows, N, D, DP: tl.constexpr):
    """Rows ``rows`` (token indices) of head (b, h) of a (B, H, N, D) tensor with any strides, as a
    (len(rows), DP) float32 tile zero-padded past N tokens and D channels; also returns the mask."""
    cols = tl.arange(0, DP)
    msk = (rows[:, None] < N) & (cols[None, :] < D)
    x = load_rows(X + b.to(tl.int64) * sx_b + h.to(tl.int64) * sx_h, sx_n, sx_d, rows, cols, N, D)
    return x.to(tl.float32), msk


@triton.jit
def flag_v_channels(KVF, kv_bh, GROUP, DP: tl.constexpr, ch, cbad, anybad):
    """The V pre-pass's non-finite flags of a tile of kv head ``kv_bh`` (b·Hkv + h): KVF[q head, 2 + c] = 1 for each
    channel c of ``ch`` whose ``cbad`` is set and KVF[q head, 1] = 1 if ``anybad``, for the GROUP query heads that read
    the kv head (int32 KVF (B, Hkv·GROUP, 2 + DP), zeroed before). Masked stores of the same value from any tile: no
    atomics, no memory traffic for finite tiles."""
    for j in range(GROUP):
        row = KVF + (kv_bh * GROUP + j).to(tl.int64) * (DP + 2)
        tl.store(row + 2 + ch, cbad, mask=cbad != 0)
        tl.store(row + 1, anybad, mask=anybad != 0)


@triton.jit
def load_rows(src, sx_n, sx_d, rows, cols, N, D):
    """``load_bhsd_rows``'s load from the head's base pointer ``src``: rows x cols in the tensor's dtype, zero past N
    tokens and D channels (not converted: a load issued ahead of its use stays in flight until then)."""
    return tl.load(src + rows[:, None].to(tl.int64) * sx_n + cols[None, :] * sx_d,
                   mask=(rows[:, None] < N) & (cols[None, :] < D), other=0.0)


@triton.jit
def visible(keys, offs_m, Nk, causal_off, CAUSAL: tl.constexpr, left_off, WINDOW: tl.constexpr):
    """(rows, keys) mask of the scores a query row may see: key < Nk and, with CAUSAL, key <= row +
    causal_off (bottom-right; a window's right edge moves causal_off); with WINDOW (a sliding window's
    left edge), key >= row + left_off."""
    ok = keys[None, :] < Nk
    if CAUSAL:
        ok = ok & (keys[None, :] <= offs_m[:, None] + causal_off)
    if WINDOW:
        ok = ok & (keys[None, :] >= offs_m[:, None] + left_off)
    return ok


@triton.jit
def causal_key_range(m0, causal_off, Nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key range of the query tile [m0, m0 + BLOCK_M) under the bottom-right causal mask.

    Query i sees keys j <= i + causal_off (causal_off = Nk - Nq, plus a window's right extent). Returns
    (hi, full_end): keys >= hi are invisible to the whole tile; key tiles (of BLOCK_N) starting below
    full_end are fully visible to every row of the tile (as far as this edge goes) and inside Nk, so they
    need no mask (tiles in [full_end, hi) do).
    """
    n_full = (Nk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(tl.maximum(m0 + BLOCK_M + causal_off, 0), Nk)
        full_end = tl.minimum((tl.maximum(m0 + causal_off + 1, 0) // BLOCK_N) * BLOCK_N, n_full)
    else:
        hi = Nk
        full_end = n_full
    return hi, full_end


@triton.jit
def window_key_range(m0, left_off, hi, full_end, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     WINDOW: tl.constexpr):
    """The tile loop of the query tile [m0, m0 + BLOCK_M) with a sliding window's left edge (query i sees
    keys j >= i + left_off) on top of ``causal_key_range``'s (hi, full_end): returns (lo, e1, e2) with key
    tiles [lo, e1) masked (the left edge crosses them), [e1, e2) unmasked, [e2, hi) masked. Keys below lo
    are invisible to the whole tile (never loaded). Without WINDOW: (0, 0, full_end)."""
    if WINDOW:
        lo = tl.minimum((tl.maximum(m0 + left_off, 0) // BLOCK_N) * BLOCK_N, hi)
        full_lo = tl.cdiv(tl.maximum(m0 + BLOCK_M - 1 + left_off, 0), BLOCK_N) * BLOCK_N
        e1 = tl.maximum(tl.minimum(full_lo, hi), lo)
        e2 = tl.maximum(full_end, e1)
    else:
        lo = 0
        e1 = 0
        e2 = full_end
    return lo, e1, e2


@triton.jit
def window_query_range(n0, causal_off, left_off, NQP, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr):
    """The mirror of ``causal_key_range`` + ``window_key_range`` for the loop of the key tile
    [n0, n0 + BLOCK_N) over query tiles (of BLOCK_M, up to NQP) of a sliding window: query i sees key j
    iff j >= i + left_off and, with CAUSAL, j <= i + causal_off. Returns (lo, mid, e, hi) with query tiles
    [lo, mid) masked (the right edge crosses them; empty without CAUSAL), [mid, e) unmasked (every row
    sees every key of the tile, as far as the edges go: padded keys are the caller's), [e, hi) masked
    (the left edge crosses them). Queries outside [lo, hi) see none of the tile's keys."""
    # queries i > n0 + BLOCK_N - 1 - left_off see none of the keys, i <= n0 - left_off all of them
    hi = tl.minimum(tl.cdiv(tl.maximum(n0 + BLOCK_N - left_off, 0), BLOCK_M) * BLOCK_M, NQP)
    full_hi = (tl.maximum(n0 - left_off + 1, 0) // BLOCK_M) * BLOCK_M
    if CAUSAL:  # queries i < n0 - causal_off see none of the keys, i >= n0 + BLOCK_N - 1 - causal_off all
        lo = tl.minimum((tl.maximum(n0 - causal_off, 0) // BLOCK_M) * BLOCK_M, hi)
        mid = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - causal_off, 0), BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.maximum(mid, lo), hi)
    else:
        lo = 0
        mid = 0
    e = tl.minimum(tl.maximum(full_hi, mid), hi)
    return lo, mid, e, hi


@triton.jit
def online_softmax_step(s, m_i, l_i, MASKED: tl.constexpr):
    """One online-softmax update for a score tile ``s`` (log2 domain, masked entries -inf).

    Returns (p, alpha, m_new, l_new): P̃ = exp2(s - m_new), the rescale factor alpha =
    exp2(m_old - m_new) of earlier partial sums, the new running max and l (from the unquantized
    P̃). With MASKED, rows that have seen no visible key yet (m_new = -inf) get P̃ = 0 instead of NaN.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def two_level_step(s, m_i, l_i, tau, MASKED: tl.constexpr):
    """Online softmax for SageAttention3's two-level P on a score tile ``s`` (log2 domain, masked -inf).

    With P̃ = exp2(s - m) (m: the running max) and s1 = rowmax(P̃)/(448·6) per row of the tile, the
    tile adds s1·ϕ(P̃/s1)·V̂ to the output numerator. P̃/s1 = 2688·exp2(s - t) (t: the tile's row max)
    does not depend on m, so it is computed directly: one exp2 and one multiply per element, no row max
    of P̃, no division. The accumulator is kept in units of the last tile's s1: acc = numerator / s1(last),
    so a tile updates it as acc·pre + ϕ(P̃/s1)·V̂ with pre = s1(last)/s1 = exp2(tau - t) (tau: the
    last tile's row max): one multiply per accumulator element, as single-level online softmax, and
    the product accumulates in place. ``two_level_scale`` turns acc back into the numerator.

    The unit is bounded below: tau = max(t, m - 64), so acc <= 2^64·2688·N·max|V̂| stays finite (|V̂| <=
    2688) and pre <= 2^64. A tile whose max lies more than 64 below the running max (log2, i.e. weights
    < 2^-64 of the row's largest) is overweighted by 2^(m - 64 - t): it adds at most 64·2^-64 of the
    row's largest weight instead of less, far below float32 resolution. l sums the unquantized P̃ (as
    s1·rowsum(P̃/s1)). With MASKED, rows without a visible key in the tile get P̃/s1 = 0, pre = 1 and
    keep tau.
    Returns (P̃/s1, pre, tau_new, m_new, l_new)."""
    t = tl.max(s, 1)
    m_new = tl.maximum(m_i, t)
    if MASKED:
        t_use = tl.where(t == float("-inf"), 0.0, t)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        t_use = t
        m_use = m_new
    # 2688·exp2(s - t): exp2(s - t + log2 2688) would save the multiply, but the argument's rounding
    # (ulp(11) ~ 1e-6 absolute) moves P̃/s1 by ~7e-7 relative, 7x the reference's rounding: measurably more
    # E2M1 rounding-boundary flips (a 70x90 tile at 1.5e-3 rel. L2 instead of < 1e-3)
    p2 = tl.math.exp2(s - t_use[:, None]) * 2688.0
    s1 = tl.math.exp2(t - m_use) * (1.0 / 2688.0)
    alpha = tl.math.exp2(m_i - m_use)
    tau_new = tl.maximum(t, m_new - 64.0)
    pre = tl.math.exp2(tau - tau_new)  # <= 2^64; 0 before the first visible tile (tau = -inf; acc is 0)
    if MASKED:
        pre = tl.where(t == float("-inf"), 1.0, pre)
        tau_new = tl.where(t == float("-inf"), tau, tau_new)
    return p2, pre, tau_new, m_new, l_i * alpha + s1 * tl.sum(p2, 1)


@triton.jit
def two_level_scale(tau, m_i):
    """acc of ``two_level_step`` times this = the output numerator (relative to the final max m_i):
    s1 of the last tile, exp2(tau - m)/2688; 0 for rows that never saw a key."""
    return tl.where(tau == float("-inf"), 0.0, tl.math.exp2(tau - tl.where(m_i == float("-inf"), 0.0, m_i))
                    * (1.0 / 2688.0))


@triton.jit
def sink_start(sk, m_i, ONLINE: tl.constexpr):
    """(m, l) of rows whose softmax has an attention sink ``sk`` (per-row logits, log2 units) as a key with no value,
    before any key: ONLINE (a running max) starts the max at the sink, l = exp2(sk − sk) = 1 (0 where sk = −inf:
    no sink); else ``m_i`` is the exact row max, which includes the sink, and l = exp2(sk − m) (m = −inf: 0)."""
    if ONLINE:
        m_i = sk
        l_i = tl.where(sk == float("-inf"), 0.0, 1.0)
    else:
        l_i = tl.math.exp2(sk - tl.where(m_i == float("-inf"), 0.0, m_i))
    return m_i, l_i


@triton.jit
def softmax_finish(l_i, m_i):
    """End of a row's online softmax: (1/l, LSE in natural log); rows with no visible key get
    1/l = 0 (output 0, no NaN) and LSE = -inf. ``m_i`` is the running max in the log2 domain."""
    empty = l_i == 0.0
    inv_l = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    return inv_l, lse


@triton.jit
def finish_rows(l_i, m_i, offs_m, KVBAD, QBAD, pid_bh, NQP, Nk, causal_off, LSE, DP: tl.constexpr,
                CAUSAL: tl.constexpr, KROWS, NKP, left_off, WINDOW: tl.constexpr, keys64):
    """Epilogue rows of the FP4 attention kernels (``attention``'s module docstring, "Non-finite inputs"):
    from the pre-pass flags of query head ``pid_bh``, a NaN/Inf query row, or a key row the row sees, makes
    the row's l (hence its output and LSE) NaN; stores the LSE. Returns (seen: rows with a visible key,
    1/l, the head's flag pointer: flags[1] != 0 when some V channel is non-finite, flags[2 + d] per channel).

    With WINDOW (a sliding window's left edge at row + left_off) the first non-finite key alone does not
    decide: a row may see a later one. Then, only when the head has a non-finite key at or before some
    row's last visible key, the rows' windows are scanned in ``KROWS`` (the kv head's per-key flags, uint8
    (NKP,): the K pre-pass's), 64 keys at a time: ``keys64`` is 0 .. 63 (``tl.arange``; a Gluon kernel's in the
    layout of its score columns). Without non-finite keys the epilogue is unchanged."""
    seen = l_i != 0.0
    flags = KVBAD + pid_bh.to(tl.int64) * (DP + 2)
    kbad = 2147483647 - tl.load(flags)  # first non-finite key of the kv head (2**31 - 1: none)
    if CAUSAL:
        row_nan = kbad <= offs_m + causal_off
    else:
        row_nan = kbad < Nk
    if WINDOW:
        cand = seen & row_nan
        win_nan = offs_m < 0
        if tl.max(cand.to(tl.int32), axis=0) != 0:  # rare: scan the windows of the tile's rows
            m0 = tl.min(offs_m, axis=0)
            k_lo = (tl.maximum(tl.maximum(m0 + left_off, kbad), 0) // 64) * 64
            if CAUSAL:
                k_hi = tl.minimum(tl.max(offs_m, axis=0) + causal_off + 1, Nk)
            else:
                k_hi = Nk
            for n0 in range(k_lo, k_hi, 64):
                kn = n0 + keys64
                kb = tl.load(KROWS + kn, mask=kn < NKP, other=0) != 0
                hit = kb[None, :] & visible(kn, offs_m, Nk, causal_off, CAUSAL, left_off, WINDOW)
                win_nan = win_nan | (tl.max(hit.to(tl.int32), axis=1) != 0)
        row_nan = win_nan
    row_nan = seen & (row_nan | (tl.load(QBAD + pid_bh.to(tl.int64) * NQP + offs_m) != 0))
    inv_l, lse = softmax_finish(tl.where(row_nan, float("nan"), l_i), m_i)  # NaN l: NaN 1/l and LSE
    tl.store(LSE + pid_bh.to(tl.int64) * NQP + offs_m, lse)
    return seen, inv_l, flags
