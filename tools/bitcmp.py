"""Bit-compatibility check between two builds of fp4attn on a GPU.

    PYTHONPATH=<old checkout>/src python tools/bitcmp.py run old.pt
    PYTHONPATH=src python tools/bitcmp.py run new.pt
    python tools/bitcmp.py cmp old.pt new.pt

``run`` computes a fixed set of outputs (Attn-QAT O and gradients for nvfp4/mxfp4 x causal, the inference
recipes, Thrift, decode, fake_quantize, the Quartet QuEST quantizer on random and adversarial bf16 / fp16 /
float32 operands) from seeded inputs and saves them; ``cmp`` reports which differ and by
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


def _quest_inputs() -> dict:
    """Seeded QuEST operands: Gaussian (one heavy column), and rows with zero / constant / NaN / Inf /
    huge / tiny groups, values whose Hadamard lands on E2M1 decision points, 2**-126..2**127 ranges."""
    from fp4attn.reference.quartet import hadamard_matrix

    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(4096, 2048, device="cuda", generator=g) * 2
    x[:, 3] *= 40
    y = torch.randn(1024, 1024, device="cuda", generator=g)
    y[0, :32] = 0.0
    y[1, 32:64] = 1.0
    y[2, :32] = float("nan")
    y[3, 5] = float("inf")
    y[4, 40] = -float("inf")
    y[5, :32] *= 1e37
    y[6, :64] = 3e38
    y[7, :32] *= 1e-30
    y[8, :32] *= 2.0 ** -120
    y[12, :32] = 2.0 ** torch.arange(-16, 16, device="cuda").float()
    y[13, :32] = -0.0
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.25, -2.5, 0.0, 7.0] * 2 + [0.5] * 8,
                     dtype=torch.float64, device="cuda")
    ties = t.reshape(1, 1, 32) * torch.exp2(torch.arange(-20, 20, device="cuda").double()).reshape(-1, 1, 1)
    y[16:56, :32] = (ties.reshape(-1, 32) @ hadamard_matrix(32, torch.float64, "cuda")).float()
    y[60:, :] *= torch.exp2(torch.randint(-60, 60, (1024 - 60, 1), device="cuda", generator=g).float())
    return {"gauss": x, "adversarial": y}


def _quest_outputs() -> dict:
    from fp4attn.kernels import quartet as kq

    out = {}
    for name, x in _quest_inputs().items():
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            xx = x.to(dt)
            for tag, res in (("fp8", kq.quest_fp8(xx)), ("mx", kq.quest_mxfp4(xx))):
                for i, r in enumerate(res):
                    out[f"quest-{name}-{str(dt)[6:]}-{tag}{i}"] = r
    return out


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
    out.update(_quest_outputs())
    torch.save(out, path)
    print("saved", len(out))


if __name__ == "__main__":
    if sys.argv[1] == "cmp":
        sys.exit(1 if compare(sys.argv[2], sys.argv[3]) else 0)
    run(sys.argv[2])
