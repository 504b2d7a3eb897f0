"""Timing variants of the decode loop (wrong results; only to see what the time depends on)."""
import os, sys, torch
import triton, triton.language as tl
from fp4attn.kvcache import KVCache
from fp4attn.kernels import decode as Kd
from fp4attn.bench.decode import graph_time_ms

@triton.jit
def no_pq(p, BLOCK: tl.constexpr, IS_MX: tl.constexpr):
    return p

@triton.jit
def cheap_k(h, sc):
    hh = (h | sc).to(tl.float16, bitcast=True)
    return tl.reshape(tl.join(tl.join(hh, hh), tl.join(hh, hh)), (h.shape[0], 4 * h.shape[1]))

@triton.jit
def cheap_v(h, sc):
    hh = (h | sc).to(tl.float16, bitcast=True)
    return hh, hh, hh, hh

v = sys.argv[1]
if "nopq" in v: Kd.fake_quant_p = no_pq
if "ck" in v: Kd.unpack_e2m1_f16_scaled = cheap_k
if "cv" in v: Kd.e2m1_halfwords_f16 = cheap_v
bn = 16 if "bn16" in v else 32
torch.manual_seed(0)
B, Hq, Hkv, N, D = 8, 32, 8, 32768, 128
k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
c = KVCache.from_dense(k, torch.randn_like(k)); del k
q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
for per_sm in (8, 16):
    splits = Kd.default_splits(B, Hkv, N, bn, q.device, per_sm=per_sm)
    t = graph_time_ms(lambda: Kd.decode_fwd(q, c, scale=0.088, num_splits=splits, block_n=bn), 25)
    try:
        regs = [x.n_regs for x in Kd._decode_split_kernel.device_caches[0][0].values()]
    except Exception as e:
        regs = repr(e)[:80]
    print(f"{v} per_sm={per_sm} splits={splits}: {t:.4f} ms  regs={regs}", flush=True)
