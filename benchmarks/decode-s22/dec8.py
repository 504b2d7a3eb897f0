"""Prototype (twenty-second session): the Gluon decode split kernel on FP8 tensor cores.

E2M1 codes are exact in E4M3 (the nibble-to-byte map of ``_nibbles_e4m3_lines``: code·2^-6), so K̂, ϕ(q),
V̂ᵀ and ϕ(P̃) codes go to ``mma.sync.m16n8k32.e4m3`` without any fp16 conversion or scale multiply; the
block scales are applied to the FP32 products instead. A product must then not mix two scale blocks:
the B operand is block-diagonal over the MMA's 8 columns = (2 scale blocks) x (4 query rows):

* Sᵀ: k-step j covers physical channels 32j .. 32j+31 = blocks 2j, 2j+1; column n = 4·(n//4) + q holds
  ϕ(q)'s codes of block 2j + n//4 (zero on the other block's channels). T_j[key, n] is the block's
  partial dot; S[key, q] = Σ_j Σ_b sk[key, b]·sq[q, b]·T_j[key, (b, q)].
* Oᵀ: the 32 keys of a tile are the k of one MMA; column n = 4·tb + q holds ϕ(P̃)'s codes of token
  block tb. O[ch, q] += sv[ch, tb]·sp[q, tb]·U[ch, (tb, q)].

Only G·n_q <= 4 query rows, D = 128, 32-key tiles, single-level P̃ (no Thrift).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from fp4attn.formats.triton_helpers import (
    _nibbles_e4m3_lines,
    block_amax,
    block_bad,
    e2m1_round,
    e2m1_round_abs,
    e4m3_round,
    rcp_approx,
)
from fp4attn.kernels._launch import fast, head_grid
from fp4attn.kernels._tiles import kv_head_program, online_softmax_step

# 4 packed bytes -> the E4M3 bytes of their low nibbles ($0) and of their high nibbles ($1)
NIB_PTX = tl.constexpr("\n".join(["{", ".reg .b32 t, u, ev, od;", *_nibbles_e4m3_lines("$2"),
                                  "mov.b32 $0, ev;", "mov.b32 $1, od;", "}"]))
# X = 4 channels of token pair p, Y = the same channels of pair p + 4 -> per channel c (output c) the E4M3
# bytes of keys (2p, 2p+1, 2p+8, 2p+9)
V_PTX = tl.constexpr("\n".join([
    "{", ".reg .b32 t, u, ev, od, z0, z1, e0, o0;",
    "prmt.b32 z0, $4, $5, 0x5140;", "prmt.b32 z1, $4, $5, 0x7362;",  # [X0, Y0, X1, Y1], [X2, Y2, X3, Y3]
    *_nibbles_e4m3_lines("z0"), "mov.b32 e0, ev;", "mov.b32 o0, od;",
    *_nibbles_e4m3_lines("z1"),
    "prmt.b32 $0, e0, o0, 0x5140;", "prmt.b32 $1, e0, o0, 0x7362;",
    "prmt.b32 $2, ev, od, 0x5140;", "prmt.b32 $3, ev, od, 0x7362;", "}"]))


@triton.jit
def _q_codes(xb):
    """fake_quant_blocks(xb, False, True) as (codes, scales)."""
    amax = block_amax(xb)
    s = e4m3_round(tl.math.div_rn(amax, 6.0))
    v = tl.math.div_rn(xb, s[:, :, None])
    v = tl.where(s[:, :, None] > 0, v, 0.0)
    bad = block_bad(xb)
    s = tl.where(bad != 0, float("nan"), s)
    return e2m1_round(v), s



@gluon.jit
def _split4(x):
    """(..., 4) -> its four slices along the last axis (a register axis)."""
    a, b = gl.split(gl.reshape(x, x.shape[:-1] + [2, 2]))  # last: bit 0
    x0, x2 = gl.split(a)
    x1, x3 = gl.split(b)
    return x0, x1, x2, x3


@gluon.jit
def _q_blocks(Q, b, h, Hkv, G, NQ, s_scale, D: gl.constexpr, LQ: gl.constexpr, LQ8: gl.constexpr,
              QJ: gl.constexpr, SJ: gl.constexpr):
    """ϕ(q) of the group's (at most 4) query rows: per 32-channel k-step j the block-diagonal operand (32 logical
    k, 8 columns n = 4·blk + q) in layout QJ's slice, and the column factors sq[q, 2j + n//4]·s_scale (8,) in SJ's."""
    rq = gl.arange(0, 4, layout=gl.SliceLayout(1, LQ))
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, LQ))
    q_rows = (b * Hkv + h).to(gl.int64) * G * NQ + rq
    q = gl.load(Q + q_rows[:, None] * D + dq[None, :], mask=(rq < G * NQ)[:, None], other=0.0).to(gl.float32)
    qc, qs = _q_codes(gl.reshape(q, [4, D // 16, 16]))
    cT = gl.permute(gl.reshape(qc, [4, D]), (1, 0))  # (D, 4)
    c8 = gl.convert_layout(gl.reshape(gl.permute(gl.join(cT, cT), (0, 2, 1)), [D, 8]), LQ8)  # n = 4·blk + q
    ch = gl.arange(0, D, layout=gl.SliceLayout(1, LQ8))
    nn = gl.arange(0, 8, layout=gl.SliceLayout(0, LQ8))
    qbd = gl.where(((ch >> 4) & 1)[:, None] == (nn >> 2)[None, :], c8, 0.0).to(gl.float8e4nv)
    # physical channel 32j + 8t + 2e + hh -> (j, logical k = 16hh + 4t + e)
    qbd = gl.reshape(gl.permute(gl.reshape(qbd, [D // 32, 4, 4, 2, 8]), (0, 3, 1, 2, 4)), [D // 32, 32, 8])
    qb0, qb1, qb2, qb3 = _split4(gl.convert_layout(gl.permute(qbd, (1, 2, 0)), QJ))
    sq = gl.reshape(gl.permute(gl.reshape(qs * s_scale, [4, D // 32, 2]), (2, 0, 1)), [8, D // 32])
    sq0, sq1, sq2, sq3 = _split4(gl.convert_layout(sq, SJ))
    return qb0, qb1, qb2, qb3, sq0, sq1, sq2, sq3


@gluon.jit
def _k_tile(KD, PT, b, h, t0, Hkv, MAXP, koff, BLOCK_N: gl.constexpr, D: gl.constexpr, PS: gl.constexpr):
    """The K codes of the BLOCK_N-key tile at t0 as E4M3 A operands of the four k-steps (key, byte 16j + 4t + e
    -> A_j[key, 16·nibble + 4t + e]), and the tile's storage (base, row0, off)."""
    page = gl.maximum(gl.load(PT + b * MAXP + t0 // PS), 0).to(gl.int64)
    off = t0 % PS
    base = page * Hkv + h
    row0 = base * PS + off
    kb = gl.load(KD + row0 * (D // 2) + koff)
    lo, hi = gl.inline_asm_elementwise(NIB_PTX, "=r,=r,r", [kb], dtype=(gl.float8e4nv, gl.float8e4nv),
                                       is_pure=True, pack=4)
    J = gl.permute(gl.join(gl.reshape(lo, [BLOCK_N, D // 32, 16]), gl.reshape(hi, [BLOCK_N, D // 32, 16])),
                   (0, 3, 2, 1))  # key, nibble, byte%16, j
    a0, a1, a2, a3 = _split4(gl.reshape(J, [BLOCK_N, 32, D // 32]))
    return a0, a1, a2, a3, base, row0, off


@gluon.jit
def _kernel(Q, KD, KS, VD, VS, PT, LENS, KG, VG, OP, MP, LP,
            qk_scale, Hkv, NQ, G, MAXP, TPS, NS,
            D: gl.constexpr, PS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
            LKB: gl.constexpr, LV8: gl.constexpr, LQ: gl.constexpr, LQ8: gl.constexpr, LS: gl.constexpr,
            LST: gl.constexpr, LP8: gl.constexpr, L24: gl.constexpr,
            PDL_TRIGGER: gl.constexpr = False):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    AOP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)
    BOP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4)
    COL: gl.constexpr = gl.SliceLayout(0, MMA)
    pid_s = gl.program_id(0)
    if PDL_TRIGGER:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    pid_bh, b, h, L, C = kv_head_program(LENS, Hkv)
    s_scale = qk_scale * gl.load(KG + pid_bh) * 64.0  # K codes come as value·2^-6
    vg = gl.load(VG + pid_bh) * 64.0

    # ---- ϕ(q): codes (block-diagonal B operands, one per k-step) and scales (per column) ----
    QJ: gl.constexpr = gl.BlockedLayout([1, 8, 4], [32, 1, 1], [1, 1, 1], [2, 1, 0])
    SJ: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [1, 1], [1, 0])
    qb0, qb1, qb2, qb3, sq0, sq1, sq2, sq3 = _q_blocks(Q, b, h, Hkv, G, NQ, s_scale, D, LQ, LQ8, QJ, SJ)
    qb0 = gl.convert_layout(qb0, BOP)
    qb1 = gl.convert_layout(qb1, BOP)
    qb2 = gl.convert_layout(qb2, BOP)
    qb3 = gl.convert_layout(qb3, BOP)
    sq0 = gl.convert_layout(sq0, COL)
    sq1 = gl.convert_layout(sq1, COL)
    sq2 = gl.convert_layout(sq2, COL)
    sq3 = gl.convert_layout(sq3, COL)

    cols = gl.arange(0, 4, layout=gl.SliceLayout(0, LS))
    last_key = L - NQ + cols % NQ
    keys0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LS))
    z = gl.permute(gl.zeros([BLOCK_N, 4], gl.float32, layout=LS), (1, 0))
    m_i = gl.max(z, 1) - float("inf")
    l_i = gl.sum(z, 1)
    acc = gl.zeros([D, 8], gl.float32, layout=MMA)

    # loop-invariant offsets
    kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LKB))
    koff = kr[:, None] * (D // 2) + gl.arange(0, D // 2, layout=gl.SliceLayout(0, LKB))[None, :]
    kc = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, MMA))
    nc = gl.arange(0, 8, layout=COL)
    ksoff = kc[:, None] * (D // 16) + (nc // 4)[None, :]  # + 2j
    vr = gl.arange(0, BLOCK_N // 2, layout=gl.SliceLayout(1, LV8))
    voff = vr[:, None] * D + gl.arange(0, D, layout=gl.SliceLayout(0, LV8))[None, :]
    m = gl.arange(0, D, layout=gl.SliceLayout(1, MMA))
    # logical row g + 8m0 + 16m1 + 32w0 + 64w1 -> physical channel 16g + 4w + 2m1 + m0
    dphys = 16 * (m % 8) + 4 * (m // 32) + 2 * ((m // 16) % 2) + (m // 8) % 2
    vsoff = (nc // 4)[None, :] * D + dphys[:, None]

    tb_ok = (gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LP8)) // 16)[:, None] == \
        (gl.arange(0, 8, layout=gl.SliceLayout(0, LP8)) // 4)[None, :]
    start = pid_s * TPS
    end = gl.minimum(start + TPS, C)
    for t0 in range(start, end, BLOCK_N):
        a0, a1, a2, a3, base, row0, off = _k_tile(KD, PT, b, h, t0, Hkv, MAXP, koff, BLOCK_N, D, PS)
        zero = gl.zeros([BLOCK_N, 8], gl.float32, layout=MMA)
        ks_ptr = KS + row0 * (D // 16) + ksoff
        t = mma_v2(gl.convert_layout(a0, AOP, assert_trivial=True), qb0, zero)
        s8 = t * gl.load(ks_ptr).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq0[None, :]
        t = mma_v2(gl.convert_layout(a1, AOP, assert_trivial=True), qb1, zero)
        s8 += t * gl.load(ks_ptr + 2).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq1[None, :]
        t = mma_v2(gl.convert_layout(a2, AOP, assert_trivial=True), qb2, zero)
        s8 += t * gl.load(ks_ptr + 4).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq2[None, :]
        t = mma_v2(gl.convert_layout(a3, AOP, assert_trivial=True), qb3, zero)
        s8 += t * gl.load(ks_ptr + 6).to(gl.float8e4nv, bitcast=True).to(gl.float32) * sq3[None, :]
        sT = gl.convert_layout(gl.sum(gl.reshape(s8, [BLOCK_N, 2, 4]), 1), LS)
        keys = t0 + keys0
        ok = (keys < C)[:, None] & (keys[:, None] <= last_key[None, :])
        sT = gl.where(ok, sT, float("-inf"))
        p, alpha, m_i, l_i = online_softmax_step(gl.permute(sT, (1, 0)), m_i, l_i, True)
        pb = gl.reshape(p, [4, 2, 16])
        sp = e4m3_round(gl.max(pb, 2) * (1.0 / 6.0))
        inv = rcp_approx(gl.maximum(sp, 0.001953125))
        pc = gl.permute(gl.reshape(e2m1_round_abs(pb * inv[:, :, None]), [4, BLOCK_N]), (1, 0))  # (key, q)
        p8 = gl.convert_layout(gl.reshape(gl.permute(gl.join(pc, pc), (0, 2, 1)), [BLOCK_N, 8]), LP8,
                               assert_trivial=True)  # n = 4·tb + q
        p8 = gl.where(tb_ok, p8, 0.0).to(gl.float8e4nv)
        # key 16hh + 8e1 + 2t + e0 -> logical k 16hh + 4t + 2e1 + e0
        pB = gl.convert_layout(gl.reshape(gl.permute(gl.reshape(p8, [2, 2, 4, 2, 8]), (0, 2, 1, 3, 4)),
                                          [BLOCK_N, 8]), BOP)
        sp8 = gl.convert_layout(gl.reshape(gl.permute(sp, (1, 0)), [8]), COL)
        a24 = gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, L24)), 0) + gl.zeros([2, 4], gl.float32, L24)
        alpha8 = gl.convert_layout(gl.reshape(a24, [8]), COL)
        # V
        vb = gl.load(VD + (base * (PS // 2) + off // 2) * D + voff)
        X, Y = gl.split(gl.permute(gl.reshape(vb, [2, 2, 4, D]), (0, 2, 3, 1)))  # (hh, t, ch), pair 8hh + 4y + t
        o0, o1, o2, o3 = gl.inline_asm_elementwise(V_PTX, "=r,=r,=r,=r,r,r", [X, Y],
                                                   dtype=(gl.float8e4nv,) * 4, is_pure=True, pack=4)
        # (hh, t, ch = 16g + 4w + k, m) = code of channel 16g + 4w + m, key slot k
        Jv = gl.join(gl.join(o0, o1), gl.join(o2, o3))  # ..., m1, m0
        Jv = gl.reshape(Jv, [2, 4, 8, 2, 2, 4, 2, 2])  # hh, t, g, w1, w0, k, m1, m0
        vA = gl.reshape(gl.permute(Jv, (3, 4, 6, 7, 2, 0, 1, 5)), [D, BLOCK_N])
        u = mma_v2(gl.convert_layout(vA, AOP, assert_trivial=True), pB, gl.zeros([D, 8], gl.float32, layout=MMA))
        sv = gl.load(VS + (base * (PS // 16) + off // 16) * D + vsoff).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        acc = acc * alpha8[None, :] + u * (sv * sp8[None, :])
    o4 = gl.sum(gl.reshape(acc * vg, [D, 2, 4]), 1)
    O4: gl.constexpr = gl.BlockedLayout([1, 4], [32, 1], [1, 1], [1, 0])
    o4 = gl.convert_layout(o4, O4)
    mo = gl.arange(0, D, layout=gl.SliceLayout(1, O4))
    co = gl.arange(0, 4, layout=gl.SliceLayout(0, O4))
    dph = 16 * (mo % 8) + 4 * (mo // 32) + 2 * ((mo // 16) % 2) + (mo // 8) % 2
    prow = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + co
    gl.store(OP + prow[None, :] * D + dph[:, None], o4, mask=(co < G * NQ)[None, :])
    cs = gl.arange(0, 4, layout=gl.SliceLayout(1, LST))
    prow2 = (pid_bh.to(gl.int64) * NS + pid_s) * BLOCK_M + cs
    gl.store(MP + prow2, m_i, mask=cs < G * NQ)
    gl.store(LP + prow2, l_i, mask=cs < G * NQ)


@functools.lru_cache(maxsize=None)
def layouts(D: int = 128, BLOCK_N: int = 32) -> dict:
    assert D == 128 and BLOCK_N == 32
    LKB = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0], [0, 16], [0, 32], [16, 0]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]], warp_bases=[], block_bases=[], shape=[32, 64])
    LV8 = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [4, 0], [8, 0]],
        lane_bases=[[1, 0], [2, 0], [0, 16], [0, 32], [0, 64]], warp_bases=[], block_bases=[], shape=[16, 128])
    LQ = gl.BlockedLayout([1, 4], [1, 32], [1, 1], [1, 0])
    LQ8 = gl.BlockedLayout([1, 8], [32, 1], [1, 1], [1, 0])
    # S (keys, q) after the sum over the two blocks: q0 in a register, q1 on lane bit 0 (lane bit 1 repeats)
    LS = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0], [16, 0]],
        lane_bases=[[0, 2], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=[], block_bases=[], shape=[32, 4])
    LST = gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [0, 8], [0, 16]],
        lane_bases=[[2, 0], [0, 0], [0, 1], [0, 2], [0, 4]], warp_bases=[], block_bases=[], shape=[4, 32])
    LP8 = gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [8, 0], [16, 0], [0, 4]],
        lane_bases=[[0, 2], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=[], block_bases=[], shape=[32, 8])
    L24 = gl.DistributedLinearLayout(reg_bases=[[0, 1]], lane_bases=[[0, 2], [1, 0], [0, 0], [0, 0], [0, 0]],
                                     warp_bases=[], block_bases=[], shape=[2, 4])
    return dict(LKB=LKB, LV8=LV8, LQ=LQ, LQ8=LQ8, LS=LS, LST=LST, LP8=LP8, L24=L24)


def launch(q, cache, pt, ks, vs, OP, MP, LP, qk_scale, NQ, G, maxp, TPS, num_splits, BLOCK_M, block_n,
           sel=None, ns_stride=None, maxnreg=None, pdl_trigger=False):
    assert sel is None and G * NQ <= 4 and block_n == 32
    B, _, _, D = q.shape
    Hkv = cache.num_kv_heads
    fast(_kernel)[head_grid(num_splits, B * Hkv)](
        q, cache.k_data, ks, cache.v_data, vs, pt, cache.seq_lens, cache.k_global_scale, cache.v_global_scale,
        OP, MP, LP, qk_scale, Hkv, NQ, G, maxp, TPS, ns_stride or num_splits,
        D=D, PS=cache.page_size, BLOCK_M=BLOCK_M, BLOCK_N=block_n, **layouts(D, block_n), num_warps=1,
        **({"maxnreg": maxnreg} if maxnreg else {}), **({"PDL_TRIGGER": True} if pdl_trigger else {}))
