"""Software-pipelined QKᵀ (PIPE=1: the next tile's S issued before this tile's softmax) vs the default loop,
attention pass on the pre-pass buffers (two launches), next to SDPA cuDNN. Bits must match.
Usage: PYTHONPATH=src python benchmarks/fusedmax-s16/probe_pipe.py"""
import probe_regs as P

B64 = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
P.SHAPES = [(16, 16, 4096, 128, False), (16, 16, 4096, 128, True), (4, 16, 16384, 128, False),
            (16, 16, 4096, 64, False)]
P.VARIANTS = {
    "default": dict(B64, PIPE=0),
    "pipe": dict(B64, PIPE=1),
    "pipe_s2": dict(B64, num_stages=2, PIPE=1),
    "pipe_r168": dict(B64, PIPE=1, maxnreg=168),
    "pipe_n32": dict(B64, BLOCK_N=32, PIPE=1),
    "pipe_m128w8": dict(B64, BLOCK_M=128, num_warps=8, PIPE=1),
}

if __name__ == "__main__":
    P.main()
