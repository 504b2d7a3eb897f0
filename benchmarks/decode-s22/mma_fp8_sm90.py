"""What ptxas makes of an FP8 ``mma.sync`` for sm_90 (no GPU needed): a one-warp Gluon kernel with one
``mma_v2`` of e4m3 operands (M=32, N=8, K=32: two ``mma.sync.m16n8k32...e4m3.e4m3.f32``) compiled for sm_90;
prints the PTX MMA count and the SASS conversion / MMA opcodes. On Triton 3.6's ptxas: two PTX MMAs become
four fp16 ``HMMA.16816.F32`` and 20 ``F2FP.F16.E4M3.UNPACK_B`` (Hopper has FP8 only in wgmma).

    PYTHONPATH=src python benchmarks/decode-s22/mma_fp8_sm90.py
"""
import collections
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "tests"), os.path.join(HERE, "..", "..", "tools")]
import sass_count  # noqa: E402
import torch  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

import aot_probe  # noqa: E402


@gluon.jit
def _k(A, B, C):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0])
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, L))
    cb = gl.arange(0, 8, layout=gl.SliceLayout(0, L))
    a = gl.load(A + r[:, None] * 32 + c[None, :]).to(gl.float8e4nv, bitcast=True)
    b = gl.load(B + r[:, None] * 8 + cb[None, :]).to(gl.float8e4nv, bitcast=True)
    acc = mma_v2(gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4)),
                 gl.convert_layout(b, gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=4)),
                 gl.zeros([32, 8], gl.float32, MMA))
    ro = gl.arange(0, 32, layout=gl.SliceLayout(1, MMA))
    co = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    gl.store(C + ro[:, None] * 8 + co[None, :], acc)


ck = aot_probe.compile_bound(_k, (torch.zeros(32, 32, dtype=torch.uint8), torch.zeros(32, 8, dtype=torch.uint8),
                                  torch.zeros(32, 8)), dict(num_warps=1), 90)
print("PTX mma.sync e4m3:", ck.asm["ptx"].count("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"))
ops = collections.Counter(op for _, op, _ in sass_count.parse(sass_count.cuobjdump(ck, "-sass")))
print("SASS:", {k: v for k, v in ops.items() if k.startswith(("HMMA", "F2FP", "QMMA"))})
