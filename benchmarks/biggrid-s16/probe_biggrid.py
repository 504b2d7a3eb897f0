"""Ops on inputs with B·H > 65535 (CUDA's grid y/z limit): does each op run, and does it match the same
call split into two halves along the batch? Usage: PYTHONPATH=src python benchmarks/biggrid-s16/probe_biggrid.py"""
import traceback

import torch

import fp4attn


def check(name, f, *tensors):
    try:
        out = f(*tensors)
        torch.cuda.synchronize()
        half = tensors[0].shape[0] // 2
        a = f(*(t[:half] for t in tensors))
        b = f(*(t[half:] for t in tensors))
        ref = torch.cat([a, b])
        print(f"{name}: ok, equal to the halves: {torch.equal(out, ref)}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: FAIL {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
        traceback.print_exc(limit=2)
        torch.cuda.synchronize()


B, H, N, D = 8200, 8, 64, 64  # B·H = 65600
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for r in ("nvfp4", "mxfp4", "sage3", "bf16"):
    check(f"attention {r}", lambda a, b, c, r=r: fp4attn.attention(a, b, c, recipe=r), q, k, v)
check("attention nvfp4 causal", lambda a, b, c: fp4attn.attention(a, b, c, causal=True), q, k, v)
check("thrift_attention", lambda a, b, c: fp4attn.thrift_attention(a, b, c, causal=True), q, k, v)
qg = q.requires_grad_(False)
check("attn_qat fwd", lambda a, b, c: fp4attn.attn_qat(a, b, c, causal=True), q, k, v)


def qat_grad(a, b, c):
    a = a.detach().requires_grad_(True)
    fp4attn.attn_qat(a, b, c, causal=True).float().square().sum().backward()
    return a.grad


check("attn_qat bwd (dq)", qat_grad, q, k, v)
check("quantize nvfp4", lambda a: fp4attn.quantize(a, "nvfp4").dequantize(), q)
del q, k, v
torch.cuda.empty_cache()
# decode: B·Hkv > 65535
B, Hq, Hkv, L = 8200, 16, 8, 48
k = torch.randn(B, Hkv, L, 64, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
try:
    cache = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    qd = torch.randn(B, Hq, 1, 64, device="cuda", dtype=torch.bfloat16)
    out = fp4attn.decode(qd, cache)
    torch.cuda.synchronize()
    print("KVCache.from_dense + decode: ok", flush=True)
    cache.append(torch.randn(B, Hkv, 1, 64, device="cuda", dtype=torch.bfloat16),
                 torch.randn(B, Hkv, 1, 64, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    print("KVCache.append: ok", flush=True)
    out = fp4attn.decode(qd, cache, thrift_budget=0.25)
    torch.cuda.synchronize()
    print("decode thrift: ok", flush=True)
except Exception as e:  # noqa: BLE001
    print(f"decode path: FAIL {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    traceback.print_exc(limit=3)
