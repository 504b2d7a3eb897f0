"""``fp4attn.KVCache``: a paged KV cache holding K and V as NVFP4 (issue 5).

Storage (one object per attention layer; :class:`KVCacheStack` holds one per layer):

* **Pages** of ``page_size`` tokens (default 64, a multiple of 16) in a pool shared by the batch; a
  page holds all ``Hkv`` heads of one sequence. ``page_table[b, i]`` is the pool index of the i-th
  page of sequence b (int32, -1 where none).
* **K** is quantized along D (blocks of 16 channels of one token): ``k_data (P, Hkv, page, D/2)``
  uint8 (channel 2i in the low nibble) and ``k_scale (P, Hkv, page, D/16)`` float8_e4m3fn.
* **V** is quantized along tokens (blocks of 16 consecutive tokens of one channel, a *slot*):
  ``v_data (P, Hkv, page/2, D)`` uint8 (token 2i of the page in the low nibble) and
  ``v_scale (P, Hkv, page/16, D)`` float8_e4m3fn. This is the layout the FP4 prefill kernels use
  (scales along the PV reduction dim).
* **Global scales**: an FP32 decode scale per (sequence, kv head) for K and for V
  (``k_global_scale``, ``v_global_scale``; value = code · block scale · global scale). Without it a
  head whose |K| exceeds 6·448 = 2688 would saturate the E4M3 block scales (and tiny values would sink
  into E4M3 subnormals). Unless given explicitly, it is fixed by the first append that brings tokens
  to a sequence: ``2**-e`` with ``e = floor(log2(448·6 / (amax · scale_headroom)))`` (a power of two,
  so the dequantized values do not depend on it except at the ends of the E4M3 range; the
  ``scale_headroom`` (default 4) leaves room for later tokens up to 4-8x larger than the prefill's).
* **The raw tail.** A V slot is quantized along its 16 tokens, so it can only be quantized once it is
  full. The last ``len % 16`` tokens of each sequence (K and V) are kept raw, in the cache dtype, in
  ``k_tail / v_tail (B, Hkv, 16, D)``; when an append fills the slot, tail + new tokens are quantized
  together and the remainder becomes the new tail. Quantizing a full slot depends only on its 16
  tokens and the global scales, so appending in any chunking gives **bit-identical** storage to
  :meth:`KVCache.from_dense` whenever the global scales are the same (always when they are passed
  explicitly; with the automatic rule, when the first chunk has the same power-of-two amax bucket).
  :meth:`decode <fp4attn.decode>` attends to the raw tail tokens in 16 bits; :meth:`dequantize`
  returns them raw. The tail is counted in :attr:`nbytes`.
* **Optional 16-bit copy** (``keep_16bit=True``, for ThriftAttention decode): every committed token
  is also stored raw in ``k16 / v16 (P, Hkv, page, D)`` (cache dtype), plus an FP32 mean of K per
  full page (``k_page_mean (P, Hkv, D)``, the Thrift block means; the thrift block is the page).
  This is the paper's design (a full FP16 copy): memory becomes ≈ 1.30x a bf16 cache (1.0 for the
  copy, 0.016 for the means) instead of ≈ 0.28x, while a Thrift decode step still *reads* only the
  FP4 pages plus the selected 16-bit pages. :attr:`nbytes_16bit` reports that part separately.

**Sliding-window layers** (``window=w``): a layer whose queries see only their last w + 1 keys (Mistral,
Gemma's local layers) keeps only the pages that can still be read. Logical page p of a sequence reuses the
pool page of logical page p − R (R = ``ring_pages``: enough pages for the last w + 16 tokens, decode's
most new queries, plus two), so each sequence holds at most R pages, and the page table maps every logical
page statically (``reserve`` stays CUDA-graph safe). Tokens older than that are gone: :meth:`dequantize`
(and :meth:`dense_16bit`) return zeros for them, :meth:`block_means` zero means for their pages, and ``decode``
needs ``window_size=(w', 0)`` with w' <= w. With ``keep_16bit`` the 16-bit copy and the page means live in the
same ring slots as the FP4 pages (they are indexed by pool page), so a Thrift decode with such a window reads
what it would read from a cache that kept every token: its candidate pages (those holding keys of the window) are
never recycled while it can read them.

Ragged batches: every sequence has its own length (``seq_lens``); ``append(k, v, lengths=...)``
takes per-sequence counts of valid new tokens (the rest of the ``n_new`` positions is padding).

Everything here is plain PyTorch (the quantization is ``fp4attn.formats.core``'s, bit-exact to
SPEC §2) and runs on CPU and CUDA, except the one-token append of a generation step on CUDA, which
runs as one Triton launch (:mod:`fp4attn.kernels.kvcache`, the same storage bit for bit).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence

import torch

from .formats import core
from .ops._dispatch import interpreting as _interpret

SLOT = 16  # tokens per V quantization block (NVFP4)
_FP8 = torch.float8_e4m3fn
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _power_of_two_decode_scale(amax: torch.Tensor, headroom: float) -> torch.Tensor:
    """amax (float32, >= 0) -> decode scale 2**-e, e = floor(log2(448*6 / (amax*headroom)))."""
    a = amax.double() * headroom
    ok = (amax > 0) & torch.isfinite(amax)
    e = torch.floor(torch.log2((core.E4M3_MAX * core.E2M1_MAX) / torch.where(ok, a, torch.ones_like(a))))
    e = torch.where(ok, e, torch.zeros_like(e)).clamp(-126, 126)
    return torch.pow(2.0, -e).float()


class KVCache:
    """Paged NVFP4 KV cache for one attention layer (see the module docstring for the layout).

    Args:
        batch_size, num_kv_heads, head_dim: B, Hkv, D (D a multiple of 16, at most 256).
        dtype: the 16-bit (or fp32) dtype of incoming K/V; inputs are cast to it first. The raw tail
            and the optional 16-bit copy are stored in it.
        device: where the pool lives.
        page_size: tokens per page (a multiple of 16; 64 by default, the Thrift block).
        keep_16bit: also keep a raw copy of every token (ThriftAttention decode).
        k_global_scale, v_global_scale: FP32 decode scales (a number or a tensor broadcastable to
            (B, Hkv)); ``None`` (default) fixes them per sequence at its first append.
        scale_headroom: headroom factor of the automatic global scales.
        initial_pages: pool capacity to allocate up front (pages, at least 1; it grows by doubling).
        window: for a sliding-window layer, the largest left extent w its queries use (they see the keys
            i − w ... i): only the pages that can hold those keys are kept (see the module docstring). None:
            every token is kept.
    """

    def __init__(self, batch_size: int, num_kv_heads: int, head_dim: int, *, dtype=torch.bfloat16,
                 device=None, page_size: int = 64, keep_16bit: bool = False, k_global_scale=None,
                 v_global_scale=None, scale_headroom: float = 4.0, initial_pages: int = 0,
                 window: int | None = None):
        for name, val in (("batch_size", batch_size), ("num_kv_heads", num_kv_heads),
                          ("head_dim", head_dim), ("page_size", page_size)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if head_dim % SLOT:
            raise ValueError(f"head_dim must be a multiple of {SLOT} (NVFP4 blocks along D), got {head_dim}")
        if head_dim > 256:  # SPEC §5, as the attention ops (the decode kernels' tiles hold at most 256 channels)
            raise ValueError(f"head_dim must be at most 256, got {head_dim}")
        if page_size % SLOT:
            raise ValueError(f"page_size must be a multiple of {SLOT}, got {page_size}")
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be one of {_DTYPES}, got {dtype}")
        if window is not None:
            if isinstance(window, bool) or not isinstance(window, int) or window < 0:
                raise ValueError(f"window must be a non-negative int or None, got {window!r}")
        self.window = window
        # pool pages per sequence of a sliding-window cache: the last window + 16 tokens (decode's most new
        # queries) may start anywhere in a page, and one more page is being filled
        self.ring_pages = None if window is None else -(-(window + SLOT) // page_size) + 2
        if not (isinstance(scale_headroom, (int, float)) and math.isfinite(scale_headroom)
                and scale_headroom >= 1):
            raise ValueError(f"scale_headroom must be a finite number >= 1, got {scale_headroom!r}")
        self.batch_size, self.num_kv_heads, self.head_dim = batch_size, num_kv_heads, head_dim
        self.page_size = page_size
        self.dtype = dtype
        self.keep_16bit = bool(keep_16bit)
        self.scale_headroom = float(scale_headroom)
        B, H, D = batch_size, num_kv_heads, head_dim
        self._lens = [0] * B  # host mirror of seq_lens
        self.seq_lens = torch.zeros(B, dtype=torch.int32, device=device if device is not None else "cpu")
        # the device as tensors report it: "cuda" becomes "cuda:<current index>", so that the device
        # checks of append/decode accept the tensors a user creates with device="cuda"
        self.device = dev = self.seq_lens.device
        self._pages: list[list[int]] = [[] for _ in range(B)]
        self.page_table = torch.full((B, 0), -1, dtype=torch.int32, device=dev)
        self.k_tail = torch.zeros(B, H, SLOT, D, dtype=dtype, device=dev)
        self.v_tail = torch.zeros(B, H, SLOT, D, dtype=dtype, device=dev)
        self.k_global_scale = torch.ones(B, H, dtype=torch.float32, device=dev)
        self.v_global_scale = torch.ones(B, H, dtype=torch.float32, device=dev)
        self._scale_set = [False] * B
        self._explicit_scales = k_global_scale is not None  # (else each sequence's first append sets them)
        if k_global_scale is not None or v_global_scale is not None:
            if k_global_scale is None or v_global_scale is None:
                raise ValueError("pass both k_global_scale and v_global_scale, or neither")
            for name, g, dst in (("k_global_scale", k_global_scale, self.k_global_scale),
                                 ("v_global_scale", v_global_scale, self.v_global_scale)):
                g = torch.as_tensor(g, dtype=torch.float32, device=dev)
                if not bool(torch.isfinite(g).all()) or not bool((g > 0).all()):
                    raise ValueError(f"{name} must be positive and finite")
                dst.copy_(torch.broadcast_to(g, (B, H)))
            self._scale_set = [True] * B
        self._num_used = 0
        self._capacity = 0
        self.reserved_len = 0  # see reserve()
        # crop(): with record_past, each append keeps the raw tokens that a crop of it may need (see crop)
        self.record_past = False
        self._undo = None
        # at least one page: readers map unused page-table entries (-1) to page 0 (masked out after
        # the read), which must exist even before the first page is used (every sequence shorter
        # than a slot): block_means, the decode and page-score kernels
        self._alloc_pool(max(1, int(initial_pages)))

    # ------------------------------------------------------------------------------------------
    # pool management
    # ------------------------------------------------------------------------------------------
    def _pool_shapes(self, P: int):
        H, D, ps = self.num_kv_heads, self.head_dim, self.page_size
        shapes = {
            "k_data": ((P, H, ps, D // 2), torch.uint8),
            "k_scale": ((P, H, ps, D // SLOT), _FP8),
            "v_data": ((P, H, ps // 2, D), torch.uint8),
            "v_scale": ((P, H, ps // SLOT, D), _FP8),
        }
        if self.keep_16bit:
            shapes["k16"] = ((P, H, ps, D), self.dtype)
            shapes["v16"] = ((P, H, ps, D), self.dtype)
            shapes["k_page_mean"] = ((P, H, D), torch.float32)
        return shapes

    def _alloc_pool(self, P: int) -> None:
        old = {n: getattr(self, n, None) for n in self._pool_shapes(0)}
        for name, (shape, dt) in self._pool_shapes(P).items():
            t = torch.zeros(shape, dtype=torch.uint8 if dt == _FP8 else dt, device=self.device)
            if dt == _FP8:
                t = t.view(_FP8)
            o = old.get(name)
            if o is not None and self._num_used:
                t[: self._num_used] = o[: self._num_used]
            setattr(self, name, t)
        self._capacity = P

    def _ensure_pages(self, b: int, n_pages: int) -> None:
        have = len(self._pages[b])
        if n_pages <= have:
            return
        if self.ring_pages is not None and n_pages > self.ring_pages:
            # a sliding-window cache: logical pages past the ring reuse the pool page of page p - R
            self._ensure_pages(b, self.ring_pages)
            have = len(self._pages[b])
            R = self.ring_pages
            for p in range(have, n_pages):
                self._pages[b].append(self._pages[b][p - R])
            self._grow_page_table(n_pages)
            self.page_table[b, have:n_pages] = torch.tensor(self._pages[b][have:n_pages], dtype=torch.int32,
                                                            device=self.device)
            return
        need = n_pages - have
        if self._num_used + need > self._capacity:
            self._alloc_pool(max(self._num_used + need, 2 * self._capacity, 4))
        new = list(range(self._num_used, self._num_used + need))
        self._num_used += need
        self._pages[b].extend(new)
        self._grow_page_table(n_pages)
        # new pages are a contiguous range of the pool: no host-to-device copy
        self.page_table[b, have:n_pages] = torch.arange(new[0], new[-1] + 1, dtype=torch.int32, device=self.device)

    def _grow_page_table(self, n_pages: int) -> None:
        if n_pages > self.page_table.shape[1]:
            cols = max(n_pages, 2 * self.page_table.shape[1])
            pt = torch.full((self.batch_size, cols), -1, dtype=torch.int32, device=self.device)
            pt[:, : self.page_table.shape[1]] = self.page_table
            self.page_table = pt

    def _pool_pages(self, n: int) -> int:
        """Pool pages a sequence of ``n`` logical pages holds."""
        return n if self.ring_pages is None else min(n, self.ring_pages)

    def _ensure_batch_pages(self, n_pages, grow: bool) -> None:
        """At least ``n_pages[b]`` pages for every sequence b, the pool grown by one allocation for the whole
        batch (``grow``: at least doubling, as one sequence's growth does; else to exactly what is needed)."""
        need = sum(max(0, self._pool_pages(n) - self._pool_pages(len(p))) for n, p in zip(n_pages, self._pages))
        if self._num_used + need > self._capacity:
            self._alloc_pool(max(self._num_used + need, 2 * self._capacity, 4) if grow else self._num_used + need)
        for b, n in enumerate(n_pages):
            self._ensure_pages(b, n)

    def reserve(self, max_len: int) -> None:
        """Prepare the cache for decode steps replayed from a CUDA graph, up to ``max_len`` tokens per sequence.

        Allocates now every page those tokens need, so that appends up to ``max_len`` neither allocate nor
        change ``page_table``, and makes :func:`fp4attn.decode` size its context splits for ``max_len``
        committed tokens instead of the current lengths. A captured step (one-token ``append`` and
        ``decode``) then stays valid while the lengths grow: its kernels read the lengths, the page table
        and the global scales from the device. (Its host bookkeeping runs only while capturing: call
        :meth:`sync_lengths` after the capture and after replays.) Eager calls on a reserved cache use the
        same splits, so they give the bits of the replays. Replays must stay within ``max_len``: a slot
        completed past the reserved pages is dropped (the kernels clamp a missing page to page 0 instead of
        reaching outside the pool, so decode reads wrong values for it) and :meth:`sync_lengths` raises
        afterwards. The global scales must be set (the first append sets them). With ``keep_16bit``, Thrift
        decode steps replay too: a one-token append updates the page means on the device, and the selection
        scores the reserved pages.
        """
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < max(self._lens, default=0):
            raise ValueError(f"max_len must be an int >= the longest sequence ({max(self._lens, default=0)}), "
                             f"got {max_len!r}")
        self._ensure_batch_pages([-(-max_len // self.page_size)] * self.batch_size, grow=False)
        self.reserved_len = max(self.reserved_len, max_len)

    def sync_lengths(self) -> None:
        """Reload the host mirror of the lengths from ``seq_lens`` (one device-to-host copy): after capturing a
        decode step in a CUDA graph (the capture ran the host bookkeeping of one append while the device
        recorded it without running it) and after replays (which run no host code)."""
        lens = [int(x) for x in self.seq_lens.tolist()]
        if self.reserved_len and max(lens) > self.reserved_len:
            raise RuntimeError(f"sequence lengths {lens} exceed the reserved {self.reserved_len} tokens: tokens "
                               "past the reservation were not stored (reserve more before capturing)")
        self._lens = lens
        self._undo = None  # (replays appended without host code)

    # ------------------------------------------------------------------------------------------
    # building
    # ------------------------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, k: torch.Tensor, v: torch.Tensor, *, lengths=None, **kwargs) -> KVCache:
        """A cache holding (B, Hkv, N, D) k and v (``lengths``: valid tokens per sequence, default N).

        ``kwargs`` go to the constructor (``dtype`` defaults to k's dtype, ``device`` to k's device).
        """
        _check_kv(k, v)
        B, H, _, D = k.shape
        kwargs.setdefault("dtype", k.dtype if k.dtype in _DTYPES else torch.float32)
        kwargs.setdefault("device", k.device)
        c = cls(B, H, D, **kwargs)
        c.append(k, v, lengths=lengths)
        return c

    def append(self, k: torch.Tensor, v: torch.Tensor, lengths=None) -> None:
        """Append new tokens k, v: (B, Hkv, n_new, D) (any n_new >= 0).

        ``lengths`` (optional, a sequence or tensor of B ints in [0, n_new]): how many of the n_new
        positions are real tokens for each sequence (the leading ones); default all of them.
        Full 16-token slots are quantized; a partial slot stays raw in the tail until it fills.
        """
        _check_kv(k, v)
        B, H, n, D = k.shape
        if (B, H, D) != (self.batch_size, self.num_kv_heads, self.head_dim):
            raise ValueError(f"k must be (B={self.batch_size}, Hkv={self.num_kv_heads}, n, "
                             f"D={self.head_dim}), got {tuple(k.shape)}")
        if k.device != self.device:
            raise ValueError(f"k and v must be on the cache's device {self.device}, got {k.device}")
        counts = _counts(lengths, B, n)
        self._undo = None
        if self.record_past and n and not (k.is_cuda and torch.cuda.is_current_stream_capturing()):
            # the raw tokens a crop of this append may need: the tails before it and its own tokens
            self._undo = dict(lens=list(self._lens), counts=list(counts), k_tail=self.k_tail.clone(),
                              v_tail=self.v_tail.clone(), k=k.to(self.dtype).clone(), v=v.to(self.dtype).clone())
        self._append(k, v, lengths, counts)

    def _append(self, k: torch.Tensor, v: torch.Tensor, lengths, counts) -> None:
        B, H, n, D = k.shape
        if self.ring_pages is not None and n > (self.ring_pages - 2) * self.page_size:
            # a sliding-window cache: pieces whose slots never share a pool page (one launch writes a piece's
            # slots in parallel; the logical pages of a longer chunk would wrap around the ring)
            piece = (self.ring_pages - 2) * self.page_size
            for s0 in range(0, n, piece):
                e0 = min(n, s0 + piece)
                part = None if lengths is None else [min(max(c - s0, 0), e0 - s0) for c in counts]
                self._append(k[:, :, s0:e0], v[:, :, s0:e0], part, _counts(part, B, e0 - s0))
            return
        k = k.to(self.dtype)
        v = v.to(self.dtype)
        if n == 1 and lengths is None and all(self._scale_set) and _use_append_kernel(self.device, D):
            self._append_one(k, v)
            return
        with torch.no_grad():
            self._set_global_scales(k, v, counts)
            if not self._append_slots(k, v, counts):
                for b in range(B):
                    if counts[b]:
                        self._append_seq(b, k[b, :, : counts[b]], v[b, :, : counts[b]])
        if lengths is None:
            self.seq_lens += n  # device-side: no host sync in a generation loop
        else:
            self.seq_lens.copy_(torch.tensor(self._lens, dtype=torch.int32))

    def _append_one(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """One token per sequence (a generation step) in one kernel launch
        (:mod:`fp4attn.kernels.kvcache`): the same storage, bit for bit, as the general path."""
        from .kernels import kvcache as kk
        from .ops._dispatch import on_device

        ps = self.page_size
        for b, L in enumerate(self._lens):
            if L % SLOT == SLOT - 1:  # this token completes a slot: its page must exist
                self._ensure_pages(b, -(-(L + 1) // ps))
        with torch.no_grad(), on_device(k):
            kk.append_one(self, k, v)
            self.seq_lens += 1
            if self.keep_16bit:  # the page the token completed, if any, found on the device
                kk.page_means(self)
        self._lens = [L + 1 for L in self._lens]

    def _append_slots(self, k, v, counts) -> bool:
        """Many tokens into sequences whose tails are empty (a prefill, or a chunk of one): every full slot in one
        launch (``kernels.kvcache.append_slots``, the storage of ``_commit`` bit for bit), the rest into the
        tails. False (nothing done) where the kernels do not run or some tail holds tokens."""
        if not _use_append_kernel(self.device, self.head_dim) or any(L % SLOT for L in self._lens):
            return False
        nslots = [c // SLOT for c in counts]
        if not any(nslots):
            return False
        from .kernels import kvcache as kk
        from .kernels._launch import device_ints
        from .ops._dispatch import on_device

        ps = self.page_size
        self._ensure_batch_pages([-(-(L + n * SLOT) // ps) for L, n in zip(self._lens, nslots)], grow=True)
        with on_device(k):
            kk.append_slots(self, k, v, self._lens, nslots)
        done = []
        for b, (c, n) in enumerate(zip(counts, nslots)):
            L, full = self._lens[b], n * SLOT
            if c > full:
                self.k_tail[b, :, : c - full] = k[b, :, full:c]
                self.v_tail[b, :, : c - full] = v[b, :, full:c]
            done += self._pages[b][L // ps:(L + full) // ps]  # the pages these slots complete
            self._lens[b] = L + c
        if self.keep_16bit and done:
            self._update_page_means(device_ints(done, self.device, torch.long))
        return True

    def _set_global_scales(self, k, v, counts) -> None:
        """The global scales of the sequences this append starts: from each head's largest finite |value| over
        the sequence's new tokens, for the whole batch in one set of ops (a max is exact in any order)."""
        todo = [b for b in range(self.batch_size) if counts[b] and not self._scale_set[b]]
        if not todo:
            return
        if _use_append_kernel(self.device, self.head_dim):  # one pass over the tokens (kernels.kvcache.head_amax)
            from .kernels import kvcache as kk
            from .kernels._launch import device_ints
            from .ops._dispatch import on_device

            with on_device(k):
                amax = kk.head_amax(k, v, [c if b in todo else 0 for b, c in enumerate(counts)])
                # (every sequence, as in a prefill: a slice; else indices made without a host-to-device copy that
                # waits on the GPU where they allow, device_ints)
                idx = slice(None) if len(todo) == self.batch_size else device_ints(todo, self.device, torch.long)
                for a, dst in zip(amax, (self.k_global_scale, self.v_global_scale)):
                    dst[idx] = _power_of_two_decode_scale(a[idx], self.scale_headroom)
        else:
            n = max(counts[b] for b in todo)
            per_seq = k.shape[1] * n * k.shape[3]
            step = max(1, (1 << 26) // per_seq)  # float32 temporaries of at most 256 MiB
            for i in range(0, len(todo), step):
                part = todo[i:i + step]
                idx = torch.tensor(part, device=self.device)
                valid = (torch.arange(n, device=self.device).view(1, n)
                         < torch.tensor([counts[b] for b in part], device=self.device).view(-1, 1)).view(-1, 1, n, 1)
                for src, dst in ((k, self.k_global_scale), (v, self.v_global_scale)):
                    x = src[idx, :, :n].float().abs()
                    x = torch.where(torch.isfinite(x) & valid, x, torch.zeros_like(x))
                    dst[idx] = _power_of_two_decode_scale(x.amax(dim=(2, 3)), self.scale_headroom)
        for b in todo:
            self._scale_set[b] = True

    def _append_seq(self, b: int, k: torch.Tensor, v: torch.Tensor) -> None:
        L = self._lens[b]
        t = L % SLOT
        ck = torch.cat([self.k_tail[b, :, :t], k], dim=1)
        cv = torch.cat([self.v_tail[b, :, :t], v], dim=1)
        m = ck.shape[1]
        nfull = m // SLOT * SLOT
        if nfull:
            self._commit(b, L - t, ck[:, :nfull], cv[:, :nfull])
        rem = m - nfull
        self.k_tail[b].zero_()
        self.v_tail[b].zero_()
        self.k_tail[b, :, :rem] = ck[:, nfull:]
        self.v_tail[b, :, :rem] = cv[:, nfull:]
        self._lens[b] = L + k.shape[1]

    def _commit(self, b: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize full slots k, v (Hkv, n, D), n % 16 == 0, placed at token ``start`` (16-aligned)."""
        H, n, D = k.shape
        ps = self.page_size
        self._ensure_pages(b, -(-(start + n) // ps))
        pages = self.page_table[b, : len(self._pages[b])].long()  # device copy of the page list
        s_k = (1.0 / self.k_global_scale[b]).view(H, 1, 1)
        s_v = (1.0 / self.v_global_scale[b]).view(H, 1, 1)
        # K along D
        qk = core.quantize_blocks(k.float().reshape(H, n, D // SLOT, SLOT), "nvfp4", global_scale=True,
                                  s_enc=s_k)
        kd = core.pack_last(qk.codes.reshape(H, n, D))
        # V along tokens (per channel)
        vt = v.float().transpose(1, 2).reshape(H, D, n // SLOT, SLOT)
        qv = core.quantize_blocks(vt, "nvfp4", global_scale=True, s_enc=s_v)
        vd = core.pack_last(qv.codes.reshape(H, D, n)).transpose(1, 2)  # (H, n/2, D)
        vs = qv.scale_store.transpose(1, 2)  # (H, n/16, D)
        pos = torch.arange(start, start + n, device=self.device)
        pg, off = pages[pos // ps], pos % ps
        self.k_data[pg, :, off] = kd.transpose(0, 1)
        self.k_scale[pg, :, off] = qk.scale_store.transpose(0, 1)
        pos2 = torch.arange(start // 2, (start + n) // 2, device=self.device)
        self.v_data[pages[pos2 // (ps // 2)], :, pos2 % (ps // 2)] = vd.transpose(0, 1)
        pos16 = torch.arange(start // SLOT, (start + n) // SLOT, device=self.device)
        self.v_scale[pages[pos16 // (ps // SLOT)], :, pos16 % (ps // SLOT)] = vs.transpose(0, 1)
        if self.keep_16bit:
            self.k16[pg, :, off] = k.transpose(0, 1)
            self.v16[pg, :, off] = v.transpose(0, 1)
            # the K mean of every page this commit completes (from the stored copy: deterministic)
            self._update_page_means(pages[start // ps:(start + n) // ps])

    def _update_page_means(self, done: torch.Tensor) -> None:
        """The FP32 K means of the completed pages ``done`` (pool indices), from their 16-bit copy
        (deterministic: the same for any append chunking). Where Triton runs (CUDA, or the interpreter) by
        the kernel that one-token appends use too (``kernels.kvcache.page_means``), else in PyTorch."""
        if not done.numel():
            return
        if self.device.type == "cuda" or _interpret():
            from .kernels import kvcache as kk
            from .ops._dispatch import on_device

            with on_device(self.k16):
                kk.page_means(self, done.long())
        else:
            self.k_page_mean[done] = self.k16[done].float().sum(dim=2) / self.page_size

    def crop(self, n: int) -> None:
        """Remove the last ``n`` tokens of every sequence (speculative decoding: the rejected draft tokens).

        Exact: the cache afterwards holds the bits of a cache that never received those tokens (appending
        them again gives the storage of the uncropped cache). Removing only tokens of the raw tail just shortens
        it. Otherwise the 16-token slot that now ends the sequence is reopened: its kept tokens go back to the
        tail raw, which needs their raw values, from one of
        * the last :meth:`append`, when ``record_past`` was set before it and the crop removes no more tokens
          than that append brought (transformers' assisted generation activates it; the transformers
          integration's cache layer also records multi-token appends of up to 64 tokens by itself);
        * the 16-bit copy (``keep_16bit=True``).
        The reopened slots' FP4 storage is cleared (and a reopened page's Thrift mean). With ``window``, at most
        ``page_size`` tokens (the ring keeps that many beyond the window); what the window reads is exact, while
        older tokens whose pool page the dropped append reused stay gone. Not under CUDA-graph capture."""
        if isinstance(n, torch.Tensor) and n.numel() == 1 and not n.is_floating_point() and n.dtype != torch.bool:
            n = int(n)  # (transformers passes a count computed on the device)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0 or n > min(self._lens, default=0):
            raise ValueError(f"n must be an int in [0, {min(self._lens, default=0)}] (the shortest sequence), "
                             f"got {n!r}")
        if self.ring_pages is not None and n > self.page_size:
            raise ValueError(f"n: a sliding-window cache can drop at most page_size={self.page_size} tokens, got {n}")
        if n == 0:
            return
        undo, self._undo = self._undo, None
        lens, new_lens = self._lens, [L - n for L in self._lens]
        c2 = [L2 - L2 % SLOT for L2 in new_lens]
        # sequences whose crop reaches below their committed length: the 16-token slot that now ends them reopens
        reopen = [b for b, L in enumerate(lens) if c2[b] < L - L % SLOT]
        dev = self.device
        if reopen:  # (all sequences at once: a per-sequence loop of small ops cost ~39 ms per 16-token verify step
            # at B = 8 with 16 layers, benchmarks/rowm-s27/)
            rows = torch.tensor(reopen, device=dev)
            kr, vr = self._reopened_raw(reopen, rows, lens, new_lens, c2, undo)  # read before the slots clear
            self._clear_slots(reopen, [c2[b] for b in reopen], [lens[b] - lens[b] % SLOT for b in reopen])
            self.k_tail[rows] = kr
            self.v_tail[rows] = vr
        # every tail keeps its first L2 - c2 tokens (the reopened ones: their raw tokens, zeros beyond)
        keep = torch.tensor([L2 - s for L2, s in zip(new_lens, c2)], device=dev)
        gone = (torch.arange(SLOT, device=dev)[None, :] >= keep[:, None])[:, None, :, None]
        self.k_tail.masked_fill_(gone, 0)
        self.v_tail.masked_fill_(gone, 0)
        self._lens = new_lens
        self.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        self._forget_scales([b for b, L2 in enumerate(new_lens) if L2 == 0])  # (a cache that never held them)

    def _reopened_raw(self, reopen: list, rows: torch.Tensor, lens: list, new_lens: list, c2: list, undo):
        """The raw K, V (R, H, SLOT, D) of the tokens c2 .. L2 - 1 of the reopened sequences ``reopen`` (zeros
        beyond), from the recorded append ``undo`` (when it covers all of them) or the 16-bit copy."""
        j = torch.arange(SLOT, device=self.device)[None, :]
        start = torch.tensor([c2[b] for b in reopen], device=self.device)[:, None]
        kept = j < torch.tensor([new_lens[b] - c2[b] for b in reopen], device=self.device)[:, None]  # (R, SLOT)
        t = start + j  # token positions
        R, H, D = len(reopen), self.num_kv_heads, self.head_dim
        # the recorded append covers a sequence when the crop removes no more tokens than it brought
        missing = [b for b in reopen if undo is None or not (
            new_lens[b] >= undo["lens"][b] and lens[b] == undo["lens"][b] + undo["counts"][b])]
        if not missing:
            # tokens below the append's first (L0) were in the tail before it (from s0), the others in its input
            L0 = torch.tensor([undo["lens"][b] for b in reopen], device=self.device)[:, None]
            s0 = L0 - L0 % SLOT
            src = torch.where(t < L0, t - s0, SLOT + t - L0)
            out = []
            for tail, new in ((undo["k_tail"], undo["k"]), (undo["v_tail"], undo["v"])):
                both = torch.cat([tail[rows], new[rows].to(tail.dtype)], dim=2)  # (R, H, SLOT + count, D)
                idx = src.clamp(0, both.shape[2] - 1)[:, None, :, None].expand(R, H, SLOT, D)
                out.append(torch.where(kept[:, None, :, None], both.gather(2, idx), 0))
            return out
        if not self.keep_16bit:
            b = missing[0]
            raise RuntimeError(
                f"crop({lens[b] - new_lens[b]}) reopens a quantized 16-token slot of sequence {b}, whose raw tokens "
                "are gone: set record_past = True before the append to undo (at most the tokens it brought), or keep "
                "a 16-bit copy (keep_16bit=True)")
        t = torch.minimum(t, torch.tensor([lens[b] - lens[b] % SLOT - 1 for b in reopen], device=self.device)[:, None])
        pg = self.page_table[rows].long().gather(1, t // self.page_size)  # (R, SLOT): tokens that existed
        off = t % self.page_size
        return [torch.where(kept[:, None, :, None], x[pg, :, off].permute(0, 2, 1, 3).to(self.k_tail.dtype), 0)
                for x in (self.k16, self.v16)]

    def _clear_slots(self, rows: list, starts: list, ends: list) -> None:
        """Zero the FP4 storage (and 16-bit copy, and the Thrift means of the pages it leaves incomplete) of the
        16-aligned tokens ``starts[i]`` .. ``ends[i]`` - 1 of sequence ``rows[i]``: what a cache that never held
        them has."""
        ps = self.page_size

        def where(step: int, per_page: int):  # (pages, offsets) of the units start/step .. end/step - 1 of each row
            r = [b for b, s, e in zip(rows, starts, ends) for _ in range(s // step, e // step)]
            u = torch.tensor([i for s, e in zip(starts, ends) for i in range(s // step, e // step)],
                             device=self.device)
            return self.page_table[torch.tensor(r, device=self.device), u // per_page].long(), u % per_page

        pg, off = where(1, ps)
        self.k_data[pg, :, off] = 0
        self.k_scale.view(torch.uint8)[pg, :, off] = 0
        pg2, off2 = where(2, ps // 2)
        self.v_data[pg2, :, off2] = 0
        pg16, off16 = where(SLOT, ps // SLOT)
        self.v_scale.view(torch.uint8)[pg16, :, off16] = 0
        if self.keep_16bit:
            self.k16[pg, :, off] = 0
            self.v16[pg, :, off] = 0
            r = [b for b, s, e in zip(rows, starts, ends) for _ in range(s // ps, -(-e // ps))]
            p = [i for s, e in zip(starts, ends) for i in range(s // ps, -(-e // ps))]
            # the pages no longer complete
            self.k_page_mean[self.page_table[torch.tensor(r, device=self.device),
                                             torch.tensor(p, device=self.device)].long()] = 0

    # ------------------------------------------------------------------------------------------
    # queries
    # ------------------------------------------------------------------------------------------
    @property
    def lengths(self) -> list[int]:
        """Per-sequence token counts (host list)."""
        return list(self._lens)

    def get_seq_length(self) -> int:
        """The longest sequence's length (what HF's ``Cache.get_seq_length`` reports)."""
        return max(self._lens) if self._lens else 0

    @property
    def max_length(self) -> int:
        return self.get_seq_length()

    def committed_lengths(self) -> list[int]:
        """Tokens per sequence that are quantized (the rest, < 16, is the raw tail)."""
        return [L - L % SLOT for L in self._lens]

    def _page_bytes(self, sixteen: bool) -> int:
        tot = 0
        for name, (shape, dt) in self._pool_shapes(1).items():
            is16 = name in ("k16", "v16", "k_page_mean")
            if is16 == sixteen:
                tot += math.prod(shape) * (1 if dt == _FP8 else torch.empty((), dtype=dt).element_size())
        return tot

    @property
    def nbytes(self) -> int:
        """Bytes held for the stored tokens: the FP4 pages in use (whole pages, the unused part of
        each sequence's last page included), the raw 16-bit tails, the global scales and the page
        table. The optional 16-bit copy is *not* included; see :attr:`nbytes_16bit`."""
        pages = sum(self._pool_pages(len(p)) for p in self._pages)
        fixed = (self.k_tail.numel() + self.v_tail.numel()) * self.k_tail.element_size()
        fixed += (self.k_global_scale.numel() + self.v_global_scale.numel()) * 4
        fixed += self.page_table.numel() * 4 + self.seq_lens.numel() * 4
        return pages * self._page_bytes(False) + fixed

    @property
    def nbytes_16bit(self) -> int:
        """Bytes of the optional 16-bit copy (k16, v16 and the page means) for the pages in use."""
        if not self.keep_16bit:
            return 0
        return sum(self._pool_pages(len(p)) for p in self._pages) * self._page_bytes(True)

    @property
    def nbytes_allocated(self) -> int:
        """Bytes of every tensor the cache owns (the whole pool capacity)."""
        tot = 0
        for name in self._pool_shapes(0):
            t = getattr(self, name)
            tot += t.numel() * t.element_size()
        for t in (self.k_tail, self.v_tail, self.k_global_scale, self.v_global_scale, self.page_table,
                  self.seq_lens):
            tot += t.numel() * t.element_size()
        return tot

    def bf16_nbytes(self) -> int:
        """Bytes of a dense bf16 cache holding the same tokens (no padding): 2·2·Hkv·D·Σ lengths (a
        sliding-window cache: at most ``window`` tokens per sequence, what transformers' sliding layer keeps)."""
        lens = self._lens if self.window is None else [min(L, self.window) for L in self._lens]
        return 4 * self.num_kv_heads * self.head_dim * sum(lens)

    # ------------------------------------------------------------------------------------------
    # dense views (references, tests)
    # ------------------------------------------------------------------------------------------
    def _pages_of(self, b: int, c: int, t: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` rows, per kv head, of page-major storage ``t`` (pages, H, rows per page, ...)
        over the pages that hold sequence b's first c committed tokens: (H, n, ...)."""
        pages = torch.tensor(self._pages[b][: -(-c // self.page_size)], dtype=torch.long, device=self.device)
        g = t[pages].transpose(0, 1)
        return g.reshape(g.shape[0], -1, *g.shape[3:])[:, :n]

    def dequantize(self, dtype=torch.float32):
        """Dense (k, v) of shape (B, Hkv, max_len, D): committed tokens dequantized
        (code · block scale · global scale, in float32, then rounded once to ``dtype``), the raw tail as
        stored, zeros beyond each length (with ``window``: also before the kept pages). Built one sequence at a
        time in ``dtype``: no float32 copy of the whole cache (at B=64 and 32k tokens of D=128 that was 8.6 GB
        per tensor next to a bf16 result)."""
        B, H, D = self.batch_size, self.num_kv_heads, self.head_dim
        Lmax = self.get_seq_length()
        k = torch.zeros(B, H, Lmax, D, dtype=dtype, device=self.device)
        v = torch.zeros_like(k)
        for b in range(B):
            L = self._lens[b]
            c = L - L % SLOT
            if c:
                kd, ks, vd, vs = (self._pages_of(b, c, t, n) for t, n in (
                    (self.k_data, c), (self.k_scale, c), (self.v_data, c // 2), (self.v_scale, c // SLOT)))
                ks, vs = ks.float(), vs.float()
                kc = core.e2m1_decode(core.unpack_last(kd)).view(H, c, D // SLOT, SLOT) * ks.unsqueeze(-1)
                k[b, :, :c] = kc.view(H, c, D) * self.k_global_scale[b].view(H, 1, 1)
                vc = core.e2m1_decode(core.unpack_last(vd.transpose(1, 2)))  # (H, D, c)
                vc = vc.view(H, D, c // SLOT, SLOT) * vs.transpose(1, 2).unsqueeze(-1)
                v[b, :, :c] = vc.view(H, D, c).transpose(1, 2) * self.v_global_scale[b].view(H, 1, 1)
            k[b, :, c:L] = self.k_tail[b, :, : L - c].float()
            v[b, :, c:L] = self.v_tail[b, :, : L - c].float()
            if self.ring_pages is not None:  # tokens whose pool pages were reused: gone
                gone = max(0, -(-c // self.page_size) - self.ring_pages) * self.page_size
                k[b, :, :gone] = 0
                v[b, :, :gone] = 0
        return k, v

    def dense_16bit(self):
        """Dense raw (k, v) (B, Hkv, max_len, D) in the cache dtype from the 16-bit copy and the
        tails (``keep_16bit=True`` only); zeros beyond each length (with ``window``: also before the kept pages,
        as :meth:`dequantize`)."""
        if not self.keep_16bit:
            raise ValueError("dense_16bit needs a cache built with keep_16bit=True")
        B, H, D = self.batch_size, self.num_kv_heads, self.head_dim
        Lmax = self.get_seq_length()
        k = torch.zeros(B, H, Lmax, D, dtype=self.dtype, device=self.device)
        v = torch.zeros_like(k)
        for b in range(B):
            L = self._lens[b]
            c = L - L % SLOT
            if c:
                k[b, :, :c] = self._pages_of(b, c, self.k16, c)
                v[b, :, :c] = self._pages_of(b, c, self.v16, c)
            k[b, :, c:L] = self.k_tail[b, :, : L - c]
            v[b, :, c:L] = self.v_tail[b, :, : L - c]
            if self.ring_pages is not None:  # tokens whose pool pages were reused: gone
                gone = max(0, -(-c // self.page_size) - self.ring_pages) * self.page_size
                k[b, :, :gone] = 0
                v[b, :, :gone] = 0
        return k, v

    def block_means(self):
        """(B, Hkv, max_pages, D) float32 K means per page over each page's valid tokens (the Thrift
        key-block means of decode; pages past a sequence's end are 0). Full pages use the stored
        means; each sequence's last partial page is averaged from the 16-bit copy and the tail. With
        ``window``, pages whose pool page was recycled (gone, see :meth:`dequantize`) are 0 too.
        Device ops only (no host sync; CUDA-graph capturable)."""
        if not self.keep_16bit:
            raise ValueError("block means need a cache built with keep_16bit=True")
        B, ps = self.batch_size, self.page_size
        npg = max(1, -(-self.get_seq_length() // ps))
        dev = self.device
        lens = self.seq_lens.long()
        pt = self.page_table[:, :npg].long()
        if pt.shape[1] < npg:
            pt = torch.nn.functional.pad(pt, (0, npg - pt.shape[1]), value=-1)
        pt = pt.clamp(min=0)
        nfull = lens // ps
        j = torch.arange(npg, device=dev)
        out = self.k_page_mean[pt].permute(0, 2, 1, 3)  # (B, H, npg, D)
        out = torch.where((j.view(1, -1) < nfull.view(-1, 1)).view(B, 1, npg, 1), out, torch.zeros_like(out))
        # the partial page of each sequence: committed tokens of that page (16-bit copy) + the tail
        pidx = nfull.clamp(max=npg - 1)
        ppage = pt.gather(1, pidx.view(B, 1)).view(B)
        comm = lens - lens % SLOT
        in_page = (comm - nfull * ps).clamp(min=0)
        tok = self.k16[ppage].float()  # (B, H, ps, D)
        tok = tok * (torch.arange(ps, device=dev).view(1, ps) < in_page.view(B, 1)).view(B, 1, ps, 1)
        tail = self.k_tail.float() * (torch.arange(SLOT, device=dev).view(1, SLOT)
                                      < (lens - comm).view(B, 1)).view(B, 1, SLOT, 1)
        cnt = (lens - nfull * ps).clamp(min=1).float().view(B, 1, 1)
        part = (tok.sum(dim=2) + tail.sum(dim=2)) / cnt  # (B, H, D)
        has_part = (lens % ps != 0).view(B, 1, 1)
        bi = torch.arange(B, device=dev)
        out[bi, :, pidx] = torch.where(has_part, part, out[bi, :, pidx])
        if self.ring_pages is not None:  # logical pages whose pool page a later page reuses: gone
            gone = (comm + ps - 1) // ps - self.ring_pages
            out = out.masked_fill((j.view(1, -1) < gone.view(-1, 1)).view(B, 1, npg, 1), 0.0)
        return out

    # ------------------------------------------------------------------------------------------
    # generation helpers
    # ------------------------------------------------------------------------------------------
    def reorder(self, index) -> None:
        """Reorder (or repeat) the batch: sequence b becomes old sequence ``index[b]`` (beam search).

        Pages are copied, so repeated sequences never share a page."""
        idx = [int(i) for i in (index.tolist() if isinstance(index, torch.Tensor) else index)]
        if len(idx) != self.batch_size or any(not 0 <= i < self.batch_size for i in idx):
            raise ValueError(f"index must hold {self.batch_size} sequence indices in [0, {self.batch_size})")
        self._gather([(self, i) for i in idx])

    @classmethod
    def cat(cls, caches) -> KVCache:
        """One cache holding the sequences of ``caches`` in order (e.g. prompts prefilled one at a time, then
        decoded as one batch): pages, tails, global scales and lengths copied, the same bits as each source. The
        caches must agree in heads, head dim, page size, dtype, device, ``keep_16bit``, ``window`` and
        ``scale_headroom`` (the global scales of sequences started later)."""
        caches = list(caches) if isinstance(caches, (list, tuple)) else None
        if not caches or any(not isinstance(c, KVCache) for c in caches):
            raise ValueError("caches must be a non-empty list of KVCache")
        c0 = caches[0]
        for c in caches[1:]:
            for attr in ("num_kv_heads", "head_dim", "page_size", "dtype", "device", "keep_16bit", "window",
                         "scale_headroom"):
                if getattr(c, attr) != getattr(c0, attr):
                    raise ValueError(f"caches: every cache must have the same {attr} ({getattr(c0, attr)}), got "
                                     f"{getattr(c, attr)}")
        out = cls(sum(c.batch_size for c in caches), c0.num_kv_heads, c0.head_dim, page_size=c0.page_size,
                  dtype=c0.dtype, device=c0.device, keep_16bit=c0.keep_16bit, scale_headroom=c0.scale_headroom,
                  window=c0.window)
        out._gather([(c, i) for c in caches for i in range(c.batch_size)])
        out._explicit_scales = all(c._explicit_scales for c in caches)
        return out

    def _gather(self, sources) -> None:
        """Make sequence b of this cache a copy of sequence i of cache c, for (c, i) = ``sources[b]`` (caches of
        this one's layout, this one included: every source is read before anything is replaced)."""
        old = {}
        for c, _ in sources:
            if id(c) not in old:
                old[id(c)] = ({n: getattr(c, n) for n in c._pool_shapes(0)}, [list(p) for p in c._pages],
                              list(c._lens), list(c._scale_set),
                              {n: getattr(c, n) for n in ("seq_lens", "k_tail", "v_tail", "k_global_scale",
                                                          "v_global_scale")})
        src = [(old[id(c)], i) for c, i in sources]
        self._undo = None
        self._num_used, self._capacity = 0, 0
        self._alloc_pool(max(sum(len(set(o[1][i])) for o, i in src), 4))
        self._pages = [[] for _ in range(self.batch_size)]
        self.page_table = torch.full((self.batch_size, self.page_table.shape[1]), -1, dtype=torch.int32,
                                     device=self.device)
        for b, (o, i) in enumerate(src):
            n = len(o[1][i])
            if n:
                self._ensure_pages(b, n)
                s_idx = torch.tensor(o[1][i], dtype=torch.long, device=self.device)
                d_idx = torch.tensor(self._pages[b], dtype=torch.long, device=self.device)
                for name, t in o[0].items():
                    getattr(self, name)[d_idx] = t[s_idx]
        self._lens = [o[2][i] for o, i in src]
        self._scale_set = [o[3][i] for o, i in src]
        self.reserved_len = 0  # only the used pages were copied: reserve() again for CUDA-graph steps
        for name in ("seq_lens", "k_tail", "v_tail", "k_global_scale", "v_global_scale"):
            setattr(self, name, torch.cat([o[4][name][i:i + 1] for o, i in src]).contiguous())

    def _forget_scales(self, seqs: list) -> None:
        """Sequences ``seqs`` hold no token again: unless the global scales were given, their next append sets them
        anew (as in a new cache)."""
        if self._explicit_scales or not seqs:
            return
        idx = slice(None) if len(seqs) == self.batch_size else torch.tensor(seqs, device=self.device)
        self.k_global_scale[idx] = 1.0
        self.v_global_scale[idx] = 1.0
        for b in seqs:
            self._scale_set[b] = False

    def reset(self) -> None:
        """Drop every token (keeps the pool allocation and explicit global scales; automatic ones are set again by
        the next append, as in a new cache)."""
        self._forget_scales(list(range(self.batch_size)))
        self._lens = [0] * self.batch_size
        self._undo = None
        self.seq_lens.zero_()
        self._pages = [[] for _ in range(self.batch_size)]
        self.page_table.fill_(-1)
        self._num_used = 0
        self.reserved_len = 0
        self.k_tail.zero_()
        self.v_tail.zero_()

    def __repr__(self) -> str:
        return (f"KVCache(B={self.batch_size}, Hkv={self.num_kv_heads}, D={self.head_dim}, "
                f"page_size={self.page_size}, dtype={self.dtype}, lengths={self._lens}, "
                f"keep_16bit={self.keep_16bit}, nbytes={self.nbytes})")


class KVCacheStack:
    """One :class:`KVCache` per layer (``layer(i)``), for a model's generation loop.

    ``update(k, v, layer_idx)`` appends to layer ``layer_idx`` and returns its cache (the call an HF
    ``Cache`` subclass forwards to); constructor kwargs are passed to every layer's cache.
    """

    def __init__(self, num_layers: int, batch_size: int, num_kv_heads: int, head_dim: int, **kwargs):
        self.layers = [KVCache(batch_size, num_kv_heads, head_dim, **kwargs) for _ in range(num_layers)]

    def layer(self, i: int) -> KVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> KVCache:
        return self.layers[i]

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, lengths=None) -> KVCache:
        c = self.layers[layer_idx]
        c.append(k, v, lengths=lengths)
        return c

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length()

    def reorder(self, index) -> None:
        for c in self.layers:
            c.reorder(index)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.layers)

    @property
    def nbytes_16bit(self) -> int:
        return sum(c.nbytes_16bit for c in self.layers)


def _use_append_kernel(device: torch.device, head_dim: int) -> bool:
    """The one-token append kernel runs on CUDA tensors (not under the Triton interpreter, unless
    ``FP4ATTN_KV_APPEND_KERNEL=1`` forces it, as the interpreter tests do); ``=0`` turns it off."""
    force = os.environ.get("FP4ATTN_KV_APPEND_KERNEL")
    if force is not None and force != "":
        on = force != "0"
    else:
        on = device.type == "cuda" and not _interpret()
    if not on:
        return False
    from .kernels import kvcache as kk

    return kk.supported(head_dim)


def _check_kv(k, v) -> None:
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, Hkv, n_new, D), got shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.device != v.device:
        raise ValueError(f"k and v must be on one device, got {k.device} and {v.device}")


def _counts(lengths, B: int, n: int) -> list[int]:
    if lengths is None:
        return [n] * B
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    if (not isinstance(lengths, Sequence) or len(lengths) != B
            or any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in lengths)):
        raise ValueError(f"lengths must hold {B} ints, got {lengths!r}")
    out = [int(x) for x in lengths]
    if any(not 0 <= x <= n for x in out):
        raise ValueError(f"lengths must be in [0, n_new={n}], got {out}")
    return out
