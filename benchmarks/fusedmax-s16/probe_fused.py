"""Fused row-max + attention (PMAX=3, needs fused_and_pipe.patch) vs the two launches (PMAX 1 then 2),
attention pass only, on the pre-pass buffers, next to SDPA cuDNN in the same run; the variants' bits are
compared with the first's. (probe_fused.txt came from an earlier form of this script with the same variants
and an extra "best × two launches" column.)
Usage: PYTHONPATH=src:benchmarks/fusedmax-s16 python benchmarks/fusedmax-s16/probe_fused.py"""
import probe_regs as P

C64 = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
C128 = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
P.SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
            (16, 16, 4096, 64, False)]
P.VARIANTS = {
    "two": dict(C64, fused_max=False),
    "f64": dict(C64, fused_max=True),
    "f64m128": dict(C64, MAX_BN=128, fused_max=True),
    "f128": dict(C128, fused_max=True),
    "f128m128": dict(C128, MAX_BN=128, fused_max=True),
    "f128x128": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, fused_max=True),
}

if __name__ == "__main__":
    P.main()
