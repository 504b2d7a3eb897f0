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

P = logger("probe_sel.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,128,1;1,32,8,131072,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))

for _D, _nq, k, v, cache, q, _cud in shapes(CASES, P):  # noqa: B007
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    sel = Dn.select_pages(q, c16, THRIFT)
    scores = Dn.page_scores(q, c16)
    npg = scores.shape[-1]
    width = max(c16.page_table.shape[1], 1)
    D = q.shape[-1]
    fns = {
        "page_scores": lambda: Dn.page_scores(q, c16),
        "page_topk": lambda: Dn.page_topk(scores, c16.seq_lens, c16.page_size, THRIFT, width),
        "select_pages": lambda: Dn.select_pages(q, c16, THRIFT),
        "decode_fwd(selection)": lambda: Dn.decode_fwd(q, c16, scale=D ** -0.5, selection=sel),
        "thrift op": lambda: fp4attn.decode(q, c16, thrift_budget=THRIFT),
        "nvfp4 op": lambda: fp4attn.decode(q, cache),
        "decode_fwd nvfp4": lambda: Dn.decode_fwd(q, cache, scale=D ** -0.5),
    }
    for n, f in fns.items():
        P(f"  {n:24s} {t(f, REP):8.1f} us")
