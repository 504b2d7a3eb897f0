import torch
from triton.testing import do_bench
import fp4attn
from fp4attn.kernels import attention as ka
torch.manual_seed(0)
q, k, v = (torch.randn(16, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
pk = ka.quantize_qkv(q, k, v, fmt="nvfp4", smooth_q=True, smooth_k=True)
for causal in (True, False):
    tn = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe="nvfp4"), warmup=25, rep=100)
    for bt in (64, 128, 32):
        for cqb in (32, 16, 8):
            for nw in (4, 8, 2):
                ka._CORR_CFG.update(block_t=bt, cqb=cqb, num_warps=nw)
                try:
                    tt = do_bench(lambda: ka.smooth_q_corr(pk, 0, 32, causal=causal), warmup=10, rep=50)
                    ts = do_bench(lambda: fp4attn.attention(q, k, v, causal=causal, recipe="sage3"), warmup=10, rep=60)
                except Exception as e:
                    print(f"causal={causal} bt={bt} cqb={cqb} nw={nw}: ERR {type(e).__name__}", flush=True)
                    continue
                print(f"causal={causal} bt={bt:3d} cqb={cqb:2d} nw={nw}: table {tt*1e3:6.1f} us  sage3 op {ts:.3f} ms  nvfp4 op {tn:.3f}  ratio {ts/tn:.3f}", flush=True)
