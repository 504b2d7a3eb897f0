"""register(..., prefill="sdpa"): the prompt through transformers' sdpa (cuDNN / flash, full precision), the decode
steps from the FP4 pages. Times of the prompt's forward into a cache (time to first token) and per generated token
(CUDA-graph steps, gen-s21/_llama.ms_per_token with gen-s22's method), for transformers' sdpa + DynamicCache, fp4attn
nvfp4 with its FP4 prefill and with prefill="sdpa". 16-layer Llama-like model. $OUT/prefill.txt.

    PYTHONPATH=src python benchmarks/gen-s22/prefill.py
"""
import os
import sys

import torch

import fp4attn
import fp4attn.integrations.transformers as fh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "gen-s21"), os.path.join(HERE, "..", "decode-s10")]
from _llama import llama_like, ms_per_token, prompt_forward_ms, timed  # noqa: E402
from _util import logger  # noqa: E402
from transformers import DynamicCache  # noqa: E402

P = logger("prefill.txt")
model, cfg = llama_like()
impls = {"sdpa + DynamicCache (bf16)": ("sdpa", DynamicCache), "nvfp4, FP4 prefill": (fh.register("nvfp4"), None),
         "nvfp4, prefill=sdpa": (fh.register("nvfp4", prefill="sdpa"), None)}
for B, L in ((8, 4096), (1, 16384)):
    ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
    for name, (impl, cache_cls) in impls.items():
        model.set_attn_implementation(impl)
        ttft = prompt_forward_ms(model, ids, cache_cls or fh.fp4_cache)
        line = f"B={B} prompt={L}: {name:28s} prompt forward {ttft:8.2f} ms"
        if cache_cls is None:
            ms, _ = ms_per_token(lambda n, ids=ids: fh.greedy_generate(model, ids, n), 64, 34, repeats=2)
            line += f"   {ms:6.2f} ms/token (CUDA graph)"
        P(line)
    # one layer's share: the append of the prompt's K/V into a fresh KVCache and the dense (dequantized) K/V the
    # layer's first update returns
    kk = torch.randn(B, cfg.num_key_value_heads, L, 128, device="cuda", dtype=torch.bfloat16)
    t_app = min(timed(lambda kk=kk: fp4attn.KVCache.from_dense(kk, kk))[0] for _ in range(3)) * 1e3
    c = fp4attn.KVCache.from_dense(kk, kk)
    t_deq = min(timed(lambda c=c: c.dequantize(torch.bfloat16))[0] for _ in range(3)) * 1e3
    P(f"B={B} prompt={L}: per layer: KVCache.from_dense {t_app:.2f} ms, dequantize {t_deq:.2f} ms")
    del kk, c
    torch.cuda.empty_cache()
