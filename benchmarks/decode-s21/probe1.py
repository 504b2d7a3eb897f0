"""Packed key halves in the Gluon decode kernel (session 21): exactness at one tile per split against the
reference composed over 16-key halves, agreement with the unpacked kernel, then CUDA-graph times against cuDNN
at `bench decode`'s shapes."""
import os
import sys

import torch

from fp4attn import reference
from fp4attn.bench.common import graph_time_ms
from fp4attn.kernels import decode as Dk
from fp4attn.ops.decode import decode_reference

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
from _util import SHAPES, decode_case, logger, print_times  # noqa: E402

import fp4attn  # noqa: E402

P = logger("probe1.txt")


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def composed(q, k, v, c, lens, part):
    """Reference over the dequantized cache, one-shot within each `part`-key chunk, chunks merged by LSE."""
    outs = []
    for b, L in enumerate(lens):
        os_, ls_ = [], []
        for a in range(0, L - L % 16, part):
            e = min(a + part, L - L % 16)
            sub = fp4attn.KVCache.from_dense(k[b:b + 1, :, a:e], v[b:b + 1, :, a:e],
                                             k_global_scale=c.k_global_scale[b:b + 1],
                                             v_global_scale=c.v_global_scale[b:b + 1])
            o, ls = decode_reference(q[b:b + 1], sub, scale=q.shape[-1] ** -0.5)
            os_.append(o.double())
            ls_.append(ls.double())
        ls_ = torch.stack(ls_)
        tot = torch.logsumexp(ls_, 0)
        outs.append(sum(torch.exp(x - tot)[..., None] * o for x, o in zip(ls_, os_)))
    return torch.cat(outs)


torch.manual_seed(0)
for (B, Hkv, G, nq, D, lens) in [(3, 2, 4, 1, 128, [320, 64, 1008]), (2, 2, 1, 1, 64, [512, 96]),
                                  (2, 4, 2, 1, 128, [256, 160]), (1, 8, 4, 1, 128, [4096])]:
    k = torch.randn(B, Hkv, max(lens), D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    k[..., :8] *= 8
    c = fp4attn.KVCache.from_dense(k, v, lengths=lens)
    q = torch.randn(B, Hkv * G, nq, D, device="cuda", dtype=torch.bfloat16)
    tiles = -(-max(lens) // 32)
    o2, l2 = Dk.decode_fwd(q, c, scale=D ** -0.5, num_splits=tiles, kernel="gluon", pack=2)
    o1, l1 = Dk.decode_fwd(q, c, scale=D ** -0.5, num_splits=tiles, kernel="gluon", pack=1)
    ot, lt = Dk.decode_fwd(q, c, scale=D ** -0.5, num_splits=tiles, kernel="triton")
    w16 = composed(q, k, v, c, lens, 16)
    w32 = composed(q, k, v, c, lens, 32)
    P(f"case B{B} Hkv{Hkv} G{G} nq{nq} D{D} lens{lens}: pack2 vs ref(16-key parts) {rel(o2, w16):.2e}, "
      f"pack1 vs ref(32-key parts) {rel(o1, w32):.2e}, triton vs ref(32) {rel(ot, w32):.2e}, "
      f"pack2 vs pack1 {rel(o2, o1):.2e}, lse diff {(l2 - l1).abs().max().item():.2e}")
    od, _ = Dk.decode_fwd(q, c, scale=D ** -0.5)
    od1, _ = Dk.decode_fwd(q, c, scale=D ** -0.5, pack=1)
    ref, _ = decode_reference(q, c, scale=D ** -0.5)
    ex = torch.cat([reference.attention(q[b:b + 1], k[b:b + 1, :, :L], v[b:b + 1, :, :L], causal=True, recipe="bf16")
                    for b, L in enumerate(lens)])
    P(f"   default splits: pack2 vs ref {rel(od, ref):.4f} vs exact {rel(od, ex):.4f}; pack1 vs ref {rel(od1, ref):.4f}"
      f" vs exact {rel(od1, ex):.4f}; ref vs exact {rel(ref, ex):.4f}")

# two new tokens of a 2-head group (causal among them: the chunked reference does not apply)
k = torch.randn(2, 4, 1500, 128, device="cuda", dtype=torch.bfloat16)
c = fp4attn.KVCache.from_dense(k, torch.randn_like(k), lengths=[1500, 700])
q = torch.randn(2, 8, 2, 128, device="cuda", dtype=torch.bfloat16)
o2, l2 = Dk.decode_fwd(q, c, scale=128 ** -0.5, num_splits=3, kernel="gluon", pack=2)
o1, l1 = Dk.decode_fwd(q, c, scale=128 ** -0.5, num_splits=3, kernel="gluon", pack=1)
ref, _ = decode_reference(q, c, scale=128 ** -0.5)
P(f"nq=2 G=2: pack2 vs pack1 {rel(o2, o1):.2e}, vs ref {rel(o2, ref):.4f} / {rel(o1, ref):.4f}, "
  f"lse diff {(l2 - l1).abs().max().item():.2e}")

for (B, Hq, Hkv, N, D) in SHAPES:
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    o2, _ = Dk.decode_fwd(q, cache, scale=D ** -0.5)
    o1, _ = Dk.decode_fwd(q, cache, scale=D ** -0.5, pack=1)
    ex = cud()
    P(f"accuracy {B, Hq, Hkv, N, D}: pack2 vs exact {rel(o2, ex):.4f}, pack1 vs exact {rel(o1, ex):.4f}, "
      f"pack2 vs pack1 {rel(o2, o1):.4f}")
    res = {}
    for _rep in range(3):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 40))
        for pk in (1, 2):
            for ps in (12, 16, 20):
                res.setdefault(f"pack{pk} ps{ps}", []).append(graph_time_ms(
                    lambda q=q, c=cache, d=D, p=pk, s=ps: Dk.decode_fwd(q, c, scale=d ** -0.5, pack=p, per_sm=s), 40))
    print_times(P, (B, Hq, Hkv, N, D), res, width=14)
    del k, v, cache
    torch.cuda.empty_cache()
