"""Times fp4attn.attention (nvfp4 / mxfp4 / sage3) for the code on PYTHONPATH and saves the outputs, to
compare a variant tree (here: Triton's warp_specialize=True on the main loop) with the baseline."""
import sys

import torch
from triton.testing import do_bench

import fp4attn

tag = sys.argv[1]
torch.manual_seed(0)
res = {}
for (B, H, N, D, causal) in [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True)]:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fl = 4 * B * H * N * N * D / (2 if causal else 1)
    for r in ("nvfp4", "mxfp4", "sage3"):
        try:
            o = fp4attn.attention(q, k, v, causal=causal, recipe=r)
            t = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe=r), warmup=25, rep=100)
            res[(N, causal, r)] = o[:1].cpu()
            print(f"{tag} ({B},{H},{N},{D}) causal={causal} {r}: {t:.3f} ms {fl / t / 1e9:.0f} TF/s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{tag} {r} causal={causal}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
torch.save(res, f"{sys.argv[2]}/out_{tag}.pt")
