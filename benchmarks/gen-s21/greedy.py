"""fp4attn.integrations.transformers.greedy_generate, eager vs CUDA-graph steps, against transformers' own greedy
generate() with SDPA and its bf16 DynamicCache (random-weight Llama-like model, 16 layers, D=128, 16/4 heads).
Prints ms per generated token (the generation time minus that of a 1-token run, over the remaining tokens) and
whether the graph run gives the eager run's tokens. $OUT/greedy.txt.

    PYTHONPATH=src python benchmarks/gen-s21/greedy.py
"""
import os
import sys

import torch

import fp4attn.integrations.transformers as fh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "decode-s10")]
from _llama import llama_like, ms_per_token  # noqa: E402
from _util import logger  # noqa: E402

P = logger("greedy.txt")
model, cfg = llama_like()
fp4 = fh.register("nvfp4")


for B, L, NEW in ((8, 2048, 128), (32, 4096, 128)):
    ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
    res = {}
    for name, impl, fn in (
            ("transformers generate, sdpa + DynamicCache (bf16)", "sdpa",
             lambda n, x=ids: model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)),
            ("greedy_generate, FP4Cache, eager", fp4,
             lambda n, x=ids: fh.greedy_generate(model, x, n, cuda_graph=False)),
            ("greedy_generate, FP4Cache, CUDA graph", fp4, lambda n, x=ids: fh.greedy_generate(model, x, n))):
        model.set_attn_implementation(impl)
        ms, res[name] = ms_per_token(fn, NEW - 2, 2)
        P(f"B={B} prompt={L} new={NEW}: {name:52s} {ms:7.2f} ms/token")
    names = list(res)
    P(f"  graph tokens == eager tokens: {torch.equal(res[names[1]], res[names[2]])}; "
      f"FP4 vs bf16 generate, share of equal new tokens: "
      f"{(res[names[2]][:, L:] == res[names[0]][:, L:]).float().mean().item():.3f}")
    res.clear()
    torch.cuda.empty_cache()
