"""Static SASS instruction counts of fp4attn kernels for sm_90, without a GPU.

Attn-QAT inner loops (``fwd``, ``dkdv``), the decode split kernels' key-tile loops (``decode``; the Gluon
kernel of Hopper: ``decode_gl``, its Thrift variant ``decode_gl_thrift``), the
Quartet quantizers (``quest``, ``queste5``, ``sr``, ``fp8conv``), the FP4 attention pre-pass kernels (``prepq``,
``prepk``, ``prepv``: Q, K, V of ``quantize_qkv`` at D=128 with ``--fmt``, the sage3 smoothing with
``--smooth``) and ``fp4attn.quantize``'s kernels on a (8192, 1024) bf16 tensor (``quant``/``quantg``: along the
last dim without/with the global scale; ``quantc``/``quantcg``: along dim 0); straight-line kernels are reported
per value (static counts: both sides of a branch count).

Compiles ``_fwd_kernel`` and ``_bwd_dkdv_kernel`` of ``fp4attn.kernels.attn_qat`` the way a real launch
at (B, H, N, D) = (16, 16, 4096, 128) bf16 would (Triton's own argument specialization: pointer and
integer arguments divisible by 16 get ``tt.divisibility=16``, integers equal to 1 become constants),
with the default GPU configs, down to a cubin with the ptxas bundled with Triton; disassembles it with
the bundled ``cuobjdump -sass`` and reports, for every loop (a backward ``BRA``), the number of
instructions between the branch target and the branch, by opcode class, plus registers and spills.

    PYTHONPATH=src python tools/sass_count.py [fwd|dkdv|decode|decode_rowm|decode_gl|decode_gl_thrift|quest|queste5|sr|
                                               fp8conv|prepq|prepk|prepv ...]
                                              attn|attnmax ...] [--fmt nvfp4|mxfp4] [--smooth] [--dump DIR]

The first loop with the most HGMMA/HMMA instructions is the main (unmasked) key-tile loop of the
forward (the MXFP4 forward's row-max pre-pass loop has fewer) / the query-tile loop of dK/dV; it is the
number quoted in commit messages ("SASS per tile"). ``decode`` and the Quartet kernels are recorded from
their public launchers at benchmark-like shapes (B=8, Hq=32, Hkv=8, D=128 decode with the default config;
(8192, 1024) bf16 quantizer operands) through ``tests/aot_probe.py``'s launch recorder. ``SASS_PER_SM=n`` compiles
the Gluon decode kernels under the register cap of n programs per SM instead of their config's, ``SASS_PIPE=0``
their FP4 tiles without ``PIPE``; ``SASS_G=g`` with g query heads per kv head (default 4), ``SASS_KEY_PERM=0``
the Gluon attention passes on operands in key order (the op's are in ``_tiles.key_position`` order),
``SASS_Q_FUSED=1`` / ``SASS_V_FUSED=1`` (``=0``) the row-max pass running (not running) the Q / V pre-pass
(default: as the op, ``attention.Q_FUSED`` / ``V_FUSED``),
``SASS_D=d`` at head dim d (default 128; Thrift at d <= 64 compiles the fused 16-bit tile, as the op runs it;
also the attention kernels' head dim), and ``SASS_WINDOW=1`` the Gluon attention passes with a causal sliding
window and sinks. ``corr --smooth``: sage3's smooth_q table kernel (``smooth_q_corr``).
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
os.environ["FP4ATTN_AUTOTUNE"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from fp4attn.kernels import attn_qat as K  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import aot_probe  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)


def compile_like_launch(fn, args, kwargs):
    """triton.compile for sm_90 with the signature, constants and attributes a real launch would use."""
    return aot_probe.compile_bound(fn, args, kwargs, 90)


def cuobjdump(ck, flag):
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        return subprocess.run([os.path.join(BIN, "cuobjdump"), flag, f.name], check=True,
                              capture_output=True, text=True).stdout


def resources(ck):
    """'REG:.. STACK:.. SHARED:.. LOCAL:..' line of cuobjdump -res-usage (LOCAL > 0 means spills)."""
    m = re.search(r"(REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+)", cuobjdump(ck, "-res-usage"))
    return m.group(1) if m else "?"


_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def parse(sass):
    """[(address, opcode, full text)] in program order."""
    out = []
    for line in sass.splitlines():
        m = _INS.search(line)
        if m:
            text = m.group(2).strip()
            op = re.sub(r"^@!?U?P[T0-9]+\s+", "", text).split()[0]
            out.append((int(m.group(1), 16), op, text))
    return out


def loops(ins):
    """(start index, end index) of every backward branch's body, in program order of the branch."""
    idx = {a: i for i, (a, _, _) in enumerate(ins)}
    res = []
    for i, (a, op, text) in enumerate(ins):
        # a loop's back edge is predicated; an unconditional backward BRA returns from an out-of-line
        # block (Gluon's mbarrier spin loops) and spans no loop
        if op.startswith("BRA") and text.startswith("@"):
            m = re.search(r"0x([0-9a-f]+)", text)
            if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in idx:
                res.append((idx[int(m.group(1), 16)], i))
    return res


def classes(body):
    c = collections.Counter(op.split(".")[0] for _, op, _ in body)
    return dict(c.most_common())


def kernel_cases(fmt, which):
    qb, is_mx = K.quant_block(fmt)
    H, N, D = 16, 4096, 128  # B = 16 does not change the compiled code
    t = torch.empty(1, 1, 64, D, dtype=torch.bfloat16)  # only the pointers' types/alignment matter
    f32 = torch.empty(64)
    ostr = (H * N * D, N * D, D, 1)
    if "fwd" in which:
        cfg = K._default_config("fwd", D)
        nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
        args = (t, t, t, t, t, f32, *ostr, 0.1, H, 1, N, N, N, N, D)
        meta = dict(CAUSAL=False, HP_O=True, QB=qb, IS_MX=is_mx, EXACT_M=K.exact_max(), DP=D, **cfg,
                    num_warps=nw, num_stages=ns)
        yield "fwd", K._fwd_kernel, args, meta
    if "dkdv" in which:
        cfg = K._default_config("dkdv", D)
        nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
        args = (t, t, t, t, f32, f32, t, t, *ostr, *ostr, 0.1, 0.1, H, 1, N, N, N, N, D)
        meta = dict(CAUSAL=False, QUANT_P=True, QB=qb, IS_MX=is_mx, DP=D, **cfg, num_warps=nw, num_stages=ns)
        yield "dkdv", K._bwd_dkdv_kernel, args, meta


def recorded_cases(which, fmt="nvfp4", smooth=False):
    """(name, fn, args, kwargs, values per thread or None) of launches recorded from the public launchers."""
    from triton.runtime.jit import JITFunction

    from fp4attn.kernels import decode as Kd
    from fp4attn.kernels import quartet as Kq
    from fp4attn.kvcache import KVCache

    run = JITFunction.run
    JITFunction.run = aot_probe._record
    try:
        aot_probe._RECORDED.clear()
        if "decode" in which:
            k = torch.randn(8, 8, 1024, 128, dtype=torch.bfloat16)
            cache = KVCache.from_dense(k, torch.randn_like(k))
            aot_probe._RECORDED.clear()
            Kd.decode_fwd(torch.randn(8, 32, 1, 128, dtype=torch.bfloat16), cache, scale=0.088)
        if "decode_rowm" in which:  # 16 new tokens per sequence: 64 query rows per kv head (ROWM)
            k = torch.randn(8, 8, 1024, 128, dtype=torch.bfloat16)
            cache = KVCache.from_dense(k, torch.randn_like(k))
            Kd.decode_fwd(torch.randn(8, 32, 16, 128, dtype=torch.bfloat16), cache, scale=0.088)
        if "decode_gl" in which or "decode_gl_thrift" in which:  # the Gluon kernel at its default configs
            D = int(os.environ.get("SASS_D", 128))  # head dim (Thrift at <= 64: the fused 16-bit tile)
            k = torch.randn(8, 8, 1024, D, dtype=torch.bfloat16)
            cache = KVCache.from_dense(k, torch.randn_like(k), keep_16bit=True)  # (Thrift reads the 16-bit copy)
            G = int(os.environ.get("SASS_G", 4))  # query heads per kv head (8 / G channel parts per row when < 8)
            q = torch.randn(8, 8 * G, 1, D, dtype=torch.bfloat16)
            buf = torch.empty(64, D)
            mp = cache.page_table.shape[1]
            BLOCK_M = 8  # query rows per program (the op's for G <= 8, one new token)
            for thrift in (False, True):
                sel = torch.zeros(8, 8 * G, mp, dtype=torch.int8) if thrift else None
                bn = Kd._GLUON_CONFIG[thrift]["block_n"]
                # the FP4 tiles' PIPE where the op runs it (SASS_PIPE=0: without)
                pipe = os.environ.get("SASS_PIPE", "1") != "0" and Kd.decode_gluon.pipe_fits(D, BLOCK_M, bn, thrift)
                per_sm = int(os.environ.get("SASS_PER_SM", 0)) or (Kd._GLUON_PIPE[D]["per_sm"] if pipe else None)
                Kd.decode_gluon.launch(q, cache, cache.page_table, cache.k_scale.view(torch.uint8),
                                       cache.v_scale.view(torch.uint8), buf, buf[:, 0], buf[:, 1], 0.088, 1, G, mp,
                                       1024, 1, BLOCK_M, bn, sel, maxnreg=Kd.gluon_maxnreg(thrift, per_sm),
                                       fused16=thrift and Kd.decode_gluon.fused16_fits(D, BLOCK_M, cache.dtype),
                                       pipe=pipe)
        x = torch.randn(8192, 1024, dtype=torch.bfloat16)
        if "quest" in which or "fp8conv" in which:
            Kq.quest_fp8(x)
        if "queste5" in which:
            Kq.quest_e5m2(x)
        if "sr" in which:
            Kq.sr_fp8(x, sign_seed=1, noise_seed=2)
        if any(w.startswith("quant") for w in which):  # fp4attn.quantize, NVFP4, (8192, 1024) bf16
            from fp4attn.kernels import quantize as Kz
            xz = torch.randn(8192, 1024, dtype=torch.bfloat16)
            for glob in (False, True):
                for dim in (1, 0):  # the rows kernel (along the last dim) / the cols loop kernel
                    Kz._launch(xz, fmt, dim, "rceil", glob and fmt == "nvfp4", False)
        if any(w.startswith("prep") for w in which):
            from fp4attn.kernels import attention as Ka
            q = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
            Ka.quantize_qkv(q, torch.randn_like(q), torch.randn_like(q), fmt=fmt, path=Ka.PATH_HOPPER,
                            staged=True, smooth_q=smooth, smooth_k=smooth)
        if any(w in which for w in ("attn", "attnmax", "attn_gl", "attnmax_gl", "attnwin", "corr")):  # attention passes
            from fp4attn.kernels import attention as Ka
            q = torch.randn(1, 2, 256, int(os.environ.get("SASS_D", 128)), dtype=torch.bfloat16)
            pk = Ka.quantize_qkv(q, q, q, fmt=fmt, path=Ka.PATH_HOPPER, staged=True, smooth_q=smooth,
                                 smooth_k=smooth, key_rows="attnwin" in which)
            Ka.attention_packed(pk, causal=False, scale=0.088, two_level_p=smooth, B=1, Hq=2, Hkv=2,
                                out=torch.empty_like(q), kernel="triton")
            if "attnwin" in which:  # a causal sliding window (the attention pass)
                Ka.attention_packed(pk, causal=True, scale=0.088, two_level_p=smooth, B=1, Hq=2, Hkv=2,
                                    out=torch.empty_like(q), kernel="triton", window=(127, 0))
            if "attn_gl" in which or "attnmax_gl" in which:  # the Gluon passes (nvfp4; sage3 with --smooth); CPU
                # tensors stand in for CUDA ones
                Ka.attention_gluon.supported = lambda **kw: True
                perm = os.environ.get("SASS_KEY_PERM", "1") != "0"  # the op's key order (quantize_qkv(key_perm=True))
                win = os.environ.get("SASS_WINDOW", "0") == "1"  # a causal sliding window and sinks instead
                # single-level P: Q / V quantized by the row-max pass as the op does (SASS_Q_FUSED / SASS_V_FUSED)
                fused = perm and not smooth and os.environ.get("SASS_Q_FUSED", str(int(Ka.Q_FUSED))) != "0"
                vfused = perm and not smooth and os.environ.get("SASS_V_FUSED", str(int(Ka.V_FUSED))) != "0"
                pkg = Ka.quantize_qkv(q, q, q, fmt=fmt, path=Ka.PATH_HOPPER, staged=True, smooth_q=smooth,
                                      smooth_k=smooth, key_perm=perm, key_rows=win, q_fused=fused, v_fused=vfused)
                Ka.attention_packed(pkg, causal=win, scale=0.088, two_level_p=smooth, B=1, Hq=2, Hkv=2,
                                    out=torch.empty_like(q), kernel="gluon", window=(127, 0) if win else None,
                                    sinks=torch.zeros(2) if win else None)
        rec = list(aot_probe._RECORDED)
    finally:
        JITFunction.run = run
    names = {"decode": "_decode_split_kernel", "decode_rowm": "_decode_split_kernel",
             "decode_gl": "_decode_split_kernel_gl",
             "decode_gl_thrift": "_decode_split_kernel_gl", "quest": "_quest_mxfp4_kernel",
             "queste5": "_quest_mxfp4_kernel", "sr": "_sr_mxfp4_kernel",
             "fp8conv": "_mx_to_fp8_kernel", "prepq": "_prep_qk_kernel", "prepk": "_prep_qk_kernel",
             "prepv": "_prep_v_kernel", "attn": "_attn_fwd_kernel", "attnmax": "_attn_fwd_kernel",
             "attn_gl": "_attn_fwd_kernel_gl", "attnmax_gl": "_rowmax_kernel_gl",
             "attnwin": "_attn_fwd_kernel", "corr": "_smooth_q_corr_kernel", "quant": "_rows_kernel",
             "quantg": "_rows_kernel", "quantc": "_cols_loop_kernel", "quantcg": "_cols_loop_kernel"}
    for w in which:
        hits = [(fn, args, kwargs) for fn, args, kwargs in rec if fn.__name__ == names.get(w)]
        if w in ("attn", "attnmax", "attnwin"):  # PMAX 1: the row-max pass; the attention pass: 2 (0: two-level)
            hits = [h for h in hits if (h[2]["PMAX"] == 1) == (w == "attnmax") and h[2]["WINDOW"] == (w == "attnwin")]
        if w == "prepk":  # the K launch comes after Q's
            hits = hits[1:]
        if w in ("decode", "decode_rowm"):  # the transposed tiles / the query rows along M
            hits = [h for h in hits if h[2].get("ROWM", False) == (w == "decode_rowm")]
        if w.startswith("decode_gl"):  # the FP4 / the Thrift variant
            hits = [h for h in hits if h[2].get("THRIFT") == (w == "decode_gl_thrift")]
        if w.startswith("quant"):  # without / with the global scale
            hits = [h for h in hits if h[2]["GLOBAL"] == w.endswith("g")]
        if w in ("quest", "queste5"):  # packed MXFP4 (OUT 0) / E5M2 (OUT 1) output
            hits = [h for h in hits if h[2].get("OUT") == (w == "queste5")]
        for fn, args, kwargs in hits:
            if w.startswith("attn") or w == "corr":
                yield w, fn, args, kwargs, None
                break
            if w.startswith("prep"):
                rows = kwargs["BLOCK_T"]
                cols = kwargs.get("DC", kwargs["DP"])
            elif w in ("quant", "quantg"):
                rows, cols = kwargs["BM"], kwargs["NB"] * 16
            elif w.startswith("quantc"):
                rows, cols = kwargs["NB"] * 16, kwargs["BQ"]
            else:
                rows = kwargs.get("BLOCK_R", 1)
                cols = kwargs.get("BLOCK_K", kwargs.get("BLOCK_L"))
            per_thread = rows * cols / (32 * kwargs["num_warps"]) if cols else None
            yield w, fn, args, kwargs, per_thread
            break


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("which", nargs="*", default=["fwd", "dkdv"])
    ap.add_argument("--fmt", default="nvfp4")
    ap.add_argument("--dump", default=None, help="write <name>_<fmt>.sass/.ptx there")
    ap.add_argument("--all-loops", action="store_true")
    ap.add_argument("--smooth", action="store_true", help="prep*: the sage3 pre-pass (smooth_q, smooth_k)")
    a = ap.parse_args()
    cases = [(*c, None) for c in kernel_cases(a.fmt, a.which)]
    ap_rec = ("decode", "decode_rowm", "decode_gl", "decode_gl_thrift", "quest", "queste5", "sr", "fp8conv", "prepq",
              "prepk", "prepv", "attn", "attnmax", "attn_gl", "attnmax_gl", "attnwin", "corr", "quant", "quantg",
              "quantc", "quantcg")
    cases += list(recorded_cases([w for w in a.which if w in ap_rec], a.fmt, a.smooth))
    for name, fn, args, meta, per_thread in cases:
        ck = compile_like_launch(fn, args, meta)
        sass = cuobjdump(ck, "-sass")
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            for ext, txt in (("sass", sass), ("ptx", ck.asm["ptx"])):
                with open(os.path.join(a.dump, f"{name}_{a.fmt}.{ext}"), "w") as f:
                    f.write(txt)
        ins = parse(sass)
        print(f"== {name} {a.fmt}: {len(ins)} instructions, {resources(ck)}, shared memory per program "
              f"{ck.metadata.shared} bytes")
        if per_thread:  # a straight-line quantizer: one tile per program
            print(f"  {per_thread:.0f} values per thread: {len(ins) / per_thread:.1f} instructions per value")
            print("   ", classes(ins))
            continue
        found = loops(ins)
        n_mma = [sum(op.startswith(("HGMMA", "HMMA")) for _, op, _ in ins[s:e + 1]) for s, e in found]
        main = n_mma.index(max(n_mma)) if found else -1
        for j, (s, e) in enumerate(found):
            body = ins[s:e + 1]
            tag = "  <-- main loop" if j == main else ""
            if a.all_loops or tag:
                print(f"  loop [{ins[s][0]:#x}, {ins[e][0]:#x}]: {len(body)} instructions{tag}")
                print("   ", classes(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
