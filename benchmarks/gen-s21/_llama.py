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
