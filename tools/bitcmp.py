"""Bit-compatibility check between two builds of fp4attn on a GPU.

    PYTHONPATH=<old checkout>/src python tools/bitcmp.py run old.pt
    PYTHONPATH=src python tools/bitcmp.py run new.pt
    python tools/bitcmp.py cmp old.pt new.pt

``run`` computes a fixed set of outputs (Attn-QAT O and gradients for nvfp4/mxfp4 x causal, the inference
recipes, Thrift, decode, fake_quantize) from seeded inputs and saves them; ``cmp`` reports which differ and by
how much. Used to check that instruction-level rewrites of the shared Triton helpers keep the results.
"""
import sys, torch
if sys.argv[1] == "cmp":
    a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
    bad = 0
    for k in a:
        x, y = a[k], b[k]
        same = torch.equal(x.view(torch.int8) if x.is_floating_point() else x, y.view(torch.int8) if y.is_floating_point() else y) if x.shape == y.shape else False
        if not same:
            bad += 1
            d = (x.float() - y.float()).abs()
            print(f"DIFF {k}: max abs {d.nan_to_num().max().item():.3e} frac {(x != y).float().mean().item():.2e} nan {x.isnan().sum().item()} {y.isnan().sum().item()}")
    print(f"{len(a)} tensors compared, {bad} differ")
    sys.exit(0)
import fp4attn
torch.manual_seed(0)
out = {}
B, H, N, D = 2, 4, 1000, 128
q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for fmt in ("nvfp4", "mxfp4"):
    for causal in (False, True):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o = fp4attn.attn_qat(qg, kg, vg, causal=causal, fmt=fmt)
        o.backward(do)
        tag = f"qat-{fmt}-{causal}"
        out[tag + "-o"] = o.detach(); out[tag + "-dq"] = qg.grad; out[tag + "-dk"] = kg.grad; out[tag + "-dv"] = vg.grad
for recipe in ("nvfp4", "mxfp4", "sage3"):
    out[f"attn-{recipe}"] = fp4attn.attention(q, k, v, causal=True, recipe=recipe)
out["thrift"] = fp4attn.thrift_attention(q, k, v, causal=True, budget=0.1)
cache = fp4attn.KVCache.from_dense(k, v)
out["decode"] = fp4attn.decode(torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16), cache)
out["fq-nv"] = fp4attn.fake_quantize(q, "nvfp4", -1)
out["fq-mx"] = fp4attn.fake_quantize(q, "mxfp4", -2)
torch.save(out, sys.argv[2])
print("saved", len(out))
