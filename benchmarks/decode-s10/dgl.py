"""Scratch: Gluon decode split kernel (Hopper, mma.sync, operands loaded straight into MMA layouts)."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from fp4attn.formats.triton_helpers import _E2M1_HALFWORDS_F16_PTX, fake_quant_p, fake_quant_rows
from fp4attn.kernels._tiles import online_softmax_step

_V_PTX = gl.constexpr("\n".join([
    "{", ".reg .b32 t, u, ev, od, p01, p23, s01, s23, f0, f1, f2, f3;", ".reg .b16 a0, a1, a2, a3, c0, c1, c2, c3;",
    "shl.b32 t, $4, 2;", "shl.b32 u, $4, 4;", "and.b32 u, u, 0x80808080;", "lop3.b32 ev, t, 0x1C1C1C1C, u, 0xEA;",
    "shr.b32 t, $4, 2;", "and.b32 u, $4, 0x80808080;", "lop3.b32 od, t, 0x1C1C1C1C, u, 0xEA;",
    "prmt.b32 p01, ev, od, 0x5140;", "prmt.b32 p23, ev, od, 0x7362;",
    "mov.b32 {a0, a1}, p01;", "mov.b32 {a2, a3}, p23;",
    "prmt.b32 s01, $5, 0, 0x1100;", "prmt.b32 s23, $5, 0, 0x3322;",
    "mov.b32 {c0, c1}, s01;", "mov.b32 {c2, c3}, s23;",
    "cvt.rn.f16x2.e4m3x2 f0, c0;", "cvt.rn.f16x2.e4m3x2 f1, c1;",
    "cvt.rn.f16x2.e4m3x2 f2, c2;", "cvt.rn.f16x2.e4m3x2 f3, c3;",
    "cvt.rn.f16x2.e4m3x2 $0, a0;", "cvt.rn.f16x2.e4m3x2 $1, a1;",
    "cvt.rn.f16x2.e4m3x2 $2, a2;", "cvt.rn.f16x2.e4m3x2 $3, a3;",
    "mul.rn.f16x2 $0, $0, f0;", "mul.rn.f16x2 $1, $1, f1;",
    "mul.rn.f16x2 $2, $2, f2;", "mul.rn.f16x2 $3, $3, f3;",
    "}"]))


@gluon.jit
def _split_kernel(Q, KD, KS, VD, VS, PT, LENS, KG, VG, OP, MP, LP,
                  qk_scale, Hkv, NQ, G, MAXP, TPS, NS,
                  D: gl.constexpr, PS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  LQ: gl.constexpr, LH: gl.constexpr, LKS: gl.constexpr, LV: gl.constexpr,
                  MMA: gl.constexpr):
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    pid_s = gl.program_id(0)
    pid_bh = gl.program_id(1)
    b = pid_bh // Hkv
    h = pid_bh % Hkv
    L = gl.load(LENS + b)
    C = L - L % 16
    # ---- q: ϕ(q) along D, columns permuted to the logical k order of the K fragments
    rq = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LQ))
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, LQ))
    q_rows = (b * Hkv + h).to(gl.int64) * G * NQ + rq
    q = gl.load(Q + q_rows[:, None] * D + dq[None, :], mask=(rq < G * NQ)[:, None], other=0.0).to(gl.float32)
    qf = fake_quant_rows(q, 16, False, True).to(gl.float16)
    qf = gl.reshape(qf, (BLOCK_M, 4, D // 32, 2, 2, 2))  # m, c, jh, e, sl, h
    qf = gl.reshape(gl.permute(qf, (0, 2, 4, 5, 1, 3)), (BLOCK_M, D))  # m, (jh, sl, h, c, e)
    qT = gl.convert_layout(gl.permute(qf, (1, 0)), BOP)
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, MMA))
    col_ok = cols < G * NQ
    last_key = L - NQ + cols % NQ
    kg = gl.load(KG + pid_bh)
    vg = gl.load(VG + pid_bh) * 64.0
    s_scale = qk_scale * kg * 64.0
    z = gl.permute(gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA), (1, 0))
    m_i = gl.max(z, 1) - float("inf")
    l_i = gl.sum(z, 1)
    accT = gl.zeros([D, BLOCK_M], gl.float32, layout=MMA)
    start = pid_s * TPS
    end = gl.minimum(start + TPS, C)
    KD16 = KD.cast(gl.pointer_type(gl.int16), bitcast=True)
    kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LH))
    kc = gl.arange(0, D // 4, layout=gl.SliceLayout(0, LH))
    sr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LKS))
    sc = gl.arange(0, D // 16, layout=gl.SliceLayout(0, LKS))
    vr = gl.arange(0, BLOCK_N // 2, layout=gl.SliceLayout(1, LV))
    vc = gl.arange(0, D, layout=gl.SliceLayout(0, LV))
    keys0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    for t0 in range(start, end, BLOCK_N):
        page = gl.load(PT + b * MAXP + t0 // PS).to(gl.int64)
        off = t0 % PS
        base = page * Hkv + h
        row0 = base * PS + off
        # ---- K tile: 16 bytes of one key row per thread, decoded into the A fragments
        kh = gl.load(KD16 + (row0 + kr)[:, None] * (D // 4) + kc[None, :])
        ksb = gl.load(KS + (row0 + sr)[:, None] * (D // 16) + sc[None, :]).to(gl.int16)
        ks2 = ksb | (ksb << 8)
        ks4 = gl.reshape(gl.join(gl.join(ks2, ks2), gl.join(ks2, ks2)), (BLOCK_N, D // 4))
        ks4 = gl.convert_layout(ks4, LH)
        o0, o1, o2, o3 = gl.inline_asm_elementwise(_E2M1_HALFWORDS_F16_PTX, "=r,=r,=r,=r,r,r", [kh, ks4],
                                                   dtype=(gl.float16, gl.float16, gl.float16, gl.float16),
                                                   is_pure=True, pack=2)
        J = gl.reshape(gl.join(gl.join(o0, o1), gl.join(o2, o3)), (BLOCK_N, 4, D // 32, 2, 2, 2))
        kA = gl.convert_layout(gl.reshape(gl.permute(J, (0, 2, 5, 4, 1, 3)), (BLOCK_N, D)), AOP,
                               assert_trivial=True)
        sT = mma_v2(kA, qT, gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA)) * s_scale
        keys = t0 + keys0
        ok = (keys < C)[:, None] & (keys[:, None] <= last_key[None, :]) & col_ok[None, :]
        s = gl.permute(gl.where(ok, sT, float("-inf")), (1, 0))
        p, alpha, m_i, l_i = online_softmax_step(s, m_i, l_i, True)
        pq = fake_quant_p(p, 16, False)
        pT = gl.convert_layout(gl.permute(pq.to(gl.float16), (1, 0)), BOP)
        # ---- V tile: 16 bytes (channels) of one token pair per thread, decoded into the A fragments of V^T
        vrow = base * (PS // 2) + off // 2 + vr
        vb = gl.load(VD + vrow[:, None] * D + vc[None, :])
        vsb = gl.load(VS + (base * (PS // 16) + (off + 2 * vr) // 16)[:, None] * D + vc[None, :])
        X, Y = gl.inline_asm_elementwise(_V_PTX, "=r,=r,=r,=r,r,r", [vb, vsb], dtype=(gl.float16, gl.float16),
                                         is_pure=True, pack=4)
        J = gl.reshape(gl.join(X, Y), (BLOCK_N // 2, 8, D // 32, 2, 2, 2))  # t2, r, w, a1, a0, z
        vA = gl.convert_layout(gl.reshape(gl.permute(J, (2, 5, 3, 1, 0, 4)), (D, BLOCK_N)), AOP,
                               assert_trivial=True)
        alpha_c = gl.convert_layout(alpha, gl.SliceLayout(0, MMA))
        accT = mma_v2(vA, pT, accT * alpha_c[None, :])
    accT = accT * vg
    m = gl.arange(0, D, layout=gl.SliceLayout(1, MMA))
    dphys = (D // 8) * (m % 8) + 4 * (m // 32) + 2 * ((m // 16) % 2) + (m // 8) % 2
    prow = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + cols
    gl.store(OP + prow[None, :] * D + dphys[:, None], accT, mask=col_ok[None, :])
    mc = gl.convert_layout(m_i, gl.SliceLayout(0, MMA))
    lc = gl.convert_layout(l_i, gl.SliceLayout(0, MMA))
    gl.store(MP + prow, mc, mask=col_ok)
    gl.store(LP + prow, lc, mask=col_ok)


def _log2(n):
    return n.bit_length() - 1


def layouts(D, BLOCK_N, BLOCK_M):
    assert D in (64, 128) and BLOCK_N in (16, 32, 64) and BLOCK_M in (8, 16)
    MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    LQ = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[1, 32], warps_per_cta=[1, 1], order=[1, 0])
    # K half-words (BLOCK_N, D/4): thread (r = lane/4, c = lane%4) holds D/16 consecutive half-words of rows r + 8i
    nh = _log2(D // 16)
    LH = gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(nh)] + [[8 << i, 0] for i in range(_log2(BLOCK_N // 8))],
        lane_bases=[[0, D // 16], [0, D // 8], [1, 0], [2, 0], [4, 0]], warp_bases=[], block_bases=[],
        shape=[BLOCK_N, D // 4])
    # K scale bytes (BLOCK_N, D/16): the D/64 blocks of the thread's half-words
    nb = _log2(D // 64)
    LKS = gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(nb)] + [[8 << i, 0] for i in range(_log2(BLOCK_N // 8))],
        lane_bases=[[0, D // 64], [0, D // 32], [1, 0], [2, 0], [4, 0]], warp_bases=[], block_bases=[],
        shape=[BLOCK_N, D // 16])
    # V bytes (BLOCK_N/2 token pairs, D): thread (r, c) holds channels r·D/8 .. +D/8 of token pairs c + 4i
    nv = _log2(D // 8)
    LV = gl.DistributedLinearLayout(
        reg_bases=[[0, 1 << i] for i in range(nv)] + [[4 << i, 0] for i in range(_log2(BLOCK_N // 8))],
        lane_bases=[[1, 0], [2, 0], [0, D // 8], [0, D // 4], [0, D // 2]], warp_bases=[], block_bases=[],
        shape=[BLOCK_N // 2, D])
    return dict(LQ=LQ, LH=LH, LKS=LKS, LV=LV, MMA=MMA)


def decode_fwd_gl(q, cache, *, scale, num_splits=None, block_n=32, per_sm=16, num_warps=1):
    import torch
    from fp4attn.kernels import decode as Dk
    B, Hq, NQ, D = q.shape
    Hkv = cache.num_kv_heads
    G = Hq // Hkv
    BLOCK_M = max(8, triton.next_power_of_2(G * NQ))
    PS = cache.page_size
    q = q.contiguous()
    committed = cache.committed_lengths()
    max_c = max(committed) if committed else 0
    if num_splits is None:
        num_splits = Dk.default_splits(B, Hkv, max_c, block_n, q.device, per_sm, None)
    tiles = max(1, -(-max_c // block_n))
    num_splits = max(1, min(int(num_splits), tiles))
    TPS = -(-tiles // num_splits) * block_n
    num_splits = max(1, -(-max_c // TPS)) if max_c else 1
    dev = q.device
    OP = torch.empty(B * Hkv * num_splits * BLOCK_M, D, dtype=torch.float32, device=dev)
    MP = torch.empty(B * Hkv * num_splits * BLOCK_M, dtype=torch.float32, device=dev)
    LP = torch.empty_like(MP)
    maxp = cache.page_table.shape[1]
    pt = cache.page_table if maxp else torch.zeros(B, 1, dtype=torch.int32, device=dev)
    ks, vs = cache.k_scale.view(torch.uint8), cache.v_scale.view(torch.uint8)
    _split_kernel[(num_splits, B * Hkv)](
        q, cache.k_data, ks, cache.v_data, vs, pt, cache.seq_lens, cache.k_global_scale, cache.v_global_scale,
        OP, MP, LP, scale * Dk.LOG2E, Hkv, NQ, G, max(maxp, 1), TPS, num_splits,
        D=D, PS=PS, BLOCK_M=BLOCK_M, BLOCK_N=block_n, **layouts(D, block_n, BLOCK_M), num_warps=num_warps)
    out = torch.empty(B, Hq, NQ, D, dtype=q.dtype, device=dev)
    lse = torch.empty(B, Hq, NQ, dtype=torch.float32, device=dev)
    Dk._decode_reduce_kernel[(B * Hq * NQ,)](OP, MP, LP, q, cache.k_tail, cache.v_tail, cache.seq_lens, out, lse,
                                             scale * Dk.LOG2E, num_splits, G * NQ, NQ, Hkv, BLOCK_M,
                                             BLOCK_S=max(2, triton.next_power_of_2(num_splits)), D=D, num_warps=4)
    return out, lse
