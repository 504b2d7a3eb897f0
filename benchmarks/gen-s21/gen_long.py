"""Decode steps of a transformers Llama-like model over a long, already filled KV cache (session 21): ms per
generated token with SDPA on transformers' bf16 DynamicCache / StaticCache against fp4attn's FP4Cache (NVFP4 pages,
``fp4attn.decode``). The caches are filled with random K/V (no prefill pass: the decode steps are what is timed);
the model has random weights. Eager PyTorch, greedy next token fed back. $OUT/gen_long.txt.

    PYTHONPATH=src python benchmarks/gen-s21/gen_long.py --batch 64 --context 32768
"""
import argparse
import collections
import gc
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache, StaticCache

import fp4attn.integrations.transformers as fh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "decode-s10")]
from _llama import llama_like  # noqa: E402
from _util import logger  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--context", type=int, default=32768)
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--layers", type=int, default=16)
ap.add_argument("--only-graph", action="store_true", help="time only the CUDA-graph FP4 variant")
a = ap.parse_args()
P = logger(f"gen_long_b{a.batch}_c{a.context}.txt")

model, cfg = llama_like(a.layers, a.context + 1024)
fp4 = fh.register("nvfp4")
B, N, H, D = a.batch, a.context, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads


def filled(kind):
    """A cache of `kind` holding N random bf16 tokens per layer (K with the scale of real rotated keys, ~1)."""
    if kind == "dynamic":
        c = DynamicCache(config=cfg)
    elif kind == "static":
        c = StaticCache(config=cfg, max_cache_len=N + a.steps + 8)
    else:
        c = fh.fp4_cache()
    g = torch.Generator(device="cuda").manual_seed(1)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
        kw = {"cache_position": torch.arange(N, device="cuda")} if kind == "static" else {}
        c.update(k, v, layer, kw)
        del k, v
    return c


def per_token_graph():
    """fp4attn nvfp4 + FP4Cache with the decode step replayed from a CUDA graph: every layer's KVCache reserved
    for the steps, one eager step (compiles the kernels, lets the layers return placeholders), one step
    captured, the host lengths resynchronized, then replays fed their own greedy token."""
    model.set_attn_implementation(fp4)
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    cache = filled("fp4")
    for layer in cache.layers:
        layer.kv.reserve(N + a.steps + 8)
    held = (torch.cuda.memory_allocated() - base) / 2**30
    ids = torch.randint(0, cfg.vocab_size, (B, 1), device="cuda")
    pos = torch.full((B, 1), N, device="cuda")
    cpos = torch.tensor([N], device="cuda")
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, position_ids=pos, cache_position=cpos, use_cache=True)
        ids.copy_(out.logits[:, -1:].argmax(-1))
        pos += 1
        cpos += 1
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = model(input_ids=ids, past_key_values=cache, position_ids=pos, cache_position=cpos,
                           use_cache=True).logits
        for layer in cache.layers:
            layer.kv.sync_lengths()
        times = []
        for _ in range(a.steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            graph.replay()
            ids.copy_(logits[:, -1:].argmax(-1))
            pos += 1
            cpos += 1
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
    for layer in cache.layers:
        layer.kv.sync_lengths()
    assert cache.layers[0].kv.get_seq_length() == N + 1 + a.steps
    del cache, graph, logits
    gc.collect()
    torch.cuda.empty_cache()
    steady = sorted(times[4:])
    return 1e3 * steady[len(steady) // 2], held


def per_token(kind, impl):
    """(median ms per decode step, GiB held by the filled cache, peak GiB during the steps, top CUDA kernels)."""
    model.set_attn_implementation(impl)
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    cache = filled(kind)
    gc.collect()
    torch.cuda.empty_cache()
    held = (torch.cuda.memory_allocated() - base) / 2**30
    torch.cuda.reset_peak_memory_stats()
    tok = torch.randint(0, cfg.vocab_size, (B, 1), device="cuda")
    times = []

    def step(i, cache):
        nonlocal tok
        out = model(input_ids=tok, past_key_values=cache, position_ids=torch.full((B, 1), N + i, device="cuda"),
                    cache_position=torch.tensor([N + i], device="cuda"), use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)

    with torch.no_grad():
        for i in range(a.steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            step(i, cache)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(a.steps, a.steps + 2):
                step(i, cache)
            torch.cuda.synchronize()
    agg = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:60]] += e.device_time / 2 / 1e3  # ms per step
    top = sorted(agg.items(), key=lambda x: -x[1])[:4]
    del cache
    gc.collect()
    torch.cuda.empty_cache()
    steady = sorted(times[4:])
    return 1e3 * steady[len(steady) // 2], held, peak, top


P(f"Llama-like {cfg.num_hidden_layers} layers, d=2048, 16/4 heads (D={D}), bf16, random weights; B={B}, "
  f"{N} cached tokens per sequence; eager decode steps, median ms per step ({a.steps} steps, first 4 dropped); "
  f"{torch.cuda.get_device_name()}")
res = {}
for name, kind, impl in () if a.only_graph else (("sdpa + DynamicCache (bf16)", "dynamic", "sdpa"),
                                                  ("sdpa + StaticCache (bf16)", "static", "sdpa"),
                                                  ("fp4attn nvfp4 + FP4Cache", "fp4", fp4)):
    try:
        ms, held, peak, top = res[name] = per_token(kind, impl)
        P(f"  {name:30s} {ms:8.2f} ms/token   cache {held:6.2f} GiB, peak above the model during the steps "
          f"{peak:6.2f} GiB")
        P("      top kernels (ms per step): " + "; ".join(f"{n} {t:.2f}" for n, t in top))
    except Exception as e:  # e.g. out of memory for the bf16 caches at large B
        P(f"  {name:30s} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
        torch.cuda.empty_cache()
name = "fp4attn nvfp4 + FP4Cache, CUDA graph"
try:
    ms, held = per_token_graph()
    P(f"  {name:30s} {ms:8.2f} ms/token   cache {held:6.2f} GiB (reserved for the steps)")
except Exception as e:
    import traceback
    P(f"  {name:30s} failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    P(traceback.format_exc()[-2500:])
