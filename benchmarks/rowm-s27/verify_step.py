"""Speculative decoding's verify step through transformers on an FP4 cache vs its bf16 DynamicCache: one forward of
k draft tokens per sequence over a context of L tokens, then the cache cropped back to L (what assisted / prompt-lookup
generation does after a fully rejected draft), eager, ms per step (median of 10 after 3 warm-up steps). Random-weight
Llama-like model (16 layers, d = 2048, 16/4 heads, D = 128; benchmarks/gen-s21/_llama.py), prompt through transformers'
sdpa for both (``register("nvfp4", prefill="sdpa")``). Counts the fp4attn.decode calls and their query lengths, to
show the verify steps decode from the FP4 pages. $OUT/verify_step.txt.

    OUT=out PYTHONPATH=src python benchmarks/rowm-s27/verify_step.py
"""
import os
import statistics
import sys
import time

import torch
from transformers import DynamicCache

import fp4attn
import fp4attn.integrations.transformers as fh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "gen-s21"), os.path.join(HERE, "..", "decode-s10")]
from _llama import llama_like  # noqa: E402
from _util import logger  # noqa: E402

P = logger(os.path.join(os.environ.get("OUT", "."), "verify_step.txt"))
P(torch.cuda.get_device_name(), torch.__version__)
model, cfg = llama_like(layers=16, max_positions=40000)
fp4 = fh.register("nvfp4", prefill="sdpa")
calls = []
real_decode = fp4attn.decode


def counting_decode(q, *a, **kw):
    calls.append(q.shape[2])
    return real_decode(q, *a, **kw)


fp4attn.decode = counting_decode
KS = [int(x) for x in os.environ.get("KS", "1,4,8,16").split(",")]
for B, L in ((1, 32768), (8, 16384)):
    ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
    res = {}
    for name, impl, make in (("sdpa + DynamicCache (bf16)", "sdpa", DynamicCache), ("nvfp4 + fp4_cache", fp4,
                                                                                     fh.fp4_cache)):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            pkv = make()
            model(ids, past_key_values=pkv, use_cache=True)
            for k in KS:
                draft = torch.randint(0, cfg.vocab_size, (B, k), device="cuda")
                ts = []
                calls.clear()
                for i in range(13):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    model(draft, past_key_values=pkv, use_cache=True)
                    pkv.crop(L)
                    torch.cuda.synchronize()
                    if i >= 3:
                        ts.append((time.perf_counter() - t0) * 1e3)
                assert pkv.get_seq_length() == L
                res[(name, k)] = statistics.median(ts)
                P(f"B={B} L={L} k={k}: {name:28s} {res[(name, k)]:8.2f} ms/step  "
                  f"(fp4attn.decode calls {len(calls)}, query lengths {sorted(set(calls))})")
            del pkv
            torch.cuda.empty_cache()
    for k in KS:
        a, b = res[("sdpa + DynamicCache (bf16)", k)], res[("nvfp4 + fp4_cache", k)]
        P(f"  B={B} k={k}: bf16 / fp4 step time {a / b:.2f}")
