import os, time, torch
from transformers import LlamaConfig, LlamaForCausalLM, DynamicCache
import fp4attn.integrations.transformers as fh
from fp4attn.kvcache import KVCache
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                  num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=40000)
m = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
impl = fh.register("nvfp4")
B, CTX, NEW = 4, 8192, 64
ids = torch.randint(0, 32000, (B, CTX), device="cuda")

def gen(n, impl_name, cache_fn):
    m.set_attn_implementation(impl_name)
    torch.cuda.synchronize(); t = time.perf_counter()
    with torch.no_grad():
        m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, past_key_values=cache_fn())
    torch.cuda.synchronize()
    return time.perf_counter() - t

def per_token(impl_name, cache_fn):
    gen(2, impl_name, cache_fn)
    a = min(gen(1, impl_name, cache_fn) for _ in range(2))
    b = min(gen(NEW + 1, impl_name, cache_fn) for _ in range(2))
    return (b - a) / NEW * 1e3

print(f"Llama-like 16 layers, d=2048, 32/8 heads (D=64), bf16, B={B}, prompt {CTX}, {NEW} new tokens; ms per generated token (decode steps only)", flush=True)
print(f"  sdpa + DynamicCache (bf16):            {per_token('sdpa', lambda: DynamicCache(config=cfg)):.2f}", flush=True)
print(f"  fp4attn nvfp4 + DynamicCache:          {per_token(impl, lambda: DynamicCache(config=cfg)):.2f}", flush=True)
print(f"  fp4attn nvfp4 + FP4Cache (this code):  {per_token(impl, lambda: fh.fp4_cache()):.2f}", flush=True)
orig = os.environ.get("FP4ATTN_KV_APPEND_KERNEL")
os.environ["FP4ATTN_KV_APPEND_KERNEL"] = "0"
KVCache.fp4attn_reads_pages = property(lambda self: False, lambda self, v: None)
print(f"  fp4attn nvfp4 + FP4Cache (dense views every step, torch append: before): {per_token(impl, lambda: fh.fp4_cache()):.2f}", flush=True)
