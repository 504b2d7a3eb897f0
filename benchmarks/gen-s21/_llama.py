"""Shared by the generation benchmarks (gen-s21, gen-s22): the random-weight Llama-like model they time and a
synchronized wall-clock timer."""
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def llama_like(layers: int = 16, max_positions: int = 16384):
    """(model, config): d = 2048, 16/4 heads (D = 128), bf16 on CUDA, eval mode, seed 0."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=max_positions)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval(), cfg


def timed(fn, *args):
    """(seconds, result) of fn(*args), with the GPU synchronized before and after."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    r = fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t, r


def ms_per_token(fn, new: int, base: int, repeats: int = 1):
    """(ms per token, output of the last timed run): fn(n) generates n tokens. Warm-up fn(4), then
    (time of fn(base + new) - time of fn(base)) / new; the base run best of two, the long run best of
    ``repeats``. gen-s21 used base 2, one long run; gen-s22 base 34, two (both timed runs then include a graph
    capture, which the difference cancels)."""
    with torch.no_grad():
        fn(4)  # compiles
        t1 = min(timed(fn, base)[0] for _ in range(2))
        runs = [timed(fn, base + new) for _ in range(repeats)]
    return (min(r[0] for r in runs) - t1) / new * 1e3, runs[-1][1]


def prompt_forward_ms(model, ids, make_cache, runs: int = 3):
    """Best-of-``runs`` ms of the prompt's forward into a fresh cache from ``make_cache()`` (time to first token),
    after one untimed forward (gen-s22/prefill.py, globaldiv-s36/ttft.py)."""
    def forward():
        with torch.no_grad():
            return model(ids, past_key_values=make_cache(), use_cache=True)
    forward()
    return min(timed(forward)[0] for _ in range(runs)) * 1e3
