"""Fifty-fourth session probe (issue 4; needs ``words.patch``: ``git apply benchmarks/prepwords-s54/words.patch``):
the Q / K pre-pass encoding NVFP4 of bfloat16 on f16x2 words (``attention.PREP_WORDS = True``, ``nvfp4_words_f16``)
against the float32 encoding (False), side by side with SDPA (flash, cuDNN): the nvfp4 op and the ``quantize_qkv``
pre-pass alone (Q, K and V; only Q and K changed). Outputs, packed Q, scale bytes and staged K̂ must be bit-equal.
Eager calls, min over interleaved rounds (the order reversed every other round).

    PYTHONPATH=src python benchmarks/prepwords-s54/ab.py [rounds]
"""
import os
import sys

import torch
from torch.nn.attention import SDPBackend

import fp4attn
from fp4attn.kernels import attention as A

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "phi-words-s53"))
from probe import SHAPES, both_orders_min_ms, main, print_table, qkv, sdpa  # noqa: E402


def run_shape(B, H, N, D, causal, rounds):
    q, k, v = qkv(B, H, N, D)
    fns = {
        "sdpa cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal),
        "sdpa flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal),
    }
    kp = A.op_key_perm(D, fmt="nvfp4", two_level_p=False, online=None, smooth_q=False, staged=True,
                       path=A.PATH_HOPPER, device=q.device)
    for m in ("words", "w96", "w80", "f32"):
        fns[f"nvfp4 {m}"] = lambda: fp4attn.attention(q, k, v, causal=causal)
        fns[f"prepass {m}"] = lambda: A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, key_perm=kp)

    def prepare(name):
        A.PREP_WORDS = not name.endswith("f32")
        A.PREP_CAP = {"maxnreg": int(name[-2:])} if name[-3:] in ("w96", "w80") else {}

    outs = {}
    for n, f in fns.items():
        if n.startswith("nvfp4"):
            prepare(n)
            outs[n] = f()
            pk = (prepare(n), A.quantize_qkv(q, k, v, fmt="nvfp4", staged=True, key_perm=kp))[1]
            outs[n + " qc"], outs[n + " qs"], outs[n + " ks"], outs[n + " kh"] = pk.qc, pk.qs, pk.ks, pk.kh
    same = {t: torch.equal(outs[f"nvfp4 words{t}"].view(torch.uint8), outs[f"nvfp4 f32{t}"].view(torch.uint8))
            for t in ("", " qc", " qs", " ks", " kh")}
    t = both_orders_min_ms(fns, rounds, prepare)

    def gain(n, ms):
        base = n.rsplit(" ", 1)[0] + " f32"
        return f"  f32/this {t[base] / ms:5.3f}" if base in t and n != base else ""

    print_table((B, H, N, D, causal), t, f"bit-equal words/f32: {same}", gain)
    prepare("")


if __name__ == "__main__":
    main(SHAPES, run_shape)
