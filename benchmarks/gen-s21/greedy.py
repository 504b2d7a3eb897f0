"""fp4attn.integrations.transformers.greedy_generate, eager vs CUDA-graph steps, against transformers' own greedy
generate() with SDPA and its bf16 DynamicCache (random-weight Llama-like model, 16 layers, D=128, 16/4 heads).
Prints ms per generated token (the generation time minus that of a 1-token run, over the remaining tokens) and
whether the graph run gives the eager run's tokens. $OUT/greedy.txt.

    PYTHONPATH=src python benchmarks/gen-s21/greedy.py
"""
import os
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fp4attn.integrations.transformers as fh

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import logger  # noqa: E402

P = logger("greedy.txt")
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                  num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=16384)
model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
fp4 = fh.register("nvfp4")


def timed(fn, *args):
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t, r


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
        with torch.no_grad():
            fn(4)  # warm up (compiles)
            t1 = min(timed(fn, 2)[0] for _ in range(2))
            tn, out = timed(fn, NEW)
        res[name] = out
        P(f"B={B} prompt={L} new={NEW}: {name:52s} {(tn - t1) / (NEW - 2) * 1e3:7.2f} ms/token")
    names = list(res)
    P(f"  graph tokens == eager tokens: {torch.equal(res[names[1]], res[names[2]])}; "
      f"FP4 vs bf16 generate, share of equal new tokens: "
      f"{(res[names[2]][:, L:] == res[names[0]][:, L:]).float().mean().item():.3f}")
    res.clear()
    torch.cuda.empty_cache()
