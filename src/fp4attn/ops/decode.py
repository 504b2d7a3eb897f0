"""``fp4attn.decode``: a few new query tokens attending to an NVFP4 :class:`fp4attn.KVCache` (issue 5).

Semantics (what the reference below computes and the CUDA kernel matches within SPEC §6):

* ``q``: (B, Hq, n_q, D), 1 <= n_q <= 16 new query tokens per sequence, **whose K/V were already
  appended to the cache** (as in HF generation: append this step's K/V, then attend). Sequence b has
  ``L_b = cache.seq_lens[b]`` tokens (ragged batches allowed); query i (0-based among the n_q) sees
  the keys ``j <= L_b − n_q + i`` (bottom-right causal, as ``attention(..., causal=True)``), and with
  ``window_size=(w, 0)`` only those ``j >= L_b − n_q + i − w`` (a sliding window, as ``attention``'s;
  transformers' ``sliding_window`` is w + 1). Quantization blocks are the cache's, whatever the window.
* GQA: query head h reads kv head ``h // (Hq / Hkv)``.
* ``recipe="nvfp4"`` (Attn-QAT Algorithm 1 on the cache): S = scale·ϕ(q)·K̂ᵀ with ϕ(q) NVFP4 along
  D and K̂ the stored NVFP4 K; P̃ = exp(S − rowmax) (one-shot in the reference), l = rowsum(P̃),
  O = ϕ(P̃)·V̂ / l with ϕ(P̃) NVFP4 along keys in blocks of 16 (aligned with the cache's slots).
  The raw tail of the cache (the last ``L_b % 16`` tokens, not yet quantized) is attended in 16 bits:
  S from the unquantized q and k, unquantized P̃ and v.
* ``thrift_budget=f`` (ThriftAttention decode; needs ``KVCache(keep_16bit=True)``): the Thrift
  blocks are the cache pages (``page_size`` tokens, 64 by default). For every sequence and query head,
  Ŝ_j = q̄·K̄_j with q̄ the mean of the n_q queries and K̄_j the FP32 mean of page j's K over its
  valid tokens; the top ``k = clamp(round(f·n_w), 1, n_w)`` (round half to even) of the sequence's n_w
  *candidate* pages (ties to the lower index) run in 16 bits (S from q and the 16-bit K copy, unquantized
  P̃ and the 16-bit V copy); the others run FP4 with two-level P (s1 = rowmax(P̃ tile of 64 keys)/(448·6))
  as in ``thrift_attention``. One softmax over all. The candidate pages are those holding a key that
  some query row of the step sees: without a window all n_b = ceil(L_b / page_size) pages (every page is
  visible to the last query); with ``window_size=(w, 0)`` the pages holding the keys
  ``max(L_b − n_q − w, 0) ... L_b − 1``, i.e. pages ``max(L_b − n_q − w, 0) // page_size ... n_b − 1``.
  The window's per-key mask applies in both paths (a selected page's keys outside a row's window score
  −inf there too). With ``sinks`` the sink joins the one softmax as without Thrift (in the max and in
  l); the selection does not depend on it.
* ``thrift_share`` (GQA, default ``"group"``): a query head computes in 16 bits every page that *some* query head
  of its kv group selected (the union of the group's selections), not only its own. The kernels read a selected
  page's 16-bit K and V once for the whole group either way, so this costs no extra memory traffic, and each
  head gets more exact pages (lower error on the Thrift quality inputs; BENCHMARKS.md, forty-first session).
  ``"head"``: only its own selection (ThriftAttention's per-head top-k, as in ``thrift_attention``). Without
  GQA (one query head per kv head) the two are the same.

Returns O in q's dtype (and the natural-log LSE (B, Hq, n_q) float32 with ``return_lse=True``).
"""

from __future__ import annotations

import math
import numbers

import torch

from ..formats.core import fake_quantize_values
from ..kvcache import SLOT, KVCache
from ..reference.common import expand_kv, lse_of, normalize, quantize_p, softmax_numerator
from ._dispatch import on_device, use_kernels
from ._validate import check_bool, check_choice, check_scale, check_sinks, check_window, warn_no_autograd

RECIPES = ("nvfp4",)
SHARES = ("group", "head")  # decode's thrift_share
MAX_NEW = 16


def _check(q, cache, scale, recipe, thrift_budget, layout, return_lse, window_size=None, sinks=None,
           thrift_share="group"):
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be an fp4attn.KVCache, got {type(cache).__name__}")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"q must be a float16, bfloat16 or float32 tensor, got dtype {q.dtype}")
    check_choice("layout", layout, ("bhsd", "bshd"))
    check_choice("recipe", recipe, RECIPES)
    check_choice("thrift_share", thrift_share, SHARES)
    check_bool("return_lse", return_lse)
    if q.dim() != 4:
        raise ValueError(f"q must be 4-D (B, Hq, n_q, D) for layout={layout!r}, got shape {tuple(q.shape)}")
    if layout == "bshd":
        q = q.transpose(1, 2)
    B, hq, nq, D = q.shape
    if B != cache.batch_size:
        raise ValueError(f"q's batch size ({B}) must equal the cache's ({cache.batch_size})")
    if D != cache.head_dim:
        raise ValueError(f"q's head dim D ({D}) must equal the cache's ({cache.head_dim})")
    if hq % cache.num_kv_heads:
        raise ValueError(f"the number of query heads ({hq}) must be a multiple of the cache's kv heads "
                         f"({cache.num_kv_heads}) (GQA/MQA)")
    if not 1 <= nq <= MAX_NEW:
        raise ValueError(f"n_q (new query tokens) must be in [1, {MAX_NEW}], got {nq}")
    if q.device != cache.device:
        raise ValueError(f"q must be on the cache's device {cache.device}, got {q.device}")
    if min(cache.lengths) < nq:
        raise ValueError(f"every sequence must already hold the n_q={nq} new tokens (append their K/V "
                         f"before decode); cache lengths are {cache.lengths}")
    if thrift_budget is not None:
        if isinstance(thrift_budget, bool) or not isinstance(thrift_budget, numbers.Real):
            raise TypeError(f"thrift_budget must be a float in (0, 1] or None, got {thrift_budget!r}")
        thrift_budget = float(thrift_budget)
        if not math.isfinite(thrift_budget) or not 0.0 < thrift_budget <= 1.0:
            raise ValueError(f"thrift_budget must be in (0, 1], got {thrift_budget}")
        if not cache.keep_16bit:
            raise ValueError("thrift_budget needs a cache built with keep_16bit=True (the 16-bit copy)")
    window = check_window(window_size, True)  # decode is causal: (left, 0) or None
    if cache.window is not None and (window is None or window[0] > cache.window):
        raise ValueError(f"this KVCache keeps only what a sliding window of {cache.window} keys reads (window="
                         f"{cache.window}): pass window_size=(w, 0) with w <= {cache.window}, got {window_size!r}")
    sinks = check_sinks(sinks, hq, q.device)
    return q, check_scale(scale, D), thrift_budget, (None if window is None else window[0]), sinks


def thrift_select(q: torch.Tensor, cache: KVCache, budget: float, window: int | None = None,
                  share: str = "head") -> torch.Tensor:
    """(B, Hq, max_pages) bool: the pages each (sequence, query head) computes in 16 bits.

    ``window``: a sliding window's left extent w (``window_size=(w, 0)``) or None: the top-k runs over the
    candidate pages of the module docstring (with a window: those holding keys ``max(L_b − n_q − w, 0) ...
    L_b − 1``; the others are never selected). ``share``: ``"head"``, each query head's own top-k; ``"group"``,
    the union of its kv group's (``decode``'s ``thrift_share``, see the module docstring). Device ops only (no
    host sync): usable inside a CUDA graph. The definition of the selection (the reference path's); CUDA
    ``decode`` computes the same with ``kernels.decode.select_pages``."""
    check_choice("share", share, SHARES)
    B, hq, nq = q.shape[:3]
    ps = cache.page_size
    means = expand_kv(cache.block_means(), hq)  # (B, Hq, npg, D)
    qbar = q.float().mean(dim=2)  # (B, Hq, D)
    s_hat = torch.einsum("bhd,bhpd->bhp", qbar, means)
    npg = means.shape[2]
    lens = cache.seq_lens.long()
    n_b = (lens + ps - 1) // ps
    first = None
    if window is not None:  # the page of the first key some query row sees (a huge w: capped, exact)
        first = (lens - nq - min(int(window), 1 << 62)).clamp(min=0) // ps
    sel = top_pages(s_hat, n_b, budget, max(cache.page_table.shape[1], npg), first)
    return share_selection(sel, cache.num_kv_heads) if share == "group" else sel


def share_selection(sel: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, W) bool -> the same shape, each query head's row the union (OR) of its kv group's rows."""
    B, hq, W = sel.shape
    return sel.view(B, hkv, hq // hkv, W).any(dim=2, keepdim=True).expand(B, hkv, hq // hkv, W).reshape(B, hq, W)


def top_pages(s_hat: torch.Tensor, n_b: torch.Tensor, budget: float, width: int,
              first: torch.Tensor | None = None) -> torch.Tensor:
    """(B, Hq, width) bool: per row of the (B, Hq, npg) scores ``s_hat``, the top
    ``k = clamp(round(f·n), 1, n)`` of its n candidate entries ``first ... n_b − 1`` (``first`` (B,), default 0;
    n = n_b − first), ties to the lower index (stable descending sort: NaN first, then +inf, ..., -inf; -0.0
    ties with +0.0); width >= npg."""
    B, _, npg = s_hat.shape
    n = n_b if first is None else n_b - first
    # budget_to_k(budget, n, causal=False) = clamp(round(f·n), 1, n), round half to even as Python's
    kk = torch.minimum(torch.round(n.double() * budget).long().clamp(min=1), n)
    j = torch.arange(npg, device=s_hat.device).view(1, 1, npg)
    valid = j < n_b.view(B, 1, 1)
    if first is not None:
        valid = valid & (j >= first.view(B, 1, 1))
    s_hat = s_hat.masked_fill(~valid, float("-inf"))
    order = torch.sort(s_hat, dim=-1, descending=True, stable=True).indices
    # the rank among the candidates: non-candidates (-inf) may precede candidates scoring -inf in the order
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, valid.expand_as(order).gather(-1, order).long().cumsum(-1) - 1)
    sel = (rank < kk.view(B, 1, 1)) & valid
    if width > npg:
        sel = torch.nn.functional.pad(sel, (0, width - npg), value=False)
    return sel


def decode_reference(q: torch.Tensor, cache: KVCache, *, scale: float, thrift_budget=None,
                     selection=None, window: int | None = None, sinks: torch.Tensor | None = None,
                     thrift_share: str = "group"):
    """The semantics above in PyTorch over ``cache.dequantize()`` (and its 16-bit copy for Thrift).
    ``window``: the sliding window's left extent w (``window_size=(w, 0)``) or None; ``sinks`` (Hq,):
    attention sinks (``fp4attn.attention``'s). ``selection`` (B, Hq, pages) bool: the pages each query head
    computes in 16 bits, used as given; else with ``thrift_budget`` ``thrift_select(..., share=thrift_share)``.

    q: (B, Hq, n_q, D) bhsd. Returns (out, lse) in float32 (float64 for float64 q)."""
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, hq, nq, D = q.shape
    k, v = cache.dequantize(cd)
    Lmax = k.shape[2]
    lens = torch.tensor(cache.lengths, device=q.device)
    comm = lens - lens % SLOT
    j = torch.arange(Lmax, device=q.device)
    raw = (j.view(1, -1) >= comm.view(-1, 1)).view(B, 1, 1, Lmax)  # the 16-bit tail
    thrift = thrift_budget is not None or selection is not None
    if thrift:
        if selection is None:
            selection = thrift_select(q, cache, thrift_budget, window, share=thrift_share)
        k16, v16 = (x.to(cd) for x in cache.dense_16bit())
        npg = -(-Lmax // cache.page_size)
        if selection.shape[-1] < npg:  # (select_pages' width: the page table's, whose last page may be tail only)
            selection = torch.nn.functional.pad(selection, (0, npg - selection.shape[-1]), value=False)
        sel_tok = selection[..., j // cache.page_size].unsqueeze(2)  # (B, Hq, 1, Lmax)
        use16 = raw | sel_tok
    else:
        k16, v16 = k, v  # only the tail is read from these, and it is raw in both
        use16 = raw.expand(B, hq, 1, Lmax)
    qx = q.to(cd)
    qf = fake_quantize_values(qx, "nvfp4", dim=-1).to(cd)
    s4 = scale * (qf @ expand_kv(k, hq).transpose(-1, -2))
    s16 = scale * (qx @ expand_kv(k16, hq).transpose(-1, -2))
    s = torch.where(use16, s16, s4)
    i = torch.arange(nq, device=q.device)
    last = lens.view(B, 1, 1) - nq + i.view(1, -1, 1)
    keep = j.view(1, 1, -1) <= last  # (B, nq, Lmax)
    if window is not None:
        keep &= j.view(1, 1, -1) >= last - window
    s = s.masked_fill(~keep.unsqueeze(1), float("-inf"))
    p, m, l = softmax_numerator(s, None if sinks is None else sinks.to(cd).view(1, hq, 1, 1))
    zero = torch.zeros_like(p)
    p4 = quantize_p(torch.where(use16, zero, p), "nvfp4", thrift)  # two-level (64-key tiles) for Thrift
    o = p4 @ expand_kv(v, hq) + torch.where(use16, p, zero) @ expand_kv(v16, hq)
    return normalize(o, l), lse_of(m, l)


def decode(q, cache: KVCache, *, scale=None, recipe: str = "nvfp4", thrift_budget=None, layout: str = "bhsd",
           return_lse: bool = False, num_splits: int | None = None, window_size=None, sinks=None,
           thrift_share: str = "group"):
    """Attend ``q`` (B, Hq, n_q <= 16, D) new query tokens to the NVFP4 KV ``cache``, which already
    holds their K/V (see the module docstring for the exact semantics).

    Args:
        q: (B, Hq, n_q, D) (``layout="bhsd"``) or (B, n_q, Hq, D) (``"bshd"``).
        cache: the layer's :class:`fp4attn.KVCache` (ragged lengths allowed).
        scale: softmax scale, default 1/sqrt(D).
        recipe: ``"nvfp4"``.
        thrift_budget: ThriftAttention fraction of pages computed in 16 bits (needs
            ``keep_16bit=True``), or None for pure FP4: the top ``clamp(round(f·n_w), 1, n_w)`` of the n_w
            candidate pages of each sequence and query head (all its pages, or with ``window_size`` those
            holding a key visible to some query row: see the module docstring). Combines with
            ``window_size`` and ``sinks``.
        thrift_share: with GQA, ``"group"`` (default): a query head also computes in 16 bits the pages the other
            heads of its kv group selected (read once for the group anyway: no extra memory traffic, lower error);
            ``"head"``: only its own top-k.
        return_lse: also return the log-sum-exp (B, Hq, n_q) float32.
        num_splits: flash-decoding splits along the context (CUDA; default: a heuristic).
        window_size: ``(w, 0)`` (or ``(w, -1)``): a sliding window, query i sees the keys
            ``L_b − n_q + i − w ... L_b − n_q + i``; only the pages it covers are read. With
            ``thrift_budget`` the selection runs over the pages of keys ``max(L_b − n_q − w, 0) ... L_b − 1``
            and the window masks the keys of the 16-bit and the FP4 pages alike.
        sinks: (Hq,) attention sinks (as :func:`fp4attn.attention`'s): one logit per query head that joins the
            softmax (its max and l) without a value; with ``thrift_budget`` the same, the selection unchanged.

    CUDA tensors run the flash-decoding kernels (:mod:`fp4attn.kernels.decode`; on Hopper the FP4 split
    loop is the Gluon kernel of :mod:`fp4attn.kernels.decode_gluon`, windows and sinks included; small Thrift
    steps run the fused Triton split kernel); CPU tensors the PyTorch reference.
    No autograd.
    """
    qb, scale, thrift_budget, window, sinks = _check(q, cache, scale, recipe, thrift_budget, layout, return_lse,
                                                     window_size, sinks, thrift_share)
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be a positive int or None, got {num_splits!r}")
    warn_no_autograd("decode", q, sinks)
    with torch.no_grad(), on_device(qb):
        # pages of any multiple of 16 tokens (the split kernels' key tiles divide the page); Thrift's 64-token
        # blocks need pages of multiples of 64. Any head dim of the cache (a multiple of 16): the kernels pad
        # their tiles to a power of two
        kernel_ok = (use_kernels(qb) and qb.dtype != torch.float64
                     and cache.page_size % (16 if thrift_budget is None else 64) == 0)
        if kernel_ok:
            from ..kernels.decode import decode_fwd, select_pages
            qb = qb.contiguous()
            # the selection by two Triton kernels (thrift_select's semantics, a few µs instead of ~40 ops)
            sel = (select_pages(qb, cache, thrift_budget, window=window, share=thrift_share)
                   if thrift_budget is not None else None)
            # (a selection shared by the kv group, or one head per group: a selected page is one 16-bit tile)
            group_sel = thrift_share == "group" or qb.shape[1] == cache.num_kv_heads
            out, lse = decode_fwd(qb, cache, scale=scale, selection=sel, num_splits=num_splits, window=window,
                                  sinks=sinks, group_sel=group_sel)
        else:
            out, lse = decode_reference(qb, cache, scale=scale, thrift_budget=thrift_budget, window=window,
                                        sinks=sinks, thrift_share=thrift_share)
    out = out.to(q.dtype)
    if layout == "bshd":
        out = out.transpose(1, 2)
    out = out.contiguous()
    return (out, lse.float().contiguous()) if return_lse else out


__all__ = ["decode", "decode_reference", "share_selection", "thrift_select"]
