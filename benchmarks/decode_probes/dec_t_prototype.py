"""Prototype: transposed decode tile (S^T = K q^T, O^T += V^T P^T): 4 query rows in the MMA's N."""
import sys, torch
import triton, triton.language as tl
from fp4attn.kvcache import KVCache
from fp4attn.kernels import decode as Kd
from fp4attn.bench.decode import graph_time_ms
from fp4attn.formats.triton_helpers import e2m1_halfwords_f16, fake_quant_p, fake_quant_rows, unpack_e2m1_f16_scaled


@triton.jit
def _tile_t(t0, accT, l_i, m_i, qT, s_scale, row_ok, last_key, C, b, h, KD, KS, VD, VS, PT, Hkv, MAXP,
            D: tl.constexpr, PS: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_n2 = tl.arange(0, BLOCK_N // 2)
    offs_n16 = tl.arange(0, BLOCK_N // 16)
    pidx = t0 // PS
    page = tl.load(PT + b * MAXP + pidx).to(tl.int64)
    off = t0 % PS
    base = page * Hkv + h
    row0 = base * PS + off
    offs_c16 = tl.arange(0, D // 16)
    ksb = tl.load(KS + (row0 + offs_n[:, None]) * (D // 16) + offs_c16[None, :])
    offs_c4 = tl.arange(0, D // 4)
    kh = tl.load(KD.to(tl.pointer_type(tl.int16)) + (row0 + offs_n[:, None]) * (D // 4) + offs_c4[None, :])
    ks4 = tl.reshape(tl.broadcast_to(ksb.to(tl.int16)[:, :, None], (BLOCK_N, D // 16, 4)), (BLOCK_N, D // 4))
    k = unpack_e2m1_f16_scaled(kh, ks4 | (ks4 << 8))
    sT = tl.dot(k, qT) * s_scale  # (BLOCK_N, RP)
    keys = t0 + offs_n
    ok = (keys < C)[:, None] & (keys[:, None] <= last_key[None, :]) & row_ok[None, :]
    sT = tl.where(ok, sT, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(sT, 0))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    pT = tl.math.exp2(sT - m_use[None, :])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(pT, 0)
    accT = accT * alpha[None, :]
    offs_c = tl.arange(0, D // 2)
    vh = tl.load(VD.to(tl.pointer_type(tl.int16)) + (base * (PS // 2) + off // 2 + offs_n2)[:, None] * (D // 2)
                 + offs_c[None, :])
    vs2 = tl.load(VS.to(tl.pointer_type(tl.int16)) + (base * (PS // 16) + off // 16 + offs_n16)[:, None] * (D // 2)
                  + offs_c[None, :])
    vs2 = tl.reshape(tl.broadcast_to(vs2[:, None, :], (BLOCK_N // 16, 8, D // 2)), (BLOCK_N // 2, D // 2))
    o0, o1, o2, o3 = e2m1_halfwords_f16(vh, vs2)
    x = tl.join(tl.join(o0, o2), tl.join(o1, o3))  # [t2, c, b, a] = code a + 2b
    vT = tl.reshape(tl.permute(x, (1, 2, 0, 3)), (D, BLOCK_N))  # [c, b, t2, a] -> (channel, token)
    pq = fake_quant_p(tl.trans(pT), 16, False)  # (RP, BLOCK_N)
    accT = tl.dot(vT, tl.trans(pq).to(tl.float16), accT)
    return accT, l_i, m_new


@triton.jit
def _split_t(Q, KD, KS, VD, VS, K16, V16, KT, VT, PT, LENS, KG, VG, SEL, OP, MP, LP,
             qk_scale, Hkv, NQ, G, MAXP, TPS, NS,
             D: tl.constexpr, PS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             J: tl.constexpr, THRIFT: tl.constexpr, DOT_F32: tl.constexpr, N_IT: tl.constexpr,
             F32_CACHE: tl.constexpr):
    RP: tl.constexpr = 4
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // Hkv
    h = pid_bh % Hkv
    L = tl.load(LENS + b)
    C = L - L % 16
    r = tl.arange(0, RP)
    row_ok = r < G * NQ
    qi = r % NQ
    last_key = L - NQ + qi
    offs_d = tl.arange(0, D)
    q_rows = (b * Hkv + h).to(tl.int64) * G * NQ + r
    q = tl.load(Q + q_rows[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0).to(tl.float32)
    qT = tl.trans(fake_quant_rows(q, 16, False, True).to(tl.float16))
    kg = tl.load(KG + pid_bh)
    vg = tl.load(VG + pid_bh)
    s_scale = qk_scale * kg * 64.0
    m_i = tl.full([RP], float("-inf"), tl.float32)
    l_i = tl.zeros([RP], tl.float32)
    accT = tl.zeros([D, RP], tl.float32)
    start = pid_s * TPS
    end = tl.minimum(start + TPS, C)
    for t0 in range(start, end, BLOCK_N):
        accT, l_i, m_i = _tile_t(t0, accT, l_i, m_i, qT, s_scale, row_ok, last_key, C, b, h, KD, KS, VD, VS,
                                 PT, Hkv, MAXP, D, PS, BLOCK_N)
    accT = accT * (vg * 64.0)
    prow = (pid_bh.to(tl.int64) * NS + pid_s) * BLOCK_M + r
    tl.store(OP + prow[None, :] * D + offs_d[:, None], accT, mask=row_ok[None, :])
    tl.store(MP + prow, m_i, mask=row_ok)
    tl.store(LP + prow, l_i, mask=row_ok)


if __name__ == "__main__":
    torch.manual_seed(0)
    for (B, Hq, Hkv, N, D) in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
        c = KVCache.from_dense(k, torch.randn_like(k)); del k
        q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
        ref, _ = Kd.decode_fwd(q, c, scale=0.088)
        t_ref = graph_time_ms(lambda: Kd.decode_fwd(q, c, scale=0.088), 25)
        orig = Kd._decode_split_kernel
        Kd._decode_split_kernel = _split_t
        res = []
        for bn, nw, ns, per_sm in ((32, 1, 2, 8), (32, 1, 3, 8), (32, 1, 2, 12), (32, 1, 2, 16), (64, 1, 2, 8),
                                   (64, 1, 3, 8), (64, 2, 2, 8), (64, 2, 2, 4), (32, 1, 3, 16), (64, 1, 2, 16)):
            splits = Kd.default_splits(B, Hkv, N, bn, q.device, per_sm=per_sm)
            try:
                out, _ = Kd.decode_fwd(q, c, scale=0.088, num_splits=splits, block_n=bn, num_warps=nw, num_stages=ns)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                t = graph_time_ms(lambda: Kd.decode_fwd(q, c, scale=0.088, num_splits=splits, block_n=bn,
                                                        num_warps=nw, num_stages=ns), 25)
                regs = [x.n_regs for x in _split_t.device_caches[0][0].values()]
            except Exception as e:
                print("ERR", bn, nw, ns, per_sm, repr(e)[:300], flush=True); continue
            print(f"({B},{N}) T bn={bn} w={nw} s={ns} per_sm={per_sm}: {t:.4f} ms vs current {t_ref:.4f} "
                  f"({t_ref / t:.2f}x) relerr {err:.2e} regs {regs}", flush=True)
        Kd._decode_split_kernel = orig
        del c; torch.cuda.empty_cache()
