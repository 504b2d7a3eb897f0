"""ptxas -v (sm_90, no GPU) of the Gluon decode split kernel's Thrift variants: registers and spill bytes of the
two-kernel path's FP4 kernel (THRIFT), FUSED16 and GROUP16, under the Thrift register cap.

    PYTHONPATH=src:tests python benchmarks/group16-s51/regs.py
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"
import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import aot_probe  # noqa: E402
import fp4attn  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402


def ptxas_v(ptx):
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        open(src, "w").write(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    txt = r.stdout + r.stderr
    regs = re.findall(r"Used (\d+) registers", txt)
    spill = re.findall(r"(\d+) bytes spill stores", txt)
    stack = re.findall(r"(\d+) bytes stack frame", txt)
    return regs, spill, stack


def main():
    JITFunction.run = aot_probe._record
    for D, dt, nq in ((128, torch.bfloat16, 1), (128, torch.bfloat16, 2), (64, torch.bfloat16, 1),
                      (96, torch.float16, 1)):
        kd = torch.randn(2, 2, 300, D, dtype=dt)
        c = fp4attn.KVCache.from_dense(kd, torch.randn_like(kd), lengths=[300, 100], keep_16bit=True)
        q = torch.randn(2, 8, nq, D, dtype=torch.bfloat16)
        sel = torch.zeros(2, 8, c.page_table.shape[1], dtype=torch.int8)
        buf = torch.empty(64, Dk.next_pow2(D))
        for mode in ("thrift", "fused16", "group16"):
            if mode == "fused16" and not Dk.decode_gluon.fused16_fits(D, 8, dt):
                continue
            for w_, s_ in ((None, None), (100, buf[:, 2])):
                aot_probe._RECORDED.clear()
                Dk.decode_gluon.launch(q, c, c.page_table, c.k_scale.view(torch.uint8), c.v_scale.view(torch.uint8),
                                       buf, buf[:, 0], buf[:, 1], 0.1, nq, 4, c.page_table.shape[1], 128, 3, 8, 64,
                                       sel, 4, maxnreg=Dk.gluon_maxnreg(True), window=w_, sink=s_,
                                       fused16=mode == "fused16", group16=mode == "group16")
                fn, args, kwargs = aot_probe._RECORDED[-1]
                ck = aot_probe.compile_launch(fn, args, kwargs, 90)
                print(f"D={D} nq={nq} {mode:8s} window={w_ is not None}: regs/spill/stack",
                      ptxas_v(ck.asm["ptx"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
