"""Host time per call of the Quartet layer at a tiny shape (the GPU idles: the time is the host's), and
per Triton launch through Triton's JIT path and through ``fp4attn.kernels._launch.fast`` (when the
package on PYTHONPATH has it). Run once per package for an A/B:

    PYTHONPATH=src python launch_ab.py <tag>"""
import sys
from pathlib import Path

import torch
import triton

from fp4attn.kernels import quartet as kq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/quartet: probe_util
import probe_util  # noqa: E402
from probe_util import tiny_layer  # noqa: E402

tag = sys.argv[1] if len(sys.argv) > 1 else "?"


def host_us(fn, n=300):
    return probe_util.host_us(fn, warmup=20, reps=5, n=n)


torch.manual_seed(0)
x, w, dy, rng = tiny_layer(w_scale=256 ** -0.5)
fb = host_us(lambda: torch.autograd.grad(kq.QuartetLinearCUDA.apply(x, w, None, rng, 32), (x, w), dy))
with torch.no_grad():
    inf = host_us(lambda: kq.quartet_linear_cuda(x, w, None, rng))
y = kq.QuartetLinearCUDA.apply(x, w, None, rng, 32)
bwd = host_us(lambda: kq.QuartetLinearCUDA.backward(y.grad_fn, dy))
print(f"[{tag}] tiny layer (256^3 bf16): f+b step {fb:.1f} us host, direct backward {bwd:.1f}, "
      f"inference forward {inf:.1f}", flush=True)

out = torch.empty(4096, dtype=torch.float32, device="cuda")
g = (triton.cdiv(4096, 128),)
jit = host_us(lambda: kq._signs_kernel[g](out, 7, 4096, BLOCK=128), n=1000)
line = f"[{tag}] _signs_kernel (3 args): JIT path {jit:.1f} us/launch"
a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
seeds, sx, _ = kq.backward_draws(rng, a.device, 256, 0)


def sr(launcher):
    return lambda: kq._sr_mx(a, 0, 1, None, None, sx, None, kq._SR_BLOCK_L, row_max=True, seeds=seeds)


sr_t = host_us(sr(None), n=1000)
line2 = f"[{tag}] _sr_mx (one SR launch + 3 allocations, 25 args): {sr_t:.1f} us/call"
try:
    from fp4attn.kernels._launch import fast
    fk = fast(kq._signs_kernel)
    f = host_us(lambda: fk[g](out, 7, 4096, BLOCK=128), n=1000)
    line += f", fast path {f:.1f} us/launch"
except ImportError:
    pass
print(line, flush=True)
print(line2, flush=True)
emp = host_us(lambda: torch.empty(256, 128, dtype=torch.uint8, device="cuda"), n=1000)
print(f"[{tag}] torch.empty {emp:.1f} us", flush=True)
