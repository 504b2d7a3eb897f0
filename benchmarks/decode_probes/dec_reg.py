import torch, itertools
from fp4attn.kvcache import KVCache
from fp4attn.kernels import decode as Kd
from fp4attn.bench.decode import graph_time_ms

orig = Kd._decode_split_kernel
class Capped:
    def __init__(self, mr): self.mr = mr
    def __getitem__(self, grid):
        f = orig[grid]
        def launch(*a, **kw):
            if self.mr: kw["maxnreg"] = self.mr
            return f(*a, **kw)
        return launch
torch.manual_seed(0)
for (B, Hq, Hkv, N, D) in ():
    k = None
    c = None
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    for mr, per_sm in itertools.product((None, 128, 120), (12, 14, 16)):
        Kd._decode_split_kernel = Capped(mr)
        splits = Kd.default_splits(B, Hkv, N, 32, q.device, per_sm=per_sm)
        try:
            t = graph_time_ms(lambda: Kd.decode_fwd(q, c, scale=0.088, num_splits=splits), 25)
            info = [(x.n_regs, x.n_spills) for x in orig.device_caches[0][0].values()]
        except Exception as e:
            t = float("nan"); info = repr(e)[:150]
        print(f"({B},{N}) maxnreg={mr} per_sm={per_sm} splits={splits}: {t:.4f} ms {info}", flush=True)
    Kd._decode_split_kernel = orig
    del c; torch.cuda.empty_cache()

# Thrift 5% decode kernel configs
from fp4attn.ops.decode import thrift_select
for (B, Hq, Hkv, N, D) in ((8, 32, 8, 32768, 128), (1, 32, 8, 131072, 128)):
    k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
    c = KVCache.from_dense(k, torch.randn_like(k), keep_16bit=True); del k
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    sel = thrift_select(q, c, 0.05)
    res = []
    for nw, ns, per_sm, mt in itertools.product((1, 2, 4), (2, 3), (2, 4, 6, 8, 12), (16, None)):
        splits = Kd.default_splits(B, Hkv, N, 64, q.device, per_sm=per_sm, max_tiles=mt)
        try:
            t = graph_time_ms(lambda: Kd.decode_fwd(q, c, scale=0.088, selection=sel, num_splits=splits, num_warps=nw, num_stages=ns), 20)
        except Exception as e:
            print("ERR", repr(e)[:120]); continue
        res.append((round(t, 4), nw, ns, per_sm, mt, splits))
    print(f"THRIFT ({B},{N}) best", sorted(res, key=lambda r: r[0])[:5], "default-like", [r for r in res if r[1:5] == (2, 2, 2, 16)], flush=True)
    del c; torch.cuda.empty_cache()
