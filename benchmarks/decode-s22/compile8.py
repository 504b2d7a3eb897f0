"""Compile dec8's (or, with the argument wg8, wg8's) kernel for sm_90 without a GPU (as tests/aot_probe does)
and print its loop's SASS counts."""
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "src"), os.path.join(HERE, "..", "..", "tests"),
                os.path.join(HERE, "..", "..", "tools")]
import dec8  # noqa: E402
import torch  # noqa: E402
import wg8  # noqa: E402

import aot_probe  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402
from fp4attn.kvcache import KVCache  # noqa: E402

B, Hq, Hkv, D, NQ = 2, 8, 2, 128, 1
cache = KVCache(B, Hkv, D, device="cpu")
cache.append(torch.randn(B, Hkv, 100, D), torch.randn(B, Hkv, 100, D))
q = torch.randn(B, Hq, NQ, D)
rec = []
mod = wg8 if sys.argv[1:] == ["wg8"] else dec8
mod.fast = lambda fn: type("R", (), {"__getitem__": lambda self, grid: (lambda *a, **k: rec.append((fn, a, k)))})()
OP = torch.empty(B * Hkv * 4 * 8, D)
MP = torch.empty(B * Hkv * 4 * 8)
LP = torch.empty_like(MP)
mod.launch(q, cache, cache.page_table, cache.k_scale.view(torch.uint8), cache.v_scale.view(torch.uint8), OP, MP, LP,
            0.1, NQ, Hq // Hkv, cache.page_table.shape[1], 64, 2, 8, 32, maxnreg=Dk.gluon_maxnreg(False),
            pdl_trigger=True)
fn, a, k = rec[0]
ck = aot_probe.compile_bound(fn, a, k, 90)
import sass_count  # noqa: E402

sass = sass_count.cuobjdump(ck, "-sass")
open(os.path.join(os.environ.get("OUT", "/tmp"), f"{mod.__name__}.sass"), "w").write(sass)
open(os.path.join(os.environ.get("OUT", "/tmp"), f"{mod.__name__}.ptx"), "w").write(ck.asm["ptx"])
ins = sass_count.parse(sass)
print(len(ins), sass_count.resources(ck))
for s_, e in sass_count.loops(ins):
    body = ins[s_:e + 1]
    print(f"loop {len(body)}", sass_count.classes(body))
