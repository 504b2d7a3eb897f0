"""Where Thrift decode's time goes (H200, CUDA-graph replays): the selection's two kernels (page scores, top-k),
``select_pages``, the decode with a given selection, the whole op; and the FP4 op for comparison.

    OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/thrift16-s30/probe_sel.py      # $OUT/probe_sel.txt
"""
# ruff: noqa: B023
import os

from _ab import REP, logger, shapes
from _common import t

import fp4attn
import fp4attn.kernels.decode as Dn

CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))


def step_parts(q, c16, cache, thrift):
    """The timed parts of a Thrift decode step on ``c16`` (a cache with its 16-bit copy) and the FP4 op on ``cache``:
    {name: fn} (also used by benchmarks/thrift-fused-s31/probe_select.py)."""
    sel = Dn.select_pages(q, c16, thrift)
    scores = Dn.page_scores(q, c16)
    width = max(c16.page_table.shape[1], 1)
    D = q.shape[-1]
    return {
        "page_scores": lambda: Dn.page_scores(q, c16),
        "page_topk": lambda: Dn.page_topk(scores, c16.seq_lens, c16.page_size, thrift, width),
        "select_pages": lambda: Dn.select_pages(q, c16, thrift),
        "decode_fwd(selection)": lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel),
        "thrift op": lambda: fp4attn.decode(q, c16, thrift_budget=thrift),
        "nvfp4 op": lambda: fp4attn.decode(q, cache),
        "decode_fwd nvfp4": lambda: Dn.decode_fwd(q, cache, scale=D ** -0.5),
    }


if __name__ == "__main__":
    P = logger("probe_sel.txt")
    for _D, _nq, k, v, cache, q, _cud in shapes(CASES, P):  # noqa: B007
        c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
        for n, f in step_parts(q, c16, cache, THRIFT).items():
            P(f"  {n:24s} {t(f, REP):8.1f} us")
