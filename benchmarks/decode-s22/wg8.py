"""Prototype (twenty-second session): the decode split kernel on Hopper's FP8 ``wgmma`` (native QGMMA, no fp16
conversions), one warp group per program, 64-key tiles.

As ``dec8.py`` (E2M1 codes as E4M3, block scales applied to FP32 products, block-diagonal B operands), with:

* Sᵀ = K̂·ϕ(q)ᵀ: warp w holds keys 16w .. 16w+15 of the tile (the A operand from registers); ϕ(q)'s
  block-diagonal B operands (one per 32-channel k-step) in shared memory, once per program.
* Each warp's 16 keys are one P̃ block, and the P·V product puts each token block in its own 4 columns
  (block-diagonal ϕ(P̃) in shared memory): so each warp is a split of its own, with its own running max, and
  no warp waits for another's scores. The output columns of token block w get warp w's factors (running-max
  rescale, P̃ block scale) through shared memory; the four sub-splits are merged at the end of the program.
* Oᵀ = V̂ᵀ·ϕ(P̃)ᵀ: warp w holds channels of its own (the A operand), for all 64 keys.

Only G·n_q <= 4, D = 128, page size a multiple of 64.
"""

from __future__ import annotations

import functools

from dec8 import V_PTX, _k_tile, _q_blocks, _split4
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from fp4attn.formats.triton_helpers import e2m1_round_abs, e4m3_round, rcp_approx
from fp4attn.kernels._launch import fast, head_grid
from fp4attn.kernels._tiles import kv_head_program, online_softmax_step


@gluon.jit
def _kernel(Q, KD, KS, VD, VS, PT, LENS, KG, VG, OP, MP, LP,
            qk_scale, Hkv, NQ, G, MAXP, TPS, NS,
            D: gl.constexpr, PS: gl.constexpr, BLOCK_M: gl.constexpr,
            LKB: gl.constexpr, LV: gl.constexpr, LQ: gl.constexpr, LQ8: gl.constexpr, LS4: gl.constexpr,
            LPB: gl.constexpr, PDL_TRIGGER: gl.constexpr = False):
    BLOCK_N: gl.constexpr = 64
    ACC8: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 32])
    ACC16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 32])
    AOP8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC8, k_width=4)
    AOP16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC16, k_width=4)
    COL8: gl.constexpr = gl.SliceLayout(0, ACC8)
    COL16: gl.constexpr = gl.SliceLayout(0, ACC16)
    QSL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, 32], gl.float8e4nv)
    PSL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([16, 32], gl.float8e4nv)
    VEC: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    pid_s = gl.program_id(0)
    if PDL_TRIGGER:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    pid_bh, b, h, L, C = kv_head_program(LENS, Hkv)
    s_scale = qk_scale * gl.load(KG + pid_bh) * 64.0
    vg = gl.load(VG + pid_bh) * 64.0

    # ---- ϕ(q): block-diagonal B operands in shared memory (rows n = 4·blk + q, K-major) and column factors ----
    QJ: gl.constexpr = gl.BlockedLayout([1, 8, 4], [32, 1, 1], [1, 4, 1], [2, 1, 0])
    SJ: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0])
    qb0, qb1, qb2, qb3, sq0, sq1, sq2, sq3 = _q_blocks(Q, b, h, Hkv, G, NQ, s_scale, D, LQ, LQ8, QJ, SJ)
    q_s0 = gl.allocate_shared_memory(gl.float8e4nv, [8, 32], QSL, gl.permute(qb0, (1, 0)))
    q_s1 = gl.allocate_shared_memory(gl.float8e4nv, [8, 32], QSL, gl.permute(qb1, (1, 0)))
    q_s2 = gl.allocate_shared_memory(gl.float8e4nv, [8, 32], QSL, gl.permute(qb2, (1, 0)))
    q_s3 = gl.allocate_shared_memory(gl.float8e4nv, [8, 32], QSL, gl.permute(qb3, (1, 0)))
    sq0 = gl.convert_layout(sq0, COL8)
    sq1 = gl.convert_layout(sq1, COL8)
    sq2 = gl.convert_layout(sq2, COL8)
    sq3 = gl.convert_layout(sq3, COL8)
    p_s0 = gl.allocate_shared_memory(gl.float8e4nv, [16, 32], PSL)
    p_s1 = gl.allocate_shared_memory(gl.float8e4nv, [16, 32], PSL)
    a_s = gl.allocate_shared_memory(gl.float32, [16], VEC)
    sp_s = gl.allocate_shared_memory(gl.float32, [16], VEC)
    fence_async_shared()

    # running stats of the 16 sub-split rows (w, q), in the layout of the (w, q) x key view of the scores
    def_z = gl.reshape(gl.permute(gl.reshape(gl.zeros([BLOCK_N, 4], gl.float32, layout=LS4), [4, 16, 4]),
                                  (0, 2, 1)), [16, 16])
    m_i = gl.max(def_z, 1) - float("inf")
    l_i = gl.sum(def_z, 1)
    acc0 = gl.zeros([64, 16], gl.float32, layout=ACC16)
    acc1 = gl.zeros([64, 16], gl.float32, layout=ACC16)
    zero8 = gl.zeros([BLOCK_N, 8], gl.float32, layout=ACC8)
    zero16 = gl.zeros([64, 16], gl.float32, layout=ACC16)

    cols = gl.arange(0, 4, layout=gl.SliceLayout(0, LS4))
    last_key = L - NQ + cols % NQ
    keys0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LS4))
    kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LKB))
    koff = kr[:, None] * (D // 2) + gl.arange(0, D // 2, layout=gl.SliceLayout(0, LKB))[None, :]
    kc = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC8))
    ksoff = kc[:, None] * (D // 16) + (gl.arange(0, 8, layout=COL8) // 4)[None, :]
    vr = gl.arange(0, 32, layout=gl.SliceLayout(1, LV))
    voff = vr[:, None] * D + gl.arange(0, D, layout=gl.SliceLayout(0, LV))[None, :]
    r16 = gl.arange(0, 64, layout=gl.SliceLayout(1, ACC16))
    n16 = gl.arange(0, 16, layout=COL16)
    # logical row 16w + 8a + g of M-block mb -> physical channel 4(8w + g) + 2mb + a
    ph0 = 4 * (8 * (r16 // 16) + r16 % 8) + (r16 // 8) % 2
    vsoff0 = (n16 // 4)[None, :] * D + ph0[:, None]
    nP = gl.arange(0, 16, layout=gl.SliceLayout(1, LPB))
    kP = gl.arange(0, 64, layout=gl.SliceLayout(0, LPB))
    diag = (kP // 16)[None, :] == (nP // 4)[:, None]

    start = pid_s * TPS
    end = gl.minimum(start + TPS, C)
    for t0 in range(start, end, BLOCK_N):
        a0, a1, a2, a3, base, row0, off = _k_tile(KD, PT, b, h, t0, Hkv, MAXP, koff, BLOCK_N, D, PS)
        ks_ptr = KS + row0 * (D // 16) + ksoff
        t = warpgroup_mma(gl.convert_layout(a0, AOP8, assert_trivial=True), q_s0.permute((1, 0)), zero8,
                          use_acc=False)
        s8 = t * gl.load(ks_ptr).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq0[None, :]
        t = warpgroup_mma(gl.convert_layout(a1, AOP8, assert_trivial=True), q_s1.permute((1, 0)), zero8,
                          use_acc=False)
        s8 += t * gl.load(ks_ptr + 2).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq1[None, :]
        t = warpgroup_mma(gl.convert_layout(a2, AOP8, assert_trivial=True), q_s2.permute((1, 0)), zero8,
                          use_acc=False)
        s8 += t * gl.load(ks_ptr + 4).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq2[None, :]
        t = warpgroup_mma(gl.convert_layout(a3, AOP8, assert_trivial=True), q_s3.permute((1, 0)), zero8,
                          use_acc=False)
        s8 += t * gl.load(ks_ptr + 6).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq3[None, :]
        sT = gl.convert_layout(gl.sum(gl.reshape(s8, [BLOCK_N, 2, 4]), 1), LS4)
        keys = t0 + keys0
        sT = gl.where((keys < C)[:, None] & (keys[:, None] <= last_key[None, :]), sT, float("-inf"))
        s16 = gl.reshape(gl.permute(gl.reshape(sT, [4, 16, 4]), (0, 2, 1)), [16, 16])  # (w, q) x key
        p, alpha, m_i, l_i = online_softmax_step(s16, m_i, l_i, True)
        sp = e4m3_round(gl.max(p, 1) * (1.0 / 6.0))
        inv = rcp_approx(gl.maximum(sp, 0.001953125))
        pc = e2m1_round_abs(p * inv[:, None])
        # key 8e1 + 2t + e0 of a block -> logical 4t + 2e1 + e0; every block on the 64 keys, the diagonal kept
        pc = gl.reshape(gl.permute(gl.reshape(pc, [16, 2, 4, 2]), (0, 2, 1, 3)), [16, 16])
        pc = gl.reshape(gl.join(gl.join(pc, pc), gl.join(pc, pc)), [16, 16, 4])
        pc = gl.convert_layout(gl.reshape(gl.permute(pc, (0, 2, 1)), [16, 64]), LPB)
        pc = gl.where(diag, pc, 0.0).to(gl.float8e4nv)
        ph0_, ph1_ = gl.split(gl.permute(gl.reshape(pc, [16, 2, 32]), (0, 2, 1)))
        gl.thread_barrier()  # the previous tile's P·V read p_s*, a_s, sp_s
        p_s0.store(ph0_)
        p_s1.store(ph1_)
        a_s.store(alpha)
        sp_s.store(sp)
        fence_async_shared()
        gl.thread_barrier()
        alpha16 = a_s.load(COL16)
        sp16 = sp_s.load(COL16)
        # V
        vb = gl.load(VD + (base * (PS // 2) + off // 2) * D + voff)
        X, Y = gl.split(gl.permute(gl.reshape(vb, [2, 2, 2, 4, D]), (0, 1, 3, 4, 2)))  # s, hh, t, ch; y last
        o0, o1, o2, o3 = gl.inline_asm_elementwise(V_PTX, "=r,=r,=r,=r,r,r", [X, Y],
                                                   dtype=(gl.float8e4nv,) * 4, is_pure=True, pack=4)
        Jv = gl.reshape(gl.join(gl.join(o0, o1), gl.join(o2, o3)), [2, 2, 4, 4, 8, 4, 2, 2])  # s,hh,t,w,g,k,m1,m0
        Jv = gl.reshape(gl.permute(Jv, (6, 3, 7, 4, 0, 1, 2, 5)), [2, 64, 2, 32])  # mb, row | s, k
        Jv = gl.permute(Jv, (1, 3, 0, 2))  # row, k, mb, s
        v00, v01, v10, v11 = _split4(gl.reshape(Jv, [64, 32, 4]))  # (mb, s) = (0,0), (0,1), (1,0), (1,1)
        vs_ptr = VS + (base * (PS // 16) + off // 16) * D + vsoff0
        u = warpgroup_mma(gl.convert_layout(v00, AOP16, assert_trivial=True), p_s0.permute((1, 0)), zero16,
                          use_acc=False)
        u = warpgroup_mma(gl.convert_layout(v01, AOP16, assert_trivial=True), p_s1.permute((1, 0)), u)
        sv = gl.load(vs_ptr).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        acc0 = acc0 * alpha16[None, :] + u * (sv * sp16[None, :])
        u = warpgroup_mma(gl.convert_layout(v10, AOP16, assert_trivial=True), p_s0.permute((1, 0)), zero16,
                          use_acc=False)
        u = warpgroup_mma(gl.convert_layout(v11, AOP16, assert_trivial=True), p_s1.permute((1, 0)), u)
        sv = gl.load(vs_ptr + 2).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        acc1 = acc1 * alpha16[None, :] + u * (sv * sp16[None, :])

    # ---- merge the four sub-splits (token block w = warp w's keys) per query row ----
    gl.thread_barrier()
    a_s.store(m_i)
    sp_s.store(l_i)
    gl.thread_barrier()
    m16 = gl.reshape(a_s.load(COL16), [4, 4])  # (tb, q)
    l16 = gl.reshape(sp_s.load(COL16), [4, 4])
    M = gl.max(m16, 0)
    Mu = gl.where(M == float("-inf"), 0.0, M)
    wgt = gl.exp2(m16 - Mu[None, :])
    lq = gl.sum(wgt * l16, 0)
    w16 = gl.convert_layout(gl.reshape(wgt, [16]), COL16)
    O4: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [4, 1], [1, 0])
    mo = gl.arange(0, 64, layout=gl.SliceLayout(1, O4))
    co = gl.arange(0, 4, layout=gl.SliceLayout(0, O4))
    phm = 4 * (8 * (mo // 16) + mo % 8) + (mo // 8) % 2
    prow = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + co
    o = gl.convert_layout(gl.sum(gl.reshape(acc0 * w16[None, :] * vg, [64, 4, 4]), 1), O4)
    gl.store(OP + prow[None, :] * D + phm[:, None], o, mask=(co < G * NQ)[None, :])
    o = gl.convert_layout(gl.sum(gl.reshape(acc1 * w16[None, :] * vg, [64, 4, 4]), 1), O4)
    gl.store(OP + prow[None, :] * D + phm[:, None] + 2, o, mask=(co < G * NQ)[None, :])
    R1: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    cs = gl.arange(0, 4, layout=R1)
    prow2 = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + cs
    gl.store(MP + prow2, gl.convert_layout(M, R1), mask=cs < G * NQ)
    gl.store(LP + prow2, gl.convert_layout(lq, R1), mask=cs < G * NQ)


@functools.lru_cache(maxsize=None)
def layouts(D: int = 128) -> dict:
    assert D == 128
    W = [[16, 0], [32, 0]]
    LKB = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0], [0, 16], [0, 32]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]], warp_bases=W, block_bases=[], shape=[64, 64])
    # V bytes (32 token pairs, D): pair 16s + 8hh + 4y + t, channel 4(8w + g) + c
    LV = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [4, 0], [8, 0], [16, 0]],
        lane_bases=[[1, 0], [2, 0], [0, 4], [0, 8], [0, 16]], warp_bases=[[0, 32], [0, 64]], block_bases=[],
        shape=[32, 128])
    LQ = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    LQ8 = gl.BlockedLayout([1, 8], [32, 1], [4, 1], [1, 0])
    LS4 = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0]], lane_bases=[[0, 2], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=W,
        block_bases=[], shape=[64, 4])
    # ϕ(P̃) rows n = (w, q) on warp w; columns: bit 5 (the k-step) in a register
    LPB = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 32]], lane_bases=[[0, 4], [0, 8], [0, 16], [1, 0], [2, 0]],
        warp_bases=[[4, 0], [8, 0]], block_bases=[], shape=[16, 64])
    return dict(LKB=LKB, LV=LV, LQ=LQ, LQ8=LQ8, LS4=LS4, LPB=LPB)


def launch(q, cache, pt, ks, vs, OP, MP, LP, qk_scale, NQ, G, maxp, TPS, num_splits, BLOCK_M, block_n,
           sel=None, ns_stride=None, maxnreg=None, pdl_trigger=False):
    assert sel is None and G * NQ <= 4 and TPS % 64 == 0 and cache.page_size % 64 == 0
    B, _, _, D = q.shape
    Hkv = cache.num_kv_heads
    fast(_kernel)[head_grid(num_splits, B * Hkv)](
        q, cache.k_data, ks, cache.v_data, vs, pt, cache.seq_lens, cache.k_global_scale, cache.v_global_scale,
        OP, MP, LP, qk_scale, Hkv, NQ, G, maxp, TPS, ns_stride or num_splits,
        D=D, PS=cache.page_size, BLOCK_M=BLOCK_M, **layouts(D), num_warps=4,
        **({"maxnreg": maxnreg} if maxnreg else {}), **({"PDL_TRIGGER": True} if pdl_trigger else {}))
