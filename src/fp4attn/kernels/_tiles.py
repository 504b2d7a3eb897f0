"""Tile arithmetic shared by the attention-family kernels (forward, Attn-QAT, Thrift)."""

import triton
import triton.language as tl


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
