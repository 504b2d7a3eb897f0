"""Forty-ninth session: test_decode_gpu_many_splits_long_context's criteria over 40 seeded q (its q was unseeded).

    PYTHONPATH=src python benchmarks/order-s49/flaky_probe.py
"""
import os
import sys

sys.path.insert(0, "tests")
os.environ.setdefault("TRITON_INTERPRET", "0")
import torch  # noqa: E402

from fp4attn import reference  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402
from fp4attn.kvcache import KVCache  # noqa: E402
from fp4attn.ops.decode import decode_reference  # noqa: E402
from test_kvcache_decode import _kv, _rel  # noqa: E402

dev, D, L = "cuda", 128, 40000
k, v = _kv(1, 1, L, D, seed=63)
c = KVCache.from_dense(k.to(dev), v.to(dev))
exact_k, exact_v = k.to(dev), v.to(dev)
worst = []
for s in range(40):
    g = torch.Generator(device=dev).manual_seed(s)
    q = torch.randn(1, 4, 1, D, device=dev, dtype=torch.bfloat16, generator=g)
    out, lse = Dk.decode_fwd(q, c, scale=D ** -0.5)
    ref, ref_lse = decode_reference(q, c, scale=D ** -0.5)
    exact = reference.attention(q, exact_k, exact_v, causal=True, recipe="bf16")
    cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0).item()
    r1 = _rel(out, exact)
    r2 = 1.05 * _rel(ref, exact) + 2e-3
    dl = (lse - ref_lse.to(lse.device)).abs().max().item()
    one, _ = Dk.decode_fwd(q, c, scale=D ** -0.5, num_splits=40)
    r3 = _rel(out, one)
    ok = cos >= 0.995 and r1 <= r2 and dl <= 2e-3 and r3 <= 0.2
    print(f"seed {s}: cos {cos:.5f} rel {r1:.4f} <= {r2:.4f} dlse {dl:.1e} rel_one {r3:.3f} {'ok' if ok else 'FAIL'}")
