"""Where the Gluon decode kernel's time goes: timing variants with parts of the loop replaced by cheap
stand-ins (results deliberately wrong), (8,32,8,32768,128), 16 programs per SM, CUDA-graph medians.
Run one variant per process: python probe5.py VARIANT."""
import os
import sys
import torch
import triton
import triton.language as tl
from triton.experimental.gluon import language as gl
import fp4attn
from fp4attn.kernels import decode as Dk
from fp4attn.kernels import decode_gluon as G
from fp4attn.formats import triton_helpers as T
from fp4attn.bench.common import graph_time_ms

var = sys.argv[1]


@triton.jit
def _no_quant(p, BLOCK: tl.constexpr, IS_MX: tl.constexpr):
    return p


if "nocvt" in var:  # fp8 -> fp16 conversions of the codes replaced by moves
    for name in ("E2M1_HALFWORDS_F16S_PTX", "E2M1_BYTE_PAIRS_F16_PTX"):
        src = getattr(T, name).value
        import re
        src = re.sub(r"cvt\.rn\.f16x2\.e4m3x2 (\$\d), (\w+);", r"mov.b32 \1, {\2, \2};", src)
        setattr(G, name, gl.constexpr(src))
if "nomul" in var:  # scale multiplies dropped
    for name in ("E2M1_HALFWORDS_F16S_PTX", "E2M1_BYTE_PAIRS_F16_PTX"):
        src = getattr(G, name).value
        import re
        src = re.sub(r"mul\.rn\.f16x2 (\$\d), \$\d, \w+;", r"", src)
        src = re.sub(r"mul\.rn\.f16x2 (\$\d), \$\d, \$5;", r"", src)
        setattr(G, name, gl.constexpr(src))
if "noquant" in var:
    G.fake_quant_p = _no_quant

dev = "cuda"
torch.manual_seed(0)
B, Hq, Hkv, N, D = 8, 32, 8, 32768, 128
k = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
cache = fp4attn.KVCache.from_dense(k, torch.randn_like(k))
q = torch.randn(B, Hq, 1, D, device=dev, dtype=torch.bfloat16)
ts = [graph_time_ms(lambda: Dk.decode_fwd(q, cache, scale=D ** -0.5, kernel="gluon"), 40) for _ in range(2)]
line = f"{var:24s} {min(ts):.4f} ms"
print(line)
open(os.path.join(os.environ.get("OUT", "/tmp"), f"probe5_{var}.txt"), "w").write(line + "\n")
