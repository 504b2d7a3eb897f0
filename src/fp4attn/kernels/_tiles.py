"""Tile arithmetic shared by the attention-family kernels (forward, Attn-QAT, Thrift)."""

import triton
import triton.language as tl


@triton.jit
def program_rows(H, BLOCK: tl.constexpr):
    """The tile of a program on a (token tiles, B·H) grid over a (B, H, N, ·) tensor:
    (tile index t, flat head index bh, b, h, the tile's BLOCK token indices t·BLOCK ...)."""
    t = tl.program_id(0)
    bh = tl.program_id(1)
    return t, bh, bh // H, bh % H, t * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def load_bhsd_rows(X, sx_b, sx_h, sx_n, sx_d, b, h, rows, N, D, DP: tl.constexpr):
    """Rows ``rows`` (token indices) of head (b, h) of a (B, H, N, D) tensor with any strides, as a
    (len(rows), DP) float32 tile zero-padded past N tokens and D channels; also returns the mask."""
    cols = tl.arange(0, DP)
    msk = (rows[:, None] < N) & (cols[None, :] < D)
    src = X + b.to(tl.int64) * sx_b + h.to(tl.int64) * sx_h
    x = tl.load(src + rows[:, None].to(tl.int64) * sx_n + cols[None, :] * sx_d, mask=msk, other=0.0)
    return x.to(tl.float32), msk


@triton.jit
def visible(keys, offs_m, Nk, causal_off, CAUSAL: tl.constexpr):
    """(rows, keys) mask of the scores a query row may see: key < Nk and, with CAUSAL, key <= row +
    causal_off (bottom-right)."""
    ok = keys[None, :] < Nk
    if CAUSAL:
        ok = ok & (keys[None, :] <= offs_m[:, None] + causal_off)
    return ok


@triton.jit
def causal_key_range(m0, Nq, Nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key range of the query tile [m0, m0 + BLOCK_M) under the bottom-right causal mask.

    Query i sees keys j <= i + Nk - Nq. Returns (hi, full_end): keys >= hi are invisible to the
    whole tile; key tiles (of BLOCK_N) starting below full_end are fully visible to every row of the
    tile and inside Nk, so they need no mask (tiles in [full_end, hi) do).
    """
    causal_off = Nk - Nq
    n_full = (Nk // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(tl.maximum(m0 + BLOCK_M + causal_off, 0), Nk)
        full_end = tl.minimum((tl.maximum(m0 + causal_off + 1, 0) // BLOCK_N) * BLOCK_N, n_full)
    else:
        hi = Nk
        full_end = n_full
    return hi, full_end


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
def softmax_finish(l_i, m_i):
    """End of a row's online softmax: (1/l, LSE in natural log); rows with no visible key get
    1/l = 0 (output 0, no NaN) and LSE = -inf. ``m_i`` is the running max in the log2 domain."""
    empty = l_i == 0.0
    inv_l = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    return inv_l, lse
