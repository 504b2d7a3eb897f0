"""Bit-compatibility check between two builds of fp4attn on a GPU.

    PYTHONPATH=<old checkout>/src python tools/bitcmp.py run old.pt
    PYTHONPATH=src python tools/bitcmp.py run new.pt
    python tools/bitcmp.py cmp old.pt new.pt

``run`` computes a fixed set of outputs (Attn-QAT O and gradients for nvfp4/mxfp4 x causal, the inference
recipes, Thrift, decode, fake_quantize) from seeded inputs and saves them; ``cmp`` reports which differ and by
how much. Used to check that instruction-level rewrites of the shared Triton helpers keep the results.
"""

import sys

import torch


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int8) if t.is_floating_point() else t


def compare(path_a: str, path_b: str) -> int:
    a, b = torch.load(path_a), torch.load(path_b)
    bad = 0
    for name, x in a.items():
        y = b[name]
        if x.shape == y.shape and torch.equal(_bits(x), _bits(y)):
            continue
        bad += 1
        if x.shape != y.shape:
            print(f"DIFF {name}: shapes {tuple(x.shape)} vs {tuple(y.shape)}")
            continue
        d = (x.float() - y.float()).abs().nan_to_num()
        print(f"DIFF {name}: max abs {d.max().item():.3e}, fraction {(x != y).float().mean().item():.2e}, "
              f"NaN {x.isnan().sum().item()} / {y.isnan().sum().item()}")
    print(f"{len(a)} tensors compared, {bad} differ")
    return bad


def run(path: str) -> None:
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
            out.update({f"{tag}-o": o.detach(), f"{tag}-dq": qg.grad, f"{tag}-dk": kg.grad, f"{tag}-dv": vg.grad})
    for recipe in ("nvfp4", "mxfp4", "sage3"):
        out[f"attn-{recipe}"] = fp4attn.attention(q, k, v, causal=True, recipe=recipe)
    out["thrift"] = fp4attn.thrift_attention(q, k, v, causal=True, budget=0.1)
    cache = fp4attn.KVCache.from_dense(k, v)
    out["decode"] = fp4attn.decode(torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16), cache)
    out["fq-nv"] = fp4attn.fake_quantize(q, "nvfp4", -1)
    out["fq-mx"] = fp4attn.fake_quantize(q, "mxfp4", -2)
    torch.save(out, path)
    print("saved", len(out))


if __name__ == "__main__":
    if sys.argv[1] == "cmp":
        sys.exit(1 if compare(sys.argv[2], sys.argv[3]) else 0)
    run(sys.argv[2])
