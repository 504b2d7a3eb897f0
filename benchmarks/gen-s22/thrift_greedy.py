"""greedy_generate with the ``thrift`` recipe (5% of the pages in 16 bits) now replays its decode steps from a CUDA
graph (page means on the device): ms per generated token, eager vs graph, next to ``nvfp4`` with a graph and
transformers' own greedy generate() with SDPA on its bf16 DynamicCache (random-weight Llama-like model, 16 layers,
D=128, 16/4 heads, as benchmarks/gen-s21/greedy.py). Per token: the time of a (NEW + 34)-token generation minus
that of a 34-token one, over NEW (both include the graph capture, which the difference cancels; best of two each).
$OUT/thrift_greedy.txt.

    PYTHONPATH=src python benchmarks/gen-s22/thrift_greedy.py
"""
import os
import sys

import torch

import fp4attn.integrations.transformers as fh

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "gen-s21"), os.path.join(HERE, "..", "decode-s10")]
from _llama import llama_like, ms_per_token  # noqa: E402
from _util import logger  # noqa: E402

P = logger("thrift_greedy.txt")
model, cfg = llama_like()
fp4 = fh.register("nvfp4")
thrift = fh.register("thrift", budget=0.05)


for B, L, NEW in ((8, 4096, 128), (32, 4096, 128)):
    ids = torch.randint(0, cfg.vocab_size, (B, L), device="cuda")
    res = {}
    for name, impl, fn in (
            ("transformers generate, sdpa + DynamicCache (bf16)", "sdpa",
             lambda n, x=ids: model.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)),
            ("greedy_generate nvfp4, CUDA graph", fp4, lambda n, x=ids: fh.greedy_generate(model, x, n)),
            ("greedy_generate thrift 5%, eager", thrift,
             lambda n, x=ids: fh.greedy_generate(model, x, n, cuda_graph=False)),
            ("greedy_generate thrift 5%, CUDA graph", thrift, lambda n, x=ids: fh.greedy_generate(model, x, n))):
        model.set_attn_implementation(impl)
        ms, res[name] = ms_per_token(fn, NEW, 34, repeats=2)
        P(f"B={B} prompt={L} new={NEW}: {name:52s} {ms:7.2f} ms/token")
    names = list(res)
    P(f"  thrift graph tokens == thrift eager tokens: {torch.equal(res[names[2]], res[names[3]])}; share of new "
      f"tokens equal to bf16 generate: nvfp4 {(res[names[1]][:, L:] == res[names[0]][:, L:]).float().mean().item():.3f}"
      f", thrift {(res[names[3]][:, L:] == res[names[0]][:, L:]).float().mean().item():.3f}")
    res.clear()
    torch.cuda.empty_cache()
