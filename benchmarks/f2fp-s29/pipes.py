"""Throughput of the decode loop's conversion and byte-permute instructions on this GPU (twenty-ninth session):
each thread runs 8 independent dependency chains of one PTX instruction, unrolled; the time per instruction is
compared with an FP32 FMA chain of the same shape (4 warp instructions per SM-cycle on Hopper). Mixed rows
interleave two kinds in separate chains: if they share a pipe the mix takes the sum of their times. (ptxas adds a
PRMT per F2FP to the pure F2FP chain, not to the mixed ones: read F2FP's cost from the mixes.)

    PYTHONPATH=src python benchmarks/f2fp-s29/pipes.py     # $OUT/pipes.txt
"""
import os

import torch
import triton
import triton.language as tl

OUT = os.environ.get("OUT", ".")
STEPS = 64  # unrolled steps per chain

# one step of a chain on the 32-bit register x{i} (i = chain), scratch y{i}
OPS = {  # chain i also reads chain j = i + 1 (mod 8) where the instruction takes two registers: no folding
    "ffma": "fma.rn.f32 x{i}, x{i}, 0f3F800001, 0f00000001;",
    "f2fp_e4m3": "mov.b32 {{l{i}, h{i}}}, x{i}; cvt.rn.f16x2.e4m3x2 x{i}, h{i};",
    "prmt": "prmt.b32 x{i}, x{i}, x{j}, 0x5140;",
    "lop3": "lop3.b32 x{i}, x{i}, x{j}, k, 0xEA;",
    "shf": "shf.r.wrap.b32 x{i}, x{i}, x{j}, 3;",
    "hmul2": "mul.rn.f16x2 x{i}, x{i}, k;",
}


def asm_for(kinds):
    chains = 8
    lines = ["{", ".reg .b32 z, k, " + ", ".join(f"x{i}" for i in range(chains)) + ";",
             ".reg .b16 " + ", ".join(f"l{i}, h{i}" for i in range(chains)) + ";",
             "mov.b32 z, 0;", "mov.b32 k, 0x3C013C01;"]
    lines += [f"add.u32 x{i}, $1, {i};" for i in range(chains)]
    for _ in range(STEPS):
        for i in range(chains):
            lines.append(OPS[kinds[i % len(kinds)]].format(i=i, j=(i + 1) % chains))
    lines.append("xor.b32 $0, x0, x1;")
    lines += [f"xor.b32 $0, $0, x{i};" for i in range(2, chains)]
    lines.append("}")
    return "\n".join(lines)


@triton.jit
def _k(X, Y, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + offs)
    y = tl.inline_asm_elementwise(ASM, "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(Y + offs, y)


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = sms * 16 * 256  # 16 programs of 256 threads per SM: 32 warps per SM
    x = torch.arange(n, device="cuda", dtype=torch.int32)
    y = torch.empty_like(x)
    rows = []
    base = None
    for name, kinds in [("ffma", ["ffma"]), ("f2fp_e4m3", ["f2fp_e4m3"]), ("prmt", ["prmt"]), ("lop3", ["lop3"]),
                        ("shf", ["shf"]), ("hmul2", ["hmul2"]), ("f2fp+lop3", ["f2fp_e4m3", "lop3"]),
                        ("prmt+lop3", ["prmt", "lop3"]), ("f2fp+prmt", ["f2fp_e4m3", "prmt"]),
                        ("f2fp+hmul2", ["f2fp_e4m3", "hmul2"]), ("prmt+hmul2", ["prmt", "hmul2"]),
                        ("f2fp+ffma", ["f2fp_e4m3", "ffma"]), ("lop3+ffma", ["lop3", "ffma"])]:
        asm = asm_for(kinds)
        fn = lambda asm=asm: _k[(n // 256,)](x, y, ASM=asm, BLOCK=256, num_warps=8)  # noqa: E731
        fn()
        ms = triton.testing.do_bench(fn, warmup=50, rep=200)
        per = ms / (8 * STEPS)
        if base is None:
            base = per
        rows.append(f"{name:12s} {ms * 1e3:9.1f} us  time per instruction / FFMA's: {per / base:5.2f}")
    txt = torch.cuda.get_device_name() + f"\n{n} threads, 8 chains x {STEPS} steps each\n" + "\n".join(rows)
    print(txt)
    with open(os.path.join(OUT, "pipes.txt"), "w") as f:
        f.write(txt + "\n")


if __name__ == "__main__":
    main()
