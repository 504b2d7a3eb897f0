"""The eighteenth session's cp.async tile ring (tree 54ab8c4, which contains it) timed on this GPU: direct loads
against ring depths 2-4 under register caps and programs per SM, CUDA-graph replays of decode_fwd.

    mkdir -p out/s18 && git archive 54ab8c4 src | tar -x -C out/s18
    git show 54ab8c4:benchmarks/decode-s10/_util.py > out/s18/_util.py
    cp benchmarks/decode-prologue-s42/ringprobe.py out/s18/ && (cd out/s18 && OUT=. python ringprobe.py)
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from _util import decode_case  # noqa: E402

from fp4attn.bench.common import graph_time_ms  # noqa: E402
from fp4attn.kernels import decode as Dk  # noqa: E402

out = open(os.path.join(os.environ.get("OUT", "."), "ringprobe.txt"), "w")


def P(*a):
    print(*a, flush=True)
    print(*a, file=out, flush=True)


P(torch.cuda.get_device_name())
for (B, Hq, Hkv, N, D) in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
    q, k, v, cache, cud = decode_case(B, Hq, Hkv, N, D)
    o0 = Dk.decode_fwd(q, cache, scale=D ** -0.5, ring=0, maxnreg=0, per_sm=16)[0]
    o2 = Dk.decode_fwd(q, cache, scale=D ** -0.5, ring=2, maxnreg=128, per_sm=16)[0]
    P((B, Hq, Hkv, N, D), "ring2 == direct:", torch.equal(o0, o2))
    res = {}
    for _ in range(3):
        res.setdefault("cudnn", []).append(graph_time_ms(cud, 60))
        for ring, mr, ps in ((0, 0, 16), (0, 128, 16), (2, 128, 16), (2, 128, 12), (2, 0, 12), (3, 128, 14),
                             (3, 112, 16), (4, 128, 12), (4, 0, 10)):
            res.setdefault(f"ring{ring} reg{mr} ps{ps}", []).append(graph_time_ms(
                lambda q=q, c=cache, d=D, r=ring, m=mr, p=ps: Dk.decode_fwd(q, c, scale=d ** -0.5, ring=r, maxnreg=m,
                                                                          per_sm=p), 60))
    cu = min(res["cudnn"])
    for n, ts in res.items():
        P(f"  {n:20s} {1e3 * min(ts):8.1f} us  x cuDNN {cu / min(ts):.3f}")
    del k, v, cache
    torch.cuda.empty_cache()
