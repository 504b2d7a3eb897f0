"""In-process A/B of the FP4 attention pre-pass (``kernels.attention.quantize_qkv``) and of ``fp4attn.quantize``:
the tree under OLD_SRC (package ``fp4attn_old``) against this one, per recipe and shape: every output tensor
compared bit for bit (also on adversarial inputs: ties, tiny and huge blocks, NaN / Inf), times min of
interleaved do_bench rounds.

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/markstein-s35/prep_ab.py
"""
import os
import sys

import torch
from triton.testing import do_bench

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
from fp4attn_old.kernels import attention as ka_old  # noqa: E402

from fp4attn.kernels import attention as ka  # noqa: E402

SHAPES = [tuple(int(x) for x in s.split(",")) for s in os.environ.get(
    "SHAPES", "16,16,4096,128;4,16,16384,128;16,16,4096,64").split(";")]
RECIPES = {"nvfp4": dict(fmt="nvfp4"), "sage3": dict(fmt="nvfp4", smooth_q=True, smooth_k=True),
           "mxfp4": dict(fmt="mxfp4")}
ROUNDS = int(os.environ.get("ROUNDS", "5"))
torch.manual_seed(0)


def _bits(x):  # bit patterns (NaN == NaN)
    if not x.dtype.is_floating_point:
        return x
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def same(a, b):
    bad = []
    for name, x, y in zip(a._fields, a, b):
        if isinstance(x, torch.Tensor):
            if not torch.equal(_bits(x), _bits(y)):
                bad.append(name)
        elif x != y and not (x is None and y is None):
            bad.append(name)
    return bad


def adversarial(shape):
    B, H, N, D = shape
    x = torch.randn(shape, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    blk = x.view(B, H, N, D // 16, 16)
    sc = torch.exp2(torch.randint(-30, 30, blk.shape[:-1], device="cuda", generator=g).float())[..., None]
    blk.mul_(sc)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], device="cuda")
    idx = torch.randint(0, 8, (N // 4, D), device="cuda", generator=g)
    x[:, :, : N // 4] = ties[idx] * torch.tensor(448 / 6.0, device="cuda")
    x[0, 0, 5, 3] = float("nan")
    x[0, 1, 7, 9] = float("inf")
    x[1, 0, 9, 17] = -float("inf")
    x[1, 1, 11, :16] = 1e-42
    return x.to(torch.bfloat16)


print(f"device: {torch.cuda.get_device_name()}", flush=True)
for B, H, N, D in SHAPES:
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for rname, kw in RECIPES.items():
        fo = lambda kw=kw, q=q, k=k, v=v: ka_old.quantize_qkv(q, k, v, **kw)  # noqa: E731
        fn = lambda kw=kw, q=q, k=k, v=v: ka.quantize_qkv(q, k, v, **kw)  # noqa: E731
        diff = same(fn(), fo())
        if B == 16 and D == 128:
            qa, kk, va = adversarial((2, 2, 256, D)), adversarial((2, 2, 256, D)), adversarial((2, 2, 256, D))
            diff += [f"adv:{n}" for n in same(ka.quantize_qkv(qa, kk, va, **kw), ka_old.quantize_qkv(qa, kk, va, **kw))]
        t_old = t_new = float("inf")
        for _ in range(ROUNDS):
            t_old = min(t_old, do_bench(fo, warmup=25, rep=100))
            t_new = min(t_new, do_bench(fn, warmup=25, rep=100))
        print(f"({B},{H},{N},{D}) {rname:6s} old {t_old * 1e3:7.1f} us  new {t_new * 1e3:7.1f} us  "
              f"new/old {t_new / t_old:.3f}  {'bit-equal' if not diff else 'DIFFER: ' + ','.join(diff)}", flush=True)

import fp4attn_old  # noqa: E402

import fp4attn  # noqa: E402

for shape, dim in (((8192, 8192), -1), ((8192, 8192), 0), ((16, 16, 4096, 128), -1)):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for fmt, kw in (("nvfp4", {}), ("nvfp4", {"global_scale": True}), ("mxfp4", {})):
        fo = lambda x=x, fmt=fmt, kw=kw, dim=dim: fp4attn_old.quantize(x, fmt, dim=dim, **kw)  # noqa: E731
        fn = lambda x=x, fmt=fmt, kw=kw, dim=dim: fp4attn.quantize(x, fmt, dim=dim, **kw)  # noqa: E731
        a, b = fn(), fo()
        eq = torch.equal(a.data, b.data) and torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))
        t_old = t_new = float("inf")
        for _ in range(ROUNDS):
            t_old = min(t_old, do_bench(fo, warmup=25, rep=100))
            t_new = min(t_new, do_bench(fn, warmup=25, rep=100))
        gbs = x.numel() * 2.5625 / t_new / 1e6
        print(f"quantize {tuple(shape)} dim={dim} {fmt}{'-global' if kw else ''}: old {t_old * 1e3:7.1f} us  "
              f"new {t_new * 1e3:7.1f} us ({gbs:.0f} GB/s)  new/old {t_new / t_old:.3f}  "
              f"{'bit-equal' if eq else 'DIFFER'}", flush=True)
