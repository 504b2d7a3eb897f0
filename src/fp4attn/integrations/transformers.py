"""fp4attn as a 🤗 transformers (≥ 5) attention implementation.

```python
import fp4attn.integrations.transformers as fp4hf
name = fp4hf.register("nvfp4")                  # -> "fp4attn_nvfp4"
model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
# or: model.set_attn_implementation(name)
```

:func:`register` adds an ``AttentionInterface`` function and, under the same name, the matching
mask function (transformers' boolean SDPA-style mask, which is ``None`` whenever a plain causal or
full mask suffices). What runs:

* ``mode="auto"``: :func:`fp4attn.attn_qat` while the attention module is in training mode
  (Attn-QAT: fake-quantized FP4 forward, Algorithm-3 backward), the inference op in eval mode:
  :func:`fp4attn.attention` with ``recipe`` (``nvfp4`` / ``mxfp4`` / ``sage3`` / ``bf16``) or
  :func:`fp4attn.thrift_attention` for ``recipe="thrift"``. ``"qat"`` / ``"infer"`` force one.
  Training with ``recipe="bf16"`` runs exact (differentiable) attention; Attn-QAT for ``sage3`` and
  ``thrift`` trains with NVFP4 (their inference formats).
* GQA: K and V are passed un-repeated (the ops do GQA natively).
* Masks: ``None`` → ``is_causal`` exactly as transformers' SDPA path (module's ``is_causal``,
  no causal mask for a single query; keys cropped to the queries for a static-cache prefill).
  Boolean or additive (0 / -inf or dtype-min) masks: a pure causal mask → ``causal=True``, an
  all-visible mask → ``causal=False``, padding → one call per sequence on its real tokens (each
  sequence computed exactly as if it were alone, unpadded), other patterns → exact, slower
  per-row-group calls (see :mod:`fp4attn.integrations._common`). Masks are never ignored.
* Sliding windows (``sliding_window=w``: Mistral, Gemma 2/3 local layers, Qwen2, ...): one call of the
  inference op with ``window_size=(w - 1, 0)`` (key tiles outside the window skipped), recognized from the
  mask or, where transformers passes none (keys fewer than w, or a captured decode step), from the
  ``sliding_window`` argument / the module's ``sliding_window``; decode steps on an :func:`fp4_cache` read
  only the window's pages (``fp4attn.decode(..., window_size=(w - 1, 0))``); training runs
  :func:`fp4attn.attn_qat` with the window; ``recipe="thrift"`` runs :func:`fp4attn.thrift_attention` with it
  (its top-k among the window's key blocks).
* The inference op has no autograd: calling an eval-mode model with gradients enabled warns once
  that no gradient flows through attention (``torch.no_grad()`` / ``torch.inference_mode()`` for
  inference, ``model.train()`` or ``mode="qat"`` to train).
* Arguments no fp4attn op can honour — dropout > 0, additive masks with real biases (ALiBi-like),
  ``position_bias``, value head dim ≠ query head dim or > 256 — fall back to transformers' own
  ``sdpa`` implementation (full precision); ``softcap`` to the model's own ``eager_attention_forward``; with a
  warning once per reason.
  ``output_attentions`` is not supported (weights are returned as ``None``, warned once).
* Attention sinks (gpt-oss's ``s_aux``): ``fp4attn.attention(..., sinks=)``,
  ``fp4attn.thrift_attention(..., sinks=)`` and ``fp4attn.decode(..., sinks=)`` at inference,
  ``fp4attn.attn_qat(..., sinks=)`` in training (the sinks get their gradient), with the layer's sliding window
  where it has one.
* Generation: by default transformers' ``DynamicCache`` keeps K and V in the model's dtype (BF16
  for a BF16 model) and each step's attention runs through the FP4 op. :func:`fp4_cache` returns an
  :class:`FP4Cache` (a transformers ``Cache``) whose layers store K and V as NVFP4 in an
  :class:`fp4attn.KVCache` (``model.generate(..., past_key_values=fp4_cache())``); with it, decode
  steps (≤ 16 new tokens, no padding mask, recipe ``nvfp4`` or ``thrift``) run
  :func:`fp4attn.decode` on the NVFP4 pages directly; the prompt (a layer's first update) runs the op on its
  own K/V, and every other call on the dequantized cache (``register(..., prefill="sdpa")``: transformers'
  sdpa instead of the op for all of those). Once an fp4attn attention function has read a layer, that layer's ``update``
  returns zero-stride placeholders instead of dequantizing the whole cache every step (the attention
  function dequantizes itself when it cannot decode from the pages). With another attention implementation
  the layer keeps returning dense K and V. Either way the layer keeps no dense copy (``layer.keys`` /
  ``layer.values`` are placeholders; ``layer.kv`` is the :class:`fp4attn.KVCache`).
* Speculative decoding (``generate(..., assistant_model=...)`` or ``prompt_lookup_num_tokens=``) on an
  :func:`fp4_cache`: the verification step's queries decode from the pages (also when transformers passes a
  materialized mask that is bottom-right causal on every row), and the rejected draft tokens are dropped exactly
  by ``FP4Cache.crop`` (:meth:`fp4attn.KVCache.crop`; the cache layers record multi-token appends for it).
"""

from __future__ import annotations

import inspect
import math
import weakref

import torch

from ..reference.common import causal_keep, window_keep
from ._common import (
    additive_to_bool,
    bool_to_additive,
    check_recipe_mode,
    make_op,
    masked_attention,
    sliding_window_of,
    warn_once,
)

# FP4Cache: lazy (needs transformers)
__all__ = ["register", "registered", "make_attention_function", "fp4_cache", "generate", "greedy_generate"]

_REGISTERED: dict[str, dict] = {}


def _default_name(recipe: str, mode: str, op_kwargs: dict) -> str:
    name = f"fp4attn_{recipe}" + ("" if mode == "auto" else f"_{mode}")
    for k in sorted(op_kwargs):
        name += f"_{k}{op_kwargs[k]}".replace(".", "p")
    return name


def registered() -> dict[str, dict]:
    """{name: {"recipe", "mode", "op_kwargs"}} of the implementations registered by this process."""
    return {k: dict(v) for k, v in _REGISTERED.items()}


def _fallback(module, query, key, value, attention_mask, scaling, dropout, is_causal, kwargs, reason, eager):
    """Full-precision attention for a call fp4attn cannot honour (``reason``, warned once): transformers'
    ``sdpa``, or the model's own ``eager_attention_forward`` for features only eager implements (softcap,
    sinks). ``reason=None``: sdpa by choice (``prefill="sdpa"``), no warning."""
    window = _hf_window(kwargs, is_causal, module)
    if attention_mask is None and (eager or window is not None):
        # transformers' sdpa mask function left the mask out (causal through is_causal; a sliding window when the
        # keys are fewer, or under capture): eager attention, and sdpa with a window, need it written out
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        S, T = query.shape[2], key.shape[2]
        keep = window_keep(0, S, S, T, bool(causal) and S > 1, window, query.device)
        attention_mask = None if keep is None else keep[None, None]
    if eager:
        import sys
        fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
        if fn is None:
            raise NotImplementedError(f"fp4attn (transformers): {reason}, and {type(module).__name__}'s module has "
                                      "no eager_attention_forward to fall back to")
        if reason is not None:
            warn_once(f"hf:{reason}", f"fp4attn (transformers): {reason}; this call runs the model's "
                      "full-precision eager attention instead of FP4")
        if attention_mask is not None and attention_mask.dtype == torch.bool:  # eager adds its mask to S
            attention_mask = bool_to_additive(attention_mask, query.dtype)
        return fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if reason is not None:
        warn_once(f"hf:{reason}", f"fp4attn (transformers): {reason}; this call runs transformers' full-precision "
                  "'sdpa' attention instead of FP4")
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _hf_window(kwargs: dict, is_causal, module):
    """The normalized ``window_size`` (w - 1, 0) of a causal sliding-window layer: transformers'
    ``sliding_window=w`` argument (Mistral, Qwen2, Gemma 2/3, ... pass it to the attention function), else
    the module's ``sliding_window`` attribute; None for full attention or bidirectional layers."""
    left = _left_extent(kwargs.get("sliding_window", getattr(module, "sliding_window", None)))
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return (left, 0) if left is not None and causal else None


def _left_extent(sliding_window):
    """transformers' ``sliding_window=w`` (key j visible from query q iff q − w < j <= q) as fp4attn's left
    extent w − 1 (``window_size=(w − 1, 0)``, ``KVCache(window=w − 1)``); None if it is not a positive int."""
    sw = sliding_window
    return sw - 1 if isinstance(sw, int) and not isinstance(sw, bool) and sw > 0 else None


def _ragged_mask(lengths, S: int, T: int, window, device) -> torch.Tensor:
    """(B, 1, S, T) bool mask of a cache whose sequences have different ``lengths`` (their keys in slots 0 .. L_b - 1,
    zeros after): sequence b's S new queries are its last S tokens, each with the keys the ops' own mask gives it
    over its L_b keys (``window_keep``: bottom-right causal, as ``fp4attn.decode``, and the sliding ``window``)."""
    keep = torch.zeros(len(lengths), 1, S, T, dtype=torch.bool, device=device)
    for b, L in enumerate(lengths):
        keep[b, 0, :, :L] = window_keep(0, S, S, L, True, window, device)
    return keep


def _dense_kv(kv, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The dense (B, Hkv, T, D) K and V of an :class:`fp4attn.KVCache`, in ``dtype``: its 16-bit copy where it
    keeps one (Thrift's 16-bit blocks then see the values that came in, as in the prompt), else dequantized."""
    if kv.keep_16bit:
        k, v = kv.dense_16bit()
        return k.to(dtype), v.to(dtype)
    return kv.dequantize(dtype)


def make_attention_function(recipe: str = "nvfp4", mode: str = "auto", prefill: str = "fp4", **op_kwargs):
    """The ``AttentionInterface`` function :func:`register` registers (usable on its own)."""
    check_recipe_mode(recipe, mode)
    if prefill not in ("fp4", "sdpa"):
        raise ValueError(f"prefill must be 'fp4' or 'sdpa', got {prefill!r}")
    op = make_op(recipe, op_kwargs)

    def fp4attn_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                  value: torch.Tensor, attention_mask: torch.Tensor | None,
                                  scaling: float | None = None, dropout: float = 0.0,
                                  is_causal: bool | None = None, **kwargs):
        """(B, Hq, S, D) query, (B, Hkv, T, D) key/value -> ((B, S, Hq, D) contiguous, None)."""
        if kwargs.get("output_attentions", False):
            warn_once("hf:output_attentions", "fp4attn (transformers): output_attentions is not supported; "
                      "attention weights are returned as None")
        kv = getattr(key, "_fp4attn_kvcache", None)
        if kv is not None:
            kv.fp4attn_reads_pages = True  # the layer's next updates may return placeholders (FP4CacheLayer)
        placeholder = getattr(key, "_fp4attn_placeholder", False)
        train = module.training if mode == "auto" else mode == "qat"
        sinks = kwargs.get("s_aux", kwargs.get("sinks"))  # gpt-oss: one logit per query head
        reason, eager = None, False
        if dropout and dropout > 0:
            reason = f"dropout={dropout} is not supported by fp4attn ops"
        elif kwargs.get("position_bias") is not None:
            reason = "position_bias (additive score bias) is not supported by fp4attn ops"
        elif kwargs.get("softcap") is not None:
            reason, eager = "softcap is not supported by fp4attn ops", True
        elif value.shape[-1] != query.shape[-1] or query.shape[-1] > 256:
            reason = f"head dims q={query.shape[-1]} v={value.shape[-1]} (need equal and <= 256)"
        elif query.shape[1] % key.shape[1]:
            reason = f"{query.shape[1]} query heads not a multiple of {key.shape[1]} key/value heads"
        # a batch of sequences of different lengths (FP4Cache.cat: prompts prefilled one at a time): sequence b's
        # keys are its first L_b cache slots and its new queries its last ones; transformers' mask, built for the
        # longest, describes none of the others, so it is rebuilt from the lengths (``_ragged_mask``) wherever a
        # call does not decode from the pages (fp4attn.decode takes each sequence's length itself)
        ragged = kv is not None and len(set(kv.lengths)) > 1
        allowed = None
        if reason is None and attention_mask is not None and not ragged:
            allowed = additive_to_bool(attention_mask[..., : key.shape[2]])
            if allowed is None:
                reason = "additive attention mask with non-zero biases on visible positions"
        if reason is not None:
            if placeholder:
                key, value = _dense_kv(kv, key.dtype)
            if ragged:
                attention_mask = _ragged_mask(kv.lengths, query.shape[2], key.shape[2],
                                              _hf_window(kwargs, is_causal, module), query.device)
            return _fallback(module, query, key, value, attention_mask, scaling, dropout, is_causal, kwargs,
                             reason, eager or sinks is not None)  # (sdpa has no sinks)

        groups = getattr(module, "num_key_value_groups", None)
        if groups is not None and query.shape[1] != key.shape[1] * groups:
            raise ValueError(f"fp4attn (transformers): {query.shape[1]} query heads, {key.shape[1]} key/value "
                             f"heads but module.num_key_value_groups={groups}")
        if not train and torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
            warn_once("hf:eval_grad", "fp4attn (transformers): the inference op has no autograd, so no gradient "
                      "flows through this attention (module in eval mode or mode='infer'); use model.train() "
                      "with mode='auto', or mode='qat', to train, or torch.no_grad() to silence this")

        S, T = query.shape[2], key.shape[2]
        window = _hf_window(kwargs, is_causal, module)
        decodable = (kv is not None and not train and recipe in ("nvfp4", "thrift") and S <= 16
                     and T == kv.get_seq_length() and (S == 1 or is_causal is not False)
                     and (recipe == "nvfp4" or kv.keep_16bit))
        dec_window = window if allowed is None else None
        if decodable and allowed is not None and window is not None:
            # a sliding-window decode step's mask (the same for every sequence, no padding): the window's pages
            # alone, each sequence's window ending at its own length (a ragged batch of prompts prefilled one
            # at a time: transformers' mask, built for the longest, does not describe the others)
            win = (sliding_window_of(allowed[0, 0]) if allowed.shape[1] == 1 and allowed.shape[0] >= 1
                   and bool((allowed == allowed[:1]).all()) else None)
            if win is not None and win[:2] == (0, 0):
                dec_window = (win[2], 0)
        # a materialized mask that is bottom-right causal on every row (no padding): a decode step like one without
        # a mask (transformers builds one for a speculative step's verification: several queries over a cache)
        plain = (decodable and allowed is not None and window is None and len(set(kv.lengths)) == 1
                 and _bottom_right_causal(attention_mask, allowed))
        if decodable and (allowed is None or dec_window is not None or plain):
            import fp4attn
            budget = op_kwargs.get("budget", 0.05) if recipe == "thrift" else None
            with torch.no_grad():  # (the inference op: warned above, in the integration's terms)
                out = fp4attn.decode(query, kv, scale=scaling, thrift_budget=budget, window_size=dec_window,
                                     sinks=sinks)
            return out.transpose(1, 2).contiguous(), None
        if placeholder:  # (a prompt's first update returns its own, unquantized K/V)
            key, value = _dense_kv(kv, key.dtype)
        if ragged:
            allowed = _ragged_mask(kv.lengths, S, T, window, query.device)
            attention_mask = allowed
        if prefill == "sdpa" and not train:  # every call but a decode from the pages: full precision
            return _fallback(module, query, key, value, attention_mask, scaling, dropout, is_causal, kwargs, None,
                             sinks is not None)
        if allowed is None:
            causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
            causal = bool(causal) and S > 1
            if causal and T > S:
                # as transformers' sdpa path: a static-cache prefill (the keys past the queries are empty
                # slots); SDPA's top-left causal mask on the first S keys
                key, value = key[:, :, :S], value[:, :, :S]
            out = op(query, key, value, causal or window is not None, scaling, train, window=window, sinks=sinks)
        else:
            out = masked_attention(op, query, key, value, allowed, scaling, train, sinks=sinks)
        return out.transpose(1, 2).contiguous(), None

    fp4attn_attention_forward.fp4attn_config = dict(recipe=recipe, mode=mode, prefill=prefill,
                                                    op_kwargs=dict(op_kwargs))
    return fp4attn_attention_forward


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_BR_MEMO: list = [None, None, None]  # (weak reference to the last mask, its version and shape, the answer)


def _bottom_right_causal(mask: torch.Tensor, allowed: torch.Tensor) -> bool:
    """Whether every (S, T) plane of the boolean ``allowed`` (derived from ``mask``) is bottom-right causal: query
    i sees keys 0 .. T - S + i. One host sync per mask (the layers of a forward share it); False under CUDA-graph
    capture (no sync there; ``_mask_function`` leaves such masks ``None`` while capturing)."""
    if _capturing():
        return False
    key = (mask._version, tuple(allowed.shape))
    ref, k0, res = _BR_MEMO
    if ref is not None and ref() is mask and k0 == key:
        return res
    S, T = allowed.shape[-2:]
    res = bool((allowed == causal_keep(0, S, S, T, allowed.device)).all())
    _BR_MEMO[:] = [weakref.ref(mask), key, res]
    return res


def _mask_function(sdpa_mask):
    """transformers' ``sdpa_mask``, except while a CUDA graph is being captured: transformers counts stream
    capture as tracing and then materializes even the mask of a decode step without padding, which would send
    fp4attn's attention function to its dense path (which cannot run under capture). A causal mask of 1..16
    new tokens with no padding mask and no sliding window is returned as ``None`` there, as transformers does
    eagerly: the attention function then decodes from the FP4 pages (bottom-right causal among the new tokens).
    The same for a causal sliding window (``local_size`` w, the mask function checked on probe points to be
    transformers' sliding-window causal one): the attention function takes the window from the layer's
    ``sliding_window`` (see ``_hf_window``). Every other call, and every call outside capture, is
    ``sdpa_mask``'s."""
    from transformers.masking_utils import causal_mask_function

    def fp4attn_mask(*args, **kwargs):
        if _capturing() and not args:
            q_len = kwargs.get("q_length")
            if q_len is None and kwargs.get("cache_position") is not None:  # transformers < 5.2x
                q_len = kwargs["cache_position"].shape[0]
            local = kwargs.get("local_size", kwargs.get("local_attention_size"))
            fn = kwargs.get("mask_function")
            if (isinstance(q_len, int) and 1 <= q_len <= 16 and kwargs.get("attention_mask") is None
                    and kwargs.get("allow_is_causal_skip", True)
                    and (fn is causal_mask_function if local is None else _is_sliding_causal(fn, local))):
                return None
        return sdpa_mask(*args, **kwargs)
    return fp4attn_mask


def _is_sliding_causal(fn, w) -> bool:
    """Whether transformers mask function ``fn(batch, head, q_idx, kv_idx)`` is the causal sliding window of
    ``w`` keys (key j visible from query q iff q - w < j <= q), checked on the points that tell it from a
    causal, a bidirectional or a chunked mask."""
    if not isinstance(w, int) or w <= 0:
        return False
    q = torch.tensor([w + 5, w + 5, w + 5, w + 5, 5, 2 * w + 3])
    j = torch.tensor([5, 6, w + 5, w + 6, 6, w + 4])
    want = (j > q - w) & (j <= q)
    try:
        got = torch.stack([torch.as_tensor(fn(torch.tensor(0), torch.tensor(0), qi, ji)) for qi, ji in zip(q, j)])
    except Exception:  # noqa: BLE001 - a mask function we cannot evaluate is not one we recognize
        return False
    return bool(torch.equal(got.bool().flatten(), want))


def register(recipe: str = "nvfp4", name: str | None = None, mode: str = "auto", prefill: str = "fp4",
             **op_kwargs) -> str:
    """Register fp4attn with transformers' ``AttentionInterface`` and ``AttentionMaskInterface``.

    Args:
        recipe: ``"nvfp4"``, ``"mxfp4"``, ``"sage3"``, ``"bf16"`` or ``"thrift"``.
        name: the ``attn_implementation`` name (default ``fp4attn_<recipe>[_<mode>]``).
        mode: ``"auto"`` (Attn-QAT in training mode, inference op in eval), ``"qat"``, ``"infer"``.
        prefill: ``"fp4"``, or ``"sdpa"``: at inference only the decode steps that read an :func:`fp4_cache`'s
            FP4 pages run fp4attn (``nvfp4`` / ``thrift`` decode); every other call (the prompt, masked or
            padded steps) runs transformers' full-precision ``sdpa`` on the K/V it was given (a prompt's own
            K/V, unquantized). FP4 KV-cache memory and decode speed with prefill at cuDNN/flash speed and
            accuracy: the FP4 attention kernels are no faster than cuDNN's bf16 ones on Hopper.
        op_kwargs: passed on to the op, e.g. ``budget=0.1, block_size=64`` for thrift,
            ``two_level_p=True`` for the inference recipes, ``backward="naive"`` for Attn-QAT.

    Returns the name, for ``from_pretrained(..., attn_implementation=name)`` or
    ``model.set_attn_implementation(name)``.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("fp4attn.integrations.transformers needs transformers>=5: "
                          "pip install 'fp4attn[hf]'") from e
    check_recipe_mode(recipe, mode)
    name = name or _default_name(recipe, mode, op_kwargs) + ("" if prefill == "fp4" else f"_prefill{prefill}")
    if not isinstance(name, str) or not name or "|" in name or "/" in name:
        raise ValueError(f"name must be a non-empty string without '|' or '/', got {name!r}")
    AttentionInterface.register(name, make_attention_function(recipe, mode, prefill, **op_kwargs))
    AttentionMaskInterface.register(name, _mask_function(sdpa_mask))
    _REGISTERED[name] = dict(recipe=recipe, mode=mode, prefill=prefill, op_kwargs=dict(op_kwargs))
    return name


# -------------------------------------------------------------------------------------------------
# FP4 KV cache for generation
# -------------------------------------------------------------------------------------------------
def _transformers_version() -> tuple[int, int]:
    """(major, minor) of the installed transformers, also for dev / rc versions ("5.25.0.dev0", "5.24.0rc1")."""
    import transformers
    from packaging.version import Version

    return Version(transformers.__version__).release[:2]


def _cache_classes():
    from transformers.cache_utils import Cache, DynamicLayer

    from ..kvcache import KVCache

    class FP4CacheLayer(DynamicLayer):
        """One layer's K/V in an :class:`fp4attn.KVCache` (NVFP4 pages; the last ``len % 16`` tokens raw).

        The layer holds no dense copy: ``update`` returns the prompt's own K/V on its first call, then dense
        (dequantized) K/V or placeholders, to its caller without keeping them, and ``keys`` / ``values`` are
        zero-stride placeholders of the cache's shape (assignments to them are ignored; ``kv.dequantize()``
        gives the values). Kept, the dense K/V of a prefill stayed alive until the layer's next update: a B=64,
        32k-token prefill of a 16-layer model held 82 GiB instead of 18, more than the bf16 cache's 64.
        (Dequantizing on every read of ``keys`` instead made decode steps ~2x slower: transformers reads them
        during a step.)"""

        # crop() works (rolling back speculative decoding's rejected drafts), but transformers 5.2x up to 5.23 also
        # reads is_croppable to choose a generation loop that crops one-token steps, which a cache that quantizes
        # completed slots can undo only when it recorded them: kept False there, that loop is not chosen. From 5.24
        # that loop runs on mps devices only, and assisted decoding refuses a cache that is not croppable
        is_croppable = _transformers_version() >= (5, 24)
        record_past = False  # transformers' assisted generation sets it (activate_past_recording)

        def _placeholder(self):
            if self.kv is None:
                return None
            shape = (self.kv.batch_size, self.kv.num_kv_heads, self.kv.get_seq_length(), self.kv.head_dim)
            return torch.zeros((), dtype=self.dtype, device=self.kv.device).expand(shape)

        @property
        def keys(self):
            return self._placeholder()

        @keys.setter
        def keys(self, value):  # DynamicLayer's __init__ / lazy_initialization / reset: nothing to keep
            pass

        @property
        def values(self):
            return self._placeholder()

        @values.setter
        def values(self, value):
            pass

        def __init__(self, **kvcache_kwargs):
            super().__init__()
            self.kv = None
            self._kw = kvcache_kwargs

        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            self.dtype = key_states.dtype  # the placeholders' (DynamicLayer set it up to transformers 5.23, not 5.24)
            B, H, _, D = key_states.shape
            dtype = key_states.dtype if key_states.dtype in (torch.float16, torch.bfloat16, torch.float32) \
                else torch.float32
            self.kv = KVCache(B, H, D, dtype=dtype, device=key_states.device, **self._kw)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            first = self.kv.get_seq_length() == 0
            # keep what a crop of this append needs (see crop): when asked, and for the few-token appends of a
            # speculative step (whatever transformers' version asks)
            self.kv.record_past = self.record_past or (not first and 1 < key_states.shape[2] <= 64)
            if not first and self.kv.window is not None and key_states.shape[2] > 16:
                # a chunk of a sliding-window layer: its first queries read keys that the append may recycle
                # (the ring keeps window + 16), so the dense K/V are read first: the old ones (zeros where
                # gone: outside every window), then the chunk's own
                k_old, v_old = _dense_kv(self.kv, key_states.dtype)
                self.kv.append(key_states.detach(), value_states.detach())
                k, v = torch.cat([k_old, key_states], 2), torch.cat([v_old, value_states], 2)
                k._fp4attn_kvcache = self.kv
                return k, v
            self.kv.append(key_states.detach(), value_states.detach())
            if first:
                # the prompt: its own K/V, as they came (the pages hold their FP4 copy). Dequantizing the cache
                # instead cost a full pass per layer (3.9 ms of a 230 ms B=8, 4096-token prefill on an H200, per
                # layer); the FP4 attention ops quantize the same blocks to the same codes either way (the
                # cache's global scales are powers of two), up to E4M3 saturation.
                k, v = key_states, value_states
            elif getattr(self.kv, "fp4attn_reads_pages", False):
                # an fp4attn attention function reads this layer (it set the flag on an earlier call): it
                # decodes from the pages or dequantizes them itself, so no dense copy of the whole cache
                # per step; k and v are zero-stride placeholders of the right shape
                k, v = self._placeholder(), self._placeholder()
                k._fp4attn_placeholder = True
            else:  # another attention implementation: dense (dequantized) K and V
                k, v = _dense_kv(self.kv, key_states.dtype)
            k._fp4attn_kvcache = self.kv   # lets the fp4attn attention function decode from the pages
            return k, v

        def get_seq_length(self) -> int:
            return 0 if self.kv is None else self.kv.get_seq_length()

        def reorder_cache(self, beam_idx):
            if self.kv is not None:
                self.kv.reorder(beam_idx)

        def reset(self) -> None:
            self.kv = None
            super().reset()

        def activate_past_recording(self, **kwargs) -> None:
            """transformers' assisted generation: record each step's appends so that crop() can undo them (its
            keyword arguments, e.g. ``recurrent_states_to_keep``, concern recurrent layers)."""
            self.record_past = True

        def crop(self, tokens_to_remove: int) -> None:
            """Drop tokens (:meth:`fp4attn.KVCache.crop`): a negative or zero ``tokens_to_remove`` removes that many
            (transformers >= 5.2x), a positive one is the length to keep (earlier versions' ``max_length``)."""
            if self.kv is None:
                return
            L = self.kv.get_seq_length()
            t = int(tokens_to_remove)  # (a count computed on the device arrives as a tensor)
            n = -t if t <= 0 else max(0, L - t)
            self.kv.crop(n)

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.kv is not None and repeats != 1:
                raise NotImplementedError("FP4Cache: batch_repeat_interleave is not supported")

        def batch_select_indices(self, indices) -> None:
            raise NotImplementedError("FP4Cache: batch_select_indices is not supported")

    class FP4Cache(Cache):
        """A transformers ``Cache`` storing every layer's K and V as NVFP4 (:class:`fp4attn.KVCache`).

        ``kvcache_kwargs`` go to each layer's ``KVCache`` (``page_size``, ``keep_16bit=True`` for
        Thrift decode, ``scale_headroom``, …). :meth:`nbytes` is the storage of all layers. With the
        model's ``config``, the sliding-window layers (``sliding_window`` / ``layer_types``) keep only the
        pages their window reads (``KVCache(window=sliding_window - 1)``), as transformers'
        ``DynamicCache(config=...)`` keeps only the window's tokens (with ``keep_16bit``, their 16-bit copy too).
        """

        def __init__(self, config=None, **kvcache_kwargs):
            windows = _layer_windows(config) if config is not None else None
            self._record_past = False
            if windows is None:
                super().__init__(layer_class_to_replicate=lambda: self._new_layer(**kvcache_kwargs))
            else:
                super().__init__(layers=[FP4CacheLayer(window=w, **kvcache_kwargs) for w in windows])

        def _new_layer(self, **kvcache_kwargs):
            layer = FP4CacheLayer(**kvcache_kwargs)
            layer.record_past = self._record_past  # (a recording asked for before this layer existed)
            return layer

        def activate_past_recording(self, **kwargs) -> None:
            """Every layer records its appends (transformers' assisted generation), also the layers created later
            (without a config the layers appear on the first update)."""
            self._record_past = True
            super().activate_past_recording(**kwargs)

        def nbytes(self) -> int:
            return sum(layer.kv.nbytes for layer in self.layers if getattr(layer, "kv", None) is not None)

        @classmethod
        def cat(cls, caches, **kvcache_kwargs):
            """One cache holding the sequences of ``caches`` in order, layer by layer (:meth:`fp4attn.KVCache.cat`;
            e.g. prompts of different lengths prefilled one at a time, then decoded as one batch: each sequence
            keeps its own length, and fp4attn's decode attends each to its own tokens)."""
            caches = list(caches)
            if not caches or len({len(c.layers) for c in caches}) != 1:
                raise ValueError("caches must be a non-empty list of FP4Caches with the same number of layers")
            out = cls(**kvcache_kwargs)
            for i in range(len(caches[0].layers)):
                src = [c.layers[i] for c in caches]
                layer = FP4CacheLayer(**kvcache_kwargs)
                layer.kv = KVCache.cat([x.kv for x in src])
                layer.dtype, layer.device, layer.is_initialized = src[0].dtype, layer.kv.device, True
                out.layers.append(layer)
            return out

    return FP4CacheLayer, FP4Cache


_CLASSES = None


def __getattr__(name):
    global _CLASSES
    if name in ("FP4Cache", "FP4CacheLayer"):
        if _CLASSES is None:
            _CLASSES = _cache_classes()
        return _CLASSES[0] if name == "FP4CacheLayer" else _CLASSES[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fp4_cache(config=None, **kvcache_kwargs):
    """A new :class:`FP4Cache` for ``model.generate(..., past_key_values=fp4_cache(model.config))`` (use one per
    generate call). ``keep_16bit=True`` is needed for ``recipe="thrift"`` decode. ``config``: the model's, so
    that sliding-window layers keep only their window's pages (without it every layer keeps every token)."""
    return __getattr__("FP4Cache")(config, **kvcache_kwargs)


def _layer_windows(config) -> list:
    """Per decoder layer: the ``KVCache`` window (sliding_window - 1) of a sliding-window layer, else None."""
    c = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    n = getattr(c, "num_hidden_layers", None)
    if not isinstance(n, int):
        return None
    left = _left_extent(getattr(c, "sliding_window", None))
    types = getattr(c, "layer_types", None)
    if types is None:  # (Mistral) every layer slides, if the model has a window
        return [left] * n
    return [left if t == "sliding_attention" else None for t in types]


def cache_argument(model) -> str:
    """The name of the model's cache argument: ``cache`` from transformers 5.24 (``past_key_values`` is deprecated
    there), else ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eos_token_id=None, pad_token_id: int | None = None, generator: torch.Generator | None = None,
             attention_mask: torch.Tensor | None = None, cuda_graph: bool = True, **kvcache_kwargs) -> torch.Tensor:
    """Generate up to ``max_new_tokens`` tokens with an :func:`fp4_cache`, each decode step replayed from a CUDA
    graph: (B, L) token ids -> (B, L + n), n <= max_new_tokens.

    The tokens are those of transformers' ``model.generate(input_ids, max_new_tokens=..., do_sample=...,
    temperature=..., top_k=..., top_p=..., eos_token_id=..., pad_token_id=..., past_key_values=fp4_cache())``
    (greedy: the argmax; sampling: the logits in float32 divided by ``temperature``, the ``top_k`` largest kept,
    then the smallest set of tokens whose probability reaches ``top_p`` (at least one), one draw of
    ``torch.multinomial`` with ``generator``, the global one if None). With ``eos_token_id`` (an int or a list
    of ints) a sequence that has produced one is continued with ``pad_token_id`` (default: the first EOS id),
    and generation stops once every sequence has (one host sync per step); without it, there is none.

    The model must run an fp4attn ``nvfp4`` or ``thrift`` attention implementation (:func:`register`, then
    ``model.set_attn_implementation(name)``; ``thrift`` decodes with its 16-bit page selection, so its cache
    keeps a 16-bit copy: ``keep_16bit`` defaults to True there). Prompts of different lengths come padded (left
    or right) with an ``attention_mask`` of ones on their tokens: each prompt is then prefilled alone, its
    cache holds only its own tokens (:meth:`FP4Cache.cat`), and every new token of a sequence equals what the
    prompt alone would give (up to the order of float32 sums in batched kernels). The prompt and one decode
    step run eagerly (the second compiles the decode kernels and lets the cache layers return placeholders);
    every layer's :class:`fp4attn.KVCache` is then reserved for L + max_new_tokens tokens
    (:meth:`fp4attn.KVCache.reserve`), one step is captured and the rest are replays of it; the next token is
    chosen from the replay's logits outside the graph. ``cuda_graph=False`` runs the same steps eagerly (same
    reserved splits, so the same logits). Eagerly a decode step is paced by the host's per-layer work;
    replayed, by the GPU (a 16-layer Llama-like model on an H200, 4096-token prompt: 1.9-3.9 ms per token at
    B = 8-32, against 16-35 for thrift eagerly and 10.7-15.6 for transformers' ``generate()`` on its bf16
    cache, ``benchmarks/gen-s22``). ``kvcache_kwargs`` go to :func:`fp4_cache` (with the model's config: sliding-window
    layers keep only their window's pages).
    """
    cfg = getattr(getattr(model, "config", None), "_attn_implementation", None)
    reg = _REGISTERED.get(cfg)
    if reg is None or reg["recipe"] not in ("nvfp4", "thrift"):
        raise ValueError(f"model: its attention implementation must be an fp4attn 'nvfp4' or 'thrift' one registered "
                         f"with fp4attn.integrations.transformers.register(recipe), got {cfg!r}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be a (B, L) tensor with L >= 1, got "
                         f"{tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if cuda_graph and not input_ids.is_cuda:
        raise ValueError("cuda_graph=True needs input_ids on a CUDA device (cuda_graph=False runs eagerly)")
    pick = _token_picker(do_sample, temperature, top_k, top_p, generator)
    eos = _ids(eos_token_id, "eos_token_id")
    if pad_token_id is not None and (isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int)):
        raise ValueError(f"pad_token_id must be an int or None, got {pad_token_id!r}")
    B, L = input_ids.shape
    dev = input_ids.device
    lens = torch.full((B,), L, dtype=torch.long, device=dev)
    if attention_mask is not None:
        am = attention_mask.to(dev) if isinstance(attention_mask, torch.Tensor) else None
        ok = am is not None and am.shape == (B, L) and bool(((am == 0) | (am == 1)).all())
        if ok:
            lens = am.long().sum(1)
            # ones contiguous: one 0 -> 1 and one 1 -> 0 step at most along each row, zero-padded at both ends
            steps = torch.nn.functional.pad(am.long(), (1, 1)).diff(dim=1).abs().sum(1)
            ok = bool((lens >= 1).all()) and bool((steps == 2).all())
        if not ok:
            raise ValueError("attention_mask must be a (B, L) tensor of 0/1 with one run of ones (the prompt) in "
                             f"every row, got {attention_mask!r}")
    ragged = bool((lens != L).any())
    if eos is not None:
        eos_t = torch.tensor(eos, device=dev)
        pad = torch.tensor(eos[0] if pad_token_id is None else pad_token_id, device=dev)
        done = torch.zeros(B, 1, dtype=torch.bool, device=dev)
    if reg["recipe"] == "thrift":
        kvcache_kwargs.setdefault("keep_16bit", True)
    out = [input_ids]

    def choose(logits):  # the next token of every sequence, from the last position's logits
        tok = pick(logits[:, -1])
        if eos is not None:
            tok = torch.where(done, pad, tok)
            done.logical_or_(torch.isin(tok, eos_t))
        out.append(tok)
        return tok

    def more():  # another token wanted (with EOS ids: one host sync)
        return len(out) - 1 < max_new_tokens and (eos is None or not bool(done.all()))

    ck = cache_argument(model)
    with torch.no_grad():
        if ragged:  # each prompt alone, then one cache of the batch
            parts, last = [], []
            for b in range(B):
                parts.append(fp4_cache(model.config, **kvcache_kwargs))
                row = input_ids[b:b + 1, am[b].bool()]
                last.append(model(row, **{ck: parts[b]}, use_cache=True).logits[:, -1:])
            cache = __getattr__("FP4Cache").cat(parts, **kvcache_kwargs)
            del parts
            tok = choose(torch.cat(last))
        else:
            cache = fp4_cache(model.config, **kvcache_kwargs)
            tok = choose(model(input_ids, **{ck: cache}, use_cache=True).logits)
        pos = lens.view(B, 1).clone()  # each sequence's next position
        if more():
            tok = choose(model(tok, **{ck: cache}, position_ids=pos, use_cache=True).logits)
            pos += 1
        if more():
            n = int(lens.max())
            for layer in cache.layers:
                layer.kv.reserve(n + max_new_tokens)
            tok = tok.clone()  # every later step reads its token from here (the graph's static input)
            cpos = torch.tensor([n + 1], dtype=torch.long, device=dev)

            def step():
                return model(tok, **{ck: cache}, position_ids=pos, cache_position=cpos, use_cache=True).logits

            run = step
            if cuda_graph:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    logits = step()
                for layer in cache.layers:
                    layer.kv.sync_lengths()  # the capture ran one append's host bookkeeping, the device none of it

                def run():  # the captured step, replayed
                    graph.replay()
                    return logits
            while more():
                tok.copy_(choose(run()))
                pos += 1
                cpos += 1
            if cuda_graph:
                for layer in cache.layers:
                    layer.kv.sync_lengths()
    return torch.cat(out, 1)


def greedy_generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, cuda_graph: bool = True,
                    eos_token_id=None, pad_token_id: int | None = None, attention_mask: torch.Tensor | None = None,
                    **kvcache_kwargs) -> torch.Tensor:
    """:func:`generate` with greedy decoding: (B, L) token ids -> (B, L + n), n <= max_new_tokens."""
    return generate(model, input_ids, max_new_tokens, cuda_graph=cuda_graph, eos_token_id=eos_token_id,
                    pad_token_id=pad_token_id, attention_mask=attention_mask, **kvcache_kwargs)


def _ids(x, name: str):
    """An int or a non-empty list of ints -> list of ints; None -> None."""
    if x is None:
        return None
    ids = [x] if isinstance(x, int) and not isinstance(x, bool) else x
    if (not isinstance(ids, (list, tuple)) or not ids
            or any(isinstance(i, bool) or not isinstance(i, int) for i in ids)):
        raise ValueError(f"{name} must be an int, a non-empty list of ints or None, got {x!r}")
    return list(ids)


def _token_picker(do_sample: bool, temperature: float, top_k, top_p, generator):
    """(B, V) logits -> (B, 1) next tokens: the argmax, or one draw from the temperature / top-k / top-p
    filtered distribution (transformers' order of those three)."""
    if not isinstance(do_sample, bool):
        raise ValueError(f"do_sample must be a bool, got {do_sample!r}")
    if not do_sample:
        return lambda logits: logits.argmax(-1, keepdim=True)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")

    def pick(logits):
        x = logits.float()
        if temperature != 1.0:
            x = x / temperature
        if top_k is not None and top_k < x.shape[-1]:
            kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
            x = x.masked_fill(x < kth, -math.inf)
        if top_p is not None and top_p < 1.0:
            # drop the least likely tokens while the probability mass they hold stays <= 1 - top_p
            srt, order = torch.sort(x, dim=-1)
            drop = srt.softmax(-1).cumsum(-1) <= 1.0 - top_p
            drop[:, -1] = False  # the most likely token always stays
            x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -math.inf)
        return torch.multinomial(x.softmax(-1), 1, generator=generator)
    return pick
