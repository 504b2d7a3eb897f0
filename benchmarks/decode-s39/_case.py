"""The probes' decode inputs: ``fp4attn.bench.decode.decode_inputs`` (q, K, V, N(0, 1), seed 0) with K, V in an
NVFP4 ``KVCache``."""
import fp4attn
from fp4attn.bench.decode import decode_inputs


def case(B, Hq, Hkv, C, D):
    """(q (B, Hq, 1, D), its cache, the default scale)."""
    q, k, v = decode_inputs(B, Hq, Hkv, C, D)
    return q, fp4attn.KVCache.from_dense(k, v), D ** -0.5
