"""Time to first token with an FP4 cache (gen-s22/prefill.py without the per-token part): the prompt's forward
through the 16-layer Llama-like model of gen-s21 into a fresh cache, for transformers' sdpa + bf16 DynamicCache,
fp4attn nvfp4 (FP4 prefill), nvfp4 with prefill="sdpa" and thrift with prefill="sdpa" (a cache that keeps
the 16-bit copy and the page means); best of 3 after a warm-up. Run it once per tree, in
separate processes, alternating, to compare trees (the package is whatever ``fp4attn`` PYTHONPATH finds):

    PYTHONPATH=src python benchmarks/globaldiv-s36/ttft.py
"""
import os
import sys

import torch

import fp4attn
import fp4attn.integrations.transformers as fh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "gen-s21"))
from _llama import llama_like, prompt_forward_ms, timed  # noqa: E402
from transformers import DynamicCache  # noqa: E402

print(f"fp4attn from {os.path.dirname(fp4attn.__file__)} on {torch.cuda.get_device_name()}", flush=True)
model, cfg = llama_like()
impls = {"sdpa + DynamicCache (bf16)": ("sdpa", DynamicCache), "nvfp4, FP4 prefill": (fh.register("nvfp4"), None),
         "nvfp4, prefill=sdpa": (fh.register("nvfp4", prefill="sdpa"), None),
         "thrift (keep_16bit), prefill=sdpa": (fh.register("thrift", prefill="sdpa"),
                                                lambda: fh.fp4_cache(keep_16bit=True))}
for B, L in ((8, 4096), (1, 16384)):
    ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
    for name, (impl, make_cache) in impls.items():
        model.set_attn_implementation(impl)
        ttft = prompt_forward_ms(model, ids, make_cache or fh.fp4_cache)
        print(f"B={B} prompt={L}: {name:34s} prompt forward {ttft:8.2f} ms", flush=True)
    kk = torch.randn(B, cfg.num_key_value_heads, L, 128, device="cuda", dtype=torch.bfloat16)
    t_app = min(timed(lambda kk=kk: fp4attn.KVCache.from_dense(kk, kk))[0] for _ in range(3)) * 1e3
    print(f"B={B} prompt={L}: per layer: KVCache.from_dense {t_app:.2f} ms", flush=True)
    del kk
    torch.cuda.empty_cache()
