"""Where the Thrift selection's time goes (H200, CUDA-graph replays), after the fused tile: the selection's two kernels
(page scores, top-k) alone and under other launch configs, ``select_pages``, the decode with a given selection, the
whole op (the list of benchmarks/thrift16-s30/probe_sel.py; the logs in results/ were written before this script
took it, without its "decode_fwd nvfp4" line), and the graph time of an empty kernel launch (the floor of one launch
in a graph).

    OUT=out PYTHONPATH=src:benchmarks/f2fp-s29 python benchmarks/thrift-fused-s31/probe_select.py
"""
# ruff: noqa: B023
import os
import sys

import torch
import triton
import triton.language as tl
from _ab import REP, logger, shapes
from _common import t

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "thrift16-s30"))
from probe_sel import step_parts  # noqa: E402

import fp4attn
import fp4attn.kernels.decode as Dn

P = logger("probe_select.txt")
CASES = os.environ.get("CASES", "8,32,8,32768,64,1;1,32,8,131072,64,1;8,32,8,32768,128,1;1,32,8,131072,128,1")
THRIFT = float(os.environ.get("THRIFT", 0.05))
CHUNKS = [int(x) for x in os.environ.get("CHUNKS", "8,16,32,64,128").split(",")]
WARPS = [int(x) for x in os.environ.get("WARPS", "1,2,4").split(",")]
TOPK_WARPS = [int(x) for x in os.environ.get("TOPK_WARPS", "1,2,4,8").split(",") if x]


@triton.jit
def _empty(X):
    tl.store(X + tl.program_id(0), 1.0)


buf = torch.zeros(1024, device="cuda")
P(f"empty kernel, 1 program: {t(lambda: _empty[(1,)](buf), REP):.1f} us; 512 programs: "
  f"{t(lambda: _empty[(512,)](buf), REP):.1f} us; two launches: "
  f"{t(lambda: (_empty[(1,)](buf), _empty[(1,)](buf)), REP):.1f} us")
for _D, _nq, k, v, cache, q, _cud in shapes(CASES, P):  # noqa: B007
    c16 = fp4attn.KVCache.from_dense(k, v, keep_16bit=True)
    scores = Dn.page_scores(q, c16)
    width = max(c16.page_table.shape[1], 1)
    fns = step_parts(q, c16, cache, THRIFT)
    for n, f in fns.items():
        P(f"  {n:24s} {t(f, REP):8.1f} us")
    for chunk in CHUNKS:
        for nw in WARPS:
            us = t(lambda: Dn.page_scores(q, c16, chunk=chunk, num_warps=nw), REP)
            P(f"  page_scores chunk {chunk:3d} warps {nw}: {us:6.1f} us")
    for nw in TOPK_WARPS:
        us = t(lambda: Dn.page_topk(scores, c16.seq_lens, c16.page_size, THRIFT, width, num_warps=nw), REP)
        P(f"  page_topk warps {nw}: {us:6.1f} us")
