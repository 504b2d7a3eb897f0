"""Thrift decode at D = 256 (twenty-eighth session): the Gluon FP4 kernel + the 16-bit stream (8 programs per SM,
255 registers) against the fused Triton split kernel, CUDA-graph ms with the selection given (and the op, selection
included), beside cuDNN. Run: PYTHONPATH=src python benchmarks/d256-s28/thrift_probe.py"""
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.bench.common import graph_time_ms
from fp4attn.bench.decode import decode_inputs, sdpa_fn
from fp4attn.kernels.decode import decode_fwd, select_pages


def one_shape(B, Hq, Hkv, N, D):
    q, k, v = decode_inputs(B, Hq, Hkv, N, D)
    c = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = select_pages(q, c, 0.05)
    t_cud = graph_time_ms(sdpa_fn(SDPBackend.CUDNN_ATTENTION, q, k, v), 40)
    res = {}
    outs = {}
    for kern in ("triton", "gluon"):
        res[kern] = graph_time_ms(
            lambda kern=kern: decode_fwd(q, c, scale=D ** -0.5, selection=sel, kernel=kern)[0], 40)
        outs[kern] = decode_fwd(q, c, scale=D ** -0.5, selection=sel, kernel=kern)[0].float()
    res["op (auto)"] = graph_time_ms(lambda: fp4attn.decode(q, c, thrift_budget=0.05), 40)
    d = ((outs["gluon"] - outs["triton"]).norm() / outs["triton"].norm()).item()
    print(f"({B},{Hq},{Hkv},{N},{D}) cuDNN {t_cud:.4f} ms; gluon vs triton rel. L2 {d:.2e}")
    for n, ms in res.items():
        print(f"  thrift 5% {n:10s} {ms:.4f} ms  {t_cud / ms:.2f}x cuDNN")


for shape in ((8, 8, 4, 32768, 256), (1, 8, 4, 131072, 256), (8, 16, 8, 32768, 256)):
    one_shape(*shape)
