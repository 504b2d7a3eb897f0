"""Compile every Triton kernel of fp4attn ahead of time for a CUDA target, on a machine without a GPU.

The interpreter tests (TRITON_INTERPRET=1) check the kernels' numerics but never run Triton's compiler,
so a kernel that only the compiler rejects (a non-constexpr global, a type mismatch between branches,
an unsupported op) passes them. This probe runs the public launchers on small CPU tensors with the
compiler enabled, records each kernel launch instead of executing it (nothing runs; outputs stay
uninitialized), and compiles every distinct recorded launch with ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", cap, 32))`` down to a cubin with the ptxas bundled with Triton.

Run as a script (``python tests/aot_probe.py [cap] [family ...]``); prints one JSON object
{family: [compiled kernel names]}, plus under "wgmma_serialized" {family: [kernel names]} the kernels whose
asynchronous wgmma ptxas serializes (its C7514 "Potential Performance Loss" note: it then waits for every
wgmma as soon as it is issued, a silent slowdown of the explicitly pipelined Gluon kernels). Used by
tests/test_aot_compile.py in a child process (the test session itself runs with TRITON_INTERPRET=1 on CPU
machines).
"""

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor

os.environ["TRITON_INTERPRET"] = "0"
os.environ["FP4ATTN_AUTOTUNE"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.uint8: "u8",
          torch.int32: "i32", torch.int64: "i64", torch.int8: "i8", torch.int16: "i16",
          torch.float8_e4m3fn: "fp8e4nv", torch.float64: "fp64", torch.bool: "i1"}
_RECORDED = []


def _record(self, *args, **kwargs):
    kwargs.pop("grid", None)
    kwargs.pop("warmup", None)
    _RECORDED.append((self, args, kwargs))


def _source(fn, sig, consts, attrs=None):
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel (explicit layouts)
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource(fn, sig, consts, attrs)
    return ASTSource(fn, sig, consts, attrs)


def compile_bound(fn, args, kwargs, cap):
    """triton.compile with the signature, constants and attributes a real launch would give, from Triton's
    own binder (pointer and integer arguments divisible by 16 get ``tt.divisibility=16``, integers equal to
    1 become constants; TMA tensor descriptors are typed by their block and layout)."""
    target = GPUTarget("cuda", cap, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, _ = binder(*args, **kwargs)
    names = [p.name for p in fn.params]
    sig = {n: s[0] for n, s in zip(names, spec)}
    consts = {(i,): v for i, (s, v) in enumerate(zip(sig.values(), bound.values())) if s == "constexpr"}
    attrs = {(i,): backend.parse_attr(s[1]) for i, s in enumerate(spec) if isinstance(s[1], str)}
    opts = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages", "maxnreg")}
    return triton.compile(_source(fn, sig, consts, attrs), target=target, options=opts)


def compile_launch(fn, args, kwargs, cap):
    # TMA descriptors, and Gluon kernels (explicit layouts: compiled with the 16-byte pointer alignment a
    # real launch specializes on, which their vectorized and asynchronous copies rely on): Triton's binder
    if getattr(fn, "is_gluon", lambda: False)() or any(type(a).__name__ == "TensorDescriptor" for a in args):
        return compile_bound(fn, args, kwargs, cap)
    names = [p.name for p in fn.params]
    bound = dict(zip(names, args))
    bound.update({k: v for k, v in kwargs.items() if k in names})
    sig, consts = {}, {}
    for p in fn.params:
        v = bound.get(p.name, p.default if p.has_default else None)
        if p.is_constexpr or v is None:
            sig[p.name] = "constexpr"
            consts[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _TYPES[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {p.name} of type {type(v).__name__}")
    opts = {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages", "maxnreg")}
    return triton.compile(_source(fn, sig, consts), target=GPUTarget("cuda", cap, 32), options=opts)


# ------------------------------------------------------------------------------------ families
def fam_quantize():
    from fp4attn.kernels import quantize as Q
    Q._check_device = lambda x: None  # a CPU tensor stands in for a CUDA one: nothing is launched
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    Q.quantize(x, "nvfp4", 1, scale_mode="rceil", global_scale=False)
    Q.fake_quantize(x, "nvfp4", 1, scale_mode="rceil", global_scale=True)
    Q.quantize(x, "mxfp4", 0, scale_mode="floor", global_scale=False)


def fam_attn_qat():
    from fp4attn.kernels import attn_qat as K
    q = torch.randn(1, 4, 256, 128, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16), torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
    for causal, fmt in ((True, "nvfp4"), (False, "mxfp4")):
        qf, kf, vf, op, lse = K.attn_qat_fwd_bhsd(q, k, v, torch.empty_like(q), causal=causal, scale=0.1,
                                                  fmt=fmt, hp_o=True)
        K.backward(torch.randn_like(q), op, qf, kf, vf, lse, torch.empty_like(q), torch.empty_like(k),
                   torch.empty_like(v), nq=256, nk=256, d=128, causal=causal, scale=0.1, fmt=fmt, quant_p=True)
    for causal, window in ((True, (63, 0)), (False, (40, 40))):  # sliding windows
        qf, kf, vf, op, lse = K.attn_qat_fwd_bhsd(q, k, v, torch.empty_like(q), causal=causal, scale=0.1,
                                                  fmt="nvfp4", hp_o=True, window=window)
        K.backward(torch.randn_like(q), op, qf, kf, vf, lse, torch.empty_like(q), torch.empty_like(k),
                   torch.empty_like(v), nq=256, nk=256, d=128, causal=causal, scale=0.1, fmt="nvfp4", quant_p=True,
                   window=window)
    K.attn_qat_fwd_bhsd(q, k, v, torch.empty_like(q), causal=True, scale=0.1, fmt="nvfp4", hp_o=True,
                        sinks=torch.zeros(4))  # attention sinks (the exact-max forward)


def fam_attention():
    from fp4attn.kernels import attention as A
    q = torch.randn(1, 4, 256, 128, dtype=torch.bfloat16)
    k, v = torch.randn(1, 2, 256, 128, dtype=torch.bfloat16), torch.randn(1, 2, 256, 128, dtype=torch.bfloat16)
    for fmt, staged, kw in (("nvfp4", True, {}), ("mxfp4", True, {}),
                            ("nvfp4", False, dict(smooth_q=True, smooth_k=True, two_level_p=True))):
        A.attention_fwd(q, k, v, causal=True, scale=0.1, fmt=fmt, path=A.PATH_HOPPER, staged=staged, **kw)
    for causal, window in ((True, (63, 0)), (False, (40, 40))):  # sliding windows (the Triton pass)
        A.attention_fwd(q, k, v, causal=causal, scale=0.1, path=A.PATH_HOPPER, window=window)
    sinks = torch.zeros(4)  # attention sinks: exact-max passes, and two-level (one pass) with smooth_k
    A.attention_fwd(q, k, v, causal=True, scale=0.1, path=A.PATH_HOPPER, sinks=sinks)
    A.attention_fwd(q, k, v, causal=True, scale=0.1, path=A.PATH_HOPPER, sinks=sinks, smooth_k=True, two_level_p=True)
    # the Gluon attention pass (Hopper): nvfp4, sage3 (two-level P, smooth_q) and nvfp4 with smooth_q, at D 128
    # and 64, causal or not
    if A.attention_gluon.HAVE_GLUON:
        A.attention_gluon.supported = lambda **kw: True  # CPU tensors stand in for CUDA ones
        os.environ["FP4ATTN_ATTN_KERNEL"] = "gluon"  # also where auto would take the Triton pass
        for d, causal in ((128, False), (64, True)):
            qd, kd = torch.randn(1, 4, 256, d, dtype=torch.bfloat16), torch.randn(1, 2, 256, d, dtype=torch.bfloat16)
            for kw in ({}, dict(smooth_q=True, smooth_k=True, two_level_p=True), dict(smooth_q=True)):
                A.attention_fwd(qd, kd, kd, causal=causal, scale=0.1, path=A.PATH_HOPPER, staged=True, **kw)
            # sliding windows (causal; both edges) and sinks on the Gluon passes: nvfp4 and sage3
            for kw in ({}, dict(smooth_q=True, smooth_k=True, two_level_p=True)):
                A.attention_fwd(qd, kd, kd, causal=True, scale=0.1, path=A.PATH_HOPPER, staged=True, window=(63, 0),
                                sinks=torch.zeros(4), **kw)
                A.attention_fwd(qd, kd, kd, causal=False, scale=0.1, path=A.PATH_HOPPER, staged=True, window=(40, 40),
                                **kw)
            # the row-max pass running the Q and V pre-passes (attention.Q_FUSED / V_FUSED, off in the op until
            # measured), its first K̂ loads before Q̂ is built or after
            fused = (A.Q_FUSED, A.V_FUSED, [c["K_FIRST"] for c in A.attention_gluon.ROWMAX_CONFIGS.values()])
            A.Q_FUSED = A.V_FUSED = True
            try:
                for k_first in (False, True):
                    for c in A.attention_gluon.ROWMAX_CONFIGS.values():
                        c["K_FIRST"] = k_first
                    A.attention_fwd(qd, kd, kd, causal=causal, scale=0.1, path=A.PATH_HOPPER, staged=True)
            finally:
                A.Q_FUSED, A.V_FUSED = fused[:2]
                for c, k_first in zip(A.attention_gluon.ROWMAX_CONFIGS.values(), fused[2]):
                    c["K_FIRST"] = k_first
        del os.environ["FP4ATTN_ATTN_KERNEL"]


def fam_thrift():
    from fp4attn.kernels import thrift as T
    q = torch.randn(1, 4, 512, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 512, 128, dtype=torch.bfloat16)
    T.thrift_fwd(q, k, torch.randn_like(k), causal=True, scale=0.1, budget=0.25)
    # a sliding window (selection and fused kernel) with attention sinks
    T.thrift_fwd(q, k, torch.randn_like(k), causal=True, scale=0.1, budget=0.25, window=(200, 0), sinks=torch.zeros(4))
    # the FP4 phase on the Gluon attention pass (thrift_mask) and the fused kernel's 16-bit phase after it
    if T._attention.attention_gluon.HAVE_GLUON:
        T._attention.attention_gluon.supported = lambda **kw: True  # CPU tensors stand in for CUDA ones
        T.gluon_fp4_phase = lambda q, window=None: True
        for d in (128, 64):
            qd, kd = torch.randn(1, 4, 512, d, dtype=torch.bfloat16), torch.randn(1, 2, 512, d, dtype=torch.bfloat16)
            T.thrift_fwd(qd, kd, torch.randn_like(kd), causal=True, scale=0.1, budget=0.25, sinks=torch.zeros(4))
            T.thrift_fwd(qd, kd, torch.randn_like(kd), causal=True, scale=0.1, budget=0.25, window=(200, 0))


def fam_decode():
    import fp4attn
    from fp4attn.kernels import decode as Dk
    k = torch.randn(2, 2, 300, 128, dtype=torch.bfloat16)
    cache = fp4attn.KVCache.from_dense(k, torch.randn_like(k))
    Dk.decode_fwd(torch.randn(2, 8, 1, 128, dtype=torch.bfloat16), cache, scale=0.1)
    Dk.decode_fwd(torch.randn(2, 8, 1, 128, dtype=torch.bfloat16), cache, scale=0.1, window=100)  # sliding window
    Dk.decode_fwd(torch.randn(2, 8, 1, 128, dtype=torch.bfloat16), cache, scale=0.1, sinks=torch.zeros(8))  # sinks
    # many query rows per kv head: the split kernel with the rows along M (64 rows; 32 at D = 64 with a window and
    # sinks, gpt-oss-like)
    Dk.decode_fwd(torch.randn(2, 8, 16, 128, dtype=torch.bfloat16), cache, scale=0.1, kernel="triton")
    k64 = fp4attn.KVCache.from_dense(*(torch.randn(2, 2, 300, 64, dtype=torch.bfloat16) for _ in range(2)))
    Dk.decode_fwd(torch.randn(2, 16, 4, 64, dtype=torch.bfloat16), k64, scale=0.1, kernel="triton", window=127,
                  sinks=torch.zeros(16))
    # a page of 48 tokens: 16-key tiles, transposed and with the rows along M
    c48 = fp4attn.KVCache.from_dense(k, torch.randn_like(k), page_size=48)
    for nq in (1, 16):
        Dk.decode_fwd(torch.randn(2, 8, nq, 128, dtype=torch.bfloat16), c48, scale=0.1, kernel="triton")
    # Thrift: the page selection kernels, then the split kernel reading their int8 selection
    c16 = fp4attn.KVCache.from_dense(k, torch.randn_like(k), lengths=[300, 100], keep_16bit=True)
    q = torch.randn(2, 8, 2, 128, dtype=torch.bfloat16)
    Dk.decode_fwd(q, c16, scale=0.1, selection=Dk.select_pages(q, c16, 0.05))
    # Thrift with a sliding window (the windowed selection kernels, then the split kernel with THRIFT and WINDOW)
    # and with sinks (THRIFT and SINKS): the Triton split kernel (Hopper runs the Gluon one, below)
    Dk.decode_fwd(q, c16, scale=0.1, selection=Dk.select_pages(q, c16, 0.05, window=100), window=100)
    Dk.decode_fwd(q, c16, scale=0.1, selection=Dk.select_pages(q, c16, 0.05), sinks=torch.zeros(8))
    # the Gluon split kernel (Hopper), D 128 and 64, 8 and 16 query rows, 32- and 64-key tiles
    if Dk.decode_gluon.HAVE_GLUON:
        for D, rows, bn in ((128, 8, 32), (64, 16, 64)):
            kd = torch.randn(2, 2, 300, D, dtype=torch.bfloat16)
            cg = fp4attn.KVCache.from_dense(kd, torch.randn_like(kd))
            qg = torch.randn(2, 4, rows // 2, D, dtype=torch.bfloat16)
            buf = torch.empty(64, D)
            Dk.decode_gluon.launch(qg, cg, cg.page_table, cg.k_scale.view(torch.uint8), cg.v_scale.view(torch.uint8),
                                   buf, buf[:, 0], buf[:, 1], 0.1, rows // 2, 2, cg.page_table.shape[1], 128, 3,
                                   max(8, rows), bn, maxnreg=Dk.gluon_maxnreg(False), pdl_trigger=D == 128)
        # the FP4 tiles with the next tile carried in registers (PIPE; the op's default at D = 64 / 128, <= 8 rows):
        # 4 and 8 rows, and with a sliding window and sinks
        for D in (128, 64):
            kd = torch.randn(2, 2, 300, D, dtype=torch.bfloat16)
            cg = fp4attn.KVCache.from_dense(kd, torch.randn_like(kd))
            buf = torch.empty(64, D)
            for nq, w_, s_ in ((1, None, None), (2, 100, buf[:, 2])):
                Dk.decode_gluon.launch(torch.randn(2, 8, nq, D, dtype=torch.bfloat16), cg, cg.page_table,
                                       cg.k_scale.view(torch.uint8), cg.v_scale.view(torch.uint8), buf, buf[:, 0],
                                       buf[:, 1], 0.1, nq, 4, cg.page_table.shape[1], 128, 3, 8, 32,
                                       maxnreg=Dk.gluon_maxnreg(False, Dk._GLUON_PIPE[D]["per_sm"]), pdl_trigger=True,
                                       window=w_, sink=s_, pipe=True)
        # Thrift on Hopper: the Gluon kernel without the selected pages, and the 16-bit stream kernel
        sel = torch.zeros(2, 8, c16.page_table.shape[1], dtype=torch.int8)
        buf = torch.empty(64, 128)
        Dk.decode_gluon.launch(q, c16, c16.page_table, c16.k_scale.view(torch.uint8), c16.v_scale.view(torch.uint8),
                               buf, buf[:, 0], buf[:, 1], 0.1, 2, 4, c16.page_table.shape[1], 128, 3, 8, 64, sel, 4,
                               maxnreg=Dk.gluon_maxnreg(True))
        for win in (False, True):  # the 16-bit stream, and with a sliding window
            Dk._decode_16bit_kernel[(4,)](q, c16.k16, c16.v16, c16.page_table, c16.seq_lens, sel, buf, buf[:, 0],
                                          buf[:, 1], 0.1, 2, 2, 4, c16.page_table.shape[1], 4, 3, 100, D=128, DP=128,
                                          PS=64, PPS=Dk._PAGES_16BIT, BLOCK_R=16, BLOCK_M=8, DOT_F32=False, WINDOW=win,
                                          STAGES=Dk._STAGES_16BIT, num_warps=4)
        # sliding windows and sinks in the Gluon kernel, FP4 and Thrift; and at D = 64 (gpt-oss's sliding layers)
        cg = fp4attn.KVCache.from_dense(*(torch.randn(2, 2, 300, 64, dtype=torch.bfloat16) for _ in range(2)))
        Dk.decode_gluon.launch(torch.randn(2, 8, 1, 64, dtype=torch.bfloat16), cg, cg.page_table,
                               cg.k_scale.view(torch.uint8), cg.v_scale.view(torch.uint8), buf[:, :64], buf[:, 0],
                               buf[:, 1], 0.1, 1, 4, cg.page_table.shape[1], 128, 3, 8, 32,
                               maxnreg=Dk.gluon_maxnreg(False), window=127, sink=buf[:, 2])
        # D = 64 and 48 (padded to 64) with the unmasked tiles' L2 prefetch (cp.async.bulk.prefetch, sm_90)
        c48d = fp4attn.KVCache.from_dense(*(torch.randn(2, 2, 300, 48, dtype=torch.bfloat16) for _ in range(2)))
        for cd, D in ((cg, 64), (c48d, 48)):
            Dk.decode_gluon.launch(torch.randn(2, 8, 1, D, dtype=torch.bfloat16), cd, cd.page_table,
                                   cd.k_scale.view(torch.uint8), cd.v_scale.view(torch.uint8), buf[:, :64], buf[:, 0],
                                   buf[:, 1], 0.1, 1, 4, cd.page_table.shape[1], 128, 3, 8, 32,
                                   maxnreg=Dk.gluon_maxnreg(False), l2_prefetch=True)
        # Thrift's selected pages inside the Gluon kernel (FUSED16): 64-channel tiles, D = 64 (bf16) and 48 (padded,
        # fp16), with a window and sinks
        for D, dt in ((64, torch.bfloat16), (48, torch.float16)):
            kd = torch.randn(2, 2, 300, D, dtype=dt)
            cf = fp4attn.KVCache.from_dense(kd, torch.randn_like(kd), lengths=[300, 100], keep_16bit=True)
            qf = torch.randn(2, 8, 2, D, dtype=torch.bfloat16)
            self_ = torch.zeros(2, 8, cf.page_table.shape[1], dtype=torch.int8)
            for w_, s_ in ((None, None), (100, buf[:, 2])):
                Dk.decode_gluon.launch(qf, cf, cf.page_table, cf.k_scale.view(torch.uint8),
                                       cf.v_scale.view(torch.uint8), buf[:, :64], buf[:, 0], buf[:, 1], 0.1, 2, 4,
                                       cf.page_table.shape[1], 128, 3, 8, 64, self_, 4, maxnreg=Dk.gluon_maxnreg(True),
                                       window=w_, sink=s_, fused16=True)
        # a kv group's selection (GROUP16: a selected page's tile from the 16-bit copy only): D = 128 with two new
        # tokens, D = 64 with a window and sinks
        for D, w_, s_ in ((128, None, None), (64, 100, buf[:, 2])):
            kd = torch.randn(2, 2, 300, D, dtype=torch.bfloat16)
            cf = fp4attn.KVCache.from_dense(kd, torch.randn_like(kd), lengths=[300, 100], keep_16bit=True)
            Dk.decode_gluon.launch(torch.randn(2, 8, 2, D, dtype=torch.bfloat16), cf, cf.page_table,
                                   cf.k_scale.view(torch.uint8), cf.v_scale.view(torch.uint8), buf[:, :D], buf[:, 0],
                                   buf[:, 1], 0.1, 2, 4, cf.page_table.shape[1], 128, 3, 8, 64,
                                   torch.zeros(2, 8, cf.page_table.shape[1], dtype=torch.int8), 4,
                                   maxnreg=Dk.gluon_maxnreg(True), window=w_, sink=s_, group16=True)
        for s_ in (None, sel):
            Dk.decode_gluon.launch(q, c16, c16.page_table, c16.k_scale.view(torch.uint8),
                                   c16.v_scale.view(torch.uint8), buf, buf[:, 0], buf[:, 1], 0.1, 2, 4,
                                   c16.page_table.shape[1], 128, 3, 8, 64 if s_ is not None else 32, s_, 4,
                                   maxnreg=Dk.gluon_maxnreg(s_ is not None), window=100, sink=buf[:, 2])
    # the generation step's one-token KV append (recorded, not run), with and without the 16-bit copy
    from fp4attn.kernels import kvcache as Kk
    kn = torch.randn(2, 2, 1, 128, dtype=torch.bfloat16)
    for c in (cache, c16):
        Kk.append_one(c, kn, kn)
    # a head dim that is not a power of two (96, Phi-3's): padded 128-channel tiles in the Gluon and the Triton split
    # kernels (transposed and rows along M), the reduce and the appends
    k96 = torch.randn(2, 2, 300, 96, dtype=torch.bfloat16)
    c96 = fp4attn.KVCache.from_dense(k96, torch.randn_like(k96))
    for nq, kern in ((1, "auto"), (1, "triton"), (16, "triton")):
        Dk.decode_fwd(torch.randn(2, 8, nq, 96, dtype=torch.bfloat16), c96, scale=0.1, kernel=kern)
    if Dk.decode_gluon.HAVE_GLUON:
        buf = torch.empty(64, 128)
        Dk.decode_gluon.launch(torch.randn(2, 8, 1, 96, dtype=torch.bfloat16), c96, c96.page_table,
                               c96.k_scale.view(torch.uint8), c96.v_scale.view(torch.uint8), buf, buf[:, 0], buf[:, 1],
                               0.1, 1, 4, c96.page_table.shape[1], 128, 3, 8, 32, maxnreg=Dk.gluon_maxnreg(False))
        # D = 256 (Gemma 2 / 3): 256-channel tiles, 12 programs per SM
        c256 = fp4attn.KVCache.from_dense(*(torch.randn(2, 2, 300, 256, dtype=torch.bfloat16) for _ in range(2)))
        Dk.decode_gluon.launch(torch.randn(2, 8, 1, 256, dtype=torch.bfloat16), c256, c256.page_table,
                               c256.k_scale.view(torch.uint8), c256.v_scale.view(torch.uint8), torch.empty(64, 256),
                               buf[:, 0], buf[:, 1], 0.1, 1, 4, c256.page_table.shape[1], 128, 3, 8, 32,
                               maxnreg=Dk.gluon_maxnreg(False, Dk._GLUON_WIDE[False]["per_sm"]))
        Dk.decode_fwd(torch.randn(2, 8, 1, 256, dtype=torch.bfloat16), c256, scale=0.1, kernel="triton")
    Kk.append_one(c96, k96[:, :, :1], k96[:, :, :1])
    Kk.append_slots(c96, k96[:, :, :32], k96[:, :, :32], [304, 304], [2, 2])


def fam_quartet():
    from fp4attn.kernels import quartet as Kq
    a = torch.randn(64, 256, dtype=torch.bfloat16)
    q8, mask, rs = Kq.quest_fp8(a)
    Kq.sr_fp8(a, sign_seed=1, noise_seed=2)
    Kq.sr_fp8(q8.t(), sign_seed=1, noise_seed=2, scale=rs)
    Kq.mask_ihadamard(a, mask, torch.bfloat16)
    Kq.mask_ihadamard(a, mask, torch.bfloat16, row_scale=rs, col_scale=torch.ones(256))  # the backward's
    # the forward's operands: E5M2 activation (+ its fix-up kernel), weight at its tensor offset, and the
    # GEMM's rescale kernel; the backward's SR quantizer of the saved E5M2 operand
    x5, m5, r5 = Kq.quest_e5m2(a)
    Kq.quest_e5m2(a, with_mask=False)
    w8, mw, rw, sw = Kq.quest_fp8(a, tensor_offset=True)
    Kq.fp8_gemm_e5m2(x5, r5, w8, rw, sw, torch.bfloat16)
    Kq.sr_fp8(x5.t(), sign_seed=1, noise_seed=2, scale=r5, a_fmt="e5m2")


FAMILIES = {name[4:]: fn for name, fn in dict(globals()).items() if name.startswith("fam_")}


def wgmma_serialized(ptx, cap):
    """Whether ptxas (Triton's bundled one, run again with -v on the kernel's PTX) serializes its wgmma: note
    C7514, e.g. "non wgmma instructions reading accumulator registers of a wgmma between start and end of the
    pipeline stage". False for kernels without wgmma."""
    if "wgmma.mma_async" not in ptx:
        return False
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([ptxas, f"-arch=sm_{cap}a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    return "C7514" in r.stdout + r.stderr


def compile_family(job):
    name, cap = job
    JITFunction.run = _record
    _RECORDED.clear()
    FAMILIES[name]()
    done, serialized, seen = [], [], set()
    for fn, args, kwargs in _RECORDED:
        key = (fn.__name__, repr(sorted(kwargs.items())),
               repr([a for a, p in zip(args, fn.params) if p.is_constexpr]))
        if key not in seen:
            seen.add(key)
            ck = compile_launch(fn, args, kwargs, cap)
            done.append(fn.__name__)
            if cap == 90 and wgmma_serialized(ck.asm["ptx"], cap):
                serialized.append(f"{fn.__name__} {key[1]}")
    return name, sorted(set(done)), serialized


if __name__ == "__main__":
    cap = int(sys.argv[1]) if len(sys.argv) > 1 else 90
    names = sys.argv[2:] or list(FAMILIES)
    with ProcessPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as ex:
        res = list(ex.map(compile_family, [(n, cap) for n in names]))
    out = {n: done for n, done, _ in res}
    out["wgmma_serialized"] = {n: ser for n, _, ser in res}
    print(json.dumps(out))
