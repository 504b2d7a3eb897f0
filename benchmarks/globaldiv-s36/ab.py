"""In-process A/B of the global-scale NVFP4 quantization (one reciprocal per block instead of a division per value):
the tree under OLD_SRC (package ``fp4attn_old``) against this one. Bit-equality of every output on random and
adversarial tensors over global magnitudes 2^-120 .. 2^120 (both sides of the fast path's divisor range), then
times (min of interleaved do_bench rounds) of ``fp4attn.quantize`` / ``fake_quantize`` with ``global_scale=True`` and
of ``KVCache.from_dense`` (the cache quantizes K and V with per-(sequence, head) global scales).

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/globaldiv-s36/ab.py
"""
import os
import sys

import torch

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
import fp4attn_old  # noqa: E402
from _util import ab_best  # noqa: E402  (interleaved do_bench rounds)

import fp4attn  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "5"))
torch.manual_seed(0)


def best(fo, fn):
    return ab_best(fo, fn, ROUNDS)


def bits(x):
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def same_q(a, b):
    return (torch.equal(a.data, b.data) and torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))
            and torch.equal(a.global_scale.view(torch.int32), b.global_scale.view(torch.int32)))


def adversarial(shape, k, g):
    """N(0,1) blocks times random powers of two over 2^(k-40) .. 2^k, E2M1 ties on an E4M3 grid in a quarter of the
    rows, a few NaN / Inf / subnormal blocks."""
    x = torch.randn(shape, device="cuda", generator=g)
    blk = x.view(*shape[:-1], shape[-1] // 16, 16)
    blk.mul_(torch.exp2(torch.randint(k - 40, k + 1, blk.shape[:-1], device="cuda", generator=g).float())[..., None])
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], device="cuda")
    r = shape[0] // 4
    x[:r] = ties[torch.randint(0, 8, (r, shape[-1]), device="cuda", generator=g)] * 2.0 ** (k - 3)
    x[r, 3] = float("nan")
    x[r + 1, 9] = float("inf")
    x[r + 2, 17] = -float("inf")
    x[r + 3, :16] = 1e-42
    return x


print(f"device: {torch.cuda.get_device_name()}", flush=True)
g = torch.Generator(device="cuda").manual_seed(3)
bad = []
for k in (-120, -100, -80, -40, -10, 0, 10, 40, 80, 100, 120):
    for dt in (torch.float32, torch.bfloat16):
        x = adversarial((512, 1024), k, g).to(dt)
        for dim in (-1, 0):
            if not same_q(fp4attn.quantize(x, "nvfp4", dim=dim, global_scale=True),
                          fp4attn_old.quantize(x, "nvfp4", dim=dim, global_scale=True)):
                bad.append(f"quantize k={k} {dt} dim={dim}")
            a = fp4attn.fake_quantize(x, "nvfp4", dim=dim, global_scale=True)
            b = fp4attn_old.fake_quantize(x, "nvfp4", dim=dim, global_scale=True)
            if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(bits(a.nan_to_num(0)), bits(b.nan_to_num(0)))):
                bad.append(f"fake_quantize k={k} {dt} dim={dim}")
print(f"adversarial global-scale tensors, 2^-120 .. 2^120: {'bit-equal' if not bad else 'DIFFER: ' + '; '.join(bad)}",
      flush=True)

for shape, dim in (((8192, 8192), -1), ((8192, 8192), 0), ((16, 16, 4096, 128), -1), ((16, 16, 4096, 128), -2)):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for fmt, kw in (("nvfp4", {}), ("nvfp4", {"global_scale": True})):
        fo = lambda x=x, fmt=fmt, kw=kw, dim=dim: fp4attn_old.quantize(x, fmt, dim=dim, **kw)  # noqa: E731
        fn = lambda x=x, fmt=fmt, kw=kw, dim=dim: fp4attn.quantize(x, fmt, dim=dim, **kw)  # noqa: E731
        a, b = fn(), fo()
        eq = torch.equal(a.data, b.data) and torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))
        to, tn = best(fo, fn)
        gbs = x.numel() * 2.5625 / tn / 1e6
        print(f"quantize {tuple(shape)} dim={dim} {fmt}{'-global' if kw else ''}: old {to * 1e3:7.1f} us  "
              f"new {tn * 1e3:7.1f} us ({gbs:.0f} GB/s)  new/old {tn / to:.3f}  {'bit-equal' if eq else 'DIFFER'}",
              flush=True)
    fo = lambda x=x, dim=dim: fp4attn_old.fake_quantize(x, "nvfp4", dim=dim, global_scale=True)  # noqa: E731
    fn = lambda x=x, dim=dim: fp4attn.fake_quantize(x, "nvfp4", dim=dim, global_scale=True)  # noqa: E731
    eq = torch.equal(fo().view(torch.int16), fn().view(torch.int16))
    to, tn = best(fo, fn)
    print(f"fake_quantize {tuple(shape)} dim={dim} nvfp4-global: old {to * 1e3:7.1f} us  new {tn * 1e3:7.1f} us  "
          f"({x.numel() * 4 / tn / 1e6:.0f} GB/s)  new/old {tn / to:.3f}  {'bit-equal' if eq else 'DIFFER'}",
          flush=True)

for B, H, N, D in ((8, 8, 32768, 128), (1, 8, 131072, 128)):
    k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    fo = lambda k=k, v=v: fp4attn_old.KVCache.from_dense(k, v)  # noqa: E731
    fn = lambda k=k, v=v: fp4attn.KVCache.from_dense(k, v)  # noqa: E731
    co, cn = fo(), fn()
    eq = all(torch.equal(getattr(co, n).view(torch.uint8), getattr(cn, n).view(torch.uint8))
             for n in ("k_data", "v_data", "k_scale", "v_scale"))
    eq = eq and torch.equal(co.k_global_scale, cn.k_global_scale) and torch.equal(co.v_global_scale, cn.v_global_scale)
    to, tn = best(fo, fn)
    gb = k.numel() * 2 * 2 / 1e9
    print(f"KVCache.from_dense ({B},{H},{N},{D}) bf16: old {to:.3f} ms  new {tn:.3f} ms ({gb / tn * 1e3:.0f} GB/s of "
          f"K+V read)  new/old {tn / to:.3f}  {'bit-equal' if eq else 'DIFFER'}", flush=True)
