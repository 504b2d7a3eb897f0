"""Fifty-fifth session probe (issue 4): the Q and V pre-passes inside the Gluon row-max pass for single-level nvfp4
(``quantize_qkv(q_fused=True, v_fused=True)``, ``attention_gluon._quantize_q`` / ``_quantize_v``;
``attention.Q_FUSED`` / ``V_FUSED = False``: the separate pre-passes, before), with the row-max pass's first K̂ loads
issued before Q̂ is built (``ROWMAX_CONFIGS[dp]["K_FIRST"]``) or after (``K_FIRST: False``, as before; all three
switches stay off in the op until this probe has run). Variants: "sep k0" (the tree before, the op's defaults), "q k0",
"q k1" (Q fused), "qv k1" (Q and V fused).

1. Exactness: the packed Q codes, scale bytes, row flags, staged V̂ᵀ, kv flags, outputs and LSE of every way, bit for
   bit, at ragged / GQA / bshd / window + sinks / non-finite shapes.
2. Time: eager op calls, quantization included, side by side with SDPA (flash, cuDNN); min over interleaved rounds
   (the order reversed every other round).
3. Where the time moved: per-kernel times of one causal call, separate against fused (torch.profiler).

    PYTHONPATH=src python benchmarks/qfuse-s55/probe.py [rounds]
"""
import os
import sys

import torch

import fp4attn
from fp4attn.kernels import attention as KA
from fp4attn.kernels import attention_gluon as AG

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "phi-words-s53"))
from probe import SHAPES, main, run_variants  # noqa: E402


def _env(q_on=False, v_on=False, k_first=False):
    """Switch the op's row-max pass (the defaults: the op's own, all off)."""
    KA.Q_FUSED, KA.V_FUSED = q_on, v_on
    for cfg in AG.ROWMAX_CONFIGS.values():
        cfg["K_FIRST"] = k_first


def buffers(q, k, v, causal, window=None, sinks=None):
    """The packed operands and outputs with the Q pre-pass separate / fused."""
    res = []
    for fq, fv in ((False, False), (True, False), (True, True)):
        pk = KA.quantize_qkv(q, k, v, fmt="nvfp4", path=KA.PATH_HOPPER, staged=True, key_perm=True,
                             key_rows=window is not None, q_fused=fq, v_fused=fv)
        out = torch.empty_like(q)
        lse = KA.attention_packed(pk, causal=causal, scale=q.shape[-1] ** -0.5, two_level_p=False, B=q.shape[0],
                                  Hq=q.shape[1], Hkv=k.shape[1], out=out, window=window, sinks=sinks)
        res.append((pk.qc, pk.qs, pk.qbad, pk.vh, pk.kvbad, out, lse))
    names = ("qc", "qs", "qbad", "vh", "kvbad", "out", "lse")
    return {n: all(torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, 0, 0, equal_nan=True)
                                         and torch.equal(a.isnan(), b.isnan())) for b in bs)
            for n, a, *bs in zip(names, *res)}


def exactness():
    g = torch.Generator(device="cuda").manual_seed(7)
    cases = []
    for (B, Hq, Hkv, Nq, Nk, D, causal) in [(2, 4, 4, 1000, 1000, 128, True), (1, 8, 2, 300, 777, 96, False),
                                            (2, 4, 1, 513, 513, 64, True), (1, 2, 2, 128, 4096, 128, True),
                                            (3, 4, 2, 77, 200, 40, False)]:
        q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.bfloat16, generator=g) * 3
        k = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.bfloat16, generator=g)
        cases.append((f"{(B, Hq, Hkv, Nq, Nk, D)} causal={causal}", q, k, v, causal, None, None))
    q, k, v = cases[0][1:4]
    qs = q.transpose(1, 2).contiguous().transpose(1, 2)  # a bshd tensor seen as bhsd (strided rows)
    cases.append(("bshd strides", qs, k, v, True, None, None))
    qn = q.clone()
    qn[0, 1, 5, 3] = float("nan")
    qn[1, 2, 999, 0] = float("inf")
    qn[1, 3, 130:140, :] = 0
    cases.append(("NaN / Inf / zero rows", qn, k, v, True, None, None))
    kn = k.clone()
    kn[0, 0, 17, 9] = float("nan")
    cases.append(("NaN in K", q, kn, v, True, None, None))
    vn = v.clone()
    vn[1, 3, 700, 100] = float("-inf")
    cases.append(("Inf in V", q, k, vn, True, None, None))
    cases.append(("bshd V strides", q, k, v.transpose(1, 2).contiguous().transpose(1, 2), False, None, None))
    cases.append(("window + sinks", q, k, v, True, (255, 0), torch.randn(4, device="cuda")))
    cases.append(("fp16 q", q.half(), k.half(), v.half(), False, None, None))
    cases.append(("fp32 q", q.float(), k.float(), v.float(), True, None, None))
    ok = True
    for name, q, k, v, causal, window, sinks in cases:
        r = buffers(q, k, v, causal, window, sinks)
        ok &= all(r.values())
        print(f"  {name:40s} {r}", flush=True)
    # the public op both ways
    q, k, v = cases[0][1:4]
    outs = []
    for on in (False, True):
        _env(on, on, on)
        outs.append(fp4attn.attention(q, k, v, causal=True, return_lse=True))
    same = all(torch.equal(a, b) for a, b in zip(*outs))
    print(f"  fp4attn.attention bit-equal fused / separate: {same}", flush=True)
    _env()
    print(f"EXACT {'OK' if ok and same else 'MISMATCH'}", flush=True)


def run_shape(B, H, N, D, causal, rounds):
    def prepare(name):
        if not name.startswith("nvfp4"):  # ("": the op's defaults; SDPA's rows)
            return _env()
        v_ = name.split()[-2]
        _env("q" in v_, "v" in v_, name.endswith("k1"))

    run_variants((B, H, N, D, causal), rounds, VARIANTS, prepare, "sep k0")  # sep k0: the code before this session


VARIANTS = ("sep k0", "q k0", "q k1", "qv k1")


def breakdown():
    """Per-kernel times of one op call after a sync (torch.profiler), separate pre-passes against both fused, at
    the causal D = 128 and D = 64 shapes: where the time moved (``voverlap-s54/steady.py``'s report)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "voverlap-s54"))
    from steady import one_call, report

    for D in (128, 64):
        q, k, v = (torch.randn(16, 16, 4096, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for on in (False, True):
            _env(on, on, on)
            ks = one_call(lambda: fp4attn.attention(q, k, v, causal=True))  # noqa: B023 (called at once)
            report(f"(16,16,4096,{D}) causal, {'Q and V fused' if on else 'separate pre-passes'}", ks, 1)
    _env()


if __name__ == "__main__":
    exactness()
    main(SHAPES, run_shape)
    breakdown()
