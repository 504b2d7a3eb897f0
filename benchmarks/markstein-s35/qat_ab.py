"""In-process A/B of the Attn-QAT fake-quantization prep (``kernels.attn_qat.prep``: Q, K along D, V along tokens) and
of ``fp4attn.attn_qat`` forward + backward: the tree under OLD_SRC (package ``fp4attn_old``) against this one,
outputs and gradients compared bit for bit, times min of interleaved do_bench rounds.

    OLD_SRC=.ab_old/src PYTHONPATH=src python benchmarks/markstein-s35/qat_ab.py
"""
import os
import sys

import torch

sys.path.insert(0, os.environ.get("OLD_SRC", ".ab_old/src"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "decode-s10"))
import fp4attn_old  # noqa: E402
from _util import ab_best  # noqa: E402  (interleaved do_bench rounds)
from fp4attn_old.kernels import attn_qat as kq_old  # noqa: E402

import fp4attn  # noqa: E402
from fp4attn.kernels import attn_qat as kq  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
os.environ.setdefault("FP4ATTN_AUTOTUNE", "0")
torch.manual_seed(0)


def best(f, g):
    return ab_best(f, g, ROUNDS, warmup=10, rep=50)


print(f"device: {torch.cuda.get_device_name()}", flush=True)
for B, H, N, D in ((16, 16, 4096, 128), (16, 16, 4096, 64)):
    x = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    for mode in (1, 2):
        fo = lambda x=x, mode=mode: kq_old.prep(x, mode, "nvfp4", torch.bfloat16)  # noqa: E731
        fn = lambda x=x, mode=mode: kq.prep(x, mode, "nvfp4", torch.bfloat16)  # noqa: E731
        eq = torch.equal(fo().view(torch.int16), fn().view(torch.int16))
        to, tn = best(fo, fn)
        print(f"prep ({B},{H},{N},{D}) mode {mode}: old {to * 1e3:.1f} us  new {tn * 1e3:.1f} us  new/old "
              f"{tn / to:.3f}  {'bit-equal' if eq else 'DIFFER'}", flush=True)
    for causal in (False, True):
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)

        def step(mod, q=q, k=k, v=v, do=do, causal=causal):
            out = mod.attn_qat(q, k, v, causal=causal)
            return (out, *torch.autograd.grad(out, (q, k, v), do))

        eq = all(torch.equal(a, b) for a, b in zip(step(fp4attn), step(fp4attn_old)))
        to, tn = best(lambda: step(fp4attn_old), lambda: step(fp4attn))
        print(f"attn_qat fwd+bwd ({B},{H},{N},{D}) causal={causal}: old {to:.3f} ms  new {tn:.3f} ms  "
              f"new/old {tn / to:.3f}  {'bit-equal' if eq else 'DIFFER'}", flush=True)
