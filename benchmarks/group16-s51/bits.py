"""The review mends against the tree before them (OLD_SRC, imported as a second package in the same process):
decode outputs and LSEs bit for bit, FP4 and Thrift (both sharing rules), D = 128 / 64 / 96, one and two new tokens,
with and without a sliding window and sinks, bf16 and fp16 caches.

    OLD_SRC=out/base_src/src PYTHONPATH=src python benchmarks/group16-s51/bits.py
"""
import torch
from _old import old_package  # (this directory: run as a script)

import fp4attn


def main():
    old = old_package()
    bad = n = 0
    for D, G, nq, dt in ((128, 4, 1, torch.bfloat16), (128, 4, 2, torch.bfloat16), (64, 4, 1, torch.bfloat16),
                         (96, 4, 1, torch.bfloat16), (128, 2, 1, torch.float16)):
        g = torch.Generator(device="cuda").manual_seed(D + nq)
        lens = [20000 + 7, 9000, 3001]
        k = torch.randn(3, 2, max(lens), D, device="cuda", dtype=dt, generator=g)
        v = torch.randn(3, 2, max(lens), D, device="cuda", dtype=dt, generator=g)
        q = torch.randn(3, 2 * G, nq, D, device="cuda", dtype=dt, generator=g)
        s = torch.randn(2 * G, device="cuda", generator=g)
        caches = [(pkg, pkg.KVCache.from_dense(k, v, lengths=lens, keep_16bit=True)) for pkg in (old, fp4attn)]
        for kw in (dict(), dict(thrift_budget=0.05), dict(thrift_budget=0.05, thrift_share="head"),
                   dict(thrift_budget=0.1, window_size=(3000, 0)), dict(window_size=(3000, 0), sinks=s),
                   dict(thrift_budget=0.1, sinks=s)):
            a, b = (pkg.decode(q, c, return_lse=True, **kw) for pkg, c in caches)
            same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            n += 1
            bad += not same
            print(f"D={D} G={G} nq={nq} {str(dt)[6:]} {kw if 'sinks' not in kw else {**kw, 'sinks': 'yes'}}: "
                  f"{'bit-equal' if same else 'DIFFERENT'}", flush=True)
    print(f"{n} cases, {bad} differ")


if __name__ == "__main__":
    main()
