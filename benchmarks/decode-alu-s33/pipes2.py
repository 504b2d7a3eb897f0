"""Issue time of the integer multiply forms that can stand in for shifts (IMAD.SHL, IMAD.HI) and of their mixes with
the decode loop's other instructions, against an FP32 FMA chain (benchmarks/f2fp-s29/pipes.py's method and chains).

    PYTHONPATH=src python benchmarks/decode-alu-s33/pipes2.py     # $OUT/pipes2.txt
"""
import importlib.util
import os

import torch
import triton

_spec = importlib.util.spec_from_file_location(
    "f2fp_pipes", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "f2fp-s29", "pipes.py"))
P = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(P)

P.OPS.update({
    "imadhi": "mul.hi.u32 x{i}, x{i}, 0x20000001;",  # not a power of two: stays IMAD.HI
    "imadshl": "mul.lo.u32 x{i}, x{i}, 16;",  # IMAD.SHL
})
ROWS = [("ffma", ["ffma"]), ("lop3", ["lop3"]), ("prmt", ["prmt"]), ("shf", ["shf"]), ("hmul2", ["hmul2"]),
        ("imadhi", ["imadhi"]), ("imadshl", ["imadshl"]), ("imadhi+lop3", ["imadhi", "lop3"]),
        ("shf+lop3", ["shf", "lop3"]), ("imadhi+hmul2", ["imadhi", "hmul2"]), ("imadshl+hmul2", ["imadshl", "hmul2"]),
        ("imadhi+prmt+hmul2", ["imadhi", "prmt", "hmul2"]), ("shf+prmt+hmul2", ["shf", "prmt", "hmul2"]),
        ("f2fp+lop3", ["f2fp_e4m3", "lop3"]), ("f2fp+hmul2", ["f2fp_e4m3", "hmul2"]),
        ("f2fp+lop3+lop3+hmul2", ["f2fp_e4m3", "lop3", "lop3", "hmul2"]),
        ("prmt+lop3+lop3+hmul2", ["prmt", "lop3", "lop3", "hmul2"])]


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = sms * 16 * 256
    x = torch.arange(n, device="cuda", dtype=torch.int32)
    y = torch.empty_like(x)
    rows, base = [], None
    for name, kinds in ROWS:
        asm = P.asm_for(kinds)
        fn = lambda asm=asm: P._k[(n // 256,)](x, y, ASM=asm, BLOCK=256, num_warps=8)  # noqa: E731
        fn()
        ms = triton.testing.do_bench(fn, warmup=50, rep=200)
        per = ms / (8 * P.STEPS)
        base = base or per
        rows.append(f"{name:22s} {ms * 1e3:9.1f} us  time per instruction / FFMA's: {per / base:5.2f}")
    txt = torch.cuda.get_device_name() + f"\n{n} threads, 8 chains x {P.STEPS} steps each\n" + "\n".join(rows)
    print(txt)
    with open(os.path.join(os.environ.get("OUT", "."), "pipes2.txt"), "w") as f:
        f.write(txt + "\n")


if __name__ == "__main__":
    main()
