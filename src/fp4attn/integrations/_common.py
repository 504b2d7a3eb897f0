"""Shared pieces of the integrations: which fp4attn op runs, and how an attention mask is expressed
with ops that only know ``causal=True/False`` (bottom-right aligned).

Mask plan. A boolean mask ``allowed (B or 1, H or 1, Nq, Nk)`` is split into *runs* of consecutive
query rows, each answered by one op call on a contiguous key span:

* a **causal run**: rows r0..r1-1 whose visible keys are [a, b_r] with b_r growing by one per row
  (``causal=True`` on keys a..b_{r1-1}; bottom-right alignment makes this exact);
* a **full run**: rows that all see the same key span [a, b] (``causal=False``);
* rows that see no key give zeros.

A **sliding window** (transformers' ``sliding_window``: Mistral, Gemma, ...) is recognized before the runs:
rows that see keys max(a, p − left) .. p (p = i + Nk − Nq, bottom-right; keys before a are padding) become
one call of the op with ``window_size=(left, 0)`` on keys a.. (the inference ops, Thrift and Attn-QAT skip the
key tiles outside the window).

A padded batch (left or right padding, causal or bidirectional) becomes one or two runs per
sequence, and each sequence is computed exactly as if it were run alone, unpadded: the FP4 blocks
of V and P start at the sequence's first real key, so padding never changes a real token's output.
Rows whose visible keys are not contiguous are grouped by key set and run non-causally on the
gathered keys (exact masking semantics; FP4 blocks follow the gathered order; slower, warned once).
"""

from __future__ import annotations

import warnings

import torch

from ..reference.common import causal_keep, window_keep

RECIPES = ("nvfp4", "mxfp4", "sage3", "bf16", "thrift")
MODES = ("auto", "qat", "infer")

_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def reset_warnings() -> None:
    """Forget which warnings were shown (tests)."""
    _warned.clear()


def check_recipe_mode(recipe: str, mode: str) -> None:
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def qat_fmt(recipe: str, op_kwargs: dict) -> str:
    """The FP4 format Attn-QAT trains with for an inference recipe (sage3 and thrift: NVFP4)."""
    if recipe in ("nvfp4", "mxfp4"):
        return recipe
    return op_kwargs.get("fmt", "nvfp4")


def make_op(recipe: str, op_kwargs: dict):
    """``op(q, k, v, causal, scale, train, window=None) -> out`` on bhsd tensors (GQA allowed).
    ``window``: ``fp4attn.attention``'s normalized ``window_size`` (left, right). ``sinks`` (Hq,): attention
    sinks (trainable through Attn-QAT).

    ``train=True``: :func:`fp4attn.attn_qat` (autograd; fake-quantized forward, Algorithm-3
    backward), or exact differentiable attention for ``recipe="bf16"``. ``train=False``: the
    inference op (:func:`fp4attn.attention` with the recipe, or :func:`fp4attn.thrift_attention`),
    which has no autograd.
    """
    import fp4attn

    qat_only = ("high_precision_o", "quantize_p_in_backward", "backward")  # (Attn-QAT's ablations: training only)
    infer_kw = {k: v for k, v in op_kwargs.items() if k not in qat_only}
    qat_kw = {k: v for k, v in op_kwargs.items() if k in qat_only}
    fmt = qat_fmt(recipe, op_kwargs)
    if recipe != "thrift":
        infer_kw.pop("fmt", None)

    def op(q, k, v, causal: bool, scale, train: bool, window=None, sinks=None):
        wkw = {} if window is None else {"window_size": window}
        if sinks is not None:
            wkw["sinks"] = sinks
        if train:
            if recipe == "bf16":
                return _exact_attention(q, k, v, causal, scale, window, sinks)
            return fp4attn.attn_qat(q, k, v, causal=causal, scale=scale, fmt=fmt, **wkw, **qat_kw)
        with torch.no_grad():  # (no autograd: the integrations say so themselves, in their terms)
            if recipe == "thrift":
                return fp4attn.thrift_attention(q, k, v, causal=causal, scale=scale, **wkw, **infer_kw)
            return fp4attn.attention(q, k, v, causal=causal, scale=scale, recipe=recipe, **wkw, **infer_kw)

    return op


def _exact_attention(q, k, v, causal, scale, window=None, sinks=None):
    """Differentiable unquantized attention (bottom-right causal, GQA, a normalized sliding ``window``) with
    PyTorch SDPA; with attention ``sinks`` (Hq,), materialized (softmax over the scores and the sink column)."""
    hq, hkv = q.shape[1], k.shape[1]
    if hq != hkv:
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    sdpa = _ORIGINAL_SDPA
    if window is None and sinks is None and nq == nk:
        return sdpa(q, k, v, is_causal=causal, scale=scale)  # (top-left = bottom-right when Nq == Nk)
    keep = window_keep(0, nq, nq, nk, causal and nq > 1, window, q.device)  # bottom-right; None: all visible
    if sinks is None:
        return sdpa(q, k, v, attn_mask=keep, scale=scale)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    sk = sinks.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sk], -1), -1)[..., :-1] @ v


# captured at import, so that the SDPA patch never routes fp4attn's own exact path to itself
_ORIGINAL_SDPA = torch.nn.functional.scaled_dot_product_attention


# -------------------------------------------------------------------------------------------------
# masks
# -------------------------------------------------------------------------------------------------
def additive_to_bool(mask: torch.Tensor):
    """An additive float mask -> boolean ``allowed``, or None when it carries real biases (values
    other than 0 on allowed positions), which no fp4attn op can express."""
    if mask.dtype == torch.bool:
        return mask
    neg = torch.finfo(mask.dtype).min / 2 if mask.dtype.is_floating_point else -1e30
    allowed = mask > neg
    if bool((mask.masked_fill(~allowed, 0) != 0).any()):
        return None
    return allowed


def bool_to_additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True: visible) as the additive one eager attention adds to its scores (0 / dtype min)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def _row_spans(m: torch.Tensor):
    """Per row of an (Nq, Nk) boolean mask: (count, first, last) visible key."""
    nk = m.shape[-1]
    return m.sum(-1), m.int().argmax(-1), nk - 1 - m.flip(-1).int().argmax(-1)


def sliding_window_of(m: torch.Tensor):
    """(r0, a, left) when the (Nq, Nk) mask ``m`` is a causal sliding window over keys a..: rows r >= r0
    see keys max(a, p − left) .. p with p = r + Nk − Nq, rows before r0 see none, and the window binds
    (some row sees fewer keys than causal would give it); else None. a > 0 only for padding (keys before
    the first row's window start that no row sees)."""
    nq, nk = m.shape
    cnt, first, last = _row_spans(m)
    seen = cnt > 0
    if not bool(seen.any()):
        return None
    r0 = int(seen.int().argmax())
    rows = torch.arange(nq, device=m.device)
    p = rows + (nk - nq)
    left = int((last - first)[seen].max())
    # keys before a: padding (its first row sees from a, not from where the window starts), else 0, so that
    # the call keeps the sequence's own quantization blocks
    a = int(first[r0]) if int(first[r0]) > int(p[r0]) - left else 0
    ok = (bool(seen[r0:].all()) and bool((last[r0:] == p[r0:]).all()) and bool((cnt == last - first + 1)[r0:].all())
          and bool((first[r0:] == torch.clamp(p[r0:] - left, min=a)).all()))
    if not ok or bool((first[r0:] == a).all()):  # not a window, or one that never binds (plain causal)
        return None
    return r0, a, left


def _row_runs(m: torch.Tensor):
    """Runs for one (Nq, Nk) boolean mask: list of (r0, r1, a, b_end, causal), b_end exclusive;
    None when some row's visible keys are not contiguous."""
    cnt, first, last = _row_spans(m)
    if bool(((cnt > 0) & (cnt != last - first + 1)).any()):
        return None
    runs = []
    cur = None  # [r0, r1, a, b_last, kind] kind: None (single row), "causal", "full"
    for r, (c, a, b) in enumerate(zip(cnt.tolist(), first.tolist(), last.tolist())):
        if c == 0:
            if cur is not None:
                runs.append(cur)
                cur = None
            continue
        if cur is not None and cur[1] == r and a == cur[2]:
            if b == cur[3] + 1 and cur[4] in (None, "causal"):
                cur[1], cur[3], cur[4] = r + 1, b, "causal"
                continue
            if b == cur[3] and cur[4] in (None, "full"):
                cur[1], cur[4] = r + 1, "full"
                continue
        if cur is not None:
            runs.append(cur)
        cur = [r, r + 1, a, b, None]
    if cur is not None:
        runs.append(cur)
    # a single-row run is "full" (one query row, its key span, no mask inside)
    return [(r0, r1, a, b + 1, kind == "causal") for r0, r1, a, b, kind in runs]


def masked_attention(op, q, k, v, allowed: torch.Tensor, scale, train: bool, many_calls: int = 64, sinks=None):
    """Attention of bhsd q, k, v under a boolean mask ``allowed`` broadcastable to (B, Hq, Nq, Nk),
    through ``op`` (see :func:`make_op`; ``sinks`` (Hq,) go to every call). Returns (B, Hq, Nq, Dv) in q's
    dtype."""
    B, hq, nq, _ = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    g = hq // hkv
    if allowed.dim() != 4:
        allowed = allowed.reshape((1,) * (4 - allowed.dim()) + tuple(allowed.shape))
    allowed = allowed.to(q.device)
    if allowed.shape[1] > 1 and bool((allowed == allowed[:, :1]).all()):
        allowed = allowed[:, :1]
    if allowed.shape[0] > 1 and bool((allowed == allowed[:1]).all()):
        allowed = allowed[:1]
    mb, mh = allowed.shape[0], allowed.shape[1]
    allowed = allowed.expand(mb, mh, nq, nk)
    # whole-tensor fast paths
    if mb == 1 and mh == 1:
        m = allowed[0, 0]
        if bool(m.all()):
            return op(q, k, v, False, scale, train, sinks=sinks)
        if bool((m == causal_keep(0, nq, nq, nk, m.device)).all()):
            return op(q, k, v, True, scale, train, sinks=sinks)
    out = q.new_zeros(B, hq, nq, v.shape[-1])
    units = [(b, h) for b in range(mb) for h in range(mh)]
    calls = 0
    for b, h in units:
        bs = slice(None) if mb == 1 else slice(b, b + 1)
        hs_q = slice(None) if mh == 1 else slice(h, h + 1)
        hs_k = slice(None) if mh == 1 else slice(h // g, h // g + 1)
        qu, ku, vu = q[bs, hs_q], k[bs, hs_k], v[bs, hs_k]
        su = None if sinks is None else sinks[hs_q]
        m = allowed[b, h]
        win = sliding_window_of(m)
        if win is not None:  # one windowed call on keys a.. (rows r0.. keep their bottom-right positions)
            r0, a, left = win
            res = op(qu[:, :, r0:], ku[:, :, a:], vu[:, :, a:], True, scale, train, window=(left, 0), sinks=su)
            out[bs, hs_q, r0:] = res.to(out.dtype)
            calls += 1
            continue
        runs = _row_runs(m)
        if runs is None:
            warn_once("gather", "fp4attn: attention mask with non-contiguous visible keys: running each group "
                      "of query rows on its gathered keys (exact masking; slower; FP4 blocks follow the "
                      "gathered key order)")
            keysets: dict[bytes, list[int]] = {}
            for r in range(nq):
                keysets.setdefault(m[r].cpu().numpy().tobytes(), []).append(r)
            for rows in keysets.values():
                idx = m[rows[0]].nonzero().flatten()
                if idx.numel() == 0:
                    continue
                rows_t = torch.tensor(rows, device=q.device)
                res = op(qu[:, :, rows_t], ku[:, :, idx], vu[:, :, idx], False, scale, train, sinks=su)
                out[bs, hs_q, rows_t] = res.to(out.dtype)
                calls += 1
            continue
        for r0, r1, a, e, causal in runs:
            res = op(qu[:, :, r0:r1], ku[:, :, a:e], vu[:, :, a:e], causal, scale, train, sinks=su)
            out[bs, hs_q, r0:r1] = res.to(out.dtype)
            calls += 1
    if calls > many_calls:
        warn_once("many_calls", f"fp4attn: this attention mask needed {calls} op calls per layer (e.g. sliding "
                  "windows or many distinct padding patterns); results are exact but slow")
    return out
